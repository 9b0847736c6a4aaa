//! The one place where the core's error becomes a Python exception. The
//! classes live in `sidelease._errors` (so `InvalidArgument` can be both a
//! `LeaseError` and a `ValueError`); this module raises them.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyList;
use sidelease::Error;

fn errors(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || py.import("sidelease._errors").map(Bound::unbind))
        .map(|m| m.bind(py))
}

fn build<'py>(py: Python<'py>, class: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    match errors(py)
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1(args))
    {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

pub fn invalid(py: Python<'_>, message: &str) -> PyErr {
    build(py, "InvalidArgument", (message,))
}

/// Convert a core error into the matching Python exception.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let message = e.to_string();
    match &e {
        Error::InUse(c) | Error::Timeout(c) => {
            let class = if matches!(e, Error::Timeout(_)) {
                "LeaseTimeout"
            } else {
                "LeaseInUse"
            };
            let holder = match &c.holder {
                Some(r) => match crate::json::loads(py, &r.to_json()) {
                    Ok(d) => d.unbind(),
                    Err(err) => return err,
                },
                None => py.None(),
            };
            let holders = match PyList::new(py, &c.holders) {
                Ok(l) => l,
                Err(err) => return err,
            };
            build(
                py,
                class,
                (
                    message,
                    holder,
                    holders,
                    c.lease_path.as_os_str(),
                    c.target.as_os_str(),
                ),
            )
        }
        Error::UnsupportedFilesystem { path, fstype, .. } => build(
            py,
            "UnsupportedFilesystem",
            (message, fstype.clone(), path.as_os_str()),
        ),
        Error::InvalidArgument { .. } => invalid(py, &message),
        Error::Io {
            syscall,
            path,
            source,
        } => build(
            py,
            "_os_error",
            // Python prints "[Errno N] <strerror>: '<filename>'": the path
            // once, the system's words, and which call failed.
            (
                source.raw_os_error().unwrap_or(0),
                format!("{} ({syscall})", sidelease::error_text(source)),
                path.as_os_str(),
                *syscall,
            ),
        ),
        Error::Cancelled { lease_path } => {
            build(py, "LeaseCancelled", (message, lease_path.as_os_str()))
        }
        Error::Lost(l) => {
            let holders = match PyList::new(py, &l.holders) {
                Ok(h) => h,
                Err(err) => return err,
            };
            build(
                py,
                "LeaseLost",
                (message, l.reason.clone(), holders, l.lease_path.as_os_str()),
            )
        }
    }
}

/// `.map_err` helper.
pub trait IntoPyResult<T> {
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
