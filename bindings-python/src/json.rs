//! Records and inspections cross into Python as plain dicts, through JSON
//! text and the standard `json` module (not a hot path).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

fn json_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static JSON: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    JSON.get_or_try_init(py, || py.import("json").map(Bound::unbind))
        .map(|m| m.bind(py))
}

pub fn loads<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    json_module(py)?.call_method1("loads", (text,))
}

/// Caller metadata: a dict of JSON values, checked and serialized by
/// `sidelease._metadata.dumps` (which names what is not JSON).
pub fn metadata_text(py: Python<'_>, metadata: &Bound<'_, PyAny>) -> PyResult<String> {
    if !metadata.is_instance_of::<PyDict>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "metadata must be a dict, not {}",
            metadata.get_type().name()?
        )));
    }
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let dumps = DUMPS.get_or_try_init(py, || {
        py.import("sidelease._metadata")?
            .getattr("dumps")
            .map(Bound::unbind)
    })?;
    dumps.bind(py).call1((metadata,))?.extract()
}
