//! The holder's watch, for C: a lease's state, a descriptor for the
//! caller's event loop that turns readable when the lease is lost, and an
//! optional callback.

use std::ffi::{c_void, CString};
use std::os::fd::AsRawFd;
use std::os::raw::{c_char, c_int};

use sidelease_core::LeaseState;

use crate::error::sidelease_status;
use crate::guard::{guard, non_null, non_null_mut, put};
use crate::lease::sidelease_lease;

/// Where a lease stands.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sidelease_state {
    /// Held and whole: the lease path names a file this lease has locked.
    SIDELEASE_STATE_HELD = 0,
    /// Lost while held: the lease file was replaced or deleted and another
    /// process holds the file now at its path, or it could not be put back.
    /// Stop the work the lease protects and release it.
    SIDELEASE_STATE_LOST = 1,
    /// This handle was released (or belongs to the parent of this forked
    /// process).
    SIDELEASE_STATE_RELEASED = 2,
}

/// Called (from the library's watcher thread, never from a signal handler)
/// when a lease is lost. `reason` is valid only during the call.
pub type sidelease_lost_callback =
    Option<unsafe extern "C" fn(reason: *const c_char, user_data: *mut c_void)>;

/// The lease's state. `*out` receives SIDELEASE_STATE_HELD, _LOST or
/// _RELEASED.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_state(
    lease: *const sidelease_lease,
    out: *mut sidelease_state,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        non_null_mut(out, "out")?;
        put(
            out,
            match l.state() {
                LeaseState::Held => sidelease_state::SIDELEASE_STATE_HELD,
                LeaseState::Lost(_) => sidelease_state::SIDELEASE_STATE_LOST,
                LeaseState::Released => sidelease_state::SIDELEASE_STATE_RELEASED,
            },
        );
        Ok(())
    })
}

/// Check, before work that must only happen under the lease, that it is
/// still held and whole: for a lease file, that its path names a file this
/// lease holds right now (one lstat; a file someone deleted or replaced is
/// put back here first), so it never passes while sidelease_lease_check()
/// would say otherwise.
///
/// Returns SIDELEASE_OK; SIDELEASE_ERR_LOST (sidelease_last_error() says
/// what happened and names the other holder); SIDELEASE_ERR_IO (the lease
/// file is not at its path and could not be put back yet, e.g. its
/// directory is gone: the lease is not lost, but do not do the work);
/// SIDELEASE_ERR_INVALID_ARGUMENT (the handle was released, or belongs to
/// the parent of this forked process); SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_ensure_held(
    lease: *const sidelease_lease,
) -> sidelease_status {
    guard(|| Ok(non_null(lease, "lease")?.inner.ensure_held()?))
}

/// As sidelease_lease_ensure_held(), and for a PostgreSQL lease ask the
/// server now (one round trip, within the lease's bound: confirm_within in
/// the URL, 1000 ms by default) rather than rely on the last heartbeat.
///
/// Returns what sidelease_lease_ensure_held() returns; SIDELEASE_ERR_IO
/// also when the server's answer did not come in time and the bound has
/// not passed yet (not known yet: do not do the work).
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_ensure_held_now(
    lease: *const sidelease_lease,
) -> sidelease_status {
    guard(|| Ok(non_null(lease, "lease")?.inner.ensure_held_now()?))
}

/// A descriptor that turns readable (POLLIN) when the lease is lost, or
/// when its last handle is released, for the caller's event loop
/// (sidelease_lease_state() tells which); it stays readable from then on.
/// Owned by the lease: do not read, write or close it; valid until
/// sidelease_lease_free().
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT,
/// SIDELEASE_ERR_INVALID_ARGUMENT (released handle) or SIDELEASE_ERR_IO
/// (no eventfd could be made).
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_lost_fd(
    lease: *const sidelease_lease,
    out: *mut c_int,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        non_null_mut(out, "out")?;
        let fd = l.lost_fd()?.as_raw_fd();
        put(out, fd);
        Ok(())
    })
}

struct UserData(*mut c_void);
// SAFETY: the caller promises (as documented) that `user_data` may be used
// from the watcher thread.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

/// Call `callback(reason, user_data)` when the lease is lost (at once, in
/// this thread, if it already was). It runs on the library's watcher
/// thread: keep it short, never block in it, and make `user_data` safe to
/// use from there. It must not free this lease. Callbacks have run by the
/// time the lost descriptor turns readable, and by the time
/// `sidelease_lease_ensure_held()` or `sidelease_lease_state()` in any
/// other thread report the loss (they wait for them). A callback that is
/// NULL is an error.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT or
/// SIDELEASE_ERR_INVALID_ARGUMENT (released handle).
#[no_mangle]
pub unsafe extern "C" fn sidelease_lease_on_lost(
    lease: *const sidelease_lease,
    callback: sidelease_lost_callback,
    user_data: *mut c_void,
) -> sidelease_status {
    guard(|| {
        let l = &non_null(lease, "lease")?.inner;
        let cb = callback.ok_or(crate::error::FfiError::Null("callback"))?;
        let data = UserData(user_data);
        l.on_lost(move |lost| {
            let reason = CString::new(lost.to_string().replace('\0', " ")).unwrap_or_default();
            let data = &data;
            // A panic or unwind must not cross into C: the callback is C.
            // SAFETY: a C function pointer given by the caller, called with
            // a NUL-terminated string valid for the call.
            unsafe { cb(reason.as_ptr(), data.0) };
        })?;
        Ok(())
    })
}
