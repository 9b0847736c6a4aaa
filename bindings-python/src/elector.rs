//! `Elector` and `Term`: the core's elector for `sidelease.Elector`,
//! `sidelease.leadership` and `sidelease.lead` (python/sidelease/_elect.py).
//!
//! Events reach the Python listener on the thread they happen on, the GIL
//! taken again there: the campaigning thread (waiting, elected, error,
//! stopped) or the one stepping down. A loss happens on the lease's watcher
//! thread, which never takes the GIL (it is paused around `os.fork()` while
//! the forking thread holds it); Python tells "lost" when the term's
//! cancellation wakes it.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use sidelease::elector::{Elector as CoreElector, Ended, Event, Outcome, Term as CoreTerm};

use crate::args::Target;
use crate::error::IntoPyResult;
use crate::lease::{options, Lease};

/// The slice a native wait sleeps before looking for Ctrl-C.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

fn event_info<'py>(py: Python<'py>, e: &Event) -> PyResult<(&'static str, Bound<'py, PyDict>)> {
    let d = PyDict::new(py);
    let kind = match e {
        Event::Waiting(c) => return Ok(("waiting", crate::progress::waiting_info(py, c)?)),
        Event::Elected { generation } => {
            d.set_item("generation", *generation)?;
            "elected"
        }
        Event::Lost { reason } => {
            d.set_item("reason", *reason)?;
            "lost"
        }
        Event::SteppedDown { why } => {
            d.set_item("why", why.kind())?;
            d.set_item("detail", why.detail())?;
            "stepped_down"
        }
        Event::Error { error, retry_in } => {
            d.set_item("message", error.to_string())?;
            d.set_item("retry_in", retry_in.as_secs_f64())?;
            "error"
        }
        Event::Stopped => "stopped",
    };
    Ok((kind, d))
}

#[pyclass(module = "sidelease._native", frozen)]
pub struct Elector {
    inner: Arc<CoreElector>,
}

#[pymethods]
impl Elector {
    #[new]
    #[pyo3(signature = (target, *, on_event=None, suffix=".backend-lease", metadata=None, allow_unsupported_fs=false, split_guard=true, watch=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: Target,
        on_event: Option<Py<PyAny>>,
        suffix: &str,
        metadata: Option<&Bound<'_, PyAny>>,
        allow_unsupported_fs: bool,
        split_guard: bool,
        watch: bool,
    ) -> PyResult<Self> {
        let opts = options(
            py,
            None,
            suffix,
            metadata,
            allow_unsupported_fs,
            split_guard,
            watch,
        )?;
        let inner = CoreElector::new(&target.0, &opts).py(py)?;
        if let Some(listener) = on_event {
            inner.on_event(move |e| {
                if matches!(e, Event::Lost { .. }) {
                    return;
                }
                // On any thread, and from a finalizer in the middle of a
                // `raise` (the elector or term freed as a frame unwinds).
                crate::reentry::calling_python(|py| {
                    let called = event_info(py, e)
                        .and_then(|(kind, info)| listener.call1(py, (kind, info)).map(drop));
                    if let Err(err) = called {
                        err.write_unraisable(py, Some(listener.bind(py)));
                    }
                });
            });
        }
        Ok(Elector {
            inner: Arc::new(inner),
        })
    }

    /// Wait until elected (a Term) or stopped (None), the GIL released;
    /// errors it can retry are told as "error" events and retried after
    /// the back-off. Ctrl-C stops the elector and raises KeyboardInterrupt.
    fn campaign(&self, py: Python<'_>) -> PyResult<Option<Term>> {
        // The campaign runs on a thread of its own so that this one can
        // look for signals (only the main thread gets them, between
        // sleeps); the GIL is released meanwhile.
        let (tx, rx) = std::sync::mpsc::channel();
        let e = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("sidelease-campaign".into())
            .spawn(move || {
                let _ = tx.send(e.campaign());
            });
        if spawned.is_err() {
            // No thread to be had: campaign here, without Ctrl-C.
            let e = self.inner.clone();
            let won = py.detach(move || e.campaign()).py(py)?;
            return won.map(|t| Term::new(py, t)).transpose();
        }
        use std::sync::mpsc::RecvTimeoutError;
        let rx = Mutex::new(rx); // for `detach`, which wants Sync
        let recv = |t: Option<Duration>| {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            match t {
                Some(t) => rx.recv_timeout(t),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            }
        };
        loop {
            match py.detach(|| recv(Some(SIGNAL_CHECK))) {
                Ok(won) => return won.py(py)?.map(|t| Term::new(py, t)).transpose(),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(crate::error::invalid(
                        py,
                        "invalid argument `elector`: the campaign's thread panicked",
                    ))
                }
            }
            if let Err(err) = py.check_signals() {
                self.inner.stop();
                // Elected in that moment: step down at once.
                drop(py.detach(|| recv(None)));
                return Err(err);
            }
        }
    }

    /// Stop: a campaign returns None, the current term's cancellation fires,
    /// and no campaign starts again.
    fn stop(&self) {
        self.inner.stop();
    }

    #[getter]
    fn stopped(&self) -> bool {
        self.inner.is_stopped()
    }

    /// The target, a PostgreSQL URL's password masked.
    #[getter]
    fn target(&self) -> String {
        self.inner.target()
    }

    /// {"leading", "generation", "leader_since" (Unix seconds or None),
    /// "elections", "losses", "failures"}
    #[getter]
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.snapshot();
        let d = PyDict::new(py);
        d.set_item("leading", s.leading)?;
        d.set_item("generation", s.generation)?;
        let since = s
            .leader_since
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64());
        d.set_item("leader_since", since)?;
        d.set_item("elections", s.elections)?;
        d.set_item("losses", s.losses)?;
        d.set_item("failures", s.failures)?;
        Ok(d)
    }
}

