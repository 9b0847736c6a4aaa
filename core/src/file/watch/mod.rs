//! The holder's watch (DESIGN §4a): one thread per process, sleeping on one
//! inotify instance that watches every held lease file for what only a
//! change of name gives — `IN_ATTRIB` (the link count fell: unlinked, or
//! renamed over), `IN_MOVE_SELF` (moved away), `IN_DELETE_SELF` — and never
//! for what holding a lease does (writes and closes), so it costs no CPU and
//! no system call while nothing happens. The directories of each lease path
//! are watched too (`dirs`), and the mount table (`platform::mounts`): a
//! directory renamed, replaced or mounted over makes the path lead
//! elsewhere without touching the file. A timer re-checks every held lease
//! now and then in case events were lost.
//!
//! A lease held for a while ([`CONTENT_AFTER`]) also has its file watched
//! for writes (`IN_MODIFY`), so a record someone truncated or overwrote is
//! written back at once; the holder's own writes at acquisition and release
//! come before and after that, so a cycle of acquire and release never
//! wakes the thread for each write. Those watches start in batches: the
//! thread plans a wake-up for them at most once per [`CONTENT_AFTER`], and
//! keeps them in order of time, so a wake-up for one lease looks at no
//! other (only the periodic sweep looks at every held lease).
//!
//! Where inotify cannot be had (the user's instances or watches are spent),
//! the lease is looked at on a timer instead ([`POLL_EVERY`]), and watched
//! again as soon as the kernel allows.
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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::file::anchor;
use crate::forkgate;
use crate::lease::{Phase, Shared};
use crate::platform::fsevents::{self, Dirs, Heard};
use crate::platform::mounts;
use crate::registry::Key;
use crate::service::Service;

mod order;
mod table;
mod upkeep;

pub(crate) use order::{above_instances, prepare, Attempt};

/// How long a lease is held before its file is watched for writes too: a
/// service holds its lease for hours, a loop of acquire and release for
/// microseconds, and only the first needs it (a write by someone else in
/// that first moment is put right when the watch starts).
pub const CONTENT_AFTER: Duration = Duration::from_millis(100);

/// How much later than [`CONTENT_AFTER`] that watch may start: an
/// acquisition wakes the thread only if it would not come round sooner
/// anyway, so a loop of acquire and release wakes it about once a second,
/// not once a cycle (`next_sleep` plans that while the loop goes on).
pub const CONTENT_LATE: Duration = Duration::from_secs(1);

/// How often a lease that inotify does not cover is looked at.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// How often to try again to watch a lease that inotify did not cover.
const UPGRADE_EVERY: Duration = Duration::from_secs(1);

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
    events: Option<OwnedFd>,
    /// The mount table, polled for changes while the thread runs.
    mounts: Option<OwnedFd>,
    paused: bool,
    /// When the thread means to wake next (`None`: only for an event).
    /// Changes that need it sooner wake it, and only then: a cycle of
    /// acquire and release makes no call to wake it.
    planned: Option<Instant>,
    /// When content watches were last started: the next start waits
    /// [`CONTENT_AFTER`] after it (see `next_sleep`).
    content_ran: Option<Instant>,
    /// The content watches to start, by when (an entry whose `content_at`
    /// no longer says so was released or held again since, and is passed
    /// over): the thread finds the next one without looking at every
    /// watch.
    content_due: std::collections::VecDeque<(Instant, i32)>,
    /// Acquisitions that set a watch and have not finished yet (the sum of
    /// the entries' `pending`).
    pending: usize,
    /// The watches given to each lease (by its address, which its weak
    /// references in `entries` keep from being reused): a lease that ends
    /// finds its own without looking at every watch.
    by_lease: HashMap<usize, Vec<i32>>,
    entries: HashMap<i32, Entry>,
    dirs: Dirs,
    /// Some held lease may lack the watch of its path's directories.
    chains_wanted: bool,
    /// Lease directories (path, identity) an acquisition found unwatched:
    /// watched next, whether or not that lease is still held by then (a
    /// loop of acquisitions must not ask again every cycle).
    new_dirs: Vec<(std::path::PathBuf, Key)>,
    /// Leases to look at on the next wake-up, asked for by `attach`.
    asked: Vec<Weak<Shared>>,
    /// Leases whose file could not be put back: when to try again.
    retry: Vec<(Weak<Shared>, Instant)>,
    /// Leases inotify does not cover (no instance, no watch to be had):
    /// looked at every [`POLL_EVERY`].
    polled: Vec<Weak<Shared>>,
    next_poll: Option<Instant>,
    next_upgrade: Option<Instant>,
    stop: bool,
}

