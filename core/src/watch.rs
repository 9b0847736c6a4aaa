//! The holder's watch (DESIGN §4a): one thread per process, sleeping on one
//! inotify instance that watches every held lease file for what only a
//! change of name gives — `IN_ATTRIB` (the link count fell: unlinked, or
//! renamed over), `IN_MOVE_SELF` (moved away), `IN_DELETE_SELF` — and never
//! for what holding a lease does (writes and closes), so it costs no CPU and
//! no system call while nothing happens. A timer re-checks every held lease
//! now and then in case events were lost.
//!
//! Watches outlive the lease (the kernel drops them with the inode), so a
//! lease file this process holds again needs no new watch; a watch that
//! fires for a file nobody here holds is removed then, off every caller's
//! thread. Once nothing has been held for a while the thread closes the
//! instance (a slow call: the kernel waits for an SRCU grace period) and
//! ends, so a process that holds nothing keeps no instance and no thread.
//!
//! The thread runs no user code except a callback the user gave, does not
//! keep the process alive, and does not exist in a forked child (the fork
//! handler closes the child's copies of its descriptors). Runtimes that warn
//! about forking a threaded process can stop it around a fork (`pause`,
//! `resume`).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use crate::anchor;
use crate::forkgate;
use crate::lease::{Phase, Shared};
use crate::service::Service;

const MASK: WatchFlags = WatchFlags::ATTRIB
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::DELETE_SELF);

/// How often every held lease is re-checked without an event (PostgreSQL
/// re-checks its `postmaster.pid` once a minute). Tests shorten it with
/// `SIDELEASE_WATCH_RECHECK_MS`.
pub(crate) fn recheck_period() -> Duration {
    static PERIOD: OnceLock<Duration> = OnceLock::new();
    *PERIOD.get_or_init(|| {
        std::env::var("SIDELEASE_WATCH_RECHECK_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(60))
    })
}

/// How long the instance outlives the last held lease: a service that
/// acquires and releases in a loop keeps it (and its watches), an idle
/// process gives it back.
const LINGER: Duration = Duration::from_secs(2);

struct Watcher {
    svc: Service,
    state: Mutex<WState>,
    running: AtomicBool,
}

#[derive(Default)]
struct WState {
    inotify: Option<OwnedFd>,
    paused: bool,
    /// When the thread means to wake next (`None`: only for an event).
    /// Changes that need it sooner wake it, and only then: a cycle of
    /// acquire and release makes no call to wake it.
    planned: Option<Instant>,
    entries: HashMap<i32, Entry>,
    /// Leases to look at on the next wake-up, asked for by `attach`.
    asked: Vec<Weak<Shared>>,
    /// Leases whose file could not be put back: when to try again.
    retry: Vec<(Weak<Shared>, Instant)>,
    stop: bool,
}

#[derive(Default)]
struct Entry {
    lease: Option<Weak<Shared>>,
    /// Acquisitions that set this watch and have not finished yet.
    pending: usize,
    /// An event came while an acquisition was pending.
    dirty: bool,
}

static WATCHER: AtomicPtr<Watcher> = AtomicPtr::new(ptr::null_mut());
static ABANDONED: AtomicPtr<Watcher> = AtomicPtr::new(ptr::null_mut());
/// The descriptors, for the fork child handler to close without a lock.
static INOTIFY_FD: AtomicI32 = AtomicI32::new(-1);
static CTL_FD: AtomicI32 = AtomicI32::new(-1);
static CREATE: Mutex<()> = Mutex::new(());

fn watcher() -> Option<&'static Watcher> {
    let p = WATCHER.load(Ordering::Acquire);
    // SAFETY: watchers are leaked boxes, never freed.
    if let Some(w) = unsafe { p.as_ref() } {
        return Some(w);
    }
    forkgate::install();
    // Without it (a fork left it held), this lease goes unwatched.
    let _g = crate::service::create_lock(&CREATE)?;
    let p = WATCHER.load(Ordering::Acquire);
    // SAFETY: as above.
    if let Some(w) = unsafe { p.as_ref() } {
        return Some(w);
    }
    let (svc, ctl) = Service::new()?;
    CTL_FD.store(ctl, Ordering::Release);
    let w: &'static Watcher = Box::leak(Box::new(Watcher {
        svc,
        state: Mutex::new(WState::default()),
        running: AtomicBool::new(false),
    }));
    WATCHER.store(w as *const Watcher as *mut Watcher, Ordering::Release);
    Some(w)
}

