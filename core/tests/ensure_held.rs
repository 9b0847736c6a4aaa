//! `ensure_held()` looks at the path itself, so it never passes while
//! `check()` says the path leads elsewhere, whether or not the holder's
//! watch has heard. Alone in its own test binary, because it stops the
//! process's watcher thread.

use sidelease::{Check, Error, Lease, Options};

#[test]
fn ensure_held_agrees_with_check_and_puts_the_file_back_itself() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let lease = Lease::acquire(&db, &Options::new()).unwrap();
    let lp = lease.lease_path().to_path_buf();

    // The watcher is stopped: nobody else will put the file back.
    sidelease::watch::pause();
    std::fs::remove_file(&lp).unwrap();
    assert_eq!(lease.check().unwrap(), Check::Unlinked);
    lease.ensure_held().expect("put back by ensure_held itself");
    assert_eq!(lease.check().unwrap(), Check::Held);
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&lp).unwrap()).unwrap();
    assert_eq!(rec["nonce"], lease.record().nonce.clone().unwrap().as_str());
    assert_eq!(rec["generation"], lease.generation().unwrap());

    // Its directory gone: not lost (nobody holds a file at the path), but
    // not whole either, and ensure_held says so rather than passing.
    let sub = d.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let in_sub = Lease::acquire(sub.join("app.db"), &Options::new()).unwrap();
    std::fs::rename(&sub, d.path().join("sub.moved")).unwrap();
    assert_eq!(in_sub.check().unwrap(), Check::Unlinked);
    match in_sub.ensure_held() {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("app.db.backend-lease"), "{path:?}"),
        other => panic!("expected an I/O error naming the lease file, got {other:?}"),
    }
    sidelease::watch::resume();

    // Without the watch nothing is put back, and ensure_held says so.
    let off = Lease::acquire(d.path().join("off.db"), &Options::new().watch(false)).unwrap();
    std::fs::remove_file(off.lease_path()).unwrap();
    assert_eq!(off.check().unwrap(), Check::Unlinked);
    assert!(matches!(off.ensure_held(), Err(Error::Io { .. })));
    assert_eq!(off.check().unwrap(), Check::Unlinked);
}
