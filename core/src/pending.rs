//! [`Pending`]: one acquisition in progress, of a lease file or of a
//! PostgreSQL lease, driven the same way by every binding: `try_acquire`,
//! then sleep on `wait_fd` for at most `next_check`, until `deadline`.

use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use crate::backend::InFlight;
use crate::error::{Contention, Error, Result};
use crate::lease::Lease;
use crate::options::{Options, Wait};
use crate::platform::notify::CancelToken;

/// One acquisition in progress.
pub struct Pending {
    inner: InFlight,
    wait: Wait,
}

impl Pending {
    /// Validate the request and spell the lease path (or parse the
    /// PostgreSQL URL and start connecting).
    pub fn new(target: &Path, options: &Options) -> Result<Pending> {
        options.validate()?;
        Ok(Pending {
            inner: InFlight::start(target, options)?,
            wait: options.wait,
        })
    }

    /// The lease file's path (canonical once it was opened); for a
    /// PostgreSQL lease, its URL with the password masked.
    pub fn lease_path(&self) -> &Path {
        self.inner.get().lease_path()
    }

    /// The path the caller protects (the URL for a PostgreSQL lease).
    pub fn target(&self) -> PathBuf {
        self.inner.get().target()
    }

    /// One non-blocking attempt. `Ok(None)`: someone else holds the lease
    /// (or a young lease file is being given its grace, or the PostgreSQL
    /// server has not answered yet).
    pub fn try_acquire(&mut self) -> Result<Option<Lease>> {
        self.inner.get_mut().try_acquire()
    }

    /// The descriptor that turns readable when it is worth another attempt,
    /// or `None` when the waiter must poll (no inotify instance to be had).
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.get().wait_fd()
    }

    /// How long to sleep before the next attempt if no event comes.
    pub fn next_check(&mut self) -> Duration {
        self.inner.get_mut().next_check()
    }

    /// Note that `wait_fd` turned readable.
    pub fn woke(&mut self) {
        self.inner.get_mut().woke();
    }

    /// How long this acquisition has been going.
    pub fn elapsed(&self) -> Duration {
        self.inner.get().elapsed()
    }

    /// The in-use error for the current holder, or a timeout error when
    /// `timed_out`.
    pub fn contention_error(&self, timed_out: bool) -> Error {
        self.inner.get().contention_error(timed_out)
    }

    /// When the caller should give up (`None`: never). For a PostgreSQL
    /// lease the server keeps the time and `try_acquire` reports the
    /// timeout; this deadline, a few seconds later, only ends an
    /// acquisition whose server stopped answering.
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.get().deadline()
    }

    /// Whether this acquisition may wait at all.
    pub fn waits(&self) -> bool {
        self.wait != Wait::NoWait
    }

    /// Wait as the options say, on kernel events (or the server's answer),
    /// until acquired, timed out or cancelled.
    pub fn wait(self, cancel: Option<&CancelToken>) -> Result<Lease> {
        self.wait_inner(cancel, None)
    }

    /// `wait`, telling `progress` who holds the lease while it waits: once
    /// when the wait starts, and again whenever the holder changes (a
    /// wake-up with the same holder is not reported). Every wake-up then
    /// costs a look at the holder (the record, and the kernel's or the
    /// server's list of holders), which plain `wait` does not make.
    pub fn wait_reporting(
        self,
        cancel: Option<&CancelToken>,
        mut progress: impl FnMut(&Contention),
    ) -> Result<Lease> {
        self.wait_inner(cancel, Some(&mut progress))
    }

    fn wait_inner(
        mut self,
        cancel: Option<&CancelToken>,
        mut progress: Option<&mut dyn FnMut(&Contention)>,
    ) -> Result<Lease> {
        let deadline = self.deadline();
        let mut told: Option<Contention> = None;
        loop {
            if let Some(c) = cancel {
                if c.is_cancelled() {
                    return Err(Error::Cancelled {
                        lease_path: self.lease_path().to_path_buf(),
                    });
                }
            }
            if let Some(lease) = self.try_acquire()? {
                return Ok(lease);
            }
            if let Some(report) = progress.as_mut() {
                if let Some(c) = self.holder_changed(&mut told) {
                    report(c);
                }
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if now >= d => return Err(self.contention_error(self.waits())),
                Some(d) => d - now,
                None => Duration::MAX,
            };
            let sleep = self.next_check().min(remaining);
            if self.wait_for_change(sleep, cancel)? {
                self.woke();
            }
        }
    }

    /// After an attempt that failed: the holder, if it is named and not
    /// the one in `told` (which then becomes it). For bindings that loop
    /// themselves and report as `wait_reporting` does. Only a holder
    /// someone can name: a young file's grace, or a look in between, finds
    /// none, and "another process" would be a guess.
    pub fn holder_changed<'t>(&self, told: &'t mut Option<Contention>) -> Option<&'t Contention> {
        let Error::InUse(c) = self.contention_error(false) else {
            return None;
        };
        let named = c.holder.is_some() || !c.holders.is_empty();
        if !named || told.as_ref().is_some_and(|t| same_holder(t, &c)) {
            return None;
        }
        // The same processes holding the lock with no record naming them
        // is the holder told of writing its release (or a record being
        // rewritten): no new holder, and telling it twice would be noise.
        if c.holder.is_none() && told.as_ref().is_some_and(|t| t.holders == c.holders) {
            return None;
        }
        *told = Some(*c);
        told.as_ref()
    }

    /// Sleep until the wait descriptor fires (true), the time passes
    /// (false) or the token is cancelled (error). For bindings that loop
    /// themselves (to check for signals between short sleeps, say); call
    /// `woke` after true.
    pub fn wait_for_change(&self, timeout: Duration, cancel: Option<&CancelToken>) -> Result<bool> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let ts = Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let watch = self.wait_fd();
        let mut fds = Vec::with_capacity(2);
        if let Some(w) = watch {
            fds.push(PollFd::from_borrowed_fd(w, PollFlags::IN));
        }
        if let Some(c) = cancel {
            fds.push(PollFd::from_borrowed_fd(c.fd(), PollFlags::IN));
        }
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(Error::io("poll", self.lease_path(), e)),
        }
        if cancel.is_some() && fds.last().is_some_and(|f| !f.revents().is_empty()) {
            return Err(Error::Cancelled {
                lease_path: self.lease_path().to_path_buf(),
            });
        }
        Ok(watch.is_some() && !fds[0].revents().is_empty())
    }
}

