//! The core's elector for `Elector` and `lead` in index.js. Electors and
//! terms are kept by number, as lease handles are; a campaign runs on
//! tokio's blocking pool (it waits on the core's event-driven wait), never
//! on the event loop. A torn-down worker's electors are stopped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::UNIX_EPOCH;

use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;
use sidelease::elector::{Elector, Event, Outcome, Term};

use crate::error::{invalid, to_js_async, IntoJs, Result};
use crate::lease::{keep, options, NativeOptions};

/// Weak (never keeps the loop alive): the event as JSON text, its kind in
/// `kind`.
pub(crate) type EventCallback = ThreadsafeFunction<String, (), String, Status, false, true, 0>;

#[derive(Default)]
struct Table {
    next: u32,
    electors: HashMap<u32, (u32, Arc<Elector>)>,
    /// Each term with its environment's number.
    terms: HashMap<u32, (u32, Term)>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    let mut g: MutexGuard<'_, Option<Table>> = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Table::default))
}

fn elector(id: u32) -> Result<Arc<Elector>> {
    with(|t| t.electors.get(&id).map(|(_, e)| e.clone()))
        .ok_or_else(|| invalid("elector", "this elector was closed"))
}

/// Who a wait waits for, as JSON (kind "waiting"): an elector's campaign
/// and `acquireAsync`'s `onWaiting` tell the same.
pub(crate) fn waiting_json(c: &sidelease::Contention) -> String {
    serde_json::json!({
        "kind": "waiting",
        "holder": c.holder.as_ref().map(|r| serde_json::from_str::<serde_json::Value>(&r.to_json()).ok()),
        "holders": c.holders,
        "message": c.to_string(),
    })
    .to_string()
}

/// What JS is told of an event, as JSON; `None` for the events index.js
/// tells itself (elected, lost, stepped down, stopped: it sees them as
/// they happen, with the lease and its signal).
fn event_json(e: &Event) -> Option<String> {
    match e {
        Event::Waiting(c) => Some(waiting_json(c)),
        Event::Error { error, retry_in } => Some(
            serde_json::json!({
                "kind": "retrying",
                "message": error.to_string(),
                "code": crate::error::code(error.kind()),
                "retryIn": retry_in.as_secs_f64() * 1000.0,
            })
            .to_string(),
        ),
        _ => None,
    }
}

/// An elector for `target`; `onEvent(json)` hears "waiting" and
/// "retrying" on this thread's event loop. Its number.
#[napi]
pub fn elector_open(
    env: u32,
    target: String,
    options: Option<NativeOptions>,
    on_event: Function<'_, String, ()>,
) -> Result<u32> {
    let opts = self::options(options)?;
    let e = Elector::new(&target, &opts).js()?;
    let tsfn: EventCallback = on_event
        .build_threadsafe_function::<String>()
        .callee_handled::<false>()
        .weak::<true>()
        .build()
        .map_err(|e| invalid("onEvent", &e.to_string()))?;
    e.on_event(move |ev| {
        if let Some(msg) = event_json(ev) {
            // Closing (its environment was torn down) is fine to ignore.
            let _ = tsfn.call(msg, ThreadsafeFunctionCallMode::NonBlocking);
        }
    });
    let e = Arc::new(e);
    Ok(with(|t| {
        t.next += 1;
        t.electors.insert(t.next, (env, e));
        t.next
    }))
}

/// Wait until elected: [term number, lease handle number], or null once
/// stopped.
#[napi]
pub async fn elector_campaign(env: u32, id: u32) -> napi::Result<Option<Vec<f64>>> {
    let e = elector(id).map_err(|e| napi::Error::new(Status::InvalidArg, e.reason))?;
    let won = tokio::task::spawn_blocking(move || e.campaign())
        .await
        .map_err(|j| napi::Error::new(Status::GenericFailure, j.to_string()))?
        .map_err(to_js_async)?;
    let Some(term) = won else { return Ok(None) };
    let handle = term
        .lease()
        .try_clone()
        .map_err(to_js_async)
        .and_then(|l| {
            keep(env, l).map_err(|e| napi::Error::new(Status::GenericFailure, e.reason))
        })?;
    let tid = with(|t| {
        t.next += 1;
        t.terms.insert(t.next, (env, term));
        t.next
    });
    Ok(Some(vec![tid as f64, handle]))
}

/// Stop: a campaign answers null, and none starts again.
#[napi]
pub fn elector_stop(id: u32) -> Result<()> {
    elector(id)?.stop();
    Ok(())
}

/// Stop and forget the elector (its current term, if any, stays until it
/// steps down).
#[napi]
pub fn elector_close(id: u32) {
    if let Some((_, e)) = with(|t| t.electors.remove(&id)) {
        e.stop();
    }
}

/// {leading, generation, leaderSince (ms since the epoch), elections,
/// losses, failures} as JSON.
#[napi]
pub fn elector_snapshot(id: u32) -> Result<String> {
    let s = elector(id)?.snapshot();
    let since = s
        .leader_since
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64() * 1000.0);
    Ok(serde_json::json!({
        "leading": s.leading,
        "generation": s.generation,
        "leaderSince": since,
        "elections": s.elections,
        "losses": s.losses,
        "failures": s.failures,
    })
    .to_string())
}

/// End a term once its work ended (`error`: its failure, null when it
/// returned); the lease handle must be released first. [why, detail]:
/// why is "lost", "released", "stopped" or "error".
#[napi]
pub fn term_step_down(id: u32, error: Option<String>) -> Result<Vec<String>> {
    let (_, term) =
        with(|t| t.terms.remove(&id)).ok_or_else(|| invalid("term", "this term ended"))?;
    let outcome = match error {
        Some(m) => Outcome::Failed(m),
        None => Outcome::Returned,
    };
    let why = term.step_down(outcome);
    Ok(vec![why.kind().to_owned(), why.detail().to_owned()])
}

/// A torn-down environment's electors are stopped and their terms step
/// down: nothing in it could ever end them.
pub fn close_env(env: u32) {
    let (electors, terms) = with(|t| {
        let mut electors = Vec::new();
        t.electors.retain(|_, (e, el)| {
            let keep = *e != env;
            if !keep {
                electors.push(el.clone());
            }
            keep
        });
        let ids: Vec<u32> = t
            .terms
            .iter()
            .filter(|(_, (e, _))| *e == env)
            .map(|(id, _)| *id)
            .collect();
        let terms: Vec<Term> = ids
            .iter()
            .filter_map(|id| t.terms.remove(id).map(|(_, term)| term))
            .collect();
        (electors, terms)
    });
    for e in electors {
        e.stop();
    }
    for term in terms {
        term.step_down(Outcome::Returned);
    }
}