#[derive(Default)]
struct Entry {
    lease: Option<Weak<Shared>>,
    /// The lease file (device, inode) this watch is on.
    key: Option<Key>,
    /// Acquisitions that set this watch and have not finished yet.
    pending: usize,
    /// An event came while an acquisition was pending.
    dirty: bool,
    /// Writes are watched too.
    content: bool,
    /// When to start watching writes.
    content_at: Option<Instant>,
}

static WATCHER: AtomicPtr<Watcher> = AtomicPtr::new(ptr::null_mut());
static ABANDONED: AtomicPtr<Watcher> = AtomicPtr::new(ptr::null_mut());
/// The descriptors, for the fork child handler to close without a lock.
static INOTIFY_FD: AtomicI32 = AtomicI32::new(-1);
static MOUNTS_FD: AtomicI32 = AtomicI32::new(-1);
static CTL_FD: [AtomicI32; 2] = [const { AtomicI32::new(-1) }; 2];
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
    for (slot, fd) in CTL_FD.iter().zip(ctl) {
        slot.store(fd, Ordering::Release);
    }
    let w: &'static Watcher = Box::leak(Box::new(Watcher {
        svc,
        state: Mutex::new(WState::default()),
        running: AtomicBool::new(false),
    }));
    WATCHER.store(w as *const Watcher as *mut Watcher, Ordering::Release);
    Some(w)
}

/// What one sleep of the thread waits on.
struct Plan {
    events: Option<i32>,
    mounts: Option<i32>,
    timeout: Option<Duration>,
    any_held: bool,
}

struct Woke {
    events: bool,
    mounts: bool,
}

