//! What a holder and `inspect` say when an operator makes the lease file or
//! its directory immutable, or a rival in another PID namespace takes the
//! file at the path: each report names what really happened. These need
//! root (chattr, unshare); without it each test says it was skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Agent;
use serde_json::{json, Value};

fn root() -> bool {
    // SAFETY: no memory effects.
    let yes = unsafe { libc::geteuid() } == 0;
    if !yes {
        eprintln!("skipped: needs root (chattr, unshare)");
    }
    yes
}

/// `chattr +i` on a path for one test, undone when dropped (so the
/// temporary directory can be removed whatever the test did).
struct Immutable(PathBuf);

impl Immutable {
    fn set(p: &Path) -> Option<Immutable> {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(p)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: chattr +i {} failed (filesystem?)", p.display());
            return None;
        }
        Some(Immutable(p.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on an agent this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Stop an agent and wait until every thread of it is stopped (kill(2)
/// returns before the signal has taken effect).
fn pause(pid: u32) {
    signal(pid, libc::SIGSTOP);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                    s.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T'))
                })
            });
        if stopped {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn an_immutable_lease_file_is_released_all_the_same_and_not_called_replaced() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db").to_str().unwrap().to_owned();
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let h = a.acquire_ok(&db);
    let lp = PathBuf::from(h["lease_path"].as_str().unwrap());
    let Some(frozen) = Immutable::set(&lp) else {
        return;
    };
    // The lock is dropped even though the release cannot be written.
    let r = a.call(json!({"cmd": "release", "handle": h["handle"]}));
    assert_eq!(r["ok"], true, "{r}");
    let i = b.inspect(&db);
    assert_eq!(i["state"], "free", "{i}");
    // Its process lives and holds nothing, but nothing says its image was
    // replaced: it may simply have released into a file that took no write.
    assert_eq!(i["record_status"], "unknown", "{i}");
    drop(frozen);
    // The record never said released: the next holder runs its recovery.
    let got = b.acquire_ok(&db);
    assert_eq!(got["previous_released_cleanly"], false, "{got}");
    assert_eq!(
        got["generation"].as_u64(),
        h["generation"].as_u64().map(|g| g + 1),
        "{got}"
    );
}

#[test]
fn an_immutable_directory_is_named_as_the_reason_the_file_could_not_be_put_back() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let sub = d.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let db = sub.join("app.db").to_str().unwrap().to_owned();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sidelease-agent"));
    cmd.env("SIDELEASE_WATCH_RECHECK_MS", "300");
    let mut a = Agent::spawn_cmd(cmd);
    let h = a.acquire_ok(&db);
    // Paused, so the file is not put back before the directory is frozen.
    pause(a.pid);
    std::fs::remove_file(h["lease_path"].as_str().unwrap()).unwrap();
    let frozen = Immutable::set(&sub);
    signal(a.pid, libc::SIGCONT);
    let Some(_frozen) = frozen else {
        return;
    };
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 5}));
    assert_eq!(got["lost"], true, "{got}");
    let reason = got["reason"].as_str().unwrap();
    assert!(
        reason.contains("Operation not permitted") && !reason.contains("No such file"),
        "the reason names the error the directory gave: {reason}"
    );
}

/// An agent as PID 1 of a new PID namespace, and its PID here.
fn agent_in_new_pid_ns() -> Option<(Agent, u32)> {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_sidelease-agent"));
    let mut a = Agent::spawn_cmd(cmd);
    let inner = a.call(json!({"cmd": "ping"}));
    assert_eq!(inner["pid"], 1, "PID 1 of its namespace: {inner}");
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", a.pid, a.pid)).ok()?;
    let pid = children.split_whitespace().next()?.parse().ok()?;
    Some((a, pid))
}

#[test]
fn a_rival_in_another_pid_namespace_is_named_with_its_pid_here() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db").to_str().unwrap().to_owned();
    let mut a = Agent::spawn();
    let h = a.acquire_ok(&db);
    // The holder is paused while its file is deleted, and a rival that
    // cannot see it (PID 1 of its own namespace) takes the new one.
    pause(a.pid);
    std::fs::remove_file(h["lease_path"].as_str().unwrap()).unwrap();
    let Some((mut rival, here)) = agent_in_new_pid_ns() else {
        signal(a.pid, libc::SIGCONT);
        eprintln!("skipped: unshare --pid failed");
        return;
    };
    let r: Value = rival.acquire_ok(&db);
    assert_eq!(r["record"]["pid"], 1, "{r}");
    signal(a.pid, libc::SIGCONT);
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 5}));
    assert_eq!(got["lost"], true, "{got}");
    let reason = got["reason"].as_str().unwrap();
    assert!(
        reason.contains("pid 1 of another PID namespace")
            && reason.contains(&format!("pid {here} here")),
        "the reason says whose PID 1 it is: {reason}"
    );
}
