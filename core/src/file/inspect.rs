//! The identity probe of a lease file (DESIGN §7): who holds it, from the
//! kernel's table of locks and the processes' descriptors, and what its
//! holder record is worth.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::file::guard;
use crate::file::holders;
use crate::inspect::{Inspection, RecordStatus, State};
use crate::options::Options;
use crate::path;
use crate::platform::process::{self, FdScan, KernelKey};
use crate::platform::{locks, Missing};
use crate::record::{self, Content};

/// The lease file as inspect found it.
struct Found {
    content: Content,
    /// `stat` identity, or `None` when there is no lease file.
    key: Option<(u64, u64)>,
    kernel_dev: Option<(u32, u32)>,
    lease_path: PathBuf,
    /// Nobody could have written a release into it: immutable, append-only
    /// or on a read-only mount.
    unwritable: bool,
    /// The file, open for reading (not when it is unreadable or missing).
    fd: Option<OwnedFd>,
}

/// Inspect the lease file of `target` (only `options.suffix` is used).
pub(crate) fn inspect(target: &Path, options: &Options) -> Result<Inspection> {
    let spelled = path::spell(target, &options.suffix)?;
    let found = read_lease_file(&spelled)?;
    let lp = &found.lease_path;
    let dir_path = path::parent_of(lp);
    let dir = crate::platform::stat::stat(dir_path).map_err(|e| Error::io("stat", dir_path, e))?;
    let me = process::current();
    let mut out = Inspection {
        target: path::target_of(lp, &options.suffix),
        lease_path: lp.clone(),
        state: State::Unknown,
        holders: Vec::new(),
        record: found.content.record().cloned(),
        record_status: RecordStatus::Unknown,
        orphans: Vec::new(),
        former: Vec::new(),
        unattributed: 0,
        server: None,
        unavailable: crate::platform::unavailable()
            .into_iter()
            .filter(|m| *m == Missing::FileEvents)
            .collect(),
    };
    let kernel = found
        .kernel_dev
        .and_then(|(ma, mi)| locks::flock_locks_on(ma, mi).ok().map(|l| (ma, mi, l)));
    let Some((major, minor, all)) = kernel else {
        // No table of locks (the portable platform, a sandbox's /proc): the
        // lock itself says whether it is held, and the record the rest.
        missing(&mut out.unavailable, Missing::LockTable);
        missing(&mut out.unavailable, Missing::Descriptors);
        out.state = match (&found.fd, found.key) {
            (_, None) => State::Free,
            (Some(fd), Some(_)) if locked_now(fd.as_fd()) => State::Held,
            (Some(_), Some(key)) if !unreleased_elsewhere(&found.content, key) => State::Free,
            _ => State::Unknown,
        };
        out.record_status = judge(
            &found.content,
            None,
            &[],
            found.unwritable,
            held_here(found.key),
        );
        return Ok(out);
    };
    if let Some((_, ino)) = found.key {
        let key = KernelKey { major, minor, ino };
        out.holders = holders::kernel_holders(key, &all);
        // A listing of a table that never stopped changing is the union of
        // a few reads, each of which may skip an entry (locks::settled):
        // a lock held now that none of them named is looked for again, a
        // few times, before its holders are called unknown (once in 43
        // looks beside 4 threads locking without pause, on a busy machine).
        let mut again = 0;
        while out.holders.is_empty()
            && again < RELISTS
            && found.fd.as_ref().is_some_and(|fd| locked_now(fd.as_fd()))
        {
            again += 1;
            match locks::flock_locks_on(major, minor) {
                Ok(all) => out.holders = holders::kernel_holders(key, &all),
                Err(_) => break,
            }
        }
    }
    let target = out.target.clone();
    let scan = guard::scan(
        (major, minor),
        found.key.map(|k| k.1),
        &guard::Me {
            lease_path: lp,
            spelled: &spelled.lease,
            target: &target,
            name: &spelled.name,
            dir: (dir.st_dev, dir.st_ino),
            file_dev: found.key.map(|k| k.0),
        },
        false,
    );
    let holders = out.holders.clone();
    (out.former, out.orphans) = scan
        .orphans
        .into_iter()
        .partition(|o| holders.contains(&o.pid));
    out.unattributed = scan.unattributed;
    let unreleased_elsewhere = matches!(&found.content, Content::Record(r)
        if r.released_at.is_none() && r.pid_ns.is_some() && r.pid_ns != me.pid_ns);
    out.state = if !out.orphans.is_empty() {
        State::Split
    } else if !out.holders.is_empty() {
        State::Held
    } else if !me.sees_everything() && unreleased_elsewhere {
        State::Unknown
    } else if !(me.sees_everything() && rustix::process::geteuid().is_root())
        && out.unattributed > 0
        && !vouched_free(&found.content)
    {
        // A lock this reader cannot attribute (it cannot read every
        // process's descriptors) may be a former lease file still held, and
        // nothing at the path says otherwise. (For root, an unattributed
        // lock is one that vanished while it looked.)
        State::Unknown
    } else if found.fd.as_ref().is_some_and(|fd| locked_now(fd.as_fd())) {
        // Held, yet the table names no holder: it does not list every lock
        // (a sandbox's /proc, another PID namespace's lock).
        missing(&mut out.unavailable, Missing::LockTable);
        State::Held
    } else {
        State::Free
    };
    let orphan_pids: Vec<u32> = out.orphans.iter().map(|o| o.pid).collect();
    // A table that missed a held lock is no kernel view of its holders.
    let incomplete = out.unavailable.contains(&Missing::LockTable);
    out.record_status = judge(
        &found.content,
        (!incomplete).then_some(&out.holders[..]),
        &orphan_pids,
        found.unwritable,
        incomplete && held_here(found.key),
    );
    Ok(out)
}

