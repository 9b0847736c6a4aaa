//! The one place where a target picks its engine, and the two interfaces
//! every engine implements: [`Attempt`] (one acquisition in progress) and
//! [`Held`] (what a held lease does on release, check and loss). The rest
//! of the core (`pending.rs`, `lease.rs`, `inspect.rs`, `forkgate.rs`,
//! `error.rs`) goes through here, so a new engine is a new folder beside
//! `file/` and `pg/` plus one arm in each `match` below. Outside this
//! module only `Lease::is_postgres`, a public question about the engine,
//! names one.

use std::any::Any;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::file::FilePending;
use crate::inspect::Inspection;
use crate::lease::{Check, Lease, Shared};
use crate::options::Options;
use crate::pg;

/// Which engine holds a target's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// An exclusive `flock` on a sidecar lease file.
    File,
    /// A session advisory lock on a PostgreSQL server.
    Pg,
}

impl Engine {
    /// The engine a target names; a target that looks like a mistyped URL
    /// is an error rather than a lease file of that name.
    pub(crate) fn of(target: &Path) -> Result<Engine> {
        Ok(if pg::classify(target)? {
            Engine::Pg
        } else {
            Engine::File
        })
    }

    /// How logs and errors show `target`: a PostgreSQL URL's password is
    /// masked.
    pub(crate) fn shown(target: &Path) -> String {
        let s = target.to_string_lossy();
        match Engine::of(target) {
            Ok(Engine::Pg) => pg::mask(&s),
            _ => s.into_owned(),
        }
    }

    /// What an error calls the thing at `lease_path` (a lease path as a
    /// [`Lease`] shows it: the file's path, or a masked URL).
    pub(crate) fn noun_of(lease_path: &Path) -> &'static str {
        if pg::is_target(lease_path) {
            "lease"
        } else {
            "lease file"
        }
    }
}

/// One acquisition in progress, driven by [`crate::Pending`]: `try_acquire`,
/// then sleep on `wait_fd` for at most `next_check`, until `deadline`.
pub(crate) trait Attempt {
    /// The lease path (or the masked URL).
    fn lease_path(&self) -> &Path;
    /// The path the caller protects (or the masked URL).
    fn target(&self) -> PathBuf;
    /// One non-blocking attempt; `Ok(None)`: not yet.
    fn try_acquire(&mut self) -> Result<Option<Lease>>;
    /// Readable when another attempt is worth it; `None`: poll.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>>;
    /// How long to sleep before the next attempt if no event comes.
    fn next_check(&mut self) -> Duration;
    /// `wait_fd` turned readable.
    fn woke(&mut self) {}
    fn elapsed(&self) -> Duration;
    /// The in-use error for the current holder, or a timeout error.
    fn contention_error(&self, timed_out: bool) -> Error;
    /// When the caller should give up (`None`: never).
    fn deadline(&self) -> Option<Instant>;
}

// One per acquisition, on the caller's stack: boxing the file variant would
// add an allocation to every file acquisition.
#[allow(clippy::large_enum_variant)]
pub(crate) enum InFlight {
    File(FilePending),
    Pg(pg::Attempt),
}

impl InFlight {
    /// Pick the engine and start the acquisition (spell the lease path, or
    /// parse the URL and start connecting).
    pub(crate) fn start(target: &Path, options: &Options) -> Result<InFlight> {
        Ok(match Engine::of(target)? {
            Engine::File => InFlight::File(FilePending::new(target, options)?),
            Engine::Pg => InFlight::Pg(pg::attempt(target, options)?),
        })
    }

    pub(crate) fn get(&self) -> &dyn Attempt {
        match self {
            InFlight::File(f) => f,
            InFlight::Pg(p) => p,
        }
    }

    pub(crate) fn get_mut(&mut self) -> &mut dyn Attempt {
        match self {
            InFlight::File(f) => f,
            InFlight::Pg(p) => p,
        }
    }
}

/// A held lease's engine half, kept in its [`Shared`]. Every method is
/// called on a live handle (not released, not inherited through `fork`).
pub(crate) trait Held: Send + Sync + RefUnwindSafe + UnwindSafe {
    fn engine(&self) -> Engine;
    /// This handle's release: the engine counts the handles and ends the
    /// lease with the last one.
    fn release(&self, s: &Arc<Shared>) -> Result<()>;
    /// Whether the lock is still where the lease says (`Err(Lost)` once
    /// it is lost).
    fn check(&self, s: &Arc<Shared>) -> Result<Check>;
    /// Bring the lease's phase up to date before it is read: a lease whose
    /// liveness runs on a clock turns lost here once its bound passed.
    fn refresh(&self, _: &Shared) {}
    /// `Ok` while held and whole, from what is known now; called once the
    /// handle is found live and its lease not already lost.
    fn ensure_held(&self, lease: &Lease) -> Result<()>;
    /// As `ensure_held`, asking whoever keeps the lock now rather than
    /// relying on its last answer.
    fn ensure_held_now(&self, lease: &Lease) -> Result<()> {
        lease.ensure_held()
    }
    /// A new descriptor that keeps the lock for a child process.
    fn hand_on(&self, s: &Shared) -> Result<OwnedFd>;
    /// How much longer a previous holder whose lock was taken from it (it
    /// did not release) may go on believing it holds the lease; `None`
    /// when nothing is left, or the lock is freed only by its holder
    /// letting go or dying.
    fn predecessor_bound(&self) -> Option<Duration> {
        None
    }
    /// Whether that bound may yet be cut short, so is worth asking again
    /// before it passes: a predecessor of this machine that may be seen to
    /// have ended.
    fn predecessor_may_end(&self) -> bool {
        false
    }
    /// How much longer the lease counts as held without another
    /// confirmation; `None` when it needs none (the kernel keeps a lock
    /// until its holder lets go or dies).
    fn held_for(&self) -> Option<Duration> {
        None
    }
    /// For the engine's own code, to reach its half of a [`Shared`].
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn as_any(&self) -> &dyn Any;
}

/// Who holds the lease of `target`, without taking it.
pub(crate) fn inspect(target: &Path, options: &Options) -> Result<Inspection> {
    match Engine::of(target)? {
        Engine::File => crate::file::inspect(target, options),
        Engine::Pg => pg::inspect(target),
    }
}

/// In a forked child: every engine forgets what belongs to the parent.
pub(crate) fn after_fork_in_child() {
    crate::file::after_fork_in_child();
    pg::after_fork_in_child();
}
