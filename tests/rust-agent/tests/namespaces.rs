//! What container platforms and operators do around a lease: the same
//! directory at two mount points, holders and contenders in different PID
//! namespaces, overlayfs with layers on different filesystems. These need
//! root (mount, unshare); without it each test says it was skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::Agent;
use serde_json::{json, Value};

fn root() -> bool {
    // SAFETY: no memory effects.
    let yes = unsafe { libc::geteuid() } == 0;
    if !yes {
        eprintln!("skipped: needs root (mount, unshare)");
    }
    yes
}

/// A mount made for one test, unmounted (lazily, in case an agent still has
/// files open there) when dropped.
struct Mount(PathBuf);

impl Mount {
    fn new(args: &[&str], at: &Path) -> Option<Mount> {
        let out = Command::new("mount").args(args).arg(at).output().ok()?;
        if !out.status.success() {
            eprintln!(
                "skipped: mount {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        Some(Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An agent as PID 1 of a new PID namespace (with its own /proc), as a
/// container's main process is. `pid` is its PID in this namespace.
fn agent_in_new_pid_ns() -> Option<(Agent, u32)> {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_sidelease-agent"));
    let mut a = Agent::spawn_cmd(cmd);
    let inner = a.call(json!({"cmd": "ping"}));
    assert_eq!(inner["pid"], 1, "PID 1 of its namespace: {inner}");
    // `unshare` forked the agent: its only child.
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", a.pid, a.pid)).ok()?;
    let pid = children.split_whitespace().next()?.parse().ok()?;
    Some((a, pid))
}

fn acquire(target: &str) -> Value {
    json!({"cmd": "acquire", "target": target})
}

fn holders(v: &Value) -> Value {
    v["holders"].clone()
}

#[test]
fn bind_mounted_directory_is_one_lease() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (d.path().join("a"), d.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let Some(_m) = Mount::new(&["--bind", a_dir.to_str().unwrap()], &b_dir) else {
        return;
    };
    let (via_a, via_b) = (
        a_dir.join("app.db").to_str().unwrap().to_owned(),
        b_dir.join("app.db").to_str().unwrap().to_owned(),
    );
    let (mut h, mut c) = (Agent::spawn(), Agent::spawn());
    // The guard alone: the holder does not watch, the file is deleted.
    let got = h.acquire_ok_with(json!({"cmd": "acquire", "target": via_a, "watch": false}));
    assert_eq!(c.inspect(&via_b)["state"], "held");
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    let e = c.acquire_err(acquire(&via_b), "in_use");
    assert_eq!(holders(&e), json!([h.pid]), "{e}");
    let i = c.inspect(&via_b);
    assert_eq!(i["state"], "split", "status through the other mount: {i}");
    assert_eq!(i["orphans"][0]["pid"], h.pid, "{i}");
    h.call(json!({"cmd": "release", "handle": got["handle"]}));
    // The holder's defence alone: it puts the file back, the kernel refuses.
    let got = h.acquire_ok(&via_a);
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let e = c.acquire_err(
        json!({"cmd": "acquire", "target": via_b, "split_guard": false}),
        "in_use",
    );
    assert_eq!(holders(&e), json!([h.pid]), "{e}");
}

#[test]
fn holder_in_a_child_pid_namespace_is_seen_and_guarded_from_outside() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db").to_str().unwrap().to_owned();
    let Some((mut inner, global)) = agent_in_new_pid_ns() else {
        eprintln!("skipped: unshare --pid failed");
        return;
    };
    let mut outer = Agent::spawn();
    let got = inner.acquire_ok_with(json!({"cmd": "acquire", "target": db, "watch": false}));
    assert_eq!(got["record"]["pid"], 1);
    let i = outer.inspect(&db);
    assert_eq!(i["state"], "held", "{i}");
    assert_eq!(i["holders"], json!([global]), "the kernel's PID here: {i}");
    assert_eq!(i["record_status"], "foreign", "another PID namespace: {i}");
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    let e = outer.acquire_err(acquire(&db), "in_use");
    assert_eq!(holders(&e), json!([global]), "{e}");
    assert_eq!(outer.inspect(&db)["state"], "split");
}

#[test]
fn holder_outside_is_not_free_to_a_child_pid_namespace_and_keeps_its_lease() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db").to_str().unwrap().to_owned();
    let mut outer = Agent::spawn();
    let Some((mut inner, _)) = agent_in_new_pid_ns() else {
        eprintln!("skipped: unshare --pid failed");
        return;
    };
    let got = outer.acquire_ok(&db);
    let i = inner.inspect(&db);
    assert_eq!(
        i["state"], "unknown",
        "a blind namespace must not say free: {i}"
    );
    inner.acquire_err(acquire(&db), "in_use");
    // Deleted: the holder puts it back, so the kernel refuses the
    // contender its guard cannot help (it sees no lock outside).
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    inner.acquire_err(acquire(&db), "in_use");
}

#[test]
fn a_blind_acquisition_does_not_disable_the_guard_for_the_next() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db").to_str().unwrap().to_owned();
    let mut outer = Agent::spawn();
    let Some((mut inner, _)) = agent_in_new_pid_ns() else {
        eprintln!("skipped: unshare --pid failed");
        return;
    };
    // The holder outside does not watch; its file is deleted; the guard
    // inside cannot see it, so the contender inside acquires (the limit
    // of a blind guard: the holder's watch is the defence there).
    let got = outer.acquire_ok_with(json!({"cmd": "acquire", "target": db, "watch": false}));
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    let blind = inner.acquire_ok(&db);
    assert_eq!(
        blind["record"]["split_checked"], false,
        "a blind check never vouches: {blind}"
    );
    inner.call(json!({"cmd": "release", "handle": blind["handle"]}));
    // The next contender, who can see, runs its guard and refuses.
    let mut third = Agent::spawn();
    let e = third.acquire_err(acquire(&db), "in_use");
    assert_eq!(holders(&e), json!([outer.pid]), "{e}");
    assert_eq!(third.inspect(&db)["state"], "split");
}

#[test]
fn contenders_in_two_child_namespaces_meet_the_kernel() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("app.db").to_str().unwrap().to_owned();
    let (Some((mut one, _)), Some((mut two, _))) = (agent_in_new_pid_ns(), agent_in_new_pid_ns())
    else {
        eprintln!("skipped: unshare --pid failed");
        return;
    };
    let got = one.acquire_ok(&db);
    two.acquire_err(acquire(&db), "in_use");
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    two.acquire_err(acquire(&db), "in_use");
    one.call(json!({"cmd": "release", "handle": got["handle"]}));
    two.acquire_ok(&db);
}

