//! `acquire`, `inspect` and the `Lease` handle.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyResourceWarning;
use pyo3::prelude::*;
use pyo3::types::PyType;
use sidelease::{Options, Pending as CorePending, Wait};

use crate::args::{Seconds, Target};
use crate::cancel::CancelToken;
use crate::error::{invalid, IntoPyResult};
use crate::json;

/// How long a native wait sleeps before looking for Ctrl-C (the GIL is
/// released meanwhile; signals are only delivered to Python between sleeps).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

pub fn runtime() -> String {
    static RUNTIME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Python::attach(|py| {
                let v = py.version_info();
                format!("python {}.{}.{}", v.major, v.minor, v.patch)
            })
        })
        .clone()
}

/// The options shared by `acquire` and `acquire_async`.
pub fn options(
    py: Python<'_>,
    timeout: Option<f64>,
    suffix: &str,
    metadata: Option<&Bound<'_, PyAny>>,
    allow_unsupported_fs: bool,
    split_guard: bool,
    watch: bool,
) -> PyResult<Options> {
    let wait = match timeout {
        None => Wait::Forever,
        Some(t) => Wait::from_secs_f64(t).py(py)?,
    };
    let mut o = Options::new()
        .wait(wait)
        .suffix(suffix)
        .allow_unsupported_fs(allow_unsupported_fs)
        .split_guard(split_guard)
        .watch(watch)
        .runtime(runtime());
    if let Some(m) = metadata.filter(|m| !m.is_none()) {
        let text = json::metadata_text(py, m)?;
        o.metadata = Some(sidelease::record::parse_metadata(&text).py(py)?);
    }
    Ok(o) // validated by Pending::new
}

/// Acquire the lease of `target`. `timeout` in seconds: 0 is one attempt,
/// None waits forever. The GIL is released while trying (a first look at
/// `/proc/locks` can take milliseconds) and while waiting; Ctrl-C ends a
/// wait with KeyboardInterrupt, and `cancel` (a CancelToken) from another
/// thread with LeaseCancelled. `on_waiting(info)` hears who holds the lease
/// once a wait starts and whenever that changes (as the `sidelease` logger
/// does at INFO); an exception it raises ends the wait.
#[pyfunction]
// The suffix is a literal, not sidelease::DEFAULT_SUFFIX: pyo3 writes a
// literal default into the text signature, where stubtest compares it with
// _native.pyi's (test_api.py checks the value); a constant shows as `...`.
#[pyo3(signature = (target, *, timeout=Seconds::ONE_ATTEMPT, suffix=".backend-lease", metadata=None, allow_unsupported_fs=false, split_guard=true, watch=true, cancel=None, on_waiting=None))]
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    py: Python<'_>,
    target: Target,
    timeout: Seconds,
    suffix: &str,
    metadata: Option<&Bound<'_, PyAny>>,
    allow_unsupported_fs: bool,
    split_guard: bool,
    watch: bool,
    cancel: Option<PyRef<'_, CancelToken>>,
    on_waiting: Option<Bound<'_, PyAny>>,
) -> PyResult<Lease> {
    let on_waiting = crate::progress::callback(on_waiting)?;
    let opts = options(
        py,
        timeout.0,
        suffix,
        metadata,
        allow_unsupported_fs,
        split_guard,
        watch,
    )?;
    let mut p = CorePending::new(&target.0, &opts).py(py)?;
    let deadline = p.deadline();
    let token = cancel.map(|c| c.inner.clone());
    let mut told = None;
    loop {
        if token.as_ref().is_some_and(|t| t.is_cancelled()) {
            return Err(sidelease::Error::Cancelled {
                lease_path: p.lease_path().to_path_buf(),
            })
            .py(py);
        }
        if let Some(lease) = py.detach(|| p.try_acquire()).py(py)? {
            crate::progress::tell_lease(py, "acquired", &lease)?;
            return Ok(Lease::new(lease));
        }
        crate::progress::tell(py, &p, &mut told, on_waiting.as_ref())?;
        let now = Instant::now();
        let remaining = match deadline {
            Some(d) if now >= d => return Err(p.contention_error(p.waits())).py(py),
            Some(d) => d - now,
            None => Duration::MAX,
        };
        let sleep = p.next_check().min(remaining).min(SIGNAL_CHECK);
        let woke = py
            .detach(|| p.wait_for_change(sleep, token.as_ref()))
            .py(py)?;
        if woke {
            p.woke();
        }
        py.check_signals()?;
    }
}

/// Inspect the lease of `target` without taking or disturbing it.
#[pyfunction]
#[pyo3(signature = (target, *, suffix=".backend-lease"))]
pub fn inspect<'py>(py: Python<'py>, target: Target, suffix: &str) -> PyResult<Bound<'py, PyAny>> {
    let opts = Options::new().suffix(suffix);
    let i = py.detach(|| sidelease::inspect(&target.0, &opts)).py(py)?;
    json::loads(py, &i.to_json())
}

/// A handle on a lease: a context manager (sync and async). `release()`
/// is idempotent; a handle collected without release releases and warns.
#[pyclass(module = "sidelease._native", frozen)]
pub struct Lease {
    inner: sidelease::Lease,
}

impl Lease {
    pub fn new(inner: sidelease::Lease) -> Lease {
        Lease { inner }
    }

    pub fn core(&self) -> &sidelease::Lease {
        &self.inner
    }
}

