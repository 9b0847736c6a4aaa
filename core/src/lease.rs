//! A held lease and the handles that share it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::backend::Held;
use crate::error::{Error, Lost, Result};
use crate::file::access::Access;
use crate::file::FileHold;
use crate::options::Options;
use crate::pending::Pending;
use crate::platform::notify::CancelToken;
use crate::platform::wakefd::WakeFd;
use crate::record::{Content, Record};
use crate::registry::{self, Key};

/// One locked lease file. A lease starts with one; the holder's watch adds
/// one each time it puts the lease file back after someone deleted, moved or
/// replaced it, and the lease holds them all until its release.
#[derive(Debug)]
pub(crate) struct Anchor {
    pub fd: RawFd,
    pub slot: u32,
    pub key: Key,
    pub writable: bool,
    /// The record line written there (unpadded).
    pub line: Vec<u8>,
    /// Bytes in the file (the record plus padding), so a rewrite can pad.
    pub len: usize,
}

impl Anchor {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the anchor exists.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Phase {
    Held,
    Lost(Lost),
    Released,
}

type Callback = Arc<dyn Fn(&Lost) + Send + Sync>;

pub(crate) struct State {
    pub anchors: Vec<Anchor>,
    pub phase: Phase,
    /// The anchor whose descriptor was handed out to outlive the handle
    /// (`sidelease hold`'s command).
    pub inherited: Option<Key>,
    pub callbacks: Vec<Callback>,
    /// The lease file could not be put back since then.
    pub failing_since: Option<std::time::Instant>,
    /// The file now at the path found locked by other processes, while it
    /// is being put back.
    pub contended: Option<crate::file::anchor::Contention>,
}

/// One lease held by this process. Shared by every handle of the lease;
/// ended by the last release.
pub(crate) struct Shared {
    pub epoch: u64,
    pub target: PathBuf,
    pub lease_path: PathBuf,
    /// What this acquisition wrote (or would have, on a read-only file).
    pub record: Record,
    /// The same as JSON, as written (one line, no newline).
    pub record_json: String,
    pub previous: Content,
    /// The previous record as the lease file held it (trimmed JSON), when
    /// it was one.
    pub previous_json: Option<String>,
    /// The lease file's path as the acquisition spelled it (absolute): when
    /// a symlink on the way makes it differ from `lease_path`, it too must
    /// lead to a file this lease holds (a deploy may flip the symlink; the
    /// service opens its database through it).
    pub spelled: PathBuf,
    pub writable: bool,
    /// Whether the holder's watch defends this lease (re-anchoring, lost).
    pub watched: bool,
    /// How a lease file is made when it has to be put back.
    pub access: Access,
    handles: AtomicUsize,
    state: Mutex<State>,
    /// The thread telling a loss (running its callbacks) until it is told:
    /// whoever else finds the lease lost waits for that, so a term's
    /// cancellation (a callback) has fired by the time `ensure_held`,
    /// `state` or `lost` first report the loss.
    telling: Mutex<Option<std::thread::ThreadId>>,
    told: std::sync::Condvar,
    lost_fd: OnceLock<WakeFd>,
    /// The engine's half: what release, check and loss do for this lease.
    pub hold: Box<dyn Held>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("lease_path", &self.lease_path)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

pub(crate) struct SharedInit {
    pub target: PathBuf,
    pub lease_path: PathBuf,
    pub record: Record,
    pub previous: Content,
    pub previous_json: Option<String>,
    pub spelled: PathBuf,
    pub watched: bool,
    pub access: Access,
    pub anchor: Anchor,
}

impl Shared {
    pub(crate) fn new(init: SharedInit) -> Shared {
        let writable = init.anchor.writable;
        // The line written (or that would have been) is the record's JSON.
        let json = crate::record::utf8(init.anchor.line.trim_ascii_end());
        let mut s = Shared::build(
            init.target,
            init.lease_path,
            (init.record, json, init.previous),
            writable,
            init.access,
            vec![init.anchor],
            Box::new(FileHold),
        );
        s.watched = init.watched;
        s.spelled = init.spelled;
        s.previous_json = init.previous_json;
        s
    }

    /// A lease held on a server: no lease file, `hold` is the lock and
    /// `shown` names it (a URL with its secrets masked).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn new_remote(
        shown: PathBuf,
        record: Record,
        previous: Content,
        hold: Box<dyn Held>,
    ) -> Shared {
        let access = Access {
            mode: 0,
            umask: false,
            owner: None,
        };
        let target = shown.clone();
        let json = record.to_json();
        Shared::build(
            target,
            shown,
            (record, json, previous),
            true,
            access,
            Vec::new(),
            hold,
        )
    }

