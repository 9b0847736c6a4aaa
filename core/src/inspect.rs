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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Free,
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
    Empty,
    Unreadable,
    /// The record lacks what a judgement needs (no PID, no start time), or
    /// the kernel view is missing: cannot tell.
    Unknown,
}

impl State {
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

#[derive(Debug, Clone)]
pub struct Inspection {
    pub target: PathBuf,
    pub lease_path: PathBuf,
    pub state: State,
    pub holders: Vec<u32>,
    pub record: Option<Record>,
    pub record_status: RecordStatus,
    /// Former lease files (deleted, moved away, mounted over) held by a
    /// process that does not hold the file at the path: the lease is split.
    pub orphans: Vec<Orphan>,
    /// Former lease files the holder of the file at the path keeps locked
    /// since it put the lease file back (not a split: its own).
    pub former: Vec<Orphan>,
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
    pub backend_pid: u32,
    pub client_addr: Option<String>,
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
