//! sidelease_elector and sidelease_term: the core's elector. A thread
//! campaigns (blocking, woken by the lease's release), leads while the
//! term's cancel descriptor is not readable, and steps down; another thread
//! may stop the elector at any time.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use sidelease_core::elector::{Elector, Ended, Event, Outcome, Term};
use sidelease_core::Options;

use crate::error::{sidelease_status, FfiError};
use crate::guard::{guard, non_null, non_null_mut, put};
use crate::lease::sidelease_lease;
use crate::options::sidelease_options;
use crate::strings::{give, path_arg, str_arg};

/// Campaigns for one lease again and again, until stopped.
pub struct sidelease_elector {
    inner: Elector,
}

/// One term of leadership, from sidelease_elector_campaign() to
/// sidelease_term_step_down().
pub struct sidelease_term {
    inner: Mutex<Option<Term>>,
    /// The caller's handle on the term's lease (another handle on it).
    lease: sidelease_lease,
    ended: Mutex<Option<sidelease_term_state>>,
}

/// Where a term is: leading, or why it must end or ended.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sidelease_term_state {
    /// The work may go on.
    SIDELEASE_TERM_LEADING = 0,
    /// The lease was lost.
    SIDELEASE_TERM_LOST = 1,
    /// The work returned; the lease was released.
    SIDELEASE_TERM_RELEASED = 2,
    /// sidelease_elector_stop() was called.
    SIDELEASE_TERM_STOPPED = 3,
    /// The work failed.
    SIDELEASE_TERM_FAILED = 4,
}

/// What an elector tells its callback.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sidelease_elector_event {
    /// Campaigning while another holds it (once at the start and whenever
    /// the holder changes): detail is the holder, as the in-use message says.
    SIDELEASE_ELECTOR_WAITING = 0,
    /// Elected: detail is the generation in decimal, or "".
    SIDELEASE_ELECTOR_ELECTED = 1,
    /// The lease was lost while leading (from the watcher thread): the reason.
    SIDELEASE_ELECTOR_LOST = 2,
    /// The term ended: "lost", "released", "stopped" or "error", then ": "
    /// and the detail when there is one.
    SIDELEASE_ELECTOR_STEPPED_DOWN = 3,
    /// A campaign failed and is retried after the back-off: the error.
    SIDELEASE_ELECTOR_ERROR = 4,
    /// Stopped: no campaign runs and none will. Detail "".
    SIDELEASE_ELECTOR_STOPPED = 5,
}

/// Called for each event with a NUL-terminated detail valid for the call.
pub type sidelease_elector_callback = Option<
    unsafe extern "C" fn(
        event: sidelease_elector_event,
        detail: *const c_char,
        user_data: *mut c_void,
    ),
>;

fn state_of(e: &Ended) -> sidelease_term_state {
    match e {
        Ended::Lost(_) => sidelease_term_state::SIDELEASE_TERM_LOST,
        Ended::Released => sidelease_term_state::SIDELEASE_TERM_RELEASED,
        Ended::Stopped => sidelease_term_state::SIDELEASE_TERM_STOPPED,
        Ended::Failed(_) => sidelease_term_state::SIDELEASE_TERM_FAILED,
    }
}

fn event_of(e: &Event) -> (sidelease_elector_event, String) {
    use sidelease_elector_event::*;
    match e {
        Event::Waiting(c) => (SIDELEASE_ELECTOR_WAITING, c.to_string()),
        Event::Elected { generation } => (
            SIDELEASE_ELECTOR_ELECTED,
            generation.map(|g| g.to_string()).unwrap_or_default(),
        ),
        Event::Lost { reason } => (SIDELEASE_ELECTOR_LOST, reason.to_string()),
        Event::SteppedDown { why } if why.detail().is_empty() => {
            (SIDELEASE_ELECTOR_STEPPED_DOWN, why.kind().to_owned())
        }
        Event::SteppedDown { why } => (
            SIDELEASE_ELECTOR_STEPPED_DOWN,
            format!("{}: {}", why.kind(), why.detail()),
        ),
        Event::Error { error, .. } => (SIDELEASE_ELECTOR_ERROR, error.to_string()),
        Event::Stopped => (SIDELEASE_ELECTOR_STOPPED, String::new()),
    }
}

