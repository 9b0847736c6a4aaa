//! Arguments as Python gives them: targets as `str`, `bytes` or path-like
//! objects (like `os.open`), and timeouts in seconds that must be a real
//! number of seconds, not `True` or an integer too large to mean anything.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes};

use crate::error::invalid;

/// A target path: `os.fsencode` accepts `str` (surrogateescape), `bytes`
/// and `os.PathLike` of either, exactly as the `os` module does.
pub struct Target(pub PathBuf);

impl<'a, 'py> FromPyObject<'a, 'py> for Target {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        // A str, the common case, is encoded natively (surrogateescape, as
        // os.fsencode does) without a call into Python.
        if let Ok(s) = obj.cast::<pyo3::types::PyString>() {
            return Ok(Target(s.extract::<PathBuf>()?));
        }
        let py = obj.py();
        let encoded = py.import("os")?.call_method1("fsencode", (obj,))?;
        let bytes = encoded.cast::<PyBytes>()?;
        Ok(Target(PathBuf::from(OsString::from_vec(
            bytes.as_bytes().to_vec(),
        ))))
    }
}

/// A timeout in seconds: `None` waits forever.
pub struct Seconds(pub Option<f64>);

impl Seconds {
    pub const ONE_ATTEMPT: Seconds = Seconds(Some(0.0));
}

impl<'a, 'py> FromPyObject<'a, 'py> for Seconds {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        if obj.is_none() {
            return Ok(Seconds(None));
        }
        if obj.is_instance_of::<PyBool>() {
            return Err(invalid(
                py,
                "invalid argument `timeout`: must be a number of seconds or None, not a bool",
            ));
        }
        match obj.extract::<f64>() {
            Ok(s) => Ok(Seconds(Some(s))),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => Err(invalid(
                py,
                "invalid argument `timeout`: is too large to be a number of seconds",
            )),
            Err(e) => Err(e),
        }
    }
}