/// One term of leadership: the work must end once `cancelled` is True;
/// `step_down()` ends the term.
#[pyclass(module = "sidelease._native", frozen)]
pub struct Term {
    inner: Mutex<Option<CoreTerm>>,
    lease: Py<Lease>,
    /// The cancellation's descriptor, valid while the term is not ended.
    fd: i32,
    ended: Mutex<Option<(&'static str, String)>>,
}

impl Drop for Term {
    // A term collected without step_down steps down as if the work had
    // returned; the Python handle goes first, so the core's is the last.
    fn drop(&mut self) {
        let _ = self.lease.get().core().release();
    }
}

impl Term {
    fn new(py: Python<'_>, t: CoreTerm) -> PyResult<Term> {
        let handle = t.lease().try_clone().py(py)?;
        let fd = t.cancel_fd().as_raw_fd();
        Ok(Term {
            lease: Py::new(py, Lease::new(handle))?,
            inner: Mutex::new(Some(t)),
            fd,
            ended: Mutex::new(None),
        })
    }

    fn with<T>(&self, f: impl FnOnce(Option<&CoreTerm>) -> T) -> T {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(g.as_ref())
    }
}

fn ended(e: Option<Ended>) -> Option<(&'static str, String)> {
    e.map(|e| (e.kind(), e.detail().to_owned()))
}

#[pymethods]
impl Term {
    #[getter]
    fn lease(&self, py: Python<'_>) -> Py<Lease> {
        self.lease.clone_ref(py)
    }

    #[getter]
    fn generation(&self) -> Option<u64> {
        self.lease.get().core().generation()
    }

    /// Why the work must end: ("lost", reason) or ("stopped", ""); None
    /// while it may go on. After step_down, why the term ended.
    #[getter]
    fn cancelled(&self) -> Option<(&'static str, String)> {
        self.with(|t| t.map(|t| ended(t.cancelled())))
            .unwrap_or_else(|| self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Block until the work must end (True) or `timeout` seconds pass
    /// (False), the GIL released; Ctrl-C raises KeyboardInterrupt.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = match timeout {
            Some(t) if !(t.is_finite() && t >= 0.0) => {
                return Err(crate::error::invalid(
                    py,
                    &format!("invalid argument `timeout`: {t} is not a number of seconds >= 0"),
                ))
            }
            // A timeout past what the clock can hold waits for ever.
            Some(t) => Duration::try_from_secs_f64(t)
                .ok()
                .and_then(|d| std::time::Instant::now().checked_add(d)),
            None => None,
        };
        loop {
            let slice = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    left.min(SIGNAL_CHECK)
                }
                None => SIGNAL_CHECK,
            };
            let done = py.detach(|| {
                self.with(|t| match t {
                    Some(t) => t.wait_cancelled(Some(slice)).is_some(),
                    None => true,
                })
            });
            if done {
                return Ok(true);
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// Readable once the work must end (for the event loop).
    fn _cancel_fd(&self) -> i32 {
        self.fd
    }

    /// End the term: release the lease (the next campaigner is woken at
    /// once) and return why it ended: ("lost", reason), ("stopped", ""),
    /// ("released", "") or ("error", error). `error` is the work's failure,
    /// None when it returned. A second call returns the first's answer.
    #[pyo3(signature = (error=None))]
    fn step_down(&self, py: Python<'_>, error: Option<String>) -> (&'static str, String) {
        let term = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(term) = term else {
            return self
                .ended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or(("released", String::new()));
        };
        let _ = self.lease.get().core().release();
        let outcome = match error {
            Some(m) => Outcome::Failed(m),
            None => Outcome::Returned,
        };
        let why = py.detach(|| term.step_down(outcome));
        let answer = (why.kind(), why.detail().to_owned());
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer.clone());
        answer
    }
}
