//! The split guard of a process that holds many leases: its own lease files
//! are recognised from its registry, not read back one by one. Alone in its
//! own test binary, because it counts this process's read calls.

use sidelease::{Lease, Options};

/// Read system calls this process has made (`syscr` in `/proc/self/io`).
fn reads() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("syscr: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("syscr in /proc/self/io")
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no /proc to read; the guard judges from records only"
)]
fn a_new_lease_beside_hundreds_held_reads_a_bounded_amount() {
    const HELD: usize = 400;
    let d = tempfile::tempdir().unwrap();
    let opts = Options::new();
    let held: Vec<Lease> = (0..HELD)
        .map(|i| Lease::acquire(d.path().join(format!("db{i}")), &opts).unwrap())
        .collect();
    // Every one of them was a new file, so each went through the full guard.
    assert!(held.iter().all(|l| l.record().split_checked == Some(true)));

    let before = reads();
    let fresh = Lease::acquire(d.path().join("fresh.db"), &opts).unwrap();
    let used = reads() - before;
    // A complete check all the same: this process's 400 locks were seen and
    // accounted for, not skipped blindly.
    assert_eq!(fresh.record().split_checked, Some(true));
    // Reading each held record back (or each one's fdinfo) would cost at
    // least one read per held lease; /proc/locks itself takes a few.
    assert!(
        used < (HELD / 4) as u64,
        "{used} read calls to acquire one new lease beside {HELD} held"
    );
}