/// Whether this process holds the lease file `key` (its registry says).
fn held_here(key: Option<(u64, u64)>) -> bool {
    key.is_some_and(|key| {
        crate::registry::existing().is_some_and(|r| r.lock().holder_of(key).is_some())
    })
}

/// Whether someone holds an exclusive lock on the file now: a shared lock
/// taken and let go at once (shared locks do not exclude each other; an
/// acquirer's attempt in that microsecond looks once more).
/// How many more listings a held lock that no listing named gets.
const RELISTS: u32 = 3;

fn locked_now(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use rustix::fs::FlockOperation;
    match rustix::fs::flock(fd, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
            false
        }
        Err(_) => true,
    }
}

/// A record, never released, of a holder of another file than this one
/// (it was copied here, or this file replaced the one it held): that
/// holder may still hold a former lease file nobody here can see. A
/// holder of this very file, which is not locked now, is gone.
fn unreleased_elsewhere(content: &Content, (dev, ino): (u64, u64)) -> bool {
    matches!(content, Content::Record(r)
        if r.released_at.is_none() && (r.device, r.inode) != (Some(dev), Some(ino)))
}

fn missing(list: &mut Vec<Missing>, m: Missing) {
    if !list.contains(&m) {
        list.push(m);
    }
}

/// A record released cleanly by a holder that had checked for former
/// lease files: nothing was left behind when it let go.
fn vouched_free(content: &Content) -> bool {
    matches!(content, Content::Record(r) if r.released_at.is_some() && r.split_checked == Some(true))
}

