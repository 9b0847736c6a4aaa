//! sidelease_options: acquisition options that can grow without breaking
//! the ABI (an opaque object with setters).

use std::os::raw::c_char;
use std::time::Duration;

use sidelease_core::{Options, Wait};

use crate::error::{sidelease_status, FfiError};
use crate::guard::{guard, non_null_mut, put};
use crate::strings::str_arg;

/// Options of sidelease_acquire(). Defaults: one attempt (timeout 0),
/// suffix ".backend-lease", no metadata, supported filesystems only, split
/// guard on.
pub struct sidelease_options {
    pub(crate) inner: Options,
}

/// Create options with the defaults. `*out` receives an object to free with
/// sidelease_options_free().
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT (`out` NULL).
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_new(
    out: *mut *mut sidelease_options,
) -> sidelease_status {
    guard(|| {
        non_null_mut(out, "out")?;
        let opts = Box::new(sidelease_options {
            inner: Options::new().runtime("c"),
        });
        put(out, Box::into_raw(opts));
        Ok(())
    })
}

/// Free options. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_free(opts: *mut sidelease_options) {
    if !opts.is_null() {
        // SAFETY: created by sidelease_options_new.
        drop(unsafe { Box::from_raw(opts) });
    }
}

fn with(
    opts: *mut sidelease_options,
    f: impl FnOnce(&mut Options) -> Result<(), FfiError>,
) -> sidelease_status {
    guard(|| f(&mut non_null_mut(opts, "opts")?.inner))
}

/// How long sidelease_acquire() may wait, in milliseconds: 0 = one attempt
/// (the default), negative = wait until acquired or cancelled.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_timeout_ms(
    opts: *mut sidelease_options,
    timeout_ms: i64,
) -> sidelease_status {
    with(opts, |o| {
        o.wait = match timeout_ms {
            0 => Wait::NoWait,
            t if t < 0 => Wait::Forever,
            t => Wait::Timeout(Duration::from_millis(t as u64)),
        };
        Ok(())
    })
}

/// The lease file suffix (UTF-8, not empty, no '/'). Copied.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT or
/// SIDELEASE_ERR_INVALID_ARGUMENT (checked here, not at acquire).
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_suffix(
    opts: *mut sidelease_options,
    suffix: *const c_char,
) -> sidelease_status {
    with(opts, |o| {
        let s = str_arg(suffix, "suffix")?;
        let candidate = o.clone().suffix(s);
        candidate.validate()?;
        *o = candidate;
        Ok(())
    })
}

/// Caller metadata for the holder record: a JSON object as UTF-8 text, at
/// most 16 KiB serialized. NULL clears it. Copied.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT (`opts` NULL) or
/// SIDELEASE_ERR_INVALID_ARGUMENT (not UTF-8, not JSON, not an object, too
/// large).
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_metadata_json(
    opts: *mut sidelease_options,
    json: *const c_char,
) -> sidelease_status {
    with(opts, |o| {
        o.metadata = if json.is_null() {
            None
        } else {
            Some(sidelease_core::record::parse_metadata(str_arg(
                json, "metadata",
            )?)?)
        };
        Ok(())
    })
}

/// Accept filesystems where flock is not known to be reliable (NFS, SMB,
/// FUSE, …). Off by default.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_allow_unsupported_fs(
    opts: *mut sidelease_options,
    allow: bool,
) -> sidelease_status {
    with(opts, |o| {
        o.allow_unsupported_fs = allow;
        Ok(())
    })
}

/// The split-domain guard (on by default): refuse the lease while a live
/// process holds a former lease file (deleted, moved away or replaced).
/// Reads /proc/locks unless the previous holder's record vouches for the
/// file.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_split_guard(
    opts: *mut sidelease_options,
    on: bool,
) -> sidelease_status {
    with(opts, |o| {
        o.split_guard = on;
        Ok(())
    })
}

/// The holder's watch (on by default): while held, the lease file is
/// watched, and if someone deletes, moves or replaces it the lease puts it
/// back at once; if another process holds the new file, the lease is lost
/// (see sidelease_lease_state()).
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_watch(
    opts: *mut sidelease_options,
    on: bool,
) -> sidelease_status {
    with(opts, |o| {
        o.watch = on;
        Ok(())
    })
}

/// The runtime named in the holder record (default "c"; for wrappers such
/// as "go 1.23" or "ruby 3.3"). UTF-8, copied.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT or
/// SIDELEASE_ERR_INVALID_ARGUMENT (not UTF-8).
#[no_mangle]
pub unsafe extern "C" fn sidelease_options_set_runtime(
    opts: *mut sidelease_options,
    runtime: *const c_char,
) -> sidelease_status {
    with(opts, |o| {
        o.runtime = Some(str_arg(runtime, "runtime")?.to_owned());
        Ok(())
    })
}