    fn build(
        target: PathBuf,
        lease_path: PathBuf,
        (record, record_json, previous): (Record, String, Content),
        writable: bool,
        access: Access,
        anchors: Vec<Anchor>,
        hold: Box<dyn Held>,
    ) -> Shared {
        Shared {
            epoch: registry::epoch(),
            target,
            spelled: lease_path.clone(),
            lease_path,
            record,
            record_json,
            previous,
            previous_json: None,
            writable,
            watched: false,
            access,
            handles: AtomicUsize::new(1),
            state: Mutex::new(State {
                anchors,
                phase: Phase::Held,
                inherited: None,
                callbacks: Vec::new(),
                failing_since: None,
                contended: None,
            }),
            telling: Mutex::new(None),
            told: std::sync::Condvar::new(),
            lost_fd: OnceLock::new(),
            hold,
        }
    }

    /// The paths that must lead to a file this lease holds: the canonical
    /// one, and the one as spelled when a symlink made them differ.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.lease_path.as_path())
            .chain((self.spelled != self.lease_path).then_some(self.spelled.as_path()))
    }

    /// One handle fewer; true for the last one.
    pub(crate) fn drop_handle(&self) -> bool {
        self.handles.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Wake whoever waits on the lost descriptor.
    pub(crate) fn ring_lost_fd(&self) {
        if let Some(fd) = self.lost_fd.get() {
            fd.ring();
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One handle more, unless the last one was released already.
    fn retain(&self) -> bool {
        self.handles
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .is_ok()
    }

    /// Called under the registry lock.
    pub(crate) fn add_handle(&self) {
        self.handles.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn shareable(&self) -> bool {
        matches!(self.state().phase, Phase::Held)
    }

    /// The holder's watch found the lease broken: say so once, to everyone
    /// who asked.
    pub(crate) fn mark_lost(&self, lost: Lost) {
        let callbacks = {
            let mut st = self.state();
            if !matches!(st.phase, Phase::Held) {
                return;
            }
            st.phase = Phase::Lost(lost.clone());
            // Under the state lock: a reader who sees `Lost` sees this.
            *self.telling.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(std::thread::current().id());
            st.callbacks.clone()
        };
        // Callbacks first: whoever wakes on the descriptor finds them run.
        // A callback that panics neither keeps the others, the descriptor
        // or the other leases its thread tells (a shared session's) from
        // being told, nor ends that thread.
        let quietly = |f: &dyn Fn()| {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        };
        for cb in callbacks {
            quietly(&|| cb(&lost));
        }
        if let Some(hook) = LOST_HOOK.get() {
            quietly(&|| hook(&lost));
        }
        if let Some(fd) = self.lost_fd.get() {
            fd.ring();
        }
        *self.telling.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.told.notify_all();
    }

    /// Called by whoever found the lease lost, before saying so: wait until
    /// the loss was told (its callbacks ran), unless this thread is the
    /// one telling it (a callback that asks).
    pub(crate) fn await_told(&self) {
        let me = std::thread::current().id();
        let mut t = self.telling.lock().unwrap_or_else(|e| e.into_inner());
        while t.is_some_and(|id| id != me) {
            t = self.told.wait(t).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// `Err(Lost)` if the lease was lost (before asking the engine, or as its
/// answer), once the loss was told.
fn told(s: &Shared, engine: impl FnOnce() -> Result<()>) -> Result<()> {
    let lost = match &s.state().phase {
        Phase::Lost(l) => Some(l.clone()),
        _ => None,
    };
    let r = match lost {
        Some(l) => Err(Error::Lost(Box::new(l))),
        None => engine(),
    };
    if matches!(r, Err(Error::Lost(_))) {
        s.await_told();
    }
    r
}

static LOST_HOOK: OnceLock<fn(&Lost)> = OnceLock::new();

/// For a binding that tells every loss in its own idiom (Python's logger):
/// `hook` is called whenever any lease of this process is lost, on the
/// thread that found it (usually the watcher thread): keep it short, never
/// block in it, and take no interpreter lock. One per process; a second is
/// refused (false).
pub fn on_any_lost(hook: fn(&Lost)) -> bool {
    LOST_HOOK.set(hook).is_ok()
}

/// Does the lease path still name the locked file?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The path names the locked inode.
    Held,
    /// The locked file was unlinked and nothing replaced it.
    Unlinked,
    /// The path now names another file.
    Replaced,
}

impl Check {
    /// The name used in JSON answers and by the CLI (`held`, `unlinked`,
    /// `replaced`).
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Held => "held",
            Check::Unlinked => "unlinked",
            Check::Replaced => "replaced",
        }
    }
}

/// Where a lease stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Held, whole: the lease path names a file this lease has locked.
    Held,
    /// Lost while held (see [`Lease::ensure_held`]); release it.
    Lost(Lost),
    /// This handle was released (or belongs to the parent of this forked
    /// process).
    Released,
}

impl LeaseState {
    /// The name used in JSON answers and by the bindings (`held`, `lost`,
    /// `released`).
    pub fn as_str(&self) -> &'static str {
        match self {
            LeaseState::Held => "held",
            LeaseState::Lost(_) => "lost",
            LeaseState::Released => "released",
        }
    }
}

/// A handle on a lease. Dropping it releases it; several handles of one
/// process may share one lease, which ends with the last release.
pub struct Lease {
    shared: Arc<Shared>,
    released: AtomicBool,
    /// The loss this handle's lease had when the handle was released, so
    /// that [`Lease::lost`] answers after release as it did before.
    lost_at_release: OnceLock<Lost>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("lease_path", &self.shared.lease_path)
            .field("generation", &self.generation())
            .field("released", &self.is_released())
            .finish()
    }
}

impl Lease {
    /// Acquire the lease of `target` (see DESIGN §3), waiting as
    /// `options.wait` says.
    pub fn acquire(target: impl AsRef<Path>, options: &Options) -> Result<Lease> {
        Pending::new(target.as_ref(), options)?.wait(None)
    }

