//! The connection of a PostgreSQL lease and the statements it runs: the
//! session's settings, opening it on a socket the library owns, cancel
//! requests, the lock and holder-row statements, and errors that name the
//! URL with its password masked.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

use super::session::HEARTBEAT_DEADLINE;
use super::socket;
use super::target::Target;
use super::tls::Mode;
use crate::error::{Error, Result};
use crate::platform::process;

pub(crate) use super::pooler::{pooler, probe, Pooled};

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a connection or a statement given `patience` ended unanswered: the
/// server's silence, or, when the patience was what was left of the
/// caller's timeout, that timeout (the server may have been about to
/// answer: a slow handshake, an emulated CPU).
pub(crate) fn unanswered(wait: crate::options::Wait, patience: Duration) -> String {
    match wait {
        crate::options::Wait::Timeout(d) if patience < CONNECT_TIMEOUT => format!(
            "no answer from the server before the acquisition's {} timeout ran out",
            seconds(d)
        ),
        _ => format!("the server did not answer within {}", seconds(patience)),
    }
}

/// "0.3s", or milliseconds under a tenth of a second (never "0.0s").
pub(crate) fn seconds(d: Duration) -> String {
    if d < Duration::from_millis(100) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}
pub(crate) struct Conn {
    pub client: Client,
    pub task: JoinHandle<std::result::Result<(), tokio_postgres::Error>>,
    /// The socket's descriptor, owned by `task` (see `hand_on`).
    socket: std::os::fd::RawFd,
    /// A value set in this server session only (`sidelease.session`):
    /// every statement that matters checks it, so a pooler that hands the
    /// next statement to another server session is caught (see
    /// [`POOLER_CHECK`]).
    pub session: String,
    /// This end's and the peer's TCP addresses (`None` over a Unix
    /// socket): a server reached directly sees exactly them as its
    /// client's and its own.
    pub ends: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
    /// The TLS version of the session, if it is encrypted.
    pub tls: Option<&'static str>,
    /// The host reached, if over TCP.
    pub host: Option<String>,
    /// Which server and database this session is in ([`SERVER_IDENTITY`]),
    /// read with the session's settings; `None` where the server would not
    /// say (or for the pooler probe's bare connection).
    pub server: Option<String>,
}

impl Conn {
    /// A copy of the session's socket for a command this process starts:
    /// while any copy is open the connection stays open, so the session
    /// (and its lock) outlives this process until the command ends too.
    /// Called on the session's own thread, whose runtime runs one task at a
    /// time: the connection task, which owns the socket, cannot close it
    /// between the check and the copy.
    pub fn hand_on(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        if self.task.is_finished() {
            return Err(std::io::Error::other("the session has ended"));
        }
        // SAFETY: open while the connection task runs (checked above).
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.socket) };
        // Without close-on-exec, as a lease file's copy: the command
        // inherits it.
        Ok(rustix::io::dup(fd)?)
    }

    /// This end's and the peer's port and address, as statement parameters
    /// (`-1` and `""` over a Unix socket), for the check that nothing sits
    /// between this connection and the server.
    pub fn ends_params(&self) -> (i32, String, i32, String) {
        match self.ends {
            Some((l, r)) => (
                i32::from(l.port()),
                l.ip().to_string(),
                i32::from(r.port()),
                r.ip().to_string(),
            ),
            None => (-1, String::new(), -1, String::new()),
        }
    }

    pub async fn close(self) {
        drop(self.client);
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(1), &mut task)
            .await
            .is_err()
        {
            // The driver keeps the socket open while a statement awaits its
            // answer (a wait whose cancel never arrived): closing it is what
            // ends that wait on the server (client_connection_check_interval).
            task.abort();
        }
    }
}

/// Settings every lease session runs with, set by statements once
/// connected (a pooler such as PgBouncer refuses the startup packet's
/// `options`; each is one a plain user may set, and each overrides what a
/// role or database setting says). The holder row's writes wait for a row
/// lock at most `ROW_LOCK_TIMEOUT` (an application's fencing transaction
/// holds one `FOR SHARE`); only the blocking `pg_advisory_lock` gets the
/// caller's own timeout. The server's keepalives (2 s idle, 3 probes 1 s
/// apart) notice a silent client after 5 s, later than the holder gives up
/// (its bound, `confirm_within`, at most 4 s); `tcp_user_timeout` is the
/// system's (0), whatever a role set, so it cannot cut that short.
pub(crate) const SESSION_SETTINGS: &str = "SET statement_timeout = 0; SET lock_timeout = 5000; \
     SET idle_in_transaction_session_timeout = 0; SET idle_session_timeout = 10000; \
     SET client_connection_check_interval = 1000; SET tcp_keepalives_idle = 2; \
     SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 3; SET tcp_user_timeout = 0";

