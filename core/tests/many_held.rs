//! A process holding thousands of leases: what each further acquisition
//! costs the holder's watch thread. Alone in its own test binary, because
//! it counts that thread's wake-ups, which every lease of the process adds
//! to.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sidelease::{Lease, Options};

/// The tests count the one watch thread of the process: one at a time.
static ALONE: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `watch_sleeps` once the thread runs (it names itself once it runs).
fn sleeps_once_running() -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match watch_sleeps() {
            Some(n) => return n,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            None => panic!("no watch thread while a lease is held"),
        }
    }
}

/// How often the holder's watch thread has gone to sleep (its voluntary
/// context switches), if it runs.
fn watch_sleeps() -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != "sidelease-watch" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        return status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok());
    }
    None
}

/// Leases acquired one after another for longer than the watch waits to
/// watch a file's writes (`CONTENT_AFTER`, 100 ms): the thread starts those
/// watches together, a few times a second, not once per acquisition. Each
/// wake-up looked at every held lease then, so waking once per acquisition
/// made the thread busy and each acquisition slower the more were held
/// (issue 38: 4.1× at 10,000 in bench/REPORT.md, split guard off).
#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no holder's watch thread (files are looked at on a timer)"
)]
fn acquisitions_in_a_row_wake_the_watch_a_few_times_a_second() {
    let _one = alone();
    const LEASES: usize = 600;
    let d = tempfile::tempdir().unwrap();
    // Files made beforehand and older than the grace a file no guard has
    // checked is given: the guard off, each acquisition is only the lock,
    // the record and the watch.
    for i in 0..LEASES {
        std::fs::write(d.path().join(format!("db{i}.backend-lease")), b"").unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let opts = Options::new().split_guard(false);
    let mut held = vec![Lease::acquire(d.path().join("db0"), &opts).unwrap()];
    let before = sleeps_once_running();
    let start = Instant::now();
    for i in 1..LEASES {
        held.push(Lease::acquire(d.path().join(format!("db{i}")), &opts).unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = start.elapsed();
    let sleeps = watch_sleeps().unwrap() - before;
    // Once per CONTENT_AFTER, and a little besides (the directory watched,
    // a wake-up for a lock it was kept waiting on); not one per lease.
    let bound = took.as_millis() as u64 / 100 * 3 + 20;
    assert!(
        sleeps <= bound,
        "the watch thread slept {sleeps} times while {LEASES} leases were acquired over {took:?} \
         (at most {bound})"
    );
    drop(held);
}

/// A loop of acquire and release beside a lease held all along: the
/// holder's own writes are not watched, and the thread comes round for the
/// cycles' content watches about once a second, not once per cycle
/// (docs/algorithm.md, "writes"). It woke once per cycle it caught (100
/// times in 1.5 s here) while it planned its sweep between them.
#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no holder's watch thread (files are looked at on a timer)"
)]
fn a_loop_of_acquire_and_release_wakes_the_watch_a_bounded_number_of_times() {
    let _one = alone();
    let d = tempfile::tempdir().unwrap();
    let opts = Options::new();
    let kept = Lease::acquire(d.path().join("kept.db"), &opts).unwrap();
    drop(Lease::acquire(d.path().join("loop.db"), &opts).unwrap());
    // Past the kept lease's content watch: the thread has planned its sweep.
    std::thread::sleep(Duration::from_millis(300));
    let before = sleeps_once_running();
    let start = Instant::now();
    let mut cycles = 0u64;
    while start.elapsed() < Duration::from_millis(1500) {
        drop(Lease::acquire(d.path().join("loop.db"), &opts).unwrap());
        cycles += 1;
    }
    let took = start.elapsed();
    let sleeps = watch_sleeps().unwrap() - before;
    // About once a second, and a little besides.
    let bound = took.as_millis() as u64 / 1000 * 3 + 10;
    assert!(
        sleeps <= bound,
        "the watch thread slept {sleeps} times over {cycles} cycles in {took:?} (at most {bound})"
    );
    assert!(
        cycles > bound * 4,
        "only {cycles} cycles in {took:?}: the loop proves nothing"
    );
    drop(kept);
}
