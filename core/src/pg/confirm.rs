//! How sure a held PostgreSQL lease is: when the server last confirmed its
//! session, the bound past which it counts as lost, and why a session ended.

use std::time::Duration;

use super::conn::{describe, heartbeat, Conn};

/// When the server last confirmed the session, and the bound past which the
/// holder counts the lease as lost. A confirmation is dated when its
/// statement was sent (the server's answer was true at some moment after
/// that), and once the bound has passed nothing revives the lease.
pub(crate) struct Confirmed {
    at: std::sync::atomic::AtomicU64,
    over: std::sync::atomic::AtomicBool,
    bound: Duration,
}

impl Confirmed {
    /// Milliseconds on a clock that counts suspended time too (a paused VM
    /// must find its bound passed).
    pub(crate) fn clock() -> u64 {
        crate::platform::clock::boot_ms()
    }

    pub(crate) fn new(bound: Duration, sent: u64) -> Confirmed {
        Confirmed {
            at: sent.into(),
            over: false.into(),
            bound,
        }
    }

    /// The server answered a statement sent at `sent`; `false` if the
    /// bound had passed already (the answer changes nothing then).
    pub(super) fn answered(&self, sent: u64) -> bool {
        if self.expired() {
            return false;
        }
        self.at.fetch_max(sent, std::sync::atomic::Ordering::AcqRel);
        true
    }

    /// Whether it was confirmed by a statement sent at `sent` or later,
    /// and is not lost.
    pub(super) fn since(&self, sent: u64) -> bool {
        self.at.load(std::sync::atomic::Ordering::Acquire) >= sent && !self.expired()
    }

    /// How long since the last confirmation.
    pub(crate) fn age(&self) -> Duration {
        let at = self.at.load(std::sync::atomic::Ordering::Acquire);
        Duration::from_millis(Self::clock().saturating_sub(at))
    }

    pub(crate) fn bound(&self) -> Duration {
        self.bound
    }

    /// Whether the bound has passed since the last confirmation; once it
    /// has, for good.
    pub(crate) fn expired(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.over.load(Ordering::Acquire) {
            return true;
        }
        if self.age() > self.bound {
            self.over.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// How often the holder asks: four times within the bound, so one slow
    /// answer does not lose the lease.
    pub(super) fn interval(&self) -> Duration {
        self.bound / 4
    }
}

/// Why a held session ended.
pub(super) enum Beat {
    Lost(String),
    /// A statement failed because the connection closed.
    Closed(String),
    /// The driver's task ended.
    Ended(
        std::result::Result<std::result::Result<(), tokio_postgres::Error>, tokio::task::JoinError>,
    ),
}

/// How long a loss waits for the server's reason after a statement found
/// the connection closed.
pub(super) const ENDED_GRACE: Duration = Duration::from_millis(250);

pub(super) fn ended(
    end: std::result::Result<
        std::result::Result<(), tokio_postgres::Error>,
        tokio::task::JoinError,
    >,
) -> String {
    match end {
        Ok(Err(e)) => format!("the server ended the lease's session: {}", describe(&e)),
        _ => "the server closed the lease's connection".to_owned(),
    }
}

/// Why a lease whose bound passed without the server's answer is lost.
pub(super) fn silent(bound: Duration) -> String {
    format!(
        "the server did not confirm the lease's session within {:.1}s (network cut, server \
         stalled or restarted, or this process paused); it may hold the lease no longer",
        bound.as_secs_f64()
    )
}

/// One heartbeat: the server must answer, from this connection's own
/// session, before the bound passes; `Err` says why the lease is lost.
pub(crate) async fn beat(
    conn: &Conn,
    pid: i32,
    confirmed: &Confirmed,
) -> std::result::Result<(), Beat> {
    if confirmed.expired() {
        return Err(Beat::Lost(silent(confirmed.bound())));
    }
    let sent = Confirmed::clock();
    let left = confirmed.bound().saturating_sub(confirmed.age());
    match tokio::time::timeout(left, heartbeat(&conn.client, &conn.session)).await {
        Ok(Ok((now, true))) if now == pid => {
            if confirmed.answered(sent) {
                Ok(())
            } else {
                Err(Beat::Lost(silent(confirmed.bound())))
            }
        }
        Ok(Ok((now, _))) => Err(Beat::Lost(format!(
            "the heartbeat ran in another server session (pid {pid}, then {now}): a \
             transaction- or statement-mode pooler sits between this process and the server, \
             and the lock stayed with the old session"
        ))),
        Ok(Err(e)) if e.is_closed() => Err(Beat::Closed(format!(
            "the lease's session failed: {}",
            describe(&e)
        ))),
        Ok(Err(e)) => Err(Beat::Lost(format!(
            "the lease's session failed: {}",
            describe(&e)
        ))),
        Err(_) => Err(Beat::Lost(silent(confirmed.bound()))),
    }
}
