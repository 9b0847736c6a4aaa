//! A process holding thousands of leases: what each further acquisition
//! costs the holder's watch thread. Alone in its own test binary, because
//! it counts that thread's wake-ups, which every lease of the process adds
//! to.

use std::time::{Duration, Instant};

use sidelease::{Lease, Options};

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
/// wake-up looks at every held lease, so waking once per acquisition made
/// the thread busy and each acquisition slower the more were held (issue
/// 38: 3.2× at 10,000).
#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no holder's watch thread (files are looked at on a timer)"
)]
fn acquisitions_in_a_row_wake_the_watch_a_few_times_a_second() {
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
    // (The thread names itself once it runs.)
    let deadline = Instant::now() + Duration::from_secs(5);
    let before = loop {
        match watch_sleeps() {
            Some(n) => break n,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            None => panic!("no watch thread while a lease is held"),
        }
    };
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