    /// As [`Lease::acquire`], and a `cancel` from another thread ends the
    /// wait with [`Error::Cancelled`].
    pub fn acquire_cancellable(
        target: impl AsRef<Path>,
        options: &Options,
        cancel: &CancelToken,
    ) -> Result<Lease> {
        Pending::new(target.as_ref(), options)?.wait(Some(cancel))
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Lease {
        Lease {
            shared,
            released: AtomicBool::new(false),
            lost_at_release: OnceLock::new(),
        }
    }

    /// Release this handle's share. The last release of a lease records
    /// `released_at`, unlocks and closes every descriptor of it; the file
    /// stays. A second call is a no-op. In a forked child the handle is
    /// already dead (the fork handler closed the child's copy) and this is a
    /// no-op too. A lease file is always let go: when the release cannot be
    /// written into it (immutable, a full disk, an I/O error) the lock is
    /// dropped all the same and the record keeps no `released_at`, so the
    /// next holder runs its crash recovery. An error comes only from a
    /// PostgreSQL lease whose release could not be recorded on the server.
    pub fn release(&self) -> Result<()> {
        if self.is_released() || !self.is_current() {
            return Ok(());
        }
        // Kept before the handle turns released: a reader never finds it
        // released with its loss not yet kept.
        if let LeaseState::Lost(l) = self.state() {
            let _ = self.lost_at_release.set(l);
        }
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.shared.hold.release(&self.shared)
    }

    pub(crate) fn shared_arc(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Another handle on this lease, for a second owner: the lease ends
    /// with the last handle's release.
    pub fn try_clone(&self) -> Result<Lease> {
        let s = self.live()?;
        if !s.retain() {
            return Err(Error::invalid("lease", "this lease handle was released"));
        }
        Ok(Lease::from_shared(self.shared.clone()))
    }

    /// Whether this handle was released.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn is_current(&self) -> bool {
        self.shared.epoch == registry::epoch()
    }

    /// Whether this handle came from the parent through `fork`: in this
    /// process it never held anything, and releasing it does nothing.
    pub fn is_inherited(&self) -> bool {
        !self.is_current()
    }

    fn live(&self) -> Result<&Shared> {
        if self.is_released() {
            return Err(Error::invalid("lease", "this lease handle was released"));
        }
        if !self.is_current() {
            return Err(Error::invalid(
                "lease",
                "this lease handle belongs to the parent process; a forked child does not hold it",
            ));
        }
        Ok(&self.shared)
    }

    /// Does the lease path still name a file this lease has locked?
    pub fn check(&self) -> Result<Check> {
        let s = self.live()?;
        s.hold.check(&self.shared)
    }

    /// Held, lost (the holder's watch found the lease file replaced or
    /// deleted and could not put it back, or another process holds the new
    /// one), or released.
    pub fn state(&self) -> LeaseState {
        if self.is_released() || !self.is_current() {
            return LeaseState::Released;
        }
        self.shared.hold.refresh(&self.shared);
        let phase = self.shared.state().phase.clone();
        match phase {
            Phase::Held => LeaseState::Held,
            Phase::Lost(l) => {
                self.shared.await_told();
                LeaseState::Lost(l)
            }
            Phase::Released => LeaseState::Released,
        }
    }

    /// The loss, once the lease was lost while this handle held it: the
    /// same answer before and after [`Lease::release`] (a handle released
    /// whole stays not lost, whatever happens to the lease later).
    pub fn lost(&self) -> Option<Lost> {
        if self.is_released() {
            return self.lost_at_release.get().cloned();
        }
        match self.state() {
            LeaseState::Lost(l) => Some(l),
            _ => None,
        }
    }

    /// `Ok` while the lease is held and whole; [`Error::Lost`] once it was
    /// lost (and an invalid-argument error on a released handle). Call it
    /// before work that must only happen under the lease. A PostgreSQL lease
    /// counts as lost, from then on, once the server has not confirmed its
    /// session within its bound (`confirm_within`, 1 s by default; the
    /// holder asks four times within it): a paused process or a cut network
    /// cannot know whether an operator or a restart ended the session
    /// meanwhile. Only the fencing check in the application's own
    /// transaction closes that window; [`Lease::ensure_held_now`] narrows it
    /// to one round trip.
    ///
    /// For a lease file it looks at the path itself (one `lstat`), so it
    /// never answers `Ok` while [`Lease::check`] would say the path names
    /// another file or none: when it does, the lease file is put back right
    /// here (as the holder's watch would), and if that cannot be done now
    /// the answer is an I/O error naming the path (the lease is not lost
    /// yet: nobody else holds the file at the path), or [`Error::Lost`] when
    /// another process holds it. Without the watch (`watch: false`) nothing
    /// is put back and a path that names another file is that I/O error.
    pub fn ensure_held(&self) -> Result<()> {
        let s = self.live()?;
        told(s, || s.hold.ensure_held(self))
    }

    /// [`Lease::ensure_held`], and for a PostgreSQL lease ask the server
    /// now (one round trip, within the lease's bound) rather than rely on
    /// the last heartbeat. An I/O error if the answer did not come in time
    /// and the bound has not passed yet (unknown, not lost).
    pub fn ensure_held_now(&self) -> Result<()> {
        let s = self.live()?;
        told(s, || s.hold.ensure_held_now(self))
    }

    /// A descriptor that turns readable when the lease is lost, or when its
    /// last handle is released (made on first use), for an
    /// event loop; [`Lease::state`] tells which. It stays readable from
    /// then on.
    pub fn lost_fd(&self) -> Result<BorrowedFd<'_>> {
        let s = self.live()?;
        if s.lost_fd.get().is_none() {
            let fd = WakeFd::new().map_err(|e| Error::io(WakeFd::CALL, &s.lease_path, e))?;
            let _ = s.lost_fd.set(fd);
        }
        let fd = s
            .lost_fd
            .get()
            .ok_or_else(|| Error::invalid("lease", "no lost descriptor"))?;
        if matches!(s.state().phase, Phase::Lost(_)) {
            fd.ring();
        }
        Ok(fd.as_fd())
    }