/// What tells one server from another, so that a lock held by backend N of
/// one server is never taken for this process's lease held by backend N of
/// another: two containers' servers number their backends alike. The
/// cluster's `system_identifier` (made at initdb; a copy of a data
/// directory, a standby, keeps it), the postmaster's start time (a copy
/// started apart, a promoted standby, a restart differ) and the database
/// (an advisory lock is per database). A server may have revoked
/// `pg_control_system()`: the statement then fails on its own (the
/// server checks the privilege before it runs any of it), and no lock on
/// that server is taken for one of ours.
pub(crate) const SERVER_IDENTITY: &str = "SELECT pg_catalog.concat_ws('/', system_identifier, \
     EXTRACT(epoch FROM pg_catalog.pg_postmaster_start_time()), \
     (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())) \
     FROM pg_catalog.pg_control_system()";

/// What a statement that matters checks, in the same statement, so it runs
/// in the same server session as what it guards: that the session is the
/// one this connection set up (a transaction- or statement-mode pooler
/// hands each statement to any server session), and that it holds no
/// advisory lock this connection did not take (a pooled server session may
/// carry another client's lock, which `pg_try_advisory_lock` would grant
/// again). `$2` is the session's value.
pub(crate) const POOLER_CHECK: &str = "current_setting('sidelease.session', true) IS NOT \
     DISTINCT FROM $2";
pub(crate) const FOREIGN_LOCKS: &str = "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = \
     'advisory' AND pid = pg_backend_pid() AND granted)";
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
    open_with(target, app, true, None).await
}

/// `open`, bounded from outside (the caller's patience), telling through
/// `started` whether the server (or a pooler) took the session: a
/// connection that got that far and no answer since is waiting for a
/// pooler's server session, and may be asked again while the caller waits;
/// one that did not is unreachable, and is not.
pub(crate) async fn open_tracked(
    target: &Target,
    app: Option<String>,
    started: &std::sync::atomic::AtomicBool,
) -> Result<Conn> {
    open_with(target, app, true, Some(started)).await
}

/// A connection without the lease session's settings (and without its
/// `sidelease.session` value): the probe for a pooler.
pub(crate) async fn open_bare(target: &Target, app: &str) -> Result<Conn> {
    open_with(target, Some(app.to_owned()), false, None).await
}

