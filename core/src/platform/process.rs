//! Process identity and descriptors, as `/proc` tells them.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Who this process is, for the holder record. Fields the platform cannot
/// provide are `None`.
#[derive(Debug, Clone)]
pub struct Identity {
    pub pid: u32,
    pub host: Option<String>,
    pub boot_id: Option<String>,
    pub machine_id: Option<String>,
    pub pid_ns: Option<u64>,
    pub proc_start: Option<u64>,
    /// The identity this one replaced (a forked parent's), kept reachable.
    previous: Option<&'static Identity>,
}

/// This process's identity, computed once per PID: a forked child sees its
/// own, and the lookup takes no lock (it may run right after `fork`).
pub fn current() -> &'static Identity {
    static CURRENT: AtomicPtr<Identity> = AtomicPtr::new(std::ptr::null_mut());
    let pid = std::process::id();
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: every pointer stored is a leaked Box, never freed.
    if let Some(id) = unsafe { p.as_ref() } {
        if id.pid == pid {
            return id;
        }
    }
    let mut id = read_identity(pid);
    // SAFETY: as above.
    id.previous = unsafe { p.as_ref() };
    let fresh: &'static mut Identity = Box::leak(Box::new(id));
    CURRENT.store(fresh, Ordering::Release);
    fresh
}

fn read_identity(pid: u32) -> Identity {
    let host = rustix::system::uname()
        .nodename()
        .to_str()
        .ok()
        .map(str::to_owned);
    Identity {
        pid,
        host,
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        machine_id: read_trimmed("/etc/machine-id"),
        pid_ns: rustix::fs::stat("/proc/self/ns/pid").ok().map(|s| s.st_ino),
        proc_start: start_time(pid),
        previous: None,
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// Start time of a process in clock ticks since boot (`/proc/PID/stat` field
/// 22), or `None` when no such process is visible.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_start_time(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // After the name come fields 3 (state) onwards; field 22 is index 19.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// What a look at another process's descriptors found.
pub enum FdScan<T> {
    Found(T),
    NotFound,
    /// `/proc/PID/fd` could not be read: another user, or a non-dumpable
    /// process. Nothing can be said of its descriptors.
    Denied,
    /// No such process.
    Gone,
}

/// Visit the descriptors of `pid`, giving each descriptor number and the
/// path of `/proc/PID/fd/N`, until `visit` returns `Some`.
pub fn scan_fds<T>(pid: u32, mut visit: impl FnMut(u32, &Path) -> Option<T>) -> FdScan<T> {
    let dir = format!("/proc/{pid}/fd");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ESRCH) => FdScan::Gone,
                _ => FdScan::Denied,
            }
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(fd) = std::str::from_utf8(name.as_bytes())
            .ok()
            .and_then(|s| s.parse().ok())
        else {
            continue;
        };
        if let Some(t) = visit(fd, &entry.path()) {
            return FdScan::Found(t);
        }
    }
    FdScan::NotFound
}

/// Does `pid` have a descriptor of the open file description that owns the
/// flock lock on (device, inode)?
pub fn holds_lock(pid: u32, dev: u64, ino: u64) -> FdScan<u32> {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    scan_fds(pid, |fd, link| {
        let st = rustix::fs::stat(link).ok()?;
        if st.st_dev != dev || st.st_ino != ino {
            return None;
        }
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
        super::locks::fdinfo_holds(&info, major, minor, ino).then_some(fd)
    })
}

/// Find a descriptor of `pid` that names `lease_path` after it was deleted
/// (the kernel shows `<path> (deleted)`) and is one of the given inodes.
pub fn deleted_lease_fd(pid: u32, lease_path: &Path, inodes: &[u64]) -> FdScan<(u32, u64)> {
    let mut wanted = OsString::from(lease_path.as_os_str()).into_vec();
    wanted.extend_from_slice(b" (deleted)");
    scan_fds(pid, |fd, link| {
        let target = std::fs::read_link(link).ok()?;
        if target.as_os_str().as_bytes() != wanted.as_slice() {
            return None;
        }
        let st = rustix::fs::stat(link).ok()?;
        inodes.contains(&st.st_ino).then_some((fd, st.st_ino))
    })
}

/// Every PID visible in `/proc`.
pub fn all_pids() -> io::Result<Vec<u32>> {
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| {
            std::str::from_utf8(e.file_name().as_bytes())
                .ok()?
                .parse()
                .ok()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_odd_names() {
        let stat = b"4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                     1 2 0 0 20 0 1 0 987654 12345 100 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time(b"garbage"), None);
    }

    #[test]
    fn identity_of_this_process() {
        let id = current();
        assert_eq!(id.pid, std::process::id());
        assert!(id.proc_start.is_some());
        assert!(id.boot_id.is_some());
        assert!(id.pid_ns.is_some());
        assert_eq!(start_time(id.pid), id.proc_start);
        assert!(std::ptr::eq(id, current()));
    }
}