/// The lease file's content and identity. Opened read-only and
/// non-blocking; never created.
fn read_lease_file(spelled: &path::Spelled) -> Result<Found> {
    let lp = &spelled.lease;
    let flags =
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match rustix::fs::open(lp, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            // No lease file: name it beside the canonical directory.
            let dir = path::parent_of(lp);
            let dfd = open_path(dir).map_err(|e| Error::io("open", dir, e))?;
            let canon_dir = process::fd_path(dfd.as_fd())
                .map(|b| PathBuf::from(OsString::from_vec(b)))
                .unwrap_or_else(|_| dir.to_path_buf());
            return Ok(Found {
                content: Content::Empty,
                key: None,
                kernel_dev: process::kernel_device(dfd.as_fd()).ok(),
                lease_path: canon_dir.join(&spelled.name),
                unwritable: false,
                fd: None,
            });
        }
        Err(Errno::LOOP) => {
            return Err(Error::io(
                "open",
                lp,
                std::io::Error::other("the lease file is a symlink; refusing to follow it"),
            ))
        }
        // Unreadable by this user: the lock can still be judged.
        Err(Errno::ACCESS) => {
            let pfd = open_path(lp).map_err(|e| Error::io("open", lp, e))?;
            let st = crate::platform::stat::fstat(&pfd).map_err(|e| Error::io("fstat", lp, e))?;
            let lease_path = canonical(pfd.as_fd(), lp);
            return Ok(Found {
                content: Content::Unreadable,
                key: Some((st.st_dev, st.st_ino)),
                kernel_dev: process::kernel_device(pfd.as_fd()).ok(),
                lease_path,
                unwritable: false,
                fd: None,
            });
        }
        Err(e) => return Err(Error::io("open", lp, e)),
    };
    let st = crate::platform::stat::fstat(&fd).map_err(|e| Error::io("fstat", lp, e))?;
    if st.file_type() != FileType::RegularFile {
        return Err(Error::io(
            "open",
            lp,
            std::io::Error::other("the lease file is not a regular file"),
        ));
    }
    let bytes = process::read_at_most(
        fd.as_fd(),
        st.st_size.max(0) as usize,
        record::RECORD_MAX_BYTES,
    )
    .map_err(|e| Error::io("pread", lp, e))?;
    let content = if bytes.len() > record::RECORD_MAX_BYTES {
        Content::Unreadable
    } else {
        Content::parse(&bytes)
    };
    Ok(Found {
        content,
        key: Some((st.st_dev, st.st_ino)),
        kernel_dev: process::kernel_device(fd.as_fd()).ok(),
        lease_path: canonical(fd.as_fd(), lp),
        unwritable: process::unwritable(fd.as_fd()),
        fd: Some(fd),
    })
}

fn open_path(p: &Path) -> std::io::Result<OwnedFd> {
    crate::platform::paths::open_path(p)
}

fn canonical(fd: std::os::fd::BorrowedFd<'_>, spelled: &Path) -> PathBuf {
    match process::fd_path(fd) {
        Ok(b) if !b.ends_with(b" (deleted)") => PathBuf::from(OsString::from_vec(b)),
        _ => spelled.to_path_buf(),
    }
}

/// Judge a record against the kernel's holders (`None`: no kernel view)
/// and the holders of former lease files. `unwritable`: no release could
/// have been recorded in the file. `held_here`: this process holds the
/// file (its registry says so; asked only without a kernel view).
fn judge(
    content: &Content,
    holders: Option<&[u32]>,
    orphan_pids: &[u32],
    unwritable: bool,
    held_here: bool,
) -> RecordStatus {
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
        return RecordStatus::Unknown;
    };
    let Some(holders) = holders else {
        // No kernel view (the portable platform): this process knows what
        // it holds; a holder that no longer exists is stale; one that does
        // may or may not hold the lock.
        if pid == me.pid && held_here {
            return RecordStatus::Myself;
        }
        return match process::alive(pid) {
            Some(false) => RecordStatus::Stale,
            _ => RecordStatus::Unknown,
        };
    };
    if holders.contains(&pid) {
        return if pid == me.pid {
            RecordStatus::Myself
        } else {
            RecordStatus::Live
        };
    }
    if orphan_pids.contains(&pid) {
        // It holds a former lease file of this lease: alive, and not an
        // image that lost its descriptor.
        return RecordStatus::Live;
    }
    let Some(start) = process::start_time(pid) else {
        return RecordStatus::Stale;
    };
    match r.proc_start {
        None => RecordStatus::Unknown,
        Some(s) if s != start => RecordStatus::Stale,
        // Same process, no longer holding: it may have released into a
        // file that took no write (immutable, append-only, read-only
        // mount), which says nothing of whether its image was replaced.
        Some(_) if unwritable => RecordStatus::Unknown,
        Some(_) => {
            // Same process, and the kernel does not list it as a holder.
            // Only a look at its descriptors shows it has none of the
            // lease file; another user's process cannot be looked at.
            match process::fds_of(pid) {
                FdScan::Found(_) => RecordStatus::ImageReplaced,
                _ => RecordStatus::Unknown,
            }
        }
    }
}