async fn open_with(
    target: &Target,
    app: Option<String>,
    settings: bool,
    started: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Conn> {
    let mut cfg = target.config.clone();
    cfg.application_name(app.unwrap_or_else(|| application_name(target)));
    let timeout = cfg
        .get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT);
    // libpq's order of tries: `allow` plaintext first and TLS if the server
    // refuses it, `prefer` TLS first and plaintext if the handshake fails
    // or the server refuses the encrypted session.
    let (first, second) = match target.tls.mode {
        Mode::Disable => (SslMode::Disable, None),
        Mode::Allow => (SslMode::Disable, Some(SslMode::Require)),
        Mode::Prefer => (SslMode::Prefer, Some(SslMode::Disable)),
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => (SslMode::Require, None),
    };
    let first_tls = first != SslMode::Disable;
    let mut conn = match startup(target, &mut cfg, timeout, first).await {
        Ok(c) => c,
        Err(Failed {
            error: before,
            retry: true,
        }) if second.is_some() => {
            let second = second.unwrap_or(SslMode::Disable);
            startup(target, &mut cfg, timeout, second)
                .await
                .map_err(|f| match (f.error, before) {
                    (Error::Io { source, .. }, Error::Io { source: first, .. }) => io_error(
                        target,
                        "connect",
                        format!(
                            "{source}; the try {} TLS before it failed too: {first}",
                            if first_tls { "with" } else { "without" }
                        ),
                    ),
                    (e, _) => e,
                })?
        }
        Err(f) => return Err(f.error),
    };
    if let Some(s) = started {
        s.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if settings {
        let setup = format!(
            "{SESSION_SETTINGS}; SET sidelease.session = '{}'",
            conn.session
        );
        // The server's identity in the same round trip (the two are sent
        // together), as a statement of its own: refused, it costs nothing
        // but the identity.
        let both = async {
            let (set, id) = tokio::join!(
                conn.client.batch_execute(&setup),
                conn.client.simple_query(SERVER_IDENTITY)
            );
            let id = id.ok().and_then(|messages| {
                messages.iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
            });
            set.map(|()| id)
        };
        // Bounded from outside when tracked (`open_tracked`): its caller
        // tells this wait from an unreachable server by `started`.
        let answered = match started {
            Some(_) => Ok(both.await),
            None => tokio::time::timeout(timeout, both).await,
        };
        match answered {
            Ok(Ok(id)) => conn.server = id,
            Ok(Err(e)) => return Err(pg_error(target, "connect", &e)),
            Err(_) => {
                return Err(io_error(
                    target,
                    "connect",
                    "the server did not answer the session's settings in time",
                ))
            }
        }
    } else {
        conn.session.clear();
    }
    Ok(conn)
}

/// A startup that failed, and whether libpq's other try applies: the
/// server refused the session (`allow`), or TLS was tried (`prefer`).
struct Failed {
    error: Error,
    retry: bool,
}

async fn startup(
    target: &Target,
    cfg: &mut tokio_postgres::Config,
    timeout: Duration,
    mode: SslMode,
) -> std::result::Result<Conn, Failed> {
    let hard = |error| Failed {
        error,
        retry: false,
    };
    let (sock, host) = socket::connect(cfg, timeout).await.map_err(|source| {
        // The system's error itself, so its errno reaches the caller
        // (EMFILE, ECONNREFUSED), not one made of its text.
        hard(Error::Io {
            syscall: "connect",
            path: PathBuf::from(&target.shown),
            source,
        })
    })?;
    let ends = sock.tcp_ends();
    let socket = sock.raw();
    // No TLS over a Unix socket (as libpq).
    let connector = match (&host, mode) {
        (Some(h), SslMode::Prefer | SslMode::Require) => {
            target.tls.connector(h, &target.shown).map_err(hard)?
        }
        _ => None,
    };
    cfg.ssl_mode(if connector.is_some() {
        mode
    } else {
        SslMode::Disable
    });
    let used = connector.as_ref().map(|c| c.used.clone());
    let started = match connector {
        Some(tls) => {
            let tried = tls.tried.clone();
            let r = tokio::time::timeout(timeout, cfg.connect_raw(sock, tls)).await;
            let tried = tried.load(std::sync::atomic::Ordering::Relaxed);
            r.map(|r| {
                r.map(|(client, connection)| (client, tokio::spawn(connection)))
                    .map_err(|e| (e, tried))
            })
        }
        None => tokio::time::timeout(timeout, cfg.connect_raw(sock, NoTls))
            .await
            .map(|r| {
                r.map(|(client, connection)| (client, tokio::spawn(connection)))
                    .map_err(|e| (e, false))
            }),
    };
    let (client, task) = match started {
        Ok(Ok(c)) => c,
        Ok(Err((e, tried))) => {
            let retry = match mode {
                SslMode::Disable => e.as_db_error().is_some(),
                _ => tried,
            };
            return Err(Failed {
                error: pg_error(target, "connect", &e),
                retry,
            });
        }
        Err(_) => {
            return Err(hard(io_error(
                target,
                "connect",
                "the server did not finish the startup in time",
            )))
        }
    };
    let session = crate::nonce::fresh_hex().map_err(|e| {
        hard(io_error(
            target,
            crate::platform::random::CALL,
            crate::error::os_message(&e),
        ))
    })?;
    Ok(Conn {
        client,
        task,
        socket,
        session,
        ends,
        tls: used.and_then(|u| u.get().copied()),
        host,
        server: None,
    })
}

/// A cancel request for what `conn`'s session runs now, carried by a new
/// connection: a future that ends once the server (or a pooler) has taken
/// the request and closed that connection, or could not be reached.
/// Spawned, so that a server slow to take it cannot stretch a caller's
/// bound on giving up. A request that lands after the statement ended by
/// itself ends the session's next statement instead (an idle session
/// ignores it): callers write what matters so that a retry is safe.
pub(crate) fn cancel_request(
    target: &Arc<Target>,
    conn: &Conn,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let token = conn.client.cancel_token();
    // The request goes as the session did: the token remembers its mode.
    let tls = match &conn.host {
        Some(h) if conn.tls.is_some() => target.tls.connector(h, &target.shown).ok().flatten(),
        _ => None,
    }
    .map(|c| super::tls::Connector { linger: true, ..c });
    let target = target.clone();
    async move {
        let Ok((sock, _)) = socket::connect(&target.config, CONNECT_TIMEOUT).await else {
            return;
        };
        let sock = socket::ClosedByPeer(sock);
        let _ = match tls {
            Some(tls) => {
                tokio::time::timeout(CONNECT_TIMEOUT, token.cancel_query_raw(sock, tls)).await
            }
            None => {
                tokio::time::timeout(CONNECT_TIMEOUT, token.cancel_query_raw(sock, NoTls)).await
            }
        };
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

/// The holder's heartbeat: the server backend, and whether the statement
/// ran in this connection's own server session.
pub(crate) async fn heartbeat(
    c: &Client,
    session: &str,
) -> std::result::Result<(i32, bool), tokio_postgres::Error> {
    let rows = c
        .query_typed(
            "SELECT pg_backend_pid(), current_setting('sidelease.session', true) IS NOT DISTINCT FROM $1",
            &[(&session, Type::TEXT)],
        )
        .await?;
    Ok(rows.first().map_or((0, false), |r| (r.get(0), r.get(1))))
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
                "no answer from the server within {}; the server ends the session, and frees \
                 the lock, when it notices",
                seconds(limit)
            ),
        )),
    }
}

