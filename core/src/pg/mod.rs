//! Leases on a PostgreSQL server, for backends on several hosts in front of
//! one database: the target is `postgresql://user@host/db?lease=NAME` and
//! the lease is a session advisory lock held on a connection of the library,
//! with a holder row (and its fencing generation) in `sidelease_leases`.
//!
//! A lease lives beside the process's other leases on its server's shared
//! session (`hub/`, the default), or, when it had to wait or its URL
//! says `session=own`, on a connection of its own with a thread running a
//! single-threaded tokio runtime (`session.rs`): the callers' threads
//! never block on the network beyond a release, the Node addon's runtime
//! is never entered, and the server itself wakes a waiter (a blocking
//! `pg_advisory_lock`). Either way a handle holds a link to its session
//! (`link.rs`); the holder row is `row.rs`'s.

#[cfg(feature = "postgres")]
mod attempt;
#[cfg(feature = "postgres")]
mod confirm;
#[cfg(feature = "postgres")]
mod conn;
#[cfg(feature = "postgres")]
mod fence;
#[cfg(feature = "postgres")]
mod held;
#[cfg(feature = "postgres")]
mod hub;
#[cfg(feature = "postgres")]
mod idle;
#[cfg(feature = "postgres")]
mod inspect;
#[cfg(feature = "postgres")]
mod link;
#[cfg(feature = "postgres")]
mod local;
#[cfg(feature = "postgres")]
mod pooler;
#[cfg(feature = "postgres")]
mod row;
#[cfg(feature = "postgres")]
mod session;
#[cfg(feature = "postgres")]
mod socket;
#[cfg(feature = "postgres")]
pub mod target;
#[cfg(feature = "postgres")]
mod tls;
#[cfg(feature = "postgres")]
mod wait;
#[cfg(feature = "postgres")]
mod write;

use std::path::Path;

use crate::error::{Error, Result};

/// Whether a target is spelled as a PostgreSQL lease (`postgresql://` or
/// `postgres://`, the scheme in any case, as libpq takes it).
pub fn is_target(target: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = target.as_os_str().as_bytes();
    let starts = |p: &[u8]| b.len() >= p.len() && b[..p.len()].eq_ignore_ascii_case(p);
    starts(b"postgresql://") || starts(b"postgres://")
}

/// Which backend a target names: `Ok(true)` a PostgreSQL lease, `Ok(false)`
/// a lease file. A target that looks like a mistyped or half-built URL is
/// neither: `postgresql:` without `//`, or `?lease=` in a path (what
/// `"${DATABASE_URL}?lease=scheduler"` gives when the variable is empty)
/// would otherwise become a lease file of that name, and two directories
/// would each hold "their" lease at once.
pub(crate) fn classify(target: &Path) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    if is_target(target) {
        return Ok(true);
    }
    let b = target.as_os_str().as_bytes();
    let starts = |p: &[u8]| b.len() >= p.len() && b[..p.len()].eq_ignore_ascii_case(p);
    let shown = || mask_path(&String::from_utf8_lossy(b));
    if starts(b"postgresql:") || starts(b"postgres:") {
        return Err(Error::invalid(
            "target",
            format!(
                "{}: looks like a PostgreSQL URL, but a lease URL starts with postgresql:// \
                 (or postgres://)",
                shown()
            ),
        ));
    }
    if b.windows(7).any(|w| w == b"?lease=") {
        return Err(Error::invalid(
            "target",
            format!(
                "{}: has `?lease=` in it, as a PostgreSQL lease target does, but does not start \
                 with postgresql:// (was the URL before it empty, say an unset DATABASE_URL?); \
                 a lease file's name would not have it",
                shown()
            ),
        ));
    }
    Ok(false)
}

/// A path that was meant as a URL, for display: anything up to its last
/// `@` (where a password would be) and any secret-looking parameter
/// hidden, control characters escaped.
fn mask_path(p: &str) -> String {
    let p = match p.rsplit_once('@') {
        Some((_, tail)) => format!("***@{tail}"),
        None => p.to_owned(),
    };
    printable(&mask_query(&p))
}

/// Control characters escaped (`\x07`), so a message shows what it quotes.
pub(crate) fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A PostgreSQL URL cut into credentials, host and path, parameters. The
/// credentials run to the first `@` when it comes before the first `/` (as
/// libpq reads them) or before the first `?` (as the driver reads them, so
/// a password may hold `/` or `#`); an `@` after a `?` with a `/` before it
/// is a parameter's (`?password=a@b`, which libpq accepts).
pub(crate) struct UrlParts<'a> {
    pub scheme: &'a str,
    pub creds: Option<&'a str>,
    /// Hosts and path, up to the parameters.
    pub place: &'a str,
    pub query: Option<&'a str>,
}

