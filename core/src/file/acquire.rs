//! Acquiring a lease (DESIGN §3) and waiting for it on kernel events (§5).
//!
//! [`FilePending`] is one acquisition of a lease file in progress. `try_acquire` makes one
//! non-blocking attempt; between attempts a waiter sleeps on `wait_fd` (an
//! inotify watch that turns readable when a holder's descriptor closes) for at
//! most `next_check`. The blocking `wait` does exactly that with `poll`, and
//! the bindings do the same on their own event loops.
//!
//! The steady-state cycle on an existing lease file costs twelve system
//! calls: `readlink` (is the target a symlink?), `open`, `readlink` of
//! `/proc/self/fd/N` (the canonical name), `fstat`, `flock`, `pread`,
//! `pwrite`, `lstat` (is the path still this file, now that our record is
//! in it?), `inotify_add_watch` (the holder's watch), then at release
//! `pwrite`, `flock(LOCK_UN)`, `close`.

use std::os::fd::{BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FileType, FlockOperation, OFlags};
use rustix::io::Errno;

use crate::error::{Contention, Error, Result};
use crate::faults;
use crate::file::access::{self, Access};
use crate::file::guard::Orphan;
use crate::file::{holders, previous};
use crate::lease::{Anchor, Lease};
use crate::options::{Options, Wait};
use crate::path::{self, Spelled};
use crate::platform::filestat::{self, stat_with_age};
use crate::platform::notify::ChangeWatch;
use crate::platform::{fskind, process};
use crate::record::{self, Content};
use crate::registry::{self, Flight, Key};

/// Times the lease file may turn out replaced between open and lock within
/// one attempt before a single attempt gives up, or a wait backs off until
/// its next check. On a loaded machine a process that replaces the file
/// every few milliseconds wins a handful of rounds in a row; 64 in a row is
/// someone doing it on purpose (or a machine too loaded to lock in time).
const MAX_REPLACED_ROUNDS: u32 = 64;
/// How long an attempt waits for another thread's attempt on the same lease
/// file to end (attempts never wait for other processes, so this is a
/// bound on a `/proc` scan, not a real wait).
const FLIGHT_BOUND: Duration = Duration::from_secs(10);

/// After a close event the lock may still be in place for a moment (the
/// event is sent before the kernel drops the lock), so retry soon a few times.
const HOT_RETRIES: [Duration; 4] = [
    Duration::from_micros(50),
    Duration::from_micros(200),
    Duration::from_millis(1),
    Duration::from_millis(4),
];
/// Retries (each after a `sched_yield`) right after a wake-up, before the
/// timed retries: the holder's close sends the event just before the kernel
/// drops its lock.
const WAKE_SPINS: u32 = 64;
/// Re-check even without an event, for holders that unlock without closing
/// and for orphans whose deleted inode cannot be watched.
const SAFETY_RECHECK: Duration = Duration::from_millis(100);
/// Backoff of the polling fallback when no inotify instance can be had.
const POLL_MIN: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(50);

/// How long an acquisition that could not check for orphans itself (split
/// guard off, or blind: another PID namespace, other users' locks) gives a
/// holder to put back a lease file someone just deleted or replaced, before
/// trusting a file that young: a holder's watch re-anchors within
/// microseconds, but a contender that opens the new file in between would
/// otherwise win it. Only files younger than this wait, and only once. As
/// long as the platform's holder may take to put a file back: 20 ms where
/// file events wake it, 250 ms where it looks on a timer.
const REANCHOR_GRACE: Duration = crate::platform::fsevents::REANCHOR_GRACE;
/// How long a waiter goes on waiting on a held file that was deleted or
/// replaced while its record cannot say whether its holder runs (emptied or
/// overwritten under a holder, or a plain `flock(1)` that wrote none): as
/// long as a holder whose record was damaged takes, on a crowded machine,
/// to finish a short critical section, but not a lock nobody acquiring
/// through the path needs held for ever.
const UNRECORDED_FOR: Duration = Duration::from_secs(1);
/// The most one acquisition spends in graces: a file replaced faster than
/// the grace, over and over, must not starve it (200 ms, or two graces
/// where one is longer than 100 ms).
const GRACE_BUDGET: Duration = if REANCHOR_GRACE.as_millis() > 100 {
    REANCHOR_GRACE.saturating_mul(2)
} else {
    Duration::from_millis(200)
};
/// A lease file younger than this is checked for former files before it is
/// locked (see `needs_precheck`).
const PRECHECK_YOUNGER_THAN: Duration = Duration::from_secs(1);

