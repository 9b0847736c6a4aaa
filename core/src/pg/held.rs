//! What a held PostgreSQL lease does on release, check and loss: its
//! session is the lock, and it is only as sure as the server's last answer.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::confirm::silent;
use super::link::Link;
use super::local;
use crate::backend::{Engine, Held};
use crate::error::{Error, Lost, Result};
use crate::lease::{Check, Lease, Phase, Shared};

impl Held for Link {
    fn engine(&self) -> Engine {
        Engine::Pg
    }

    fn release(&self, s: &Arc<Shared>) -> Result<()> {
        local::release(s, self)
    }

    /// No path names the lock: the session is the lease.
    fn check(&self, s: &Arc<Shared>) -> Result<Check> {
        self.refresh(s);
        match &s.state().phase {
            Phase::Lost(l) => Err(Error::Lost(Box::new(l.clone()))),
            _ => Ok(Check::Held),
        }
    }

    /// Count the lease as lost once the server has not confirmed its
    /// session within the bound (`confirm_within`): this process was paused
    /// or cut off, and an operator or a restart may have ended the session
    /// meanwhile.
    fn refresh(&self, s: &Shared) {
        if self.confirmed.expired() {
            // The same words whichever thread saw the bound pass first.
            s.mark_lost(Lost {
                lease_path: s.lease_path.clone(),
                reason: silent(self.confirmed.bound()),
                holders: Vec::new(),
            });
        }
    }

    fn ensure_held(&self, lease: &Lease) -> Result<()> {
        confirmed(lease.shared(), self)
    }

    /// One round trip within the bound.
    fn ensure_held_now(&self, lease: &Lease) -> Result<()> {
        let s = lease.shared();
        confirmed(s, self)?;
        match self.confirm_now() {
            Some(_) => confirmed(s, self),
            None => {
                confirmed(s, self)?;
                Err(Error::Io {
                    syscall: "heartbeat",
                    path: s.lease_path.clone(),
                    source: std::io::Error::other(
                        "the lease's session did not answer in time; whether it is still held is \
                         not known yet",
                    ),
                })
            }
        }
    }

    fn hand_on(&self, _: &Shared) -> Result<OwnedFd> {
        self.hand_on()
    }

    fn held_for(&self) -> Option<std::time::Duration> {
        if self.confirmed.expired() {
            return Some(std::time::Duration::ZERO);
        }
        Some(self.confirmed.bound().saturating_sub(self.confirmed.age()))
    }

    /// What the server judged when the row was written: the previous
    /// holder's bound from then if it did not release (as its record gives
    /// it), or a fence an earlier one left that a clean release passed on;
    /// less, at each call, the holders of this machine that have ended.
    fn predecessor_bound(&self) -> Option<std::time::Duration> {
        self.fences.left()
    }

    fn predecessor_may_end(&self) -> bool {
        self.fences.may_end()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `Err(Lost)` once the lease is lost, or its bound has passed.
fn confirmed(s: &Shared, link: &Link) -> Result<()> {
    link.refresh(s);
    match &s.state().phase {
        Phase::Lost(l) => Err(Error::Lost(Box::new(l.clone()))),
        _ => Ok(()),
    }
}

/// The session link of a PostgreSQL lease (`None` for another engine's).
pub(crate) fn link_of(s: &Shared) -> Option<&Link> {
    s.hold.as_any().downcast_ref::<Link>()
}
