//! Any Unix: only `flock`, `open`/`fstat`/`pread`/`pwrite`, `poll` with
//! timers, pipes, `kill`-free process identity (`getpid`, `uname`) and
//! `realpath`. What needs more is answered "unknown": no lock holders by
//! PID, no other process's descriptors (so no former lease files), no file
//! events (waits and the holder's watch poll), no filesystem type. Selected
//! on every target but Linux, and on Linux by the `portable` feature.

pub(crate) use super::{note_unavailable, Missing};

pub const NAME: &str = "portable";

pub mod clock;
pub mod filestat;
pub mod fsevents;
pub mod fskind;
pub mod locks;
pub mod mounts;
pub mod notify;
pub mod paths;
pub mod process;
pub mod random;
pub mod reaper;
pub mod sockopt;
pub mod wakefd;

/// The answer to a question this platform cannot ask.
pub(crate) fn unsupported(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("{what} is not available on the portable platform"),
    )
}
