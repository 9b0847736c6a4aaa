//! The identity probe (DESIGN §7): who holds a lease, from the kernel, and
//! what the holder record is worth. Never takes, blocks or disturbs the lock.

use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use serde::Serialize;

use crate::acquire::read_capped;
use crate::error::{Error, Result};
use crate::holders::{self, Orphan};
use crate::options::Options;
use crate::path;
use crate::platform::{locks, process};
use crate::record::{Content, Record};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Free,
    Held,
    /// A live process still holds a deleted former lease inode.
    Split,
    /// The platform gives no kernel view.
    Unknown,
}

/// What the holder record is worth, and how that was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordStatus {
    /// Its process exists with the same boot, namespace and start time and
    /// holds the lock.
    Live,
    /// This process holds it.
    #[serde(rename = "self")]
    Myself,
    /// Its process is gone, its PID was reused, or the machine rebooted.
    Stale,
    /// Same PID and start time, but no descriptor of it holds the lock: the
    /// program was replaced by exec.
    ImageReplaced,
    /// The last holder released cleanly.
    Released,
    /// Another host or PID namespace: not judged.
    Foreign,
    Empty,
    Unreadable,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Free => "free",
            State::Held => "held",
            State::Split => "split",
            State::Unknown => "unknown",
        }
    }
}

impl RecordStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Live => "live",
            RecordStatus::Myself => "self",
            RecordStatus::Stale => "stale",
            RecordStatus::ImageReplaced => "image-replaced",
            RecordStatus::Released => "released",
            RecordStatus::Foreign => "foreign",
            RecordStatus::Empty => "empty",
            RecordStatus::Unreadable => "unreadable",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub target: PathBuf,
    pub lease_path: PathBuf,
    pub state: State,
    pub holders: Vec<u32>,
    pub record: Option<Record>,
    pub record_status: RecordStatus,
    pub orphans: Vec<Orphan>,
    pub unattributed: usize,
}

impl Inspection {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Inspect the lease of `target` (only `options.suffix` is used).
pub fn inspect(target: impl AsRef<Path>, options: &Options) -> Result<Inspection> {
    options.validate()?;
    let req = path::resolve(target.as_ref(), &options.suffix)?;
    let lp = &req.lease_path;
    let (content, current) = read_lease_file(lp)?;
    let dev = match current {
        Some((dev, _)) => dev,
        None => {
            let dir = lp.parent().unwrap_or(Path::new("/"));
            rustix::fs::stat(dir)
                .map_err(|e| Error::io("stat", dir, e))?
                .st_dev
        }
    };
    let mut out = Inspection {
        target: req.target.clone(),
        lease_path: lp.clone(),
        state: State::Unknown,
        holders: Vec::new(),
        record: content.record().cloned(),
        record_status: RecordStatus::Empty,
        orphans: Vec::new(),
        unattributed: 0,
    };
    let Ok(locks) = locks::flock_locks_on(rustix::fs::major(dev), rustix::fs::minor(dev)) else {
        out.record_status = judge(&content, None);
        return Ok(out);
    };
    if let Some((dev, ino)) = current {
        out.holders = holders::kernel_holders(dev, ino, &locks);
    }
    let scan = holders::split_scan(lp, dev, current.map(|c| c.1), &locks, false);
    out.orphans = scan.orphans;
    out.unattributed = scan.unattributed;
    out.state = if !out.orphans.is_empty() {
        State::Split
    } else if !out.holders.is_empty() {
        State::Held
    } else {
        State::Free
    };
    out.record_status = judge(&content, Some(&out.holders));
    Ok(out)
}

/// The lease file's content and identity, or `None` identity when it does
/// not exist. Opened read-only and non-blocking; never created.
fn read_lease_file(lp: &Path) -> Result<(Content, Option<(u64, u64)>)> {
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    let fd = match rustix::fs::open(lp, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok((Content::Empty, None)),
        Err(Errno::LOOP) => {
            return Err(Error::io(
                "open",
                lp,
                std::io::Error::other("the lease file is a symlink; refusing to follow it"),
            ))
        }
        // Unreadable by this user: the lock can still be judged.
        Err(Errno::ACCESS) => {
            let st = rustix::fs::lstat(lp).map_err(|e| Error::io("lstat", lp, e))?;
            return Ok((Content::Unreadable, Some((st.st_dev, st.st_ino))));
        }
        Err(e) => return Err(Error::io("open", lp, e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("fstat", lp, e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Error::io(
            "open",
            lp,
            std::io::Error::other("the lease file is not a regular file"),
        ));
    }
    let bytes = read_capped(std::os::fd::AsFd::as_fd(&fd), lp)?;
    let content = if bytes.len() > crate::record::RECORD_MAX_BYTES {
        Content::Unreadable
    } else {
        Content::parse(&bytes)
    };
    Ok((content, Some((st.st_dev, st.st_ino))))
}

/// Judge a record against the kernel's holders (`None`: no kernel view).
fn judge(content: &Content, holders: Option<&[u32]>) -> RecordStatus {
    let r = match content {
        Content::Empty => return RecordStatus::Empty,
        Content::Unreadable => return RecordStatus::Unreadable,
        Content::Record(r) => r,
    };
    if r.released_at.is_some() {
        return RecordStatus::Released;
    }
    let me = process::current();
    let differs =
        |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(x), Some(y)) if x != y);
    if differs(&r.machine_id, &me.machine_id)
        || differs(&r.host, &me.host)
        || matches!((r.pid_ns, me.pid_ns), (Some(x), Some(y)) if x != y)
    {
        return RecordStatus::Foreign;
    }
    if differs(&r.boot_id, &me.boot_id) {
        return RecordStatus::Stale;
    }
    let Some(pid) = r.pid else {
        return RecordStatus::Unreadable;
    };
    let Some(start) = process::start_time(pid) else {
        return RecordStatus::Stale;
    };
    if r.proc_start.is_some_and(|s| s != start) {
        return RecordStatus::Stale;
    }
    let Some(holders) = holders else {
        return RecordStatus::Live;
    };
    match (holders.contains(&pid), pid == me.pid) {
        (true, true) => RecordStatus::Myself,
        (true, false) => RecordStatus::Live,
        (false, _) => RecordStatus::ImageReplaced,
    }
}