/// What the events read said.
#[derive(Default)]
struct Events {
    check: Vec<Arc<Shared>>,
    modified: Vec<Arc<Shared>>,
    /// Look at every lease (events were lost, or a directory of some lease
    /// path changed).
    all: bool,
    /// Something appeared where a lease file is missing.
    appeared: bool,
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
        if st.events.is_none() {
            let fd = fsevents::open()?;
            INOTIFY_FD.store(fd.as_raw_fd(), Ordering::Release);
            st.events = Some(fd);
        }
        st.events.as_ref()
    }

    /// Start the thread unless it runs (state locked).
    fn ensure_running(&'static self, st: &mut WState) {
        if self.running.load(Ordering::Acquire) || st.paused {
            return;
        }
        st.stop = false;
        if st.mounts.is_none() {
            if let Some(fd) = mounts::watch() {
                MOUNTS_FD.store(fd.as_raw_fd(), Ordering::Release);
                st.mounts = Some(fd);
            }
        }
        if self.svc.spawn("sidelease-watch", move || self.run()) {
            self.running.store(true, Ordering::Release);
        }
    }

    fn run(&'static self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut next_sweep = Instant::now() + recheck_period();
        let mut idle_since: Option<Instant> = None;
        loop {
            let Some(plan) = self.next_sleep(next_sweep, &mut idle_since) else {
                return;
            };
            let woke = self.sleep(&plan);
            if self.state().stop {
                continue;
            }
            let mut heard = Events::default();
            if let (true, Some(fd)) = (woke.events, plan.events) {
                // SAFETY: only this thread closes the instance, after this
                // borrow ends.
                let events = unsafe { BorrowedFd::borrow_raw(fd) };
                self.read_events(events, &mut buf, &mut heard);
            }
            heard.all |= woke.mounts;
            let now = Instant::now();
            let mut check = std::mem::take(&mut heard.check);
            let mut verify: Vec<Arc<Shared>> = std::mem::take(&mut heard.modified);
            {
                let mut st = self.state();
                check.extend(st.asked.drain(..).filter_map(|w| w.upgrade()));
                let due: Vec<Arc<Shared>> = st
                    .retry
                    .iter()
                    .filter(|(_, at)| heard.appeared || *at <= now)
                    .filter_map(|(w, _)| w.upgrade())
                    .collect();
                st.retry
                    .retain(|(w, at)| !heard.appeared && *at > now && w.strong_count() > 0);
                check.extend(due);
                st.polled.retain(|w| w.strong_count() > 0);
                if st.next_poll.is_some_and(|t| t <= now) {
                    let polled: Vec<Arc<Shared>> =
                        st.polled.iter().filter_map(Weak::upgrade).collect();
                    st.next_poll = (!polled.is_empty()).then(|| now + POLL_EVERY);
                    verify.extend(polled.iter().cloned());
                    check.extend(polled);
                }
            }
            let sweep = plan.any_held && now >= next_sweep;
            if sweep || heard.all {
                check.extend(self.held());
                next_sweep = now + recheck_period();
                self.state().chains_wanted = true;
            }
            check.sort_by_key(|s| Arc::as_ptr(s) as usize);
            check.dedup_by(|a, b| Arc::ptr_eq(a, b));
            for s in check {
                crate::faults::step("watch.check");
                let v = sweep || verify.iter().any(|m| Arc::ptr_eq(m, &s));
                if let Some(at) = anchor::check(&s, v) {
                    self.state().retry.push((Arc::downgrade(&s), at));
                }
            }
            self.watch_content(now);
            self.upkeep(now);
        }
    }

    /// What to sleep on and how long: until the next retry, poll, content
    /// watch or sweep while leases are held, until the instance's time is
    /// up while nothing is. `None`: the thread ends (paused, or idle long
    /// enough: then the instance is closed here, on the way out).
    fn next_sleep(&self, next_sweep: Instant, idle_since: &mut Option<Instant>) -> Option<Plan> {
        // Nothing here looks at every lease: a wake-up for one more lease
        // (its directory to watch) costs the same with 10,000 held. (A
        // lost lease not yet released counts as held: the sweep passes
        // it over.)
        let mut st = self.state();
        st.polled.retain(|w| w.strong_count() > 0);
        let any_held = !st.by_lease.is_empty() || !st.polled.is_empty();
        let busy = any_held || st.pending > 0 || !st.retry.is_empty() || !st.asked.is_empty();
        let now = Instant::now();
        *idle_since = if busy {
            None
        } else {
            Some(idle_since.unwrap_or(now))
        };
        let expired = idle_since.is_some_and(|t| now >= t + LINGER)
            && order::ATTEMPTS.load(Ordering::Acquire) == 0;
        if st.stop || expired {
            let fds = if expired && !st.stop {
                (st.events.take(), st.mounts.take())
            } else {
                (None, None)
            };
            if fds.0.is_some() {
                INOTIFY_FD.store(-1, Ordering::Release);
                st.entries.clear();
                st.by_lease.clear();
                st.content_due.clear();
                st.pending = 0;
                st.dirs.clear();
            }
            if fds.1.is_some() {
                MOUNTS_FD.store(-1, Ordering::Release);
            }
            self.running.store(false, Ordering::Release);
            drop(st);
            drop(fds);
            return None;
        }
        let mut wake_at = if any_held { Some(next_sweep) } else { None };
        let mut soonest = |at: Instant| {
            wake_at = Some(wake_at.map_or(at, |w: Instant| w.min(at)));
        };
        for (_, at) in &st.retry {
            soonest(*at);
        }
        // Content watches start together, at most once per CONTENT_AFTER:
        // each at its own time, leases acquired one after another woke the
        // thread once per acquisition, and every wake-up looks at every
        // held lease (10,000 held made the thread busy and each acquisition
        // 3× slower). A lease's watch so starts within twice CONTENT_AFTER.
        let asked_for = !st.content_due.is_empty();
        match st.next_content() {
            Some(at) => soonest(st.content_ran.map_or(at, |r| at.max(r + CONTENT_AFTER))),
            // Asked for and let go since (a loop of acquire and release):
            // come round within CONTENT_LATE anyway, so the loop's next
            // acquisitions find the thread planned and need not wake it.
            // Planning the sweep instead, each one woke it (another lease
            // held all along: one wake-up per cycle).
            None if asked_for => soonest(now + CONTENT_LATE),
            None => {}
        }
        if let Some(t) = st.next_poll {
            soonest(t);
        }
        if let Some(t) = st.next_upgrade {
            soonest(t);
        }
        if let Some(t) = *idle_since {
            // While lingering, come round at least every CONTENT_LATE, so
            // an acquisition meanwhile need not wake the thread. Past the
            // linger with an attempt still in flight (a wait: the instance
            // stays while it lasts), once per CONTENT_LATE too: planning
            // the end of the linger, passed, spun the thread at a whole
            // core for as long as the wait went on.
            let end = t + LINGER;
            soonest(if end > now {
                end.min(now + CONTENT_LATE)
            } else {
                now + CONTENT_LATE
            });
        }
        if !st.asked.is_empty() || st.chains_wanted || !st.new_dirs.is_empty() {
            soonest(now);
        }
        if st.pending > 0 {
            // An acquisition that set a watch and gives up (its file was
            // replaced, its claim withdrawn) counts down without waking
            // the thread: come round to see whether all is idle then.
            soonest(now + CONTENT_LATE);
        }
        st.planned = wake_at;
        Some(Plan {
            events: st.events.as_ref().map(|f| f.as_raw_fd()),
            mounts: st.mounts.as_ref().map(|f| f.as_raw_fd()),
            timeout: wake_at.map(|w| w.saturating_duration_since(now)),
            any_held,
        })
    }

    fn sleep(&self, plan: &Plan) -> Woke {
        // SAFETY: only this thread closes these, after the poll.
        let events = plan.events.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
        // SAFETY: as above.
        let mounts = plan.mounts.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
        let mut fds = vec![PollFd::new(&self.svc.ctl, PollFlags::IN)];
        if let Some(fd) = &events {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        if let Some(fd) = &mounts {
            fds.push(PollFd::new(fd, mounts::EVENTS));
        }
        let ts = plan.timeout.map(|t| Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: t.subsec_nanos() as _,
        });
        let _ = poll(&mut fds, ts.as_ref());
        let ctl = !fds[0].revents().is_empty();
        let mut i = 1;
        let mut woke = Woke {
            events: false,
            mounts: false,
        };
        if events.is_some() {
            woke.events = !fds[i].revents().is_empty();
            i += 1;
        }
        if mounts.is_some() {
            woke.mounts = mounts::changed(fds[i].revents());
        }
        if ctl {
            self.svc.woken();
        }
        woke
    }

    /// Read every queued event. A queue overflow means events were lost:
    /// check everything.
    fn read_events(&self, events: BorrowedFd<'_>, buf: &mut [MaybeUninit<u8>], out: &mut Events) {
        fsevents::read(events, buf, |ev| {
            if ev.overflow {
                out.all = true;
                return;
            }
            let wd = ev.wd;
            let mut st = self.state();
            match st.dirs.heard(events, &ev) {
                Heard::PathChanged => {
                    out.all = true;
                    st.chains_wanted = true;
                    return;
                }
                Heard::Appeared => {
                    out.appeared = true;
                    return;
                }
                Heard::Nothing => {}
            }
            if ev.gone {
                st.remove(wd);
                return;
            }
            let Some(e) = st.entries.get_mut(&wd) else {
                return;
            };
            match e.lease.as_ref().and_then(Weak::upgrade) {
                Some(s) => {
                    if ev.written {
                        out.modified.push(s.clone());
                    }
                    out.check.push(s)
                }
                None if e.pending > 0 => e.dirty = true,
                None => {
                    // A file nobody here holds any more: stop hearing about
                    // it. Under the lock, so an acquisition that is adding
                    // this very watch again cannot lose it.
                    st.remove(wd);
                    fsevents::unwatch(events, wd);
                }
            }
        });
    }

    /// Every lease this process holds that the thread knows of.
    fn held(&self) -> Vec<Arc<Shared>> {
        let st = self.state();
        let mut v: Vec<Arc<Shared>> = st
            .entries
            .values()
            .filter_map(|e| e.lease.as_ref().and_then(Weak::upgrade))
            .chain(st.polled.iter().filter_map(Weak::upgrade))
            .collect();
        v.sort_by_key(|s| Arc::as_ptr(s) as usize);
        v.dedup_by(|a, b| Arc::ptr_eq(a, b));
        v
    }
}

