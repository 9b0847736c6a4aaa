//! Waking a waiter when a lease file's holder lets go: an inotify watch for
//! the close of any descriptor of the file (SIGKILL included), and an eventfd
//! that cancels a wait from another thread.
//!
//! Every wait of the process shares one inotify instance (the hub): a user
//! may have only 128 instances, and closing one costs ~16 ms here (the
//! kernel waits for an SRCU grace period), while one instance carries
//! thousands of watches. A thread reads the hub's events and signals each
//! waiter through an eventfd of its own, which is what a waiter polls (or
//! hands to its event loop). That thread also removes watches nobody waits
//! on, and closes the instance once nothing has waited for a while, so the
//! slow calls never run on a caller's thread and an idle process keeps no
//! instance.
//!
//! A thread between the kernel and the waiter costs a hand-off of tens of
//! microseconds, so one wait at a time skips it: the first wait while no
//! other has it borrows a second instance (the spare) and polls it itself.
//! A process waiting holds at most these two instances.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::service::Service;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

const MASK: WatchFlags = WatchFlags::CLOSE_WRITE
    .union(WatchFlags::CLOSE_NOWRITE)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DONT_FOLLOW);

/// How long the hub's instance, and the spare, outlive the last wait that
/// used them: waits that come and go keep them, a process that stopped
/// waiting gives them back (closing them is the thread's work, so this can
/// be short).
const LINGER: Duration = Duration::from_millis(200);

/// How long a watch nobody waits on is kept before it is removed.
const UNUSED_DELAY: Duration = Duration::from_millis(20);

struct Hub {
    svc: Service,
    state: Mutex<HubState>,
    /// Set in a forked child for a hub inherited from the parent: its
    /// descriptors are closed and nothing may use it.
    dead: AtomicBool,
}

#[derive(Default)]
struct HubState {
    inotify: Option<OwnedFd>,
    /// The waiters of each watch.
    watches: HashMap<i32, Vec<Arc<Signal>>>,
    /// Watches whose waiters all left, and since when: the thread removes
    /// them a little later, in one go (when hundreds of waits end together,
    /// their ends do not queue behind each other's removals).
    unused: Vec<(i32, Instant)>,
    /// When the thread means to wake next (`None`: only for an event).
    planned: Option<Instant>,
    spare: Spare,
    running: bool,
    paused: bool,
    stop: bool,
}

/// The solo waiter's own instance, lent to one wait at a time.
#[derive(Default)]
struct Spare {
    /// Here while not lent.
    idle: Option<OwnedFd>,
    lent: bool,
    /// Watches the last borrower left on it, and since when (the next
    /// borrower removes them; the thread closes a spare nobody borrows).
    leftover: Vec<i32>,
    returned: Option<Instant>,
}

/// One waiter's doorbell.
struct Signal {
    fd: OwnedFd,
    /// Its watch was dropped by the kernel (the file is gone): arm again.
    stale: AtomicBool,
}

impl Signal {
    fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

static HUB: AtomicPtr<Hub> = AtomicPtr::new(ptr::null_mut());
/// A forked child's inherited hub, kept reachable (never used again).
static ABANDONED: AtomicPtr<Hub> = AtomicPtr::new(ptr::null_mut());
/// The descriptors, for the fork child handler to close without a lock.
static INOTIFY_FD: AtomicI32 = AtomicI32::new(-1);
static CTL_FD: [AtomicI32; 2] = [const { AtomicI32::new(-1) }; 2];
static SPARE_FD: AtomicI32 = AtomicI32::new(-1);
/// The spare's number, idle or lent, from its making to its closing: one
/// atomic, so that no reading of it misses the spare as it changes hands.
static SPARE_ANY: AtomicI32 = AtomicI32::new(-1);
static CREATE: Mutex<()> = Mutex::new(());

fn hub() -> Option<&'static Hub> {
    // SAFETY: hubs are leaked boxes, never freed.
    if let Some(h) = unsafe { HUB.load(Ordering::Acquire).as_ref() } {
        return Some(h);
    }
    crate::forkgate::install();
    // Without it (a fork left it held), this wait polls.
    let _g = crate::service::create_lock(&CREATE)?;
    // SAFETY: as above.
    if let Some(h) = unsafe { HUB.load(Ordering::Acquire).as_ref() } {
        return Some(h);
    }
    let (svc, ctl) = Service::new()?;
    for (slot, fd) in CTL_FD.iter().zip(ctl) {
        slot.store(fd, Ordering::Release);
    }
    let h: &'static Hub = Box::leak(Box::new(Hub {
        svc,
        state: Mutex::new(HubState::default()),
        dead: AtomicBool::new(false),
    }));
    HUB.store(h as *const Hub as *mut Hub, Ordering::Release);
    Some(h)
}