/// The lease file opened by this attempt, listed for the fork handler.
struct OpenFile {
    fd: RawFd,
    slot: u32,
    key: Key,
    writable: bool,
    epoch: u64,
    /// The canonical lease path, from the kernel.
    canon: PathBuf,
    size: usize,
    /// Who may open it: a lease file that has to be put back is made the same.
    access: Access,
    /// How long ago the file was created (`None`: the filesystem does not
    /// say).
    age: Option<Duration>,
    /// A lock attempt on it failed before: it was held, and whoever held it
    /// let go (no grace needed once it is ours).
    waited: bool,
    /// It was given its grace already. Tracked per open descriptor, which
    /// pins the inode: a later file may reuse the inode number.
    graced: bool,
    /// Untouched since its content was last written (see `vouched_for`).
    untouched: bool,
    /// What the guard's look before locking found (nothing): whether it was
    /// complete, and undecided.
    prechecked: Option<(bool, bool)>,
}

impl OpenFile {
    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `fd` stays open until this value is dropped or handed on.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }

    /// Hand the descriptor on to a held lease (and the canonical path out).
    fn into_anchor(mut self, line: Vec<u8>, len: usize) -> (Anchor, PathBuf) {
        let canon = std::mem::take(&mut self.canon);
        let a = Anchor {
            fd: self.fd,
            slot: self.slot,
            key: self.key,
            writable: self.writable,
            line,
            len,
        };
        std::mem::forget(self);
        (a, canon)
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.epoch != registry::epoch() {
            return; // forked child: the fork handler closed it
        }
        registry::close_listed(self.fd, self.slot);
    }
}

/// What one open of the lease path gave.
enum Opened {
    File(OpenFile),
    /// Renamed or unlinked between the open and the look at it: open again.
    Moved,
    /// Someone else created the missing file in the moment before we
    /// could: open theirs (not a replacement, so not counted as one).
    Created,
}

/// How many times in a row a missing lease file may turn out created by
/// someone else before giving up (each time means another process is
/// creating and removing it as fast as this one looks).
const MAX_CREATE_RACES: u32 = 1000;

mod claim;
use claim::Claimed;

/// One acquisition of a lease file in progress.
pub(crate) struct FilePending {
    spelled: Spelled,
    opts: Options,
    id: u64,
    open: Option<OpenFile>,
    watch: Option<ChangeWatch>,
    orphan: Option<Orphan>,
    started: Instant,
    hot: usize,
    poll_backoff: Duration,
    /// While a young lease file is given its grace: until when.
    grace_until: Option<Instant>,
    /// Time spent in graces so far.
    grace_spent: Duration,
    /// When this waiting attempt stops waiting on the file it opened, which
    /// the path no longer names, and opens the path again (see the wait in
    /// `try_acquire`).
    move_on_at: Option<Instant>,
    /// The watch's instance, made before the first open (watch::prepare).
    watching: Option<crate::file::watch::Attempt>,
    /// The replaced rounds of the last attempt, when it backed off at the
    /// bound (a wait's timeout then says so).
    backed_off: Option<u32>,
}

impl FilePending {
    /// Validate the request and spell the lease path.
    pub fn new(target: &Path, options: &Options) -> Result<FilePending> {
        options.validate()?;
        let spelled = path::spell(target, &options.suffix)?;
        Ok(FilePending {
            spelled,
            opts: options.clone(),
            id: registry::attempt_id(),
            open: None,
            watch: None,
            orphan: None,
            started: Instant::now(),
            hot: HOT_RETRIES.len(),
            poll_backoff: POLL_MIN,
            grace_until: None,
            grace_spent: Duration::ZERO,
            move_on_at: None,
            watching: None,
            backed_off: None,
        })
    }

    /// The lease file's path (canonical once it was opened).
    pub fn lease_path(&self) -> &Path {
        match &self.open {
            Some(of) => &of.canon,
            None => &self.spelled.lease,
        }
    }

    /// The path the caller protects.
    pub fn target(&self) -> PathBuf {
        path::target_of(self.lease_path(), &self.opts.suffix)
    }

