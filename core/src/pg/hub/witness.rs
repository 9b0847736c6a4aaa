//! What keeps one lease's slow statement from costing the others on the
//! shared session. Every statement there waits behind the one before it,
//! the heartbeat included, so a statement that overruns its share of the
//! tightest bound (a slow trigger, a commit waiting for a synchronous
//! standby that is gone) would leave every other lease unconfirmed. Past
//! that share the server is asked to end the statement, and meanwhile a
//! witness, a connection of its own (opened at the first such stall, kept
//! while the session lasts), confirms the others from `pg_locks`: the
//! shared session's backend (its PID and start time) still holds their
//! advisory locks and is running a statement. A trigger that ignores the
//! cancel, or a heartbeat stuck behind it, then costs the others nothing
//! for as long as the server keeps their locks.
//!
//! Why that cannot outlast the server's own hold: the witness vouches only
//! for a backend it sees holding the locks, at a moment after each
//! confirmation's date. The server frees them early only when it gives
//! the holder up: an operator ends the session (the documented window),
//! or its keepalives find the holder silent (5 s after the last packet it
//! heard, at least; a running statement's backend checks its client each
//! second). So each time the witness asks, it also sends a statement on
//! the shared session (answered, and dropped, once the session is free):
//! a holder whose packets stop reaching the server then has one
//! unacknowledged within every interval (a second at most), and its own
//! socket (`TCP_USER_TIMEOUT`, 3 s) fails first, losing every lease on it
//! at once. An idle backend is never vouched for: the heartbeat did not
//! reach it. Only on a session connected directly over TCP: through a
//! pooler, the server session behind a client that went silent may be
//! handed on, its locks with it (and a Unix socket cannot tell a pooler
//! from the server).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{error::Elapsed, timeout, Instant};
use tokio_postgres::types::Type;

use super::super::confirm::Confirmed;
use super::super::conn::{cancel_request, open_bare, Conn, CONNECT_TIMEOUT};
use super::super::session::HEARTBEAT_DEADLINE;
use super::super::target::Target;
use super::Hub;

/// The advisory locks (whole 64-bit keys) a backend holds, asked of the
/// server by another session: only while that backend is the one that
/// started at `$2` (microseconds since the epoch: a PID the server reused
/// is another session) and is running a statement.
const HELD_BY: &str = "SELECT (l.classid::int8 << 32) | l.objid::int8 FROM pg_locks l \
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.pid = $1 \
     AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = $1 \
     AND (extract(epoch FROM a.backend_start) * 1000000)::int8 = $2 AND a.state = 'active')";

/// When a backend started, as `HELD_BY` compares it (a number: the text of
/// a time depends on each session's `DateStyle` and `TimeZone`).
pub(super) const BORN: &str =
    "(SELECT (extract(epoch FROM backend_start) * 1000000)::int8 FROM pg_stat_activity \
     WHERE pid = pg_backend_pid())";

/// The witness's connection, once opened.
pub(super) type Witness = tokio::sync::Mutex<Option<Conn>>;

impl Hub {
    /// A quarter of the tightest bound of the leases here (`also`
    /// included), at most `HEARTBEAT_DEADLINE`: how long one statement may
    /// hold up the others before they are confirmed another way.
    pub(super) fn share(&self, also: Option<Duration>) -> Duration {
        let tightest = self
            .members
            .values()
            .map(|m| m.confirmed.bound())
            .chain(also)
            .min()
            .unwrap_or(self.first.confirm_within);
        (tightest / 4).min(HEARTBEAT_DEADLINE)
    }

    /// Wait for one lease's statements on this session (`t`'s: its bound
    /// counts), at most a quarter of the tightest bound here. Past that (a
    /// slow trigger, a commit waiting for a synchronous standby that is
    /// gone) the server is asked to end them, the request delivered before
    /// anything else is sent, and the answer waited for up to
    /// `HEARTBEAT_DEADLINE` more, while the witness confirms the others.
    /// Every statement of the session but the heartbeat goes through here,
    /// and each is one that may be ended and asked again.
    pub(super) async fn bounded<F: std::future::Future>(
        &self,
        t: &Arc<Target>,
        answer: F,
    ) -> Result<F::Output, Elapsed> {
        let share = self.share(Some(t.confirm_within));
        tokio::pin!(answer);
        if let Ok(r) = timeout(share, &mut answer).await {
            return Ok(r);
        }
        let ended = async {
            // Spawned, so that a request slower than the share still goes.
            let _ = timeout(share, tokio::spawn(cancel_request(t, &self.conn))).await;
            let answered = timeout(HEARTBEAT_DEADLINE, &mut answer).await;
            // Had they ended by themselves as the request came, it could
            // end the next statement: one of no consequence takes it when
            // it lands soon enough (the server takes the request, then
            // acts on it a moment later), and the statements after treat a
            // cancel they meet as a statement to ask again (a heartbeat
            // unanswered, a release's row written on a side connection, a
            // given-back row next time).
            if answered.is_ok() {
                let absorb = self.conn.client.simple_query("SELECT 1");
                let _ = timeout(HEARTBEAT_DEADLINE, absorb).await;
            }
            answered
        };
        tokio::select! {
            biased;
            r = ended => r,
            () = self.witness(None) => unreachable!("a witness without a limit never ends"),
        }
    }

