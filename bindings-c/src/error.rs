//! Statuses, and the one place where the core's error becomes a C status and
//! the thread's last error.

use std::cell::RefCell;
use std::os::raw::c_char;

use sidelease_core::{Error, ErrorKind};

use crate::strings::copy_out;

/// What every fallible function returns. Numbers are fixed and never reused.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sidelease_status {
    /// Success: the function did what it says and wrote its out-parameters
    /// (they are written only on success).
    SIDELEASE_OK = 0,
    /// Another process (or another copy of the library) holds the lease.
    SIDELEASE_ERR_IN_USE = 1,
    /// The lease stayed held for the whole timeout.
    SIDELEASE_ERR_TIMEOUT = 2,
    /// The lease directory is on a filesystem where flock is unreliable.
    SIDELEASE_ERR_UNSUPPORTED_FS = 3,
    /// An argument's value is not acceptable; the message names it.
    SIDELEASE_ERR_INVALID_ARGUMENT = 4,
    /// A system call failed; see sidelease_last_errno().
    SIDELEASE_ERR_IO = 5,
    /// A required pointer argument was NULL; the message names it.
    SIDELEASE_ERR_NULL_ARGUMENT = 6,
    /// A bug inside the library was caught before it reached the caller.
    SIDELEASE_ERR_PANIC = 7,
    /// The wait was cancelled through a sidelease_cancel.
    SIDELEASE_ERR_CANCELLED = 8,
    /// A buffer given to the library was too small (the output is truncated).
    SIDELEASE_ERR_BUFFER_TOO_SMALL = 9,
    /// The lease was lost while held: its file was replaced or deleted and
    /// another process holds the lease file now, or it could not be put back
    /// (the message says which).
    SIDELEASE_ERR_LOST = 10,
    /// The answer is not known: a lease that could only open its file
    /// read-only writes no record, so it has no fencing generation and
    /// cannot tell whether its predecessor released cleanly.
    SIDELEASE_ERR_UNKNOWN = 11,
}

use sidelease_status::*;

