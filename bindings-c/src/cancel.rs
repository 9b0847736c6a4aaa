//! sidelease_cancel: ends a waiting sidelease_acquire() from another thread.

use sidelease_core::CancelToken;

use crate::error::{sidelease_status, FfiError};
use crate::guard::{guard, non_null, non_null_mut, put};

/// A cancel token. Cancelling is permanent: a cancelled token cancels every
/// wait it is given afterwards, so make one per wait you may cancel.
pub struct sidelease_cancel {
    pub(crate) token: CancelToken,
}

/// Create a cancel token; free it with sidelease_cancel_free() once no
/// acquire uses it.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT or SIDELEASE_ERR_IO
/// (no descriptor could be made).
#[no_mangle]
pub unsafe extern "C" fn sidelease_cancel_new(out: *mut *mut sidelease_cancel) -> sidelease_status {
    guard(|| {
        non_null_mut(out, "out")?;
        let token = CancelToken::new().map_err(|e| {
            FfiError::Core(sidelease_core::Error::Io {
                syscall: sidelease_core::platform::wakefd::WakeFd::CALL,
                path: "(cancel token)".into(),
                source: e,
            })
        })?;
        put(out, Box::into_raw(Box::new(sidelease_cancel { token })));
        Ok(())
    })
}

/// Cancel: a sidelease_acquire() waiting with this token returns
/// SIDELEASE_ERR_CANCELLED promptly, holding nothing. Safe to call from any
/// thread, any number of times.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_cancel_cancel(
    cancel: *const sidelease_cancel,
) -> sidelease_status {
    guard(|| {
        non_null(cancel, "cancel")?.token.cancel();
        Ok(())
    })
}

/// Free a cancel token. NULL is a no-op. Not while an acquire uses it.
#[no_mangle]
pub unsafe extern "C" fn sidelease_cancel_free(cancel: *mut sidelease_cancel) {
    if !cancel.is_null() {
        // SAFETY: created by sidelease_cancel_new.
        drop(unsafe { Box::from_raw(cancel) });
    }
}