    /// Call `f` (from the watcher thread) when the lease is lost; at once if
    /// it already was. Keep `f` short and never block in it: another thread
    /// that finds the lease lost (`ensure_held`, `state`) waits until every
    /// such callback has run, so that what they cancel is cancelled before
    /// the loss is reported. `f` itself may ask the lease.
    pub fn on_lost(&self, f: impl Fn(&Lost) + Send + Sync + 'static) -> Result<()> {
        let s = self.live()?;
        let f: Callback = Arc::new(f);
        let already = {
            let mut st = s.state();
            match &st.phase {
                Phase::Lost(l) => Some(l.clone()),
                _ => {
                    st.callbacks.push(f.clone());
                    None
                }
            }
        };
        if let Some(l) = already {
            f(&l);
        }
        Ok(())
    }

    /// Whether this lease lives on a PostgreSQL server (its `lease_path`
    /// and `target` are then the URL, password masked).
    pub fn is_postgres(&self) -> bool {
        self.shared.hold.engine() == crate::backend::Engine::Pg
    }

    /// The lease file, canonical (for a PostgreSQL lease, its URL with the
    /// password masked).
    pub fn lease_path(&self) -> &Path {
        &self.shared.lease_path
    }

    /// The path the lease protects: the lease file's path without its
    /// suffix (for a PostgreSQL lease, the masked URL).
    pub fn target(&self) -> &Path {
        &self.shared.target
    }

    /// The record this process wrote (or would have, on a read-only file).
    pub fn record(&self) -> &Record {
        &self.shared.record
    }

