//! sidelease: one exclusive `flock` lease per database (or data directory)
//! on a machine, held through a persistent sidecar file, shared by every
//! handle of a process, judged from the kernel rather than from a PID in a
//! file, and kept whole while held: if someone deletes, moves or replaces
//! the lease file, the holder puts it back at once (or learns the lease is
//! lost).
//!
//! ```no_run
//! use sidelease::{Lease, Options, Wait};
//! use std::time::Duration;
//!
//! let opts = Options::new().wait(Wait::Timeout(Duration::from_secs(2)));
//! let lease = Lease::acquire("app.db", &opts)?;
//! if lease.previous_released_cleanly() == Some(false) {
//!     // the previous holder died holding the lease: recover
//! }
//! lease.ensure_held()?; // before work that must only happen under the lease
//! lease.release()?;
//! # Ok::<(), sidelease::Error>(())
//! ```
//!
//! This crate is the one core the C, Python, Node and Bun surfaces share.

#![warn(missing_docs)]

mod backend;
pub mod elector;
mod error;
mod faults;
mod file;
mod forkgate;
mod inspect;
mod lease;
mod nonce;
mod options;
mod path;
mod pending;
pub mod pg;
// Support for the sibling crates (CLI, bindings, test agents) and tests, not
// the API: may change without notice.
#[doc(hidden)]
pub mod platform;
pub mod record;
mod registry;
mod service;

pub use error::{os_message as error_text, Contention, Error, ErrorKind, Lost, Result};
pub use file::guard::Orphan;
// Support for the bindings and tests (pausing the watcher around a fork,
// counting inotify instances), not the API: may change without notice.
#[doc(hidden)]
pub use file::watch;
pub use inspect::{inspect, Inspection, RecordStatus, ServerHolder, State};
pub use lease::{on_any_lost, Check, Lease, LeaseState};
pub use options::{Options, Wait, DEFAULT_SUFFIX};
pub use pending::Pending;
pub use platform::notify::CancelToken;
pub use record::{Content, Record};
pub use registry::MAX_LEASES;

/// `sidelease X.Y.Z`, as written in every record.
pub const LIBRARY: &str = concat!("sidelease ", env!("CARGO_PKG_VERSION"));
/// This library's version, `X.Y.Z` (the crate's version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
