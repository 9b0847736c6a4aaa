//! The inotify instances a process keeps: a user may have only 128, so one
//! for the held leases' watch (made at the first acquisition attempt), two
//! for every wait together (the first wait polls its own), and none once
//! the process has neither held nor waited for a while. Alone in its own
//! test binary, because it counts this process's instances.

use std::fs::File;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use sidelease::{Lease, Options, Wait};

/// Instances in this process's descriptor table (not the library's own
/// count: what the kernel charges to the user).
fn instances() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l == Path::new("anon_inode:inotify"))
        .count()
}

fn eventually(what: &str, timeout: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {timeout:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A lock this process holds by hand, through an open file description of
/// its own: to sidelease, a holder like any other.
fn lock_by_hand(path: &Path) -> File {
    let f = File::create(path).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    f
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no inotify instances; waits and the watch poll"
)]
fn one_instance_per_role_and_none_when_idle() {
    const WAITS: usize = 300;
    let d = tempfile::tempdir().unwrap();
    let idle_bound = Duration::from_secs(10);
    assert_eq!(instances(), 0);

    // A refused attempt makes the watch's instance (before its open: a
    // lease file is numbered above it) and leaves it to the watcher, which
    // closes it once idle.
    let busy = lock_by_hand(&d.path().join("busy.db.backend-lease"));
    assert!(Lease::acquire(d.path().join("busy.db"), &Options::new()).is_err());
    eventually(
        "a refused attempt's instance closed once idle",
        idle_bound,
        || instances() == 0 && sidelease::watch::inotify_instances() == 0,
    );
    eventually("the watcher thread ended", idle_bound, || {
        !sidelease::watch::is_running()
    });
    drop(busy);

    // Holding: the holder's watch, one instance.
    let lease = Lease::acquire(d.path().join("held.db"), &Options::new()).unwrap();
    assert_eq!(instances(), 1);
    lease.release().unwrap();
    eventually(
        "the holder's instance closed once nothing is held",
        idle_bound,
        || instances() == 0 && sidelease::watch::inotify_instances() == 0,
    );
    eventually("the watcher thread ended", idle_bound, || {
        !sidelease::watch::is_running()
    });

    // More waits than a user may have instances, all on one.
    let hand: Vec<File> = (0..WAITS)
        .map(|i| lock_by_hand(&d.path().join(format!("w{i}.db.backend-lease"))))
        .collect();
    let waiters: Vec<_> = (0..WAITS)
        .map(|i| {
            let target = d.path().join(format!("w{i}.db"));
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    // The split guard off: what is measured is the wake-up.
                    // With it, each of the 300 acquisitions reads
                    // /proc/locks, which takes the kernel's lock table
                    // (file_rwsem) for writing and stalls every flock on
                    // the machine meanwhile: 0.5 to 6.4 s here, against
                    // 67-81 ms without (issue 38's scale cliff).
                    let opts = Options::new()
                        .wait(Wait::Timeout(Duration::from_secs(60)))
                        .split_guard(false);
                    Lease::acquire(&target, &opts)
                })
                .unwrap()
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    // One for the first wait (which polls it itself), one for the others,
    // and the holder's watch: made before a lease file is first opened, so
    // that a held lease file is numbered above it (docs/algorithm.md, "A
    // killed holder's lock").
    assert_eq!(
        instances(),
        3,
        "every wait on two instances, and the watch's"
    );
    let start = Instant::now();
    drop(hand);
    let leases: Vec<Lease> = waiters
        .into_iter()
        .map(|w| w.join().unwrap().expect("each waiter acquires"))
        .collect();
    // Woken by events, not by the 100 ms safety re-check of each waiter in
    // turn (which would take seconds for 300).
    let woken = start.elapsed();
    assert!(woken < Duration::from_secs(5), "300 waiters took {woken:?}");
    eventually(
        "the waits' instances closed while holding",
        idle_bound,
        || instances() == 1,
    );
    for l in leases {
        l.release().unwrap();
    }
    eventually("every instance closed once idle", idle_bound, || {
        instances() == 0
    });
}
