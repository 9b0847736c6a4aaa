//! One acquisition of a PostgreSQL lease in progress, as `Pending` drives
//! it: its thread does the work and rings a wake descriptor when it is over, so a
//! blocking caller polls that descriptor and an event loop watches it.

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::platform::wakefd::WakeFd;
use tokio::sync::mpsc::UnboundedSender;

use super::link::Cmd;
use super::local;
use super::session;
use super::target::Target;
use crate::error::{Contention, Error, Result};
use crate::lease::Lease;
use crate::options::{Options, Wait};

/// Where the thread leaves the outcome.
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    fd: WakeFd,
}

#[derive(Default)]
struct SlotState {
    outcome: Option<Result<Lease>>,
    /// Who the lock's holder is, as the server told it when the wait began.
    waiting: Option<Contention>,
    /// The caller gave the acquisition up.
    abandoned: bool,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ring(&self) {
        self.fd.ring();
    }

    /// Leave an outcome (a lease nobody takes any more is dropped, which
    /// releases it).
    pub(crate) fn finish(&self, outcome: Result<Lease>) {
        let mut st = self.state();
        if st.abandoned {
            drop(st);
            drop(outcome);
            return;
        }
        st.outcome = Some(outcome);
        drop(st);
        self.ring();
    }

    /// The wait begins: who holds the lock (told once; the caller's
    /// `Pending` sees it on its next look).
    pub(crate) fn waiting(&self, c: Contention) {
        let mut st = self.state();
        if st.abandoned || st.outcome.is_some() {
            return;
        }
        st.waiting = Some(c);
        drop(st);
        self.ring();
    }

    /// Whether the caller gave the acquisition up.
    pub(crate) fn abandoned(&self) -> bool {
        self.state().abandoned
    }

    /// Leave the lease `make` lists, unless the caller gave up (false).
    pub(crate) fn finish_with(&self, make: impl FnOnce() -> Lease) -> bool {
        let mut st = self.state();
        if st.abandoned {
            return false;
        }
        st.outcome = Some(Ok(make()));
        drop(st);
        self.ring();
        true
    }
}

pub(crate) struct Attempt {
    target: Arc<Target>,
    slot: ManuallyDrop<Arc<Slot>>,
    tx: ManuallyDrop<UnboundedSender<Cmd>>,
    ended: bool,
    contention: Option<Box<Contention>>,
    started: Instant,
    wait: Wait,
    /// The fork epoch it began in: a forked child's copy has no thread.
    epoch: u64,
}

/// How long past the caller's timeout an acquisition may go before it is
/// given up without an answer from the server (a stalled server, or one
/// that stopped answering mid-connect).
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(6);