/// A watch set by an acquisition that has not finished yet (`wd: None`:
/// inotify could not watch it, the lease will be polled).
pub(crate) struct Ticket {
    wd: Option<i32>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let (Some(w), Some(wd)) = (watcher(), self.wd) else {
            return;
        };
        w.state().finish(wd);
    }
}

/// Watch the lease file locked through `fd` (one `inotify_add_watch`; the
/// kernel returns the same watch for a file already watched, and this
/// narrows it back to changes of name, so the acquisition's own write
/// wakes nobody). `None` only when not even the watcher can be had; a
/// ticket without a watch makes the lease polled.
pub(crate) fn begin(fd: BorrowedFd<'_>) -> Option<Ticket> {
    let w = watcher()?;
    // Added and counted under the lock: the watcher removes unowned watches
    // (and closes the instance) under it too.
    let mut st = w.state();
    let wd = w
        .instance(&mut st)
        .and_then(|i| fsevents::watch_held(i.as_fd(), fd.as_raw_fd(), false).ok());
    if let Some(wd) = wd {
        let e = st.entries.entry(wd).or_default();
        e.pending += 1;
        e.content = false;
        st.pending += 1;
    }
    w.ensure_running(&mut st);
    Some(Ticket { wd })
}

/// The acquisition finished: its watch now belongs to `shared`.
pub(crate) fn attach(t: Ticket, shared: &Arc<Shared>) {
    let Some(w) = watcher() else { return };
    let now = Instant::now();
    let Some(wd) = t.wd else {
        std::mem::forget(t);
        w.poll_instead(shared);
        w.state().chains_wanted = true;
        w.wake();
        return;
    };
    let key = shared.state().anchors.first().map(|a| a.key);
    let dir = match (shared.record.dir_device, shared.record.dir_inode) {
        (Some(d), Some(i)) => Some((d, i)),
        _ => None,
    };
    let wake = {
        let mut st = w.state();
        let e = st.own(wd, shared);
        e.key = key;
        let mut wake = std::mem::take(&mut e.dirty);
        st.finish(wd);
        let content_at = now + CONTENT_AFTER;
        st.content_at(wd, content_at);
        if wake {
            st.asked.push(Arc::downgrade(shared));
        }
        // The directories of a path not watched yet: once per directory
        // (both paths of a lease spelled through a symlink).
        match dir {
            Some(d) => {
                for path in shared.paths() {
                    let p = crate::path::parent_of(path);
                    if st.dirs.is_chained(p, d)
                        || st.new_dirs.iter().any(|(q, k)| *k == d && q == p)
                    {
                        continue;
                    }
                    st.new_dirs.push((p.to_path_buf(), d));
                    wake = true;
                }
            }
            None => {
                st.chains_wanted = true;
                wake = true;
            }
        }
        // A thread that sleeps well past the time to watch writes must plan
        // again (once; a loop of acquisitions finds it planned already).
        if st.planned.is_none_or(|p| p > content_at + CONTENT_LATE) {
            st.planned = Some(now);
            wake = true;
        }
        wake
    };
    std::mem::forget(t);
    if wake {
        w.wake();
    }
}