/// Make an elector for `target` (as sidelease_acquire() takes it). `opts`
/// may be NULL; its timeout is ignored (a campaign waits until elected or
/// stopped). Free it with sidelease_elector_free().
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_INVALID_ARGUMENT,
/// SIDELEASE_ERR_NULL_ARGUMENT or SIDELEASE_ERR_IO.
#[no_mangle]
pub unsafe extern "C" fn sidelease_elector_new(
    target: *const c_char,
    opts: *const sidelease_options,
    out: *mut *mut sidelease_elector,
) -> sidelease_status {
    guard(|| {
        let target = path_arg(target, "target")?;
        non_null_mut(out, "out")?;
        let defaults;
        // SAFETY: NULL or a live options object, as documented.
        let opts = match unsafe { opts.as_ref() } {
            Some(o) => &o.inner,
            None => {
                defaults = Options::new().runtime("c");
                &defaults
            }
        };
        let inner = Elector::new(target, opts)?;
        put(out, Box::into_raw(Box::new(sidelease_elector { inner })));
        Ok(())
    })
}

struct UserData(*mut c_void);
// SAFETY: the caller promises (as documented) that `user_data` may be used
// from the threads events happen on.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

/// Call `callback(event, detail, user_data)` on every event, on the thread
/// it happens on: the campaigning thread, the one stepping down or
/// stopping, or the library's watcher thread for a loss. Keep it short,
/// never block in it, and never free the elector or a term in it.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_elector_on_event(
    elector: *const sidelease_elector,
    callback: sidelease_elector_callback,
    user_data: *mut c_void,
) -> sidelease_status {
    guard(|| {
        let e = &non_null(elector, "elector")?.inner;
        let cb = callback.ok_or(FfiError::Null("callback"))?;
        let data = UserData(user_data);
        e.on_event(move |ev| {
            let (kind, detail) = event_of(ev);
            let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
            let data = &data;
            // SAFETY: a C function pointer given by the caller, called with
            // a NUL-terminated string valid for the call.
            unsafe { cb(kind, detail.as_ptr(), data.0) };
        });
        Ok(())
    })
}

/// Block until elected (`*out` receives a term) or stopped (`*out`
/// receives NULL). Errors that a retry may mend (a server that refuses
/// connections) are told as SIDELEASE_ELECTOR_ERROR events and retried
/// after the back-off. One campaign or term at a time per elector.
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_INVALID_ARGUMENT (a campaign or term
/// in progress), SIDELEASE_ERR_UNSUPPORTED_FS or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_elector_campaign(
    elector: *const sidelease_elector,
    out: *mut *mut sidelease_term,
) -> sidelease_status {
    guard(|| {
        let e = &non_null(elector, "elector")?.inner;
        non_null_mut(out, "out")?;
        let term = match e.campaign()? {
            Some(t) => t,
            None => {
                put(out, std::ptr::null_mut());
                return Ok(());
            }
        };
        let lease = sidelease_lease {
            inner: term.lease().try_clone()?,
        };
        let t = sidelease_term {
            inner: Mutex::new(Some(term)),
            lease,
            ended: Mutex::new(None),
        };
        put(out, Box::into_raw(Box::new(t)));
        Ok(())
    })
}

/// Stop: a campaign returns with NULL, the current term's cancel
/// descriptor turns readable (its work must end, then step down), and no
/// campaign starts again. Safe from any thread, and idempotent.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_elector_stop(
    elector: *const sidelease_elector,
) -> sidelease_status {
    guard(|| {
        non_null(elector, "elector")?.inner.stop();
        Ok(())
    })
}

/// The elector's snapshot as JSON: {"leading", "generation",
/// "leader_since" (Unix seconds or null), "elections", "losses",
/// "failures"}. Free `*out` with sidelease_string_free().
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_elector_snapshot_json(
    elector: *const sidelease_elector,
    out: *mut *mut c_char,
) -> sidelease_status {
    guard(|| {
        let s = non_null(elector, "elector")?.inner.snapshot();
        non_null_mut(out, "out")?;
        let since = s
            .leader_since
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64());
        let json = serde_json::json!({
            "leading": s.leading,
            "generation": s.generation,
            "leader_since": since,
            "elections": s.elections,
            "losses": s.losses,
            "failures": s.failures,
        });
        put(out, give(json.to_string()));
        Ok(())
    })
}

