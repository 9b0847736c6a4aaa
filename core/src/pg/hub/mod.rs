//! One shared session per server per process. A try-acquisition goes to
//! the session this process already has to the lease's server (opening it
//! if there is none): the lock and the holder row in one round trip, and
//! the lease then lives on that session beside the others, one heartbeat
//! confirming them all. Whatever the shared session cannot settle at once
//! (the lock is held elsewhere, the row is locked by a fencing transaction,
//! the table is missing, a pooler sits between) goes to the acquisition's
//! own thread and connection, as every acquisition did before, so every
//! wait, error and refusal is that path's.
//!
//! Losing the shared session loses every lease on it, each told on its own
//! (its `on_lost` callbacks and lost descriptor). A lease whose own bound
//! (`confirm_within`) passes is lost alone, and its lock is given back.

mod acquire;
mod release;
mod witness;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::attempt::Slot;
use super::confirm::{ended, silent, Confirmed, ENDED_GRACE};
use super::conn::{
    describe, heartbeat, io_error, open_tracked, probe, unlock, upsert_sql, Conn, CONNECT_TIMEOUT,
    FOREIGN_LOCKS, POOLER_CHECK, UPDATE_RELEASED,
};
use super::link::Cmd;
use super::local;
use super::session::{self, HEARTBEAT_DEADLINE};
use super::target::Target;
use crate::error::{Error, Lost, Result};
use crate::lease::Shared;
use crate::options::{Options, Wait};

/// How long a holder-row statement on the shared session may wait for a
/// row lock (an application's fencing transaction holding it `FOR SHARE`):
/// the session's other leases wait behind it, heartbeats included, so a
/// longer wait is taken elsewhere.
const ROW_LOCK_MS: &str = "20";

/// How long a shared session is not tried again after it found a pooler,
/// a standby or a foreign lock (each acquisition then uses its own
/// connection, which says what is wrong).
const REFUSED_FOR: Duration = Duration::from_secs(10);

/// How long a shared session stays open once it holds no lease: one-shot
/// tries in a row (the lock held elsewhere each time) use one connection,
/// not one each.
const LINGER: Duration = Duration::from_secs(1);
/// After a heartbeat that took longer than the interval, how long the
/// commands queued meanwhile (a release, a try) have before the next one.
const COMMANDS_FIRST: Duration = Duration::from_millis(5);

/// The lock, in the first of two statements sent together: when it is
/// granted, the session notes this try's nonce (`$3`), which no other try
/// ever has, so the statement after it writes the row only for the try
/// that locked (a stale note from an earlier try never matches, and a
/// pooled server session never has it). A look at `pg_locks` would cost a
/// scan of every lock on the server, per try.
const GUARDED_LOCK: &str = "SELECT pg_backend_pid(), set_config('sidelease.locked', \
     CASE WHEN current_setting('sidelease.session', true) IS NOT DISTINCT FROM $2 \
     THEN CASE WHEN pg_try_advisory_lock($1) THEN $3 ELSE '' END ELSE '' END, false) = $3";

/// The holder row, in the second: written (and the previous holder's
/// record read) by the statement after the lock, so it sees the release
/// the previous holder committed before unlocking, and only if this try's
/// lock was granted. `$4` the session's value, `$5` the nonce.
static GUARDED_UPSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    upsert_sql(
        "current_setting('sidelease.session', true) IS NOT DISTINCT FROM $4 \
         AND current_setting('sidelease.locked', true) = $5",
    )
});

/// The unlock after the release's row write, in the same round trip: it
/// runs only if that write committed (a row lock can time it out).
const UNLOCK_IF_RECORDED: &str = "SELECT pg_advisory_unlock($1) WHERE EXISTS (SELECT 1 FROM \
     sidelease_leases WHERE name = $2 AND generation = $3 AND released_at IS NOT NULL)";

/// One acquisition handed to the shared session, with what its own thread
/// needs if the shared session cannot settle it.
pub(crate) struct TryReq {
    pub target: Arc<Target>,
    pub opts: Options,
    pub started: Instant,
    pub slot: Arc<Slot>,
    pub tx: UnboundedSender<Cmd>,
    pub rx: UnboundedReceiver<Cmd>,
}

