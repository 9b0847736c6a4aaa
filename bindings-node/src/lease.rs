//! `acquire`, `inspect` and the `Lease` handle.

use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;

/// Weak (never keeps the loop alive), called with the message only.
type LostCallback = ThreadsafeFunction<String, (), String, Status, false, true, 0>;
use sidelease::{Options, Pending, Wait};

use crate::error::{invalid, IntoJs, Result};

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

/// Acquire synchronously (a wait blocks only the calling thread).
#[napi]
pub fn acquire(target: String, options: Option<NativeOptions>) -> Result<Lease> {
    let opts = self::options(options)?;
    let lease = Pending::new(target.as_ref(), &opts).js()?.wait(None).js()?;
    Ok(Lease::new(lease))
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

/// A handle on a lease. Garbage collection never releases it: a lease lives
/// until `release()`, dispose, or process exit.
#[napi]
pub struct Lease {
    inner: Option<sidelease::Lease>,
}

impl Lease {
    pub fn new(inner: sidelease::Lease) -> Lease {
        Lease { inner: Some(inner) }
    }

    fn live(&self) -> Result<&sidelease::Lease> {
        match &self.inner {
            Some(l) if !l.is_released() => Ok(l),
            _ => Err(invalid("lease", "this lease handle was released")),
        }
    }

    fn any(&self) -> Result<&sidelease::Lease> {
        self.inner
            .as_ref()
            .ok_or_else(|| invalid("lease", "this lease handle is empty"))
    }
}

#[napi]
impl Lease {
    /// Release this handle's share; a second call does nothing.
    #[napi]
    pub fn release(&self) -> Result<()> {
        self.any()?.release().js()
    }

    /// 'held', 'unlinked' or 'replaced'.
    #[napi]
    pub fn check(&self) -> Result<String> {
        Ok(self.live()?.check().js()?.as_str().to_string())
    }

    #[napi(getter)]
    pub fn released(&self) -> bool {
        self.inner.as_ref().is_none_or(|l| l.is_released())
    }

    #[napi(getter)]
    pub fn lease_path(&self) -> Result<String> {
        Ok(self.any()?.lease_path().to_string_lossy().into_owned())
    }

    #[napi(getter)]
    pub fn target(&self) -> Result<String> {
        Ok(self.any()?.target().to_string_lossy().into_owned())
    }

    /// The record this acquisition wrote, as JSON text.
    #[napi(getter)]
    pub fn record_json(&self) -> Result<String> {
        Ok(self.any()?.record().to_json())
    }

    /// The previous holder's record as JSON text ("null" if none).
    #[napi(getter)]
    pub fn previous_json(&self) -> Result<String> {
        Ok(self
            .any()?
            .previous()
            .map(|r| r.to_json())
            .unwrap_or_else(|| "null".into()))
    }

    /// null when the lease file could only be opened read-only (no record
    /// is written, so this is not known).
    #[napi(getter)]
    pub fn previous_released_cleanly(&self) -> Result<Option<bool>> {
        Ok(self.any()?.previous_released_cleanly())
    }

    /// The fencing token (a JS number: exact up to 2^53); null for a
    /// read-only lease file.
    #[napi(getter)]
    pub fn generation(&self) -> Result<Option<f64>> {
        Ok(self.any()?.generation().map(|g| g as f64))
    }

    /// 'held', 'lost' or 'released'.
    #[napi(getter)]
    pub fn state(&self) -> String {
        match &self.inner {
            Some(l) => l.state().as_str().to_string(),
            None => "released".into(),
        }
    }

    /// What happened, once the lease was lost (else null).
    #[napi(getter)]
    pub fn lost_reason(&self) -> Option<String> {
        match self.inner.as_ref()?.state() {
            sidelease::LeaseState::Lost(l) => Some(l.reason),
            _ => None,
        }
    }

    /// Throw a SIDELEASE_LOST error if the lease was lost.
    #[napi]
    pub fn ensure_held(&self) -> Result<()> {
        self.any()?.ensure_held().js()
    }

    /// Call `callback(message)` on this thread's event loop when the lease
    /// is lost. It never keeps the event loop alive.
    #[napi]
    pub fn on_lost(&self, callback: Function<'_, String, ()>) -> Result<()> {
        let tsfn: LostCallback = callback
            .build_threadsafe_function::<String>()
            .callee_handled::<false>()
            .weak::<true>()
            .build()
            .map_err(|e| invalid("callback", &e.to_string()))?;
        self.live()?
            .on_lost(move |lost| {
                // Closing (its environment was torn down) is fine to ignore.
                let _ = tsfn.call(lost.to_string(), ThreadsafeFunctionCallMode::NonBlocking);
            })
            .js()
    }

    #[napi(getter)]
    pub fn record_written(&self) -> Result<bool> {
        Ok(self.any()?.record_written())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Collected by GC: keep the lease (see DESIGN §4); the core handle is
        // deliberately leaked so its Drop does not release it.
        if let Some(l) = self.inner.take() {
            if !l.is_released() {
                std::mem::forget(l);
            }
        }
    }
}