/// Watch one more file of a held lease (a re-anchored one), writes
/// included: whoever just put a file at the path may write into it after
/// the holder did (a tool that recreates the file and then truncates it),
/// and the holder writes its record again. (Acquisitions do not watch
/// writes at first: the holder's own writes would wake the watcher every
/// cycle; a later `add_watch` of the same file sets the narrower mask
/// again.) Without a watch, the lease is polled.
pub(crate) fn add_anchor(shared: &Arc<Shared>, fd: BorrowedFd<'_>, key: Key) {
    let Some(w) = watcher() else { return };
    let mut st = w.state();
    let wd = w
        .instance(&mut st)
        .and_then(|i| fsevents::watch_held(i.as_fd(), fd.as_raw_fd(), true).ok());
    match wd {
        Some(wd) => {
            let e = st.own(wd, shared);
            e.key = Some(key);
            e.content = true;
            st.chains_wanted = true;
            w.ensure_running(&mut st);
        }
        None => {
            w.ensure_running(&mut st);
            drop(st);
            w.poll_instead(shared);
        }
    }
}

/// Look at `shared` again at `at` (a caller could not put its file back).
pub(crate) fn retry_at(shared: &Arc<Shared>, at: Instant) {
    let Some(w) = watcher() else { return };
    let mut st = w.state();
    st.retry.push((Arc::downgrade(shared), at));
    w.ensure_running(&mut st);
    drop(st);
    w.wake();
}

