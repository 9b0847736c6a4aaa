//! Everything that depends on the kernel, behind one interface: who holds a
//! lock (`locks`, `process`), waiting for a change of a file (`notify`),
//! watching a held lease file and its path (`fsevents`, `mounts`), what
//! filesystem a path is on (`fskind`), who this process is (`process`),
//! and the descriptors, clocks and sockets those need. Each question may be
//! answered "unknown", never with a guess.
//!
//! Two implementations answer it: `linux` (`/proc`, inotify, eventfd, ...)
//! and `portable` (only what every Unix has: `flock`, `fstat`, `pread`,
//! `poll` on timers, pipes, `realpath`). `portable` is what any other Unix
//! builds, and on Linux the `portable` feature selects it, so the whole
//! suite proves it here. Nothing outside this folder names a Linux-only
//! call (`tests/platform-seam` checks).

use std::sync::atomic::{AtomicU8, Ordering};

mod cancel;
mod common;
#[cfg(feature = "postgres")]
pub mod roots;
pub mod stat;

#[cfg(all(target_os = "linux", not(feature = "portable")))]
mod linux;
#[cfg(all(target_os = "linux", not(feature = "portable")))]
use linux as imp;

#[cfg(any(not(target_os = "linux"), feature = "portable"))]
mod portable;
#[cfg(any(not(target_os = "linux"), feature = "portable"))]
use portable as imp;

pub use imp::clock;
pub use imp::{
    filestat, fsevents, fskind, locks, mounts, notify, paths, process, random, reaper, sockopt,
    wakefd,
};

/// Which implementation this build uses: `linux` or `portable`.
pub const IMPLEMENTATION: &str = imp::NAME;

/// A question this process found it could not ask the kernel, so the
/// portable answer stood in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The kernel's table of locks (`/proc/locks`): holders are not named.
    LockTable,
    /// Other processes' descriptors (`/proc/PID/fd`): former lease files
    /// and their holders cannot be seen.
    Descriptors,
    /// File events (an inotify instance): waits and the holder's watch poll.
    FileEvents,
}

impl Missing {
    const ALL: [Missing; 3] = [
        Missing::LockTable,
        Missing::Descriptors,
        Missing::FileEvents,
    ];

    /// The name used in JSON answers and by the CLI (`lock-table`,
    /// `descriptors`, `file-events`).
    pub fn as_str(self) -> &'static str {
        match self {
            Missing::LockTable => "lock-table",
            Missing::Descriptors => "descriptors",
            Missing::FileEvents => "file-events",
        }
    }

    /// What answers without it.
    pub fn consequence(self) -> &'static str {
        match self {
            Missing::LockTable => "holders are not named: the lock itself says held or free",
            Missing::Descriptors => "former lease files and their holders are not seen",
            Missing::FileEvents => "waits and the holder's watch poll",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

static MISSING: AtomicU8 = AtomicU8::new(0);

/// Note that `m` could not be had just now.
pub(crate) fn note_unavailable(m: Missing) {
    MISSING.fetch_or(m.bit(), Ordering::Relaxed);
}

/// Note that `m` could be had again (the user's inotify limit has room).
#[cfg_attr(any(not(target_os = "linux"), feature = "portable"), allow(dead_code))]
pub(crate) fn note_available(m: Missing) {
    MISSING.fetch_and(!m.bit(), Ordering::Relaxed);
}

/// What this process last found unavailable. The portable implementation
/// has none of them.
pub fn unavailable() -> Vec<Missing> {
    if IMPLEMENTATION == "portable" {
        return Missing::ALL.to_vec();
    }
    let bits = MISSING.load(Ordering::Relaxed);
    Missing::ALL
        .into_iter()
        .filter(|m| bits & m.bit() != 0)
        .collect()
}
