//! Strings across the boundary.

use std::ffi::{CStr, CString, OsStr};
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{sidelease_status, FfiError};
use crate::guard::non_null;

/// Copy bytes into a caller buffer as a NUL-terminated string, truncating.
pub(crate) fn copy_out(
    bytes: &[u8],
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> sidelease_status {
    if buf.is_null() && len > 0 {
        return sidelease_status::SIDELEASE_ERR_NULL_ARGUMENT;
    }
    if !written.is_null() {
        // SAFETY: non-NULL out-parameter supplied by the caller.
        unsafe { written.write(bytes.len()) };
    }
    if len == 0 {
        return if bytes.is_empty() {
            sidelease_status::SIDELEASE_OK
        } else {
            sidelease_status::SIDELEASE_ERR_BUFFER_TOO_SMALL
        };
    }
    let n = bytes.len().min(len - 1);
    // SAFETY: `buf` holds `len` > n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    if n < bytes.len() {
        sidelease_status::SIDELEASE_ERR_BUFFER_TOO_SMALL
    } else {
        sidelease_status::SIDELEASE_OK
    }
}

/// A path argument: any bytes but NUL (Linux paths need not be UTF-8).
pub(crate) fn path_arg<'a>(p: *const c_char, name: &'static str) -> Result<&'a Path, FfiError> {
    non_null(p, name)?;
    // SAFETY: non-NULL and NUL-terminated, as documented.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Ok(Path::new(OsStr::from_bytes(bytes)))
}

/// A text argument, which must be UTF-8.
pub(crate) fn str_arg<'a>(p: *const c_char, name: &'static str) -> Result<&'a str, FfiError> {
    non_null(p, name)?;
    // SAFETY: non-NULL and NUL-terminated, as documented.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| FfiError::Invalid(name, format!("is not valid UTF-8 ({e})")))
}

/// A string for the caller, freed with sidelease_string_free().
pub(crate) fn give(s: impl Into<Vec<u8>>) -> *mut c_char {
    let mut v: Vec<u8> = s.into();
    // Interior NULs cannot occur in JSON or paths; drop any to be safe.
    v.retain(|&b| b != 0);
    CString::new(v)
        .map(CString::into_raw)
        .unwrap_or(std::ptr::null_mut())
}

/// Free a string this library returned. NULL is a no-op. Never pass these
/// strings to free(), and never pass other strings here.
#[no_mangle]
pub unsafe extern "C" fn sidelease_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from CString::into_raw in `give`.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// The library version ("0.1.0"), a static string: do not free it.
#[no_mangle]
pub extern "C" fn sidelease_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
