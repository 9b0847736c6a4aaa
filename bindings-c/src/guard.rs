//! The panic boundary: every exported body runs inside [`guard`].

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{record_failure, sidelease_status, FfiError};

/// Run an exported function's body: its error becomes the thread's last
/// error and a status; a panic becomes `SIDELEASE_ERR_PANIC`.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), FfiError>) -> sidelease_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => sidelease_status::SIDELEASE_OK,
        Ok(Err(e)) => record_failure(e),
        Err(_) => record_failure(FfiError::Panic),
    }
}

/// A NULL check that names the argument.
pub(crate) fn non_null<'a, T>(p: *const T, name: &'static str) -> Result<&'a T, FfiError> {
    // SAFETY: the caller promises a valid pointer or NULL, as documented.
    unsafe { p.as_ref() }.ok_or(FfiError::Null(name))
}

pub(crate) fn non_null_mut<'a, T>(p: *mut T, name: &'static str) -> Result<&'a mut T, FfiError> {
    // SAFETY: as above.
    unsafe { p.as_mut() }.ok_or(FfiError::Null(name))
}

/// Write an out-parameter (checked non-NULL by the caller beforehand).
pub(crate) fn put<T>(out: *mut T, value: T) {
    // SAFETY: `out` was checked non-NULL and points to caller storage.
    unsafe { out.write(value) }
}
