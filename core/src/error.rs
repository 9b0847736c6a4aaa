//! The one error type of sidelease. Every binding converts it in one place.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::record::Record;

/// Why a lease could not be had: who holds it, as far as can be told.
#[derive(Debug, Clone)]
pub struct Contention {
    /// The path the caller asked to protect.
    pub target: PathBuf,
    /// The lease file that is locked.
    pub lease_path: PathBuf,
    /// The holder record read from the lease file; `None` when it is empty or
    /// unreadable (which never means "free"), or when it is not the record of
    /// the process holding the lock (released, stale, or another process's:
    /// a lock taken by something that is not a sidelease holder).
    pub holder: Option<Record>,
    /// PIDs the kernel reports as holding the lock (this process's namespace).
    pub holders: Vec<u32>,
    /// What the lease file's record is when it is not the holder's (`holder`
    /// is then `None`): for the message.
    pub record_note: Option<String>,
    /// The kernel's holders by name (`comm`, where the platform gives it),
    /// when the record does not name the holder: for the message.
    pub names: Vec<(u32, String)>,
    /// How the kernel's holders came to hold the lock when they inherited
    /// it from the process the record names ("inherited from pid N (…),
    /// now gone"); `record_note` is then `None`. For the message.
    pub inherited: Option<String>,
    /// How long the caller waited before giving up (zero for one attempt).
    pub waited: std::time::Duration,
}

/// Every failure sidelease reports.
#[derive(Debug)]
pub enum Error {
    /// Another process (or another copy of the library in this process) holds
    /// the lease.
    InUse(Box<Contention>),
    /// The lease stayed held for the whole timeout.
    Timeout(Box<Contention>),
    /// The lease directory is on a filesystem where `flock` cannot be trusted.
    UnsupportedFilesystem {
        /// The directory whose filesystem was refused.
        path: PathBuf,
        /// The filesystem's name (`nfs`, `cifs`, ...; "an unknown
        /// filesystem" when the magic is not in the table).
        fstype: String,
        /// The filesystem's magic number, as `statfs` reports it.
        magic: u32,
    },
    /// A caller-supplied value is not acceptable; `argument` names it.
    InvalidArgument {
        /// The argument, as the options and the docs spell it (`target`,
        /// `timeout`, `metadata`, ...).
        argument: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A system call failed; `syscall` and `path` say where.
    Io {
        /// The system call that failed (`open`, `flock`, ...), or for a
        /// PostgreSQL lease the step (`connect`, `heartbeat`, ...).
        syscall: &'static str,
        /// The path it was called on; for a PostgreSQL lease, its URL with
        /// the password masked.
        path: PathBuf,
        /// The OS error (its `raw_os_error` is the errno), or the server's
        /// or driver's error in words.
        source: io::Error,
    },
    /// The wait was cancelled through its [`crate::CancelToken`].
    Cancelled {
        /// The lease file waited for; for a PostgreSQL lease, its URL with
        /// the password masked.
        lease_path: PathBuf,
    },
    /// A held lease was lost (see [`crate::Lease::ensure_held`]): its file
    /// was replaced or deleted and another process holds the lease file now,
    /// or it could not be put back.
    Lost(Box<Lost>),
}

/// Why a held lease is no longer whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The lease file that was lost; for a PostgreSQL lease, its URL with
    /// the password masked.
    pub lease_path: PathBuf,
    /// What happened, naming the other holder when there is one.
    pub reason: String,
    /// PIDs the kernel reports as holding the lease file now.
    pub holders: Vec<u32>,
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the lease {} was lost: {}",
            self.lease_path.display(),
            self.reason
        )
    }
}

/// `std::result::Result` with sidelease's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The stable, language-neutral name of each error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// [`Error::InUse`]: `in_use`.
    InUse,
    /// [`Error::Timeout`]: `timeout`.
    Timeout,
    /// [`Error::UnsupportedFilesystem`]: `unsupported_fs`.
    UnsupportedFilesystem,
    /// [`Error::InvalidArgument`]: `invalid_argument`.
    InvalidArgument,
    /// [`Error::Io`]: `io`.
    Io,
    /// [`Error::Cancelled`]: `cancelled`.
    Cancelled,
    /// [`Error::Lost`]: `lost`.
    Lost,
}

impl ErrorKind {
    /// Snake-case name used in JSON answers and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InUse => "in_use",
            ErrorKind::Timeout => "timeout",
            ErrorKind::UnsupportedFilesystem => "unsupported_fs",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Io => "io",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Lost => "lost",
        }
    }
}

