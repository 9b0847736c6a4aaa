//! The `sidelease` command, run as a real process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sidelease");

fn sidelease(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// `hold` running a shell that says READY and waits for a line on stdin.
struct Holder {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Holder {
    fn start(db: &str, extra: &[&str]) -> Holder {
        let mut args = vec!["hold", db];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", "echo READY $$; read line; exit 3"]);
        let mut child = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("READY"),
            "hold did not start its command: {line:?}"
        );
        Holder { child, out }
    }

    fn command_pid(&self) -> u32 {
        self.child.id() // the shell's PID is read separately when needed
    }

    fn finish(mut self) -> std::process::ExitStatus {
        writeln!(self.child.stdin.as_mut().unwrap()).unwrap();
        let _ = &mut self.out;
        wait_bounded(&mut self.child)
    }
}

fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("process {} did not exit; killed it", child.id());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn status_json(db: &str) -> (i32, serde_json::Value) {
    let out = sidelease(&["status", db, "--json"]);
    let v = serde_json::from_slice(&out.stdout).unwrap();
    (out.status.code().unwrap(), v)
}

#[test]
fn status_of_a_free_lease_exits_zero() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let db = db.to_str().unwrap();
    let (code, v) = status_json(db);
    assert_eq!(code, 0);
    assert_eq!(v["state"], "free");
    let out = sidelease(&["status", db]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(": free"));
}

#[test]
fn hold_passes_the_command_status_through_and_releases() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let db = db.to_str().unwrap();
    let out = sidelease(&["hold", db, "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let (code, v) = status_json(db);
    assert_eq!(code, 0);
    assert_eq!(v["record_status"], "released");
    assert!(v["record"]["runtime"]
        .as_str()
        .unwrap()
        .starts_with("sidelease-cli"));
}

#[test]
fn hold_refuses_a_held_lease_naming_the_holder() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let db = db.to_str().unwrap();
    let h = Holder::start(db, &[]);
    let hold_pid = h.command_pid();
    let out = sidelease(&["hold", db, "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("is leased by pid {hold_pid} (sidelease-cli")),
        "{err}"
    );
    let out = sidelease(&["hold", db, "-E", "9", "--", "true"]);
    assert_eq!(out.status.code(), Some(9));
    let (code, v) = status_json(db);
    assert_eq!(code, 3);
    assert_eq!(v["state"], "held");
    assert_eq!(v["holders"], serde_json::json!([hold_pid]), "{v}");
    assert_eq!(h.finish().code(), Some(3));
    assert_eq!(status_json(db).0, 0);
}

#[test]
fn hold_waits_with_a_timeout() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let db = db.to_str().unwrap().to_owned();
    let h = Holder::start(&db, &[]);
    let t = Instant::now();
    let out = sidelease(&["hold", &db, "--timeout", "0.2", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out after"));
    let waiter = {
        let db = db.clone();
        std::thread::spawn(move || sidelease(&["hold", &db, "--timeout", "20", "--", "true"]))
    };
    std::thread::sleep(Duration::from_millis(100));
    h.finish();
    assert_eq!(waiter.join().unwrap().status.code(), Some(0));
}

#[test]
fn the_command_keeps_the_lease_if_hold_is_killed_unless_no_inherit() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let db = db.to_str().unwrap();
    for (flags, still_held) in [(&[][..], true), (&["--no-inherit"][..], false)] {
        let mut h = Holder::start(db, flags);
        unsafe { libc::kill(h.child.id() as i32, libc::SIGKILL) };
        wait_bounded(&mut h.child);
        let (code, v) = status_json(db);
        assert_eq!(code == 3, still_held, "{flags:?}: {v}");
        // End the command (our grandchild) by closing its stdin.
        drop(h.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while status_json(db).0 != 0 {
            assert!(
                Instant::now() < deadline,
                "the command kept the lease after exiting"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn sigterm_is_forwarded_and_the_lease_released_after_the_command() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db");
    let db = db.to_str().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "hold",
            db,
            "--",
            "sh",
            "-c",
            "trap 'exit 42' TERM; echo READY; while :; do sleep 0.05; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("READY"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_bounded(&mut child);
    assert_eq!(
        st.code(),
        Some(42),
        "the command's trap ran and hold passed its status on"
    );
    let (code, v) = status_json(db);
    assert_eq!(code, 0);
    assert_eq!(v["record_status"], "released");
}

#[test]
fn bad_arguments_are_named() {
    let d = tempfile::tempdir().unwrap();
    let x = d.path().join("x.db");
    let x = x.to_str().unwrap();
    let out = sidelease(&["hold", "", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("<TARGET>"));
    let out = sidelease(&["hold", x, "--suffix", "a/b", "--", "true"]);
    assert_eq!(out.status.code(), Some(71));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`suffix`"));
    let out = sidelease(&["hold", x, "--metadata", "[1]", "--", "true"]);
    assert_eq!(out.status.code(), Some(71));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`metadata`"));
    let out = sidelease(&["hold", x, "--timeout=-1", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("`timeout`"));
    let out = sidelease(&["hold", x, "--", "/nonexistent/cmd"]);
    assert_eq!(out.status.code(), Some(127));
}
