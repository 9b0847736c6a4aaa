//! [`Term`]: one term of leadership, from election to stepping down. Its
//! cancellation fires once, on loss or on `stop`, and keeps the first
//! reason.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use super::{Ended, Event, Inner, MIN_TERM};
use crate::backend::Engine;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::platform::notify::CancelToken;

/// How the leader's work ended, as the binding saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It returned (the CLI's command exited 0).
    Returned,
    /// It failed: raised, rejected, exited non-zero (the message).
    Failed(String),
}

#[derive(Clone)]
pub(crate) struct Cancel {
    token: CancelToken,
    why: Arc<Mutex<Option<Ended>>>,
}

impl Cancel {
    /// The first reason wins; true if this was it.
    pub(crate) fn fire(&self, why: Ended) -> bool {
        let first = {
            let mut w = self.why.lock().unwrap_or_else(|e| e.into_inner());
            if w.is_none() {
                *w = Some(why);
                true
            } else {
                false
            }
        };
        if first {
            self.token.cancel();
        }
        first
    }

    fn why(&self) -> Option<Ended> {
        self.why.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// This process leads until the term's cancellation fires; the work must
/// then end, and [`Term::step_down`] release the lease. Dropping a term
/// steps down as if the work had returned.
pub struct Term {
    lease: Option<Lease>,
    cancel: Cancel,
    began: Instant,
    inner: Arc<Inner>,
}

impl Term {
    pub(crate) fn begin(lease: Lease, inner: Arc<Inner>) -> Result<Term> {
        let token = CancelToken::new().map_err(|e| {
            let _ = lease.release();
            Error::io(
                "CancelToken::new",
                Path::new(&Engine::shown(lease.target())),
                e,
            )
        })?;
        let cancel = Cancel {
            token,
            why: Arc::new(Mutex::new(None)),
        };
        let generation = lease.generation();
        {
            let mut st = inner.state();
            st.term = Some(cancel.clone());
            st.snapshot.leading = true;
            st.snapshot.generation = generation;
            st.snapshot.leader_since = Some(SystemTime::now());
            st.snapshot.elections += 1;
        }
        let term = Term {
            lease: Some(lease),
            cancel: cancel.clone(),
            began: Instant::now(),
            inner: inner.clone(),
        };
        inner.emit(&Event::Elected { generation });
        // After `Elected`, so that a lease lost already is told after it.
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let registered = term.lease().on_lost(move |l| {
            // Counted before the cancellation fires: the work that wakes
            // on it reads a snapshot that has the loss.
            let inner = weak.upgrade();
            if let Some(i) = &inner {
                i.state().snapshot.losses += 1;
            }
            cancel.fire(Ended::Lost(l.reason.clone()));
            if let Some(i) = inner {
                i.emit(&Event::Lost { reason: &l.reason });
            }
        });
        // A stop between the campaign's last look and `st.term` being set.
        if inner.stopped() {
            term.cancel.fire(Ended::Stopped);
        }
        registered.map(|()| term)
    }

    /// The lease this term holds.
    pub fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .expect("a term's lease is taken only when it ends")
    }

    /// The term's generation: its lease's fencing token (`None` when the
    /// lease has none, a read-only lease file).
    pub fn generation(&self) -> Option<u64> {
        self.lease().generation()
    }

    /// Why the work must end (`Lost` or `Stopped`); `None` while it may go
    /// on.
    pub fn cancelled(&self) -> Option<Ended> {
        // Brought up to date as the lease's own answer is (a PostgreSQL
        // lease whose bound passed is lost now, its cancellation fired), so
        // the term never says "go on" once `ensure_held` says "lost".
        if let Some(l) = &self.lease {
            let _ = l.state();
        }
        self.cancel.why()
    }

    /// Readable once the work must end.
    pub fn cancel_fd(&self) -> BorrowedFd<'_> {
        self.cancel.token.fd()
    }

    /// Block until the work must end (`Some`) or `timeout` passes (`None`;
    /// `None` as the timeout waits for ever).
    pub fn wait_cancelled(&self, timeout: Option<Duration>) -> Option<Ended> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(why) = self.cancelled() {
                return Some(why);
            }
            let ts = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    Some(Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: left.subsec_nanos() as _,
                    })
                }
                None => None,
            };
            let mut fds = [PollFd::from_borrowed_fd(self.cancel_fd(), PollFlags::IN)];
            let _ = poll(&mut fds, ts.as_ref());
        }
    }

    /// How long this term has lasted.
    pub fn elapsed(&self) -> Duration {
        self.began.elapsed()
    }

    /// End the term: release the lease (the next campaigner is woken at
    /// once) and say why it ended. A loss or a stop is the reason even when
    /// the work then failed; otherwise the work's outcome is. Work that
    /// failed, or returned within [`MIN_TERM`], makes the next campaign
    /// back off first.
    pub fn step_down(mut self, outcome: Outcome) -> Ended {
        self.end(outcome)
    }

    fn end(&mut self, outcome: Outcome) -> Ended {
        let Some(lease) = self.lease.take() else {
            return self.cancel.why().unwrap_or(Ended::Released);
        };
        let released = lease.release();
        let why = match (self.cancel.why(), outcome, released) {
            (Some(why), _, _) => why,
            (None, _, Err(Error::Lost(l))) => Ended::Lost(l.reason),
            (None, _, Err(e)) => Ended::Failed(e.to_string()),
            (None, Outcome::Returned, Ok(())) => Ended::Released,
            (None, Outcome::Failed(m), Ok(())) => Ended::Failed(m),
        };
        // Anything still watching the work's cancellation is told too.
        self.cancel.fire(why.clone());
        let short = self.began.elapsed() < MIN_TERM;
        {
            let mut st = self.inner.state();
            st.busy = false;
            st.term = None;
            st.snapshot.leading = false;
            st.snapshot.leader_since = None;
            let s = &mut st.snapshot;
            match &why {
                Ended::Failed(_) => s.failures = s.failures.saturating_add(1),
                Ended::Released if short => s.failures = s.failures.saturating_add(1),
                Ended::Released => s.failures = 0,
                Ended::Lost(_) | Ended::Stopped => {}
            }
        }
        self.inner.emit(&Event::SteppedDown { why: &why });
        why
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        self.end(Outcome::Returned);
    }
}