impl TryReq {
    /// The acquisition's own thread and connection, as without sharing.
    fn alone(self) {
        let slot = self.slot.clone();
        if let Err(e) = session::spawn(
            self.target,
            self.opts,
            self.started,
            self.slot,
            self.tx,
            self.rx,
        ) {
            slot.finish(Err(e));
        }
    }

    /// Whether the caller's wait lasts beyond now.
    fn waits_on(&self) -> bool {
        match self.opts.wait {
            Wait::NoWait => false,
            Wait::Timeout(d) => self.started.elapsed() < d,
            Wait::Forever => true,
        }
    }

    /// How long connecting may take: the caller's time left when that is
    /// shorter than `CONNECT_TIMEOUT`.
    fn patience(&self) -> Duration {
        match self.opts.wait {
            Wait::Timeout(d) => d
                .saturating_sub(self.started.elapsed())
                .clamp(Duration::from_millis(1), CONNECT_TIMEOUT),
            _ => CONNECT_TIMEOUT,
        }
    }
}

/// Start an acquisition: on the shared session of its server, or alone
/// when that session refused to be shared lately.
pub(crate) fn start(mut req: TryReq) -> Result<()> {
    loop {
        let (tx, fresh) = match local::hub(&req.target.server) {
            local::Hub::Refused => {
                return session::spawn(req.target, req.opts, req.started, req.slot, req.tx, req.rx)
            }
            local::Hub::Open(tx) => (tx, None),
            local::Hub::New(tx, rx) => (tx, Some(rx)),
        };
        if let Some(rx) = fresh {
            spawn(req.target.clone(), tx.clone(), rx)?;
        }
        match tx.send(Cmd::Try(Box::new(req))) {
            Ok(()) => return Ok(()),
            // That session just closed: open another.
            Err(tokio::sync::mpsc::error::SendError(Cmd::Try(back))) => {
                local::forget_hub(&back.target.server, &tx);
                req = *back;
            }
            Err(_) => unreachable!("a Try was sent"),
        }
    }
}

fn spawn(target: Arc<Target>, tx: UnboundedSender<Cmd>, rx: UnboundedReceiver<Cmd>) -> Result<()> {
    let shown = target.shown.clone();
    // Reachable from here too: if the thread cannot be made, what other
    // threads queued on the channel meanwhile goes on alone.
    let handed = Arc::new(std::sync::Mutex::new(Some(rx)));
    let theirs = handed.clone();
    let (server, their_tx) = (target.server.clone(), tx.clone());
    let made = std::thread::Builder::new()
        .name("sidelease-pg-shared".into())
        .spawn(move || {
            let Some(rx) = theirs.lock().unwrap_or_else(|e| e.into_inner()).take() else {
                return;
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(run(target, their_tx, rx)),
                Err(_) => drain(&target.server, &their_tx, rx),
            }
        });
    match made {
        Ok(_) => Ok(()),
        Err(e) => {
            if let Some(rx) = handed.lock().unwrap_or_else(|e| e.into_inner()).take() {
                drain(&server, &tx, rx);
            }
            Err(Error::io("pthread_create", Path::new(&shown), e))
        }
    }
}

/// A lease held on the shared session.
struct Member {
    target: Arc<Target>,
    generation: i64,
    confirmed: Arc<Confirmed>,
    shared: Weak<Shared>,
}

