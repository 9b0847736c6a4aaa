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
//! thread.
//!
//! The thread runs no user code except a callback the user gave, does not
//! keep the process alive, and does not exist in a forked child (the fork
//! handler closes the child's copies of its descriptors). Runtimes that warn
//! about forking a threaded process can stop it around a fork (`pause`,
//! `resume`).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use crate::anchor;
use crate::forkgate;
use crate::lease::{Phase, Shared};

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

struct Watcher {
    inotify: OwnedFd,
    ctl: OwnedFd,
    state: Mutex<WState>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    running: AtomicBool,
}

#[derive(Default)]
struct WState {
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
    let _g = CREATE.try_lock().ok()?;
    let p = WATCHER.load(Ordering::Acquire);
    // SAFETY: as above.
    if let Some(w) = unsafe { p.as_ref() } {
        return Some(w);
    }
    let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
    let ctl = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok()?;
    INOTIFY_FD.store(inotify.as_raw_fd(), Ordering::Release);
    CTL_FD.store(ctl.as_raw_fd(), Ordering::Release);
    let w: &'static Watcher = Box::leak(Box::new(Watcher {
        inotify,
        ctl,
        state: Mutex::new(WState::default()),
        thread: Mutex::new(None),
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
        let _ = rustix::io::write(&self.ctl, &1u64.to_ne_bytes());
    }

    fn ensure_running(&'static self) {
        if self.running.load(Ordering::Acquire) {
            return;
        }
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if self.running.load(Ordering::Acquire) {
            return;
        }
        if let Some(old) = t.take() {
            let _ = old.join();
        }
        self.state().stop = false;
        let spawned = std::thread::Builder::new()
            .name("sidelease-watch".into())
            .stack_size(128 * 1024)
            .spawn(move || self.run());
        if let Ok(h) = spawned {
            self.running.store(true, Ordering::Release);
            *t = Some(h);
        }
    }

    fn run(&'static self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut next_sweep = Instant::now() + recheck_period();
        loop {
            let (timeout, any_held) = self.timeout(next_sweep);
            let woke = self.sleep(timeout);
            if self.state().stop {
                break;
            }
            let mut check: Vec<Arc<Shared>> = Vec::new();
            let mut modified: Vec<Arc<Shared>> = Vec::new();
            let mut all = false;
            if woke.inotify {
                all |= self.read_events(&mut buf, &mut check, &mut modified);
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
        self.running.store(false, Ordering::Release);
    }

    /// How long to sleep: until the next retry or sweep while leases are
    /// held, forever otherwise.
    fn timeout(&self, next_sweep: Instant) -> (Option<Duration>, bool) {
        let st = self.state();
        let any_held = st.entries.values().any(|e| {
            e.lease
                .as_ref()
                .and_then(Weak::upgrade)
                .is_some_and(|s| matches!(s.state().phase, Phase::Held))
        });
        let mut wake_at = if any_held { Some(next_sweep) } else { None };
        for (_, at) in &st.retry {
            wake_at = Some(wake_at.map_or(*at, |w: Instant| w.min(*at)));
        }
        let now = Instant::now();
        (wake_at.map(|w| w.saturating_duration_since(now)), any_held)
    }

    fn sleep(&self, timeout: Option<Duration>) -> Woke {
        let mut fds = [
            PollFd::new(&self.inotify, PollFlags::IN),
            PollFd::new(&self.ctl, PollFlags::IN),
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
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.ctl, &mut b);
        }
        woke
    }

    /// Read every queued event; returns true when events were lost (a
    /// queue overflow: check everything).
    fn read_events(
        &self,
        buf: &mut [MaybeUninit<u8>],
        check: &mut Vec<Arc<Shared>>,
        modified: &mut Vec<Arc<Shared>>,
    ) -> bool {
        let mut overflow = false;
        let mut reader = inotify::Reader::new(self.inotify.as_fd(), buf);
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
                    let _ = inotify::remove_watch(&self.inotify, wd);
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
    w.ensure_running();
    // Added and counted under the lock: the watcher removes unowned watches
    // under it too.
    let mut st = w.state();
    let wd = add(w, fd)?;
    st.entries.entry(wd).or_default().pending += 1;
    Some(Ticket { wd })
}

fn add(w: &Watcher, fd: BorrowedFd<'_>) -> Option<i32> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    inotify::add_watch(&w.inotify, link, MASK).ok()
}

/// The acquisition finished: its watch now belongs to `shared`.
pub(crate) fn attach(t: Ticket, shared: &Arc<Shared>) {
    let Some(w) = watcher() else { return };
    let dirty = {
        let mut st = w.state();
        let e = st.entries.entry(t.wd).or_default();
        e.lease = Some(Arc::downgrade(shared));
        e.pending = e.pending.saturating_sub(1);
        let dirty = std::mem::take(&mut e.dirty);
        if dirty {
            st.asked.push(Arc::downgrade(shared));
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
    if let Ok(wd) = inotify::add_watch(&w.inotify, link, MASK | WatchFlags::MODIFY) {
        st.entries.entry(wd).or_default().lease = Some(Arc::downgrade(shared));
    }
}

/// The lease ended: its watches stay (kept for the next hold), unowned.
pub(crate) fn forget(shared: &Arc<Shared>) {
    // SAFETY: the watcher is a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    let mut st = w.state();
    for e in st.entries.values_mut() {
        if e.lease
            .as_ref()
            .is_some_and(|l| ptr::eq(l.as_ptr(), Arc::as_ptr(shared)))
        {
            e.lease = None;
        }
    }
}

/// Stop the watcher thread (before a fork, for runtimes that warn about
/// forking a threaded process). Held leases are not watched until
/// `resume`; events that come meanwhile wait in the queue.
pub fn pause() {
    // SAFETY: a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    let mut t = w.thread.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = t.take() {
        w.state().stop = true;
        w.wake();
        let _ = h.join();
    }
    w.running.store(false, Ordering::Release);
}

/// Start the watcher thread again if any lease is held.
pub fn resume() {
    // SAFETY: a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    if !w.held().is_empty() {
        w.ensure_running();
    }
}

/// Whether the watcher thread exists now (for tests and diagnostics).
pub fn is_running() -> bool {
    // SAFETY: a leaked box, never freed.
    unsafe { WATCHER.load(Ordering::Acquire).as_ref() }
        .is_some_and(|w| w.running.load(Ordering::Acquire))
}

/// The fork child handler's part: no watcher thread exists in the child;
/// close the child's copies of its descriptors (reading the parent's
/// instance would steal its events) and start afresh when needed.
pub(crate) fn after_fork_in_child() {
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
