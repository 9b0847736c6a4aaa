//! What `sidelease` refuses to take for a target, in every command: a URL
//! half built or mistyped, a lease file named as its database.

#[path = "../../core/tests/common/mod.rs"]
mod common;

const BIN: &str = env!("CARGO_BIN_EXE_sidelease");

fn sidelease(args: &[&str]) -> std::process::Output {
    common::command(BIN).args(args).output().unwrap()
}

#[test]
fn a_mistyped_or_half_built_url_is_refused_never_a_lease_file() {
    let d = tempfile::tempdir().unwrap();
    for target in [
        "postgresql:/app:HUNTER2@db/app?lease=x".to_string(),
        "POSTGRES:app:HUNTER2@db/app?lease=x".to_string(),
        // "${DATABASE_URL}?lease=scheduler" with the variable empty.
        format!("{}/?lease=scheduler", d.path().display()),
    ] {
        for args in [vec!["status", &target], vec!["hold", &target, "--", "true"]] {
            let out = sidelease(&args);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(out.status.code(), Some(71), "{args:?}: {err}");
            assert!(err.contains("invalid argument `target`"), "{args:?}: {err}");
            assert!(!err.contains("HUNTER2"), "{args:?}: {err}");
        }
    }
    // Nothing was made of it.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
}

/// The path every message names, `[lease file …/app.db.backend-lease]`,
/// pasted back: `status` said "free" of a held lease (its lease file's own
/// lease file), and `hold` ran its command beside the holder (issue 39).
#[test]
fn a_lease_file_given_as_the_target_is_refused_naming_its_database() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let lease = d.path().join("app.db.backend-lease");
    let ran = d.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let (db, lease) = (db.to_str().unwrap(), lease.to_str().unwrap());
    // Held, so that "free" would be the wrong answer it was; ended with
    // SIGTERM whatever the outcome (`hold` ends its command and releases;
    // a SIGKILL would leave the `sleep` holding the lease).
    struct Holder(std::process::Child);
    impl Drop for Holder {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the child this test started.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let _holder = Holder(
        common::command(BIN)
            .args(["hold", db, "--", "sleep", "30"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = std::time::Instant::now();
    while sidelease(&["status", db]).status.code() != Some(3) {
        assert!(t0.elapsed().as_secs() < 10, "hold did not take the lease");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The usage error of each command: 71 (`status`, `hold`), 2 (`lead`).
    for (args, code) in [
        (vec!["status", lease], 71),
        (vec!["status", "--json", lease], 71),
        (vec!["hold", lease, "--", "sh", "-c", &touch], 71),
        (vec!["lead", lease, "--", "sh", "-c", &touch], 2),
    ] {
        // Bounded: a `lead` that took the target would campaign for ever.
        let mut c = common::command(BIN)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t0.elapsed().as_secs() >= 10 {
                let _ = c.kill();
                panic!("{args:?}: still running after 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{lease} is a lease file"))
                && err.contains(&format!("did you mean {db}?")),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    assert!(!ran.exists(), "no command ran");
    assert!(
        !std::path::Path::new(&format!("{lease}.backend-lease")).exists(),
        "no lease file of the lease file"
    );
}

/// A mistyped path is free, and has no lease file: `status` says so with its
/// own exit status (66), so `sidelease status $DB && maintenance` stops. A
/// database that is there, or a lease file left by an earlier holder, is
/// plainly free (0).
#[test]
fn status_of_a_path_that_is_not_there_and_never_leased_exits_66() {
    let d = tempfile::tempdir().unwrap();
    let typo = d.path().join("ap.db");
    let typo = typo.to_str().unwrap();
    for args in [vec!["status", typo], vec!["status", "--json", typo]] {
        let out = sidelease(&args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(66), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{typo}: no such file, and no lease file"))
                && err.contains("mistyped"),
            "{args:?}: {err}"
        );
        let shown = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            shown.contains(": free") || shown.contains("\"state\":\"free\""),
            "{args:?}: the inspection is printed all the same: {shown}"
        );
    }
    assert!(
        !std::path::Path::new(&format!("{typo}.backend-lease")).exists(),
        "status made no lease file"
    );
    // The database there, never leased: free.
    let db = d.path().join("app.db");
    std::fs::write(&db, b"").unwrap();
    let db = db.to_str().unwrap();
    let out = sidelease(&["status", db]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains(": free"));
    let out = sidelease(&["status", db, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "free");
    // No database, a lease file an earlier holder left: free.
    let gone = d.path().join("gone.db");
    let gone = gone.to_str().unwrap();
    assert_eq!(
        sidelease(&["hold", gone, "--", "true"]).status.code(),
        Some(0)
    );
    let out = sidelease(&["status", gone]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
}
