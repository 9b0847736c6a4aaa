//! `CancelToken`: ends a synchronous wait from another thread, as the C
//! ABI's `sidelease_cancel` does (Ctrl-C only reaches the main thread).

use pyo3::prelude::*;

/// Pass it to `acquire(..., cancel=token)`; `token.cancel()` from any thread
/// ends that wait with `LeaseCancelled`, holding nothing. Cancelling is
/// permanent: make one token per wait you may cancel.
#[pyclass(module = "sidelease._native", frozen)]
pub struct CancelToken {
    pub inner: sidelease::CancelToken,
}

#[pymethods]
impl CancelToken {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(CancelToken {
            inner: sidelease::CancelToken::new()?,
        })
    }

    /// End the waits given this token (now and later). Safe from any
    /// thread, and from a signal handler.
    fn cancel(&self) {
        self.inner.cancel();
    }

    #[getter]
    fn cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }
}
