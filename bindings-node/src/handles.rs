//! Lease handles by number. JS holds a plain object with the number; the
//! native handle lives here until `release()`, which frees it at once (a
//! class instance would keep its native state until the garbage collector
//! runs its finalizer, which a busy synchronous loop never lets it do).
//!
//! Every handle belongs to the JS environment (main thread or worker) that
//! made it. When a worker's environment is torn down (`worker.terminate()`,
//! or its script ends), its pending waits are cancelled and its handles
//! released: nothing in it could ever release them. The main thread's
//! handles live until process exit, like any lease (DESIGN §4).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use napi::Env;
use napi_derive::napi;

use crate::error::{invalid, Result};
use crate::wait::CancelState;

#[derive(Default)]
struct Table {
    /// The facts of handles whose release failed, until index.js takes them.
    facts: HashMap<u64, String>,
    next: u64,
    leases: HashMap<u64, (u32, Arc<sidelease::Lease>)>,
    next_env: u32,
    closed: HashSet<u32>,
    waits: HashMap<u32, Vec<Weak<CancelState>>>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<Table>> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    let mut g = table();
    f(g.get_or_insert_with(Table::default))
}

/// Number this JS environment (index.js calls it once as it loads). A
/// worker's environment releases what it holds when it is torn down.
#[napi]
pub fn env_open(env: Env, main_thread: bool) -> Result<u32> {
    let id = with(|t| {
        t.next_env += 1;
        t.next_env
    });
    if !main_thread {
        env.add_env_cleanup_hook(id, close_env)
            .map_err(|e| invalid("env", &e.to_string()))?;
    }
    Ok(id)
}

fn close_env(env: u32) {
    let (leases, waits) = with(|t| {
        t.closed.insert(env);
        let ids: Vec<u64> = t
            .leases
            .iter()
            .filter(|(_, (e, _))| *e == env)
            .map(|(id, _)| *id)
            .collect();
        let leases: Vec<Arc<sidelease::Lease>> = ids
            .into_iter()
            .filter_map(|id| t.leases.remove(&id).map(|(_, l)| l))
            .collect();
        (leases, t.waits.remove(&env).unwrap_or_default())
    });
    for w in waits.iter().filter_map(Weak::upgrade) {
        w.cancel();
    }
    for l in leases {
        let _ = l.release();
    }
    crate::elector::close_env(env);
}

/// Keep a new handle; its number for JS. An environment torn down while
/// the acquisition ran gets nothing: the lease is released here.
pub fn insert(env: u32, lease: sidelease::Lease) -> std::result::Result<u64, sidelease::Lease> {
    with(|t| {
        if t.closed.contains(&env) {
            return Err(lease);
        }
        t.next += 1;
        let id = t.next;
        t.leases.insert(id, (env, Arc::new(lease)));
        Ok(id)
    })
}

pub fn keep_facts(id: u64, facts: String) {
    with(|t| t.facts.insert(id, facts));
}

pub fn facts_of_failed(id: u64) -> Option<String> {
    with(|t| t.facts.remove(&id))
}

/// Take a handle out (on release).
pub fn remove(id: u64) -> Option<Arc<sidelease::Lease>> {
    with(|t| t.leases.remove(&id).map(|(_, l)| l))
}

/// Run `f` on a held handle (outside the table's lock: it may wait for the
/// lease's own), or fail naming a released one.
/// The handle's lease, to use off this thread.
pub fn shared(id: u64) -> Option<Arc<sidelease::Lease>> {
    table()
        .as_ref()
        .and_then(|t| t.leases.get(&id))
        .map(|(_, l)| l.clone())
}

pub fn get<T>(id: u64, f: impl FnOnce(&sidelease::Lease) -> Result<T>) -> Result<T> {
    let lease = table()
        .as_ref()
        .and_then(|t| t.leases.get(&id))
        .map(|(_, l)| l.clone());
    match lease {
        Some(l) => f(&l),
        None => Err(invalid("lease", "this lease handle was released")),
    }
}

/// Let a torn-down environment cancel this wait. False: it is already gone.
pub fn add_wait(env: u32, wait: &Arc<CancelState>) -> bool {
    with(|t| {
        if t.closed.contains(&env) {
            return false;
        }
        let waits = t.waits.entry(env).or_default();
        waits.retain(|w| w.strong_count() > 0);
        waits.push(Arc::downgrade(wait));
        true
    })
}

/// How many handles are kept (for tests: released ones are not).
#[napi]
pub fn handle_count() -> u32 {
    with(|t| t.leases.len() as u32)
}
