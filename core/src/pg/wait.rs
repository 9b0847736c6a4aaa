//! The wait for a PostgreSQL lease on its own session: a blocking
//! `pg_advisory_lock`, with the holder row's write sent behind it in the
//! same pipeline, so that a handoff costs the server's wake-up and one
//! answer rather than a second round trip after the grant. The lock
//! statement notes this wait's nonce in the session when the lock is
//! granted, and the write is guarded by it: a wait that ended any other
//! way (cancelled, timed out, refused by the pooler checks) writes nothing.

use std::sync::LazyLock;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::confirm::Confirmed;
use super::conn::{
    cancel_request, holds, in_order, io_error, pg_error, pooler, release_within, unlock,
    upsert_sql, Conn, Pooled, CANCEL_GRACE, CANCEL_RETRY, FOREIGN_LOCKS, POOLER_CHECK,
    ROW_LOCK_TIMEOUT, UPDATE_RELEASED,
};
use super::inspect::contention;
use super::link::Cmd;
use super::session::{Run, Step, HEARTBEAT_DEADLINE};
use super::write::Claimed;
use crate::error::Error;

/// Before the wait: the caller's time left as the lock's timeout (`$1`),
/// and a prepared statement's plan kept generic from its first run on
/// (PostgreSQL makes five custom plans first), so the dry run below plans
/// the row write for good; a server before PostgreSQL 12 has no such
/// setting, and plans it after the grant.
const SETTINGS: &str = "SELECT set_config('lock_timeout', $1, false), \
     CASE WHEN current_setting('plan_cache_mode', true) IS NOT NULL \
     THEN set_config('plan_cache_mode', 'force_generic_plan', false) END";

/// The row write behind the lock: written only under the nonce (`$4`) the
/// lock statement noted on its grant, and stamped with the server's time
/// of writing, since the record was made before the wait.
static UPSERT_LOCKED: LazyLock<String> = LazyLock::new(|| {
    upsert_sql("$4 <> '' AND current_setting('sidelease.locked', true) = $4").replacen(
        "$3::jsonb",
        "($3::jsonb || jsonb_build_object('started_at', to_char(clock_timestamp() \
             AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')))",
        1,
    )
});