/// Whether two looks at a held lease found the same holder: the same
/// record naming it (its nonce and generation), or, without one, the same
/// PIDs holding the lock. The record is read before the kernel's list of
/// holders: a holder letting go in between leaves its record and no PID,
/// the same holder still.
fn same_holder(a: &Contention, b: &Contention) -> bool {
    let id = |c: &Contention| {
        c.holder
            .as_ref()
            .map(|r| (r.nonce.clone(), r.generation, r.pid))
    };
    match (id(a), id(b)) {
        (Some(x), Some(y)) => x == y,
        (x, y) => x == y && a.holders == b.holders,
    }
}

#[cfg(test)]
mod tests {
    use super::same_holder;
    use crate::error::Contention;
    use crate::record::Record;

    fn look(nonce: Option<&str>, holders: &[u32]) -> Contention {
        Contention {
            target: "t".into(),
            lease_path: "t.backend-lease".into(),
            holder: nonce.map(|n| Record {
                nonce: Some(n.into()),
                generation: Some(5),
                pid: Some(7),
                ..Record::default()
            }),
            holders: holders.to_vec(),
            record_note: None,
            names: Vec::new(),
            inherited: None,
            waited: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn a_holder_is_its_record_and_without_one_its_pids() {
        // The record read, then the holder let go before the kernel's list
        // was: the same holder (a CI run told it twice).
        assert!(same_holder(&look(Some("a"), &[7]), &look(Some("a"), &[])));
        assert!(!same_holder(&look(Some("a"), &[7]), &look(Some("b"), &[7])));
        // No record: the PIDs say (a lock handed on to a child is news).
        assert!(!same_holder(&look(None, &[7]), &look(None, &[8])));
        assert!(same_holder(&look(None, &[7]), &look(None, &[7])));
        // A record where there was none is news too.
        assert!(!same_holder(&look(None, &[7]), &look(Some("a"), &[7])));
    }
}
