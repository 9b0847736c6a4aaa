//! The holder row (`sidelease_leases`): its table, and what a write of it
//! returns (the generation, the previous holder's record, the fence).

use std::time::Duration;

use super::conn::io_error;
use super::fence::Fences;
use super::target::Target;
use crate::error::Error;
use crate::record::{Content, Record};

/// The table the library makes and writes holder rows to.
pub const TABLE: &str = "sidelease_leases";

/// The table as the library makes it.
pub const TABLE_DDL: &str = "CREATE TABLE IF NOT EXISTS sidelease_leases (\
     name text PRIMARY KEY, key bigint NOT NULL UNIQUE, generation bigint NOT NULL, \
     holder jsonb NOT NULL, acquired_at timestamptz NOT NULL, released_at timestamptz)";

/// What a holder-row write returned.
pub(crate) struct Written {
    pub generation: i64,
    pub previous: Content,
    /// The server backend that wrote it.
    pub backend: i32,
    /// Until when a previous holder whose lock was taken from it may still
    /// believe it holds the lease: the server's count, less the holders
    /// that provably ended (`fence`).
    pub fence: Fences,
}

impl Written {
    /// Read the row, a type no column of the library's table has (a table
    /// made by hand) an error rather than a panic.
    pub(crate) fn of(
        row: &tokio_postgres::Row,
    ) -> std::result::Result<Written, tokio_postgres::Error> {
        let server = Duration::from_millis(row.try_get::<_, i64>(5)?.max(0) as u64);
        let fences: Option<String> = row.try_get(6)?;
        Ok(Written {
            generation: row.try_get(0)?,
            previous: previous_of(row.try_get(1)?, row.try_get(2)?, row.try_get(3)?),
            backend: row.try_get(4)?,
            fence: Fences::of(fences.as_deref(), server),
        })
    }
}

/// A holder row that cannot be read as the library writes it.
pub(crate) fn table_error(t: &Target, e: &tokio_postgres::Error) -> Error {
    io_error(
        t,
        "insert",
        format!("{TABLE} is not the table the library makes ({TABLE_DDL}): {e}"),
    )
}

/// The previous holder's record, from its row as the write returned it.
pub(crate) fn previous_of(
    generation: Option<i64>,
    holder: Option<String>,
    released_at: Option<String>,
) -> Content {
    match holder {
        None => Content::Empty,
        Some(text) => match serde_json::from_str::<Record>(&text) {
            Ok(mut r) => {
                r.generation = generation.map(|g| g as u64);
                r.released_at = released_at;
                Content::Record(Box::new(r))
            }
            Err(_) => Content::Unreadable,
        },
    }
}