struct Hub {
    conn: Conn,
    pid: i32,
    /// When the session's backend started (`witness::BORN`): with `pid`,
    /// what the witness knows it by (`None`: no witness, as through a
    /// pooler).
    born: Option<i64>,
    /// The target the session was opened for: the witness connects as it.
    first: Arc<Target>,
    /// The witness's connection, opened at the first stall (`witness.rs`).
    witness: witness::Witness,
    server: String,
    tx: UnboundedSender<Cmd>,
    members: HashMap<i64, Member>,
    /// Keys whose lock this session may still hold for no lease (one lost
    /// on its own bound, an unlock or a try that got no answer in time):
    /// never tried here, and given back once the session answers again;
    /// with the nonce of a holder row a try may have written meanwhile,
    /// which is then recorded released first.
    held: HashMap<i64, Option<(Arc<Target>, String)>>,
    /// Keys released while their row is written on a side connection (a
    /// fencing transaction held it): locked until that write is done.
    recording: HashSet<i64>,
    /// Keys of leases lost on their own bound whose holders are being told
    /// (on a thread of their own): not given back until they were.
    telling: HashSet<i64>,
    /// When the next heartbeat is due.
    next: tokio::time::Instant,
    /// A try's and a release's statements, once prepared on this session.
    prepared: Option<Prepared>,
}

/// The statements of a try and a release, parsed and planned once per
/// session rather than once per statement (which was half of a cycle's
/// time, bench/).
#[derive(Clone)]
struct Prepared {
    lock: tokio_postgres::Statement,
    upsert: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    unlock: tokio_postgres::Statement,
}

async fn run(first: Arc<Target>, tx: UnboundedSender<Cmd>, mut rx: UnboundedReceiver<Cmd>) {
    let server = first.server.clone();
    let Some(Cmd::Try(req)) = rx.recv().await else {
        return drain(&server, &tx, rx);
    };
    // Tries that come while the session opens wait for it, unless their
    // caller's time is shorter than the opening's: those go alone.
    let mut queued: Vec<Box<TryReq>> = Vec::new();
    // Taken once: the error below names the time this opening was given.
    let patience = req.patience();
    let taken = std::sync::atomic::AtomicBool::new(false);
    let opening = tokio::time::timeout(
        patience,
        open_tracked(&first, Some(app_name("shared")), &taken),
    );
    tokio::pin!(opening);
    let opened = loop {
        tokio::select! {
            r = &mut opening => break r,
            cmd = rx.recv() => match cmd {
                Some(Cmd::Try(other)) if other.patience() < req.patience() => other.alone(),
                Some(Cmd::Try(other)) => queued.push(other),
                Some(_) => {}
                None => break (&mut opening).await,
            },
        }
    };
    let conn = match opened {
        Ok(Ok(c)) => c,
        // The first acquisition reports it, as its own connection would
        // have; the others try on their own.
        Ok(Err(e)) => {
            req.slot.finish(Err(e));
            queued.into_iter().for_each(|q| q.alone());
            return drain(&server, &tx, rx);
        }
        // Unanswered: an acquisition that may wait longer goes on alone,
        // asking again while its wait lasts (a pooler's server session may
        // come free); one that may not reports it.
        Err(_) if !req.waits_on() => {
            let why = super::conn::unanswered(req.opts.wait, patience);
            req.slot.finish(Err(io_error(
                &first,
                "connect",
                match taken.load(std::sync::atomic::Ordering::Relaxed) {
                    true => super::pooler::unanswered_taken(why),
                    false => why,
                },
            )));
            queued.into_iter().for_each(|q| q.alone());
            return drain(&server, &tx, rx);
        }
        Err(_) => {
            req.alone();
            queued.into_iter().for_each(|q| q.alone());
            return drain(&server, &tx, rx);
        }
    };
    // Within what is left of the first acquisition's time: past it, that
    // acquisition goes alone (and says so) without refusing the session.
    let (pid, born) = match tokio::time::timeout(req.patience(), shareable(&first, &conn)).await {
        Ok(Some(it)) => it,
        Err(_) => {
            conn.close().await;
            req.alone();
            queued.into_iter().for_each(|q| q.alone());
            return drain(&server, &tx, rx);
        }
        Ok(None) => {
            conn.close().await;
            local::refuse_hub(&server, &tx, REFUSED_FOR);
            req.alone();
            queued.into_iter().for_each(|q| q.alone());
            return drain(&server, &tx, rx);
        }
    };
    let mut hub = Hub {
        conn,
        pid,
        born,
        first: first.clone(),
        witness: Default::default(),
        server,
        tx,
        members: HashMap::new(),
        held: HashMap::new(),
        recording: HashSet::new(),
        telling: HashSet::new(),
        next: tokio::time::Instant::now(),
        prepared: None,
    };
    hub.try_one(*req).await;
    for q in queued {
        hub.try_one(*q).await;
    }
    let lost = hub.serve(&mut rx).await;
    let Hub {
        conn,
        server,
        tx,
        members,
        witness,
        ..
    } = hub;
    local::forget_hub(&server, &tx);
    if let Some(w) = witness.into_inner() {
        w.task.abort();
    }
    match lost {
        None => conn.close().await,
        Some(reason) => {
            // Close the connection first, so the server can end the
            // session (and free the locks) while the loss callbacks run.
            conn.task.abort();
            drop(conn.client);
            for m in members.values() {
                lose(m, reason.clone());
            }
        }
    }
    drain(&server, &tx, rx);
}

