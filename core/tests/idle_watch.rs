//! What a process that holds nothing costs while it waits. Alone in its
//! own test binary, because it measures the whole process's CPU time.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sidelease::{ErrorKind, Lease, Options, Wait};

/// CPU time this process has used, every thread's.
fn cpu() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: filled above.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A wait longer than the holder's watch lingers once nothing is held
/// (2 s) sleeps all along: the watch thread, kept for the waiting attempt,
/// planned the passed end of its linger again and again and spun a whole
/// core until the wait ended (`sidelease lead` campaigners burned one each).
#[test]
fn a_long_wait_with_nothing_held_uses_no_cpu() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let file = d.path().join("app.db.backend-lease");
    // Another process holds the lease file: util-linux flock(1), no record.
    let mut holder = Command::new("flock")
        .arg(&file)
        .args(["sleep", "30"])
        .stdin(Stdio::null())
        .spawn()
        .expect("flock(1)");
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(&file).is_err() {
        assert!(Instant::now() < deadline, "flock(1) never made the file");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    let waiter = std::thread::spawn(move || {
        let opts = Options::new().wait(Wait::Timeout(Duration::from_millis(4500)));
        Lease::acquire(&db, &opts).map(drop)
    });
    // Past the linger, with the wait still going on.
    std::thread::sleep(Duration::from_millis(2500));
    let before = cpu();
    std::thread::sleep(Duration::from_millis(1500));
    let used = cpu() - before;
    let outcome = waiter.join().unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    match outcome {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        other => panic!("the wait should have timed out: {other:?}"),
    }
    // A waiter wakes every 100 ms to look again: microseconds each.
    assert!(
        used < Duration::from_millis(150),
        "a wait used {used:?} of CPU in 1.5 s with nothing held"
    );
}
