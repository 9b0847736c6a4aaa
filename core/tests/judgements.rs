//! Answers only on evidence: a record that lacks what a judgement needs is
//! "unknown", never "image-replaced"; inspect gives a complete JSON document
//! for any path; resolution obeys `fs.protected_symlinks` like the kernel.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command};

use sidelease::{inspect, Error, Lease, Options, RecordStatus, State};

/// A live process this test started, ended by its PID on drop.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(Command::new("sleep").arg("30").spawn().unwrap())
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_record(lease: &Path, fields: serde_json::Value) {
    std::fs::write(lease, serde_json::to_vec(&fields).unwrap()).unwrap();
}

#[test]
fn a_record_without_proc_start_is_unknown_not_image_replaced() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let lease = d.path().join("app.db.backend-lease");
    let live = Sleeper::start();
    let held = Lease::acquire(&db, &Options::new()).unwrap();
    let mut rec = held.record().to_value();
    held.release().unwrap();
    // The record of a live process that does not hold the lock, written by
    // a version that recorded no start time: nothing says whether the
    // process is the same program.
    rec["pid"] = serde_json::json!(live.0.id());
    rec.as_object_mut().unwrap().remove("proc_start");
    rec.as_object_mut().unwrap().remove("released_at");
    let g = rec["generation"].as_u64().unwrap();
    write_record(&lease, rec);
    let i = inspect(&db, &Options::new()).unwrap();
    assert_eq!(i.state, State::Free);
    assert_eq!(i.record_status, RecordStatus::Unknown, "{}", i.to_json());
    // And a new holder is not told the previous one released cleanly.
    let l = Lease::acquire(&db, &Options::new()).unwrap();
    assert_eq!(l.previous_released_cleanly(), Some(false));
    assert_eq!(l.generation(), Some(g + 1));
}

#[test]
fn the_last_generation_is_refused_instead_of_wrapping() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let lease = d.path().join("app.db.backend-lease");
    let held = Lease::acquire(&db, &Options::new()).unwrap();
    let mut rec = held.record().to_value();
    held.release().unwrap();
    rec["generation"] = serde_json::json!(u64::MAX);
    write_record(&lease, rec);
    let e = Lease::acquire(&db, &Options::new()).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("generation"), "{e}");
    // Nothing was written over the record.
    let text = std::fs::read_to_string(&lease).unwrap();
    assert!(text.contains(&u64::MAX.to_string()), "{text}");
}

#[test]
fn inspect_of_a_non_utf8_path_is_complete_json() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join(OsStr::from_bytes(b"caf\xe9.db"));
    let held = Lease::acquire(&db, &Options::new()).unwrap();
    let json = inspect(&db, &Options::new()).unwrap().to_json();
    // The byte that is not UTF-8 travels as a lone surrogate escape (as
    // Python's surrogateescape reads it); the document is whole.
    assert!(json.starts_with('{') && json.ends_with('}'), "{json}");
    assert!(json.contains("\"state\":\"held\""), "{json}");
    assert!(json.contains("caf\\udce9.db.backend-lease"), "{json}");
    drop(held);
}

/// Sets `fs.protected_symlinks` and puts the old value back.
struct Sysctl(Option<String>);

const PROTECTED: &str = "/proc/sys/fs/protected_symlinks";

impl Sysctl {
    fn protect() -> Option<Sysctl> {
        let old = std::fs::read_to_string(PROTECTED).ok()?;
        std::fs::write(PROTECTED, "1").ok()?;
        Some(Sysctl(Some(old)))
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            let _ = std::fs::write(PROTECTED, old.trim());
        }
    }
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: fs.protected_symlinks is a Linux rule; symlinks are followed as the kernel follows them"
)]
fn another_users_symlink_in_a_sticky_directory_is_not_followed() {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to set fs.protected_symlinks and own a link as nobody");
        return;
    }
    let Some(_guard) = Sysctl::protect() else {
        eprintln!("skipped: fs.protected_symlinks cannot be set here");
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let sticky = d.path().join("shared");
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(elsewhere.join("victim.db"), b"").unwrap();
    for (link, dest) in [("existing.db", "victim.db"), ("dangling.db", "ghost.db")] {
        let at = sticky.join(link);
        symlink(elsewhere.join(dest), &at).unwrap();
        std::os::unix::fs::lchown(&at, Some(65534), Some(65534)).unwrap();
        let e = Lease::acquire(&at, &Options::new()).unwrap_err();
        match &e {
            Error::Io { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::EACCES), "{link}: {e}")
            }
            other => panic!("{link}: {other:?}"),
        }
        let made = elsewhere.join(format!("{dest}.backend-lease"));
        assert!(!made.exists(), "{link}: created {}", made.display());
    }
    // A link owned by the follower is followed as before.
    let mine = sticky.join("mine.db");
    symlink(elsewhere.join("victim.db"), &mine).unwrap();
    let l = Lease::acquire(&mine, &Options::new()).unwrap();
    assert_eq!(l.lease_path(), elsewhere.join("victim.db.backend-lease"));
}