impl Watcher {
    fn state(&self) -> MutexGuard<'_, WState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        self.svc.wake();
    }

    /// The instance, created when there is none (state locked).
    fn instance<'a>(&self, st: &'a mut WState) -> Option<&'a OwnedFd> {
        if st.inotify.is_none() {
            let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
            INOTIFY_FD.store(fd.as_raw_fd(), Ordering::Release);
            st.inotify = Some(fd);
        }
        st.inotify.as_ref()
    }

    /// Start the thread unless it runs (state locked).
    fn ensure_running(&'static self, st: &mut WState) {
        if self.running.load(Ordering::Acquire) || st.paused {
            return;
        }
        st.stop = false;
        if self.svc.spawn("sidelease-watch", move || self.run()) {
            self.running.store(true, Ordering::Release);
        }
    }

    fn run(&'static self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut next_sweep = Instant::now() + recheck_period();
        let mut idle_since: Option<Instant> = None;
        loop {
            let Some((fd, timeout, any_held)) = self.next_sleep(next_sweep, &mut idle_since) else {
                return;
            };
            // SAFETY: only this thread closes the instance, after this
            // borrow ends.
            let inotify = unsafe { BorrowedFd::borrow_raw(fd) };
            let woke = self.sleep(inotify, timeout);
            if self.state().stop {
                continue;
            }
            let mut check: Vec<Arc<Shared>> = Vec::new();
            let mut modified: Vec<Arc<Shared>> = Vec::new();
            let mut all = false;
            if woke.inotify {
                all |= self.read_events(inotify, &mut buf, &mut check, &mut modified);
            }
            let now = Instant::now();
            {
                let mut st = self.state();
                check.extend(st.asked.drain(..).filter_map(|w| w.upgrade()));
                let due: Vec<Arc<Shared>> = st
                    .retry
                    .iter()
                    .filter(|(_, at)| *at <= now)
                    .filter_map(|(w, _)| w.upgrade())
                    .collect();
                st.retry.retain(|(w, at)| *at > now && w.strong_count() > 0);
                check.extend(due);
            }
            let sweep = any_held && now >= next_sweep;
            if sweep || all {
                check.extend(self.held());
                next_sweep = now + recheck_period();
            }
            check.sort_by_key(|s| Arc::as_ptr(s) as usize);
            check.dedup_by(|a, b| Arc::ptr_eq(a, b));
            for s in check {
                let verify = sweep || modified.iter().any(|m| Arc::ptr_eq(m, &s));
                if let Some(at) = anchor::check(&s, verify) {
                    self.state().retry.push((Arc::downgrade(&s), at));
                }
            }
        }
    }

    /// What to sleep on and how long: until the next retry or sweep while
    /// leases are held, until the instance's time is up while nothing is.
    /// `None`: the thread ends (paused, or idle long enough: then the
    /// instance is closed here, on the way out).
    fn next_sleep(
        &self,
        next_sweep: Instant,
        idle_since: &mut Option<Instant>,
    ) -> Option<(i32, Option<Duration>, bool)> {
        let mut st = self.state();
        let any_held = st.entries.values().any(|e| {
            e.lease
                .as_ref()
                .and_then(Weak::upgrade)
                .is_some_and(|s| matches!(s.state().phase, Phase::Held))
        });
        let busy = st
            .entries
            .values()
            .any(|e| e.pending > 0 || e.lease.as_ref().is_some_and(|l| l.strong_count() > 0))
            || !st.retry.is_empty()
            || !st.asked.is_empty();
        let now = Instant::now();
        *idle_since = if busy {
            None
        } else {
            Some(idle_since.unwrap_or(now))
        };
        let expired = idle_since.is_some_and(|t| now >= t + LINGER);
        if st.stop || expired || st.inotify.is_none() {
            let fd = if expired && !st.stop {
                st.inotify.take()
            } else {
                None
            };
            if fd.is_some() {
                INOTIFY_FD.store(-1, Ordering::Release);
                st.entries.clear();
            }
            self.running.store(false, Ordering::Release);
            drop(st);
            drop(fd);
            return None;
        }
        let mut wake_at = if any_held { Some(next_sweep) } else { None };
        for (_, at) in &st.retry {
            wake_at = Some(wake_at.map_or(*at, |w: Instant| w.min(*at)));
        }
        if let Some(t) = *idle_since {
            wake_at = Some(wake_at.map_or(t + LINGER, |w: Instant| w.min(t + LINGER)));
        }
        st.planned = wake_at;
        let fd = st.inotify.as_ref().map(|f| f.as_raw_fd())?;
        Some((
            fd,
            wake_at.map(|w| w.saturating_duration_since(now)),
            any_held,
        ))
    }

    fn sleep(&self, inotify: BorrowedFd<'_>, timeout: Option<Duration>) -> Woke {
        let mut fds = [
            PollFd::new(&inotify, PollFlags::IN),
            PollFd::new(&self.svc.ctl, PollFlags::IN),
        ];
        let ts = timeout.map(|t| Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: t.subsec_nanos() as _,
        });
        let _ = poll(&mut fds, ts.as_ref());
        let woke = Woke {
            inotify: !fds[0].revents().is_empty(),
        };
        if !fds[1].revents().is_empty() {
            self.svc.woken();
        }
        woke
    }

    /// Read every queued event; returns true when events were lost (a
    /// queue overflow: check everything).
    fn read_events(
        &self,
        inotify: BorrowedFd<'_>,
        buf: &mut [MaybeUninit<u8>],
        check: &mut Vec<Arc<Shared>>,
        modified: &mut Vec<Arc<Shared>>,
    ) -> bool {
        let mut overflow = false;
        let mut reader = inotify::Reader::new(inotify, buf);
        // Until EAGAIN: drained.
        while let Ok(ev) = reader.next() {
            let (wd, flags) = (ev.wd(), ev.events());
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                overflow = true;
                continue;
            }
            let mut st = self.state();
            if flags.contains(ReadFlags::IGNORED) {
                st.entries.remove(&wd);
                continue;
            }
            let Some(e) = st.entries.get_mut(&wd) else {
                continue;
            };
            match e.lease.as_ref().and_then(Weak::upgrade) {
                Some(s) => {
                    if flags.contains(ReadFlags::MODIFY) {
                        modified.push(s.clone());
                    }
                    check.push(s)
                }
                None if e.pending > 0 => e.dirty = true,
                None => {
                    // A file nobody here holds any more: stop hearing about
                    // it. Under the lock, so an acquisition that is adding
                    // this very watch again cannot lose it.
                    st.entries.remove(&wd);
                    let _ = inotify::remove_watch(inotify, wd);
                }
            }
        }
        overflow
    }

    fn held(&self) -> Vec<Arc<Shared>> {
        self.state()
            .entries
            .values()
            .filter_map(|e| e.lease.as_ref().and_then(Weak::upgrade))
            .collect()
    }
}

