//! Rust-side measurements for bench/: the core's uncontended cycle and the
//! shared re-acquire, printed as one JSON line of nanosecond samples'
//! median and p99 per item.

use std::time::Instant;

use sidelease::{Lease, Options};

fn stats(mut ns: Vec<u64>) -> serde_json::Value {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q) as usize];
    serde_json::json!({"n": ns.len(), "median_ns": at(0.5), "p99_ns": at(0.99)})
}

fn measure(iters: usize, mut f: impl FnMut()) -> serde_json::Value {
    for _ in 0..iters / 10 + 1 {
        f();
    }
    let mut ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f();
        ns.push(t.elapsed().as_nanos() as u64);
    }
    stats(ns)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: sidelease-bench DIR [ITERS]"));
    let iters: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let db = dir.join("bench.db");
    let opts = Options::new();
    let cycle = measure(iters, || {
        let l = Lease::acquire(&db, &opts).expect("acquire");
        l.release().expect("release");
    });
    let no_guard = Options::new().split_guard(false);
    let cycle_no_guard = measure(iters, || {
        let l = Lease::acquire(&db, &no_guard).expect("acquire");
        l.release().expect("release");
    });
    let held = Lease::acquire(&db, &opts).expect("acquire");
    let shared = measure(iters, || {
        let l = Lease::acquire(&db, &opts).expect("share");
        l.release().expect("release");
    });
    drop(held);
    println!(
        "{}",
        serde_json::json!({"rust_cycle": cycle, "rust_cycle_no_split_guard": cycle_no_guard, "rust_shared_reacquire": shared})
    );
}