/// Free an elector, stopping it. It must outlive every campaign; a term
/// may outlive it. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn sidelease_elector_free(elector: *mut sidelease_elector) {
    if !elector.is_null() {
        let _ = std::panic::catch_unwind(|| {
            // SAFETY: created by sidelease_elector_new.
            drop(unsafe { Box::from_raw(elector) })
        });
    }
}

/// The term's lease (for its generation, record and checks), owned by the
/// term: valid until sidelease_term_free(); do not release or free it.
/// NULL for a NULL term.
#[no_mangle]
pub unsafe extern "C" fn sidelease_term_lease(
    term: *const sidelease_term,
) -> *const sidelease_lease {
    // SAFETY: NULL or a live term.
    match unsafe { term.as_ref() } {
        Some(t) => &t.lease,
        None => std::ptr::null(),
    }
}

/// A descriptor that turns readable once the work must end (lost or
/// stopped), for poll(). Owned by the term: do not read or close it; valid
/// until sidelease_term_step_down().
///
/// Returns SIDELEASE_OK, SIDELEASE_ERR_NULL_ARGUMENT or
/// SIDELEASE_ERR_INVALID_ARGUMENT (the term stepped down).
#[no_mangle]
pub unsafe extern "C" fn sidelease_term_cancel_fd(
    term: *const sidelease_term,
    out: *mut c_int,
) -> sidelease_status {
    guard(|| {
        let t = non_null(term, "term")?;
        non_null_mut(out, "out")?;
        let g = t.inner.lock().unwrap_or_else(|e| e.into_inner());
        let term = g
            .as_ref()
            .ok_or_else(|| FfiError::Invalid("term", "the term stepped down".into()))?;
        put(out, term.cancel_fd().as_raw_fd());
        Ok(())
    })
}

/// `*out` receives SIDELEASE_TERM_LEADING while the work may go on,
/// SIDELEASE_TERM_LOST or _STOPPED once it must end, and after
/// sidelease_term_step_down() why the term ended.
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_term_check(
    term: *const sidelease_term,
    out: *mut sidelease_term_state,
) -> sidelease_status {
    guard(|| {
        let t = non_null(term, "term")?;
        non_null_mut(out, "out")?;
        let ended = *t.ended.lock().unwrap_or_else(|e| e.into_inner());
        let state = match ended {
            Some(s) => s,
            None => {
                let g = t.inner.lock().unwrap_or_else(|e| e.into_inner());
                match g.as_ref().and_then(|term| term.cancelled()) {
                    Some(why) => state_of(&why),
                    None => sidelease_term_state::SIDELEASE_TERM_LEADING,
                }
            }
        };
        put(out, state);
        Ok(())
    })
}

/// End the term once its work ended: release the lease (the next
/// campaigner is woken at once). `error` is NULL when the work returned, or
/// what made it fail (failed work backs the next campaign off, as does work
/// that returned within 1 s). `*out` (may be NULL) receives why the term
/// ended: a loss or a stop wins over the work's outcome. A second call
/// answers the first's. The term stays allocated until sidelease_term_free().
///
/// Returns SIDELEASE_OK or SIDELEASE_ERR_NULL_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn sidelease_term_step_down(
    term: *const sidelease_term,
    error: *const c_char,
    out: *mut sidelease_term_state,
) -> sidelease_status {
    guard(|| {
        let t = non_null(term, "term")?;
        let outcome = if error.is_null() {
            Outcome::Returned
        } else {
            Outcome::Failed(str_arg(error, "error")?.to_owned())
        };
        let state = step_down(t, outcome);
        if !out.is_null() {
            put(out, state);
        }
        Ok(())
    })
}

fn step_down(t: &sidelease_term, outcome: Outcome) -> sidelease_term_state {
    let taken = t.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
    let mut ended = t.ended.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(term) = taken {
        // The caller's handle first, so the term's is the lease's last.
        let _ = t.lease.inner.release();
        *ended = Some(state_of(&term.step_down(outcome)));
    }
    ended.unwrap_or(sidelease_term_state::SIDELEASE_TERM_RELEASED)
}

/// Free a term, stepping down first (as if the work returned) if it did
/// not. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn sidelease_term_free(term: *mut sidelease_term) {
    if !term.is_null() {
        let _ = std::panic::catch_unwind(|| {
            // SAFETY: created by sidelease_elector_campaign.
            let t = unsafe { Box::from_raw(term) };
            step_down(&t, Outcome::Returned);
        });
    }
}
