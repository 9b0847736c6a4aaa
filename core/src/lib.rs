//! sidelease: one exclusive `flock` lease per database (or data directory)
//! on a machine, held through a persistent sidecar file, shared by every
//! handle of a process, and judged from the kernel rather than from a PID in
//! a file.
//!
//! ```no_run
//! use sidelease::{Lease, Options, Wait};
//! use std::time::Duration;
//!
//! let opts = Options::new().wait(Wait::Timeout(Duration::from_secs(2)));
//! let lease = Lease::acquire("app.db", &opts)?;
//! if !lease.previous_released_cleanly() {
//!     // the previous holder died holding the lease: recover
//! }
//! lease.release()?;
//! # Ok::<(), sidelease::Error>(())
//! ```
//!
//! The contract is `DESIGN.md`; this crate is the one core the C, Python,
//! Node and Bun surfaces share.

mod acquire;
mod error;
mod holders;
mod inspect;
mod lease;
mod options;
mod path;
pub mod platform;
pub mod record;
mod registry;

pub use acquire::Pending;
pub use error::{Contention, Error, ErrorKind, Result};
pub use holders::Orphan;
pub use inspect::{inspect, Inspection, RecordStatus, State};
pub use lease::{Check, Lease};
pub use options::{Options, Wait, DEFAULT_SUFFIX};
pub use platform::notify::CancelToken;
pub use record::{Content, Record};
pub use registry::MAX_LEASES;

/// `sidelease X.Y.Z`, as written in every record.
pub const LIBRARY: &str = concat!("sidelease ", env!("CARGO_PKG_VERSION"));
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
