//! A try-acquisition on the shared session: the lock and the holder row in
//! one round trip; what it cannot settle goes to the acquisition's own
//! thread and connection.

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::release::Release;
use super::{Hub, Member, TryReq};
use crate::error::Error;
use crate::lease::Shared;
use crate::options::Wait;
use crate::pg::confirm::Confirmed;
use crate::pg::conn::in_order;
use crate::pg::inspect::{contention, lock_holder};
use crate::pg::link::Link;
use crate::pg::local;
use crate::pg::row::Written;
use crate::pg::target::Target;
use crate::record::Record;

impl Hub {
    /// One try-acquisition: the lock and the row in one round trip; what
    /// it cannot settle goes on alone.
    pub(super) async fn try_one(&mut self, req: TryReq) {
        if req.slot.abandoned() {
            return;
        }
        let t = req.target.clone();
        if self.busy(t.key) || local::share_pending(&t.identity) {
            // Advisory locks are reentrant: this session must never take
            // a key it holds.
            return req.alone();
        }
        let Ok(mut rec) = Record::of_this_process(t.shown.clone(), &req.opts) else {
            return req.alone();
        };
        rec.encrypted = Some(self.conn.tls.is_some());
        rec.confirm_within_ms = Some(t.confirm_within.as_millis() as u64);
        let holder = rec.to_json();
        // The lock's note is this nonce: never empty, which is what a try
        // that did not lock notes.
        let Some(nonce) = rec.nonce.clone().filter(|n| !n.is_empty()) else {
            return req.alone();
        };
        let Some(p) = self.prepared().await else {
            // No table yet (the acquisition's own connection makes it), or
            // no answer: alone, as without sharing.
            return req.alone();
        };
        let c = &self.conn.client;
        type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let lock_params: [Param; 3] = [&t.key, &self.conn.session, &nonce];
        let lock = c.query(&p.lock, &lock_params);
        let row_params: [Param; 5] = [&t.name, &t.key, &holder, &self.conn.session, &nonce];
        let row = c.query(&p.upsert, &row_params);
        let sent = Confirmed::clock();
        let answered = self.bounded(&t, in_order(lock, row)).await;
        let Ok((locked, written)) = answered else {
            // The session stalled: the heartbeat decides what that means.
            // Whether the lock was taken and the row written is not known:
            // the key stays off, and a row of this try is recorded released
            // before the lock is given back.
            self.held.insert(t.key, Some((t.clone(), nonce)));
            return req.alone();
        };
        if locked.is_err() || written.is_err() {
            // Prepared again on the next try: a table altered or dropped
            // since makes its plan fail.
            self.prepared = None;
        }
        if let Err(e) = &locked {
            if !e.is_closed() {
                // The statement failed after its lock may have been granted
                // (cancelled, say): a session lock outlives the statement's
                // transaction. Given back once the session answers again.
                self.held.insert(t.key, Some((t.clone(), nonce)));
                return req.alone();
            }
        }
        let got = matches!(&locked, Ok(rows) if rows.first().is_some_and(|r| {
            r.try_get::<_, i32>(0).is_ok_and(|p| p == self.pid)
                && r.try_get::<_, bool>(1).unwrap_or(false)
        }));
        if !got && locked.is_ok() && req.opts.wait == Wait::NoWait {
            // One attempt, and another process holds the lock: answer here
            // rather than open a connection only to be refused.
            if let Some(e) = self.in_use(&t, req.started).await {
                return req.slot.finish(Err(e));
            }
        }
        let written = match written {
            Ok(rows) if got && rows.len() == 1 => Written::of(&rows[0]).ok(),
            _ => None,
        };
        // Alone, an acquisition says what is wrong (a table made by hand
        // whose columns the row cannot be read from, say).
        let Some(written) = written.filter(|w| w.backend == self.pid) else {
            if got {
                self.unlock_key(t.key).await;
            }
            return req.alone();
        };
        let Written {
            generation,
            previous,
            fence,
            ..
        } = written;
        rec.generation = Some(generation as u64);
        let confirmed = Arc::new(Confirmed::new(t.confirm_within, sent));
        let link = Link::on_shared(
            ManuallyDrop::new(self.tx.clone()),
            &t,
            (self.conn.server.clone(), self.pid, generation),
            confirmed.clone(),
            fence,
        );
        let shared = Arc::new(Shared::new_remote(
            PathBuf::from(&t.shown),
            rec,
            previous,
            Box::new(link),
        ));
        let weak = Arc::downgrade(&shared);
        if !req
            .slot
            .finish_with(|| local::insert(&t.identity, &t.name, shared))
        {
            // Given up while the row was written: let go at once.
            if let Release::RowLocked = self.record_and_unlock(&t, generation).await {
                let (reply, _) = std::sync::mpsc::sync_channel(1);
                self.record_later(t, generation, reply);
            }
            return;
        }
        self.next = self
            .next
            .min(tokio::time::Instant::now() + confirmed.interval());
        self.members.insert(
            t.key,
            Member {
                target: t,
                generation,
                confirmed,
                shared: weak,
            },
        );
    }

    /// The in-use error for a lock another session holds, as the
    /// acquisition's own connection would have answered it; `None` when
    /// this process holds it (on a connection of its own, through another
    /// spelling of the server) or the session did not answer in time.
    pub(super) async fn in_use(&self, t: &Target, started: Instant) -> Option<Error> {
        let ask = lock_holder(&self.conn.client, t);
        let holder = self.bounded(&self.first, ask).await.ok()?.ok()?;
        let server = self.conn.server.as_deref();
        if holder.is_some_and(|h| local::holds_backend(&t.name, (server, h.backend_pid as i32))) {
            return None;
        }
        let c = self
            .bounded(&self.first, contention(&self.conn, t, started))
            .await
            .ok()?;
        Some(Error::InUse(Box::new(c)))
    }
}
