//! A pooler between this process and the server: whether its pool keeps a
//! connection's server session for it (a session pool, where a session
//! advisory lock can live) or hands it on between statements (a
//! transaction or statement pool, where it cannot), and the errors that
//! say which was found.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::conn::{io_error, open_bare, pg_error, seconds, Conn, CONNECT_TIMEOUT};
use super::target::Target;
use crate::error::{Error, Result};

/// How long the pooler probe's statement waits for a server session (see
/// [`probe`]): a free one comes within a round trip or two.
pub(crate) const PROBE_WAIT: Duration = Duration::from_millis(250);

/// Whether another connection to the same URL, opened while this one is
/// idle, reaches this one's server session: a transaction- or
/// statement-mode pooler hands an idle client's server session to the next
/// client (PgBouncer the most recently used one first), a session-mode
/// pool never does. Asked only when something sits between this process
/// and the server (the server does not see this connection's address as
/// its client's).
///
/// A pool that gives the probe no server session within [`PROBE_WAIT`] is
/// asked which it is through this connection, the probe still queued: a
/// session pool keeps this connection's server session for it and answers
/// at once (a pool of one, or one as full as its clients, must not cost
/// the lease); a transaction or statement pool holds none for an idle
/// client, so this statement queues behind the probe, which gets the next
/// free server session first and is judged as above. Neither answering
/// within the caller's patience is the pooler's error, saying so.
pub(crate) async fn probe(target: &Target, conn: &Conn, pid: i32) -> Result<()> {
    const SQL: &str =
        "SELECT pg_backend_pid(), current_setting('sidelease.session', true) IS NOT DISTINCT FROM $1";
    let other = open_bare(target, "sidelease pooler probe").await?;
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 1] =
        [(&conn.session, Type::TEXT)];
    let judge = |rows: std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>| {
        let rows = rows.map_err(|e| pg_error(target, "query", &e))?;
        let (p, same): (i32, bool) = rows.first().map_or((0, false), |r| (r.get(0), r.get(1)));
        if p == pid || same {
            return Err(pooler(target, Pooled::SharedSession));
        }
        Ok(())
    };
    let (answer, starved) = {
        let ask = other.client.query_typed(SQL, &params);
        tokio::pin!(ask);
        match tokio::time::timeout(PROBE_WAIT, &mut ask).await {
            Ok(rows) => (Some(judge(rows)), false),
            Err(_) => {
                let mine = conn.client.query_typed(SQL, &params);
                let answer = tokio::time::timeout(CONNECT_TIMEOUT, async {
                    tokio::select! {
                        // The probe first: queued first, it is the pool's next.
                        biased;
                        rows = &mut ask => judge(rows),
                        rows = mine => match rows {
                            Ok(r) if r.first().is_some_and(|r| {
                                r.get::<_, i32>(0) == pid && r.get::<_, bool>(1)
                            }) => Ok(()),
                            // Answered from another server session: none is
                            // kept for this connection.
                            Ok(_) => Err(pooler(target, Pooled::SharedSession)),
                            Err(e) => Err(pg_error(target, "query", &e)),
                        },
                    }
                })
                .await;
                (answer.ok(), true)
            }
        }
    };
    if starved {
        // Closed at once: the pooler drops a queued statement with its
        // client.
        other.task.abort();
    } else {
        other.close().await;
    }
    answer.unwrap_or_else(|| {
        Err(io_error(
            target,
            "connect",
            format!(
                "a pooler sits between this process and the server, and neither a second \
                 connection nor this one got a server session within {}: its pool has none free",
                seconds(PROBE_WAIT + CONNECT_TIMEOUT)
            ),
        ))
    })
}

/// What a statement found of a pooler between this connection and the
/// server.
pub(crate) enum Pooled {
    /// The statement ran in another server session than the one this
    /// connection set up.
    OtherSession,
    /// The server session already held an advisory lock this connection
    /// never took (another client's, left on a pooled server session).
    ForeignLock,
    /// The server backend changed between two statements.
    Backend(i32, Option<i32>),
    /// Another connection reached this connection's server session.
    SharedSession,
}

pub(crate) fn pooler(t: &Target, what: Pooled) -> Error {
    let seen = match what {
        Pooled::OtherSession => {
            "a statement ran in another server session than the one this connection set up"
                .to_owned()
        }
        Pooled::ForeignLock => {
            "the server session already held an advisory lock this connection never took".to_owned()
        }
        Pooled::SharedSession => {
            "another connection to the same URL reached this connection's server session while \
             it was idle"
                .to_owned()
        }
        Pooled::Backend(before, after) => format!(
            "the server backend changed between two statements (pid {before}, then {})",
            after.map_or("none".to_owned(), |p| p.to_string())
        ),
    };
    Error::invalid(
        "target",
        format!(
            "{}: {seen}: the URL goes through a transaction- or statement-mode pooler (such as \
             PgBouncer with pool_mode = transaction), where a session advisory lock cannot live; \
             connect to the server directly, or through a session-mode pool",
            t.shown
        ),
    )
}

/// `why` a connection ended unanswered, for one that the server (or a
/// pooler) took and then left its first statement unanswered: what a
/// pooler does whose pool has no server session free.
pub(crate) fn unanswered_taken(why: String) -> String {
    format!(
        "{why}: the connection was taken and its first statement not answered, as a pooler \
         whose pool has no server session free does (PgBouncer's default_pool_size, every one \
         taken by another client)"
    )
}