#[pymethods]
impl Lease {
    /// Release this handle's share (the last release of a lease records it
    /// and drops the lock). A second call does nothing.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let first = !self.inner.is_released();
        self.inner.release().py(py)?;
        if first {
            crate::progress::tell_lease(py, "released", &self.inner)?;
        }
        Ok(())
    }

    /// "held", "unlinked" or "replaced": does the lease path still name the
    /// locked file?
    fn check(&self, py: Python<'_>) -> PyResult<&'static str> {
        if self.inner.is_released() {
            return Err(invalid(
                py,
                "invalid argument `lease`: this lease handle was released",
            ));
        }
        Ok(self.inner.check().py(py)?.as_str())
    }

    #[getter]
    fn lease_path(&self) -> std::ffi::OsString {
        self.inner.lease_path().as_os_str().to_owned()
    }

    #[getter]
    fn target(&self) -> std::ffi::OsString {
        self.inner.target().as_os_str().to_owned()
    }

    #[getter]
    fn record<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json::loads(py, self.inner.record_json())
    }

    #[getter]
    fn previous<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner
            .previous_json()
            .map(|j| json::loads(py, &j))
            .transpose()
    }

    /// True only when the previous record says so; False when the last
    /// holder died holding the lease; None when no record tells (an empty
    /// lease file: a first lease, or one deleted or emptied) or the file
    /// could only be opened read-only. Recover unless it is True.
    #[getter]
    fn previous_released_cleanly(&self) -> Option<bool> {
        self.inner.previous_released_cleanly()
    }

    /// The fencing token, never repeated (a first lease starts at the
    /// clock, microseconds since 1970); None for a read-only lease file.
    #[getter]
    fn generation(&self) -> Option<u64> {
        self.inner.generation()
    }

    /// "held", "lost" or "released".
    #[getter]
    fn state(&self) -> &'static str {
        self.inner.state().as_str()
    }

    /// True once the lease was lost while held (its file replaced or
    /// deleted and another process holding the new one, or it could not be
    /// put back); the same answer after release() as before it.
    #[getter]
    fn lost(&self) -> bool {
        self.inner.lost().is_some()
    }

    /// What happened, when the lease was lost (also after release()).
    #[getter]
    fn lost_reason(&self) -> Option<String> {
        self.inner.lost().map(|l| l.reason)
    }

    /// Raise LeaseLost if the lease was lost (call it before work that must
    /// only happen under the lease). For a lease file it looks at the path
    /// and puts back a file someone deleted or replaced, so it never passes
    /// while check() says otherwise; LeaseOSError when the file cannot be
    /// put back yet (its directory is gone).
    fn ensure_held(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.ensure_held().py(py)
    }

    /// As ensure_held(), and for a PostgreSQL lease ask the server now (one
    /// round trip within the lease's bound, the GIL released) rather than
    /// rely on the last heartbeat. LeaseOSError when the answer did not
    /// come in time (not known yet).
    fn ensure_held_now(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.ensure_held_now()).py(py)
    }

    /// A descriptor that turns readable when the lease is lost or released
    /// (owned by the lease; for `wait_lost`).
    fn _lost_fd(&self, py: Python<'_>) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.inner.lost_fd().py(py)?.as_raw_fd())
    }

    /// Wait (asyncio) until the lease is lost: returns the LeaseLost error,
    /// or None if the lease is released first.
    fn wait_lost<'py>(slf: Bound<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("sidelease._lost")?
            .getattr("wait_lost")?
            .call1((slf,))
    }

    #[getter]
    fn record_written(&self) -> bool {
        self.inner.record_written()
    }

    #[getter]
    fn released(&self) -> bool {
        self.inner.is_released()
    }

    fn __repr__(&self) -> String {
        format!(
            "<sidelease.Lease {:?} generation={} {}>",
            self.inner.target().display().to_string(),
            self.inner
                .generation()
                .map_or_else(|| "None".to_string(), |g| g.to_string()),
            if self.inner.is_released() {
                "released"
            } else {
                "held"
            }
        )
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    /// Never swallows the block's exception (returns None), so a type
    /// checker knows a `return` inside the block is the function's end.
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    fn __aenter__(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Ready>> {
        Py::new(
            py,
            Ready {
                value: Some(slf.into_any()),
            },
        )
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__(
        &self,
        py: Python<'_>,
        _exc: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<Py<Ready>> {
        self.release(py)?;
        Py::new(
            py,
            Ready {
                value: Some(py.None()),
            },
        )
    }

    #[classmethod]
    fn __class_getitem__(cls: &Bound<'_, PyType>, _item: &Bound<'_, PyAny>) -> Py<PyType> {
        cls.clone().unbind()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.inner.is_released() {
            return;
        }
        let inherited = self.inner.is_inherited();
        let _ = self.inner.release();
        // A finalizer: it may run while an exception is being raised.
        crate::reentry::calling_python(|py| {
            let target = self.inner.target().display();
            let msg = if inherited {
                format!(
                    "sidelease.Lease for {target} came from the parent process through fork and \
                     was garbage-collected in the child; the child never held the lease, so \
                     nothing was released (the parent's lease is untouched)"
                )
            } else {
                format!(
                    "sidelease.Lease for {target} was garbage-collected without release(); \
                     released it now"
                )
            };
            let cat = py.get_type::<PyResourceWarning>();
            if let Err(e) = PyErr::warn(
                py,
                &cat,
                &std::ffi::CString::new(msg).unwrap_or_default(),
                1,
            ) {
                e.write_unraisable(py, None);
            }
        });
    }
}

/// An awaitable that is already done (what `__aenter__`/`__aexit__` return,
/// since nothing there needs to wait).
#[pyclass(module = "sidelease._native")]
pub struct Ready {
    value: Option<Py<PyAny>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<()> {
        let v = self.value.take().unwrap_or_else(|| py.None());
        Err(pyo3::exceptions::PyStopIteration::new_err((v,)))
    }
}
