//! The core within one process: sharing between handles and threads,
//! release, check, and every bad input getting an error that names it.

use std::os::unix::fs::symlink;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use sidelease::{inspect, Check, Error, Lease, LeaseState, Options, RecordStatus, State, Wait};

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn handles_share_one_lease_and_the_last_release_frees_it() {
    let d = dir();
    let db = d.path().join("app.db");
    let a = Lease::acquire(&db, &Options::new()).unwrap();
    let b = Lease::acquire(&db, &Options::new()).unwrap();
    assert_eq!(a.record().nonce, b.record().nonce);
    let g = a.generation().unwrap();
    assert!(
        g > 1_600_000_000_000_000,
        "a first lease file starts at the clock: {g}"
    );
    a.release().unwrap();
    a.release().unwrap();
    assert!(a.is_released());
    assert_eq!(b.check().unwrap(), Check::Held);
    assert_eq!(inspect(&db, &Options::new()).unwrap().state, State::Held);
    drop(b);
    let i = inspect(&db, &Options::new()).unwrap();
    assert_eq!(i.state, State::Free);
    assert_eq!(i.record_status, RecordStatus::Released);
    let c = Lease::acquire(&db, &Options::new()).unwrap();
    assert_eq!(c.generation(), Some(g + 1));
    assert_eq!(c.previous_released_cleanly(), Some(true));
}

#[test]
fn threads_holding_at_once_share_one_lease() {
    let d = dir();
    let db = Arc::new(d.path().join("app.db"));
    let first = Lease::acquire(&*db, &Options::new()).unwrap();
    let nonce = first.record().nonce.clone();
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (db, barrier) = (db.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let l = Lease::acquire(&*db, &Options::new()).unwrap();
                let n = l.record().nonce.clone();
                barrier.wait(); // all eight hold a handle at this point
                n
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), nonce);
    }
    assert_eq!(inspect(&*db, &Options::new()).unwrap().state, State::Held);
    drop(first);
    assert_eq!(inspect(&*db, &Options::new()).unwrap().state, State::Free);
}

#[test]
fn racing_acquire_and_release_in_threads_neither_fail_nor_deadlock() {
    let d = dir();
    let db = Arc::new(d.path().join("race.db"));
    let total = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (db, total) = (db.clone(), total.clone());
            std::thread::spawn(move || {
                let opts = Options::new().wait(Wait::Timeout(Duration::from_secs(10)));
                for _ in 0..300 {
                    let l = Lease::acquire(&*db, &opts).unwrap();
                    assert_eq!(l.check().unwrap(), Check::Held);
                    total.fetch_add(1, Ordering::SeqCst);
                    l.release().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(total.load(Ordering::SeqCst), 1200);
    assert_eq!(inspect(&*db, &Options::new()).unwrap().state, State::Free);
}

#[test]
fn a_released_handle_refuses_check() {
    let d = dir();
    let l = Lease::acquire(d.path().join("x.db"), &Options::new()).unwrap();
    l.release().unwrap();
    let e = l.check().unwrap_err();
    assert!(e.to_string().contains("released"), "{e}");
}

/// Hold the lease of `app.db` through a descriptor outside this library's
/// registry, as another process would.
fn hold_outside_registry(d: &tempfile::TempDir) -> std::fs::File {
    let lp = d.path().join("app.db.backend-lease");
    std::fs::write(&lp, b"").unwrap();
    let f = std::fs::File::open(&lp).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    f
}

#[test]
fn cancel_ends_a_wait_from_another_thread() {
    let d = dir();
    let db = d.path().join("app.db");
    let f = hold_outside_registry(&d);
    let token = sidelease::CancelToken::new().unwrap();
    let t2 = token.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        t2.cancel();
    });
    let start = std::time::Instant::now();
    let e =
        Lease::acquire_cancellable(&db, &Options::new().wait(Wait::Forever), &token).unwrap_err();
    assert!(matches!(e, Error::Cancelled { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
    canceller.join().unwrap();
    drop(f);
    // Nothing stayed held by the cancelled wait.
    Lease::acquire(&db, &Options::new()).unwrap();
}

#[test]
fn a_waiter_in_this_process_wakes_when_the_other_holder_closes() {
    let d = dir();
    let db = d.path().join("app.db");
    let f = hold_outside_registry(&d);
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(f);
    });
    let start = std::time::Instant::now();
    let opts = Options::new().wait(Wait::Timeout(Duration::from_secs(10)));
    let l = Lease::acquire(&db, &opts).unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(90) && took < Duration::from_secs(2),
        "{took:?}"
    );
    closer.join().unwrap();
    drop(l);
}

fn invalid(target: &std::path::Path, opts: &Options) -> (String, String) {
    match Lease::acquire(target, opts).unwrap_err() {
        Error::InvalidArgument { argument, message } => (argument.to_string(), message),
        e => panic!("expected invalid argument, got {e}"),
    }
}

#[test]
fn bad_input_names_the_argument() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let d = dir();
    let db = d.path().join("app.db");
    assert_eq!(
        invalid(std::path::Path::new(""), &Options::new()).0,
        "target"
    );
    let nul = std::path::Path::new(OsStr::from_bytes(b"a\0b"));
    assert_eq!(invalid(nul, &Options::new()).0, "target");
    assert_eq!(
        invalid(std::path::Path::new("/"), &Options::new()).0,
        "target"
    );
    assert_eq!(invalid(&db, &Options::new().suffix("")).0, "suffix");
    assert_eq!(invalid(&db, &Options::new().suffix("a/b")).0, "suffix");
    let e = Options::new()
        .metadata(serde_json::json!([1, 2]))
        .unwrap_err();
    assert!(
        e.to_string().contains("`metadata`: must be a JSON object"),
        "{e}"
    );
    let big = serde_json::json!({"k": "x".repeat(20_000)});
    assert!(Options::new().metadata(big).is_err());
}