impl Hub {
    fn state(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        self.svc.wake();
    }

    /// Start the thread unless it runs (called with the state locked).
    fn ensure_running(&'static self, st: &mut HubState) {
        if st.running || st.paused {
            return;
        }
        st.stop = false;
        st.running = self.svc.spawn("sidelease-wait", move || self.run());
    }

    fn run(&'static self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut idle_since: Option<Instant> = None;
        loop {
            let (fd, timeout) = {
                let mut st = self.state();
                let now = Instant::now();
                let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut st.unused)
                    .into_iter()
                    .partition(|(_, at)| now >= *at + UNUSED_DELAY);
                st.unused = later;
                for (wd, _) in due {
                    // Under the lock: a wait that is adding this very watch
                    // again (the kernel gives it the same number) cannot
                    // lose it.
                    if st.watches.get(&wd).is_some_and(|w| w.is_empty()) {
                        st.watches.remove(&wd);
                        if let Some(fd) = &st.inotify {
                            let _ = inotify::remove_watch(fd, wd);
                        }
                    }
                }
                // A spare nobody borrowed again is closed (with its
                // watches), after this lock is let go.
                let mut unlent = None;
                if !st.stop && st.spare.returned.is_some_and(|t| now >= t + LINGER) {
                    SPARE_FD.store(-1, Ordering::Release);
                    SPARE_ANY.store(-1, Ordering::Release);
                    st.spare.returned = None;
                    st.spare.leftover.clear();
                    unlent = st.spare.idle.take();
                }
                let idle = st.watches.is_empty() && !st.spare.lent;
                idle_since = if idle {
                    Some(idle_since.unwrap_or(now))
                } else {
                    None
                };
                let close = st.stop || idle_since.is_some_and(|t| now >= t + LINGER);
                let nothing = st.inotify.is_none() && st.spare.idle.is_none() && !st.spare.lent;
                if close || nothing {
                    // Closing is the slow call: made here, on the way out.
                    // Not when pausing: the thread that pauses waits for this one.
                    let fds = if idle && !st.stop {
                        INOTIFY_FD.store(-1, Ordering::Release);
                        SPARE_FD.store(-1, Ordering::Release);
                        SPARE_ANY.store(-1, Ordering::Release);
                        (st.inotify.take(), st.spare.idle.take())
                    } else {
                        (None, None)
                    };
                    st.running = false;
                    drop(st);
                    drop((fds, unlent));
                    return;
                }
                let raw = st.inotify.as_ref().map(|f| f.as_raw_fd());
                let mut wake_at = idle_since.map(|t| t + LINGER);
                if st.spare.lent {
                    // Look now and then instead of being woken when the
                    // spare comes back: that wake would land in the middle
                    // of the borrower's hand-off.
                    wake_at = Some(now + LINGER);
                }
                let unused_due = st.unused.first().map(|(_, at)| *at + UNUSED_DELAY);
                for at in [unused_due, st.spare.returned.map(|t| t + LINGER)]
                    .into_iter()
                    .flatten()
                {
                    wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                }
                st.planned = wake_at;
                drop(st);
                drop(unlent);
                (raw, wake_at.map(|w| w.saturating_duration_since(now)))
            };
            // SAFETY: only this thread closes the instance, and not before
            // this borrow ends.
            let inotify = fd.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
            let mut fds = vec![PollFd::new(&self.svc.ctl, PollFlags::IN)];
            if let Some(i) = &inotify {
                fds.push(PollFd::new(i, PollFlags::IN));
            }
            let ts = timeout.map(|t| Timespec {
                tv_sec: t.as_secs() as i64,
                tv_nsec: t.subsec_nanos() as _,
            });
            let _ = poll(&mut fds, ts.as_ref());
            let ctl = !fds[0].revents().is_empty();
            let events = fds.get(1).is_some_and(|f| !f.revents().is_empty());
            drop(fds);
            if ctl {
                self.svc.woken();
            }
            if let (true, Some(i)) = (events, inotify) {
                self.dispatch(i, &mut buf);
            }
        }
    }

    /// Ring the waiters of every watch that has events.
    fn dispatch(&self, fd: BorrowedFd<'_>, buf: &mut [MaybeUninit<u8>]) {
        let mut reader = inotify::Reader::new(fd, buf);
        // Until EAGAIN: drained.
        while let Ok(ev) = reader.next() {
            let (wd, flags) = (ev.wd(), ev.events());
            let mut st = self.state();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                // Events were lost: every waiter looks again.
                st.watches.values().flatten().for_each(|s| s.ring());
                continue;
            }
            if flags.contains(ReadFlags::IGNORED) {
                for s in st.watches.remove(&wd).into_iter().flatten() {
                    s.stale.store(true, Ordering::Release);
                    s.ring();
                }
                continue;
            }
            // Every event rings: a waiter may have consumed an earlier ring
            // and gone back to sleep while this read went on.
            if let Some(waiters) = st.watches.get(&wd) {
                waiters.iter().for_each(|s| s.ring());
            }
        }
    }
}

