//! `sidelease._native`: the Python surface of the sidelease core. The
//! public package (`python/sidelease`) re-exports it and adds asyncio.

mod args;
mod cancel;
mod elector;
mod error;
mod json;
mod lease;
mod lost;
mod pending;
mod progress;
mod reentry;
mod watch;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", sidelease::VERSION)?;
    sidelease::on_any_lost(lost::hook);
    m.add_function(wrap_pyfunction!(lease::acquire, m)?)?;
    m.add_function(wrap_pyfunction!(lease::inspect, m)?)?;
    m.add_class::<lease::Lease>()?;
    m.add_class::<pending::Pending>()?;
    m.add_class::<lease::Ready>()?;
    m.add_class::<cancel::CancelToken>()?;
    m.add_class::<elector::Elector>()?;
    m.add_class::<elector::Term>()?;
    m.add_function(wrap_pyfunction!(watch::_watch_pause, m)?)?;
    m.add_function(wrap_pyfunction!(watch::_watch_resume, m)?)?;
    m.add_function(wrap_pyfunction!(watch::_watch_resume_soon, m)?)?;
    m.add_function(wrap_pyfunction!(watch::_watch_running, m)?)?;
    Ok(())
}
