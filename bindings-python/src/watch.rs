//! The holder's watcher thread around `os.fork()`: CPython 3.12+ warns when
//! a process with more than one thread forks, and counts native threads too,
//! so the package stops the watcher in a `before` fork hook and starts it
//! again afterwards (see `sidelease/__init__.py`).

use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// The frame that called `os.fork()` (recorded by the `before` hook), and
/// until when to wait for it to be running again.
struct ForkCaller {
    frame: usize,
    _keep: Py<PyAny>,
    until: Instant,
}

static FORK_CALLER: Mutex<Option<ForkCaller>> = Mutex::new(None);

extern "C" fn resume_pending(_: *mut c_void) -> c_int {
    let mut caller = FORK_CALLER.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: pending calls run in the main thread with the GIL held.
    let top = unsafe { pyo3::ffi::PyEval_GetFrame() } as usize;
    let back = match caller.as_ref() {
        Some(c) => top == c.frame || Instant::now() >= c.until,
        None => true,
    };
    if back {
        // Dropping the frame's reference needs the GIL, which is held.
        caller.take();
        drop(caller);
        sidelease::watch::resume();
        return 0;
    }
    drop(caller);
    // Still inside os.fork() (an at-fork hook's frame is on top): CPython
    // 3.13 counts threads only after its hooks, so look again later.
    // SAFETY: called with the GIL held; the callback takes no argument.
    if unsafe { pyo3::ffi::Py_AddPendingCall(Some(resume_pending), std::ptr::null_mut()) } != 0 {
        sidelease::watch::resume();
    }
    0
}

/// Start the watcher again once `os.fork()` has returned to `caller` (the
/// frame that called it, or None). CPython 3.13.0 counts threads after the
/// `after_in_parent` hooks, so a thread started in one of them, or in a
/// pending call that runs while they do, would be counted.
#[pyfunction]
#[pyo3(signature = (caller=None))]
pub fn _watch_resume_soon(caller: Option<Bound<'_, PyAny>>) {
    *FORK_CALLER.lock().unwrap_or_else(|e| e.into_inner()) = caller.map(|f| ForkCaller {
        frame: f.as_ptr() as usize,
        _keep: f.unbind(),
        until: Instant::now() + Duration::from_secs(2),
    });
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
