//! What a caller can ask of `acquire` and `inspect`.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::record;

/// The lease file's default suffix: `app.db` is leased through
/// `app.db.backend-lease`.
pub const DEFAULT_SUFFIX: &str = ".backend-lease";

/// How long `acquire` may wait for a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// One attempt (the default).
    #[default]
    NoWait,
    /// Wait up to this long.
    Timeout(Duration),
    /// Wait until the lease is free or the wait is cancelled.
    Forever,
}

impl Wait {
    /// The shared reading of a timeout in seconds, as the Python surface and
    /// the CLI take it: 0 is one attempt, +inf waits forever, negative and NaN
    /// are refused.
    pub fn from_secs_f64(secs: f64) -> Result<Wait> {
        if secs.is_nan() {
            return Err(Error::invalid("timeout", "is NaN"));
        }
        if secs < 0.0 {
            return Err(Error::invalid("timeout", format!("is negative ({secs})")));
        }
        if secs == 0.0 {
            return Ok(Wait::NoWait);
        }
        if secs.is_infinite() {
            return Ok(Wait::Forever);
        }
        Duration::try_from_secs_f64(secs)
            .map(Wait::Timeout)
            .map_err(|_| Error::invalid("timeout", format!("is out of range ({secs})")))
    }

    /// The same reading for milliseconds (the Node surface).
    pub fn from_millis_f64(ms: f64) -> Result<Wait> {
        Wait::from_secs_f64(ms / 1000.0)
    }
}

/// Options of `acquire` (all of them) and `inspect` (`suffix` only).
#[derive(Debug, Clone)]
pub struct Options {
    /// Appended to the resolved target to name the lease file.
    pub suffix: String,
    /// How long `acquire` waits for a held lease (one attempt by default).
    pub wait: Wait,
    /// The caller's own JSON object, stored in the record.
    pub metadata: Option<Map<String, Value>>,
    /// Accept filesystems where `flock` is not known to be reliable.
    pub allow_unsupported_fs: bool,
    /// Refuse to create a second lock domain when a live process holds a
    /// former lease file (deleted, moved or replaced): reads `/proc/locks`
    /// unless the previous holder's record vouches for the file.
    pub split_guard: bool,
    /// Who is calling, for the record (`python 3.11.7`, `node 20.20.2`, …).
    pub runtime: Option<String>,
    /// Watch the held lease file and put it back at once if someone deletes,
    /// moves or replaces it (and report the lease lost if that fails).
    pub watch: bool,
    /// The lease will be handed on to another process
    /// (`Lease::inheritable_fd`, as `sidelease hold` and `lead` give their
    /// command): a PostgreSQL lease then keeps a connection of its own
    /// rather than the process's shared session, unless its URL says
    /// `session=shared`.
    pub inheritable: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            suffix: DEFAULT_SUFFIX.to_string(),
            wait: Wait::NoWait,
            metadata: None,
            allow_unsupported_fs: false,
            split_guard: true,
            runtime: None,
            watch: true,
            inheritable: false,
        }
    }
}

impl Options {
    /// The defaults: suffix [`DEFAULT_SUFFIX`], one attempt, no metadata,
    /// split guard and watch on.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long `acquire` may wait for a held lease.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// The lease file's suffix (checked by [`Options::validate`]: not
    /// empty, no `/`, no NUL).
    pub fn suffix(mut self, suffix: impl Into<String>) -> Self {
        self.suffix = suffix.into();
        self
    }

    /// Set metadata from a JSON value; it must be an object of at most
    /// [`record::METADATA_MAX_BYTES`] serialized, else `InvalidArgument`.
    pub fn metadata(mut self, metadata: Value) -> Result<Self> {
        self.metadata = Some(record::validate_metadata(&metadata)?);
        Ok(self)
    }

    /// Accept a lease directory on a filesystem where `flock` is not known
    /// to be reliable (NFS, SMB, ...) instead of failing with
    /// `UnsupportedFilesystem`.
    pub fn allow_unsupported_fs(mut self, allow: bool) -> Self {
        self.allow_unsupported_fs = allow;
        self
    }

    /// Turn the split guard on (the default) or off.
    pub fn split_guard(mut self, on: bool) -> Self {
        self.split_guard = on;
        self
    }

    /// Turn the holder's watch on (the default) or off.
    pub fn watch(mut self, on: bool) -> Self {
        self.watch = on;
        self
    }

    /// Say the lease will be handed on to another process (see the
    /// `inheritable` field).
    pub fn inheritable(mut self, on: bool) -> Self {
        self.inheritable = on;
        self
    }

    /// Who is calling, for the record's `runtime` (`rust` when unset).
    pub fn runtime(mut self, runtime: impl Into<String>) -> Self {
        self.runtime = Some(runtime.into());
        self
    }

    /// Check the options on their own (acquire and inspect do it too).
    pub fn validate(&self) -> Result<()> {
        if self.suffix.is_empty() {
            return Err(Error::invalid("suffix", "is empty"));
        }
        if self.suffix.contains('/') {
            return Err(Error::invalid(
                "suffix",
                format!("{:?} contains '/'", self.suffix),
            ));
        }
        if self.suffix.contains('\0') {
            return Err(Error::invalid("suffix", "contains a NUL byte"));
        }
        if let Some(m) = &self.metadata {
            record::validate_metadata(&Value::Object(m.clone()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_the_same_everywhere() {
        assert_eq!(Wait::from_secs_f64(0.0).unwrap(), Wait::NoWait);
        assert_eq!(Wait::from_secs_f64(f64::INFINITY).unwrap(), Wait::Forever);
        assert_eq!(
            Wait::from_secs_f64(1.5).unwrap(),
            Wait::Timeout(Duration::from_millis(1500))
        );
        assert_eq!(
            Wait::from_millis_f64(250.0).unwrap(),
            Wait::Timeout(Duration::from_millis(250))
        );
        for bad in [f64::NAN, -1.0, f64::NEG_INFINITY, 1e300] {
            let e = Wait::from_secs_f64(bad).unwrap_err();
            assert!(e.to_string().contains("`timeout`"), "{e}");
        }
    }

    #[test]
    fn suffix_is_checked() {
        for bad in ["", "a/b", "x\0"] {
            let e = Options::new().suffix(bad).validate().unwrap_err();
            assert!(e.to_string().contains("`suffix`"), "{e}");
        }
        assert!(Options::new().suffix(".lock").validate().is_ok());
    }
}