/// What a shared session's `application_name` says: whose it is, and
/// which of its connections (`shared`, or the `witness`).
fn app_name(role: &str) -> String {
    let me = crate::platform::process::current();
    let mut s = format!(
        "sidelease {}@{} {role}",
        me.pid,
        me.host.as_deref().unwrap_or("?")
    );
    s.retain(|c| c.is_ascii() && !c.is_ascii_control());
    s.truncate(63);
    s
}

/// The checks an acquisition's own connection makes, once for the shared
/// session: its own server session (no transaction pooler), a primary,
/// no advisory lock it did not take. Its backend PID (and when that
/// backend started) if it may be shared.
async fn shareable(t: &Target, conn: &Conn) -> Option<(i32, Option<i64>)> {
    let (lport, laddr, rport, raddr) = conn.ends_params();
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 6] = [
        (&ROW_LOCK_MS, Type::TEXT),
        (&conn.session, Type::TEXT),
        (&lport, Type::INT4),
        (&laddr, Type::TEXT),
        (&rport, Type::INT4),
        (&raddr, Type::TEXT),
    ];
    let sql = format!(
        "SELECT pg_backend_pid(), NOT pg_is_in_recovery() AND {POOLER_CHECK} AND NOT {FOREIGN_LOCKS} \
             AND set_config('lock_timeout', $1, false) IS NOT NULL, \
             (inet_client_port() IS NOT DISTINCT FROM $3 AND \
              inet_client_addr() IS NOT DISTINCT FROM NULLIF($4, '')::inet AND \
              inet_server_port() IS NOT DISTINCT FROM $5 AND \
              inet_server_addr() IS NOT DISTINCT FROM NULLIF($6, '')::inet), {}",
        witness::BORN
    );
    let rows = tokio::time::timeout(CONNECT_TIMEOUT, conn.client.query_typed(&sql, &params))
        .await
        .ok()?
        .ok()?;
    let row = rows.first()?;
    let (pid, fine, direct): (i32, bool, bool) = (row.get(0), row.get(1), row.get(2));
    let born: Option<i64> = row.try_get(3).ok().flatten();
    if !fine {
        return None;
    }
    if !direct {
        // Something sits between: a session pool is fine, a transaction
        // pooler is not; the witness is not (see `witness`).
        probe(t, conn, pid).await.ok()?;
        return Some((pid, None));
    }
    Some((pid, born))
}

/// Answer what is left in a closed session's channel: acquisitions go on
/// alone, releases find their lock gone with the session.
fn drain(server: &str, tx: &UnboundedSender<Cmd>, mut rx: UnboundedReceiver<Cmd>) {
    local::forget_hub(server, tx);
    rx.close();
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Cmd::Try(req) => req.alone(),
            Cmd::Leave(_, _, reply) | Cmd::Release(reply) => {
                let _ = reply.send(Ok(()));
            }
            Cmd::Confirm(reply) => {
                let _ = reply.send(false);
            }
            Cmd::Recorded(_, reply) => {
                let _ = reply.send(Ok(()));
            }
            Cmd::HandOn(reply) => {
                let _ = reply.send(Err(shared_hand_on()));
            }
            Cmd::Cancel | Cmd::Share | Cmd::Told(_) => {}
        }
    }
}