pub(crate) fn split_url(url: &str) -> Option<UrlParts<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    let first = |c: char| rest.find(c).unwrap_or(usize::MAX);
    let at = first('@');
    let (creds, rest) = if at != usize::MAX && (at < first('/') || at < first('?')) {
        (Some(&rest[..at]), &rest[at + 1..])
    } else {
        (None, rest)
    };
    let (place, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    Some(UrlParts {
        scheme,
        creds,
        place,
        query,
    })
}

/// Whether a URL parameter may carry a secret: its name, decoded, mentions
/// "pass" in any case (`password`, `PASSWORD`, ` password`, `passfile`…).
fn may_be_secret(key: &str) -> bool {
    let mut out = Vec::new();
    let b = key.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%')
            .then(|| b.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out)
        .to_ascii_lowercase()
        .contains("pass")
}

/// The URL for display: the password (in the credentials or a `password`
/// parameter, however encoded) replaced by `***`, control characters
/// escaped. Anything that does not look like a URL is shown as `***`.
pub fn mask(url: &str) -> String {
    printable(&mask_raw(url))
}

fn mask_raw(url: &str) -> String {
    let Some(p) = split_url(url) else {
        return "***".into();
    };
    if p.place.contains('@') && !p.query.is_some_and(|q| q.contains('@')) {
        // A second `@` before the parameters: where the password ends is
        // ambiguous, so hide everything before the last one.
        let (_, tail) = url.rsplit_once('@').unwrap_or(("", url));
        return format!("{}://***@{}", p.scheme, mask_query(tail));
    }
    let mut out = format!("{}://", p.scheme);
    if let Some(c) = p.creds {
        match c.split_once(':') {
            Some((user, _)) => out.push_str(&format!("{user}:***@")),
            None => out.push_str(&format!("{c}@")),
        }
    }
    out.push_str(&mask_query(&place_query(&p)));
    out
}

fn place_query(p: &UrlParts<'_>) -> String {
    match p.query {
        Some(q) => format!("{}?{q}", p.place),
        None => p.place.to_owned(),
    }
}

/// `place?query` with secret-looking parameters masked.
fn mask_query(s: &str) -> String {
    let Some((place, q)) = s.split_once('?') else {
        return s.to_owned();
    };
    let parts: Vec<String> = q
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if may_be_secret(k) => format!("{k}=***"),
            _ if may_be_secret(kv) => "***".to_owned(),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{place}?{}", parts.join("&"))
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
pub(crate) fn attempt(target: &Path, options: &crate::Options) -> Result<Attempt> {
    Attempt::new(url_of(target)?, options)
}

#[cfg(feature = "postgres")]
pub(crate) fn inspect(target: &Path) -> Result<crate::Inspection> {
    inspect::inspect(url_of(target)?)
}

#[cfg(not(feature = "postgres"))]
mod off {
    use super::*;

    /// Never made: this build has no PostgreSQL support.
    pub(crate) enum Attempt {}

    fn refuse(target: &Path) -> Error {
        let shown = url_of(target).map(mask).unwrap_or_default();
        Error::invalid(
            "target",
            format!(
                "{shown}: this build of sidelease has no PostgreSQL support (Cargo feature \
                 `postgres` of the core)"
            ),
        )
    }

    pub(crate) fn attempt(target: &Path, _: &crate::Options) -> Result<Attempt> {
        Err(refuse(target))
    }

    pub(crate) fn inspect(target: &Path) -> Result<crate::Inspection> {
        Err(refuse(target))
    }

    pub(crate) fn after_fork_in_child() {}

    impl crate::backend::Attempt for Attempt {
        fn lease_path(&self) -> &Path {
            match *self {}
        }
        fn target(&self) -> std::path::PathBuf {
            match *self {}
        }
        fn try_acquire(&mut self) -> Result<Option<crate::Lease>> {
            match *self {}
        }
        fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            match *self {}
        }
        fn next_check(&mut self) -> std::time::Duration {
            match *self {}
        }
        fn elapsed(&self) -> std::time::Duration {
            match *self {}
        }
        fn contention_error(&self, _: bool) -> Error {
            match *self {}
        }
        fn deadline(&self) -> Option<std::time::Instant> {
            match *self {}
        }
    }
}
#[cfg(not(feature = "postgres"))]
pub(crate) use off::*;