/// The start of both holder-row writes (a lease's own session's, the
/// shared session's): the server's clock in milliseconds, and the previous
/// row's generation, record and release (`prev`), with its fences: until
/// when a holder whose lock was taken from it may still believe it holds
/// the lease, on the server's clock, and who that holder was (its PID,
/// start time, boot, PID namespace, host name and machine id, from its
/// record, so a successor on its host can tell it ended). A previous holder that did not release is
/// given its bound (`confirm_within_ms` in its record; 4 s, the largest,
/// when it does not say) from now, 2 ms more for its millisecond rounding;
/// the fences a row carries stand, while they lie ahead, through clean
/// releases and through holders that ended, so no holder in between hides
/// one. Each is at most 4 s from now whatever a row says, and a row keeps
/// the 32 latest. A row of an earlier version (`fence_until_ms`, no list)
/// gives a fence for no one in particular, never skipped. `fence` is the
/// latest of them. `$1` is the name.
const ROW_PREVIOUS: &str = "WITH clock AS (SELECT \
         floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms), \
     prev AS (SELECT generation, holder::text AS holder, \
         to_char(released_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS released_at, \
         (SELECT COALESCE(jsonb_agg(g), '[]'::jsonb) FROM (SELECT jsonb_set(f, '{until}', \
              to_jsonb(LEAST((f->>'until')::numeric, (SELECT ms FROM clock) + 4002))) AS g \
            FROM jsonb_array_elements(CASE WHEN jsonb_typeof(holder->'fences') = 'array' \
                 THEN holder->'fences' ELSE '[]'::jsonb END) f \
            WHERE CASE WHEN jsonb_typeof(f) = 'object' AND jsonb_typeof(f->'until') = 'number' \
                  THEN (f->>'until')::numeric > (SELECT ms FROM clock) ELSE false END \
            ORDER BY (f->>'until')::numeric DESC LIMIT 32) kept) \
         || CASE WHEN jsonb_typeof(holder->'fences') IS DISTINCT FROM 'array' \
                  AND jsonb_typeof(holder->'fence_until_ms') = 'number' \
            THEN CASE WHEN (holder->>'fence_until_ms')::numeric > (SELECT ms FROM clock) \
                 THEN jsonb_build_array(jsonb_build_object('until', \
                      LEAST((holder->>'fence_until_ms')::numeric, (SELECT ms FROM clock) + 4002))) \
                 ELSE '[]'::jsonb END \
            ELSE '[]'::jsonb END \
         || CASE WHEN released_at IS NOT NULL THEN '[]'::jsonb \
            ELSE jsonb_build_array(jsonb_build_object('until', (SELECT ms FROM clock) + 2 + \
                CASE WHEN jsonb_typeof(holder->'confirm_within_ms') = 'number' \
                     THEN LEAST(GREATEST((holder->>'confirm_within_ms')::numeric, 100), 4000) \
                     ELSE 4000 END, \
                'pid', holder->'pid', 'proc_start', holder->'proc_start', \
                'boot_id', holder->'boot_id', 'pid_ns', holder->'pid_ns', \
                'host', holder->'host', 'machine_id', holder->'machine_id')) END AS fences \
         FROM sidelease_leases WHERE name = $1), \
     fences AS (SELECT COALESCE((SELECT fences FROM prev), '[]'::jsonb) AS list), \
     fence AS (SELECT LEAST((SELECT ms FROM clock) + 4002, COALESCE((SELECT max((f->>'until')::numeric) \
         FROM jsonb_array_elements((SELECT list FROM fences)) f), 0))::bigint AS until) ";

