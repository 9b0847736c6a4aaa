//! Every loss of a lease of this process, on the `sidelease` logger at
//! WARNING. The watcher thread that finds a loss never takes the GIL: it
//! queues the loss and asks CPython for a pending call, which the main
//! thread runs (with the GIL) the next time it runs Python code.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;

/// Losses not told yet: the process that found it (a forked child has the
/// parent's queue and pending state, and tells none of its losses), the
/// lease path (a URL's password masked) and why.
static QUEUE: Mutex<Vec<(u32, String, String)>> = Mutex::new(Vec::new());
/// The process that asked for a pending call that has not run yet (0: none).
static ASKED: AtomicU32 = AtomicU32::new(0);

/// The core's hook (`sidelease::on_any_lost`): no GIL, no Python.
pub fn hook(l: &sidelease::Lost) {
    let me = std::process::id();
    QUEUE.lock().unwrap_or_else(|e| e.into_inner()).push((
        me,
        l.lease_path.to_string_lossy().into_owned(),
        l.reason.clone(),
    ));
    if ASKED.swap(me, Ordering::AcqRel) != me {
        // SAFETY: Py_AddPendingCall needs no thread state and no GIL; the
        // callback takes no argument.
        if unsafe { pyo3::ffi::Py_AddPendingCall(Some(tell), std::ptr::null_mut()) } != 0 {
            // The interpreter's queue is full: the next loss asks again.
            ASKED.store(0, Ordering::Release);
        }
    }
}

extern "C" fn tell(_: *mut c_void) -> c_int {
    ASKED.store(0, Ordering::Release);
    let me = std::process::id();
    let losses = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|e| e.into_inner()));
    // Pending calls run in the main thread with the GIL held.
    crate::reentry::calling_python(|py| {
        for (_, path, reason) in losses.into_iter().filter(|l| l.0 == me) {
            let told = py
                .import("sidelease._elect")
                .and_then(|m| m.getattr("_tell_lost"))
                .and_then(|f| f.call1((path, reason)));
            if let Err(e) = told {
                // A logging handler that raised: reported, never raised
                // into whatever code the main thread was running.
                e.write_unraisable(py, None);
            }
        }
    });
    0
}
