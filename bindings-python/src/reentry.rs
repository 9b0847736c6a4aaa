//! Native code calling back into Python at a moment it did not choose: a
//! finalizer (`Drop` of a handle, an elector or a term) runs while the
//! object is freed, and CPython frees objects in the middle of unwinding an
//! exception (a frame cleared as a `raise` leaves it). Calling Python code
//! with that exception still set makes CPython report `SystemError` ("a
//! result with an exception set") and lose the user's exception, and the
//! unwinding then goes on with no exception at all: a segmentation fault.
//!
//! CPython's own finalizers save the exception around `__del__`
//! (`PyErr_Fetch`/`PyErr_Restore` in `slot_tp_finalize`); every callback
//! of this binding runs inside [`calling_python`], which does the same.

use pyo3::ffi;
use pyo3::prelude::*;

/// Run `f` with the GIL and no exception set, the pending one (if any)
/// set again afterwards, unchanged: whatever `f` raised is reported by
/// `f` itself (as unraisable) or dropped, never put in its place.
pub fn calling_python<R>(f: impl FnOnce(Python<'_>) -> R) -> R {
    Python::attach(|py| {
        let (mut ty, mut value, mut tb) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: the GIL is held (`attach`); Fetch moves the thread's
        // exception (possibly none) into the three owned references, which
        // Restore then takes back. PyErr_Fetch is in the stable ABI of
        // every version this module supports (3.9+); 3.12's replacement is
        // not in 3.9's.
        #[allow(deprecated)]
        unsafe {
            ffi::PyErr_Fetch(&mut ty, &mut value, &mut tb)
        };
        let r = f(py);
        // SAFETY: as above. An exception `f` left set (it should not) is
        // replaced: the saved one is what was being raised.
        #[allow(deprecated)]
        unsafe {
            if !ty.is_null() {
                ffi::PyErr_Restore(ty, value, tb);
            }
        }
        r
    })
}
