//! The thread of one PostgreSQL lease: it connects, takes the advisory lock
//! (one try, or a blocking `pg_advisory_lock` the server ends when the lock
//! is free), writes the holder row, then keeps the session: a heartbeat
//! every second that must be answered within two, and the connection's end
//! (terminated, server restarted, network cut) marks the lease lost. The
//! session asks the server to end it after 10 s without a statement, so a
//! holder that was cut off learns it lost the lease (≤ 3 s) before the
//! server can give it to anyone else (≥ 5 s).

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_postgres::types::Type;

use super::attempt::Slot;
use super::confirm::{beat, ended, silent, Beat, Confirmed, ENDED_GRACE};
use super::conn::{
    application_name, io_error, open_tracked, pg_error, pooler, probe, release_within,
    standby_error, Conn, Pooled, CONNECT_TIMEOUT, FOREIGN_LOCKS, POOLER_CHECK, ROW_LOCK_TIMEOUT,
};
use super::idle;
use super::inspect::contention;
use super::link::{Cmd, Link};
use super::local;
use super::target::Target;
use super::write::Claimed;
use crate::error::{Contention, Error, Lost, Result};
use crate::lease::Shared;
use crate::options::{Options, Wait};
use crate::record::{Content, Record};
use crate::registry;

/// How long a statement other than the heartbeat may wait for its answer
/// (a release, the cancel of a wait).
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(2);
/// A kept session made new for its next lease: named for it
/// (`application_name`, as `conn::open` sets it), and its lock timeout
/// back to the row write's bound (`SESSION_SETTINGS`), which a wait before
/// set to its caller's time (`wait.rs`; "0", none, for a wait without a
/// limit) and an attempt that does not wait does not set.
static RENEW_SESSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT set_config('application_name', $1, false), \
         set_config('lock_timeout', '{ROW_LOCK_TIMEOUT}', false)"
    )
});
/// Between reconnections while waiting (the server restarting, say).
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

pub(super) enum Step {
    /// `waited`: the session's lock timeout was the caller's, and goes
    /// back to the row-write bound with the row write; `claimed`: the row
    /// the wait's pipeline wrote (see `wait.rs`).
    Got {
        pid: i32,
        table: bool,
        waited: bool,
        claimed: Option<Box<Claimed>>,
    },
    Fail(Error),
    /// The connection broke while waiting: connect again if time is left.
    Broken(Error),
    Share,
    Cancelled,
    /// Look again (the probe for a pooler found none).
    Again,
}

/// Why connecting gave no session.
enum NoConn {
    Fail(Error),
    /// Not yet: look again (after the pause it took).
    Again,
    GivenUp,
}

pub(super) struct Run {
    pub(super) target: Arc<Target>,
    pub(super) opts: Options,
    pub(super) started: Instant,
    pub(super) slot: Arc<Slot>,
    pub(super) rx: UnboundedReceiver<Cmd>,
    tx: UnboundedSender<Cmd>,
    waiter_id: u64,
    /// The wait's row write, kept prepared for the session's life: closing
    /// it would cost a message right after the grant.
    pub(super) plan: Option<tokio_postgres::Statement>,
    /// This connection was found to reach a server session of its own
    /// through whatever sits between (see `conn::probe`).
    probed: bool,
    /// The server saw this connection's ends as its own: nothing sits
    /// between, and the session may be kept after a release (`idle.rs`).
    direct: bool,
}

pub(crate) fn spawn(
    target: Arc<Target>,
    opts: Options,
    started: Instant,
    slot: Arc<Slot>,
    tx: UnboundedSender<Cmd>,
    rx: UnboundedReceiver<Cmd>,
) -> Result<()> {
    let run = Run {
        waiter_id: registry::attempt_id(),
        plan: None,
        probed: false,
        direct: false,
        target,
        opts,
        started,
        slot,
        rx,
        tx,
    };
    // Given up before it began (a try on the shared session that went on
    // alone): nothing to run, and no kept session to spend on it.
    if run.slot.abandoned() {
        return Ok(());
    }
    let Some(run) = idle::hand(Box::new(run)) else {
        return Ok(());
    };
    let shown = run.target.shown.clone();
    std::thread::Builder::new()
        .name("sidelease-pg".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(async move {
                    // One acquisition, then those it is handed while its
                    // released session is kept (`idle.rs`).
                    let mut next: idle::Next = Some((run, None));
                    while let Some((run, conn)) = next {
                        next = run.main(conn).await;
                    }
                }),
                Err(e) => {
                    let err = Error::io("tokio runtime", Path::new(&run.target.shown), e);
                    run.slot.finish(Err(err));
                }
            }
        })
        .map(drop)
        .map_err(|e| Error::io("pthread_create", std::path::Path::new(&shown), e))
}

