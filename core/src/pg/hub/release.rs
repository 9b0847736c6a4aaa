//! A release on the shared session: the row says released, then the lock
//! goes, in one round trip; a row lock held by a fencing transaction is
//! waited out on a connection of its own.

use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::{Hub, UNLOCK_IF_RECORDED};
use crate::error::Result;
use crate::pg::conn::{
    cancel_request, in_order, io_error, open, pg_error, seconds, CONNECT_TIMEOUT, ROW_LOCK_TIMEOUT,
    UPDATE_RELEASED,
};
use crate::pg::link::Cmd;
use crate::pg::session::HEARTBEAT_DEADLINE;
use crate::pg::target::Target;

impl Hub {
    /// The last release of a lease here: its row says released, then the
    /// lock goes, in one round trip; a row lock held by a fencing
    /// transaction is waited out on a connection of its own.
    pub(super) async fn leave(&mut self, key: i64, generation: i64, reply: SyncSender<Result<()>>) {
        // Only the lease this release is of: one lost before may have left
        // its key to a newer lease here.
        if self
            .members
            .get(&key)
            .is_none_or(|m| m.generation != generation)
        {
            // Lost already: its lock was given back, or goes with the
            // session.
            let _ = reply.send(Ok(()));
            return;
        }
        let Some(m) = self.members.remove(&key) else {
            return;
        };
        match self.record_and_unlock(&m.target, m.generation).await {
            Release::Done(r) => {
                let _ = reply.send(r);
            }
            Release::RowLocked => self.record_later(m.target, m.generation, reply),
        }
    }

    /// Write a release's row on a side connection, the lock kept meanwhile,
    /// and unlock (then answer) once it is written.
    pub(super) fn record_later(
        &mut self,
        t: Arc<Target>,
        generation: i64,
        reply: SyncSender<Result<()>>,
    ) {
        let key = t.key;
        self.recording.insert(key);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let r = record_alone(&t, generation).await;
            let _ = tx.send(Cmd::Recorded(Box::new((t, key, r)), reply));
        });
    }

    pub(super) async fn record_and_unlock(&mut self, t: &Arc<Target>, generation: i64) -> Release {
        let c = &self.conn.client;
        let began = std::time::Instant::now();
        // A lease here came from a try, which prepared the statements.
        let answered = match &self.prepared {
            Some(p) => {
                type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
                let params: [Param; 2] = [&t.name, &generation];
                let record = c.query(&p.release, &params);
                let unlock_params: [Param; 3] = [&t.key, &t.name, &generation];
                let unlocked = c.query(&p.unlock, &unlock_params);
                self.bounded(t, in_order(record, unlocked)).await
            }
            None => {
                let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
                    [(&t.name, Type::TEXT), (&generation, Type::INT8)];
                let record = c.query_typed(UPDATE_RELEASED, &params);
                let unlock_params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 3] = [
                    (&t.key, Type::INT8),
                    (&t.name, Type::TEXT),
                    (&generation, Type::INT8),
                ];
                let unlocked = c.query_typed(UNLOCK_IF_RECORDED, &unlock_params);
                self.bounded(t, in_order(record, unlocked)).await
            }
        };
        if matches!(&answered, Ok((Err(_), _) | (_, Err(_)))) {
            // Prepared again on the next try (a proxy may have deallocated
            // them, a table altered since fails their plan).
            self.prepared = None;
        }
        match answered {
            Ok((Ok(_), Ok(rows))) if rows.len() == 1 => Release::Done(Ok(())),
            // A fencing transaction holds the row, or the write was ended
            // for holding up the other leases (`bounded`): the lock stays
            // (its unlock runs only after the row says released) and the
            // row is written on a connection of its own.
            Ok((Err(e), _))
                if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
                    || e.code() == Some(&SqlState::QUERY_CANCELED) =>
            {
                Release::RowLocked
            }
            Ok((recorded, _)) => {
                // Not recorded (the row was deleted, a statement failed):
                // the lock goes all the same.
                let unlocked = self.unlock(t, t.key).await;
                Release::Done(match recorded {
                    Err(e) => Err(pg_error(t, "release", &e)),
                    Ok(_) => unlocked,
                })
            }
            Err(_) => {
                self.held.entry(t.key).or_insert(None);
                Release::Done(Err(io_error(
                    t,
                    "release",
                    format!(
                        "no answer from the server within {} (the statement was asked to end \
                         after {}); the server ends the session, and frees the lock, when it \
                         notices",
                        seconds(began.elapsed()),
                        seconds(self.share(Some(t.confirm_within)))
                    ),
                )))
            }
        }
    }
}

pub(super) enum Release {
    Done(Result<()>),
    /// A fencing transaction holds the row: nothing changed yet.
    RowLocked,
}

/// Record a release on a connection of its own, waiting out the fencing
/// transaction as long as an acquisition's own session would.
async fn record_alone(t: &Arc<Target>, generation: i64) -> Result<()> {
    let conn = match tokio::time::timeout(CONNECT_TIMEOUT, open(t, None)).await {
        Ok(c) => c?,
        Err(_) => {
            return Err(io_error(
                t,
                "release",
                "the server did not answer a connection to record the release in time",
            ))
        }
    };
    let limit =
        Duration::from_millis(ROW_LOCK_TIMEOUT.parse::<u64>().unwrap_or(5000)) + HEARTBEAT_DEADLINE;
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&t.name, Type::TEXT), (&generation, Type::INT8)];
    let r = {
        let write = conn.client.query_typed(UPDATE_RELEASED, &params);
        tokio::pin!(write);
        match tokio::time::timeout(limit, &mut write).await {
            Ok(r) => Ok(r),
            Err(_) => {
                // Past a row lock's wait: a commit waiting for a synchronous
                // standby that is gone. Asked to end, the server commits it
                // locally (with a warning), which is all a release needs.
                // Not waited for: it goes while the answer is waited for.
                drop(tokio::spawn(cancel_request(t, &conn)));
                tokio::time::timeout(HEARTBEAT_DEADLINE, &mut write).await
            }
        }
    };
    let limit = limit + HEARTBEAT_DEADLINE;
    conn.close().await;
    match r {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(pg_error(t, "update", &e)),
        Err(_) => Err(io_error(
            t,
            "release",
            format!("no answer from the server within {}", seconds(limit)),
        )),
    }
}
