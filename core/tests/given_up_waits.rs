//! A PostgreSQL acquisition given up before its wait reached the server
//! sends no wait there (`pg/wait.rs`): connecting and the checks before a
//! wait take round trips a loaded machine stretches to seconds, and a lock
//! request sent after the caller gave up would wait on the server until a
//! cancel reached it, a waiter the caller was told had ended. A test build
//! with `SIDELEASE_FAULTS` set widens the gap before the request (the step
//! `wait.lock`); tests/run runs this file so. Against the throwaway
//! cluster (`tests/pg/cluster start`; tests/run starts one).
#![cfg(feature = "postgres")]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sidelease::{Lease, Options, Pending, Wait};

mod common;
use common::{env, psql, spawn_until_held};

#[test]
#[ignore = "run by the test below in a child process"]
fn child_holds_forever() {
    let u = std::env::var("SIDELEASE_CHILD_URL").unwrap();
    let _l = Lease::acquire(&u, &Options::new()).unwrap();
    println!("HELD");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

fn spawn_holder(u: &str) -> std::process::Child {
    spawn_until_held("child_holds_forever", "SIDELEASE_CHILD_URL", u)
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The advisory lock of the lease `name` in `pg_locks`, as conditions.
fn lock_of(name: &str) -> String {
    let key = sidelease::pg::target::key_of(name);
    format!(
        "l.locktype = 'advisory' AND l.objsubid = 1 \
         AND l.classid = (({key}::bigint >> 32) & 4294967295)::oid \
         AND l.objid = ({key}::bigint & 4294967295)::oid"
    )
}

/// Sessions waiting for the lease `name` (only this test's process waits
/// for it; its holder holds it) while `secs` pass, sampled by the server
/// itself every millisecond: a wait cancelled a moment after its request
/// is seen too, which polling from here would miss. Each waiting backend's
/// PID and when it was first seen (seconds since the epoch; the server
/// runs on this machine's clock).
fn waits_seen_for(name: &str, secs: f64) -> std::thread::JoinHandle<Vec<(i32, f64)>> {
    let sql = format!(
        "CREATE FUNCTION pg_temp.sample() RETURNS TABLE(pid int, at float8) LANGUAGE plpgsql AS $$ \
         DECLARE until timestamptz := clock_timestamp() + {secs} * interval '1 second'; \
         BEGIN \
           CREATE TEMP TABLE seen(pid int PRIMARY KEY, at float8); \
           WHILE clock_timestamp() < until LOOP \
             INSERT INTO seen SELECT l.pid, extract(epoch FROM clock_timestamp()) \
               FROM pg_locks l WHERE {lock} AND NOT l.granted ON CONFLICT DO NOTHING; \
             PERFORM pg_sleep(0.001); \
           END LOOP; \
           RETURN QUERY SELECT s.pid, s.at FROM seen s; \
         END $$; \
         SELECT coalesce(string_agg(pid || ' ' || at, ','), '') FROM pg_temp.sample()",
        lock = lock_of(name)
    );
    std::thread::spawn(move || {
        psql(&sql)
            .split(',')
            .filter(|r| !r.is_empty())
            .map(|r| {
                let (pid, at) = r.split_once(' ').unwrap();
                (pid.parse().unwrap(), at.parse().unwrap())
            })
            .collect()
    })
}

/// Sessions waiting for the lease `name` now.
fn waiting_now(name: &str) -> u32 {
    psql(&format!(
        "SELECT count(*) FROM pg_locks l WHERE {} AND NOT l.granted",
        lock_of(name)
    ))
    .parse()
    .unwrap()
}

/// A lock request the server began later than this after the caller gave
/// up was sent after it (the margin: one sent just before, that a loaded
/// machine let the server begin late). tests/run delays requests up to
/// 2 s (`SIDELEASE_FAULTS=1:2000000`), so a late one is seen late.
const LATE: f64 = 0.75;
/// How long after the caller gave up the server is watched: past the
/// longest injected delay, with a margin.
const WATCH: f64 = 2.5;

#[test]
fn a_wait_given_up_before_it_was_sent_never_reaches_the_server() {
    let base = env("SIDELEASE_TEST_PG");
    let name = format!(
        "gu{}-{:x}",
        std::process::id(),
        now_secs().to_bits() & 0xffff_ffff
    );
    let u = format!("{base}?lease={name}");
    let mut holder = spawn_holder(&u);
    // The sampling sees a wait (the lease's lock as the server names it).
    let waiter = Pending::new(Path::new(&u), &Options::new().wait(Wait::Forever)).unwrap();
    let t = Instant::now();
    while waiting_now(&name) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the wait never reached the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = waits_seen_for(&name, 0.2).join().unwrap();
    assert_eq!(seen.len(), 1, "the sampling saw {seen:?}");
    drop(waiter);
    let mut seed = u64::from(std::process::id());
    let mut draw = |below: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % below
    };
    for round in 0..4 {
        let wait_for = Duration::from_micros(draw(400_000));
        let watching = waits_seen_for(&name, wait_for.as_secs_f64() + WATCH);
        // Waits given up while connecting, checking or waiting: each may
        // be anywhere on its way to the lock request.
        let pending: Vec<Pending> = (0..30)
            .map(|_| Pending::new(Path::new(&u), &Options::new().wait(Wait::Forever)).unwrap())
            .collect();
        std::thread::sleep(wait_for);
        drop(pending);
        let given_up = now_secs();
        let seen = watching.join().unwrap();
        let late: Vec<_> = seen
            .iter()
            .filter(|(_, at)| *at > given_up + LATE)
            .collect();
        assert!(
            late.is_empty(),
            "round {round}: waits began {:?} s after the caller gave up: {late:?}",
            late.iter().map(|(_, at)| at - given_up).collect::<Vec<_>>()
        );
        // Those sent before it are cancelled: within the cancel's grace
        // (2 s) and the server's check of a closed connection (1 s), with
        // a margin, from when they were given up.
        while waiting_now(&name) != 0 {
            assert!(
                now_secs() - given_up < 6.0,
                "round {round}: waits still on the server {:.1} s after the caller gave up",
                now_secs() - given_up
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "round {round}: given up after {wait_for:?}; {} waits had begun",
            seen.len()
        );
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
}
