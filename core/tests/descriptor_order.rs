//! A lease file's descriptor is numbered above every inotify instance of
//! the process once acquired. When a process is killed, the kernel runs the
//! part of its descriptors' closes that lets a flock go in the reverse
//! order of their numbers, and an inotify instance's teardown waits for an
//! SRCU grace period: numbered below one, a SIGKILLed holder's lock was
//! let go 8-20 ms after the kill instead of about 1 ms (issue 38's
//! failover). One test, run alone in this binary: it reads the process's
//! whole descriptor table.

#[path = "common/child.rs"]
mod child;

use std::path::Path;
use std::time::Duration;

use sidelease::{Lease, Options, Wait};

fn links() -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(to) = std::fs::read_link(e.path()) {
            out.push((fd, to.to_string_lossy().into_owned()));
        }
    }
    out
}

/// The descriptors of `lease`'s file, and the highest inotify instance.
fn numbers(lease: &Lease) -> (Vec<i32>, i32) {
    let all = links();
    let path = lease.lease_path().to_string_lossy().into_owned();
    let mine = all
        .iter()
        .filter(|(_, to)| *to == path)
        .map(|(fd, _)| *fd)
        .collect();
    let inotify = all
        .iter()
        .filter(|(_, to)| to == "anon_inode:inotify")
        .map(|(fd, _)| *fd)
        .max()
        .unwrap_or(-1);
    (mine, inotify)
}

fn assert_above(lease: &Lease, what: &str) {
    let (mine, inotify) = numbers(lease);
    assert!(!mine.is_empty(), "{what}: no descriptor of the lease file");
    assert!(
        inotify >= 0,
        "{what}: no inotify instance (the watch is on, so there is one)"
    );
    // The lock goes with the last of the file's descriptors to be closed:
    // the highest, when a process is killed.
    let top = *mine.iter().max().unwrap();
    assert!(
        top > inotify,
        "{what}: the lease file's descriptors {mine:?} are all below inotify instance {inotify}"
    );
    // No free number was left below the lease: the program's next open is
    // numbered above it, so a lock the holder takes next is let go before
    // the lease when it is killed (a leader's own lock, test_elect.py's
    // detector).
    let next = std::fs::File::open("/dev/null").unwrap();
    let n = std::os::fd::AsRawFd::as_raw_fd(&next);
    assert!(
        n > top,
        "{what}: the next open took {n}, below the lease file's descriptor {top} (a number freed by moving it)"
    );
}

#[test]
#[ignore = "run by the test below as its holder"]
fn child_holds() {
    let db = std::env::var("SIDELEASE_CHILD_TARGET").unwrap();
    let _l = Lease::acquire(&db, &Options::new()).unwrap();
    println!("HELD");
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no inotify instances, nothing is moved"
)]
fn a_held_lease_files_descriptor_is_above_every_inotify_instance() {
    let d = tempfile::tempdir().unwrap();
    let db = |n: &str| d.path().join(n);

    // A file the program opened before: its number, freed later, is a
    // hole below the watch's instance.
    let early = std::fs::File::open(Path::new("/dev/null")).unwrap();
    // The first acquisition of the process: the watch's instance is made
    // before the lease file is opened.
    let first = Lease::acquire(db("a.db"), &Options::new()).unwrap();
    assert_above(&first, "the first lease");
    drop(early);
    // A lease file opened in that hole is moved up.
    let second = Lease::acquire(db("c.db"), &Options::new()).unwrap();
    assert_above(&second, "a lease file opened below the watch's instance");
    drop(first);

    // After a wait: the waiter's own instance was made after the open.
    let mut holder = child::spawn_until_held("child_holds", "SIDELEASE_CHILD_TARGET", db("b.db"));
    let waiter = {
        let p = db("b.db");
        std::thread::spawn(move || {
            Lease::acquire(
                &p,
                &Options::new().wait(Wait::Timeout(Duration::from_secs(20))),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    holder.kill().unwrap();
    holder.wait().unwrap();
    let waited = waiter.join().unwrap().unwrap();
    assert_above(&waited, "a lease acquired after a wait");
    drop(waited);
    drop(second);
}
