//! The connection of a PostgreSQL lease and the statements it runs: the
//! session's settings, opening it on a socket the library owns, cancel
//! requests, the lock and holder-row statements, and errors that name the
//! URL with its password masked.

use std::path::PathBuf;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

use super::session::HEARTBEAT_DEADLINE;
use super::socket;
use super::target::Target;
use crate::error::{Error, Result};
use crate::platform::process;

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) struct Conn {
    pub client: Client,
    pub task: JoinHandle<std::result::Result<(), tokio_postgres::Error>>,
}

impl Conn {
    pub async fn close(self) {
        drop(self.client);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
    }
}

/// Settings every lease session runs with (sent in the startup packet, so
/// they cost no round trip; each is one a plain user may set). The holder
/// row's writes wait for a row lock at most `ROW_LOCK_TIMEOUT` (an
/// application's fencing transaction holds one `FOR SHARE`); only the
/// blocking `pg_advisory_lock` gets the caller's own timeout. The server's
/// keepalives (2 s idle, 3 probes 1 s apart) notice a silent client after
/// 5 s, later than the holder notices (3 s); `tcp_user_timeout` is left at
/// the server's default so it cannot cut that short.
pub(crate) const SESSION_OPTIONS: &str = "-c statement_timeout=0 -c lock_timeout=5000 \
     -c idle_in_transaction_session_timeout=0 -c idle_session_timeout=10000 \
     -c client_connection_check_interval=1000 -c tcp_keepalives_idle=2 \
     -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3";
pub(crate) const ROW_LOCK_TIMEOUT: &str = "5000";

/// How long a cancelled wait may take to end before its connection is
/// dropped (the server then ends the wait within a second).
pub(crate) const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How often a cancel request is repeated until the wait ends.
pub(crate) const CANCEL_RETRY: Duration = Duration::from_millis(100);

pub(crate) fn pg_error(target: &Target, what: &'static str, e: &tokio_postgres::Error) -> Error {
    io_error(target, what, describe(e))
}

pub(crate) fn io_error(target: &Target, what: &'static str, text: impl Into<String>) -> Error {
    Error::Io {
        syscall: what,
        path: PathBuf::from(&target.shown),
        source: std::io::Error::other(text.into()),
    }
}

pub(crate) fn application_name(target: &Target) -> String {
    let me = process::current();
    let mut s = format!(
        "sidelease {}@{} {}",
        me.pid,
        me.host.as_deref().unwrap_or("?"),
        target.name
    );
    s.retain(|c| c.is_ascii() && !c.is_ascii_control());
    s.truncate(63);
    s
}

pub(crate) async fn open(target: &Target, app: Option<String>) -> Result<Conn> {
    let mut cfg = target.config.clone();
    cfg.application_name(app.unwrap_or_else(|| application_name(target)));
    let opts = match cfg.get_options() {
        Some(o) if !o.is_empty() => format!("{o} {SESSION_OPTIONS}"),
        _ => SESSION_OPTIONS.to_owned(),
    };
    cfg.options(opts);
    let timeout = cfg
        .get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT);
    let sock = socket::connect(&cfg, timeout)
        .await
        .map_err(|e| io_error(target, "connect", crate::error::os_message(&e)))?;
    let (client, connection) =
        match tokio::time::timeout(timeout, cfg.connect_raw(sock, NoTls)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(pg_error(target, "connect", &e)),
            Err(_) => {
                return Err(io_error(
                    target,
                    "connect",
                    "the server did not finish the startup in time",
                ))
            }
        };
    let task = tokio::spawn(connection);
    Ok(Conn { client, task })
}

/// Ask the server to cancel what the connection runs (a new connection
/// carries the request).
pub(crate) async fn cancel(target: &Target, client: &Client) {
    let token = client.cancel_token();
    if let Ok(sock) = socket::connect(&target.config, CONNECT_TIMEOUT).await {
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, token.cancel_query_raw(sock, NoTls)).await;
    }
}

/// The server's message (severity, text, SQLSTATE, hint), or the driver's
/// error with its causes.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut t = format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            );
            if let Some(h) = db.hint() {
                t.push_str(&format!("; hint: {h}"));
            }
            t
        }
        None => {
            let mut t = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(s) = src {
                t.push_str(&format!(": {s}"));
                src = s.source();
            }
            t
        }
    }
}

