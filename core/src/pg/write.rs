//! The holder row of a lease on its own session: written after a lock
//! taken at once (or, when the wait could not carry it, after a wait), or
//! already written by the wait's pipeline (`wait.rs`); then the lease is
//! handed to the caller and the session kept.

use std::path::PathBuf;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};

use super::confirm::Confirmed;
use super::conn::{
    in_order, io_error, pg_error, pooler, privilege_error, release_within, set_lock_timeout,
    unlock, upsert_sql, Conn, Pooled, ROW_LOCK_TIMEOUT,
};
use super::row::{table_error, Written, TABLE, TABLE_DDL};
use super::session::Run;
use super::target::Target;
use crate::error::{Contention, Error, Result};
use crate::options::Wait;
use crate::record::Record;

/// The holder row's write after a lock taken at once.
static UPSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| upsert_sql("true"));

/// A row the wait's pipeline wrote: the record, what the write returned,
/// and when the server last vouched for the lock (`Confirmed::clock`).
pub(super) type Claimed = (Record, Written, u64);

impl Run {
    /// This process's record for the lease, as its row stores it.
    pub(super) fn new_record(&self, conn: &Conn) -> Result<Record> {
        let t = &*self.target;
        let mut rec = Record::of_this_process(t.shown.clone(), &self.opts)?;
        rec.encrypted = Some(conn.tls.is_some());
        rec.confirm_within_ms = Some(t.confirm_within.as_millis() as u64);
        Ok(rec)
    }

    /// Write the holder row (the fencing generation grows) unless the wait
    /// did, hand the lease to the caller, keep the session.
    pub(super) async fn claim(
        self,
        conn: Conn,
        pid: i32,
        (table, waited): (bool, bool),
        claimed: Option<Box<Claimed>>,
    ) -> super::idle::Next {
        let t = self.target.clone();
        if self.slot.abandoned() {
            match claimed.as_deref() {
                // Given up as the wait's row was written: said released,
                // so the next holder reads a clean release, not a crash.
                Some((_, w, _)) => {
                    let _ = release_within(&conn.client, &t, w.generation).await;
                }
                // Given up before the row was written: no generation spent.
                None => {
                    let _ = unlock(&conn.client, t.key).await;
                }
            }
            conn.close().await;
            return None;
        }
        let claimed = match claimed {
            Some(c) => Ok(*c),
            None => {
                let sent = Confirmed::clock();
                self.write_row(&conn, pid, table, waited)
                    .await
                    .map(|(rec, written)| (rec, written, sent))
            }
        };
        match claimed {
            Ok((rec, written, sent)) => {
                let Written {
                    previous,
                    generation,
                    fence,
                    ..
                } = written;
                self.hold(conn, rec, previous, (generation, fence), pid, sent)
                    .await
            }
            Err(e) => {
                let _ = unlock(&conn.client, t.key).await;
                conn.close().await;
                self.slot.finish(Err(e));
                None
            }
        }
    }

    async fn write_row(
        &self,
        conn: &Conn,
        pid: i32,
        table: bool,
        waited: bool,
    ) -> Result<(Record, Written)> {
        let t = &*self.target;
        let c = &conn.client;
        if !table {
            if let Err(e) = c.batch_execute(TABLE_DDL).await {
                // Sessions creating it at the same moment collide in the
                // catalogs in every way "already exists" can be said.
                let benign = [
                    SqlState::UNIQUE_VIOLATION,
                    SqlState::DUPLICATE_TABLE,
                    SqlState::DUPLICATE_OBJECT,
                ];
                if !e.code().is_some_and(|code| benign.contains(code)) {
                    return Err(privilege_error(t, "create table", &e, &format!(
                        "creating {TABLE} needs CREATE on the schema; or have its owner run once: {TABLE_DDL}"
                    )));
                }
            }
        }
        let mut rec = self.new_record(conn)?;
        let holder = rec.to_json();
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 3] = [
            (&t.name, Type::TEXT),
            (&t.key, Type::INT8),
            (&holder, Type::TEXT),
        ];
        let upsert = c.query_typed(&UPSERT, &params);
        let rows = if waited || self.opts.wait != Wait::NoWait {
            let (reset, rows) = in_order(set_lock_timeout(c, &self.row_lock_ms()), upsert).await;
            reset.map_err(|e| pg_error(t, "query", &e))?;
            rows
        } else {
            upsert.await
        };
        let written = self.written(c, pid, rows).await?;
        rec.generation = Some(written.generation as u64);
        Ok((rec, written))
    }

    /// What a holder-row write answered, as this lease's row (exactly one)
    /// or the error a user can act on.
    pub(super) async fn written(
        &self,
        c: &Client,
        pid: i32,
        rows: std::result::Result<Vec<Row>, tokio_postgres::Error>,
    ) -> Result<Written> {
        let t = &*self.target;
        let row = match rows {
            Ok(mut r) if r.len() == 1 => r.remove(0),
            Ok(_) => return Err(io_error(t, "insert", "the server answered no row")),
            Err(e) => return Err(self.row_error(c, &e).await),
        };
        let written = Written::of(&row).map_err(|e| table_error(t, &e))?;
        if written.backend != pid {
            return Err(pooler(t, Pooled::Backend(pid, Some(written.backend))));
        }
        Ok(written)
    }

    async fn row_error(&self, c: &Client, e: &tokio_postgres::Error) -> Error {
        let t: &Target = &self.target;
        if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
            if !matches!(self.opts.wait, Wait::Timeout(_)) {
                return io_error(
                    t,
                    "insert",
                    format!(
                        "a transaction, an application's fencing check, kept the lease's \
                         row in {TABLE} locked FOR SHARE for over {ROW_LOCK_TIMEOUT} ms; \
                         the lock itself was free"
                    ),
                );
            }
            return Error::Timeout(Box::new(Contention {
                target: PathBuf::from(&t.shown),
                lease_path: PathBuf::from(&t.shown),
                holder: None,
                holders: Vec::new(),
                names: Vec::new(),
                inherited: None,
                record_note: Some(format!(
                    "a transaction, an application's fencing check, kept the lease's row \
                     in {TABLE} locked FOR SHARE for the rest of the wait; the lock itself \
                     was free"
                )),
                waited: self.started.elapsed(),
            }));
        }
        if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
            let other: Option<String> = c
                .query_typed(
                    "SELECT name FROM sidelease_leases WHERE key = $1",
                    &[(&t.key, Type::INT8)],
                )
                .await
                .ok()
                .and_then(|r| r.first().map(|r| r.get(0)));
            return Error::invalid(
                "target",
                format!(
                    "{}: the lease name {:?} has the same advisory-lock key ({}) as the lease {:?} \
                     in {TABLE}; refusing to share one lock between two names: rename one",
                    t.shown,
                    t.name,
                    t.key,
                    other.unwrap_or_else(|| "?".into())
                ),
            );
        }
        privilege_error(
            t,
            "insert",
            e,
            &format!("the lease's user needs SELECT, INSERT and UPDATE on {TABLE}"),
        )
    }
}
