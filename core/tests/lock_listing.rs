//! `/proc/locks` comes a page per read, and the kernel's list of locks can
//! change between one page and the next: an entry added at the head of the
//! list shows the last one of the previous page again, one removed before
//! the reader's place hides the next. A busy machine (the cross-language
//! suite, a crowd of contenders) changes its locks all the time. Whoever
//! reads the listing must neither count one lock twice (a lease split
//! between "two" holders that are one) nor miss one (a split not seen).
//! Alone in its own test binary: it fills the lock table on purpose.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{fcntl_lock, flock, FlockOperation};
use sidelease::{inspect, Lease, Options, State};

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no table of the machine's locks to read"
)]
fn a_split_is_told_once_while_the_lock_table_changes_under_the_reader() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let opts = Options::new().watch(false);
    // The orphan: this process's lock on a lease file someone unlinked and
    // recreated (the playbook's wrong arm), while another lease is held at
    // the new file so that both lists have an entry to lose.
    let orphaned = Lease::acquire(&db, &opts).unwrap();
    std::fs::remove_file(d.path().join("app.db.backend-lease")).unwrap();
    File::create(d.path().join("app.db.backend-lease")).unwrap();
    let other = d.path().join("other.db");
    let held = Lease::acquire(&other, &opts).unwrap();

    // Enough shared locks that the listing spans several pages (a line is
    // about 55 bytes, a page 4096), and threads that take and drop
    // exclusive ones without pause, so that pages are read across changes.
    let pad: Vec<File> = (0..300)
        .map(|i| {
            let f = File::create(d.path().join(format!("pad{i}"))).unwrap();
            flock(&f, FlockOperation::NonBlockingLockShared).unwrap();
            f
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    // Half of it POSIX locks (an SQLite database's), which no reader of
    // flock locks keeps but which move their entries all the same.
    let churn: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            let files: Vec<File> = (0..20)
                .map(|i| File::create(d.path().join(format!("churn{t}-{i}"))).unwrap())
                .collect();
            let lock = move |f: BorrowedFd<'_>, op| {
                if t % 2 == 0 {
                    flock(f, op)
                } else {
                    fcntl_lock(f, op)
                }
            };
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for f in &files {
                        lock(f.as_fd(), FlockOperation::NonBlockingLockExclusive).unwrap();
                    }
                    for f in &files {
                        lock(f.as_fd(), FlockOperation::Unlock).unwrap();
                    }
                    n += 1;
                    // Leave the reader a core's share (two cores here).
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                n
            })
        })
        .collect();

    let me = std::process::id();
    let deadline = Instant::now() + Duration::from_secs(3);
    let (mut looks, mut wrong) = (0u32, Vec::new());
    while Instant::now() < deadline && looks < 200 {
        looks += 1;
        let split = inspect(&db, &Options::new()).unwrap();
        let orphans: Vec<u32> = split.orphans.iter().map(|o| o.pid).collect();
        if split.state != State::Split || orphans != [me] {
            wrong.push(format!(
                "look {looks}: {:?} orphans {orphans:?}",
                split.state
            ));
        }
        let other_look = inspect(&other, &Options::new()).unwrap();
        if other_look.state != State::Held || other_look.holders != [me] {
            wrong.push(format!(
                "look {looks}: other {:?} holders {:?} unavailable {:?}",
                other_look.state, other_look.holders, other_look.unavailable
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = churn.into_iter().map(|t| t.join().unwrap()).sum();
    drop((pad, held, orphaned));
    eprintln!("{looks} looks, {rounds} churn rounds");
    assert!(rounds > 0, "the churn never ran");
    assert!(looks >= 20, "only {looks} looks in the time given");
    assert!(
        wrong.is_empty(),
        "{} of {looks} looks wrong while the lock table changed ({rounds} churn rounds):\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
