//! Who a wait waits for, told to Python: the info dict an elector's
//! "waiting" event and `acquire(on_waiting=…)` share, and the `sidelease`
//! logger's INFO line (`sidelease._elect._tell_waiting`), and a plain
//! lease's acquisition and release at INFO (`_tell_lease`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use sidelease::{Contention, Pending};

/// holder (the record, or None), holders (PIDs) and message.
pub fn waiting_info<'py>(py: Python<'py>, c: &Contention) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let holder = match &c.holder {
        Some(r) => crate::json::loads(py, &r.to_json())?.unbind(),
        None => py.None(),
    };
    d.set_item("holder", holder)?;
    d.set_item("holders", PyList::new(py, &c.holders)?)?;
    d.set_item("message", c.to_string())?;
    Ok(d)
}

fn helper<'py>(py: Python<'py>, name: &'static str) -> PyResult<Bound<'py, PyAny>> {
    py.import("sidelease._elect")?.getattr(name)
}

/// Whether anyone listens: a callback, or the logger at INFO. Asked after
/// an attempt that failed, never on an uncontended acquisition.
pub fn wanted(py: Python<'_>, on_waiting: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    static ENABLED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if on_waiting.is_some() {
        return Ok(true);
    }
    let f = ENABLED.get_or_try_init(py, || helper(py, "_info_logged").map(Bound::unbind))?;
    f.bind(py).call0()?.is_truthy()
}

/// After an attempt that failed: tell a holder not told before.
pub fn tell(
    py: Python<'_>,
    p: &Pending,
    told: &mut Option<Contention>,
    on_waiting: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    if !p.waits() || !wanted(py, on_waiting)? {
        return Ok(());
    }
    let Some(c) = p.holder_changed(told) else {
        return Ok(());
    };
    let info = waiting_info(py, c)?;
    let target = p.target().to_string_lossy().into_owned();
    helper(py, "_tell_waiting")?.call1((target, info, on_waiting))?;
    Ok(())
}

/// `on_waiting`: None, or a callable (a TypeError naming it otherwise).
pub fn callback(f: Option<Bound<'_, PyAny>>) -> PyResult<Option<Bound<'_, PyAny>>> {
    match f {
        Some(f) if f.is_none() => Ok(None),
        Some(f) if !f.is_callable() => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "on_waiting: must be callable or None, not {}",
            f.get_type().name()?
        ))),
        f => Ok(f),
    }
}

/// "acquired" or "released", on the `sidelease` logger at INFO when it is
/// enabled (one call to ask, otherwise).
pub fn tell_lease(py: Python<'_>, kind: &'static str, lease: &sidelease::Lease) -> PyResult<()> {
    if !wanted(py, None)? {
        return Ok(());
    }
    let target = sidelease_shown(lease);
    helper(py, "_tell_lease")?.call1((kind, target, lease.generation()))?;
    Ok(())
}

fn sidelease_shown(lease: &sidelease::Lease) -> String {
    // A PostgreSQL lease's path is its URL with the password masked.
    match lease.is_postgres() {
        true => lease.lease_path().to_string_lossy().into_owned(),
        false => lease.target().to_string_lossy().into_owned(),
    }
}
