//! PostgreSQL leases against the floor under them, in one run on one
//! server: a bare `pg_try_advisory_lock` + `pg_advisory_unlock` on an open
//! connection (what a lease on the process's shared session costs at
//! least), the same on a new connection each time (what a lease on a
//! connection of its own, `session=own`, costs at most once its released
//! connection is kept for the next); the handoff
//! beside a bare `pg_advisory_lock` waiter woken by an unlock; and what
//! 1,000 leases of one process hold: server sessions and descriptors.
//! Every lease here says `sslmode=disable`, as the bare clients (NoTls).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

use serde_json::{json, Value};
use sidelease::{Lease, Options};
use tokio_postgres::{Client, NoTls};

use crate::{measure, monotonic_ns, stats};

const KEY: i64 = 0x5eed_1ea5e;

fn bare_url(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_owned()
}

/// `url` (`…?lease=NAME`) for the lease `NAME-tag`, with `params`.
fn lease(url: &str, tag: &str, params: &str) -> String {
    format!("{url}-{tag}&sslmode=disable{params}")
}

async fn connect(url: &str) -> Client {
    let cfg = tokio_postgres::Config::from_str(&bare_url(url)).expect("url");
    let (client, conn) = cfg.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

async fn lock_unlock(c: &Client) {
    c.simple_query(&format!("SELECT pg_try_advisory_lock({KEY})"))
        .await
        .expect("lock");
    c.simple_query(&format!("SELECT pg_advisory_unlock({KEY})"))
        .await
        .expect("unlock");
}

fn cycle(url: &str, n: usize) -> Value {
    let opts = Options::new();
    measure(n, || {
        Lease::acquire(url, &opts)
            .expect("acquire")
            .release()
            .expect("release");
    })
}

pub(crate) fn run(url: &str, n: usize) -> Value {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // A lease of its own: its connection, kept 2 s after a clean release
    // for the next one that goes alone (core/src/pg/idle.rs), is the one
    // before's (the first cycle alone connects).
    let own = cycle(&lease(url, "own", "&session=own"), n);
    // On the process's shared session (the default), which another lease
    // keeps open: the lock and the row in one round trip, the release in
    // another.
    let anchor = Lease::acquire(lease(url, "anchor", ""), &Options::new()).expect("anchor");
    let shared = cycle(&lease(url, "shared", ""), n * 4);
    anchor.release().expect("release");
    let bare = rt.block_on(async {
        let c = connect(url).await;
        let mut ns = Vec::with_capacity(n * 10);
        for _ in 0..n * 10 {
            let t = std::time::Instant::now();
            lock_unlock(&c).await;
            ns.push(t.elapsed().as_nanos() as u64);
        }
        stats(ns)
    });
    let bare_connect = rt.block_on(async {
        let mut ns = Vec::with_capacity(n);
        for _ in 0..n {
            let t = std::time::Instant::now();
            let c = connect(url).await;
            lock_unlock(&c).await;
            drop(c);
            ns.push(t.elapsed().as_nanos() as u64);
        }
        stats(ns)
    });
    json!({
        "cycle": own,
        "shared_cycle": shared,
        "bare_round_trip": bare,
        "bare_connect_round_trip": bare_connect,
        // A lease name of its own: the row of one updated thousands of
        // times just before is not what a handoff meets.
        "handoff": handoff(&lease(url, "handoff", ""), n.min(50)),
        "bare_handoff": rt.block_on(bare_handoff(url, n.min(50))),
        "thousand_leases": rt.block_on(thousand(url)),
    })
}

/// 1,000 leases held by this process on one server: its server sessions
/// (in `pg_stat_activity`, by application name) and its descriptors, each
/// before and while they are held.
async fn thousand(url: &str) -> Value {
    let c = connect(url).await;
    let me = std::process::id();
    let sessions = || async {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
            &[&format!("sidelease {me}@%")],
        )
        .await
        .expect("pg_stat_activity")
        .get::<_, i64>(0)
    };
    let fds = || {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let (sessions_before, fds_before) = (sessions().await, fds());
    let leases: Vec<Lease> = (0..1000)
        .map(|i| {
            Lease::acquire(lease(url, &format!("many-{i}"), ""), &Options::new()).expect("acquire")
        })
        .collect();
    let (sessions_held, fds_held) = (sessions().await, fds());
    for l in leases {
        l.release().expect("release");
    }
    json!({
        "leases": 1000,
        "sessions": sessions_held - sessions_before,
        "descriptors": fds_held.saturating_sub(fds_before),
    })
}

/// Holder here, waiter in another process (this binary's `waiter` mode):
/// from the release call to the waiter holding.
fn handoff(url: &str, rounds: usize) -> Value {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["waiter", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("waiter");
    let mut to = child.stdin.take().expect("stdin");
    let mut from = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ns = Vec::with_capacity(rounds);
    let mut line = String::new();
    for _ in 0..rounds {
        let held = Lease::acquire(
            url,
            &Options::new().wait(sidelease::Wait::Timeout(Duration::from_secs(10))),
        )
        .expect("acquire");
        writeln!(to, "wait").expect("write");
        // Let the waiter reach its blocking pg_advisory_lock.
        std::thread::sleep(Duration::from_millis(30));
        let t0 = monotonic_ns();
        held.release().expect("release");
        line.clear();
        from.read_line(&mut line).expect("read");
        let t1: u64 = line.trim().parse().expect("waiter time");
        ns.push(t1.saturating_sub(t0));
        writeln!(to, "release").expect("write");
        line.clear();
        from.read_line(&mut line).expect("read");
    }
    drop(to);
    let _ = child.wait();
    stats(ns)
}

/// A bare `pg_advisory_lock` waiter on a second connection woken by the
/// holder's `pg_advisory_unlock`.
async fn bare_handoff(url: &str, rounds: usize) -> Value {
    let holder = connect(url).await;
    let waiter = std::sync::Arc::new(connect(url).await);
    let mut ns = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        holder
            .simple_query(&format!("SELECT pg_advisory_lock({KEY})"))
            .await
            .expect("lock");
        let w = waiter.clone();
        let waiting = tokio::spawn(async move {
            w.simple_query(&format!("SELECT pg_advisory_lock({KEY})"))
                .await
                .expect("wait");
            let t = monotonic_ns();
            w.simple_query(&format!("SELECT pg_advisory_unlock({KEY})"))
                .await
                .expect("unlock");
            t
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = monotonic_ns();
        holder
            .simple_query(&format!("SELECT pg_advisory_unlock({KEY})"))
            .await
            .expect("unlock");
        let t1 = waiting.await.expect("join");
        ns.push(t1.saturating_sub(t0));
    }
    stats(ns)
}