#[test]
fn missing_directory_is_an_io_error_naming_it() {
    let d = dir();
    let target = d.path().join("no-such-dir/app.db");
    let e = Lease::acquire(&target, &Options::new()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT));
    assert!(e.to_string().contains("no-such-dir"), "{e}");
    assert!(
        !d.path().join("no-such-dir").exists(),
        "directories are never created"
    );
}

#[test]
fn lease_path_that_is_a_directory_or_symlink_is_refused() {
    let d = dir();
    std::fs::create_dir(d.path().join("a.db.backend-lease")).unwrap();
    let e = Lease::acquire(d.path().join("a.db"), &Options::new()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EISDIR), "{e}");
    assert!(e.to_string().contains("a.db.backend-lease"), "{e}");

    std::fs::write(d.path().join("elsewhere"), b"").unwrap();
    symlink(
        d.path().join("elsewhere"),
        d.path().join("b.db.backend-lease"),
    )
    .unwrap();
    let e = Lease::acquire(d.path().join("b.db"), &Options::new()).unwrap_err();
    assert!(e.to_string().contains("is a symlink"), "{e}");
    assert!(e.to_string().contains("b.db.backend-lease"), "{e}");
    let e = inspect(d.path().join("b.db"), &Options::new()).unwrap_err();
    assert!(e.to_string().contains("is a symlink"), "{e}");
}

#[test]
fn data_directory_target_gets_a_sibling_lease_file() {
    let d = dir();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let l = Lease::acquire(data.join("."), &Options::new()).unwrap();
    let want = d.path().canonicalize().unwrap().join("data.backend-lease");
    assert_eq!(l.lease_path(), want);
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: POSIX names no filesystem type, so none is refused (docs/platforms.md)"
)]
fn pseudo_filesystems_are_refused_unless_allowed() {
    let e = Lease::acquire("/proc/sidelease-test.db", &Options::new()).unwrap_err();
    match &e {
        Error::UnsupportedFilesystem { fstype, .. } => assert_eq!(fstype, "proc"),
        e => panic!("{e}"),
    }
    assert!(e.to_string().contains("allow_unsupported_fs"));
    // Allowed, it goes on to open and fails there, naming the path.
    let allowed = Options::new().allow_unsupported_fs(true);
    let e = Lease::acquire("/proc/sidelease-test.db", &allowed).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("/proc/sidelease-test.db.backend-lease"),
        "{e}"
    );
}

#[test]
fn torn_record_is_unreadable_and_counted_unclean_and_generation_grows() {
    let d = dir();
    let db = d.path().join("app.db");
    let first = Lease::acquire(&db, &Options::new()).unwrap();
    let g = first.generation().unwrap();
    drop(first);
    let lp = d.path().join("app.db.backend-lease");
    let mut bytes = std::fs::read(&lp).unwrap();
    bytes.extend_from_slice(b"tail of an older, longer record\"}");
    std::fs::write(&lp, &bytes).unwrap();
    let l = Lease::acquire(&db, &Options::new()).unwrap();
    assert!(l.previous().is_none());
    assert_eq!(l.previous_released_cleanly(), Some(false));
    assert_eq!(l.generation(), Some(g + 1));
}

