//! The identity probe (DESIGN §7): who holds a lease, from the kernel, and
//! what the holder record is worth. Never holds or blocks the lock: where
//! the kernel's table of locks is missing (the portable platform, a
//! sandbox's `/proc`) or names no holder, a shared lock taken and let go at
//! once says whether it is held. Every judgement needs evidence, and
//! "cannot tell" is an answer.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Result;
use crate::file::guard::Orphan;
use crate::options::Options;
use crate::platform::Missing;
use crate::record::{self, Record};

/// Whether the lease is held, as the kernel (or the server) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Nobody holds it (nor a former lease file of it).
    Free,
    /// Someone holds the lease file at the path (for a PostgreSQL lease:
    /// a server session holds its advisory lock); `holders` says who when
    /// the kernel's table of locks names them.
    Held,
    /// A live process still holds a former lease file (deleted, moved away,
    /// or reached through another mount) and does not hold the current one.
    Split,
    /// No kernel view, or this reader cannot see the locks that matter (a
    /// child PID namespace with no visible lock and a record naming an
    /// unreleased holder outside it).
    Unknown,
}

/// What the holder record is worth, and how that was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordStatus {
    /// Its process exists with the same boot, namespace and start time and
    /// holds the lock (or a former lease file of this lease).
    Live,
    /// This process holds it.
    #[serde(rename = "self")]
    Myself,
    /// Its process is gone, its PID was reused, or the machine rebooted.
    Stale,
    /// Same PID and start time, but no descriptor of it holds the lock: the
    /// program was replaced by exec.
    ImageReplaced,
    /// The last holder released cleanly.
    Released,
    /// Another host or PID namespace: not judged.
    Foreign,
    /// Nothing to judge: no lease file, or one nothing was ever written
    /// into (for a PostgreSQL lease: no holder row).
    Empty,
    /// The lease file could not be read by this user, or its bytes are not a
    /// record (torn, corrupted, foreign, too long).
    Unreadable,
    /// The record lacks what a judgement needs (no PID, no start time), or
    /// the kernel view is missing: cannot tell.
    Unknown,
}

impl State {
    /// Lower-case name used in JSON answers and by the CLI (`free`, `held`,
    /// `split`, `unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Free => "free",
            State::Held => "held",
            State::Split => "split",
            State::Unknown => "unknown",
        }
    }
}

impl RecordStatus {
    /// Kebab-case name used in JSON answers and by the CLI (`live`, `self`,
    /// `image-replaced`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Live => "live",
            RecordStatus::Myself => "self",
            RecordStatus::Stale => "stale",
            RecordStatus::ImageReplaced => "image-replaced",
            RecordStatus::Released => "released",
            RecordStatus::Foreign => "foreign",
            RecordStatus::Empty => "empty",
            RecordStatus::Unreadable => "unreadable",
            RecordStatus::Unknown => "unknown",
        }
    }
}

/// Who holds a lease and what its record is worth: the answer of
/// [`inspect()`].
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The target the lease protects (for a PostgreSQL lease, its URL with
    /// the password masked).
    pub target: PathBuf,
    /// The lease file, canonical (for a PostgreSQL lease, the masked URL).
    pub lease_path: PathBuf,
    /// Whether it is held.
    pub state: State,
    /// PIDs the kernel reports as holding the lease file at the path (this
    /// process's PID namespace). Empty when nobody holds it, when the
    /// platform has no table of locks, and for a PostgreSQL lease (see
    /// `server`).
    pub holders: Vec<u32>,
    /// The holder record in the lease file (or the holder row); `None` when
    /// there is none or it is unreadable (see `record_status`).
    pub record: Option<Record>,
    /// What `record` is worth.
    pub record_status: RecordStatus,
    /// Former lease files (deleted, moved away, mounted over) held by a
    /// process that does not hold the file at the path: the lease is split.
    pub orphans: Vec<Orphan>,
    /// Former lease files the holder of the file at the path keeps locked
    /// since it put the lease file back (not a split: its own).
    pub former: Vec<Orphan>,
    /// Exclusive `flock` locks on the machine this reader could not
    /// attribute (their holder's descriptors were not readable by this
    /// user, or no visible process holds them): any of them may be a former
    /// lease file, so while there are some, `state` may be `unknown`.
    pub unattributed: usize,
    /// For a PostgreSQL lease: the server session holding the lock.
    pub server: Option<ServerHolder>,
    /// What this inspection could not ask the kernel (and what this
    /// process's waits and watch could not have), so a portable answer
    /// stood in. Always empty for a PostgreSQL lease.
    pub unavailable: Vec<Missing>,
}

/// The server session holding a PostgreSQL lease, as `pg_locks`,
/// `pg_stat_activity` and `pg_stat_ssl` show it (client address and
/// application name only where this user may see them).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerHolder {
    /// The server process of the session (`pg_backend_pid()` there).
    pub backend_pid: u32,
    /// The client's address; `None` over a Unix socket or where this user
    /// may not see it.
    pub client_addr: Option<String>,
    /// The session's `application_name` (a sidelease session's is
    /// `sidelease PID@HOST NAME`); `None` where this user may not see it.
    pub application_name: Option<String>,
    /// Whether the session is encrypted (TLS), as the server says.
    pub encrypted: Option<bool>,
}

impl Inspection {
    /// The inspection as one JSON object. Paths that are not UTF-8 keep
    /// their bytes as `\udcXX` escapes (see [`record::json_path`]), so the
    /// document is complete for any path.
    pub fn to_json(&self) -> String {
        let value = |v: serde_json::Result<String>| v.unwrap_or_else(|_| "null".into());
        format!(
            "{{\"target\":{},\"lease_path\":{},\"state\":\"{}\",\"holders\":{},\"record\":{},\
             \"record_status\":\"{}\",\"orphans\":{},\"former\":{},\"unattributed\":{},\
             \"server\":{},\"platform\":{{\"implementation\":\"{}\",\"unavailable\":{}}}}}",
            record::json_path(self.target.as_os_str().as_bytes()),
            record::json_path(self.lease_path.as_os_str().as_bytes()),
            self.state.as_str(),
            value(serde_json::to_string(&self.holders)),
            value(serde_json::to_string(&self.record)),
            self.record_status.as_str(),
            value(serde_json::to_string(&self.orphans)),
            value(serde_json::to_string(&self.former)),
            self.unattributed,
            value(serde_json::to_string(&self.server)),
            crate::platform::IMPLEMENTATION,
            value(serde_json::to_string(
                &self
                    .unavailable
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
            )),
        )
    }
}

/// Inspect the lease of `target`: a lease file (only `options.suffix` is
/// used) or a PostgreSQL lease.
pub fn inspect(target: impl AsRef<Path>, options: &Options) -> Result<Inspection> {
    options.validate()?;
    crate::backend::inspect(target.as_ref(), options)
}