impl Error {
    /// Which kind of error this is, without its details.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InUse(_) => ErrorKind::InUse,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::UnsupportedFilesystem { .. } => ErrorKind::UnsupportedFilesystem,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::Io { .. } => ErrorKind::Io,
            Error::Cancelled { .. } => ErrorKind::Cancelled,
            Error::Lost(_) => ErrorKind::Lost,
        }
    }

    /// Holder details of an in-use or timeout error.
    pub fn contention(&self) -> Option<&Contention> {
        match self {
            Error::InUse(c) | Error::Timeout(c) => Some(c),
            _ => None,
        }
    }

    /// The OS error number of an I/O error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    pub(crate) fn invalid(argument: &'static str, message: impl Into<String>) -> Error {
        Error::InvalidArgument {
            argument,
            message: message.into(),
        }
    }

    pub(crate) fn io(syscall: &'static str, path: &Path, source: impl Into<io::Error>) -> Error {
        Error::Io {
            syscall,
            path: path.to_path_buf(),
            source: source.into(),
        }
    }
}

impl fmt::Display for Contention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is leased by ", self.target.display())?;
        match &self.holder {
            Some(rec) if rec.pid.is_some() => {
                write!(f, "pid {}", rec.pid.unwrap_or_default())?;
                if rec.pid_ns.is_some() && rec.pid_ns != crate::platform::process::current().pid_ns
                {
                    write!(f, " of another PID namespace")?;
                }
                // The runtime, and the application's own words about the
                // holder (its metadata, as any reader of the record sees it).
                let about: Vec<String> = rec
                    .runtime
                    .iter()
                    .cloned()
                    .chain(rec.metadata.as_ref().map(metadata_text))
                    .collect();
                if !about.is_empty() {
                    write!(f, " ({})", about.join(", "))?;
                }
                if let Some(host) = &rec.host {
                    write!(f, " on {host}")?;
                }
                if let Some(since) = &rec.started_at {
                    write!(f, " since {since}")?;
                }
                if !self.holders.is_empty() && !self.holders.contains(&rec.pid.unwrap_or(0)) {
                    write!(f, "; the kernel reports pid {}", join_pids(&self.holders))?;
                }
            }
            _ => {
                if self.holders.is_empty() {
                    write!(f, "another process")?;
                } else {
                    let named: Vec<String> = self
                        .holders
                        .iter()
                        .map(|pid| {
                            let about: Vec<&str> = self
                                .names
                                .iter()
                                .filter(|(p, _)| p == pid)
                                .map(|(_, name)| name.as_str())
                                .chain(self.inherited.as_deref())
                                .collect();
                            match about.is_empty() {
                                true => pid.to_string(),
                                false => format!("{pid} ({})", about.join(", ")),
                            }
                        })
                        .collect();
                    write!(f, "pid {}", named.join(", "))?;
                }
                match (&self.record_note, &self.inherited) {
                    (Some(note), _) => write!(f, ": {note}")?,
                    // The holder and where it got the lock: said above.
                    (None, Some(_)) if !self.holders.is_empty() => {}
                    (None, _) => write!(f, ": holder record empty or unreadable")?,
                }
            }
        }
        let noun = crate::backend::Engine::noun_of(&self.lease_path);
        write!(f, " [{noun} {}]", self.lease_path.display())
    }
}

/// The holder's metadata in a message: its JSON, cut at 120 characters
/// (the record keeps up to 16 KiB).
pub(crate) fn metadata_text(m: &serde_json::Map<String, serde_json::Value>) -> String {
    const MAX: usize = 120;
    let text = serde_json::Value::Object(m.clone()).to_string();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

fn join_pids(pids: &[u32]) -> String {
    let v: Vec<String> = pids.iter().map(u32::to_string).collect();
    v.join(", ")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InUse(c) => c.fmt(f),
            Error::Timeout(c) => write!(f, "timed out after {:.3}s: {c}", c.waited.as_secs_f64()),
            Error::UnsupportedFilesystem {
                path,
                fstype,
                magic,
            } => write!(
                f,
                "{} is on {fstype} (filesystem magic {magic:#x}), where flock is not a reliable \
                 lock; pass allow_unsupported_fs to use it anyway",
                path.display()
            ),
            Error::InvalidArgument { argument, message } => {
                write!(f, "invalid argument `{argument}`: {message}")
            }
            Error::Io {
                syscall,
                path,
                source,
            } => write!(f, "{syscall} {}: {}", path.display(), os_message(source)),
            Error::Cancelled { lease_path } => {
                write!(f, "wait for {} was cancelled", lease_path.display())
            }
            Error::Lost(l) => l.fmt(f),
        }
    }
}

/// The system's text for an OS error, without Rust's "(os error N)" tail.
pub fn os_message(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let text = e.to_string();
            let tail = format!(" (os error {code})");
            text.strip_suffix(&tail).unwrap_or(&text).to_owned()
        }
        None => e.to_string(),
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
