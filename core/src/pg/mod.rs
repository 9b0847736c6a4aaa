//! Leases on a PostgreSQL server, for backends on several hosts in front of
//! one database: the target is `postgresql://user@host/db?lease=NAME` and
//! the lease is a session advisory lock held on one dedicated connection,
//! with a holder row (and its fencing generation) in `sidelease_leases`.
//!
//! Each lease (and each acquisition in flight) has its own thread running a
//! single-threaded tokio runtime: the callers' threads never block on the
//! network beyond a release, the Node addon's runtime is never entered, and
//! the server itself wakes a waiter (a blocking `pg_advisory_lock`).

#[cfg(feature = "postgres")]
mod attempt;
#[cfg(feature = "postgres")]
mod inspect;
#[cfg(feature = "postgres")]
mod local;
#[cfg(feature = "postgres")]
mod session;
#[cfg(feature = "postgres")]
mod socket;
#[cfg(feature = "postgres")]
pub mod target;

use std::path::Path;

use crate::error::{Error, Result};
use crate::lease::Shared;

/// Whether a target is spelled as a PostgreSQL lease (`postgresql://` or
/// `postgres://`).
pub fn is_target(target: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = target.as_os_str().as_bytes();
    b.starts_with(b"postgresql://") || b.starts_with(b"postgres://")
}

fn url_of(target: &Path) -> Result<&str> {
    target
        .to_str()
        .ok_or_else(|| Error::invalid("target", "a PostgreSQL URL must be UTF-8"))
}

#[cfg(feature = "postgres")]
pub(crate) use attempt::Attempt;
#[cfg(feature = "postgres")]
pub(crate) use local::after_fork_in_child;
#[cfg(feature = "postgres")]
pub(crate) use session::Link;

#[cfg(feature = "postgres")]
pub(crate) fn attempt(target: &Path, options: &crate::Options) -> Result<Attempt> {
    Attempt::new(url_of(target)?, options)
}

#[cfg(feature = "postgres")]
pub(crate) fn inspect(target: &Path) -> Result<crate::Inspection> {
    inspect::inspect(url_of(target)?)
}

/// The last release of a PostgreSQL lease in this process.
#[cfg(feature = "postgres")]
pub(crate) fn release(s: &std::sync::Arc<Shared>, link: &Link) -> Result<()> {
    local::release(s, link)
}

#[cfg(not(feature = "postgres"))]
mod off {
    use super::*;

    /// Never made: this build has no PostgreSQL support.
    pub(crate) enum Link {}
    pub(crate) enum Attempt {}

    fn refuse(target: &Path) -> Error {
        let shown = url_of(target).map(mask_password).unwrap_or_default();
        Error::invalid(
            "target",
            format!(
                "{shown}: this build of sidelease has no PostgreSQL support (Cargo feature \
                 `postgres` of the core)"
            ),
        )
    }

    fn mask_password(url: &str) -> String {
        match (url.find("://"), url.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
            _ => url.to_owned(),
        }
    }

    pub(crate) fn attempt(target: &Path, _: &crate::Options) -> Result<Attempt> {
        Err(refuse(target))
    }

    pub(crate) fn inspect(target: &Path) -> Result<crate::Inspection> {
        Err(refuse(target))
    }

    pub(crate) fn release(_: &std::sync::Arc<Shared>, link: &Link) -> Result<()> {
        match *link {}
    }

    pub(crate) fn after_fork_in_child() {}

    impl Attempt {
        pub(crate) fn shown(&self) -> &Path {
            match *self {}
        }
        pub(crate) fn try_acquire(&mut self) -> Result<Option<crate::Lease>> {
            match *self {}
        }
        pub(crate) fn wait_fd(&self) -> std::os::fd::BorrowedFd<'_> {
            match *self {}
        }
        pub(crate) fn next_check(&self) -> std::time::Duration {
            match *self {}
        }
        pub(crate) fn elapsed(&self) -> std::time::Duration {
            match *self {}
        }
        pub(crate) fn contention_error(&self, _: bool) -> Error {
            match *self {}
        }
    }
}
#[cfg(not(feature = "postgres"))]
pub(crate) use off::*;