#[test]
fn an_emptied_lease_file_is_no_new_lease_and_its_generation_cannot_repeat() {
    let d = dir();
    let db = d.path().join("app.db");
    let lp = d.path().join("app.db.backend-lease");
    // A file someone created and nobody wrote: no record says how the
    // last holder ended (it may have replaced a deleted lease file), and
    // the generation starts at the clock, above every one handed out.
    std::fs::File::create(&lp).unwrap();
    let l = Lease::acquire(&db, &Options::new()).unwrap();
    let first = l.generation().unwrap();
    assert!(first > 1_600_000_000_000_000, "{first}");
    assert_eq!(l.previous_released_cleanly(), None);
    drop(l);
    // The same file emptied after it held records (a log rotation's
    // copytruncate, `: > file`), later than the filesystem's clock tick: it
    // says nothing of how the last holder ended, and generation 1 would
    // repeat a fencing token already handed out.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&lp)
        .unwrap()
        .set_len(0)
        .unwrap();
    let l = Lease::acquire(&db, &Options::new()).unwrap();
    assert_eq!(l.previous_released_cleanly(), None);
    let g = l.generation().unwrap();
    assert!(g > first + 1, "jumps to the clock again: {g} after {first}");
    drop(l);
    // And grows one by one from there.
    let l = Lease::acquire(&db, &Options::new()).unwrap();
    assert_eq!(l.generation(), Some(g + 1));
    assert_eq!(l.previous_released_cleanly(), Some(true));
}

#[test]
fn a_lost_holder_records_no_clean_release_and_the_next_generation_is_larger() {
    // Issue 35: a rival's fresh, locked file renamed over the lease file
    // takes the lease; once the rival lets go and the lost holder releases,
    // the next holder's generation is above every earlier one (never 1
    // again), and nothing says the last holder released cleanly.
    use std::os::fd::AsFd;
    let d = dir();
    let db = d.path().join("app.db");
    let lp = d.path().join("app.db.backend-lease");
    drop(Lease::acquire(&db, &Options::new()).unwrap());
    let held = Lease::acquire(&db, &Options::new()).unwrap();
    let g = held.generation().unwrap();
    let tmp = d.path().join("rival");
    let rival = std::fs::File::create(&tmp).unwrap();
    rustix::fs::flock(rival.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
    std::fs::rename(&tmp, &lp).unwrap();
    let t0 = Instant::now();
    while !matches!(held.state(), LeaseState::Lost(_)) {
        assert!(t0.elapsed() < Duration::from_secs(10), "never lost");
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(rival);
    held.release().unwrap();
    let next = Lease::acquire(&db, &Options::new()).unwrap();
    assert!(
        next.generation().unwrap() > g,
        "{:?} after {g}",
        next.generation()
    );
    assert_eq!(next.previous_released_cleanly(), None);
    assert!(next.previous().is_none());
}

/// A holder whose lease file was deleted over and over keeps only the
/// newest of its former files (16) and lets the rest go. The number of an
/// inode let go comes back on the next file made (ext4 reuses it at once):
/// that file, another database's lease file, is not this lease's, and
/// acquiring it must not share this lease (it did: the registry kept every
/// file the lease ever held).
#[test]
fn a_file_a_lease_let_go_is_not_shared_when_its_inode_number_comes_back() {
    use std::collections::HashSet;
    use std::os::unix::fs::MetadataExt;
    let d = dir();
    let a = Lease::acquire(d.path().join("a.db"), &Options::new()).unwrap();
    let file = a.lease_path().to_path_buf();
    let mut former = HashSet::new();
    for _ in 0..24 {
        let ino = std::fs::metadata(&file).unwrap().ino();
        former.insert(ino);
        std::fs::remove_file(&file).unwrap();
        // The holder's watch puts a file back.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::metadata(&file).map_or(true, |m| m.ino() == ino || m.len() == 0) {
            assert!(
                Instant::now() < deadline,
                "the holder never put its file back"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(a.check().unwrap(), Check::Held);
    // Only a file let go (closed, unlinked) can give its number back.
    let mut reused = None;
    for i in 0..2000 {
        let p = d.path().join(format!("b{i}.db.backend-lease"));
        std::fs::write(&p, b"").unwrap();
        if former.contains(&std::fs::metadata(&p).unwrap().ino()) {
            reused = Some(d.path().join(format!("b{i}.db")));
            break;
        }
    }
    let Some(b) = reused else {
        eprintln!("not given: this filesystem gave no inode number back");
        return;
    };
    let lb = Lease::acquire(&b, &Options::new().split_guard(false)).unwrap();
    assert_eq!(
        lb.target(),
        b.as_path(),
        "another database's lease was shared"
    );
    assert_ne!(lb.record().nonce, a.record().nonce);
}
