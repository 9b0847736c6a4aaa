//! A PostgreSQL acquisition given up before its wait reached the server
//! sends no wait there (`pg/wait.rs`): connecting and the checks before a
//! wait take round trips a loaded machine stretches to seconds, and a lock
//! request sent after the caller gave up would wait on the server until a
//! cancel reached it, a waiter the caller was told had ended. A test build
//! with `SIDELEASE_FAULTS` set widens the gap before the request (the step
//! `wait.lock`); tests/run runs this file so. Against the throwaway
//! cluster (`tests/pg/cluster start`; tests/run starts one).
#![cfg(feature = "postgres")]

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sidelease::{Lease, Options, Pending, Wait};

mod common;
use common::{command, env, psql, this_exe};

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
    let mut child = command(this_exe())
        .args([
            "--exact",
            "child_holds_forever",
            "--nocapture",
            "--include-ignored",
        ])
        .env("SIDELEASE_CHILD_URL", u)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("HELD") {
        let n = child.stdout.as_mut().unwrap().read(&mut buf).unwrap();
        assert!(n > 0, "the holder ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    child
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// This process's sessions waiting for the lease `name`, as the server
/// sees them: backend PID and when its statement began (seconds since the
/// epoch; the server runs on this machine's clock).
fn waiting(name: &str) -> Vec<(i32, f64)> {
    let rows = psql(&format!(
        "SELECT string_agg(a.pid || ' ' || extract(epoch FROM a.query_start), ',') \
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND NOT l.granted \
         AND a.application_name LIKE 'sidelease {}@% {name}'",
        std::process::id()
    ));
    rows.split(',')
        .filter(|r| !r.is_empty())
        .map(|r| {
            let (pid, at) = r.split_once(' ').unwrap();
            (pid.parse().unwrap(), at.parse().unwrap())
        })
        .collect()
}

#[test]
fn a_wait_given_up_before_it_was_sent_never_reaches_the_server() {
    let base = env("SIDELEASE_TEST_PG");
    // Short: the whole name must show in a session's application_name.
    let name = format!(
        "gu{}-{:x}",
        std::process::id(),
        now_secs().to_bits() & 0xffff_ffff
    );
    let u = format!("{base}?lease={name}");
    let mut holder = spawn_holder(&u);
    let mut seed = u64::from(std::process::id());
    let mut draw = |below: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % below
    };
    for round in 0..5 {
        // Waits given up while connecting or checking (or waiting): each
        // may be anywhere on its way to the lock request.
        let pending: Vec<Pending> = (0..30)
            .map(|_| Pending::new(Path::new(&u), &Options::new().wait(Wait::Forever)).unwrap())
            .collect();
        std::thread::sleep(Duration::from_micros(draw(400_000)));
        drop(pending);
        let given_up = now_secs();
        // A lock request the server began later than this was sent after
        // the caller gave up (the margin: a request sent just before, that
        // a loaded server read late).
        const LATE: f64 = 0.25;
        let t = Instant::now();
        let mut seen: Vec<(i32, f64)> = Vec::new();
        loop {
            let now = waiting(&name);
            let late: Vec<_> = now.iter().filter(|(_, at)| *at > given_up + LATE).collect();
            assert!(
                late.is_empty(),
                "round {round}: waits sent {:?} after the caller gave up: {late:?}",
                late.iter().map(|(_, at)| at - given_up).collect::<Vec<_>>()
            );
            seen.extend(now.iter().copied());
            // Cancelled within the cancel's grace (2 s) and the server's
            // check of a closed connection (1 s), with a margin.
            if now.is_empty() && t.elapsed() > Duration::from_millis(1500) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(6),
                "round {round}: waits still on the server {:?} after the caller gave up: {now:?}",
                t.elapsed()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "round {round}: {} waits seen on the server after the caller gave up (sent before)",
            {
                seen.sort_by_key(|s| s.0);
                seen.dedup_by_key(|s| s.0);
                seen.len()
            }
        );
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
}