    /// One non-blocking attempt. `Ok(None)`: someone else holds the lease
    /// (or a young lease file is being given its grace).
    pub fn try_acquire(&mut self) -> Result<Option<Lease>> {
        if let Some(until) = self.grace_until {
            // A wake-up does not cut a grace short.
            if Instant::now() < until {
                return Ok(None);
            }
            self.grace_until = None;
        }
        self.backed_off = None;
        let mut rounds = 0;
        let mut races = 0;
        let mut rechecked = false;
        let mut looked = false;
        let mut spins = 0;
        loop {
            if self.open.is_none() {
                if let Some(lease) = self.share_by_path()? {
                    return Ok(Some(lease));
                }
                if self.opts.watch && self.watching.is_none() {
                    self.watching = crate::file::watch::prepare();
                }
                match self.open_file()? {
                    Opened::File(of) => {
                        faults::step("acquire.opened");
                        self.open = Some(of);
                        // A look at a former file does not carry over.
                        self.move_on_at = None;
                    }
                    Opened::Moved => {
                        rounds += 1;
                        if self.replaced_too_often(rounds)? {
                            return Ok(None);
                        }
                        continue;
                    }
                    Opened::Created => {
                        races += 1;
                        if races >= MAX_CREATE_RACES {
                            return Err(Error::io(
                                "open",
                                self.lease_path(),
                                std::io::Error::other(format!(
                                    "the lease file was created and removed by others {races} \
                                     times while this process tried to open it"
                                )),
                            ));
                        }
                        continue;
                    }
                }
            }
            let Some(of) = self.open.as_ref() else {
                continue;
            };
            let key = of.key;
            let deadline = Instant::now() + FLIGHT_BOUND;
            let flight = match Flight::claim(&of.canon, self.id, deadline, |g| g.share(key)) {
                Ok(f) => f,
                Err(Some(shared)) => {
                    self.open = None;
                    return Ok(Some(Lease::from_shared(shared)));
                }
                Err(None) => return Ok(None),
            };
            let look = self
                .opts
                .split_guard
                .then(|| self.needs_precheck(of))
                .flatten();
            if look.is_some() {
                // What an earlier round's look found stands for no later
                // lock: without a look now, the claim scans after the lock.
                if let Some(of) = self.open.as_mut() {
                    of.prechecked = None;
                }
            }
            let Some(of) = self.open.as_ref() else {
                continue;
            };
            // The cheap questions first: a file held by another is not
            // looked at, and its record is read only once it is free.
            if look.is_some_and(|strict| {
                unlocked_now(of.fd())
                    && (strict || !previous::vouches_now(of.fd(), of.key, &of.canon))
            }) {
                let outcome = self.precheck()?;
                if let Some(orphan) = outcome.orphan {
                    drop(flight);
                    self.refused_by(orphan, key);
                    return Ok(None);
                }
                if let Some(of) = self.open.as_mut() {
                    of.prechecked = Some((outcome.complete, outcome.undecided));
                }
            }
            let Some(of) = self.open.as_ref() else {
                continue;
            };
            match rustix::fs::flock(of.fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {
                    drop(flight);
                    if let Some(of) = self.open.as_mut() {
                        of.waited = true;
                    }
                    // Another thread of this process may have just won it.
                    if let Some(s) = registry::get().lock().share(key) {
                        self.open = None;
                        return Ok(Some(Lease::from_shared(s)));
                    }
                    if !rechecked {
                        // ...or just released it: look once more.
                        rechecked = true;
                        continue;
                    }
                    if !looked {
                        looked = true;
                        // The file this attempt opened and found held may
                        // be no longer at the path. Deleted, moved or
                        // replaced (its own name no longer names it) while
                        // its record names a holder that runs: that holder
                        // puts a file back at the path and keeps this one,
                        // so wait on this one until it is let go. Moving on
                        // to the new file before the holder's watch ran (a
                        // loaded machine) would win it beside that holder:
                        // the split guard refuses such a win, but an
                        // acquirer that turned it off has only this. Once
                        // this one is let go, the next round locks it,
                        // finds the path names another file and opens that.
                        // A record of no running holder, or the path as
                        // spelled leading elsewhere (a symlink on it
                        // flipped): once a holder had the moment it needs
                        // to put its file back, wait on the one there now.
                        // No record to tell (emptied, overwritten, or a
                        // plain `flock(1)`): the same, after longer.
                        let bound = match self.open.as_ref() {
                            Some(of) if !names(&self.spelled.lease, key) => {
                                if names(&of.canon, key) {
                                    Some(REANCHOR_GRACE)
                                } else {
                                    match previous::writer_holds(of.fd(), key, &of.canon) {
                                        Some(true) => None,
                                        Some(false) => Some(REANCHOR_GRACE),
                                        None => Some(UNRECORDED_FOR),
                                    }
                                }
                            }
                            _ => None,
                        };
                        match bound {
                            None => self.move_on_at = None,
                            Some(bound) => {
                                let at = *self
                                    .move_on_at
                                    .get_or_insert_with(|| Instant::now() + bound);
                                if Instant::now() >= at {
                                    self.move_on_at = None;
                                    self.open = None;
                                    rounds += 1;
                                    if self.replaced_too_often(rounds)? {
                                        return Ok(None);
                                    }
                                    continue;
                                }
                            }
                        }
                    }
                    self.orphan = None;
                    if self.arm_watch(key) {
                        continue; // armed now: retry once, so no release is missed
                    }
                    if self.hot == 0 && spins < WAKE_SPINS {
                        // Just woken by a close: the unlock follows within
                        // microseconds, sooner than any timer could fire.
                        spins += 1;
                        rustix::thread::sched_yield();
                        continue;
                    }
                    return Ok(None);
                }
                Err(e) => return Err(Error::io("flock", &of.canon, e)),
            }
            match self.claim(flight)? {
                Claimed::Lease(lease) => return Ok(Some(lease)),
                Claimed::Waiting => return Ok(None),
                Claimed::Again => continue,
                Claimed::Replaced => {
                    rounds += 1;
                    if self.replaced_too_often(rounds)? {
                        return Ok(None);
                    }
                    continue;
                }
            }
        }
    }