/// A wait's watch on one lease file: on the spare instance it polls itself,
/// or through the hub. Without inotify (no instance to be had, or not
/// Linux) it has no descriptor and the waiter falls back to backoff
/// polling.
pub struct ChangeWatch {
    hub: Option<&'static Hub>,
    /// The spare, while this wait has it, and the watches it set on it.
    direct: Option<OwnedFd>,
    direct_wds: Vec<i32>,
    /// Through the hub: this wait's doorbell (made on first use).
    signal: Option<Arc<Signal>>,
    chosen: bool,
    /// The spare's watch was dropped by the kernel: arm again.
    stale: AtomicBool,
    watched: Option<((u64, u64), i32)>,
}

impl ChangeWatch {
    pub fn new() -> ChangeWatch {
        ChangeWatch {
            hub: hub(),
            direct: None,
            direct_wds: Vec::new(),
            signal: None,
            chosen: false,
            stale: AtomicBool::new(false),
            watched: None,
        }
    }

    /// Watch the file the path names now, unless that inode is already
    /// watched. Arm before the attempt that may fail, so no release between
    /// the attempt and the wait goes unseen: true when a new watch was set
    /// (the caller attempts once more before it sleeps).
    pub fn arm(&mut self, path: &Path, identity: (u64, u64)) -> bool {
        if self.hub.is_some_and(|h| h.dead.load(Ordering::Acquire)) {
            // Forked while this wait went on: the parent's instances are
            // the parent's. Start afresh on this process's hub.
            *self = ChangeWatch::new();
        }
        let stale = self.stale.load(Ordering::Acquire)
            || self
                .signal
                .as_ref()
                .is_some_and(|s| s.stale.load(Ordering::Acquire));
        if self.watched.is_some_and(|(id, _)| id == identity) && !stale {
            return false;
        }
        self.stale.store(false, Ordering::Release);
        if let Some(fd) = &self.direct {
            self.watched = None;
            // A watch that cannot be set (limit of watches reached):
            // polling still works, just slower.
            if let Ok(wd) = inotify::add_watch(fd, path, MASK) {
                if !self.direct_wds.contains(&wd) {
                    self.direct_wds.push(wd);
                }
                self.watched = Some((identity, wd));
            }
            return self.watched.is_some();
        }
        let Some(hub) = self.hub else { return false };
        let mut st = hub.state();
        if !std::mem::replace(&mut self.chosen, true) && !st.spare.lent {
            let spare = match st.spare.idle.take() {
                Some(fd) => {
                    SPARE_FD.store(-1, Ordering::Release);
                    // What the last borrower left: its watches would wake
                    // this wait for nothing.
                    for wd in std::mem::take(&mut st.spare.leftover) {
                        let _ = inotify::remove_watch(&fd, wd);
                    }
                    st.spare.returned = None;
                    drain(fd.as_fd());
                    Some(fd)
                }
                None => inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok(),
            };
            if let Some(fd) = spare {
                SPARE_ANY.store(fd.as_raw_fd(), Ordering::Release);
                st.spare.lent = true;
                // The thread closes the spare once nobody has used it for a while.
                hub.ensure_running(&mut st);
                drop(st);
                self.direct = Some(fd);
                return self.arm(path, identity);
            }
        }
        self.leave(&mut st);
        if self.signal.is_none() {
            let Ok(fd) = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK) else {
                return false;
            };
            self.signal = Some(Arc::new(Signal {
                fd,
                stale: AtomicBool::new(false),
            }));
        }
        let Some(signal) = self.signal.clone() else {
            return false;
        };
        signal.stale.store(false, Ordering::Release);
        if st.inotify.is_none() {
            match inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK) {
                Ok(fd) => {
                    INOTIFY_FD.store(fd.as_raw_fd(), Ordering::Release);
                    st.inotify = Some(fd);
                    // A running thread (kept by the spare) polls only what
                    // it knew of when it went to sleep.
                    if st.running {
                        hub.wake();
                    }
                }
                // No instance to be had (the user's limit): poll instead.
                Err(_) => {
                    super::note_unavailable(super::Missing::FileEvents);
                    return false;
                }
            }
        }
        let Some(fd) = &st.inotify else {
            return false;
        };
        // A watch that cannot be set (limit of watches reached): polling
        // still works, just slower.
        let Ok(wd) = inotify::add_watch(fd, path, MASK) else {
            return false;
        };
        st.watches.entry(wd).or_default().push(signal);
        self.watched = Some((identity, wd));
        hub.ensure_running(&mut st);
        true
    }

    /// Stop waiting on the current watch of the hub (state locked).
    fn leave(&mut self, st: &mut HubState) {
        let (Some((_, wd)), Some(signal), Some(hub)) =
            (self.watched.take(), &self.signal, self.hub)
        else {
            return;
        };
        if let Some(waiters) = st.watches.get_mut(&wd) {
            waiters.retain(|s| !Arc::ptr_eq(s, signal));
            if waiters.is_empty() {
                let now = Instant::now();
                st.unused.push((wd, now));
                // Wake the thread only if it would not look soon enough.
                if st.planned.is_none_or(|p| p > now + UNUSED_DELAY) {
                    st.planned = Some(now);
                    hub.wake();
                }
            }
        }
    }

    /// The descriptor that turns readable when the watched file changed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.watched?;
        match &self.direct {
            Some(fd) => Some(fd.as_fd()),
            None => self.signal.as_ref().map(|s| s.fd.as_fd()),
        }
    }

    /// Consume pending events, so the next wait sleeps until a new one.
    pub fn clear(&self) {
        if let Some(fd) = &self.direct {
            // The kernel drops a watch with its inode (IN_IGNORED); a new
            // file may get the same inode number, so note it and arm again.
            let mut buf = [MaybeUninit::<u8>::uninit(); 1024];
            let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
            while let Ok(ev) = reader.next() {
                if ev.events().contains(ReadFlags::IGNORED)
                    && self.watched.is_some_and(|(_, wd)| wd == ev.wd())
                {
                    self.stale.store(true, Ordering::Release);
                }
            }
        } else if let Some(s) = &self.signal {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&s.fd, &mut b);
        }
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

