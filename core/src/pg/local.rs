//! This process's PostgreSQL leases, by lease identity (user, hosts,
//! database, name), so repeated acquisitions share one lease, and the
//! acquisitions in flight, so one blocked on the server is told when
//! another thread of this process got the lease instead (it would
//! otherwise wait on its own process forever).
//!
//! Like the file registry it is a leaked box behind an atomic pointer that
//! the fork child handler forgets: a lock held by a thread that did not
//! survive `fork` is never taken in the child.

use std::collections::HashMap;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::link::{shared_lease, Cmd, Link};
use crate::error::Result;
use crate::lease::{Lease, Phase, Shared};

#[derive(Default)]
struct Local {
    held: HashMap<String, Arc<Shared>>,
    /// Acquisitions in flight, by lease name.
    waiting: HashMap<String, Vec<(u64, UnboundedSender<Cmd>)>>,
    /// The shared session of each server (`Target::server`), and until when
    /// one that refused to be shared is not tried again.
    hubs: HashMap<String, UnboundedSender<Cmd>>,
    refused: HashMap<String, std::time::Instant>,
    /// Released sessions of their own kept for the next acquisition, by
    /// server (`idle.rs`).
    idle: HashMap<String, Vec<super::idle::Offer>>,
}

/// What `hub` found for a server.
pub(crate) enum Hub {
    Open(UnboundedSender<Cmd>),
    /// None yet: this caller starts it, with this channel.
    New(UnboundedSender<Cmd>, UnboundedReceiver<Cmd>),
    /// It refused to be shared lately: go alone.
    Refused,
}