    /// Confirm the leases here from the witness once per interval, for as
    /// long as it is polled. With `until`, it ends then, or before once
    /// the tightest lease's bound has passed all the same (a witness that
    /// cannot connect or see the locks confirms nothing); without, never.
    pub(super) async fn witness(&self, until: Option<Instant>) {
        let gone = async {
            let Some(until) = until else {
                return std::future::pending::<()>().await;
            };
            loop {
                if self.members.values().any(|m| m.confirmed.expired()) {
                    return;
                }
                // Past the tightest bound on the millisecond clock the
                // ages are read on, so an unconfirmed lease is found
                // expired.
                let at = self
                    .members
                    .values()
                    .map(|m| m.confirmed.bound().saturating_sub(m.confirmed.age()))
                    .min()
                    .map_or(until, |left| {
                        (Instant::now() + left + Duration::from_millis(2)).min(until)
                    });
                tokio::time::sleep_until(at).await;
                if Instant::now() >= until {
                    return;
                }
            }
        };
        tokio::pin!(gone);
        tokio::select! {
            biased;
            () = &mut gone => {}
            () = self.confirm_aside() => gone.await,
        }
    }

    /// The witness itself: ends only when it cannot go on (no lease to
    /// confirm, no connection, a question unanswered on two connections),
    /// having confirmed what it could.
    async fn confirm_aside(&self) {
        let Some(born) = self.born else {
            return;
        };
        if self.members.is_empty() {
            return;
        }
        let mut kept = self.witness.lock().await;
        let mut opened = 0;
        loop {
            // One kept from an earlier stall that the server ended since
            // (an operator, a restart, a failed question) is opened again:
            // at most twice per stall.
            if kept.as_ref().is_none_or(|c| c.client.is_closed()) {
                if opened == 2 {
                    return;
                }
                opened += 1;
                *kept = self.open_witness().await;
            }
            let Some(conn) = kept.as_ref() else {
                return;
            };
            let sent = Confirmed::clock();
            let next = Instant::now() + self.interval();
            self.ping();
            let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
                [(&self.pid, Type::INT4), (&born, Type::INT8)];
            let asked = timeout(
                HEARTBEAT_DEADLINE,
                conn.client.query_typed(HELD_BY, &params),
            );
            match asked.await {
                Ok(Ok(rows)) => {
                    let keys: HashSet<i64> =
                        rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
                    for (key, m) in &self.members {
                        if keys.contains(key) {
                            m.confirmed.answered(sent);
                        }
                    }
                    tokio::time::sleep_until(next).await;
                }
                // Opened again (see above), or given up on.
                _ => {
                    if let Some(c) = kept.take() {
                        c.task.abort();
                    }
                }
            }
        }
    }

    /// The witness's connection: named for its process, and exempt from
    /// the server's idle timeout (it waits for the next stall).
    async fn open_witness(&self) -> Option<Conn> {
        let name = super::app_name("witness");
        let opened = async {
            let c = open_bare(&self.first, &name).await.ok()?;
            c.client
                .batch_execute("SET idle_session_timeout = 0; SET statement_timeout = 0")
                .await
                .ok()?;
            Some(c)
        };
        timeout(CONNECT_TIMEOUT, opened).await.ok().flatten()
    }

    /// A statement on the shared session, sent and not waited for: while
    /// another holds the session up, it keeps this end's packets going to
    /// the server (see the module's comment).
    fn ping(&self) {
        let mut sent = std::pin::pin!(self.conn.client.simple_query(""));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // The first poll hands it to the connection; its answer is dropped.
        let _ = sent.as_mut().poll(&mut cx);
    }

    /// Whether every lease here was confirmed by a question sent at `sent`
    /// or later (by the witness, the heartbeat being held up).
    pub(super) fn witnessed_since(&self, sent: u64) -> bool {
        !self.members.is_empty() && self.members.values().all(|m| m.confirmed.since(sent))
    }
}