impl Default for ChangeWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ChangeWatch {
    fn drop(&mut self) {
        let Some(hub) = self.hub else { return };
        if hub.dead.load(Ordering::Acquire) {
            return;
        }
        let mut st = hub.state();
        if let Some(fd) = self.direct.take() {
            // Back to the hub; its watches are removed by the thread.
            let now = Instant::now();
            SPARE_FD.store(fd.as_raw_fd(), Ordering::Release);
            st.spare.idle = Some(fd);
            st.spare.lent = false;
            st.spare.leftover.append(&mut self.direct_wds);
            st.spare.returned = Some(now);
            if st.planned.is_none_or(|p| p > now + LINGER) {
                st.planned = Some(now);
                hub.wake();
            }
            return;
        }
        if self.watched.is_some() {
            self.leave(&mut st);
        }
    }
}

/// Stop the hub's thread (before a fork). Waits go on, woken by their
/// re-check timers instead, until `resume`.
pub(crate) fn pause() {
    // SAFETY: a leaked box, never freed.
    let Some(h) = (unsafe { HUB.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    {
        let mut st = h.state();
        st.paused = true;
        st.stop = true;
    }
    h.wake();
    h.svc.join_all();
}

/// Start the hub's thread again if anything waits.
pub(crate) fn resume() {
    // SAFETY: a leaked box, never freed.
    let Some(h) = (unsafe { HUB.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    let mut st = h.state();
    st.paused = false;
    if st.inotify.is_some() || st.spare.idle.is_some() || st.spare.lent {
        h.ensure_running(&mut st);
    }
}

/// The highest number among the hub's inotify instances open now (its own,
/// the spare, idle or lent), or -1: a lease file's descriptor is moved
/// above it (`file::watch::order` says why).
pub fn highest_instance() -> i32 {
    INOTIFY_FD
        .load(Ordering::Acquire)
        .max(SPARE_ANY.load(Ordering::Acquire))
}

/// How many inotify instances the hub holds now (0 or 1).
pub fn instances() -> usize {
    // SAFETY: a leaked box, never freed.
    unsafe { HUB.load(Ordering::Acquire).as_ref() }.is_some_and(|h| h.state().inotify.is_some())
        as usize
}

/// The fork child handler's part: the hub's thread does not exist in the
/// child; close the child's copies of its descriptors (reading the parent's
/// instance would steal its events) and start afresh when needed.
pub(crate) fn after_fork_in_child() {
    let old = HUB.swap(ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: a leaked box, never freed; the store is async-signal-safe.
    if let Some(h) = unsafe { old.as_ref() } {
        h.dead.store(true, Ordering::Release);
        ABANDONED.store(old, Ordering::Release);
    }
    // (A spare lent to a wait is that wait's own descriptor: not closed,
    // only forgotten.)
    SPARE_ANY.store(-1, Ordering::Release);
    for fd in [&INOTIFY_FD, &CTL_FD[0], &CTL_FD[1], &SPARE_FD] {
        let raw = fd.swap(-1, Ordering::AcqRel);
        if raw >= 0 {
            // SAFETY: our descriptor; close is async-signal-safe.
            unsafe { libc::close(raw) };
        }
    }
}

pub use crate::platform::cancel::CancelToken;

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: BorrowedFd<'_>) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let t = rustix::event::Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&t)).unwrap() == 1
    }

    #[test]
    fn a_second_wait_goes_through_the_hub_and_is_woken_too() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let st = crate::platform::stat::fstat(&f).unwrap();
        let id = (st.st_dev, st.st_ino);
        let (mut first, mut second) = (ChangeWatch::new(), ChangeWatch::new());
        assert!(first.arm(&p, id), "a new watch");
        assert!(!first.arm(&p, id), "the same inode: nothing new");
        assert!(second.arm(&p, id));
        // Other tests may hold the spare: at least the second is on the hub.
        assert!(second.direct.is_none());
        drop(f);
        assert!(readable(first.fd().unwrap()));
        assert!(readable(second.fd().unwrap()));
        second.clear();
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let fd = second.fd().unwrap();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
    }

    #[test]
    fn close_of_a_descriptor_wakes_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let st = crate::platform::stat::fstat(&f).unwrap();
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
        // The hub's thread rings the waiter's eventfd.
        let second = rustix::event::Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        assert_eq!(rustix::event::poll(&mut fds, Some(&second)).unwrap(), 1);
        w.clear();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        assert_eq!(rustix::event::poll(&mut fds, Some(&zero)).unwrap(), 0);
    }
}
