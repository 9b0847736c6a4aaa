//! Waking a waiter when a lease file's holder lets go: an inotify watch for
//! the close of any descriptor of the file (SIGKILL included), and an eventfd
//! that cancels a wait from another thread.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

/// Idle inotify instances kept for reuse: closing one costs ~80 µs (p99 far
/// more) and a user may only have 128, so waits borrow and return them. The
/// PID tells a forked child not to share its parent's instances. Each keeps
/// the watches its last wait set: removing a watch is slow too, and doing it
/// when the next wait begins keeps it out of the handoff.
type Idle = (OwnedFd, Vec<i32>);
static POOL: Mutex<(u32, Vec<Idle>)> = Mutex::new((0, Vec::new()));
const POOL_MAX: usize = 16;

fn take_instance() -> Option<OwnedFd> {
    let pid = super::process::pid();
    // try_lock: after fork the lock may be held by a thread that is gone.
    let idle = match POOL.try_lock() {
        Ok(mut pool) => {
            if pool.0 != pid {
                // Inherited from the parent: never read its events, never
                // close what the parent still uses.
                std::mem::take(&mut pool.1)
                    .into_iter()
                    .for_each(std::mem::forget);
                pool.0 = pid;
            }
            pool.1.pop()
        }
        Err(_) => None,
    };
    if let Some((fd, wds)) = idle {
        for wd in wds {
            let _ = inotify::remove_watch(&fd, wd);
        }
        drain(fd.as_fd());
        return Some(fd);
    }
    inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()
}

fn give_back(fd: OwnedFd, wds: Vec<i32>) {
    if let Ok(mut pool) = POOL.try_lock() {
        if pool.0 == super::process::pid() && pool.1.len() < POOL_MAX {
            pool.1.push((fd, wds));
            return;
        }
    }
    for wd in wds {
        let _ = inotify::remove_watch(&fd, wd);
    }
}

fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 1024];
    while let Ok(n) = rustix::io::read(fd, &mut buf) {
        if n.0.is_empty() {
            break;
        }
    }
}

/// A watch on one lease file. Without inotify (limit reached, or not Linux)
/// it has no descriptor and the waiter falls back to backoff polling.
pub struct ChangeWatch {
    inotify: Option<OwnedFd>,
    watched: Option<(u64, u64)>,
    wds: Vec<i32>,
}

impl ChangeWatch {
    pub fn new() -> ChangeWatch {
        ChangeWatch {
            inotify: take_instance(),
            watched: None,
            wds: Vec::new(),
        }
    }

    /// Watch the file the path names now, unless that inode is already
    /// watched. Arm before the attempt that may fail, so no release between
    /// the attempt and the wait goes unseen.
    pub fn arm(&mut self, path: &Path, identity: (u64, u64)) {
        if self.watched == Some(identity) {
            return;
        }
        let Some(fd) = &self.inotify else { return };
        let mask = WatchFlags::CLOSE_WRITE
            | WatchFlags::CLOSE_NOWRITE
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ATTRIB
            | WatchFlags::DONT_FOLLOW;
        match inotify::add_watch(fd, path, mask) {
            Ok(wd) => {
                if !self.wds.contains(&wd) {
                    self.wds.push(wd);
                }
                self.watched = Some(identity);
            }
            Err(_) => {
                // A watch that cannot be set (limit of watches reached):
                // polling still works, just slower.
                self.watched = None;
            }
        }
    }

    /// The descriptor that turns readable when the watched file changed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        if self.watched.is_some() {
            self.inotify.as_ref().map(|f| f.as_fd())
        } else {
            None
        }
    }

    /// Consume pending events, so the next wait sleeps until a new one.
    pub fn clear(&self) {
        if let Some(fd) = &self.inotify {
            drain(fd.as_fd());
        }
    }
}

impl Default for ChangeWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ChangeWatch {
    fn drop(&mut self) {
        if let Some(fd) = self.inotify.take() {
            give_back(fd, std::mem::take(&mut self.wds));
        }
    }
}

/// Cancels waits from another thread. Cancelling is permanent: a token that
/// was cancelled cancels every wait it is given afterwards.
#[derive(Clone, Debug)]
pub struct CancelToken {
    fd: Arc<OwnedFd>,
}

impl CancelToken {
    pub fn new() -> std::io::Result<CancelToken> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(CancelToken { fd: Arc::new(fd) })
    }

    pub fn cancel(&self) {
        // The counter only grows, so the descriptor stays readable.
        let _ = rustix::io::write(&*self.fd, &1u64.to_ne_bytes());
    }

    pub fn is_cancelled(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &*self.fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// Readable once cancelled (for event loops that wait on descriptors).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_is_sticky() {
        let t = CancelToken::new().unwrap();
        assert!(!t.is_cancelled());
        t.clone().cancel();
        assert!(t.is_cancelled());
        assert!(t.is_cancelled());
    }

    #[test]
    fn close_of_a_descriptor_wakes_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let st = rustix::fs::fstat(&f).unwrap();
        let mut w = ChangeWatch::new();
        w.arm(&p, (st.st_dev, st.st_ino));
        let fd = w.fd().expect("inotify available");
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
        drop(f);
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 1);
        w.clear();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
    }
}