struct Woke {
    inotify: bool,
}

/// A watch set by an acquisition that has not finished yet.
pub(crate) struct Ticket {
    wd: i32,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(w) = watcher() {
            if let Some(e) = w.state().entries.get_mut(&self.wd) {
                e.pending = e.pending.saturating_sub(1);
            }
        }
    }
}

/// Watch the lease file locked through `fd` (one `inotify_add_watch`; the
/// kernel returns the same watch for a file already watched). `None` when
/// inotify is not available: then only the timer re-checks the lease.
pub(crate) fn begin(fd: BorrowedFd<'_>) -> Option<Ticket> {
    let w = watcher()?;
    // Added and counted under the lock: the watcher removes unowned watches
    // (and closes the instance) under it too.
    let mut st = w.state();
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let wd = inotify::add_watch(w.instance(&mut st)?, link, MASK).ok()?;
    st.entries.entry(wd).or_default().pending += 1;
    w.ensure_running(&mut st);
    Some(Ticket { wd })
}

/// The acquisition finished: its watch now belongs to `shared`.
pub(crate) fn attach(t: Ticket, shared: &Arc<Shared>) {
    let Some(w) = watcher() else { return };
    let dirty = {
        let mut st = w.state();
        let e = st.entries.entry(t.wd).or_default();
        e.lease = Some(Arc::downgrade(shared));
        e.pending = e.pending.saturating_sub(1);
        let mut dirty = std::mem::take(&mut e.dirty);
        if dirty {
            st.asked.push(Arc::downgrade(shared));
        }
        // A thread that sleeps until an event must start the sweep timer.
        if st.planned.is_none() {
            st.planned = Some(Instant::now());
            dirty = true;
        }
        dirty
    };
    std::mem::forget(t);
    if dirty {
        w.wake();
    }
}