    /// Whether to look for former files before locking the file at the
    /// path: when it is young (it was just created, maybe after the live one
    /// was deleted or replaced) and not the file this process last held
    /// there, or this process was refused at this path by a former file's
    /// holder before. Such an attempt is refused without locking, so it
    /// never stands between the holder and the file it is putting back.
    /// `Some(true)`: look; `Some(false)`: look unless the file's record
    /// vouches for it (a young file); `None`: no look.
    fn needs_precheck(&self, of: &OpenFile) -> Option<bool> {
        let young = of.age.is_some_and(|a| a < PRECHECK_YOUNGER_THAN);
        let reg = registry::get().lock();
        if reg.remembers_refusal(&of.canon) {
            Some(true)
        } else {
            (young && !reg.held_last(&of.canon, of.key)).then_some(false)
        }
    }

    /// The registry path: a lease this process holds is shared without
    /// opening anything (and without even a `stat` when it holds none).
    fn share_by_path(&self) -> Result<Option<Lease>> {
        let reg = registry::get();
        if !reg.lock().holds_any() {
            return Ok(None);
        }
        let path = &self.spelled.lease;
        match crate::platform::stat::lstat(path) {
            Ok(st) => {
                match st.file_type() {
                    FileType::Symlink => return Err(symlink_error(path)),
                    FileType::Directory => {
                        return Err(Error::io("open", path, Errno::ISDIR));
                    }
                    _ => {}
                }
                Ok(reg
                    .lock()
                    .share((st.st_dev, st.st_ino))
                    .map(Lease::from_shared))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(Error::io("lstat", path, e)),
        }
    }

    fn open_file(&self) -> Result<Opened> {
        let path = &self.spelled.lease;
        // NONBLOCK: a FIFO planted at the path, or a file lease (F_SETLEASE) on
        // the file, must not block the open (it changes nothing for a regular
        // file's reads, writes or flock).
        let base = OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK;
        let open = |flags: OFlags, mode: u32| {
            registry::open_listed(|| {
                Ok(rustix::fs::open(
                    path,
                    flags,
                    crate::platform::stat::mode(mode),
                )?)
            })
        };
        let (fd, slot, writable) = match open(base | OFlags::RDWR, 0) {
            Ok(r) => {
                let (fd, slot) = r?;
                (fd, slot, true)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // A new lease file: check the filesystem before creating it.
                let dir = path::parent_of(path);
                match fskind::check_dir(dir, self.opts.allow_unsupported_fs) {
                    // The directory is missing: what failed is the open.
                    Err(Error::Io { source, .. })
                        if source.raw_os_error() == Some(libc::ENOENT) =>
                    {
                        return Err(Error::io("open", dir, source))
                    }
                    r => r?,
                };
                let access = access::for_target(&path::target_of(path, &self.opts.suffix));
                // Exclusive, so only a file this process made is given away.
                match open(
                    base | OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
                    access.mode,
                ) {
                    Ok(r) => {
                        let (fd, slot) = r?;
                        // SAFETY: just opened, and open until `OpenFile` closes it.
                        access::apply(unsafe { BorrowedFd::borrow_raw(fd) }, &access);
                        (fd, slot, true)
                    }
                    // Someone else made it in the meantime: open theirs.
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(Opened::Created),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        // Never create directories: name the missing one
                        // (or the file, on a filesystem that refuses it).
                        let at = if crate::platform::stat::stat(dir).is_ok() {
                            path
                        } else {
                            dir
                        };
                        return Err(Error::io("open", at, e));
                    }
                    Err(e) => return Err(open_error(path, e)),
                }
            }
            // An existing file on a read-only mount, or not ours to write:
            // the lock still works read-only, the record is not written.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM)
                ) =>
            {
                match open(base | OFlags::RDONLY, 0) {
                    Ok(r) => {
                        let (fd, slot) = r?;
                        (fd, slot, false)
                    }
                    Err(e2) if e2.raw_os_error() == Some(libc::ENOENT) => {
                        return Err(open_error(path, e));
                    }
                    Err(e2) => return Err(open_error(path, e2)),
                }
            }
            Err(e) => return Err(open_error(path, e)),
        };
        let mut of = OpenFile {
            fd,
            slot,
            key: (0, 0),
            writable,
            epoch: registry::epoch(),
            canon: PathBuf::new(),
            size: 0,
            access: Access {
                mode: 0o600,
                umask: true,
                owner: None,
            },
            age: None,
            waited: false,
            graced: false,
            untouched: false,
            prechecked: None,
        };
        let Some(canon) = path::canonical_from_fd(of.fd(), &self.spelled) else {
            return Ok(Opened::Moved);
        };
        let st = stat_with_age(of.fd()).map_err(|e| Error::io(filestat::CALL, &canon, e))?;
        if st.file_type() != FileType::RegularFile {
            return Err(Error::io(
                "open",
                &canon,
                std::io::Error::other("the lease file is not a regular file"),
            ));
        }
        if st.st_nlink == 0 {
            return Ok(Opened::Moved);
        }
        fskind::check_fd(of.fd(), st.st_dev, &canon, self.opts.allow_unsupported_fs)?;
        access::not_planted(
            &canon,
            &path::target_of(&canon, &self.opts.suffix),
            (st.st_dev, st.st_ino, st.st_uid, st.st_nlink),
        )?;
        of.key = (st.st_dev, st.st_ino);
        of.canon = canon;
        of.size = st.st_size as usize;
        of.access = access::of_file(st.st_mode, st.st_uid, st.st_gid);
        of.age = st.age;
        of.untouched = st.untouched;
        Ok(Opened::File(of))
    }
    /// Watch the lease file for a holder's close. Returns true when a new
    /// watch was set (the caller retries once before sleeping).
    fn arm_watch(&mut self, key: Key) -> bool {
        if self.opts.wait == Wait::NoWait {
            return false;
        }
        let path = match &self.open {
            Some(of) => of.canon.clone(),
            None => self.spelled.lease.clone(),
        };
        self.watch
            .get_or_insert_with(ChangeWatch::new)
            .arm(&path, key)
    }
    /// The descriptor that turns readable when the lease file changed, or
    /// `None` when the waiter must poll (no inotify instance to be had).
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.watch.as_ref().and_then(|w| w.fd())
    }

    /// How long to sleep before the next attempt if no event comes.
    pub fn next_check(&mut self) -> Duration {
        if let Some(until) = self.grace_until {
            return until.saturating_duration_since(Instant::now());
        }
        if self.hot < HOT_RETRIES.len() {
            self.hot += 1;
            return HOT_RETRIES[self.hot - 1];
        }
        if let Some(at) = self.move_on_at {
            // Look again once the holder of the file opened had its moment
            // (and at least as often as the safety net).
            let left = at.saturating_duration_since(Instant::now());
            return left.clamp(Duration::from_millis(1), SAFETY_RECHECK);
        }
        if self.wait_fd().is_some() {
            return SAFETY_RECHECK;
        }
        let d = self.poll_backoff;
        self.poll_backoff = (d * 2).min(POLL_MAX);
        d
    }

    /// Note that `wait_fd` turned readable: consume its events and retry
    /// soon after the next attempt fails.
    pub fn woke(&mut self) {
        if let Some(w) = &self.watch {
            w.clear();
        }
        self.hot = 0;
    }

    /// How long this acquisition has been going.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The in-use error for the current holder (the orphan's, when a split
    /// refused the lease), or a timeout error when `timed_out`.
    pub fn contention_error(&self, timed_out: bool) -> Error {
        let c = Box::new(self.contention());
        if timed_out {
            Error::Timeout(c)
        } else {
            Error::InUse(c)
        }
    }

    fn contention(&self) -> Contention {
        let mut c = Contention {
            target: self.target(),
            lease_path: self.lease_path().to_path_buf(),
            holder: None,
            holders: Vec::new(),
            record_note: None,
            names: Vec::new(),
            inherited: None,
            waited: self.started.elapsed(),
        };
        if let Some(orphan) = &self.orphan {
            c.holder = orphan.record.clone();
            c.holders = vec![orphan.pid];
            return c;
        }
        if let (None, Some(n)) = (&self.open, self.backed_off) {
            c.record_note = Some(format!(
                "the lease file was replaced {n} times in a row while being locked"
            ));
        }
        if let Some(of) = &self.open {
            let mut rec = None;
            if let Ok(bytes) = process::read_at_most(of.fd(), of.size, record::RECORD_MAX_BYTES) {
                rec = Content::parse(&bytes).record().cloned();
            }
            holders::describe(&mut c, of.fd(), rec);
        }
        c
    }

    /// When the wait ends (`None`: never); for NoWait, when it started.
    pub fn deadline(&self) -> Option<Instant> {
        match self.opts.wait {
            Wait::NoWait => Some(self.started),
            // A timeout past the end of time is no deadline at all.
            Wait::Timeout(d) => self.started.checked_add(d),
            Wait::Forever => None,
        }
    }
}

