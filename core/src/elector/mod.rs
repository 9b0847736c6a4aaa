//! [`Elector`]: leader election on a lease, the loop every runtime shares.
//! Campaign (wait for the lease, woken by its release), lead (the work runs
//! with a cancellation that fires on loss or on `stop`), step down (release,
//! which wakes the next campaigner at once), and campaign again, with a
//! bounded back-off only after errors.
//!
//! Leadership is per process, like the lease: two electors of one process
//! on one target both lead (one lease, shared).
//!
//! ```no_run
//! use sidelease::elector::{Elector, Outcome};
//! use sidelease::Options;
//!
//! let elector = Elector::new("app.db", &Options::new())?;
//! while let Some(term) = elector.campaign()? {
//!     // the leader's work; it must end once term.cancelled() is Some
//!     term.step_down(Outcome::Returned);
//! }
//! # Ok::<(), sidelease::Error>(())
//! ```

mod term;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::backend::Engine;
use crate::error::{Contention, Error, Result};
use crate::options::{Options, Wait};
use crate::pending::Pending;
use crate::platform::notify::CancelToken;

pub use term::{Outcome, Term};

/// The back-off after an error (a server that refuses connections, work
/// that failed or ended at once) doubles from this up to `BACKOFF_MAX`; a
/// normal hand-off never waits.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest back-off after errors.
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Work that returns sooner than this counts as a failure for the
/// back-off: work that ends at once would otherwise be elected hundreds of
/// times a second.
pub const MIN_TERM: Duration = Duration::from_secs(1);

/// How often a predecessor of this machine that a new term waits out is
/// looked at again, to end the wait once it has exited (a few reads of
/// `/proc`).
const LOOK_AGAIN: Duration = Duration::from_millis(5);

/// Why a term ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The lease was lost (the reason, naming the other holder if known).
    Lost(String),
    /// The work returned: the elector stepped down (released the lease).
    Released,
    /// [`Elector::stop`] was called.
    Stopped,
    /// The work failed (its error, as the binding tells it).
    Failed(String),
}

impl Ended {
    /// "lost", "released", "stopped" or "error".
    pub fn kind(&self) -> &'static str {
        match self {
            Ended::Lost(_) => "lost",
            Ended::Released => "released",
            Ended::Stopped => "stopped",
            Ended::Failed(_) => "error",
        }
    }

    /// The reason of a loss or the error of a failure; empty otherwise.
    pub fn detail(&self) -> &str {
        match self {
            Ended::Lost(s) | Ended::Failed(s) => s,
            Ended::Released | Ended::Stopped => "",
        }
    }
}

/// What an elector tells its listeners, as it happens.
#[derive(Debug)]
pub enum Event<'a> {
    /// Campaigning, and the lease is held by this holder: once when the
    /// wait starts and again whenever the holder changes.
    Waiting(&'a Contention),
    /// This process leads now.
    Elected {
        /// The term's generation (its lease's fencing token); `None` when
        /// the lease has none (a read-only lease file).
        generation: Option<u64>,
    },
    /// The lease was lost while leading (told from the watcher thread; the
    /// work's cancellation has fired).
    Lost {
        /// What happened, naming the other holder when there is one.
        reason: &'a str,
    },
    /// The term is over and the lease released.
    SteppedDown {
        /// Why the term ended.
        why: &'a Ended,
    },
    /// Campaigning failed; the next attempt is in `retry_in`.
    Error {
        /// What failed.
        error: &'a Error,
        /// The back-off before the next attempt ([`backoff`]).
        retry_in: Duration,
    },
    /// Stopped: no campaign runs and none will.
    Stopped,
}

/// What a service exports about its elector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether this elector leads now (a term is running).
    pub leading: bool,
    /// The generation of the current term (of the last one when not
    /// leading); `None` before the first, or when the lease has none.
    pub generation: Option<u64>,
    /// When the current term began; `None` when not leading.
    pub leader_since: Option<SystemTime>,
    /// Terms begun so far.
    pub elections: u64,
    /// Terms that ended because the lease was lost.
    pub losses: u64,
    /// Errors in a row (campaigns that failed, terms that failed or ended
    /// at once); the back-off grows with it.
    pub failures: u32,
}