/// The lease ended: its watches stay (kept for the next hold), unowned.
/// Looks only at this lease's own watches: a release costs the same with
/// 10,000 others held.
pub(crate) fn forget(shared: &Arc<Shared>) {
    // SAFETY: the watcher is a leaked box, never freed.
    let Some(w) = (unsafe { WATCHER.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    let mut st = w.state();
    let mine = |l: &Weak<Shared>| ptr::eq(l.as_ptr(), Arc::as_ptr(shared));
    for wd in st
        .by_lease
        .remove(&(Arc::as_ptr(shared) as usize))
        .unwrap_or_default()
    {
        if let Some(e) = st.entries.get_mut(&wd) {
            if e.lease.as_ref().is_some_and(mine) {
                e.lease = None;
                e.content_at = None;
            }
        }
    }
    if !st.polled.is_empty() {
        st.polled.retain(|l| !mine(l) && l.strong_count() > 0);
    }
    // Another lease watched or polled. (An acquisition under way is not
    // counted: the thread finds it, and only comes round once more.)
    let others = !st.by_lease.is_empty() || !st.polled.is_empty();
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
    if st.events.is_some() || !st.polled.is_empty() || !st.retry.is_empty() {
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
        .is_some_and(|w| w.state().events.is_some()) as usize;
    held + crate::platform::notify::instances()
}

/// The fork child handler's part: no watcher thread exists in the child;
/// close the child's copies of its descriptors (reading the parent's
/// instance would steal its events) and start afresh when needed.
pub(crate) fn after_fork_in_child() {
    crate::platform::notify::after_fork_in_child();
    order::after_fork_in_child();
    for fd in [&INOTIFY_FD, &MOUNTS_FD, &CTL_FD[0], &CTL_FD[1]] {
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
