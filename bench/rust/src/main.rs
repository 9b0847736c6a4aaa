//! Rust-side measurements for bench/ (driven by bench/bench.py):
//!
//!   sidelease-bench cycle|shared|refused|inspect TARGET ITERS   JSON stats (ns)
//!   sidelease-bench scale DIR COUNT                             first/last thousand, RSS
//!   sidelease-bench waiter TARGET                               handoff waiter (stdin protocol)
//!   sidelease-bench pg URL?lease=NAME ITERS                     PostgreSQL leases beside bare advisory locks

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sidelease::{inspect, Lease, Options, Wait};

mod pg;

pub(crate) fn stats(mut ns: Vec<u64>) -> Value {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q) as usize];
    json!({"n": ns.len(), "median_ns": at(0.5), "p99_ns": at(0.99)})
}

pub(crate) fn measure(iters: usize, mut f: impl FnMut()) -> Value {
    for _ in 0..iters / 10 + 1 {
        f();
    }
    let mut ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        one(&mut f);
        ns.push(t.elapsed().as_nanos() as u64);
    }
    stats(ns)
}

/// One timed operation, in a function of its own: bench/instructions.py
/// counts the instructions run inside it (callgrind's `--toggle-collect`),
/// on this thread only, so neither the warm-up, the timing nor the
/// library's own threads count.
#[inline(never)]
fn one(f: &mut impl FnMut()) {
    f()
}

/// CLOCK_MONOTONIC in ns, the clock every waiter of every language reports.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, target) = (args[0].as_str(), Path::new(&args[1]));
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let opts = Options::new();
    let out = match mode {
        "cycle" => measure(n, || {
            Lease::acquire(target, &opts)
                .expect("acquire")
                .release()
                .expect("release");
        }),
        "cycle-no-guard" => {
            let o = Options::new().split_guard(false);
            measure(n, || {
                Lease::acquire(target, &o)
                    .expect("acquire")
                    .release()
                    .expect("release");
            })
        }
        "shared" => {
            let held = Lease::acquire(target, &opts).expect("acquire");
            let v = measure(n, || {
                Lease::acquire(target, &opts)
                    .expect("share")
                    .release()
                    .expect("release");
            });
            drop(held);
            v
        }
        "refused" => measure(n, || {
            assert!(
                Lease::acquire(target, &opts).is_err(),
                "the lease should be held elsewhere"
            );
        }),
        "inspect" => measure(n, || {
            inspect(target, &opts).expect("inspect");
        }),
        "scale" => scale(target, n),
        "waiter" => return waiter(target),
        "campaign" => return campaign(target, Path::new(&args[2])),
        "pg" => pg::run(&args[1], n),
        m => panic!("unknown mode {m}"),
    };
    println!("{out}");
}

/// A campaigner for bench.py's failover: the core's elector; on each term
/// it writes "PID PID" to `fifo` (one short write), then leads until the
/// term is cancelled (or the process is killed).
fn campaign(target: &Path, fifo: &Path) {
    use std::io::Write;
    let e = sidelease::elector::Elector::new(target, &Options::new()).expect("elector");
    e.run(|term| {
        let line = format!("{0} {0}\n", std::process::id());
        std::fs::OpenOptions::new()
            .write(true)
            .open(fifo)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| e.to_string())?;
        term.wait_cancelled(None);
        Ok(())
    })
    .expect("campaign");
}

/// Hold `count` distinct leases at once: cost of the first and the last
/// thousand acquisitions, and memory per held lease. Run twice by the bench:
/// on new lease files (the split guard reads /proc/locks for each) and on
/// files acquired before (their records vouch; no /proc/locks read).
fn scale(dir: &Path, count: usize) -> Value {
    let guard = std::env::var("SCALE_SPLIT_GUARD")
        .map(|v| v != "0")
        .unwrap_or(true);
    let opts = Options::new().split_guard(guard);
    // Each lease in a directory of its own (a database per tenant), its
    // empty file made beforehand and older than the grace a file no guard
    // checked is given: each acquisition watches one more directory.
    let own_dirs = std::env::var("SCALE_DIRS").is_ok_and(|v| v == "1");
    let path = |i: usize| {
        if own_dirs {
            dir.join(format!("t{i}")).join("db")
        } else {
            dir.join(format!("db-{i}"))
        }
    };
    if own_dirs {
        for i in 0..count {
            let p = path(i);
            std::fs::create_dir_all(p.parent().unwrap()).expect("mkdir");
            std::fs::write(p.with_file_name("db.backend-lease"), b"").expect("lease file");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = rss_bytes();
    let mut held = Vec::with_capacity(count);
    let mut ns = Vec::with_capacity(count);
    for i in 0..count {
        let p = path(i);
        let t = Instant::now();
        held.push(Lease::acquire(&p, &opts).expect("acquire"));
        ns.push(t.elapsed().as_nanos() as u64);
    }
    let after = rss_bytes();
    let k = 1000.min(count);
    let first = stats(ns[..k].to_vec());
    let last = stats(ns[count - k..].to_vec());
    drop(held);
    json!({"count": count, "split_guard": guard, "first_thousand": first, "last_thousand": last,
           "rss_per_lease_bytes": (after.saturating_sub(before)) as f64 / count as f64})
}

/// The handoff waiter: on "wait", block in acquire and print the
/// CLOCK_MONOTONIC time it returned; on "release", release and print "ok".
fn waiter(target: &Path) {
    let opts = Options::new().wait(Wait::Timeout(Duration::from_secs(30)));
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut lease = None;
    for line in stdin.lock().lines() {
        match line.unwrap_or_default().trim() {
            "wait" => {
                let l = Lease::acquire(target, &opts).expect("acquire");
                let t = monotonic_ns();
                lease = Some(l);
                let _ = writeln!(out, "{t}");
            }
            "release" => {
                drop(lease.take());
                let _ = writeln!(out, "ok");
            }
            _ => break,
        }
        let _ = out.flush();
    }
}
