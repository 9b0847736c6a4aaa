//! What keeps one lease's slow statement from costing the others on the
//! shared session. Every statement there waits behind the one before it,
//! the heartbeat included, so a statement that overruns its share of the
//! tightest bound (a slow trigger, a commit waiting for a synchronous
//! standby that is gone) would leave every other lease unconfirmed. Past
//! that share the server is asked to end the statement, and meanwhile a
//! witness, a connection of its own, confirms the others from `pg_locks`:
//! the shared session's backend (its PID and start time) still holds
//! their advisory locks and is running a statement. A trigger that ignores
//! the cancel, or a heartbeat stuck behind it, then costs the others
//! nothing for as long as the server keeps their locks. Only on a session
//! connected directly: through a pooler, the server session behind a
//! client that went silent may be handed on, its locks with it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{error::Elapsed, timeout, Instant};
use tokio_postgres::types::Type;

use super::super::confirm::Confirmed;
use super::super::conn::{cancel_request, open_bare, CONNECT_TIMEOUT};
use super::super::session::HEARTBEAT_DEADLINE;
use super::super::target::Target;
use super::Hub;

/// The advisory locks (whole 64-bit keys) a backend holds, asked of the
/// server by another session: only while that backend is the one that
/// started at `$2` (a PID the server reused is another session) and is
/// running a statement. An idle backend whose heartbeat is unanswered did
/// not hear it: the network may be gone, and the server then frees the
/// locks once its keepalives give up, so the lease must be lost before
/// that, as without a witness. A running one frees nothing until its
/// statement ends (or an operator ends it, the documented window).
const HELD_BY: &str = "SELECT (l.classid::int8 << 32) | l.objid::int8 FROM pg_locks l \
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.pid = $1 \
     AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = $1 \
     AND a.backend_start::text = $2 AND a.state = 'active')";

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

    /// `answer` (statements on this session), waited for at most `limit`;
    /// past its share of the tightest bound, the witness confirms the
    /// other leases meanwhile.
    pub(super) async fn witnessed<F: std::future::Future>(
        &self,
        limit: Duration,
        answer: F,
    ) -> Result<F::Output, Elapsed> {
        let began = Instant::now();
        tokio::pin!(answer);
        if let Ok(r) = timeout(self.share(None).min(limit), &mut answer).await {
            return Ok(r);
        }
        let rest = limit.saturating_sub(began.elapsed());
        tokio::select! {
            biased;
            r = timeout(rest, &mut answer) => r,
            () = self.witness(false) => unreachable!("a witness that does not give up never ends"),
        }
    }

    /// Wait for one lease's statements on this session, at most a quarter
    /// of the tightest bound here (`t`'s included). Past that (a slow
    /// trigger, a commit waiting for a synchronous standby that is gone)
    /// the server is asked to end them, the request delivered before
    /// anything else is sent, and the answer waited for up to
    /// `HEARTBEAT_DEADLINE` more, while the witness confirms the others.
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
            // it lands soon enough (the driver does not wait for the
            // server to act on it), and the statements after treat a
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
            () = self.witness(false) => unreachable!("a witness that does not give up never ends"),
        }
    }

    /// Confirm the leases here from a connection of its own, once per
    /// interval, for as long as it is polled. With `give_up`, it ends once
    /// the tightest lease's bound has passed all the same (a witness that
    /// cannot connect or see the locks confirms nothing; with no lease
    /// here, after `HEARTBEAT_DEADLINE`); without, it never ends.
    pub(super) async fn witness(&self, give_up: bool) {
        let began = Instant::now();
        let gone = async {
            if !give_up {
                return std::future::pending::<()>().await;
            }
            loop {
                let left = self
                    .members
                    .values()
                    .map(|m| m.confirmed.bound().saturating_sub(m.confirmed.age()))
                    .min()
                    .unwrap_or_else(|| HEARTBEAT_DEADLINE.saturating_sub(began.elapsed()));
                if left.is_zero() || self.members.values().any(|m| m.confirmed.expired()) {
                    return;
                }
                // Past the bound on the millisecond clock the ages are
                // read on, so an unconfirmed lease is found expired.
                tokio::time::sleep(left + Duration::from_millis(2)).await;
            }
        };
        tokio::pin!(gone);
        tokio::select! {
            biased;
            () = &mut gone => {}
            () = self.confirm_aside() => gone.await,
        }
    }

    /// The witness itself: ends only when it cannot go on (no connection,
    /// the server refused the question), having confirmed what it could.
    async fn confirm_aside(&self) {
        let Some(born) = self.born.as_deref() else {
            return;
        };
        let conn = match timeout(
            CONNECT_TIMEOUT,
            open_bare(&self.first, "sidelease shared session witness"),
        )
        .await
        {
            Ok(Ok(c)) => c,
            _ => return,
        };
        loop {
            let sent = Confirmed::clock();
            let next = Instant::now() + self.interval();
            let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
                [(&self.pid, Type::INT4), (&born, Type::TEXT)];
            let rows = match timeout(
                HEARTBEAT_DEADLINE,
                conn.client.query_typed(HELD_BY, &params),
            )
            .await
            {
                Ok(Ok(rows)) => rows,
                _ => break,
            };
            let keys: HashSet<i64> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
            for (key, m) in &self.members {
                if keys.contains(key) {
                    m.confirmed.answered(sent);
                }
            }
            tokio::time::sleep_until(next).await;
        }
        conn.task.abort();
    }
}
