//! `acquire`, `inspect` and the `Lease` handle.

use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;

/// Weak (never keeps the loop alive), called with the message only.
type LostCallback = ThreadsafeFunction<String, (), String, Status, false, true, 0>;
use sidelease::{Options, Pending, Wait};

use crate::error::{invalid, IntoJs, Result};
use crate::handles;

/// Options as `index.js` passes them (timeout in milliseconds, metadata as
/// JSON text).
#[napi(object)]
pub struct NativeOptions {
    pub timeout: Option<f64>,
    pub suffix: Option<String>,
    pub metadata_json: Option<String>,
    pub allow_unsupported_fs: Option<bool>,
    pub split_guard: Option<bool>,
    pub watch: Option<bool>,
    pub runtime: Option<String>,
}

static RUNTIME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name the runtime once ("node 20.20.2", "bun 1.4.5"), so calls without
/// options pass nothing from JS at all.
#[napi]
pub fn set_runtime(runtime: String) {
    let _ = RUNTIME.set(runtime);
}

fn runtime() -> String {
    RUNTIME.get().cloned().unwrap_or_else(|| "node".into())
}

pub fn options(o: Option<NativeOptions>) -> Result<Options> {
    let mut opts = Options::new();
    let Some(o) = o else {
        opts.runtime = Some(runtime());
        return Ok(opts);
    };
    if let Some(t) = o.timeout {
        opts.wait = Wait::from_millis_f64(t).js()?;
    }
    if let Some(s) = o.suffix {
        opts.suffix = s;
    }
    if let Some(m) = o.metadata_json {
        opts.metadata = Some(sidelease::record::parse_metadata(&m).js()?);
    }
    opts.allow_unsupported_fs = o.allow_unsupported_fs.unwrap_or(false);
    opts.split_guard = o.split_guard.unwrap_or(true);
    opts.watch = o.watch.unwrap_or(true);
    opts.runtime = Some(o.runtime.unwrap_or_else(runtime));
    opts.validate().js()?;
    Ok(opts)
}

/// Acquire synchronously (a wait blocks only the calling thread); the
/// handle's number.
#[napi]
pub fn acquire(env: u32, target: String, options: Option<NativeOptions>) -> Result<f64> {
    let opts = self::options(options)?;
    let lease = Pending::new(target.as_ref(), &opts).js()?.wait(None).js()?;
    keep(env, lease)
}

/// Hand a new lease to JS as a number (`handles`).
pub fn keep(env: u32, lease: sidelease::Lease) -> Result<f64> {
    match handles::insert(env, lease) {
        Ok(id) => Ok(id as f64),
        Err(lease) => {
            let lease_path = lease.lease_path().to_path_buf();
            let _ = lease.release();
            Err(crate::error::to_js(sidelease::Error::Cancelled {
                lease_path,
            }))
        }
    }
}

/// The inspection as JSON text (index.js renames the keys to camelCase).
#[napi]
pub fn inspect_json(target: String, suffix: Option<String>) -> Result<String> {
    let mut opts = Options::new();
    if let Some(s) = suffix {
        opts = opts.suffix(s);
    }
    Ok(sidelease::inspect(&target, &opts).js()?.to_json())
}

fn id(n: f64) -> u64 {
    n as u64
}

/// Release a handle and free it. A second call does nothing.
#[napi]
pub fn release(handle: f64) -> Result<()> {
    match handles::remove(id(handle)) {
        Some(lease) => lease.release().js(),
        None => Ok(()),
    }
}

/// 'held', 'unlinked' or 'replaced'.
#[napi]
pub fn check(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| Ok(l.check().js()?.as_str().to_string()))
}

#[napi]
pub fn lease_path(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| {
        Ok(l.lease_path().to_string_lossy().into_owned())
    })
}

#[napi]
pub fn target(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| {
        Ok(l.target().to_string_lossy().into_owned())
    })
}

/// The record this acquisition wrote, as JSON text.
#[napi]
pub fn record_json(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| Ok(l.record().to_json()))
}

/// The previous holder's record as JSON text ("null" if none).
#[napi]
pub fn previous_json(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| {
        Ok(l.previous()
            .map(|r| r.to_json())
            .unwrap_or_else(|| "null".into()))
    })
}

/// null when the lease file could only be opened read-only (no record is
/// written, so this is not known).
#[napi]
pub fn previous_released_cleanly(handle: f64) -> Result<Option<bool>> {
    handles::get(id(handle), |l| Ok(l.previous_released_cleanly()))
}

/// The fencing token (a JS number: exact up to 2^53); null for a
/// read-only lease file.
#[napi]
pub fn generation(handle: f64) -> Result<Option<f64>> {
    handles::get(id(handle), |l| Ok(l.generation().map(|g| g as f64)))
}

#[napi]
pub fn record_written(handle: f64) -> Result<bool> {
    handles::get(id(handle), |l| Ok(l.record_written()))
}

/// 'held' or 'lost' (index.js knows a released handle itself).
#[napi]
pub fn state(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| Ok(l.state().as_str().to_string()))
}

/// What happened, once the lease was lost (else null).
#[napi]
pub fn lost_reason(handle: f64) -> Result<Option<String>> {
    handles::get(id(handle), |l| match l.state() {
        sidelease::LeaseState::Lost(l) => Ok(Some(l.reason)),
        _ => Ok(None),
    })
}

/// Throw a SIDELEASE_LOST error if the lease was lost.
#[napi]
pub fn ensure_held(handle: f64) -> Result<()> {
    handles::get(id(handle), |l| l.ensure_held().js())
}

/// Call `callback(message)` on this thread's event loop when the lease is
/// lost. It never keeps the event loop alive.
#[napi]
pub fn on_lost(handle: f64, callback: Function<'_, String, ()>) -> Result<()> {
    let tsfn: LostCallback = callback
        .build_threadsafe_function::<String>()
        .callee_handled::<false>()
        .weak::<true>()
        .build()
        .map_err(|e| invalid("callback", &e.to_string()))?;
    handles::get(id(handle), |l| {
        l.on_lost(move |lost| {
            // Closing (its environment was torn down) is fine to ignore.
            let _ = tsfn.call(lost.to_string(), ThreadsafeFunctionCallMode::NonBlocking);
        })
        .js()
    })
}
