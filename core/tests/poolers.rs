//! PostgreSQL leases through a real, stock PgBouncer (the one
//! `tests/pg/cluster start` runs: SIDELEASE_TEST_PGBOUNCER in session mode,
//! _TX1 and _TX5 in transaction mode with pools of 1 and 5, _STMT in
//! statement mode). Session mode just works; the others are refused with an
//! error naming the pooler, and leave no lock behind on a pooled backend.
#![cfg(feature = "postgres")]

use std::time::Duration;

use sidelease::{inspect, ErrorKind, Lease, Options, State};

mod common;
use common::{env, server_locks};

fn name() -> String {
    common::unique("pool")
}

fn via(var: &str, name: &str) -> String {
    format!("{}?lease={name}", env(var))
}

/// Each check runs for a lease on its process's shared session (the
/// default) and for one on a connection of its own.
const SESSIONS: [&str; 2] = ["", "&session=own"];

#[test]
fn session_mode_pgbouncer_with_its_defaults_just_works() {
    for session in SESSIONS {
        session_mode_works(session);
    }
}

fn session_mode_works(session: &str) {
    let n = name();
    let url = via("SIDELEASE_TEST_PGBOUNCER", &n) + session;
    let lease =
        Lease::acquire(&url, &Options::new()).expect("acquire through session-mode PgBouncer");
    assert_eq!(lease.generation(), Some(1));
    // The server itself sees the lock held.
    assert_eq!(server_locks(&n), 1);
    let direct = format!("{}?lease={n}", env("SIDELEASE_TEST_PG"));
    assert_eq!(
        inspect(&direct, &Options::new()).unwrap().state,
        State::Held
    );
    // Held across heartbeats.
    std::thread::sleep(Duration::from_millis(2500));
    lease
        .ensure_held()
        .expect("still held after heartbeats through PgBouncer");
    lease.release().unwrap();
    assert_eq!(server_locks(&n), 0);
    let again = Lease::acquire(&url, &Options::new()).unwrap();
    assert_eq!(again.generation(), Some(2));
    assert_eq!(again.previous_released_cleanly(), Some(true));
}

#[test]
fn transaction_and_statement_mode_poolers_are_refused_naming_the_pooler() {
    for var in [
        "SIDELEASE_TEST_PGBOUNCER_TX1",
        "SIDELEASE_TEST_PGBOUNCER_TX5",
        "SIDELEASE_TEST_PGBOUNCER_STMT",
    ] {
        // A quiet pool, one client: nothing else would ever show the
        // pooler, and a second client would then be granted the same lock
        // on the same pooled session.
        for session in SESSIONS.iter().cycle().take(4) {
            let n = name();
            let e = Lease::acquire(via(var, &n) + session, &Options::new())
                .expect_err(&format!("{var}: acquired through a transaction pooler"));
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{var}{session}: {e}");
            let text = e.to_string();
            assert!(
                text.contains("pooler") && text.contains("session-mode"),
                "{var}: {text}"
            );
            assert!(!text.contains("app-secret"), "{var}: {text}");
            assert_eq!(
                server_locks(&n),
                0,
                "{var}: a lock was left on a pooled backend"
            );
        }
    }
}

#[test]
fn a_transaction_pooler_never_gives_two_holders_under_contention() {
    // Two processes (this test's binary, again) attempting the same lease
    // through a one-connection transaction pool, 1,000 times each: every
    // attempt is refused, so no moment has two holders, and nothing is
    // left locked.
    if let Ok(n) = std::env::var("SIDELEASE_POOLER_CHILD") {
        let url = via("SIDELEASE_TEST_PGBOUNCER_TX1", &n);
        let mut got = 0;
        for _ in 0..1000 {
            if let Ok(l) = Lease::acquire(&url, &Options::new()) {
                got += 1;
                drop(l);
            }
        }
        println!("ACQUIRED {got}");
        return;
    }
    let n = name();
    let me = common::this_exe();
    let children: Vec<_> = (0..2)
        .map(|_| {
            common::command(&me)
                .args([
                    "--exact",
                    "a_transaction_pooler_never_gives_two_holders_under_contention",
                    "--nocapture",
                ])
                .env("SIDELEASE_POOLER_CHILD", &n)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for c in &outputs {
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(
            out.contains("ACQUIRED 0"),
            "{out}{}",
            String::from_utf8_lossy(&c.stderr)
        );
    }
    assert_eq!(server_locks(&n), 0);
}
