//! `acquire`, `inspect` and the `Lease` handle.

use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi::{Env, JsString};
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

/// Release a handle and free it; answers what the acquisition learned (a
/// JSON object: leasePath, target, generation, previousReleasedCleanly,
/// recordWritten, record, previous), which index.js keeps so its getters
/// answer after release as before. A second call answers null. When the
/// release itself fails, `takeFacts` has them.
#[napi]
pub fn release(env: &Env, handle: f64) -> Result<Option<JsString<'_>>> {
    let Some(lease) = handles::remove(id(handle)) else {
        return Ok(None);
    };
    let mut facts = facts(&lease);
    let released = lease.release().js();
    // The loss the handle had (kept by the core at release): `lostReason`
    // and `signal` answer after release as before.
    let lost = lease.lost();
    facts.pop(); // the closing brace
    facts.push_str(",\"lostReason\":");
    facts.push_str(&json_or_null(lost.as_ref().map(|l| l.reason.as_str())));
    facts.push_str(",\"lostMessage\":");
    facts.push_str(&json_or_null(lost.map(|l| l.to_string()).as_deref()));
    facts.push('}');
    match released {
        Ok(()) => text(env, &facts).map(Some),
        Err(e) => {
            handles::keep_facts(id(handle), facts);
            Err(e)
        }
    }
}

/// A JS string of `s`. ASCII (the common case: JSON escapes what is not)
/// is made as Latin-1, which the engine copies as it is instead of
/// decoding it as UTF-8.
fn text<'env>(env: &'env Env, s: &str) -> Result<JsString<'env>> {
    let made = if s.is_ascii() {
        env.create_string_latin1(s.as_bytes())
    } else {
        env.create_string(s)
    };
    made.map_err(|e| invalid("lease", &e.to_string()))
}

fn json_or_null(s: Option<&str>) -> String {
    s.and_then(|s| serde_json::to_string(s).ok())
        .unwrap_or_else(|| "null".into())
}

/// What a handle whose release failed had learned (once).
#[napi]
pub fn take_facts(handle: f64) -> Option<String> {
    handles::facts_of_failed(id(handle))
}

/// The immutable fields of a lease, as one JSON object (the record and the
/// previous record are JSON already, and are copied in as they are).
fn facts(l: &sidelease::Lease) -> String {
    // As the getters give them: UTF-8, or lossy where a path is not.
    let s = |p: &std::path::Path| {
        let text = match p.to_str() {
            Some(t) => std::borrow::Cow::Borrowed(t),
            None => p.to_string_lossy(),
        };
        serde_json::to_string(&*text).unwrap_or_else(|_| "null".into())
    };
    let lease_path = s(l.lease_path());
    let target = s(l.target());
    let previous = l.previous_json();
    let record = l.record_json();
    let mut out = String::with_capacity(
        lease_path.len()
            + target.len()
            + record.len()
            + previous.as_ref().map_or(4, |p| p.len())
            + 160,
    );
    out.push_str("{\"leasePath\":");
    out.push_str(&lease_path);
    out.push_str(",\"target\":");
    out.push_str(&target);
    out.push_str(",\"generation\":");
    match l.generation() {
        // JSON.parse reads it as the same number the getter gives (`g as
        // f64`: both round to the nearest double).
        Some(g) => out.push_str(&g.to_string()),
        None => out.push_str("null"),
    }
    out.push_str(",\"previousReleasedCleanly\":");
    out.push_str(match l.previous_released_cleanly() {
        Some(true) => "true",
        Some(false) => "false",
        None => "null",
    });
    out.push_str(",\"recordWritten\":");
    out.push_str(if l.record_written() { "true" } else { "false" });
    out.push_str(",\"record\":");
    out.push_str(record);
    out.push_str(",\"previous\":");
    out.push_str(previous.as_deref().unwrap_or("null"));
    out.push('}');
    out
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
    handles::get(id(handle), |l| Ok(l.record_json().to_string()))
}

/// The previous holder's record as JSON text, as it wrote it ("null" if
/// none).
#[napi]
pub fn previous_json(handle: f64) -> Result<String> {
    handles::get(id(handle), |l| {
        Ok(l.previous_json()
            .map(|j| j.into_owned())
            .unwrap_or_else(|| "null".into()))
    })
}

/// true only when the previous record says so; null when no record tells
/// (an empty lease file: a first lease, or one deleted or emptied) or the
/// file could only be opened read-only. Recover unless it is true.
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
    handles::get(id(handle), |l| Ok(l.lost().map(|l| l.reason)))
}

/// Throw a SIDELEASE_LOST error if the lease was lost.
#[napi]
pub fn ensure_held(handle: f64) -> Result<()> {
    handles::get(id(handle), |l| l.ensure_held().js())
}

/// Ask the server now (a PostgreSQL lease: one round trip, within its
/// bound) off the event loop; a lease file as `ensure_held`.
#[napi]
pub async fn ensure_held_now(handle: f64) -> napi::Result<()> {
    let Some(lease) = handles::shared(id(handle)) else {
        return Err(napi::Error::new(
            napi::Status::GenericFailure,
            invalid("lease", "this lease handle was released").reason,
        ));
    };
    tokio::task::spawn_blocking(move || lease.ensure_held_now())
        .await
        .map_err(|e| napi::Error::new(napi::Status::GenericFailure, e.to_string()))?
        .map_err(crate::error::to_js_async)
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