    /// The record found in the lease file before this acquisition.
    pub fn previous(&self) -> Option<&Record> {
        self.shared.previous.record()
    }

    /// [`Lease::record`] as JSON (what the lease file holds).
    pub fn record_json(&self) -> &str {
        &self.shared.record_json
    }

    /// [`Lease::previous`] as JSON: the record as the previous holder wrote
    /// it (every field it has), or `None`.
    pub fn previous_json(&self) -> Option<std::borrow::Cow<'_, str>> {
        match &self.shared.previous_json {
            Some(j) => Some(std::borrow::Cow::Borrowed(j)),
            None => self
                .previous()
                .map(|r| std::borrow::Cow::Owned(r.to_json())),
        }
    }

    /// What the lease file held before: empty, a record, or unreadable.
    pub fn previous_content(&self) -> &Content {
        &self.shared.previous
    }

    /// Whether the previous holder released cleanly. `Some(true)` only when
    /// its record proves it (`released_at`, written by a holder that had
    /// not lost the lease). `Some(false)`: it died holding the lease (its
    /// record has no `released_at`) or left a record that cannot be read —
    /// run crash recovery. `None` when no record tells: the lease file is
    /// empty (created now — a first lease, or one whose file an operator
    /// deleted after a crash — or emptied), or this lease could only open
    /// its file read-only. Run crash recovery unless it is `Some(true)`.
    pub fn previous_released_cleanly(&self) -> Option<bool> {
        if !self.shared.writable {
            return None;
        }
        match &self.shared.previous {
            // No record says how the last holder ended: a file created
            // now may have replaced a deleted one whose holder crashed.
            Content::Empty => None,
            Content::Record(r) => Some(r.released_at.is_some()),
            Content::Unreadable => Some(false),
        }
    }

    /// The fencing token: one more than the previous holder's. `None` for a
    /// lease that could only open its file read-only (it writes no record,
    /// so it has no place in the sequence).
    pub fn generation(&self) -> Option<u64> {
        self.shared.record.generation
    }

    /// How much longer a previous holder that did not release (its session
    /// ended by an operator, a restart or a cut network) may go on
    /// believing it holds the lease, as the server judged it when this
    /// holder's row was written: the `confirm_within` its record gives (the
    /// largest allowed, 4 s, when it gives none), from then; a clean
    /// release in between passes the fence on. A previous holder of this
    /// machine that has provably ended believes nothing: it is left out,
    /// judged again at each call (one killed a moment before may still be
    /// on its way out at the first). `None` when nothing is left, and for
    /// a lease file, whose lock the kernel frees only once its holder let
    /// go or died. The elector waits this out before a term's work starts.
    pub fn predecessor_bound(&self) -> Option<std::time::Duration> {
        self.shared.hold.predecessor_bound()
    }

    /// Whether `predecessor_bound` may yet end early: worth asking again
    /// before it passes.
    pub(crate) fn predecessor_may_end(&self) -> bool {
        self.shared.hold.predecessor_may_end()
    }

    /// How much longer this lease counts as held if no confirmation comes
    /// (zero once its bound passed); `None` for a lease file, which needs
    /// none. Past it a successor may be elected once the predecessor's
    /// bound (its [`Lease::predecessor_bound`]) passes, never before: work
    /// that must not outlive the lease ends by then (what `sidelease
    /// lead`'s watchdog does for its command when `lead` itself is frozen).
    pub fn held_for(&self) -> Option<std::time::Duration> {
        self.shared.hold.held_for()
    }

    /// False when the lease file could only be opened read-only: the lock
    /// holds, but no record was written.
    pub fn record_written(&self) -> bool {
        self.shared.writable
    }

    /// A new descriptor of the lease, outside the registry and without
    /// close-on-exec, for a command that should keep the lease alive as long
    /// as it runs (what `sidelease hold` gives its command, as `flock(1)`
    /// does). The caller owns it; never `LOCK_UN` it. From then on the last
    /// release leaves the lock to that descriptor and records `released_at`
    /// only if no process holds the lease file any more. For a PostgreSQL
    /// lease with a session of its own it is a copy of that session's
    /// socket, never to be read or written: while it is open the server
    /// keeps the session, and the lock, even after this process died (a
    /// lease on the shared session, the default, is refused: it would keep
    /// every lease of the process; acquire with
    /// [`Options::inheritable`](crate::Options::inheritable) or
    /// `session=own`).
    pub fn inheritable_fd(&self) -> Result<OwnedFd> {
        let s = self.live()?;
        s.hold.hand_on(s)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