/// The shared session of `server`, or the channel of a new one (listed at
/// once, so acquisitions meanwhile queue on it).
pub(crate) fn hub(server: &str) -> Hub {
    let mut g = lock();
    if let Some(until) = g.refused.get(server) {
        if std::time::Instant::now() < *until {
            return Hub::Refused;
        }
        g.refused.remove(server);
    }
    if let Some(tx) = g.hubs.get(server) {
        if !tx.is_closed() {
            return Hub::Open(tx.clone());
        }
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    g.hubs.insert(server.to_owned(), tx.clone());
    Hub::New(tx, rx)
}

/// Unlist the shared session `tx` (a newer one stays).
pub(crate) fn forget_hub(server: &str, tx: &UnboundedSender<Cmd>) {
    let mut g = lock();
    if g.hubs.get(server).is_some_and(|h| h.same_channel(tx)) {
        g.hubs.remove(server);
    }
}

/// The shared session `tx` could not be shared: unlist it, and go alone
/// for `span`.
pub(crate) fn refuse_hub(server: &str, tx: &UnboundedSender<Cmd>, span: std::time::Duration) {
    forget_hub(server, tx);
    lock()
        .refused
        .insert(server.to_owned(), std::time::Instant::now() + span);
}

/// List a kept session of `server`.
pub(super) fn offer_idle(server: &str, tx: super::idle::Offer) {
    lock().idle.entry(server.to_owned()).or_default().push(tx);
}

/// The most recently kept session of `server` still waiting, unlisted.
pub(super) fn take_idle(server: &str) -> Option<super::idle::Offer> {
    let mut g = lock();
    let list = g.idle.get_mut(server)?;
    let found = std::iter::from_fn(|| list.pop()).find(|tx| !tx.is_closed());
    if list.is_empty() {
        g.idle.remove(server);
    }
    found
}

/// Unlist the kept session `tx`, if still listed.
pub(super) fn forget_idle(server: &str, tx: &super::idle::Offer) {
    let mut g = lock();
    if let Some(list) = g.idle.get_mut(server) {
        list.retain(|t| !t.same_channel(tx));
        if list.is_empty() {
            g.idle.remove(server);
        }
    }
}

static LOCAL: AtomicPtr<Mutex<Local>> = AtomicPtr::new(ptr::null_mut());

fn lock() -> MutexGuard<'static, Local> {
    let mut p = LOCAL.load(Ordering::Acquire);
    if p.is_null() {
        crate::forkgate::install();
        let fresh = Box::into_raw(Box::default());
        p = match LOCAL.compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh,
            Err(winner) => {
                // SAFETY: `fresh` was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                winner
            }
        };
    }
    // SAFETY: leaked boxes, never freed.
    let m: &'static Mutex<Local> = unsafe { &*p };
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fork child handler: one atomic store (the parent's map is abandoned,
/// its leases belong to the parent).
pub(crate) fn after_fork_in_child() {
    LOCAL.store(ptr::null_mut(), Ordering::Release);
}

pub(crate) fn share(identity: &str) -> Option<Lease> {
    let g = lock();
    let s = g.held.get(identity)?;
    s.shareable().then(|| shared_lease(s.clone()))
}

/// Whether this process holds the lease `name` on the server backend
/// `backend_pid` of the server `server` (under another identity: the same
/// server spelled another way); if so it is listed under `identity` too, so
/// the next attempt shares it.
pub(crate) fn share_backend(identity: &str, name: &str, at: (Option<&str>, i32)) -> bool {
    let mut g = lock();
    let found = g
        .held
        .values()
        .find(|s| s.shareable() && super::held::link_of(s).is_some_and(|l| is_at(l, name, at)))
        .cloned();
    match found {
        Some(s) => {
            g.held.insert(identity.to_owned(), s);
            true
        }
        None => false,
    }
}

/// Whether this process holds the lease `name` on the server backend
/// `backend_pid` of the server `server`, under any identity.
pub(crate) fn holds_backend(name: &str, at: (Option<&str>, i32)) -> bool {
    lock()
        .held
        .values()
        .any(|s| super::held::link_of(s).is_some_and(|l| is_at(l, name, at)))
}

/// Whether `link` is the lease `name` held by backend `pid` of `server`. A
/// server that did not say which it is matches none: the same backend PID
/// on two servers is two sessions (every container's server numbers its
/// backends from the same few PIDs), and "unknown" is not "the same".
fn is_at(link: &Link, name: &str, (server, pid): (Option<&str>, i32)) -> bool {
    link.name == name
        && link.backend_pid == pid
        && server.is_some()
        && link.server.as_deref() == server
}

/// Whether another thread of this process holds the lease now.
pub(crate) fn share_pending(identity: &str) -> bool {
    lock().held.get(identity).is_some_and(|s| s.shareable())
}

/// List the new lease, tell the acquisitions waiting for it to share it,
/// and hand the first handle out.
pub(crate) fn insert(identity: &str, name: &str, s: Arc<Shared>) -> Lease {
    let mut g = lock();
    g.held.insert(identity.to_owned(), s.clone());
    // Waiters for the same name under any spelling of the server look
    // again (one that reaches this lease's backend shares it).
    for (_, tx) in g.waiting.get(name).into_iter().flatten() {
        let _ = tx.send(Cmd::Share);
    }
    drop(g);
    Lease::from_shared(s)
}

pub(crate) fn wait_for(identity: &str, id: u64, tx: UnboundedSender<Cmd>) {
    lock()
        .waiting
        .entry(identity.to_owned())
        .or_default()
        .push((id, tx));
}

pub(crate) fn unwait(identity: &str, id: u64) {
    let mut g = lock();
    if let Some(v) = g.waiting.get_mut(identity) {
        v.retain(|(i, _)| *i != id);
        if v.is_empty() {
            g.waiting.remove(identity);
        }
    }
}

/// A handle's release: the last one unlists the lease and ends its session.
pub(crate) fn release(s: &Arc<Shared>, link: &Link) -> Result<()> {
    {
        let mut g = lock();
        if !s.drop_handle() {
            return Ok(());
        }
        if g.held
            .get(&link.identity)
            .is_some_and(|h| Arc::ptr_eq(h, s))
        {
            g.held.remove(&link.identity);
        }
        let mut st = s.state();
        st.phase = match std::mem::replace(&mut st.phase, Phase::Released) {
            Phase::Lost(l) => Phase::Lost(l),
            _ => Phase::Released,
        };
    }
    s.ring_lost_fd();
    link.finish()
}

/// Whether this process holds the lease.
pub(crate) fn holds(identity: &str) -> bool {
    share_pending(identity)
}
