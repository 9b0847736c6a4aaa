//! Who holds a PostgreSQL lease, from the server: the backend holding the
//! advisory lock (`pg_locks`, with `pg_stat_activity` for its client and
//! `application_name`) and the holder row.

use std::path::PathBuf;
use std::time::Instant;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::conn::{self, pg_error, Conn};
use super::local;
use super::target::Target;
use crate::error::{Contention, Result};
use crate::inspect::{Inspection, RecordStatus, ServerHolder, State};
use crate::record::Record;

/// The holder row: its record (generation and `released_at` from their
/// columns; `None` if the JSON cannot be read) and whether it says released.
pub(crate) async fn holder_row(
    c: &Client,
    t: &Target,
) -> std::result::Result<Option<(Option<Record>, bool)>, tokio_postgres::Error> {
    let exists = c
        .query_typed("SELECT to_regclass('sidelease_leases') IS NOT NULL", &[])
        .await?;
    if !exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
        return Ok(None);
    }
    let rows = c
        .query_typed(
            "SELECT generation, holder::text, to_char(released_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') \
             FROM sidelease_leases WHERE name = $1",
            &[(&t.name, Type::TEXT)],
        )
        .await?;
    Ok(rows.first().map(|r| {
        let released: Option<String> = r.get(2);
        let rec = serde_json::from_str::<Record>(r.get::<_, &str>(1))
            .ok()
            .map(|mut rec| {
                rec.generation = Some(r.get::<_, i64>(0) as u64);
                rec.released_at = released.clone();
                rec
            });
        (rec, released.is_some())
    }))
}

pub(crate) async fn lock_holder(
    c: &Client,
    t: &Target,
) -> std::result::Result<Option<ServerHolder>, tokio_postgres::Error> {
    let rows = c
        .query_typed(
            "SELECT l.pid, host(a.client_addr), a.application_name, s.ssl FROM pg_locks l \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             LEFT JOIN pg_stat_ssl s ON s.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid = (($1::bigint >> 32) & 4294967295)::oid \
             AND l.objid = ($1::bigint & 4294967295)::oid",
            &[(&t.key, Type::INT8)],
        )
        .await?;
    Ok(rows.first().map(|r| ServerHolder {
        backend_pid: r.get::<_, i32>(0) as u32,
        client_addr: r.get(1),
        application_name: r.get(2),
        encrypted: r.get(3),
    }))
}

pub(crate) fn inspect(url: &str) -> Result<Inspection> {
    let t = Target::parse(url)?;
    // On a thread of its own: the caller's thread may be inside another
    // tokio runtime (the Node addon's).
    let shown = t.shown.clone();
    std::thread::Builder::new()
        .name("sidelease-pg".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| {
                    crate::Error::io("tokio runtime", std::path::Path::new(&t.shown), e)
                })?;
            rt.block_on(run(&t))
        })
        .map_err(|e| crate::Error::io("pthread_create", std::path::Path::new(&shown), e))?
        .join()
        .unwrap_or_else(|_| {
            Err(crate::Error::invalid(
                "target",
                "the inspection thread panicked",
            ))
        })
}

async fn run(t: &Target) -> Result<Inspection> {
    let conn = conn::open(t, Some("sidelease inspect".into())).await?;
    let standby = conn
        .client
        .query_typed("SELECT pg_is_in_recovery()", &[])
        .await;
    match standby.map(|r| r.first().is_some_and(|r| r.get::<_, bool>(0))) {
        Ok(false) => {}
        Ok(true) => {
            conn.close().await;
            return Err(conn::standby_error(t));
        }
        Err(e) => {
            conn.close().await;
            return Err(pg_error(t, "query", &e));
        }
    }
    let holder = lock_holder(&conn.client, t).await;
    let row = holder_row(&conn.client, t).await;
    conn.close().await;
    let holder = holder.map_err(|e| pg_error(t, "query", &e))?;
    let row = row.map_err(|e| pg_error(t, "query", &e))?;
    let state = if holder.is_some() {
        State::Held
    } else {
        State::Free
    };
    let (record, released) = match row {
        Some((rec, released)) => (rec, Some(released)),
        None => (None, None),
    };
    let mine = local::holds(&t.identity);
    let record_status = match (holder.is_some(), released, &record) {
        (_, None, _) => RecordStatus::Empty,
        (_, Some(_), None) => RecordStatus::Unreadable,
        (true, Some(false), _) if mine => RecordStatus::Myself,
        (true, Some(false), _) => RecordStatus::Live,
        // Locked, but the row says released: a new holder is writing it.
        (true, Some(true), _) => RecordStatus::Unknown,
        (false, Some(false), _) => RecordStatus::Stale,
        (false, Some(true), _) => RecordStatus::Released,
    };
    Ok(Inspection {
        target: PathBuf::from(&t.shown),
        lease_path: PathBuf::from(&t.shown),
        state,
        holders: Vec::new(),
        record,
        record_status,
        orphans: Vec::new(),
        former: Vec::new(),
        unattributed: 0,
        server: holder,
        unavailable: Vec::new(),
    })
}

/// Who holds the lease, as the server tells it: the holder row (its
/// record) and the backend holding the lock.
pub(crate) async fn contention(conn: &Conn, t: &Target, started: Instant) -> Contention {
    let holder = super::inspect::holder_row(&conn.client, t)
        .await
        .ok()
        .flatten()
        .and_then(|(rec, _)| rec);
    Contention {
        target: PathBuf::from(&t.shown),
        lease_path: PathBuf::from(&t.shown),
        holder,
        holders: Vec::new(),
        record_note: None,
        names: Vec::new(),
        inherited: None,
        waited: started.elapsed(),
    }
}