/// The record a holder-row write stores: the holder's (`$3`), with the
/// fences it found, which lie ahead, and the latest of them as an earlier
/// version reads it (`fence_until_ms`).
const ROW_HOLDER: &str =
    "$3::jsonb || CASE WHEN jsonb_array_length((SELECT list FROM fences)) > 0 \
     THEN jsonb_build_object('fences', (SELECT list FROM fences), \
          'fence_until_ms', (SELECT until FROM fence)) ELSE '{}'::jsonb END";

/// What a holder-row write returns: the generation, the previous row's
/// generation, record and release, the server backend, how many
/// milliseconds of the fence are left, and each fence with the
/// milliseconds left of it (`left`, at most 4 s) and who it is for.
const ROW_RETURNING: &str = "RETURNING t.generation, (SELECT generation FROM prev), \
     (SELECT holder FROM prev), (SELECT released_at FROM prev), pg_backend_pid(), \
     GREATEST((SELECT until FROM fence) - (SELECT ms FROM clock), 0), \
     (SELECT COALESCE(jsonb_agg(f || jsonb_build_object('left', GREATEST(LEAST( \
         (f->>'until')::numeric - (SELECT ms FROM clock), 4002), 0))), '[]'::jsonb)::text \
      FROM jsonb_array_elements((SELECT list FROM fences)) f)";

/// The holder-row write: the generation grows (the fencing token), and the
/// previous holder's record and the fence left come back. `$1` the name,
/// `$2` the key, `$3` the holder's record; `guard` is the condition the
/// row is written under (the shared session's checks, or `true`).
pub(crate) fn upsert_sql(guard: &str) -> String {
    format!(
        "{ROW_PREVIOUS} INSERT INTO sidelease_leases AS t \
         (name, key, generation, holder, acquired_at, released_at) \
         SELECT $1, $2, 1, {ROW_HOLDER}, now(), NULL WHERE {guard} \
         ON CONFLICT (name) DO UPDATE SET generation = t.generation + 1, key = EXCLUDED.key, \
         holder = EXCLUDED.holder, acquired_at = now(), released_at = NULL {ROW_RETURNING}"
    )
}

/// A release's row write: `$1` the name, `$2` the holder's generation.
pub(crate) const UPDATE_RELEASED: &str =
    "UPDATE sidelease_leases SET released_at = now() WHERE name = $1 AND generation = $2";

/// Record the release (so the next holder reads a clean one), then unlock:
/// in that order, or the next holder could read the row before it says so.
pub(crate) async fn release_row(c: &Client, t: &Target, generation: i64) -> Result<()> {
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&t.name, Type::TEXT), (&generation, Type::INT8)];
    let record = c.query_typed(UPDATE_RELEASED, &params);
    // One round trip: the server runs the update (and commits it) before
    // the unlock, since it runs a connection's requests in order.
    let (recorded, unlocked) = in_order(record, unlock(c, t.key)).await;
    recorded.map_err(|e| pg_error(t, "update", &e))?;
    unlocked.map_err(|e| pg_error(t, "unlock", &e))
}
