//! sidelease_lease: acquire, release, check and the handle's fields.

use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;

use sidelease_core::{Check, Lease, Options, Pending};

use crate::cancel::sidelease_cancel;
use crate::error::{sidelease_status, FfiError};
use crate::guard::{guard, non_null, non_null_mut, put};
use crate::options::sidelease_options;
use crate::strings::{give, path_arg};

/// A handle on a lease. Several handles of one process may share one lease;
/// the lease ends with the last release.
pub struct sidelease_lease {
    pub(crate) inner: Lease,
}

/// Does the lease path still name the locked file?
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sidelease_check {
    /// The path names the locked inode.
    SIDELEASE_CHECK_HELD = 0,
    /// The locked file was unlinked and nothing replaced it.
    SIDELEASE_CHECK_UNLINKED = 1,
    /// The path now names another file.
    SIDELEASE_CHECK_REPLACED = 2,
}

/// Acquire the lease of `target` (a path; it need not exist, its directory
/// must; or a PostgreSQL lease, `postgresql://user@host/db?lease=NAME`). `opts` may be NULL for the defaults (one attempt). `cancel` may be
/// NULL; otherwise sidelease_cancel_cancel() from another thread ends a wait.
/// On success `*out` receives a handle to release with
/// sidelease_lease_release() and free with sidelease_lease_free().
///
/// Returns SIDELEASE_OK; SIDELEASE_ERR_IN_USE or SIDELEASE_ERR_TIMEOUT (the
/// holder's record and PIDs are then readable with
/// sidelease_last_holder_json() and sidelease_last_holder_pids());
/// SIDELEASE_ERR_UNSUPPORTED_FS; SIDELEASE_ERR_INVALID_ARGUMENT;
/// SIDELEASE_ERR_IO (see sidelease_last_errno()); SIDELEASE_ERR_CANCELLED;
/// SIDELEASE_ERR_NULL_ARGUMENT (`target` or `out` NULL).
#[no_mangle]
pub unsafe extern "C" fn sidelease_acquire(
    target: *const c_char,
    opts: *const sidelease_options,
    cancel: *const sidelease_cancel,
    out: *mut *mut sidelease_lease,
) -> sidelease_status {
    guard(|| {
        let target = path_arg(target, "target")?;
        non_null_mut(out, "out")?;
        let defaults;
        // SAFETY: NULL or a live options object, as documented.
        let opts = match unsafe { opts.as_ref() } {
            Some(o) => &o.inner,
            None => {
                defaults = Options::new().runtime("c");
                &defaults
            }
        };
        // SAFETY: NULL or a live cancel token.
        let token = unsafe { cancel.as_ref() }.map(|c| &c.token);
        let lease = Pending::new(target, opts)?.wait(token)?;
        put(
            out,
            Box::into_raw(Box::new(sidelease_lease { inner: lease })),
        );
        Ok(())
    })
}

/// Release this handle's share of the lease. The last release of a lease
/// records the release in the lease file and drops the lock; the file stays.
/// A second release of the same handle is a no-op. In a forked child the
/// handle holds nothing and this is a no-op. The handle stays valid (its
/// fields readable) until sidelease_lease_free().
///
/// A lease file is always let go: when the release cannot be written into
/// it (immutable, a full disk) the lock is dropped all the same and the
/// record keeps no released_at, so the next holder runs its crash recovery.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT, or SIDELEASE_ERR_IO
/// when a PostgreSQL lease's release could not be recorded on the server.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_release(
    lease: *const sidelease_lease,
) -> sidelease_status {
    guard(|| Ok(non_null(lease, "lease")?.inner.release()?))
}

/// Free a handle, releasing it first if it was not released. NULL is a
/// no-op.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_free(lease: *mut sidelease_lease) {
    if !lease.is_null() {
        // Dropping releases; a panic here must not cross the boundary.
        let _ = std::panic::catch_unwind(|| {
            // SAFETY: created by sidelease_acquire.
            drop(unsafe { Box::from_raw(lease) })
        });
    }
}