impl Run {
    /// Block in `pg_advisory_lock` until the server grants it, the lock
    /// timeout ends it, or the caller gives up (a cancel request to the
    /// server then).
    pub(super) async fn wait(&mut self, conn: &Conn, pid: i32, table: bool) -> Step {
        let t = self.target.clone();
        let c = &conn.client;
        // The row write is prepared and run once, writing nothing, before
        // the wait: planning it (its fences in JSON) costs the server about
        // a millisecond, and a first run in a session loads its catalogs,
        // neither of which a handoff should wait for after the grant.
        let prepare = async {
            if !table {
                return None;
            }
            let types = [Type::TEXT, Type::INT8, Type::TEXT, Type::TEXT];
            let stmt = c.prepare_typed(&UPSERT_LOCKED, &types).await.ok()?;
            c.query(&stmt, &[&t.name, &t.key, &"{}", &""]).await.ok()?;
            Some(stmt)
        };
        let ms = self.lock_timeout_ms();
        let ms_param: [(&(dyn ToSql + Sync), Type); 1] = [(&ms, Type::TEXT)];
        let (set, prepared) = in_order(c.query_typed(SETTINGS, &ms_param), prepare).await;
        if let Err(e) = set {
            return Step::Broken(pg_error(&t, "query", &e));
        }
        // The record goes with the lock; no table yet (or no plan): the row
        // is written after the grant, as for a lock taken at once.
        let mut rec = match prepared
            .is_some()
            .then(|| self.new_record(conn))
            .transpose()
        {
            Ok(r) => r,
            Err(e) => return Step::Fail(e),
        };
        let holder = rec.as_ref().map(|r| r.to_json());
        let nonce = match crate::nonce::fresh_hex() {
            Ok(n) => n,
            Err(e) => {
                use crate::platform::random;
                return Step::Fail(Error::io(
                    random::CALL,
                    std::path::Path::new(random::SOURCE),
                    e,
                ));
            }
        };
        // The row write's budget as of now (the settings, the plan and the
        // dry run took some of the caller's time).
        let budget: i64 = self.lock_timeout_ms().parse().unwrap_or(0);
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&t.key, Type::INT8),
            (&conn.session, Type::TEXT),
            (&nonce, Type::TEXT),
            (&budget, Type::INT8),
        ];
        // The checks and the lock in one statement, so in one server
        // session; the lock is taken only if they pass. On the grant (each
        // CASE runs its branch only after its condition) the session notes
        // the nonce and gives the row write the rest of the caller's time
        // (`ROW_LOCK_TIMEOUT` for a wait without a limit), and the server
        // says how long after the statement began it held the lock: at
        // least that long after this client sent it, which is when the
        // lease counts as confirmed.
        let sql = format!(
            "SELECT pg_backend_pid(), pre.ours, pre.held_already, \
                 CASE WHEN pre.ours AND NOT pre.held_already THEN \
                   CASE WHEN pg_advisory_lock($1)::text = '' THEN \
                     CASE WHEN set_config('lock_timeout', CASE WHEN $4 = 0 THEN '{ROW_LOCK_TIMEOUT}' \
                            ELSE GREATEST(1, $4 - floor(1000 * extract(epoch FROM \
                                 clock_timestamp() - statement_timestamp())))::bigint::text END, \
                            false) <> '' \
                          AND set_config('sidelease.locked', $3, false) = $3 \
                     THEN GREATEST(0, floor(1000 * extract(epoch FROM \
                          clock_timestamp() - statement_timestamp())))::bigint END \
                   END \
                 END \
             FROM (SELECT {POOLER_CHECK} AS ours, {FOREIGN_LOCKS} AS held_already) pre"
        );
        // A caller who gave up while the wait was made ready (connecting,
        // the checks, the plan: round trips a loaded machine stretches to
        // seconds) is not waited for on the server: a lock request sent
        // now would wait there until the cancel below reached it, a waiter
        // left behind after the caller was told the wait ended. A test
        // build widens the gap between the setup and the request.
        crate::faults::step("wait.lock");
        if self.slot.abandoned() {
            return Step::Cancelled;
        }
        let sent = Confirmed::clock();
        let lock = c.query_typed(&sql, &params);
        let write = async {
            let (stmt, holder) = (prepared.as_ref()?, holder.as_deref()?);
            let row: [&(dyn ToSql + Sync); 4] = [&t.name, &t.key, &holder, &nonce];
            Some(c.query(stmt, &row).await)
        };
        let pipeline = in_order(lock, write);
        tokio::pin!(pipeline);
        let mut why: Option<Step> = None;
        let mut cancels: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let mut give_up_at = tokio::time::Instant::now();
        let retry = tokio::time::sleep(std::time::Duration::MAX / 4);
        tokio::pin!(retry);
        let (res, wrote) = loop {
            tokio::select! {
                r = &mut pipeline => break r,
                cmd = self.rx.recv(), if why.is_none() => {
                    why = match cmd {
                        Some(Cmd::Share) => Some(Step::Share),
                        Some(Cmd::Release(_) | Cmd::Confirm(_)) => continue,
                        Some(Cmd::Try(_) | Cmd::Leave(..) | Cmd::Recorded(..) | Cmd::Told(_) | Cmd::HandOn(_)) => continue,
                        Some(Cmd::Cancel) | None => Some(Step::Cancelled),
                    };
                    give_up_at = tokio::time::Instant::now() + CANCEL_GRACE;
                    cancels.push(tokio::spawn(cancel_request(&t, conn)));
                    retry.as_mut().reset(tokio::time::Instant::now() + CANCEL_RETRY);
                }
                _ = &mut retry, if why.is_some() => {
                    if tokio::time::Instant::now() >= give_up_at {
                        // Close the socket now (the driver would keep it
                        // open for the answer): the server ends the wait
                        // when it notices (client_connection_check_interval).
                        conn.task.abort();
                        return why.unwrap_or(Step::Cancelled);
                    }
                    // A cancel request that reaches the server before the
                    // lock request does is ignored: ask again.
                    cancels.push(tokio::spawn(cancel_request(&t, conn)));
                    retry.as_mut().reset(tokio::time::Instant::now() + CANCEL_RETRY);
                }
            }
        };
        // A cancel request that came as the statements ended by themselves
        // ends the next one instead: each is sent before anything else is,
        // and the release below asks again when it meets one.
        for c in cancels {
            let _ = tokio::time::timeout(CANCEL_GRACE, c).await;
        }
        // The row the pipeline's write wrote, if any.
        let rows = wrote;
        self.plan = prepared.clone();
        let mut waited_ms: Option<i64> = None;
        let row_written = matches!(&rows, Some(Ok(r)) if r.len() == 1);
        let granted = match res {
            Ok(rows) => {
                let Some(row) = rows.first() else {
                    return Step::Fail(io_error(&t, "query", "the server answered no row"));
                };
                let (now, ours, foreign, held_for): (i32, bool, bool, Option<i64>) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                waited_ms = held_for;
                let locked = held_for.is_some();
                if !ours {
                    return Step::Fail(pooler(&t, Pooled::OtherSession));
                }
                if foreign {
                    return Step::Fail(pooler(&t, Pooled::ForeignLock));
                }
                if now != pid {
                    // The write, if any, went to that session: closing the
                    // connection (the caller's next step) ends it.
                    if locked && !row_written {
                        let _ = unlock(c, t.key).await;
                    }
                    return Step::Fail(pooler(&t, Pooled::Backend(pid, Some(now))));
                }
                locked
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                // The lock may have been granted at the instant the timeout
                // ended the wait (and then the row is written after it).
                match holds(c, t.key).await {
                    Ok(h) => h,
                    Err(e) => return Step::Broken(pg_error(&t, "query", &e)),
                }
            }
            Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => false,
            Err(e) => return Step::Broken(pg_error(&t, "query", &e)),
        };
        if let Some(step) = why {
            if granted {
                // Given up as the lock came: a row it wrote says released,
                // so the next holder reads no crash.
                match rows {
                    Some(rows @ Ok(_)) if row_written => match self.written(c, pid, rows).await {
                        Ok(w) => release_given_up(c, &t, w.generation).await,
                        Err(_) => {
                            let _ = unlock(c, t.key).await;
                        }
                    },
                    _ => {
                        let _ = unlock(c, t.key).await;
                    }
                }
            }
            return step;
        }
        if !granted {
            return Step::Fail(Error::Timeout(Box::new(
                contention(conn, &t, self.started).await,
            )));
        }
        let claimed: Option<Box<Claimed>> = match rows {
            // Granted at the timeout's edge, or no plan: written after.
            None => None,
            Some(Ok(r)) if r.is_empty() => None,
            Some(rows) => {
                let written = match self.written(c, pid, rows).await {
                    Ok(w) => w,
                    // The caller's next step closes the connection, which
                    // ends the session and its lock.
                    Err(e) => return Step::Fail(e),
                };
                let Some(ms) = waited_ms else {
                    let _ = release_within(c, &t, written.generation).await;
                    return Step::Fail(io_error(
                        &t,
                        "query",
                        "the server did not say when it granted the lock",
                    ));
                };
                let rec = rec.as_mut().map(|r| {
                    r.generation = Some(written.generation as u64);
                    r.started_at = Some(crate::record::now_rfc3339());
                    r.clone()
                });
                // Never later than now on this client's clock, whatever
                // the server's clock did meanwhile.
                let confirmed = (sent + ms as u64).min(Confirmed::clock());
                rec.map(|r| Box::new((r, written, confirmed)))
            }
        };
        Step::Got {
            pid,
            table,
            waited: true,
            claimed,
        }
    }
}

/// The release of a row written for a wait that was given up: the row says
/// released before the lock goes (so the next holder reads no crash), the
/// write asked again when a cancel request meant for the wait ended it
/// (a request ends one statement), and the lock kept if it never lands
/// (the connection's close, next, frees it).
async fn release_given_up(c: &tokio_postgres::Client, t: &super::target::Target, generation: i64) {
    let params: [(&(dyn ToSql + Sync), Type); 2] =
        [(&t.name, Type::TEXT), (&generation, Type::INT8)];
    for _ in 0..3 {
        let write = c.query_typed(UPDATE_RELEASED, &params);
        match tokio::time::timeout(HEARTBEAT_DEADLINE, write).await {
            Ok(Ok(_)) => {
                let _ = tokio::time::timeout(HEARTBEAT_DEADLINE, unlock(c, t.key)).await;
                return;
            }
            Ok(Err(e)) if e.code() == Some(&SqlState::QUERY_CANCELED) => continue,
            _ => return,
        }
    }
}
