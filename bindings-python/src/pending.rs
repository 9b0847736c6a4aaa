//! `Pending`: one acquisition in progress, driven by asyncio in
//! `sidelease.acquire_async` (no thread per wait: the event loop watches the
//! inotify descriptor).

use std::sync::Mutex;

use pyo3::prelude::*;
use sidelease::Pending as CorePending;

use crate::args::{Seconds, Target};
use crate::error::IntoPyResult;
use crate::lease::{options, Lease};

#[pyclass(module = "sidelease._native", frozen)]
pub struct Pending {
    inner: Mutex<Option<CorePending>>,
    /// The holder told last (`tell_waiting`).
    told: Mutex<Option<sidelease::Contention>>,
}

impl Pending {
    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut CorePending) -> PyResult<T>,
    ) -> PyResult<T> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(p) => f(p),
            None => Err(crate::error::invalid(
                py,
                "invalid argument `pending`: this acquisition was closed",
            )),
        }
    }
}

#[pymethods]
impl Pending {
    #[new]
    #[pyo3(signature = (target, *, timeout=Seconds::ONE_ATTEMPT, suffix=".backend-lease", metadata=None, allow_unsupported_fs=false, split_guard=true, watch=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: Target,
        timeout: Seconds,
        suffix: &str,
        metadata: Option<&Bound<'_, PyAny>>,
        allow_unsupported_fs: bool,
        split_guard: bool,
        watch: bool,
    ) -> PyResult<Self> {
        let opts = options(
            py,
            timeout.0,
            suffix,
            metadata,
            allow_unsupported_fs,
            split_guard,
            watch,
        )?;
        let p = CorePending::new(&target.0, &opts).py(py)?;
        Ok(Pending {
            inner: Mutex::new(Some(p)),
            told: Mutex::new(None),
        })
    }

    /// After an attempt that failed: tell `on_waiting` and the logger of a
    /// holder not told before (nothing when nobody listens).
    #[pyo3(signature = (on_waiting=None))]
    fn tell_waiting(&self, py: Python<'_>, on_waiting: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let on_waiting = crate::progress::callback(on_waiting)?;
        self.with(py, |p| {
            let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
            crate::progress::tell(py, p, &mut told, on_waiting.as_ref())
        })
    }

    /// One non-blocking attempt: a Lease, or None while someone else holds
    /// it. The GIL is released meanwhile (a first look at `/proc/locks`
    /// can take milliseconds).
    fn try_acquire(&self, py: Python<'_>) -> PyResult<Option<Lease>> {
        self.with(py, |p| match py.detach(|| p.try_acquire()).py(py)? {
            Some(lease) => {
                crate::progress::tell_lease(py, "acquired", &lease)?;
                Ok(Some(Lease::new(lease)))
            }
            None => Ok(None),
        })
    }

    /// The descriptor that turns readable when the lease file changed, or
    /// None (then poll at next_check()).
    fn wait_fd(&self, py: Python<'_>) -> PyResult<Option<i32>> {
        use std::os::fd::AsRawFd;
        self.with(py, |p| Ok(p.wait_fd().map(|fd| fd.as_raw_fd())))
    }

    /// Seconds until the next attempt should be made without an event.
    fn next_check(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, |p| Ok(p.next_check().as_secs_f64()))
    }

    /// Seconds left before the timeout (None: no timeout; 0 for one attempt).
    fn remaining(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        self.with(py, |p| {
            Ok(p.deadline().map(|d| {
                d.saturating_duration_since(std::time::Instant::now())
                    .as_secs_f64()
            }))
        })
    }

    /// Note that wait_fd() turned readable.
    fn woke(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |p| {
            p.woke();
            Ok(())
        })
    }

    /// The LeaseInUse (or LeaseTimeout) exception for the current holder.
    fn error(&self, py: Python<'_>, timed_out: bool) -> PyResult<PyErr> {
        self.with(py, |p| {
            Ok(crate::error::to_py(py, p.contention_error(timed_out)))
        })
    }

    /// Give up: close the descriptors this acquisition opened. Idempotent.
    fn close(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.take();
    }
}