/// Watch one more file of a held lease (a re-anchored one), writes
/// included: whoever just put a file at the path may write into it after
/// the holder did (a tool that recreates the file and then truncates it),
/// and the holder writes its record again. (Acquisitions do not watch
/// writes: the holder's own writes would wake the watcher every cycle; a
/// later `add_watch` of the same file sets the narrower mask again.)
pub(crate) fn add_anchor(shared: &Arc<Shared>, fd: BorrowedFd<'_>) {
    let Some(w) = watcher() else { return };
    let mut st = w.state();
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let Some(inotify) = w.instance(&mut st) else {
        return;
    };
    if let Ok(wd) = inotify::add_watch(inotify, link, MASK | WatchFlags::MODIFY) {
        st.entries.entry(wd).or_default().lease = Some(Arc::downgrade(shared));
        w.ensure_running(&mut st);
    }
}

/// The lease ended: its watches stay (kept for the next hold), unowned.
pub(crate) fn forget(shared: &Arc<Shared>) {
    // SAFETY: the watcher is a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    let mut st = w.state();
    let mut others = false;
    for e in st.entries.values_mut() {
        if e.lease
            .as_ref()
            .is_some_and(|l| ptr::eq(l.as_ptr(), Arc::as_ptr(shared)))
        {
            e.lease = None;
        }
        others |= e.pending > 0 || e.lease.as_ref().is_some_and(|l| l.strong_count() > 0);
    }
    // The last lease: the thread starts counting towards closing the
    // instance, unless it wakes soon enough anyway.
    let now = Instant::now();
    if !others && st.planned.is_none_or(|p| p > now + LINGER) {
        st.planned = Some(now);
        drop(st);
        w.wake();
    }
}

/// Stop the watcher thread (before a fork, for runtimes that warn about
/// forking a threaded process). Held leases are not watched until
/// `resume`; events that come meanwhile wait in the queue.
/// The wait hub's thread (platform::notify) is stopped and started with it.
pub fn pause() {
    crate::platform::notify::pause();
    // SAFETY: a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    {
        let mut st = w.state();
        st.paused = true;
        st.stop = true;
    }
    w.wake();
    w.svc.join_all();
    // (The thread clears `running` itself, under the lock, as it ends.)
}

/// Start the watcher thread again if it has an instance (it closes an idle
/// one itself), and the wait hub's.
pub fn resume() {
    crate::platform::notify::resume();
    // SAFETY: a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    let mut st = w.state();
    st.paused = false;
    if st.inotify.is_some() {
        w.ensure_running(&mut st);
    }
}

/// Whether the watcher thread exists now (for tests and diagnostics).
pub fn is_running() -> bool {
    // SAFETY: a leaked box, never freed.
    unsafe { WATCHER.load(Ordering::Acquire).as_ref() }
        .is_some_and(|w| w.running.load(Ordering::Acquire))
}

/// How many inotify instances this library holds now: the holder's watch
/// and the wait hub, each 0 or 1 (for tests and diagnostics).
pub fn inotify_instances() -> usize {
    // SAFETY: a leaked box, never freed.
    let held = unsafe { WATCHER.load(Ordering::Acquire).as_ref() }
        .is_some_and(|w| w.state().inotify.is_some()) as usize;
    held + crate::platform::notify::instances()
}

/// The fork child handler's part: no watcher thread exists in the child;
/// close the child's copies of its descriptors (reading the parent's
/// instance would steal its events) and start afresh when needed.
pub(crate) fn after_fork_in_child() {
    crate::platform::notify::after_fork_in_child();
    for fd in [&INOTIFY_FD, &CTL_FD] {
        let raw = fd.swap(-1, Ordering::AcqRel);
        if raw >= 0 {
            // SAFETY: our descriptor; close is async-signal-safe.
            unsafe { libc::close(raw) };
        }
    }
    let old = WATCHER.swap(ptr::null_mut(), Ordering::AcqRel);
    if !old.is_null() {
        ABANDONED.store(old, Ordering::Release);
    }
}
