//! Who holds a lease file, from the kernel: the PIDs holding the current
//! inode, and the live processes still holding a deleted former inode of the
//! same lease path (a split lock domain).

use std::path::Path;

use serde::Serialize;

use crate::platform::locks::FlockLock;
use crate::platform::process::{self, FdScan};
use crate::registry;

/// A live process holding a deleted former inode of the lease file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub pid: u32,
    pub inode: u64,
    #[serde(skip)]
    pub fd: Option<u32>,
}

#[derive(Debug, Default)]
pub(crate) struct SplitScan {
    pub orphans: Vec<Orphan>,
    /// Exclusive flock locks on the device held by processes whose
    /// descriptors this user may not read.
    pub unattributed: usize,
}

/// PIDs whose descriptors own the flock lock on (dev, ino). `/proc/locks`
/// names the process that took the lock, which may have exited while a
/// forked child keeps the descriptor; fdinfo `lock:` lines tell who really
/// holds it, so a listed PID is checked and, when it does not hold the lock,
/// every visible process is.
pub(crate) fn kernel_holders(dev: u64, ino: u64, locks: &[FlockLock]) -> Vec<u32> {
    let me = std::process::id();
    let mut listed: Vec<u32> = locks
        .iter()
        .filter(|l| l.ino == ino)
        .map(|l| l.pid)
        .collect();
    listed.sort_unstable();
    listed.dedup();
    let mut holders = Vec::new();
    let mut unverified = false;
    for &pid in &listed {
        if pid == me && registry::get().lock().get((dev, ino)).is_some() {
            holders.push(pid);
            continue;
        }
        match process::holds_lock(pid, dev, ino) {
            FdScan::Found(_) | FdScan::Denied => holders.push(pid),
            FdScan::NotFound | FdScan::Gone => unverified = true,
        }
    }
    if unverified {
        for pid in process::all_pids().unwrap_or_default() {
            if !listed.contains(&pid)
                && matches!(process::holds_lock(pid, dev, ino), FdScan::Found(_))
            {
                holders.push(pid);
            }
        }
        if holders.is_empty() {
            // Held by something this user cannot see: report what the
            // kernel lists rather than nothing.
            holders = listed;
        }
    }
    holders.sort_unstable();
    holders
}

/// The holders of (dev, ino) for an in-use answer. When the record names a
/// process whose descriptors show it owns the lock, that is the kernel's
/// answer without reading `/proc/locks` (whose read can cost an RCU grace
/// period); otherwise, as `kernel_holders`.
pub(crate) fn holders_of(dev: u64, ino: u64, record_pid: Option<u32>) -> Vec<u32> {
    if let Some(pid) = record_pid {
        if matches!(process::holds_lock(pid, dev, ino), FdScan::Found(_)) {
            return vec![pid];
        }
    }
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    match crate::platform::locks::flock_locks_on(major, minor) {
        Ok(locks) => kernel_holders(dev, ino, &locks),
        Err(_) => Vec::new(),
    }
}

/// Live processes holding an exclusive flock on a deleted inode that was
/// `lease_path`. `current` is the inode the path names now (if any);
/// `first_only` stops at the first orphan found (the acquire guard).
pub(crate) fn split_scan(
    lease_path: &Path,
    dev: u64,
    current: Option<u64>,
    locks: &[FlockLock],
    first_only: bool,
) -> SplitScan {
    let me = std::process::id();
    let mut scan = SplitScan::default();
    let mut candidates: Vec<(u32, Vec<u64>)> = Vec::new();
    for l in locks
        .iter()
        .filter(|l| l.exclusive && Some(l.ino) != current)
    {
        if l.pid == me {
            // This process's own leases are known without reading /proc.
            if let Some(s) = registry::get().lock().get((dev, l.ino)) {
                if s.lease_path == lease_path {
                    scan.orphans.push(Orphan {
                        pid: me,
                        inode: l.ino,
                        fd: u32::try_from(s.fd).ok(),
                    });
                    if first_only {
                        return scan;
                    }
                }
                continue;
            }
        }
        match candidates.iter_mut().find(|(p, _)| *p == l.pid) {
            Some((_, inodes)) => inodes.push(l.ino),
            None => candidates.push((l.pid, vec![l.ino])),
        }
    }
    for (pid, mut inodes) in candidates {
        // One pass over a process's descriptors finds each orphan inode.
        while !inodes.is_empty() {
            match process::deleted_lease_fd(pid, lease_path, &inodes) {
                FdScan::Found((fd, ino)) => {
                    scan.orphans.push(Orphan {
                        pid,
                        inode: ino,
                        fd: Some(fd),
                    });
                    if first_only {
                        return scan;
                    }
                    inodes.retain(|&i| i != ino);
                }
                FdScan::Denied => {
                    scan.unattributed += inodes.len();
                    break;
                }
                FdScan::NotFound | FdScan::Gone => break,
            }
        }
    }
    scan
}

/// The record inside an orphan's deleted lease file, read through its
/// descriptor link (same user only).
pub(crate) fn orphan_record(orphan: &Orphan) -> Option<crate::record::Record> {
    let fd = orphan.fd?;
    let bytes = std::fs::read(format!("/proc/{}/fd/{fd}", orphan.pid)).ok()?;
    crate::record::Content::parse(&bytes).record().cloned()
}