fn lose(m: &Member, reason: String) {
    if let Some(s) = m.shared.upgrade() {
        s.mark_lost(Lost {
            lease_path: PathBuf::from(&m.target.shown),
            reason,
            holders: Vec::new(),
        });
    }
}

impl Hub {
    /// Serve until the session ends (`Some(reason)`: lost) or holds no
    /// lease any more (`None`).
    async fn serve(&mut self, rx: &mut UnboundedReceiver<Cmd>) -> Option<String> {
        let mut idle_until = None;
        loop {
            let idle = self.members.is_empty() && self.held.is_empty() && self.recording.is_empty();
            idle_until = match (idle, idle_until) {
                (false, _) => None,
                (true, None) => Some(tokio::time::Instant::now() + LINGER),
                (true, until) => until,
            };
            let close_at = idle_until.unwrap_or_else(tokio::time::Instant::now);
            // In this order: a session that ended says so first, and a
            // heartbeat due goes before the commands queued (a flood of
            // tries must not starve the others' confirmations; a slow one
            // leaves the commands `COMMANDS_FIRST`, see `beat`).
            tokio::select! {
                biased;
                end = &mut self.conn.task => return Some(ended(end)),
                _ = tokio::time::sleep_until(self.next), if !idle => {
                    if let Err(why) = self.beat().await {
                        return Some(why);
                    }
                }
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Try(req)) => {
                        self.try_one(*req).await;
                        // Lingering counts from the last try.
                        idle_until = None;
                    }
                    Some(Cmd::Leave(key, generation, reply)) => {
                        self.leave(key, generation, reply).await
                    }
                    Some(Cmd::Recorded(done, reply)) => {
                        let (t, key, recorded) = *done;
                        if self.recording.remove(&key) {
                            let unlocked = self.unlock(&t, key).await;
                            let _ = reply.send(recorded.and(unlocked));
                        }
                    }
                    Some(Cmd::Confirm(reply)) => match self.beat().await {
                        Ok(true) => {
                            let _ = reply.send(true);
                        }
                        // No answer in time: the caller hears none (unknown,
                        // not confirmed).
                        Ok(false) => drop(reply),
                        Err(why) => {
                            let _ = reply.send(false);
                            return Some(why);
                        }
                    },
                    Some(Cmd::Told(keys)) => keys.iter().for_each(|k| {
                        self.telling.remove(k);
                    }),
                    Some(Cmd::Release(reply)) => { let _ = reply.send(Ok(())); }
                    Some(Cmd::HandOn(reply)) => { let _ = reply.send(Err(shared_hand_on())); }
                    Some(Cmd::Cancel | Cmd::Share) => {}
                    None => return None,
                },
                _ = tokio::time::sleep_until(close_at), if idle => return None,
            }
        }
    }

    /// How often to ask: four times within the tightest bound of the
    /// leases here.
    fn interval(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.confirmed.interval())
            .min()
            .unwrap_or(Duration::from_millis(250))
    }

    /// One heartbeat for every lease here: `Ok(true)` answered in time,
    /// `Ok(false)` not within the tightest bound. A lease whose own bound
    /// passed is lost alone (and its lock given back); `Err` loses them all.
    async fn beat(&mut self) -> std::result::Result<bool, String> {
        self.expire();
        // Until the tightest bound has passed on the millisecond clock the
        // ages are read on (2 ms past it, for its rounding), so a question
        // left unanswered finds that lease expired, never "not yet"; from
        // its share on, the witness confirms the leases meanwhile (a
        // statement holding this one up), and the wait still ends there,
        // so commands queued get their turn.
        let left = self
            .members
            .values()
            .map(|m| m.confirmed.bound().saturating_sub(m.confirmed.age()))
            .min()
            .unwrap_or(HEARTBEAT_DEADLINE)
            + Duration::from_millis(2);
        let until = tokio::time::Instant::now() + left;
        let sent = Confirmed::clock();
        self.next = tokio::time::Instant::now() + self.interval();
        let answer = {
            let asked = heartbeat(&self.conn.client, &self.conn.session);
            tokio::pin!(asked);
            match tokio::time::timeout(self.share(None).min(left), &mut asked).await {
                Ok(a) => Some(a),
                Err(_) => tokio::select! {
                    biased;
                    a = &mut asked => Some(a),
                    () = self.witness(Some(until)) => None,
                },
            }
        };
        // A heartbeat slower than the interval leaves the next one due at
        // once, and `serve` asks a due heartbeat first, so a queued release
        // could wait behind beat after beat (2 s each on a cut network: a
        // release took 9 s). Commands queued meanwhile go first.
        self.next = self.next.max(tokio::time::Instant::now() + COMMANDS_FIRST);
        match answer {
            Some(Ok((now, true))) if now == self.pid => {
                for m in self.members.values() {
                    m.confirmed.answered(sent);
                }
                self.expire();
                self.give_back().await;
                Ok(true)
            }
            Some(Ok((now, _))) => Err(format!(
                "the heartbeat ran in another server session (pid {}, then {now}): a \
                 transaction- or statement-mode pooler sits between this process and the \
                 server, and the lock stayed with the old session",
                self.pid
            )),
            Some(Err(e)) if e.is_closed() => {
                // A lease whose bound passed (this process was frozen) is
                // lost now, not after the wait for the server's reason.
                self.expire();
                let why = format!("the lease's session failed: {}", describe(&e));
                Err(
                    match tokio::time::timeout(ENDED_GRACE, &mut self.conn.task).await {
                        Ok(end @ Ok(Err(_))) => ended(end),
                        _ => why,
                    },
                )
            }
            // A cancel request for a statement that ended by itself as
            // it came (see `bounded`) ends this one: not an answer, and
            // not a failure of the session.
            Some(Err(e)) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
                self.expire();
                Ok(false)
            }
            Some(Err(e)) => Err(format!("the lease's session failed: {}", describe(&e))),
            // Unanswered, but each lease here confirmed by the witness
            // since this question was sent: as good as an answer for
            // them (though no lock is given back on a held-up session).
            None if self.witnessed_since(sent) => Ok(true),
            // The tightest bound passed: that lease is lost, the others
            // wait on.
            None => {
                self.expire();
                Ok(false)
            }
        }
    }

    /// Give back the locks no lease holds any more (the session answered:
    /// it is not stalled), recording first a holder row a try may have
    /// written for nobody.
    async fn give_back(&mut self) {
        let keys: Vec<i64> = self
            .held
            .keys()
            .copied()
            .filter(|k| !self.telling.contains(k))
            .collect();
        for key in keys {
            let Some(phantom) = self.held.get(&key).cloned() else {
                continue;
            };
            if let Some((t, nonce)) = &phantom {
                let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
                    [(&t.name, Type::TEXT), (nonce, Type::TEXT)];
                let fix = self.conn.client.query_typed(
                    "UPDATE sidelease_leases SET released_at = now() WHERE name = $1 \
                     AND released_at IS NULL AND holder->>'nonce' = $2",
                    &params,
                );
                match self.bounded(&self.first, fix).await {
                    // Written, or not writable from here (no table, no
                    // privilege): no row of this try to record either way.
                    Ok(Ok(_)) => {}
                    // A row lock, or a cancel request meant for an earlier
                    // statement (see `bounded`): tried again next time.
                    Ok(Err(e))
                        if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
                            || e.code() == Some(&SqlState::QUERY_CANCELED) =>
                    {
                        continue
                    }
                    Ok(Err(_)) => {}
                    // Stalled again: the next answered heartbeat goes on.
                    Err(_) => return,
                }
            }
            if self.unlock_key(key).await {
                self.held.remove(&key);
            } else {
                return;
            }
        }
    }

    /// One unlock, bounded; false (and the key kept in `held`) when the
    /// session did not answer in time or refused.
    async fn unlock_key(&mut self, key: i64) -> bool {
        let ok = matches!(
            self.bounded(&self.first, unlock(&self.conn.client, key))
                .await,
            Ok(Ok(()))
        );
        if !ok {
            self.held.entry(key).or_insert(None);
        }
        ok
    }

    /// [`Hub::unlock_key`] for a release: its error names the lease.
    async fn unlock(&mut self, t: &Target, key: i64) -> Result<()> {
        if self.unlock_key(key).await {
            return Ok(());
        }
        Err(io_error(
            t,
            "unlock",
            "the shared session did not unlock the lease in time; it does once it answers again, \
             or the server does when the session ends",
        ))
    }

    /// Whether this session holds, or may hold, the key: advisory locks are
    /// reentrant, so it must never take it again.
    fn busy(&self, key: i64) -> bool {
        self.members.contains_key(&key)
            || self.held.contains_key(&key)
            || self.recording.contains(&key)
    }

    /// Lose, alone, each lease whose bound passed without an answer; its
    /// lock is given back once the session answers again.
    fn expire(&mut self) {
        let over: Vec<i64> = self
            .members
            .iter()
            .filter(|(_, m)| m.confirmed.expired())
            .map(|(k, _)| *k)
            .collect();
        let mut gone = Vec::new();
        for key in over {
            if let Some(m) = self.members.remove(&key) {
                self.held.entry(key).or_insert(None);
                gone.push(m);
            }
        }
        if gone.is_empty() {
            return;
        }
        // Told on a thread of their own, so a slow callback does not hold
        // up the other leases' heartbeats; their locks are given back only
        // once they were told (`Cmd::Told`).
        let keys: Vec<i64> = gone.iter().map(|m| m.target.key).collect();
        self.telling.extend(keys.iter().copied());
        let gone = Arc::new(std::sync::Mutex::new(Some(gone)));
        let theirs = gone.clone();
        let tx = self.tx.clone();
        let told = keys.clone();
        let made = std::thread::Builder::new()
            .name("sidelease-pg-lost".into())
            .spawn(move || {
                if let Some(gone) = theirs.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    gone.iter()
                        .for_each(|m| lose(m, silent(m.confirmed.bound())));
                }
                let _ = tx.send(Cmd::Told(told));
            });
        if made.is_err() {
            if let Some(gone) = gone.lock().unwrap_or_else(|e| e.into_inner()).take() {
                gone.iter()
                    .for_each(|m| lose(m, silent(m.confirmed.bound())));
            }
            keys.iter().for_each(|k| {
                self.telling.remove(k);
            });
        }
    }

    /// The statements, prepared on first use (one round trip for all
    /// four); `None` while they cannot be (no table yet, no answer).
    async fn prepared(&mut self) -> Option<Prepared> {
        if self.prepared.is_none() {
            let c = &self.conn.client;
            let all = async {
                tokio::try_join!(
                    c.prepare_typed(GUARDED_LOCK, &[Type::INT8, Type::TEXT, Type::TEXT]),
                    c.prepare_typed(
                        &GUARDED_UPSERT,
                        &[Type::TEXT, Type::INT8, Type::TEXT, Type::TEXT, Type::TEXT]
                    ),
                    c.prepare_typed(UPDATE_RELEASED, &[Type::TEXT, Type::INT8]),
                    c.prepare_typed(UNLOCK_IF_RECORDED, &[Type::INT8, Type::TEXT, Type::INT8]),
                )
            };
            if let Ok(Ok((lock, upsert, release, unlock))) = self.bounded(&self.first, all).await {
                self.prepared = Some(Prepared {
                    lock,
                    upsert,
                    release,
                    unlock,
                });
            }
        }
        self.prepared.clone()
    }
}

/// Why a lease on the shared session has no descriptor to hand on: a copy
/// of that socket would keep every lease of the process alive.
fn shared_hand_on() -> std::io::Error {
    std::io::Error::other(
        "a shared session carries other leases of this process: only a lease with a session \
         of its own (session=own) is handed on",
    )
}