/// Failures of the C layer: the core's errors and the boundary's own.
pub(crate) enum FfiError {
    Core(Error),
    Null(&'static str),
    Invalid(&'static str, String),
    Unknown(String),
    Panic,
}

impl From<Error> for FfiError {
    fn from(e: Error) -> Self {
        FfiError::Core(e)
    }
}

#[derive(Default)]
struct LastError {
    message: Vec<u8>,
    errno: i32,
    holder: Vec<u8>,
    holders: Vec<u32>,
}

thread_local! {
    static LAST: RefCell<LastError> = RefCell::new(LastError::default());
}

pub(crate) fn record_failure(e: FfiError) -> sidelease_status {
    let (status, last) = match e {
        FfiError::Core(e) => {
            let status = match e.kind() {
                ErrorKind::InUse => SIDELEASE_ERR_IN_USE,
                ErrorKind::Timeout => SIDELEASE_ERR_TIMEOUT,
                ErrorKind::UnsupportedFilesystem => SIDELEASE_ERR_UNSUPPORTED_FS,
                ErrorKind::InvalidArgument => SIDELEASE_ERR_INVALID_ARGUMENT,
                ErrorKind::Io => SIDELEASE_ERR_IO,
                ErrorKind::Cancelled => SIDELEASE_ERR_CANCELLED,
                ErrorKind::Lost => SIDELEASE_ERR_LOST,
            };
            let (holder, holders) = match e.contention() {
                Some(c) => (
                    c.holder
                        .as_ref()
                        .map(|r| r.to_json())
                        .unwrap_or_else(|| "null".into())
                        .into_bytes(),
                    c.holders.clone(),
                ),
                None => (Vec::new(), Vec::new()),
            };
            (
                status,
                LastError {
                    message: e.to_string().into_bytes(),
                    errno: e.errno().unwrap_or(0),
                    holder,
                    holders,
                },
            )
        }
        FfiError::Null(name) => (
            SIDELEASE_ERR_NULL_ARGUMENT,
            LastError {
                message: format!("argument `{name}` is NULL").into_bytes(),
                ..Default::default()
            },
        ),
        FfiError::Invalid(name, why) => (
            SIDELEASE_ERR_INVALID_ARGUMENT,
            LastError {
                message: format!("invalid argument `{name}`: {why}").into_bytes(),
                ..Default::default()
            },
        ),
        FfiError::Unknown(why) => (
            SIDELEASE_ERR_UNKNOWN,
            LastError {
                message: why.into_bytes(),
                ..Default::default()
            },
        ),
        FfiError::Panic => (
            SIDELEASE_ERR_PANIC,
            LastError {
                message: b"internal error in sidelease (a panic was caught)".to_vec(),
                ..Default::default()
            },
        ),
    };
    // A panic while unwinding must not escape: try_with and ignore failure.
    let _ = LAST.try_with(|l| *l.borrow_mut() = last);
    status
}

/// Copy the message of this thread's last failure into `buf` (at most `len`
/// bytes including the terminating NUL; truncated if needed). `*written`
/// (if not NULL) receives the full message length without the NUL. `buf`
/// may be NULL when `len` is 0, to ask for the length only. The message
/// stays until the next failure in this thread; success does not clear it.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_BUFFER_TOO_SMALL when truncated, or
/// SIDELEASE_ERR_NULL_ARGUMENT when `buf` is NULL with `len` > 0.
#[no_mangle]
pub unsafe extern "C" fn sidelease_last_error(
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> sidelease_status {
    LAST.with(|l| copy_out(&l.borrow().message, buf, len, written))
}

/// The errno of this thread's last SIDELEASE_ERR_IO failure (0 otherwise).
#[no_mangle]
pub extern "C" fn sidelease_last_errno() -> i32 {
    LAST.try_with(|l| l.borrow().errno).unwrap_or(0)
}

/// The holder record JSON of this thread's last in-use or timeout failure
/// ("null" when the record was empty or unreadable; "" after other
/// failures). Buffer rules as sidelease_last_error().
#[no_mangle]
pub unsafe extern "C" fn sidelease_last_holder_json(
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> sidelease_status {
    LAST.with(|l| copy_out(&l.borrow().holder, buf, len, written))
}

/// The PIDs the kernel reported as holders at this thread's last in-use or
/// timeout failure. Copies at most `len` of them into `pids` (which may be
/// NULL when `len` is 0); `*count` (required) receives how many there are.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_BUFFER_TOO_SMALL when `len` < count,
/// or SIDELEASE_ERR_NULL_ARGUMENT when `count` is NULL, or `pids` is NULL
/// with `len` > 0.
#[no_mangle]
pub unsafe extern "C" fn sidelease_last_holder_pids(
    pids: *mut u32,
    len: usize,
    count: *mut usize,
) -> sidelease_status {
    if count.is_null() || (pids.is_null() && len > 0) {
        return SIDELEASE_ERR_NULL_ARGUMENT;
    }
    LAST.with(|l| {
        let l = l.borrow();
        let n = l.holders.len().min(len);
        if n > 0 {
            // SAFETY: `pids` holds at least `len` >= n elements.
            unsafe { std::ptr::copy_nonoverlapping(l.holders.as_ptr(), pids, n) };
        }
        // SAFETY: checked non-NULL above.
        unsafe { count.write(l.holders.len()) };
        if len < l.holders.len() {
            SIDELEASE_ERR_BUFFER_TOO_SMALL
        } else {
            SIDELEASE_OK
        }
    })
}

/// A fixed description of a status, copied into `buf` with the same rules as
/// sidelease_last_error(). Unknown numbers get "unknown status".
#[no_mangle]
pub unsafe extern "C" fn sidelease_strerror(
    status: i32,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> sidelease_status {
    let text: &[u8] = match status {
        0 => b"success",
        1 => b"the lease is held by another process",
        2 => b"timed out waiting for the lease",
        3 => b"the lease directory is on an unsupported filesystem",
        4 => b"invalid argument",
        5 => b"input/output error",
        6 => b"a required argument is NULL",
        7 => b"internal error (panic caught)",
        8 => b"the wait was cancelled",
        9 => b"buffer too small",
        10 => b"the lease was lost while held",
        11 => b"the answer is not known (read-only lease file)",
        _ => b"unknown status",
    };
    copy_out(text, buf, len, written)
}
