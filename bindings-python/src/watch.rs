//! The holder's watcher thread around `os.fork()`: CPython 3.12+ warns when
//! a process with more than one thread forks, and counts native threads too,
//! so the package stops the watcher in a `before` fork hook and starts it
//! again afterwards (see `sidelease/__init__.py`).

use std::ffi::{c_int, c_void};

use pyo3::prelude::*;

/// Stop the watcher thread (a `before` fork hook). The GIL is released
/// while joining it.
#[pyfunction]
pub fn _watch_pause(py: Python<'_>) {
    py.detach(sidelease::watch::pause);
}

/// Start the watcher thread again if a lease is held.
#[pyfunction]
pub fn _watch_resume() {
    sidelease::watch::resume();
}

extern "C" fn resume_pending(_: *mut c_void) -> c_int {
    sidelease::watch::resume();
    0
}

/// Start the watcher again as soon as the interpreter runs Python code in
/// its main thread, that is after `os.fork()` has returned. CPython 3.13.0
/// counts threads after the `after_in_parent` hooks, so a thread started in
/// one of them would be counted.
#[pyfunction]
pub fn _watch_resume_soon() {
    // SAFETY: called with the GIL held (a pyfunction); the callback takes no
    // argument and touches no Python object.
    let added = unsafe { pyo3::ffi::Py_AddPendingCall(Some(resume_pending), std::ptr::null_mut()) };
    if added != 0 {
        sidelease::watch::resume();
    }
}

/// Whether the watcher thread runs now (for tests).
#[pyfunction]
pub fn _watch_running() -> bool {
    sidelease::watch::is_running()
}