impl Attempt {
    pub(crate) fn new(url: &str, options: &Options) -> Result<Attempt> {
        let target = Arc::new(Target::parse(url)?);
        let fd = WakeFd::new().map_err(|e| Error::io(WakeFd::CALL, Path::new(&target.shown), e))?;
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::default()),
            fd,
        });
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let started = Instant::now();
        if let Some(lease) = local::share(&target.identity) {
            slot.finish(Ok(lease));
        } else if target.shared.unwrap_or(!options.inheritable) {
            super::hub::start(super::hub::TryReq {
                target: target.clone(),
                opts: options.clone(),
                started,
                slot: slot.clone(),
                tx: tx.clone(),
                rx,
            })?;
        } else {
            session::spawn(
                target.clone(),
                options.clone(),
                started,
                slot.clone(),
                tx.clone(),
                rx,
            )?;
        }
        Ok(Attempt {
            target,
            slot: ManuallyDrop::new(slot),
            tx: ManuallyDrop::new(tx),
            ended: false,
            contention: None,
            started,
            wait: options.wait,
            epoch: crate::registry::epoch(),
        })
    }

    pub(crate) fn shown(&self) -> &Path {
        Path::new(&self.target.shown)
    }

    /// The outcome if the thread has one: `Ok(None)` while it works.
    pub(crate) fn try_acquire(&mut self) -> Result<Option<Lease>> {
        if self.ended {
            return Err(Error::invalid("pending", "this acquisition already ended"));
        }
        if self.epoch != crate::registry::epoch() {
            return Err(Error::invalid(
                "pending",
                "this acquisition belongs to the parent process; start a new one in the child",
            ));
        }
        let outcome = self.slot.state().outcome.take();
        match outcome {
            None => Ok(None),
            Some(r) => {
                self.ended = true;
                match r {
                    Ok(l) => Ok(Some(l)),
                    Err(e) => {
                        self.contention = e.contention().cloned().map(Box::new);
                        Err(e)
                    }
                }
            }
        }
    }

    pub(crate) fn wait_fd(&self) -> BorrowedFd<'_> {
        self.slot.fd.as_fd()
    }

    /// The thread rings when it is done; this is only a safety re-check.
    pub(crate) fn next_check(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// When the caller gives up if the server has not answered: its own
    /// timeout (or none) plus a grace for connecting.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.wait {
            Wait::NoWait => self.started.checked_add(ANSWER_GRACE),
            Wait::Timeout(d) => self.started.checked_add(d)?.checked_add(ANSWER_GRACE),
            Wait::Forever => None,
        }
    }

    pub(crate) fn contention_error(&self, timed_out: bool) -> Error {
        let waiting = match (&self.contention, self.ended) {
            (None, false) => self.slot.state().waiting.clone().map(Box::new),
            _ => None,
        };
        if let Some(c) = waiting {
            return if timed_out {
                Error::Timeout(c)
            } else {
                Error::InUse(c)
            };
        }
        if self.contention.is_none() && !self.ended {
            return super::conn::io_error(
                &self.target,
                "connect",
                format!(
                    "no answer from the server within {:.1}s",
                    self.started.elapsed().as_secs_f64()
                ),
            );
        }
        let c = Box::new(*self.contention.clone().unwrap_or_else(|| {
            Box::new(Contention {
                record_note: None,
                names: Vec::new(),
                inherited: None,
                target: self.shown().to_path_buf(),
                lease_path: self.shown().to_path_buf(),
                holder: None,
                holders: Vec::new(),
                waited: self.started.elapsed(),
            })
        }));
        if timed_out {
            Error::Timeout(c)
        } else {
            Error::InUse(c)
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.epoch != crate::registry::epoch() {
            // A forked child's copy: its thread and runtime stayed in the
            // parent, and the slot's lock may have been held at the fork.
            // Touch nothing (the slot and the channel are leaked).
            return;
        }
        let left = {
            let mut st = self.slot.state();
            st.abandoned = true;
            st.outcome.take()
        };
        // An untaken lease is released here, on the caller's thread.
        drop(left);
        let _ = self.tx.send(Cmd::Cancel);
        // SAFETY: dropped once, here, and never used again.
        unsafe {
            ManuallyDrop::drop(&mut self.tx);
            ManuallyDrop::drop(&mut self.slot);
        }
    }
}

impl crate::backend::Attempt for Attempt {
    fn lease_path(&self) -> &Path {
        self.shown()
    }
    fn target(&self) -> std::path::PathBuf {
        self.shown().to_path_buf()
    }
    fn try_acquire(&mut self) -> Result<Option<Lease>> {
        Attempt::try_acquire(self)
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(Attempt::wait_fd(self))
    }
    fn next_check(&mut self) -> Duration {
        Attempt::next_check(self)
    }
    /// The thread rang for a report (`Slot::waiting`): clear it, or the
    /// descriptor would stay readable until the outcome.
    fn woke(&mut self) {
        self.slot.fd.drain();
    }
    fn elapsed(&self) -> Duration {
        Attempt::elapsed(self)
    }
    fn contention_error(&self, timed_out: bool) -> Error {
        Attempt::contention_error(self, timed_out)
    }
    fn deadline(&self) -> Option<Instant> {
        Attempt::deadline(self)
    }
}
