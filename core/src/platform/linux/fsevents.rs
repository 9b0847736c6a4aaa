//! File events for the holder's watch (`watch`): one inotify instance on
//! which every held lease file is watched, through its descriptor, for what
//! only a change of name gives — `IN_ATTRIB` (the link count fell: unlinked
//! or renamed over), `IN_MOVE_SELF`, `IN_DELETE_SELF` — and, once held a
//! while, for writes (`IN_MODIFY`); and the directories of each lease path
//! (`Dirs`).

use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

pub use super::dirs::{Dirs, Heard};

const NAME: WatchFlags = WatchFlags::ATTRIB
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::DELETE_SELF);

/// How long a contender that cannot see former lease files gives their
/// holder to put a replaced one back: events reach the holder's watch
/// within microseconds; this covers its being scheduled.
pub const REANCHOR_GRACE: Duration = Duration::from_millis(20);

/// One event read from the instance.
pub struct Event {
    pub wd: i32,
    /// The queue overflowed: events were lost.
    pub overflow: bool,
    /// The kernel dropped this watch (its inode is gone).
    pub gone: bool,
    /// The file was written.
    pub written: bool,
    pub(super) flags: ReadFlags,
}

/// Whether a held lease file's descriptor is to be numbered above the
/// instances (`file::watch::order` says why). A dying process's
/// deferred closes run newest first, so from the highest descriptor down,
/// since task_work lost its FIFO order (Linux 5.7, "task_work: remove fifo
/// ordering guarantee"); before, oldest first, and a file opened before the
/// instances already went first. Said only from 5.10, the first long-term
/// kernel past that change: before it, nothing is moved (as it was).
pub fn held_files_go_above() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static KNOWN: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 no, 2 yes
    match KNOWN.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let uname = rustix::system::uname();
            let yes = kernel_at_least(&uname.release().to_string_lossy(), (5, 10));
            KNOWN.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

/// Whether a kernel release (`6.1.0-18-amd64`, `5.4.0`) is `min` or later.
fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next().and_then(|x| x.parse::<u32>().ok());
    let minor = it.next().and_then(|x| x.parse::<u32>().ok());
    matches!((major, minor), (Some(a), Some(b)) if (a, b) >= min)
}

/// A new instance, or `None` when none can be had (the user's limit of
/// instances is spent): the caller then polls.
pub fn open() -> Option<OwnedFd> {
    match inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK) {
        Ok(fd) => {
            crate::platform::note_available(super::Missing::FileEvents);
            Some(fd)
        }
        Err(_) => {
            super::note_unavailable(super::Missing::FileEvents);
            None
        }
    }
}

/// Watch the held lease file open as `fd` for changes of name, and for
/// writes when `writes`. Through the descriptor's `/proc/self/fd` name, so
/// it is the file held, wherever its path leads now. The kernel returns the
/// same watch for a file already watched, with the mask given now.
pub fn watch_held(instance: BorrowedFd<'_>, fd: RawFd, writes: bool) -> std::io::Result<i32> {
    let mask = if writes {
        NAME | WatchFlags::MODIFY
    } else {
        NAME
    };
    Ok(inotify::add_watch(
        instance,
        format!("/proc/self/fd/{fd}"),
        mask,
    )?)
}

pub fn unwatch(instance: BorrowedFd<'_>, wd: i32) {
    let _ = inotify::remove_watch(instance, wd);
}

/// Every queued event, until the queue is empty.
pub fn read(instance: BorrowedFd<'_>, buf: &mut [MaybeUninit<u8>], mut each: impl FnMut(Event)) {
    let mut reader = inotify::Reader::new(instance, buf);
    while let Ok(ev) = reader.next() {
        let flags = ev.events();
        each(Event {
            wd: ev.wd(),
            overflow: flags.contains(ReadFlags::QUEUE_OVERFLOW),
            gone: flags.contains(ReadFlags::IGNORED),
            written: flags.contains(ReadFlags::MODIFY),
            flags,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare() {
        assert!(kernel_at_least("6.18.44-fc-v1300", (5, 10)));
        assert!(kernel_at_least("5.10.0-28-amd64", (5, 10)));
        assert!(!kernel_at_least("5.4.0-150-generic", (5, 10)));
        assert!(!kernel_at_least("4.18.0-513.el8.x86_64", (5, 10)));
        assert!(!kernel_at_least("garbage", (5, 10)));
    }
}
