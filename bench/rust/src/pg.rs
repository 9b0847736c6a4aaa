//! PostgreSQL leases against the floor under them, in one run on one
//! server: a bare `pg_try_advisory_lock` + `pg_advisory_unlock` on an open
//! connection, and the same on a new connection each time (what a lease
//! costs at least, since it has a connection of its own); the handoff beside
//! a bare `pg_advisory_lock` waiter woken by an unlock.

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

pub(crate) fn run(url: &str, n: usize) -> Value {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let opts = Options::new();
    let cycle = measure(n, || {
        Lease::acquire(url, &opts)
            .expect("acquire")
            .release()
            .expect("release");
    });
    // On a shared session (`session=shared`) that another lease keeps
    // open: the lock and the row in one round trip, the release in another.
    let shared_url = url.replacen("?lease=", "?session=shared&lease=", 1);
    let anchor = Lease::acquire(format!("{shared_url}-anchor"), &opts).expect("anchor");
    let shared = measure(n * 4, || {
        Lease::acquire(&shared_url, &opts)
            .expect("acquire")
            .release()
            .expect("release");
    });
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
        "cycle": cycle,
        "shared_cycle": shared,
        "bare_round_trip": bare,
        "bare_connect_round_trip": bare_connect,
        "handoff": handoff(url, n.min(50)),
        "bare_handoff": rt.block_on(bare_handoff(url, n.min(50))),
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