/// Does the lease path still name the locked inode? `*out` receives
/// SIDELEASE_CHECK_HELD, _UNLINKED or _REPLACED.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT,
/// SIDELEASE_ERR_INVALID_ARGUMENT (the handle was released, or belongs to
/// the parent of this forked process) or SIDELEASE_ERR_IO.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_check(
    lease: *const sidelease_lease,
    out: *mut sidelease_check,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        non_null_mut(out, "out")?;
        put(
            out,
            match l.check()? {
                Check::Held => sidelease_check::SIDELEASE_CHECK_HELD,
                Check::Unlinked => sidelease_check::SIDELEASE_CHECK_UNLINKED,
                Check::Replaced => sidelease_check::SIDELEASE_CHECK_REPLACED,
            },
        );
        Ok(())
    })
}

fn string_field(
    lease: *const sidelease_lease,
    out: *mut *mut c_char,
    f: impl FnOnce(&Lease) -> Vec<u8>,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        non_null_mut(out, "out")?;
        put(out, give(f(l)));
        Ok(())
    })
}

/// The lease file's path. `*out` is freed with sidelease_string_free().
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_path(
    lease: *const sidelease_lease,
    out: *mut *mut c_char,
) -> sidelease_status {
    string_field(lease, out, |l| {
        l.lease_path().as_os_str().as_bytes().to_vec()
    })
}

/// The holder record this acquisition wrote, as JSON. `*out` is freed with
/// sidelease_string_free().
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_record_json(
    lease: *const sidelease_lease,
    out: *mut *mut c_char,
) -> sidelease_status {
    string_field(lease, out, |l| l.record_json().as_bytes().to_vec())
}

/// The record the previous holder left, as JSON, as it wrote it ("null"
/// when the file was new or the record unreadable). `*out` is freed with
/// sidelease_string_free().
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_previous_json(
    lease: *const sidelease_lease,
    out: *mut *mut c_char,
) -> sidelease_status {
    string_field(lease, out, |l| {
        l.previous_json()
            .map(|j| j.into_owned())
            .unwrap_or_else(|| "null".into())
            .into_bytes()
    })
}

fn value_field<T>(
    lease: *const sidelease_lease,
    out: *mut T,
    f: impl FnOnce(&Lease) -> T,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        non_null_mut(out, "out")?;
        put(out, f(l));
        Ok(())
    })
}

/// Whether the previous holder released cleanly: true only when its record
/// says so; false when it died holding the lease, or left an unreadable
/// record. Run crash recovery unless the answer is SIDELEASE_OK and true.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT, or
/// SIDELEASE_ERR_UNKNOWN (`*out` untouched) when no record tells: the lease
/// file is empty (a first lease, or a file someone deleted or emptied), or
/// could only be opened read-only (such a lease writes no record).
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_previous_released_cleanly(
    lease: *const sidelease_lease,
    out: *mut bool,
) -> sidelease_status {
    known_field(lease, out, Lease::previous_released_cleanly)
}

/// The fencing token: one more than the previous holder's generation; for
/// a lease file with no record (a first lease, or one someone deleted or
/// emptied), microseconds since 1970, above every one handed out before.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT, or
/// SIDELEASE_ERR_UNKNOWN (`*out` untouched) when the lease file could only
/// be opened read-only: such a lease writes no record, so it has no
/// generation.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_generation(
    lease: *const sidelease_lease,
    out: *mut u64,
) -> sidelease_status {
    known_field(lease, out, Lease::generation)
}

fn known_field<T>(
    lease: *const sidelease_lease,
    out: *mut T,
    f: impl FnOnce(&Lease) -> Option<T>,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        non_null_mut(out, "out")?;
        match f(l) {
            Some(v) => {
                put(out, v);
                Ok(())
            }
            None => Err(FfiError::Unknown(format!(
                "{} could only be opened read-only: no record was written, so this is not known",
                l.lease_path().display()
            ))),
        }
    })
}

/// Whether the holder record was written (false when the lease file could
/// only be opened read-only; the lock holds all the same).
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_record_written(
    lease: *const sidelease_lease,
    out: *mut bool,
) -> sidelease_status {
    value_field(lease, out, Lease::record_written)
}