impl Run {
    fn deadline(&self) -> Option<Instant> {
        match self.opts.wait {
            Wait::NoWait => Some(self.started),
            Wait::Timeout(d) => self.started.checked_add(d),
            Wait::Forever => None,
        }
    }

    /// How long connecting, or the first statement, may take: the
    /// caller's time left when that is shorter than `CONNECT_TIMEOUT`.
    fn patience(&self) -> Duration {
        match (self.opts.wait, self.deadline()) {
            (Wait::Timeout(_), Some(d)) => d
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), CONNECT_TIMEOUT),
            _ => CONNECT_TIMEOUT,
        }
    }

    fn time_left(&self) -> bool {
        self.deadline().is_none_or(|d| Instant::now() < d)
    }

    /// Acquire, on `reused` (a kept session of the server) if given, and
    /// hold; what the thread runs next.
    async fn main(mut self: Box<Self>, mut reused: Option<Conn>) -> idle::Next {
        local::wait_for(&self.target.name, self.waiter_id, self.tx.clone());
        let mut connected_once = false;
        loop {
            if let Some(lease) = local::share(&self.target.identity) {
                self.slot.finish(Ok(lease));
                break;
            }
            if self.slot.abandoned() {
                break;
            }
            self.probed = false;
            let conn = match reused.take() {
                // A kept session that the server ended while it was kept
                // costs nothing: connect as if there were none.
                Some(conn) => match self.renew(conn).await {
                    Some(conn) => conn,
                    None => continue,
                },
                None => match self.connect(connected_once).await {
                    Ok(conn) => conn,
                    Err(NoConn::Fail(e)) => {
                        self.slot.finish(Err(e));
                        break;
                    }
                    Err(NoConn::Again) => continue,
                    Err(NoConn::GivenUp) => break,
                },
            };
            connected_once = true;
            match self.attempt(&conn).await {
                Step::Got {
                    pid,
                    table,
                    waited,
                    claimed,
                } => {
                    local::unwait(&self.target.name, self.waiter_id);
                    return self.claim(conn, pid, (table, waited), claimed).await;
                }
                Step::Fail(e) => {
                    conn.close().await;
                    self.slot.finish(Err(e));
                    break;
                }
                Step::Broken(e) => {
                    conn.close().await;
                    if !self.time_left() {
                        self.slot.finish(Err(e));
                        break;
                    }
                    if !self.pause().await {
                        break;
                    }
                }
                Step::Share => conn.close().await,
                Step::Cancelled | Step::Again => {
                    conn.close().await;
                    break;
                }
            }
        }
        if let Some(conn) = reused {
            conn.close().await;
        }
        local::unwait(&self.target.name, self.waiter_id);
        None
    }

    /// A kept session made new for this lease, or `None` (closed) if it
    /// did not answer as a sound one does: within the heartbeat's deadline
    /// and half the time connecting may take, so that a new connection has
    /// the other half (a server that went silent, with no reset to tell).
    async fn renew(&self, conn: Conn) -> Option<Conn> {
        let app = application_name(&self.target);
        let param: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 1] = [(&app, Type::TEXT)];
        let renewed = conn.client.query_typed(&RENEW_SESSION, &param);
        let bound = HEARTBEAT_DEADLINE.min(self.patience() / 2);
        match tokio::time::timeout(bound, renewed).await {
            Ok(Ok(_)) => Some(conn),
            _ => {
                conn.close().await;
                None
            }
        }
    }

    /// A new session to the server.
    async fn connect(&mut self, connected_once: bool) -> std::result::Result<Conn, NoConn> {
        let patience = self.patience();
        let started = std::sync::atomic::AtomicBool::new(false);
        let mut unanswered = false;
        let opened = tokio::time::timeout(patience, open_tracked(&self.target, None, &started))
            .await
            .unwrap_or_else(|_| {
                unanswered = started.load(std::sync::atomic::Ordering::Relaxed);
                let why = super::conn::unanswered(self.opts.wait, patience);
                Err(io_error(
                    &self.target,
                    "connect",
                    if unanswered {
                        super::pooler::unanswered_taken(why)
                    } else {
                        why
                    },
                ))
            });
        match opened {
            Ok(c) => Ok(c),
            Err(e) => {
                // A refusal the first time is the answer (a wrong
                // address, password, database), and so is no answer to
                // connecting (nothing there); a session the server or a
                // pooler took and then left unanswered is waiting for a
                // pooler's server session to come free, so it is asked
                // again while the caller's wait lasts, as after a
                // connection that broke.
                // So is a server at its connection limit (a session kept
                // for a moment, `idle.rs`, may be what fills it).
                let again = connected_once || unanswered || too_many(&e);
                if again && self.opts.wait != Wait::NoWait && self.time_left() {
                    return Err(match self.pause().await {
                        true => NoConn::Again,
                        false => NoConn::GivenUp,
                    });
                }
                Err(NoConn::Fail(e))
            }
        }
    }

    /// Sleep before reconnecting; false if the attempt was given up.
    async fn pause(&mut self) -> bool {
        if self.slot.abandoned() {
            return false;
        }
        // Never past the caller's deadline.
        let nap = self.deadline().map_or(RECONNECT_PAUSE, |d| {
            RECONNECT_PAUSE.min(d.saturating_duration_since(Instant::now()))
        });
        let sleep = tokio::time::sleep(nap);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return true,
                cmd = self.rx.recv() => match cmd {
                    Some(Cmd::Share) => return true,
                    Some(Cmd::Release(_) | Cmd::Confirm(_)) => {}
                    Some(Cmd::Try(_) | Cmd::Leave(..) | Cmd::Recorded(..) | Cmd::Told(_) | Cmd::HandOn(_)) => {}
                    Some(Cmd::Cancel) | None => return false,
                },
            }
        }
    }

    pub(super) fn lock_timeout_ms(&self) -> String {
        match self.deadline() {
            None => "0".into(),
            Some(d) => {
                let ms = d.saturating_duration_since(Instant::now()).as_millis();
                ms.clamp(1, i32::MAX as u128).to_string()
            }
        }
    }

    /// How long the holder row's write may wait for a row lock (an
    /// application's fencing transaction holding it): the caller's time
    /// left; `ROW_LOCK_TIMEOUT` without a limit or for one attempt, since
    /// the advisory lock is held meanwhile and a caller who gives up must
    /// not leave it held behind a stuck transaction.
    pub(super) fn row_lock_ms(&self) -> String {
        match self.opts.wait {
            Wait::Timeout(_) => self.lock_timeout_ms(),
            Wait::NoWait | Wait::Forever => ROW_LOCK_TIMEOUT.into(),
        }
    }

    async fn attempt(&mut self, conn: &Conn) -> Step {
        loop {
            // Given up meanwhile (while connecting, the kept session's
            // renewal, a pooler's probe): nothing more to ask the server,
            // not even a try that could take a free lock for nobody.
            if self.slot.abandoned() {
                return Step::Cancelled;
            }
            match self.attempt_once(conn).await {
                Step::Again => continue,
                step => return step,
            }
        }
    }

    async fn attempt_once(&mut self, conn: &Conn) -> Step {
        let c = &conn.client;
        let t = &*self.target;
        // The server sees this connection's two ends as its client's and
        // its own only when nothing sits between them (an ephemeral port
        // may repeat towards another destination, the whole pair does not);
        // otherwise, and over a Unix socket, the lock waits for the probe.
        let (lport, laddr, rport, raddr) = conn.ends_params();
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 7] = [
            (&t.key, Type::INT8),
            (&conn.session, Type::TEXT),
            (&lport, Type::INT4),
            (&laddr, Type::TEXT),
            (&self.probed, Type::BOOL),
            (&rport, Type::INT4),
            (&raddr, Type::TEXT),
        ];
        let sql = format!(
            "SELECT pg_backend_pid(), pg_is_in_recovery(), \
                 to_regclass('sidelease_leases') IS NOT NULL, pre.ours, pre.held_already, \
                 pre.direct, \
                 CASE WHEN pg_is_in_recovery() OR NOT pre.ours OR pre.held_already \
                           OR NOT (pre.direct OR $5) THEN false \
                      ELSE pg_try_advisory_lock($1) END \
             FROM (SELECT {POOLER_CHECK} AS ours, {FOREIGN_LOCKS} AS held_already, \
                          (inet_client_port() IS NOT DISTINCT FROM $3 AND \
                           inet_client_addr() IS NOT DISTINCT FROM NULLIF($4, '')::inet AND \
                           inet_server_port() IS NOT DISTINCT FROM $6 AND \
                           inet_server_addr() IS NOT DISTINCT FROM NULLIF($7, '')::inet) AS direct) pre"
        );
        let first = c.query_typed(&sql, &params);
        let patience = self.patience();
        let first = match tokio::time::timeout(patience, first).await {
            Ok(r) => r,
            Err(_) => {
                return Step::Broken(io_error(
                    t,
                    "query",
                    super::conn::unanswered(self.opts.wait, patience),
                ))
            }
        };
        let row = match first {
            Ok(mut rows) if rows.len() == 1 => rows.remove(0),
            Ok(_) => return Step::Fail(io_error(t, "query", "the server answered no row")),
            Err(e) => return Step::Broken(pg_error(t, "query", &e)),
        };
        let (pid, standby, table, ours, foreign, direct, got): (
            i32,
            bool,
            bool,
            bool,
            bool,
            bool,
            bool,
        ) = (
            row.get(0),
            row.get(1),
            row.get(2),
            row.get(3),
            row.get(4),
            row.get(5),
            row.get(6),
        );
        self.direct = direct;
        if standby {
            return Step::Fail(standby_error(t));
        }
        if !ours {
            return Step::Fail(pooler(t, Pooled::OtherSession));
        }
        if foreign {
            return Step::Fail(pooler(t, Pooled::ForeignLock));
        }
        if !direct && !self.probed {
            // Something sits between: a session pool is fine, a
            // transaction pooler is not; ask, then attempt again.
            // Within the caller's time, as connecting is.
            let patience = self.patience();
            let asked = tokio::time::timeout(patience, probe(t, conn, pid))
                .await
                .unwrap_or_else(|_| {
                    Err(io_error(
                        t,
                        "connect",
                        format!(
                            "{} (asking whether the pooler between keeps this connection's \
                             server session)",
                            super::conn::unanswered(self.opts.wait, patience)
                        ),
                    ))
                });
            return match asked {
                Ok(()) => {
                    self.probed = true;
                    Step::Again
                }
                Err(e @ Error::InvalidArgument { .. }) => Step::Fail(e),
                Err(e) => Step::Broken(e),
            };
        }
        if got {
            return Step::Got {
                pid,
                table,
                waited: false,
                claimed: None,
            };
        }
        if local::share_pending(&t.identity) || self.held_here(conn).await {
            return Step::Share;
        }
        if self.opts.wait == Wait::NoWait || !self.time_left() {
            let c = contention(conn, t, self.started).await;
            return Step::Fail(if self.opts.wait == Wait::NoWait {
                Error::InUse(Box::new(c))
            } else {
                Error::Timeout(Box::new(c))
            });
        }
        // Who the wait is for, once, from the row: only a row that is not
        // released names the lock's holder (a new holder may not have
        // written its own yet, and the old one would be a guess).
        if let Ok(Some((Some(holder), false))) = super::inspect::holder_row(&conn.client, t).await {
            self.slot.waiting(Contention {
                target: PathBuf::from(&t.shown),
                lease_path: PathBuf::from(&t.shown),
                holder: Some(holder),
                holders: Vec::new(),
                record_note: None,
                names: Vec::new(),
                inherited: None,
                waited: self.started.elapsed(),
            });
        }
        self.wait(conn, pid, table).await
    }

    /// Whether the session holding the lock is one of this process's own
    /// leases, reached through another spelling of the server (so the
    /// identity differed): share it rather than wait on ourselves.
    async fn held_here(&self, conn: &Conn) -> bool {
        let t = &*self.target;
        match super::inspect::lock_holder(&conn.client, t).await {
            Ok(Some(h)) => local::share_backend(
                &t.identity,
                &t.name,
                (conn.server.as_deref(), h.backend_pid as i32),
            ),
            _ => false,
        }
    }

    pub(super) async fn hold(
        mut self,
        mut conn: Conn,
        rec: Record,
        previous: Content,
        (generation, fences): (i64, super::fence::Fences),
        pid: i32,
        sent: u64,
    ) -> idle::Next {
        let t = self.target.clone();
        let shown = PathBuf::from(&t.shown);
        let link = Link::on_own(
            ManuallyDrop::new(self.tx.clone()),
            &t,
            (conn.server.clone(), pid),
            Arc::new(Confirmed::new(t.confirm_within, sent)),
            fences,
        );
        let confirmed = link.confirmed.clone();
        let shared = Arc::new(Shared::new_remote(
            shown.clone(),
            rec,
            previous,
            Box::new(link),
        ));
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        drop(self.tx);
        if !self
            .slot
            .finish_with(|| local::insert(&t.identity, &t.name, shared))
        {
            // Given up while the row was written: let go at once.
            let _ = release_within(&conn.client, &t, generation).await;
            conn.close().await;
            return None;
        }
        let mut next = tokio::time::Instant::now() + confirmed.interval();
        let mut asked: Option<std::sync::mpsc::SyncSender<bool>> = None;
        // A copy of the socket went to a command: the session is not kept.
        let (mut handed, direct) = (false, self.direct);
        let lost = loop {
            tokio::select! {
                cmd = self.rx.recv() => match cmd {
                    Some(Cmd::Release(reply)) => {
                        let (r, kept) = idle::release(&conn, &t, generation, direct && !handed).await;
                        // Unlocked and recorded: the caller need not wait
                        // for the session to close.
                        let _ = reply.send(r);
                        return idle::rest(conn, kept).await;
                    }
                    None => {
                        let (_, kept) = idle::release(&conn, &t, generation, direct && !handed).await;
                        return idle::rest(conn, kept).await;
                    }
                    Some(Cmd::HandOn(reply)) => {
                        let copy = conn.hand_on();
                        handed |= copy.is_ok();
                        let _ = reply.send(copy);
                    }
                    Some(Cmd::Confirm(reply)) => match beat(&conn, pid, &confirmed).await {
                        Ok(()) => {
                            let _ = reply.send(true);
                            next = tokio::time::Instant::now() + confirmed.interval();
                        }
                        Err(why) => {
                            asked = Some(reply);
                            break why;
                        }
                    },
                    Some(_) => {}
                },
                end = &mut conn.task => break Beat::Ended(end),
                _ = tokio::time::sleep_until(next) => match beat(&conn, pid, &confirmed).await {
                    Ok(()) => next = tokio::time::Instant::now() + confirmed.interval(),
                    Err(why) => break why,
                },
            }
        };
        let lost = match lost {
            Beat::Lost(why) => why,
            Beat::Ended(end) => ended(end),
            // The server's reason (a FATAL such as "terminating connection
            // due to administrator command") reaches the driver's task,
            // which may read it a moment after the statement failed.
            // Unless the bound passed already (this process was frozen):
            // the loss is told now, as `ensure_held` would.
            Beat::Closed(_) if confirmed.expired() => silent(confirmed.bound()),
            Beat::Closed(why) => match tokio::time::timeout(ENDED_GRACE, &mut conn.task).await {
                Ok(end @ Ok(Err(_))) => ended(end),
                _ => why,
            },
        };
        // Close the connection first, so the server can end the session
        // (and free the lock) while the loss callbacks run.
        conn.task.abort();
        drop(conn.client);
        if let Some(s) = weak.upgrade() {
            s.mark_lost(Lost {
                lease_path: shown,
                reason: lost,
                holders: Vec::new(),
            });
        }
        if let Some(reply) = asked {
            let _ = reply.send(false);
        }
        // Answer releases until the last handle goes.
        while let Some(cmd) = self.rx.recv().await {
            if let Cmd::Release(reply) = cmd {
                let _ = reply.send(Ok(()));
                return None;
            }
        }
        None
    }
}

/// Whether connecting was refused for the server's, the role's or the
/// database's connection limit (SQLSTATE 53300, as `conn::describe` words
/// it).
fn too_many(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.to_string().contains("(SQLSTATE 53300)"))
}
