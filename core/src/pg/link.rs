//! What a PostgreSQL lease's handle holds: the channel to its session's
//! thread (its own, or its server's shared one), which backend of which
//! server holds the lock, and when the server last confirmed it; and the
//! commands those threads take.

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::confirm::Confirmed;
use super::fence::Fences;
use super::target::Target;
use crate::error::{Error, Result};
use crate::lease::{Lease, Shared};
use crate::registry;

/// How long a release waits for its session's answer: the row write's
/// bound, a side connection's for a shared session, and a margin.
const RELEASE_ANSWER: Duration = Duration::from_secs(15);

pub(crate) enum Cmd {
    Release(std::sync::mpsc::SyncSender<Result<()>>),
    /// Ask the server now; answer whether it confirmed the session.
    Confirm(std::sync::mpsc::SyncSender<bool>),
    /// The acquisition was given up (cancelled, timed out by its caller).
    Cancel,
    /// Another thread of this process holds the lease now: share it.
    Share,
    /// For the shared session: a try-acquisition.
    Try(Box<super::hub::TryReq>),
    /// For the shared session: the last release of the lease with this key
    /// and generation.
    Leave(i64, i64, std::sync::mpsc::SyncSender<Result<()>>),
    /// For the shared session: a release's row, written on a connection of
    /// its own; unlock the key and answer.
    Recorded(
        Box<(Arc<Target>, i64, Result<()>)>,
        std::sync::mpsc::SyncSender<Result<()>>,
    ),
    /// For the shared session: the holders of these keys' lost leases were
    /// told.
    Told(Vec<i64>),
    /// A copy of the session's socket to hand to a command (its own
    /// session only).
    HandOn(std::sync::mpsc::SyncSender<std::io::Result<std::os::fd::OwnedFd>>),
}

/// A held PostgreSQL lease's line to its thread.
pub(crate) struct Link {
    tx: ManuallyDrop<UnboundedSender<Cmd>>,
    epoch: u64,
    thread: std::thread::ThreadId,
    pub identity: String,
    pub name: String,
    /// The lease's URL, password masked.
    shown: String,
    /// The server backend holding the lock, and the server it is on
    /// (`Conn::server`): a backend PID names a session on one server only.
    pub backend_pid: i32,
    pub server: Option<String>,
    /// When the server last confirmed the session (ms on `Confirmed`'s
    /// clock): at the acquisition, then at each answered heartbeat.
    pub confirmed: Arc<Confirmed>,
    /// On the shared session of its server: the lease's key and generation
    /// there.
    member: Option<(i64, i64)>,
    /// Until when a previous holder whose lock was taken from it may still
    /// believe it holds the lease, as the server judged it when the row
    /// was written, less the holders that provably ended since.
    pub fences: Fences,
}

impl Drop for Link {
    fn drop(&mut self) {
        // In a forked child the channel's other end (and its runtime) is
        // gone with the parent's threads: touch nothing.
        if self.epoch == registry::epoch() {
            // SAFETY: dropped once, here.
            unsafe { ManuallyDrop::drop(&mut self.tx) };
        }
    }
}

impl Link {
    /// A lease on its server's shared session (called on that session's
    /// thread).
    pub(crate) fn on_shared(
        tx: ManuallyDrop<UnboundedSender<Cmd>>,
        t: &Target,
        (server, backend_pid, generation): (Option<String>, i32, i64),
        confirmed: Arc<Confirmed>,
        fences: Fences,
    ) -> Link {
        Link {
            tx,
            epoch: registry::epoch(),
            thread: std::thread::current().id(),
            identity: t.identity.clone(),
            name: t.name.clone(),
            shown: t.shown.clone(),
            backend_pid,
            server,
            confirmed,
            member: Some((t.key, generation)),
            fences,
        }
    }

    /// A lease on a session of its own (called on that session's thread).
    pub(crate) fn on_own(
        tx: ManuallyDrop<UnboundedSender<Cmd>>,
        t: &Target,
        (server, backend_pid): (Option<String>, i32),
        confirmed: Arc<Confirmed>,
        fences: Fences,
    ) -> Link {
        let mut link = Link::on_shared(tx, t, (server, backend_pid, 0), confirmed, fences);
        link.member = None;
        link
    }

    /// Record the release and unlock (and end a session of its own); wait
    /// for it unless called from the lease's own thread (a loss callback).
    pub(crate) fn finish(&self) -> Result<()> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let cmd = match self.member {
            None => Cmd::Release(reply),
            Some((key, generation)) => Cmd::Leave(key, generation, reply),
        };
        if self.tx.send(cmd).is_err() {
            // The thread ended: the session, and the lock, are gone.
            return Ok(());
        }
        if std::thread::current().id() == self.thread {
            return Ok(());
        }
        match answer.recv_timeout(RELEASE_ANSWER) {
            Ok(r) => r,
            // The thread ended: the session, and the lock, are gone.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Ok(()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::Io {
                syscall: "release",
                path: PathBuf::from(&self.shown),
                source: std::io::Error::other(format!(
                    "the lease's session did not answer the release within {}s; the server \
                     frees the lock when the session ends",
                    RELEASE_ANSWER.as_secs()
                )),
            }),
        }
    }

    /// A copy of the session's socket, for a command to inherit: the
    /// session (and the lock) then lasts until that command has ended too,
    /// even if this process is killed first.
    pub(crate) fn hand_on(&self) -> Result<std::os::fd::OwnedFd> {
        let err = |source: std::io::Error| Error::Io {
            syscall: "dup",
            path: PathBuf::from(&self.shown),
            source,
        };
        if std::thread::current().id() == self.thread {
            return Err(err(std::io::Error::other(
                "asked from the lease's own thread (a loss callback)",
            )));
        }
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Cmd::HandOn(reply)).is_err() {
            return Err(err(std::io::Error::other("the session has ended")));
        }
        match answer.recv_timeout(RELEASE_ANSWER) {
            Ok(r) => r.map_err(err),
            Err(_) => Err(err(std::io::Error::other(
                "the session has ended or did not answer",
            ))),
        }
    }

    /// Ask the server now (one round trip, within the bound): `Some(true)`
    /// if it confirmed the session, `Some(false)` if the session is lost,
    /// `None` if the lease's thread did not answer in time.
    pub(crate) fn confirm_now(&self) -> Option<bool> {
        if std::thread::current().id() == self.thread {
            // A loss callback asking: the thread cannot answer itself.
            return Some(!self.confirmed.expired());
        }
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Cmd::Confirm(reply)).is_err() {
            return Some(false);
        }
        answer
            .recv_timeout(self.confirmed.bound() + Duration::from_millis(200))
            .ok()
    }
}

/// Share the lease another thread of this process holds, if it does.
pub(crate) fn shared_lease(s: Arc<Shared>) -> Lease {
    s.add_handle();
    Lease::from_shared(s)
}
