//! The lease file's descriptor numbered above the library's inotify
//! instances, so that a killed holder's lock is let go before any
//! instance's teardown (docs/algorithm.md, "A killed holder's lock").

use super::*;

/// Acquisitions with the watch on that are in flight: the thread keeps
/// the instance while there are any (a wait made before it, and the lease
/// file numbered above it, stay so).
pub(super) static ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

/// An acquisition in flight, counted in `ATTEMPTS` until dropped, made
/// in the fork epoch it holds: a fork child starts at 0 (the parent's other
/// threads, and their attempts, are not in it), and an attempt of the
/// parent's ends there without counting down.
pub(crate) struct Attempt(u64);

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.0 == crate::registry::epoch() {
            ATTEMPTS.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The fork child handler's part (after the registry's new epoch).
pub(super) fn after_fork_in_child() {
    ATTEMPTS.store(0, Ordering::Release);
}

/// Make the watch's descriptors before an acquisition opens a lease file,
/// so that its descriptor is numbered after them (see `instance_fd`); kept
/// while the returned attempt lives. After the first, two atomic
/// operations. `None` where lease files are not numbered above instances.
pub(crate) fn prepare() -> Option<Attempt> {
    if !fsevents::held_files_go_above() {
        return None;
    }
    let attempt = Attempt(crate::registry::epoch());
    ATTEMPTS.fetch_add(1, Ordering::AcqRel);
    if INOTIFY_FD.load(Ordering::Acquire) < 0 {
        if let Some(w) = watcher() {
            let mut st = w.state();
            if w.instance(&mut st).is_some() {
                // The thread closes the instance once nothing has used it
                // for a while and no attempt is in flight.
                w.ensure_running(&mut st);
            }
        }
    }
    Some(attempt)
}

/// The watch's inotify instance, or -1. When a process ends, the kernel
/// runs the last part of its descriptors' closes, the part that lets a
/// flock go, in the reverse order of their numbers: an instance numbered
/// above a held lease file is torn down first, and that teardown waits for
/// an SRCU grace period (several ms, 10-20 under load here), all of it
/// between a SIGKILL and the next holder's lock (issue 38's failover).
pub(crate) fn instance_fd() -> i32 {
    INOTIFY_FD.load(Ordering::Acquire)
}

/// A lease file's descriptor `fd` (listed in `slot`), renumbered above
/// every inotify instance of ours when it is below one (`instance_fd`
/// says why); the number to use.
pub(crate) fn above_instances(fd: RawFd, slot: u32) -> RawFd {
    if !fsevents::held_files_go_above() {
        return fd;
    }
    let floor = instance_fd().max(crate::platform::notify::highest_instance());
    if fd < floor {
        crate::registry::raise_listed(fd, slot, floor + 1)
    } else {
        fd
    }
}
