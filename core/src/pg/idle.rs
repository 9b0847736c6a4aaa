//! A lease's own session, kept a moment after a clean release for the next
//! acquisition of this process that goes alone to the same server: opening
//! one costs a TCP handshake, TLS, SCRAM's key stretching on both ends and
//! a server process (about 20 ms here, most of it CPU), which a worker that
//! waits for a lease per job would otherwise pay every time.
//!
//! Only a session that reached its server directly is kept (through a
//! pooler it would hold one of the pool's few server sessions from the
//! next client), only after a release the server confirmed and only with
//! no advisory lock left on it, and never one whose socket was handed on
//! to a command. The thread that ran the lease keeps it, and takes the
//! next acquisition in its place; a fork child forgets the list
//! (`local.rs`), since those threads are not in it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::conn::{
    cancel_request, in_order, io_error, release_row, seconds, Conn, ROW_LOCK_TIMEOUT,
};
use super::local;
use super::session::{Run, HEARTBEAT_DEADLINE};
use super::target::Target;
use crate::error::Result;

/// How long a released session waits for the next acquisition: well
/// inside the server's own `idle_session_timeout` (10 s, `conn.rs`).
pub(super) const IDLE_KEEP: Duration = Duration::from_secs(2);

/// What a session thread does next: run this acquisition, on this
/// connection if it is still open.
pub(super) type Next = Option<(Box<Run>, Option<Conn>)>;

/// Hand `run` to a kept session of its server; back if there is none.
pub(super) fn hand(run: Box<Run>) -> Option<Box<Run>> {
    let server = run.target.server.clone();
    let mut run = run;
    while let Some(tx) = local::take_idle(&server) {
        // A session that stopped waiting has closed its channel: the send
        // fails and gives the acquisition back, never drops it.
        match tx.send(run) {
            Ok(()) => return None,
            Err(tokio::sync::mpsc::error::SendError(back)) => run = back,
        }
    }
    Some(run)
}

/// A lease's release on its own session, with every advisory lock of the
/// session let go in the same round trip when the session may be kept
/// (`keep`): session advisory locks nest, and one unlock per lock taken is
/// this library's rule; this makes a failure of the rule harmless. The
/// release's outcome, and the offer of the session if it is to be kept,
/// listed already, so the caller's next acquisition, made as soon as it
/// has the answer, finds it.
pub(super) async fn release(
    conn: &Conn,
    t: &Arc<Target>,
    generation: i64,
    keep: bool,
) -> (Result<()>, Option<Kept>) {
    if !keep {
        return (release_ending(conn, t, generation).await, None);
    }
    let all = tokio::time::timeout(HEARTBEAT_DEADLINE, conn.client.query_one(UNLOCK_ALL, &[]));
    let (r, all) = in_order(release_ending(conn, t, generation), all).await;
    if r.is_err() || !matches!(all, Ok(Ok(_))) || conn.task.is_finished() {
        return (r, None);
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Box<Run>>();
    local::offer_idle(&t.server, tx.clone());
    (
        r,
        Some(Kept {
            tx,
            rx,
            server: t.server.clone(),
        }),
    )
}

/// A kept session's listing.
pub(super) struct Kept {
    tx: Offer,
    rx: UnboundedReceiver<Box<Run>>,
    server: String,
}

const UNLOCK_ALL: &str = "SELECT pg_advisory_unlock_all()";

/// The session after its lease's release: kept for `IDLE_KEEP` when it was
/// offered, else closed. The next acquisition it takes, if any.
pub(super) async fn rest(conn: Conn, kept: Option<Kept>) -> Next {
    let Some(Kept { tx, mut rx, server }) = kept else {
        conn.close().await;
        return None;
    };
    let server = &server;
    let mut conn = conn;
    let ended = tokio::select! {
        run = rx.recv() => return run.map(|r| (r, Some(conn))),
        _ = tokio::time::sleep(IDLE_KEEP) => false,
        _ = &mut conn.task => true,
    };
    // An acquisition may be on its way meanwhile (it took this session
    // from the list before the close below): a test build widens the gap.
    crate::faults::step("idle.ended");
    // No more sends from here on; one made before is still taken, on this
    // connection unless the server ended it.
    rx.close();
    local::forget_idle(server, &tx);
    let run = rx.try_recv().ok();
    if ended {
        // Its task has given its result: `close` would poll it again,
        // which panics, and this thread would drop the acquisition.
        drop(conn);
        return run.map(|r| (r, None));
    }
    match run {
        Some(run) => Some((run, Some(conn))),
        None => {
            conn.close().await;
            None
        }
    }
}

/// `UnboundedSender<Box<Run>>` as the list in `local.rs` keeps it.
pub(super) type Offer = UnboundedSender<Box<Run>>;

/// A held lease's release on its own session, bounded: a row lock held by
/// a fencing transaction may delay it up to the session's lock timeout;
/// past that (a commit waiting for a synchronous standby that is gone) the
/// server is asked to end the write, which it then commits locally (with
/// a warning), all a release needs; a dead network does not hang it (the
/// server then ends the session, and the lock, itself).
async fn release_ending(conn: &Conn, t: &Arc<Target>, generation: i64) -> Result<()> {
    let limit =
        Duration::from_millis(ROW_LOCK_TIMEOUT.parse::<u64>().unwrap_or(5000)) + HEARTBEAT_DEADLINE;
    let write = release_row(&conn.client, t, generation);
    tokio::pin!(write);
    if let Ok(r) = tokio::time::timeout(limit, &mut write).await {
        return r;
    }
    // Not waited for: it goes while the answer is waited for. Landing
    // after the write, it ends the unlock pipelined behind it: the release
    // then reports an error though recorded, and the session, not kept,
    // closes, which frees the lock all the same.
    drop(tokio::spawn(cancel_request(t, conn)));
    match tokio::time::timeout(HEARTBEAT_DEADLINE, &mut write).await {
        Ok(r) => r,
        Err(_) => Err(io_error(
            t,
            "release",
            format!(
                "no answer from the server within {}; the server ends the session, and frees \
                 the lock, when it notices",
                seconds(limit + HEARTBEAT_DEADLINE)
            ),
        )),
    }
}