/// Whether `path` names the file `key` (a missing path names none; an
/// error looking counts as naming it, so the wait goes on as before).
fn names(path: &Path, key: Key) -> bool {
    match crate::platform::stat::lstat(path) {
        Ok(st) => (st.st_dev, st.st_ino) == key && st.st_nlink > 0,
        Err(Errno::NOENT) | Err(Errno::NOTDIR) => false,
        Err(_) => true,
    }
}

/// Whether nobody holds the lock right now: a shared lock taken and let go
/// at once (a holder's exclusive attempt in that microsecond retries). A
/// file someone holds needs no look for former files: the lock attempt
/// fails anyway.
fn unlocked_now(fd: BorrowedFd<'_>) -> bool {
    match rustix::fs::flock(fd, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
            true
        }
        Err(_) => false,
    }
}

fn symlink_error(path: &Path) -> Error {
    Error::io(
        "open",
        path,
        std::io::Error::other(format!(
            "the lease file is a symlink; refusing to follow it ({})",
            crate::error::os_message(&std::io::Error::from_raw_os_error(libc::ELOOP))
        )),
    )
}

fn open_error(path: &Path, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => symlink_error(path),
        _ => Error::io("open", path, e),
    }
}

impl crate::backend::Attempt for FilePending {
    fn lease_path(&self) -> &Path {
        FilePending::lease_path(self)
    }
    fn target(&self) -> PathBuf {
        FilePending::target(self)
    }
    fn try_acquire(&mut self) -> Result<Option<Lease>> {
        FilePending::try_acquire(self)
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        FilePending::wait_fd(self)
    }
    fn next_check(&mut self) -> Duration {
        FilePending::next_check(self)
    }
    fn woke(&mut self) {
        FilePending::woke(self)
    }
    fn elapsed(&self) -> Duration {
        FilePending::elapsed(self)
    }
    fn contention_error(&self, timed_out: bool) -> Error {
        FilePending::contention_error(self, timed_out)
    }
    fn deadline(&self) -> Option<Instant> {
        FilePending::deadline(self)
    }
}