pub(crate) fn privilege_error(
    t: &Target,
    what: &'static str,
    e: &tokio_postgres::Error,
    need: &str,
) -> Error {
    if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        let mut err = pg_error(t, what, e);
        if let Error::Io { source, .. } = &mut err {
            *source =
                std::io::Error::other(format!("{}: {need}", crate::error::os_message(source)));
        }
        err
    } else {
        pg_error(t, what, e)
    }
}

pub(crate) fn standby_error(t: &Target) -> Error {
    Error::invalid(
        "target",
        format!(
            "{}: the server is a standby (pg_is_in_recovery() is true): advisory locks are not \
             shared with the primary; point the URL at the primary",
            t.shown
        ),
    )
}

pub(crate) fn pooler(t: &Target, before: i32, after: Option<i32>) -> Error {
    Error::invalid(
        "target",
        format!(
            "{}: the server backend changed between two statements (pid {before}, then {}): \
             the URL goes through a transaction-mode pooler, where a session advisory lock \
             cannot live; connect to the server directly or through a session-mode pool",
            t.shown,
            after.map_or("none".to_owned(), |p| p.to_string())
        ),
    )
}

/// Two requests on one connection in one round trip: `first` is sent (its
/// first poll queues it) before `second`, and the server answers them in
/// that order.
pub(crate) async fn in_order<A: std::future::Future, B: std::future::Future>(
    first: A,
    second: B,
) -> (A::Output, B::Output) {
    use std::task::Poll;
    let mut first = std::pin::pin!(first);
    let early = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
    match early {
        Poll::Ready(a) => (a, second.await),
        Poll::Pending => tokio::join!(first, second),
    }
}

pub(crate) async fn set_lock_timeout(
    c: &Client,
    ms: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    c.query_typed(
        "SELECT set_config('lock_timeout', $1, false)",
        &[(&ms, Type::TEXT)],
    )
    .await
    .map(drop)
}

pub(crate) async fn backend_pid(c: &Client) -> std::result::Result<i32, tokio_postgres::Error> {
    let rows = c.query_typed("SELECT pg_backend_pid()", &[]).await?;
    Ok(rows.first().map_or(0, |r| r.get(0)))
}

pub(crate) async fn unlock(c: &Client, key: i64) -> std::result::Result<(), tokio_postgres::Error> {
    c.query_typed("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)])
        .await
        .map(drop)
}

pub(crate) async fn holds(
    c: &Client,
    key: i64,
) -> std::result::Result<bool, tokio_postgres::Error> {
    let rows = c
        .query_typed(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
             AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
             AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid)",
            &[(&key, Type::INT8)],
        )
        .await?;
    Ok(rows.first().is_some_and(|r| r.get(0)))
}

/// A release bounded in time: a row lock held by a fencing transaction may
/// delay it (up to the session's lock timeout), a dead network must not
/// hang it (the server then ends the session, and the lock, itself).
pub(crate) async fn release_within(c: &Client, t: &Target, generation: i64) -> Result<()> {
    let limit =
        Duration::from_millis(ROW_LOCK_TIMEOUT.parse::<u64>().unwrap_or(5000)) + HEARTBEAT_DEADLINE;
    match tokio::time::timeout(limit, release_row(c, t, generation)).await {
        Ok(r) => r,
        Err(_) => Err(io_error(
            t,
            "release",
            format!(
                "no answer from the server within {}s; the server ends the session, and frees \
                 the lock, when it notices",
                limit.as_secs()
            ),
        )),
    }
}

/// Record the release (so the next holder reads a clean one), then unlock:
/// in that order, or the next holder could read the row before it says so.
pub(crate) async fn release_row(c: &Client, t: &Target, generation: i64) -> Result<()> {
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&t.name, Type::TEXT), (&generation, Type::INT8)];
    let record = c.query_typed(
        "UPDATE sidelease_leases SET released_at = now() WHERE name = $1 AND generation = $2",
        &params,
    );
    // One round trip: the server runs the update (and commits it) before
    // the unlock, since it runs a connection's requests in order.
    let (recorded, unlocked) = in_order(record, unlock(c, t.key)).await;
    recorded.map_err(|e| pg_error(t, "update", &e))?;
    unlocked.map_err(|e| pg_error(t, "unlock", &e))
}
