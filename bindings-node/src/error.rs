//! The one place where the core's error becomes a JS error: `code` is the
//! stable `SIDELEASE_*` string and the message is a JSON payload that
//! `index.js` turns into a `SideleaseError` with its data fields.

use napi::Error as NapiError;
use serde_json::json;
use sidelease::{Error, ErrorKind};

pub type Result<T> = std::result::Result<T, NapiError<String>>;

pub fn code(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InUse => "SIDELEASE_IN_USE",
        ErrorKind::Timeout => "SIDELEASE_TIMEOUT",
        ErrorKind::UnsupportedFilesystem => "SIDELEASE_UNSUPPORTED_FS",
        ErrorKind::InvalidArgument => "SIDELEASE_INVALID_ARGUMENT",
        ErrorKind::Io => "SIDELEASE_IO",
        ErrorKind::Cancelled => "ABORT_ERR",
        ErrorKind::Lost => "SIDELEASE_LOST",
    }
}

pub fn to_js(e: Error) -> NapiError<String> {
    let mut payload = json!({ "code": code(e.kind()), "message": e.to_string() });
    match &e {
        Error::InUse(c) | Error::Timeout(c) => {
            payload["holder"] = c
                .holder
                .as_ref()
                .map(|r| r.to_value())
                .unwrap_or(serde_json::Value::Null);
            payload["holders"] = json!(c.holders);
            payload["leasePath"] = json!(c.lease_path.to_string_lossy());
            payload["target"] = json!(c.target.to_string_lossy());
        }
        Error::UnsupportedFilesystem { path, fstype, .. } => {
            payload["fstype"] = json!(fstype);
            payload["path"] = json!(path.to_string_lossy());
        }
        Error::InvalidArgument { argument, .. } => payload["argument"] = json!(argument),
        Error::Io {
            syscall,
            path,
            source,
        } => {
            // Node's convention: errno is negative, as in fs errors.
            payload["errno"] = json!(-source.raw_os_error().unwrap_or(libc_eio()));
            payload["syscall"] = json!(syscall);
            payload["path"] = json!(path.to_string_lossy());
        }
        Error::Cancelled { .. } => {}
        Error::Lost(l) => {
            payload["reason"] = json!(l.reason);
            payload["holders"] = json!(l.holders);
            payload["leasePath"] = json!(l.lease_path.to_string_lossy());
        }
    }
    NapiError::new(code(e.kind()).to_string(), payload.to_string())
}

fn libc_eio() -> i32 {
    5
}

/// The same for async functions, whose errors napi-rs types as plain
/// `napi::Error` (`index.js` reads the code from the payload).
pub fn to_js_async(e: Error) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, to_js(e).reason)
}

pub trait IntoJs<T> {
    fn js(self) -> Result<T>;
}

impl<T> IntoJs<T> for sidelease::Result<T> {
    fn js(self) -> Result<T> {
        self.map_err(to_js)
    }
}

pub fn invalid(argument: &'static str, message: &str) -> NapiError<String> {
    to_js(Error::InvalidArgument {
        argument,
        message: message.to_string(),
    })
}