type Listener = Arc<dyn Fn(&Event) + Send + Sync>;

pub(crate) struct Inner {
    state: Mutex<State>,
    listeners: Mutex<Vec<Listener>>,
    stop: CancelToken,
}

#[derive(Default)]
struct State {
    snapshot: Snapshot,
    /// A campaign or a term is in progress (one at a time).
    busy: bool,
    /// The current term's cancellation and the reason it fired.
    term: Option<term::Cancel>,
    told_stopped: bool,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Listeners are called with no lock held: one may call `snapshot` or
    /// `stop`.
    fn emit(&self, e: &Event) {
        let listeners = self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for l in listeners {
            l(e);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.is_cancelled()
    }

    fn tell_stopped(&self) {
        let first = !std::mem::replace(&mut self.state().told_stopped, true);
        if first {
            self.emit(&Event::Stopped);
        }
    }
}

/// Campaigns for one lease, again and again, until stopped.
pub struct Elector {
    target: PathBuf,
    engine: Engine,
    options: Options,
    inner: Arc<Inner>,
}

impl Elector {
    /// An elector for `target` (a database path or a PostgreSQL URL).
    /// `options.wait` is ignored: a campaign waits until elected or
    /// stopped.
    pub fn new(target: impl AsRef<Path>, options: &Options) -> Result<Elector> {
        let options = options.clone().wait(Wait::Forever);
        options.validate()?;
        let target = target.as_ref().to_path_buf();
        if target.as_os_str().is_empty() {
            return Err(Error::invalid("target", "is empty"));
        }
        let engine = Engine::of(&target)?;
        let stop = CancelToken::new()
            .map_err(|e| Error::io("CancelToken::new", Path::new(&Engine::shown(&target)), e))?;
        Ok(Elector {
            target,
            engine,
            options,
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                listeners: Mutex::new(Vec::new()),
                stop,
            }),
        })
    }

    /// Call `f` on every event, from the thread it happens on (the
    /// campaigning thread, or the lease's watcher thread for a loss).
    /// Keep it short and never block in it.
    pub fn on_event(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        self.inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(f));
    }

    /// Wait until elected (`Some`), or stopped (`None`). An error the
    /// elector can retry (a server that refuses connections, a file system
    /// error) is told as [`Event::Error`] and retried after the back-off;
    /// an invalid argument, an unsupported file system or a lease file's
    /// path that cannot name a file (a missing parent) is returned. A
    /// back-off left by the previous term (work that failed) is slept
    /// first. One campaign or term at a time: a second is an invalid
    /// argument.
    pub fn campaign(&self) -> Result<Option<Term>> {
        {
            let mut st = self.inner.state();
            if st.busy {
                return Err(Error::invalid(
                    "elector",
                    "is already campaigning or leading (one term at a time)",
                ));
            }
            st.busy = true;
        }
        let won = self.campaign_inner();
        if !matches!(won, Ok(Some(_))) {
            self.inner.state().busy = false;
        }
        if matches!(won, Ok(None)) {
            self.inner.tell_stopped();
        }
        won
    }

    fn campaign_inner(&self) -> Result<Option<Term>> {
        let inner = &self.inner;
        loop {
            let failures = inner.state().snapshot.failures;
            if failures > 0 && self.pause(backoff(failures)) {
                return Ok(None);
            }
            if inner.stopped() {
                return Ok(None);
            }
            let waited = Pending::new(&self.target, &self.options).and_then(|p| {
                p.wait_reporting(Some(&inner.stop), |c| inner.emit(&Event::Waiting(c)))
            });
            let lease = match waited {
                Ok(l) => l,
                Err(Error::Cancelled { .. }) => return Ok(None),
                Err(e) if fatal(&e, self.engine) => return Err(e),
                Err(e) => {
                    let failures = {
                        let mut st = inner.state();
                        st.snapshot.failures = st.snapshot.failures.saturating_add(1);
                        st.snapshot.failures
                    };
                    inner.emit(&Event::Error {
                        error: &e,
                        retry_in: backoff(failures),
                    });
                    continue;
                }
            };
            if lease.predecessor_bound().is_some() {
                // The predecessor did not release: its session may have been
                // ended under it, and it learns that only from its socket or
                // once its bound passes. Its work may run until then, unless
                // it has ended: one of this machine on its way out is looked
                // at again every few ms, and let go of once it has exited.
                let lost = lease.lost_fd().ok();
                while let Some(bound) = lease.predecessor_bound() {
                    let look = match lease.predecessor_may_end() {
                        true => bound.min(LOOK_AGAIN),
                        false => bound,
                    };
                    if self.pause_or(look, lost) {
                        break;
                    }
                }
                if lease.ensure_held().is_err() {
                    let _ = lease.release();
                    continue;
                }
            }
            if inner.stopped() {
                // Stopped in the moment it was elected: nothing was led.
                let _ = lease.release();
                return Ok(None);
            }
            return Term::begin(lease, inner.clone()).map(Some);
        }
    }

    /// Sleep up to `d`; true if stopped meanwhile.
    fn pause(&self, d: Duration) -> bool {
        self.pause_or(d, None);
        self.inner.stopped()
    }

    /// Sleep up to `d`, or until stopped or `also` turns readable (then
    /// true).
    fn pause_or(&self, d: Duration, also: Option<std::os::fd::BorrowedFd<'_>>) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let deadline = std::time::Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.inner.stopped() {
                return true;
            }
            if left.is_zero() {
                return false;
            }
            let ts = Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: left.subsec_nanos() as _,
            };
            let mut fds = [
                PollFd::from_borrowed_fd(self.inner.stop.fd(), PollFlags::IN),
                PollFd::from_borrowed_fd(also.unwrap_or(self.inner.stop.fd()), PollFlags::IN),
            ];
            if poll(&mut fds, Some(&ts)).is_ok() && !fds[1].revents().is_empty() {
                return true;
            }
        }
    }

    /// Stop: a campaign in progress returns `None`, the current term's
    /// cancellation fires (its work must end; it then steps down), and no
    /// campaign starts again. Idempotent; callable from any thread and from
    /// a listener.
    pub fn stop(&self) {
        self.inner.stop.cancel();
        let term = self.inner.state().term.clone();
        if let Some(t) = term {
            t.fire(Ended::Stopped);
        }
        if !self.inner.state().busy {
            self.inner.tell_stopped();
        }
    }

    /// Whether [`Elector::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped()
    }

    /// Readable once stopped (for event loops).
    pub fn stop_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.stop.fd()
    }

    /// Its counters and current term, for a service's status.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.state().snapshot.clone()
    }

    /// The target as given (a PostgreSQL URL's password masked), for logs.
    pub fn target(&self) -> String {
        Engine::shown(&self.target)
    }

    /// The whole loop, for a thread of its own: campaign, run `work` while
    /// leading, step down with what it returned, again, until stopped.
    /// `work` must return once `term.cancelled()` is `Some` (wait on
    /// [`Term::wait_cancelled`] or [`Term::cancel_fd`]). Returns once
    /// stopped, or with an error campaigning cannot retry.
    pub fn run(
        &self,
        mut work: impl FnMut(&Term) -> std::result::Result<(), String>,
    ) -> Result<()> {
        while let Some(term) = self.campaign()? {
            let outcome = match work(&term) {
                Ok(()) => Outcome::Returned,
                Err(e) => Outcome::Failed(e),
            };
            term.step_down(outcome);
        }
        Ok(())
    }
}

/// A dropped elector is stopped: its term's work is cancelled too (the term
/// itself outlives it and still steps down).
impl Drop for Elector {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Errors no retry can mend: a bad argument, an unsupported file system,
/// and a lease file's path that cannot name a file (a missing or
/// non-directory parent, a name too long) — a typo, which a retry would
/// hide behind error events. A PostgreSQL target's errors are its server's
/// and are retried.
fn fatal(e: &Error, engine: Engine) -> bool {
    match e {
        Error::InvalidArgument { .. } | Error::UnsupportedFilesystem { .. } => true,
        Error::Io { source, .. } if engine == Engine::File => matches!(
            source.raw_os_error(),
            Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP)
        ),
        _ => false,
    }
}

/// The back-off after `failures` errors in a row: [`BACKOFF_FIRST`] for the
/// first, doubling with each further one, at most [`BACKOFF_MAX`].
pub fn backoff(failures: u32) -> Duration {
    BACKOFF_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}
