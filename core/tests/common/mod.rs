//! What the test files share: running a child (`child.rs`); for PostgreSQL,
//! the test cluster's variables
//! (`tests/pg/cluster start`; tests/run exports them), lease names no other
//! test or earlier run uses, and psql as the superuser.
#![allow(dead_code)] // each test binary uses its own part

mod child;
#[allow(unused_imports)] // each test binary uses its own part
pub use child::{command, spawn_until_held, this_exe};

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start a server with `eval \"$(bash tests/pg/cluster start)\"` (tests/run does)")
    })
}

static N: AtomicU32 = AtomicU32::new(0);

/// `PREFIX-PID-N-NANOS`: unique within this run and across runs.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// One statement as the superuser over the cluster's Unix socket (as the
/// `postgres` user when the tests run as root): its output, trimmed.
pub fn psql(sql: &str) -> String {
    let (ok, out, err) = psql_output(sql);
    assert!(ok, "psql {sql}: {err}");
    out
}

/// `psql`, never panicking (for a test's clean-up, which may run while the
/// test unwinds): whether it succeeded, its output and its errors.
pub fn psql_output(sql: &str) -> (bool, String, String) {
    let exe = format!("{}/psql", env("SIDELEASE_TEST_PG_BIN"));
    let mut cmd = if rustix::process::geteuid().is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let (dir, port) = (env("SIDELEASE_TEST_PG_DIR"), env("SIDELEASE_TEST_PG_PORT"));
    let out = cmd
        .args([
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            &dir,
            "-p",
            &port,
        ])
        .args(["-U", "postgres", "-d", "app", "-c", sql])
        .output();
    match out {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        Err(e) => (false, String::new(), e.to_string()),
    }
}

/// SQL for the advisory locks of the lease `name` in `pg_locks`.
fn locks_of(name: &str) -> String {
    let key = sidelease::pg::target::key_of(name);
    format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
         AND classid = (({key}::bigint >> 32) & 4294967295)::oid \
         AND objid = ({key}::bigint & 4294967295)::oid"
    )
}

/// pg_terminate_backend of the session holding the lease `name`, whichever
/// session carries it (the process's shared one or its own): how many.
pub fn terminate_holder(name: &str) -> u32 {
    psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM ({} AND granted) h",
        locks_of(name)
    ))
    .parse()
    .unwrap()
}

/// The backend PID of the session holding the lease `name`.
pub fn holder_backend(name: &str) -> i32 {
    psql(&format!("{} AND granted", locks_of(name)))
        .parse()
        .unwrap()
}

/// Advisory locks the server's backends hold for the lease `name`, whoever
/// holds them (asked as the superuser, directly).
pub fn server_locks(name: &str) -> u32 {
    psql(&format!("SELECT count(*) FROM ({}) l", locks_of(name)))
        .parse()
        .unwrap()
}
