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

/// A session-mode pool of one server connection: the pooler probe's second
/// connection gets no server session while the lease's connection holds
/// the only one, and that must not cost the lease (it took 6 to 9 s and
/// failed, before). A pool of two with both connections held by leases: a
/// third acquisition waits for one as long as its caller said, no more, and
/// gets it once one is let go.
#[test]
fn small_session_pools_give_the_lease_and_bound_the_wait_for_a_connection() {
    use sidelease::Wait;
    use std::time::Instant;
    for session in SESSIONS {
        for wait in [Wait::NoWait, Wait::Timeout(Duration::from_secs(3))] {
            let n = name();
            let url = via("SIDELEASE_TEST_PGBOUNCER_SESSION1", &n) + session;
            let t = Instant::now();
            let lease = Lease::acquire(&url, &Options::new().wait(wait))
                .unwrap_or_else(|e| panic!("{session} {wait:?}: {e}"));
            // Within the probe's wait and a shared session's linger (1 s,
            // its connection the pool's only one) of the case before.
            assert!(
                t.elapsed() < Duration::from_millis(2500),
                "{session} {wait:?}: {:?}",
                t.elapsed()
            );
            assert_eq!(server_locks(&n), 1);
            lease.ensure_held().unwrap();
            lease.release().unwrap();
            assert_eq!(server_locks(&n), 0);
        }
    }
    // A pool of two, both its server connections held by leases of their
    // own; a third lease (on the shared session, the default) waits for
    // one no longer than its caller said, and for all of that: past the
    // 5 s a connection is given before it is tried again.
    let own = |n: &str| via("SIDELEASE_TEST_PGBOUNCER_SESSION2", n) + "&session=own";
    let (a, b, c) = (name(), name(), name());
    let first = Lease::acquire(own(&a), &Options::new()).unwrap();
    let second = Lease::acquire(own(&b), &Options::new()).unwrap();
    let third = via("SIDELEASE_TEST_PGBOUNCER_SESSION2", &c);
    let t = Instant::now();
    let e = Lease::acquire(
        &third,
        &Options::new().wait(Wait::Timeout(Duration::from_secs(1))),
    )
    .unwrap_err();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(1800),
        "{took:?}: {e}"
    );
    assert!(e.to_string().contains("1.0s"), "the caller's figure: {e}");
    assert!(
        e.to_string().contains("no server session free"),
        "names the full pool: {e}"
    );
    // Past the 5 s a connection is given before it is asked again, on the
    // shared session's path (which goes on alone) and on a session of its
    // own, each let go in turn.
    let mut first = Some(first);
    let mut got = Vec::new();
    for third in [third, own(&c)] {
        let held = first.take().unwrap_or_else(|| got.pop().unwrap());
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(6000));
            held.release().unwrap();
        });
        let t = Instant::now();
        let lease = Lease::acquire(
            &third,
            &Options::new().wait(Wait::Timeout(Duration::from_secs(20))),
        )
        .unwrap_or_else(|e| panic!("a third lease once a connection was let go: {e}"));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(5500) && took < Duration::from_secs(10),
            "{took:?}"
        );
        letting_go.join().unwrap();
        if got.is_empty() {
            lease.release().unwrap();
            // The pool's two connections: the second lease's and one held
            // again, so the next wait is for a connection too.
            got.push(Lease::acquire(own(&a), &Options::new()).unwrap());
        } else {
            got.push(lease);
        }
    }
    for l in got {
        l.release().unwrap();
    }
    second.release().unwrap();
}

/// Through a pool of one, a second connection (the probe that tells a
/// session pool from a transaction pool) waits for the pool's only server
/// session, 250 ms, before it is asked another way. A caller who gave
/// less than that hears within its own timeout, not the probe's: 0.26 s
/// and more for 0.1 s, before.
#[test]
fn the_pooler_probe_keeps_within_the_callers_timeout() {
    use sidelease::Wait;
    use std::time::Instant;
    for session in SESSIONS {
        let url = via("SIDELEASE_TEST_PGBOUNCER_SESSION1", &name()) + session;
        let t = Instant::now();
        let r = Lease::acquire(
            &url,
            &Options::new().wait(Wait::Timeout(Duration::from_millis(100))),
        );
        let took = t.elapsed();
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{session}: a lease after {took:?}"));
        assert!(
            took < Duration::from_millis(230),
            "{session}: {took:?}: {e}"
        );
        assert!(
            e.to_string().contains("0.1s"),
            "{session}: the caller's figure: {e}"
        );
    }
}
