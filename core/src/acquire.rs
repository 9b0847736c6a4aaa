//! Acquiring a lease (DESIGN §3) and waiting for it on kernel events (§5).
//!
//! [`Pending`] is one acquisition in progress. `try_acquire` makes one
//! non-blocking attempt; between attempts a waiter sleeps on `wait_fd` (an
//! inotify watch that turns readable when a holder's descriptor closes) for at
//! most `next_check`. The blocking `wait` does exactly that with `poll`, and
//! the bindings do the same on their own event loops.

use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Contention, Error, Result};
use crate::holders::{self, Orphan};
use crate::lease::{write_line, Lease, Shared};
use crate::options::{Options, Wait};
use crate::path::{self, Resolved};
use crate::platform::notify::{CancelToken, ChangeWatch};
use crate::platform::{fskind, locks, process};
use crate::record::{self, Content, Record};
use crate::registry::{self, Key};

/// Times the lease file may turn out replaced between open and lock before
/// acquisition gives up.
const MAX_REPLACED_ROUNDS: u32 = 8;

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

/// The lease file opened by this attempt, listed for the fork handler.
struct OpenFile {
    fd: RawFd,
    slot: u32,
    key: Key,
    writable: bool,
    epoch: u64,
}

impl OpenFile {
    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `fd` stays open until this value is dropped or handed on.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }

    /// Hand the descriptor on to a held lease.
    fn into_parts(self) -> (RawFd, u32) {
        let parts = (self.fd, self.slot);
        std::mem::forget(self);
        parts
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.epoch != registry::epoch() {
            return; // forked child: the fork handler closed it
        }
        if registry::get().lock().release_slot(self.slot, self.fd) {
            // SAFETY: ours, closed once.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// One acquisition in progress.
pub struct Pending {
    req: Resolved,
    opts: Options,
    open: Option<OpenFile>,
    watch: Option<ChangeWatch>,
    orphan: Option<Orphan>,
    started: Instant,
    hot: usize,
    poll_backoff: Duration,
    fs_checked: bool,
}

impl Pending {
    /// Validate the request, resolve the lease path and check its filesystem.
    pub fn new(target: &Path, options: &Options) -> Result<Pending> {
        options.validate()?;
        let req = path::resolve(target, &options.suffix)?;
        Ok(Pending {
            req,
            opts: options.clone(),
            open: None,
            watch: None,
            orphan: None,
            started: Instant::now(),
            hot: HOT_RETRIES.len(),
            poll_backoff: POLL_MIN,
            fs_checked: false,
        })
    }

    pub fn lease_path(&self) -> &Path {
        &self.req.lease_path
    }

    pub fn target(&self) -> &Path {
        &self.req.target
    }

    /// One non-blocking attempt. `Ok(None)`: someone else holds the lease.
    pub fn try_acquire(&mut self) -> Result<Option<Lease>> {
        let mut rounds = 0;
        let mut registry_rechecked = false;
        let mut spins = 0;
        loop {
            if self.open.is_none() {
                if let Some(lease) = self.share_by_path()? {
                    return Ok(Some(lease));
                }
                if !self.fs_checked {
                    // Checked before the first open; a lease this process
                    // holds already passed the check.
                    let dir = self.req.lease_path.parent().unwrap_or(Path::new("/"));
                    fskind::check_dir(dir, self.opts.allow_unsupported_fs)?;
                    self.fs_checked = true;
                }
                self.open = Some(self.open_file()?);
            }
            let Some(of) = self.open.as_ref() else {
                continue;
            };
            let key = of.key;
            match rustix::fs::flock(of.fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {
                    // Another thread of this process may have just won it.
                    let shared = registry::get().lock().share(key);
                    if let Some(s) = shared {
                        self.open = None;
                        return Ok(Some(Lease::from_shared(s)));
                    }
                    if !registry_rechecked {
                        // ...or just released it: look once more.
                        registry_rechecked = true;
                        continue;
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
                Err(e) => return Err(Error::io("flock", &self.req.lease_path, e)),
            }
            // Locked: does the path still name this inode?
            match rustix::fs::lstat(&self.req.lease_path) {
                Ok(st) if (st.st_dev, st.st_ino) == key && st.st_nlink > 0 => {}
                Ok(_) | Err(Errno::NOENT) => {
                    self.open = None; // closing drops the lock on the stale inode
                    rounds += 1;
                    if rounds >= MAX_REPLACED_ROUNDS {
                        return Err(Error::io(
                            "open",
                            &self.req.lease_path,
                            std::io::Error::other(format!(
                                "the lease file was replaced {rounds} times while being locked"
                            )),
                        ));
                    }
                    continue;
                }
                Err(e) => return Err(Error::io("lstat", &self.req.lease_path, e)),
            }
            let bytes = read_capped(of.fd(), &self.req.lease_path)?;
            let previous = if bytes.len() > record::RECORD_MAX_BYTES {
                Content::Unreadable
            } else {
                Content::parse(&bytes)
            };
            if self.opts.split_guard && !vouched_for(&previous, key) {
                if let Some(orphan) = self.find_orphan(key)? {
                    // Keep the descriptor (no close event for our own watch);
                    // unlock it so nobody waits on us.
                    let _ = rustix::fs::flock(of.fd(), FlockOperation::Unlock);
                    self.orphan = Some(orphan);
                    self.arm_watch(key);
                    return Ok(None);
                }
            }
            return self.complete(previous, &bytes).map(Some);
        }
    }

    /// The registry path: a lease this process holds is shared without
    /// opening anything.
    fn share_by_path(&self) -> Result<Option<Lease>> {
        let path = &self.req.lease_path;
        match rustix::fs::lstat(path) {
            Ok(st) => {
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Symlink => return Err(symlink_error(path)),
                    FileType::Directory => {
                        return Err(Error::io("open", path, Errno::ISDIR));
                    }
                    _ => {}
                }
                Ok(registry::get()
                    .lock()
                    .share((st.st_dev, st.st_ino))
                    .map(Lease::from_shared))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(Error::io("lstat", path, e)),
        }
    }

    fn open_file(&self) -> Result<OpenFile> {
        let path = &self.req.lease_path;
        let base = OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY;
        let mode = Mode::from_raw_mode(0o644);
        let (fd, writable) =
            match rustix::fs::open(path, base | OFlags::RDWR | OFlags::CREATE, mode) {
                Ok(fd) => (fd, true),
                // An existing file on a read-only mount, or not ours to write:
                // the lock still works read-only, the record is not written.
                Err(e @ (Errno::ACCESS | Errno::ROFS | Errno::PERM)) => {
                    match rustix::fs::open(path, base | OFlags::RDONLY, Mode::empty()) {
                        Ok(fd) => (fd, false),
                        Err(Errno::NOENT) => return Err(Error::io("open", path, e)),
                        Err(e2) => return Err(open_error(path, e2)),
                    }
                }
                Err(e) => return Err(open_error(path, e)),
            };
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("fstat", path, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Error::io(
                "open",
                path,
                std::io::Error::other("the lease file is not a regular file"),
            ));
        }
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        let slot = match registry::get().lock().claim_slot(raw) {
            Ok(s) => s,
            Err(e) => {
                unsafe { libc::close(raw) };
                return Err(e);
            }
        };
        Ok(OpenFile {
            fd: raw,
            slot,
            key: (st.st_dev, st.st_ino),
            writable,
            epoch: registry::epoch(),
        })
    }

    /// Watch the lease file for a holder's close. Returns true when a new
    /// watch was set (the caller retries once before sleeping).
    fn arm_watch(&mut self, key: Key) -> bool {
        if self.opts.wait == Wait::NoWait {
            return false;
        }
        let watch = self.watch.get_or_insert_with(ChangeWatch::new);
        let before = watch.fd().is_some();
        watch.arm(&self.req.lease_path, key);
        !before && watch.fd().is_some()
    }

    fn find_orphan(&self, key: Key) -> Result<Option<Orphan>> {
        let (dev, ino) = key;
        let locks = locks::flock_locks_on(rustix::fs::major(dev), rustix::fs::minor(dev))
            .map_err(|e| Error::io("read", Path::new("/proc/locks"), e))?;
        if !locks.iter().any(|l| l.ino != ino && l.exclusive) {
            return Ok(None);
        }
        let scan = holders::split_scan(&self.req.lease_path, dev, Some(ino), &locks, true);
        Ok(scan.orphans.into_iter().next())
    }

    /// Locked and verified: read the previous record, write ours, register.
    fn complete(&mut self, previous: Content, bytes: &[u8]) -> Result<Lease> {
        let Some(of) = self.open.as_ref() else {
            return Err(Error::invalid("lease", "no open lease file"));
        };
        let generation = match &previous {
            Content::Record(r) => r.generation.unwrap_or(0),
            Content::Empty => 0,
            Content::Unreadable => salvage_generation(bytes),
        } + 1;
        let rec = self.new_record(generation, of.key)?;
        let line = rec.to_line();
        if of.writable {
            write_line(of.fd, &self.req.lease_path, &line)?;
        }
        let of = self
            .open
            .take()
            .ok_or_else(|| Error::invalid("lease", "no open lease file"))?;
        let (key, writable, epoch) = (of.key, of.writable, of.epoch);
        let (fd, slot) = of.into_parts();
        let shared = Arc::new(Shared {
            fd,
            slot,
            key,
            epoch,
            writable,
            target: self.req.target.clone(),
            lease_path: self.req.lease_path.clone(),
            record: rec,
            line,
            previous,
        });
        registry::get().lock().insert(key, shared.clone());
        Ok(Lease::from_shared(shared))
    }

    fn new_record(&self, generation: u64, (dev, ino): Key) -> Result<Record> {
        let me = process::current();
        let mut nonce = [0u8; 16];
        rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| Error::io("getrandom", Path::new("/dev/urandom"), e))?;
        Ok(Record {
            schema: Some(record::SCHEMA),
            generation: Some(generation),
            pid: Some(me.pid),
            host: me.host.clone(),
            started_at: Some(record::now_rfc3339()),
            target: Some(self.req.target.to_string_lossy().into_owned()),
            lease_path: Some(self.req.lease_path.to_string_lossy().into_owned()),
            nonce: Some(hex(&nonce)),
            boot_id: me.boot_id.clone(),
            machine_id: me.machine_id.clone(),
            pid_ns: me.pid_ns,
            proc_start: me.proc_start,
            runtime: Some(self.opts.runtime.clone().unwrap_or_else(|| "rust".into())),
            library: Some(concat!("sidelease ", env!("CARGO_PKG_VERSION")).into()),
            metadata: self.opts.metadata.clone(),
            device: Some(dev),
            inode: Some(ino),
            split_checked: Some(self.opts.split_guard),
            released_at: None,
        })
    }

    /// The descriptor that turns readable when the lease file changed, or
    /// `None` when the waiter must poll (no inotify instance to be had).
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.watch.as_ref().and_then(|w| w.fd())
    }

    /// How long to sleep before the next attempt if no event comes.
    pub fn next_check(&mut self) -> Duration {
        if self.hot < HOT_RETRIES.len() {
            self.hot += 1;
            return HOT_RETRIES[self.hot - 1];
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
            target: self.req.target.clone(),
            lease_path: self.req.lease_path.clone(),
            holder: None,
            holders: Vec::new(),
            waited: self.started.elapsed(),
        };
        if let Some(orphan) = &self.orphan {
            c.holder = holders::orphan_record(orphan);
            c.holders = vec![orphan.pid];
            return c;
        }
        if let Some(of) = &self.open {
            let (dev, ino) = of.key;
            if let Ok(bytes) = read_capped(of.fd(), &self.req.lease_path) {
                c.holder = Content::parse(&bytes).record().cloned();
            }
            c.holders = holders::holders_of(dev, ino, c.holder.as_ref().and_then(|r| r.pid));
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

    /// Whether this acquisition may wait at all.
    pub fn waits(&self) -> bool {
        self.opts.wait != Wait::NoWait
    }

    /// Wait as the options say, on kernel events, until acquired, timed out
    /// or cancelled.
    pub fn wait(mut self, cancel: Option<&CancelToken>) -> Result<Lease> {
        let deadline = self.deadline();
        loop {
            if let Some(lease) = self.try_acquire()? {
                return Ok(lease);
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if now >= d => {
                    return Err(self.contention_error(self.opts.wait != Wait::NoWait))
                }
                Some(d) => d - now,
                None => Duration::MAX,
            };
            let sleep = self.next_check().min(remaining);
            if self.wait_for_change(sleep, cancel)? {
                self.woke();
            }
        }
    }

    /// Sleep until the watch fires (true), the time passes (false) or the
    /// token is cancelled (error). For bindings that loop themselves (to
    /// check for signals between short sleeps, say); call `woke` after true.
    pub fn wait_for_change(&self, timeout: Duration, cancel: Option<&CancelToken>) -> Result<bool> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let ts = Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let watch = self.wait_fd();
        let mut fds = Vec::with_capacity(2);
        if let Some(w) = watch {
            fds.push(PollFd::from_borrowed_fd(w, PollFlags::IN));
        }
        if let Some(c) = cancel {
            fds.push(PollFd::from_borrowed_fd(c.fd(), PollFlags::IN));
        }
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(Error::io("poll", &self.req.lease_path, e)),
        }
        if cancel.is_some() && fds.last().is_some_and(|f| !f.revents().is_empty()) {
            return Err(Error::Cancelled {
                lease_path: self.req.lease_path.clone(),
            });
        }
        Ok(watch.is_some() && !fds[0].revents().is_empty())
    }
}

/// Can the split guard's read of `/proc/locks` be skipped? Yes when the
/// previous record was written by a holder of this very inode whose own
/// acquisition was split-checked. An orphan (a live holder of a deleted
/// former inode) can only exist if the file at the path was deleted or
/// replaced while held, and then the path names a new inode whose first
/// holder has no such record and runs the guard; by induction every later
/// holder of the same inode may trust the chain. The read matters: it takes
/// the kernel's global file-lock rwsem for writing, which costs an RCU grace
/// period (milliseconds) whenever it has not been taken recently.
fn vouched_for(previous: &Content, (dev, ino): Key) -> bool {
    matches!(previous, Content::Record(r)
        if r.inode == Some(ino) && r.device == Some(dev) && r.split_checked == Some(true))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn symlink_error(path: &Path) -> Error {
    Error::io(
        "open",
        path,
        std::io::Error::other(format!(
            "the lease file is a symlink; refusing to follow it ({})",
            std::io::Error::from_raw_os_error(libc::ELOOP)
        )),
    )
}

fn open_error(path: &Path, e: Errno) -> Error {
    match e {
        Errno::LOOP => symlink_error(path),
        e => Error::io("open", path, e),
    }
}

/// Read the lease file from offset 0, at most one byte past the record limit
/// (so an oversized file is seen as such).
pub(crate) fn read_capped(fd: BorrowedFd<'_>, path: &Path) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if len > record::RECORD_MAX_BYTES {
                break;
            }
            buf.resize(len * 2, 0);
        }
        match rustix::io::pread(fd.as_fd(), &mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(Error::io("pread", path, e)),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// The largest `"generation":N` in bytes that are not a valid record (a
/// record torn by a crash keeps the new generation at its head), so the
/// fencing token keeps growing across a corrupted record.
fn salvage_generation(bytes: &[u8]) -> u64 {
    const KEY: &[u8] = b"\"generation\":";
    let mut best = 0;
    let mut i = 0;
    while let Some(pos) = bytes[i..].windows(KEY.len()).position(|w| w == KEY) {
        let start = i + pos + KEY.len();
        let digits: Vec<u8> = bytes[start..]
            .iter()
            .copied()
            .skip_while(|b| *b == b' ')
            .take_while(u8::is_ascii_digit)
            .collect();
        if let Some(n) = std::str::from_utf8(&digits)
            .ok()
            .and_then(|s| s.parse().ok())
        {
            best = best.max(n);
        }
        i = start;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::salvage_generation;

    #[test]
    fn generation_survives_a_torn_record() {
        assert_eq!(salvage_generation(b"garbage"), 0);
        assert_eq!(
            salvage_generation(
                b"{\"schema\":1,\"generation\":18,\"pid\":2}\n\"generation\":17,\"pi"
            ),
            18
        );
        assert_eq!(
            salvage_generation(b"\"generation\": 99999999999999999999999"),
            0
        );
    }
}
