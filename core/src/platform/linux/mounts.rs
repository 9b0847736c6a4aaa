//! Changes of the mount table. `/proc/self/mountinfo` turns "priority
//! readable" (`POLLPRI`, with `POLLERR`) whenever a filesystem is mounted or
//! unmounted in this process's mount namespace, and `poll` itself re-arms
//! it (proc(5)): a directory mounted over, which no inotify watch hears,
//! wakes whoever polls it, at no cost while nothing is mounted.

use std::os::fd::OwnedFd;

use rustix::event::PollFlags;
use rustix::fs::{Mode, OFlags};

/// The descriptor to poll, or `None` without `/proc`.
pub fn watch() -> Option<OwnedFd> {
    rustix::fs::open(
        "/proc/self/mountinfo",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// What to poll it for: never `POLLIN`, which it always is.
pub const EVENTS: PollFlags = PollFlags::PRI;

/// Whether a poll's answer says the mount table changed.
pub fn changed(revents: PollFlags) -> bool {
    revents.intersects(PollFlags::PRI | PollFlags::ERR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, Timespec};

    #[test]
    fn quiet_while_nothing_is_mounted() {
        let fd = watch().expect("/proc/self/mountinfo");
        let mut fds = [PollFd::new(&fd, EVENTS)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // The first poll may report the table as new to this descriptor;
        // after that, nothing until a mount or unmount.
        let _ = poll(&mut fds, Some(&zero));
        let mut fds = [PollFd::new(&fd, EVENTS)];
        poll(&mut fds, Some(&zero)).unwrap();
        assert!(!changed(fds[0].revents()), "{:?}", fds[0].revents());
    }
}