#[test]
fn overlay_with_layers_on_two_filesystems() {
    if !root() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (lower, upper, work, merged) = (
        d.path().join("lower"),
        d.path().join("upper"),
        d.path().join("work"),
        d.path().join("merged"),
    );
    for p in [&lower, &upper, &work, &merged] {
        std::fs::create_dir_all(p).unwrap();
    }
    let Some(_tmpfs) = Mount::new(&["-t", "tmpfs", "tmpfs"], &lower) else {
        return;
    };
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let Some(_ov) = Mount::new(&["-t", "overlay", "overlay", "-o", &opts], &merged) else {
        return;
    };
    let db = merged.join("app.db").to_str().unwrap().to_owned();
    let (mut h, mut c) = (Agent::spawn(), Agent::spawn());
    let got = h.acquire_ok_with(json!({"cmd": "acquire", "target": db, "watch": false}));
    let i = c.inspect(&db);
    assert_eq!(i["state"], "held", "{i}");
    assert_eq!(i["holders"], json!([h.pid]), "{i}");
    assert_eq!(i["record_status"], "live", "{i}");
    std::fs::remove_file(got["lease_path"].as_str().unwrap()).unwrap();
    let e = c.acquire_err(acquire(&db), "in_use");
    assert_eq!(
        holders(&e),
        json!([h.pid]),
        "the guard works on overlay: {e}"
    );
    assert_eq!(c.inspect(&db)["state"], "split");
}
