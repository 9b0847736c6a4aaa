//! What the library's two threads (the holder's watch, `watch.rs`, and the
//! wait hub, `platform::notify`) have in common: a descriptor that wakes the
//! thread, the handles of the threads started (joined before a fork, since
//! one that closes an instance on its way out may still run), and creating
//! the leaked singleton that owns them without ever blocking on a lock a
//! vanished thread may hold after a fork.

use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::platform::wakefd::WakeFd;

pub(crate) struct Service {
    pub(crate) ctl: WakeFd,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Service {
    /// A new service and its wake descriptors' numbers (for a fork child
    /// handler).
    pub(crate) fn new() -> Option<(Service, [RawFd; 2])> {
        let ctl = WakeFd::new().ok()?;
        let raw = ctl.raw();
        let svc = Service {
            ctl,
            threads: Mutex::new(Vec::new()),
        };
        Some((svc, raw))
    }

    pub(crate) fn wake(&self) {
        self.ctl.ring();
    }

    /// Consume the wake-ups (after the thread's poll saw them).
    pub(crate) fn woken(&self) {
        self.ctl.drain();
    }

    /// Start a thread: named, on a small stack, its handle kept. False if
    /// it could not be started.
    pub(crate) fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) -> bool {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.retain(|t| !t.is_finished());
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .stack_size(128 * 1024)
            .spawn(f);
        match spawned {
            Ok(t) => {
                threads.push(t);
                true
            }
            Err(_) => false,
        }
    }

    /// Wait for every thread started to end (told to stop beforehand).
    pub(crate) fn join_all(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The lock that guards creating a singleton. try_lock, briefly: after a
/// fork it may be held by a thread that is gone (then the caller does
/// without), while another thread holds it only for a moment.
pub(crate) fn create_lock(m: &'static Mutex<()>) -> Option<MutexGuard<'static, ()>> {
    (0..1000).find_map(|_| match m.try_lock() {
        Ok(g) => Some(g),
        Err(_) => {
            std::thread::yield_now();
            None
        }
    })
}
