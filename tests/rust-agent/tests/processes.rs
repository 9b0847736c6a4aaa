//! The core's behaviour between real processes: the Open Duet cases, the
//! three arms of the pathname-replacement playbook, exec, fork, waiting and
//! inspect. Each test owns a temporary directory; the destructive cases
//! (unlink, rename over) touch only that directory.

mod common;

use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

use common::{is_alive, kill_pid, Agent};
use serde_json::json;

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }
}

fn acquire(target: &str) -> serde_json::Value {
    json!({"cmd": "acquire", "target": target})
}

/// The generation after the one `got` (an acquisition's answer) reports.
fn next(got: &serde_json::Value) -> serde_json::Value {
    json!(got["generation"].as_u64().unwrap() + 1)
}

#[test]
fn same_database_is_refused_naming_the_live_holder() {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let got = a.acquire_ok(&db);
    // A first lease file: the clock, and no record to say how the last
    // holder ended (issue 35).
    assert!(
        got["generation"].as_u64().unwrap() > 1_600_000_000_000_000,
        "{got}"
    );
    assert_eq!(got["previous_released_cleanly"], json!(null));
    let e = b.acquire_err(acquire(&db), "in_use");
    assert_eq!(e["holder"]["pid"], a.pid);
    assert_eq!(e["holder"]["runtime"], "rust");
    assert_eq!(e["holders"], json!([a.pid]));
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("is leased by pid {} (rust) on ", a.pid)) && msg.contains(" since "),
        "{msg}"
    );
}

#[test]
fn symlink_spelling_is_refused_and_another_database_is_free() {
    let d = Dir::new();
    let db = d.path("app.db");
    std::fs::write(&db, b"").unwrap();
    symlink(&db, d.path("alias.db")).unwrap();
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    a.acquire_ok(&db);
    let e = b.acquire_err(acquire(&d.path("alias.db")), "in_use");
    assert_eq!(e["holder"]["pid"], a.pid);
    let other = b.acquire_ok(&d.path("other.db"));
    assert!(other["lease_path"]
        .as_str()
        .unwrap()
        .ends_with("other.db.backend-lease"));
}

#[test]
fn corrupted_record_with_a_live_holder_is_still_refused() {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let got = a.acquire_ok(&db);
    let lp = got["lease_path"].as_str().unwrap();
    // Corrupt in place (same inode), as a stray writer would.
    std::fs::OpenOptions::new()
        .write(true)
        .open(lp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"\0\0garbage{{{"))
        .unwrap();
    let e = b.acquire_err(acquire(&db), "in_use");
    assert!(e["holder"].is_null(), "{e}");
    assert_eq!(e["holders"], json!([a.pid]));
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("record empty or unreadable"));
    let i = b.inspect(&db);
    assert_eq!(i["state"], "held");
    assert_eq!(i["record_status"], "unreadable");
}

fn killed_holder_is_replaced_at_once(sig: i32) {
    let d = Dir::new();
    let db = d.path("app.db");
    let mut a = Agent::spawn();
    let first = a.acquire_ok(&db);
    let st = a.signal(sig);
    assert!(!st.success());
    let mut b = Agent::spawn();
    assert_eq!(b.inspect(&db)["record_status"], "stale");
    let t = Instant::now();
    let got = b.acquire_ok(&db);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(got["previous_released_cleanly"], false);
    assert_eq!(got["previous"]["pid"], a.pid);
    assert_eq!(got["previous"]["nonce"], first["record"]["nonce"]);
    assert_eq!(
        got["generation"].as_u64(),
        first["generation"].as_u64().map(|g| g + 1)
    );
}

#[test]
fn sigterm_holder_is_replaced_and_reported_unclean() {
    killed_holder_is_replaced_at_once(libc::SIGTERM);
}

#[test]
fn sigkill_holder_is_replaced_and_reported_unclean() {
    killed_holder_is_replaced_at_once(libc::SIGKILL);
}

#[test]
fn same_process_shares_and_only_the_last_release_frees() {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let h1 = a.acquire_ok(&db);
    let h2 = a.acquire_ok(&db);
    assert_ne!(h1["handle"], h2["handle"]);
    assert_eq!(
        h1["record"]["nonce"], h2["record"]["nonce"],
        "one lease, two handles"
    );
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h1["handle"]}))["ok"],
        true
    );
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h1["handle"]}))["ok"],
        true,
        "idempotent"
    );
    b.acquire_err(acquire(&db), "in_use");
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h2["handle"]}))["ok"],
        true
    );
    let got = b.acquire_ok(&db);
    assert_eq!(got["previous_released_cleanly"], true);
    assert!(got["previous"]["released_at"].is_string());
    assert_eq!(b.inspect(&db)["record_status"], "self");
}

/// What operators, deploy tools and the playbook's arms do to a live lease
/// file: nothing ("stable"), unlink and recreate, rename another file over
/// it, rename a faithful copy over it, move it aside, delete it.
fn tamper(d: &Dir, lp: &str, mode: &str) {
    match mode {
        "unlink" => {
            std::fs::remove_file(lp).unwrap();
            std::fs::write(lp, b"").unwrap();
        }
        "replace" => {
            let tmp = d.path("replacement");
            std::fs::write(&tmp, b"{}").unwrap();
            std::fs::rename(&tmp, lp).unwrap();
        }
        "copy" => {
            // A faithful copy of the live record (as a deploy tool might
            // make) must not vouch for the new inode.
            let tmp = d.path("copy");
            std::fs::copy(lp, &tmp).unwrap();
            std::fs::rename(&tmp, lp).unwrap();
        }
        "move" => std::fs::rename(lp, format!("{lp}.old")).unwrap(),
        "delete" => std::fs::remove_file(lp).unwrap(),
        _ => {}
    }
}

/// The contender's defence alone: the holder does not watch its lease file,
/// so after the damage the path names a new file or none, and the
/// contender's split guard must refuse while the original holder lives.
fn guard_arm(mode: &str) {
    let d = Dir::new();
    let db = d.path("job.db");
    let (mut a, mut b, mut c) = (Agent::spawn(), Agent::spawn(), Agent::spawn());
    let h = a.acquire_ok_with(json!({"cmd": "acquire", "target": db, "watch": false}));
    let first_gen = h["generation"].as_u64().unwrap();
    let lp = h["lease_path"].as_str().unwrap().to_owned();
    tamper(&d, &lp, mode);
    let check = a.call(json!({"cmd": "check", "handle": h["handle"]}));
    let expect = match mode {
        "stable" => "held",
        "move" | "delete" => "unlinked",
        _ => "replaced",
    };
    assert_eq!(check["check"], expect, "{check}");
    let e = b.acquire_err(acquire(&db), "in_use");
    assert_eq!(e["holders"], json!([a.pid]), "{e}");
    assert_eq!(
        e["holder"]["pid"], a.pid,
        "the orphan's own record is reported: {e}"
    );
    let i = c.inspect(&db);
    if mode == "stable" {
        assert_eq!(i["state"], "held");
        assert_eq!(i["orphans"], json!([]));
    } else {
        assert_eq!(i["state"], "split", "{i}");
        assert_eq!(i["orphans"][0]["pid"], a.pid, "{i}");
        assert_eq!(i["holders"], json!([]), "nobody holds the new inode: {i}");
        assert_ne!(i["record_status"], "image-replaced", "{i}");
    }
    // Only after the original holder lets go may anyone hold the lease.
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h["handle"]}))["ok"],
        true
    );
    let got = b.acquire_ok(&db);
    let generation = got["generation"].as_u64().unwrap();
    match mode {
        // The record (or a faithful copy) names the holder's generation.
        "stable" | "copy" => assert_eq!(generation, first_gen + 1, "{got}"),
        // Bytes that name no generation: it jumps to the clock, past every
        // generation a counter from 1 could have reached, never 1 again.
        "replace" => {
            assert!(generation > 1_000_000_000_000_000, "{got}");
            assert_eq!(got["previous_released_cleanly"], false, "{got}");
        }
        // A file made again after a move or a delete: the clock, above the
        // holder's, never 1 again; no record says it was released.
        _ => {
            assert!(generation > first_gen, "{got}");
            assert_eq!(got["previous_released_cleanly"], json!(null), "{got}");
        }
    }
    c.acquire_err(acquire(&db), "in_use");
}

/// The holder's defence alone: the contender's guard is off, so only the
/// holder putting its lease file back (re-anchoring) can make the kernel
/// refuse it.
fn watch_arm(mode: &str) {
    let d = Dir::new();
    let db = d.path("job.db");
    let (mut a, mut b, mut c) = (Agent::spawn(), Agent::spawn(), Agent::spawn());
    let h = a.acquire_ok(&db);
    let lp = h["lease_path"].as_str().unwrap().to_owned();
    tamper(&d, &lp, mode);
    std::thread::sleep(Duration::from_millis(10));
    let e = b.acquire_err(
        json!({"cmd": "acquire", "target": db, "split_guard": false}),
        "in_use",
    );
    assert_eq!(e["holders"], json!([a.pid]), "the kernel refuses: {e}");
    let check = a.call(json!({"cmd": "check", "handle": h["handle"]}));
    assert_eq!(check["check"], "held", "put back: {check}");
    let state = a.call(json!({"cmd": "state", "handle": h["handle"]}));
    assert_eq!(state["state"], "held", "{state}");
    let i = c.inspect(&db);
    assert_eq!(
        i["state"], "held",
        "one holder of both files is no split: {i}"
    );
    assert_eq!(i["holders"], json!([a.pid]), "{i}");
    assert_eq!(i["record_status"], "live", "{i}");
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&lp).unwrap()).unwrap();
    assert_eq!(
        rec["nonce"], h["record"]["nonce"],
        "the holder's own record"
    );
    assert_eq!(
        rec["generation"], h["generation"],
        "its own generation, so the chain goes on"
    );
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h["handle"]}))["ok"],
        true
    );
    let got = b.acquire_ok(&db);
    assert_eq!(got["generation"], next(&h), "{got}");
    assert_eq!(got["previous_released_cleanly"], true, "{got}");
}

#[test]
fn stable_lease_file_keeps_one_domain() {
    guard_arm("stable");
}

#[test]
fn unlinked_live_lease_file_is_not_a_second_domain() {
    guard_arm("unlink");
    watch_arm("unlink");
}

#[test]
fn renamed_over_live_lease_file_is_not_a_second_domain() {
    guard_arm("replace");
    watch_arm("replace");
}

#[test]
fn copied_over_live_lease_file_is_not_a_second_domain() {
    guard_arm("copy");
    watch_arm("copy");
}

#[test]
fn lease_file_moved_aside_is_not_a_second_domain() {
    guard_arm("move");
    watch_arm("move");
}

#[test]
fn deleted_lease_file_is_not_a_second_domain() {
    guard_arm("delete");
    watch_arm("delete");
}

#[test]
fn split_guard_off_and_watch_off_let_the_second_domain_happen() {
    // The opt-outs do what they say, which is why they are on by default.
    let d = Dir::new();
    let db = d.path("job.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let h = a.acquire_ok_with(json!({"cmd": "acquire", "target": db, "watch": false}));
    std::fs::remove_file(h["lease_path"].as_str().unwrap()).unwrap();
    let got = b.call(json!({"cmd": "acquire", "target": db, "split_guard": false}));
    assert_eq!(got["ok"], true, "{got}");
}

#[test]
fn a_rival_that_wins_the_new_file_makes_the_lease_lost() {
    let d = Dir::new();
    let db = d.path("job.db");
    let mut a = Agent::spawn();
    let h = a.acquire_ok(&db);
    let lp = h["lease_path"].as_str().unwrap().to_owned();
    // The rival locks a file first, writes its own record there (as a
    // sidelease process that won it does), then renames it over the lease
    // file: it holds the file at the path, and the holder is told at once.
    let tmp = d.path("rival");
    let _rival = rival_holding(&tmp, &lp);
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 2}));
    assert_eq!(got["lost"], true, "{got}");
    assert!(got["elapsed_ms"].as_f64().unwrap() < 50.0, "{got}");
    let reason = got["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("pid {}", std::process::id())) && reason.contains("replaced"),
        "the reason names the other holder: {reason}"
    );
    // A new acquisition in the holder's process does not share a lost lease.
    let e = a.acquire_err(acquire(&db), "in_use");
    assert_eq!(e["holders"], json!([std::process::id()]), "{e}");
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h["handle"]}))["ok"],
        true
    );
}

/// A file locked by this test process with a record of its own in it, as
/// a sidelease holder's file would be, renamed over `lease_path`.
fn rival_holding(tmp: &str, lease_path: &str) -> std::fs::File {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let mut rival = std::fs::File::create(tmp).unwrap();
    rustix::fs::flock(&rival, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let m = rival.metadata().unwrap();
    let record = json!({"schema": 1, "generation": 7, "pid": std::process::id(),
        "nonce": "0123456789abcdef0123456789abcdef", "device": m.dev(), "inode": m.ino(),
        "runtime": "rival"});
    writeln!(rival, "{record}").unwrap();
    std::fs::rename(tmp, lease_path).unwrap();
    rival
}

#[test]
fn a_plain_flock_on_the_new_file_makes_the_lease_lost_once_it_stays() {
    // A process that is no sidelease holder (flock(1), say) locks a file and
    // renames it over the lease file: it writes no record, so the holder
    // gives it the time a refused contender's look would take, then calls
    // the lease lost, naming it.
    let d = Dir::new();
    let db = d.path("job.db");
    let mut a = Agent::spawn();
    let h = a.acquire_ok(&db);
    let lp = h["lease_path"].as_str().unwrap().to_owned();
    let tmp = d.path("rival");
    let rival = std::fs::File::create(&tmp).unwrap();
    rustix::fs::flock(&rival, rustix::fs::FlockOperation::LockExclusive).unwrap();
    // The 100 ms run from the rename, before `wait_lost` starts its clock.
    let renamed = Instant::now();
    std::fs::rename(&tmp, &lp).unwrap();
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 2}));
    let since = renamed.elapsed();
    assert_eq!(got["lost"], true, "{got}");
    let ms = got["elapsed_ms"].as_f64().unwrap();
    // Not before 100 ms; after it, 20 looks 1 ms apart, which a loaded
    // machine stretches (the shared-lock case below allows as long).
    assert!(
        since >= Duration::from_millis(100) && ms < 2000.0,
        "{got}, {since:?} after the rename"
    );
    let reason = got["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("pid {}", std::process::id())),
        "the reason names the other holder: {reason}"
    );
    drop(rival);
}

/// A file locked *shared* by this test process, renamed over `lease_path`:
/// what a contender's look (`unlocked_now`) is while it lasts, or `flock -s`.
fn share_locked_over(tmp: &str, lease_path: &str) -> std::fs::File {
    let f = std::fs::File::create(tmp).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared).unwrap();
    std::fs::rename(tmp, lease_path).unwrap();
    f
}

#[test]
fn a_shared_lock_on_the_new_file_is_waited_out_not_lost() {
    // A contender looks at the file at the path with a shared lock; stalled
    // there (a crowded machine deschedules it) it keeps that lock far longer
    // than the 100 ms a plain exclusive flock is given. A shared lock
    // excludes every exclusive one, so nobody holds the file: the holder
    // waits it out and puts its record back, and is never told it lost.
    let d = Dir::new();
    let db = d.path("job.db");
    let mut a = Agent::spawn();
    let h = a.acquire_ok(&db);
    let lp = h["lease_path"].as_str().unwrap().to_owned();
    let looker = share_locked_over(&d.path("looker"), &lp);
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 0.6}));
    assert_eq!(got["lost"], false, "a shared lock is nobody's hold: {got}");
    drop(looker);
    let t0 = std::time::Instant::now();
    loop {
        let rec: serde_json::Value = std::fs::read_to_string(&lp)
            .ok()
            .and_then(|t| serde_json::from_str(t.trim_end_matches(['\n', ' '])).ok())
            .unwrap_or(serde_json::Value::Null);
        if rec["pid"] == json!(a.pid) && rec["released_at"].is_null() {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(2),
            "the holder put its record back once the look ended: {rec}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = a.call(json!({"cmd": "state", "handle": h["handle"]}));
    assert_eq!(st["state"], "held", "{st}");
    let mut b = Agent::spawn();
    let e = b.acquire_err(acquire(&db), "in_use");
    assert_eq!(e["holders"], json!([a.pid]), "{e}");
}

#[test]
fn a_shared_lock_that_stays_on_the_new_file_is_lost_after_the_slow_recheck() {
    // Nothing to spin on for ever: a shared lock that does not end is a
    // lease file that cannot be put back, lost after the slow re-check.
    let d = Dir::new();
    let db = d.path("job.db");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sidelease-agent"));
    cmd.env("SIDELEASE_WATCH_RECHECK_MS", "400");
    let mut a = Agent::spawn_cmd(cmd);
    let h = a.acquire_ok(&db);
    let lp = h["lease_path"].as_str().unwrap().to_owned();
    // The re-check period runs from the moment the file is locked by
    // another, which is before `wait_lost` starts its own clock.
    let locked = Instant::now();
    let _reader = share_locked_over(&d.path("reader"), &lp);
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 5}));
    let since_locked = locked.elapsed();
    assert_eq!(got["lost"], true, "{got}");
    let ms = got["elapsed_ms"].as_f64().unwrap();
    assert!(
        since_locked >= Duration::from_millis(400) && ms < 3000.0,
        "lost after the re-check: {got}, {since_locked:?} after the file was locked"
    );
    let reason = got["reason"].as_str().unwrap();
    assert!(
        reason.contains("could not be put back") && reason.contains("stayed locked"),
        "{reason}"
    );
}

#[test]
fn a_lease_file_that_cannot_be_put_back_is_lost_after_the_slow_recheck() {
    let d = Dir::new();
    let sub = d.path("sub");
    std::fs::create_dir(&sub).unwrap();
    let db = format!("{sub}/job.db");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sidelease-agent"));
    cmd.env("SIDELEASE_WATCH_RECHECK_MS", "300");
    let mut a = Agent::spawn_cmd(cmd);
    let h = a.acquire_ok(&db);
    // The whole directory goes away: the file cannot be created again.
    std::fs::rename(&sub, d.path("sub.gone")).unwrap();
    std::fs::remove_file(format!("{}/job.db.backend-lease", d.path("sub.gone"))).unwrap();
    let got = a.call(json!({"cmd": "wait_lost", "handle": h["handle"], "timeout": 5}));
    assert_eq!(got["lost"], true, "{got}");
    let ms = got["elapsed_ms"].as_f64().unwrap();
    assert!(
        (250.0..3000.0).contains(&ms),
        "lost after the re-check period: {got}"
    );
    assert!(
        got["reason"]
            .as_str()
            .unwrap()
            .contains("could not be put back"),
        "{got}"
    );
}

#[test]
fn exec_with_the_lease_held_leaves_an_image_replaced_record() {
    let d = Dir::new();
    let db = d.path("app.db");
    let mut a = Agent::spawn();
    a.acquire_ok(&db);
    a.send(json!({"cmd": "exec_self"}));
    let ready = a.recv();
    assert_eq!(ready["event"], "ready");
    assert_eq!(ready["pid"], a.pid, "exec keeps the PID");
    assert_eq!(ready["execs"], 1);
    let i = a.inspect(&db);
    assert_eq!(i["state"], "free", "{i}");
    assert_eq!(i["record_status"], "image-replaced", "{i}");
    let mut b = Agent::spawn();
    assert_eq!(b.inspect(&db)["record_status"], "image-replaced");
    let got = a.acquire_ok(&db);
    assert_eq!(got["previous"]["pid"], a.pid);
    assert_eq!(got["previous_released_cleanly"], false);
    assert_eq!(a.inspect(&db)["record_status"], "self");
    assert_eq!(b.inspect(&db)["record_status"], "live");
}

#[test]
fn forked_child_does_not_keep_the_lease() {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let h = a.acquire_ok(&db);
    let child = a.call(json!({"cmd": "fork_child"}))["child"]
        .as_i64()
        .unwrap();
    assert!(is_alive(child));
    // The parent still holds it: the child closed its copy, never LOCK_UN.
    let e = b.acquire_err(acquire(&db), "in_use");
    assert_eq!(e["holders"], json!([a.pid]));
    assert_eq!(
        a.call(json!({"cmd": "release", "handle": h["handle"]}))["ok"],
        true
    );
    b.acquire_ok(&db);
    kill_pid(child);
}

#[test]
fn forked_child_does_not_outlive_a_killed_parent_lease() {
    let d = Dir::new();
    let db = d.path("app.db");
    let mut a = Agent::spawn();
    a.acquire_ok(&db);
    let child = a.call(json!({"cmd": "fork_child"}))["child"]
        .as_i64()
        .unwrap();
    a.signal(libc::SIGKILL);
    assert!(is_alive(child));
    let mut b = Agent::spawn();
    b.acquire_ok(&db);
    kill_pid(child);
}

#[test]
fn timeout_expires_while_held() {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    a.acquire_ok(&db);
    let t = Instant::now();
    let e = b.acquire_err(
        json!({"cmd": "acquire", "target": db, "timeout": 0.3}),
        "timeout",
    );
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(e["holder"]["pid"], a.pid);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("timed out after 0.3"),
        "{e}"
    );
}

fn waiter_wakes(kill: bool) {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let h = a.acquire_ok(&db);
    b.send(json!({"cmd": "acquire", "target": db, "timeout": 30}));
    // The waiter shows up in the kernel's view: it has the file open.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !waiting_on(b.pid, h["lease_path"].as_str().unwrap()) {
        assert!(
            Instant::now() < deadline,
            "waiter never opened the lease file"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    if kill {
        a.signal(libc::SIGKILL);
    } else {
        assert_eq!(
            a.call(json!({"cmd": "release", "handle": h["handle"]}))["ok"],
            true
        );
    }
    let got = b.recv();
    let took = t.elapsed();
    assert_eq!(got["ok"], true, "{got}");
    assert_eq!(got["previous_released_cleanly"], !kill);
    assert!(took < Duration::from_millis(500), "handoff took {took:?}");
}

fn waiting_on(pid: u32, lease_path: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_str() == Some(lease_path)))
        })
        .unwrap_or(false)
}

#[test]
fn waiter_acquires_promptly_after_release() {
    waiter_wakes(false);
}

#[test]
fn waiter_acquires_promptly_after_sigkill() {
    waiter_wakes(true);
}

#[test]
fn inspect_reports_free_held_released() {
    let d = Dir::new();
    let db = d.path("app.db");
    let (mut a, mut b) = (Agent::spawn(), Agent::spawn());
    let i = b.inspect(&db);
    assert_eq!(i["state"], "free");
    assert_eq!(i["record_status"], "empty");
    assert!(i["record"].is_null());
    assert!(
        !std::path::Path::new(&format!("{db}.backend-lease")).exists(),
        "inspect never creates the lease file"
    );
    let h = a.acquire_ok(&db);
    let i = b.inspect(&db);
    assert_eq!(i["state"], "held");
    assert_eq!(i["holders"], json!([a.pid]));
    assert_eq!(i["record_status"], "live");
    assert_eq!(i["record"]["pid"], a.pid);
    // Every lock on the filesystem is attributed. Other tests' processes
    // come and go meanwhile, and a lock whose process is exiting is listed
    // for a moment after its descriptors are gone: a lock that stays
    // unattributed is the failure, not one that passes.
    let mut unattributed = i["unattributed"].clone();
    for _ in 0..50 {
        if unattributed == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        unattributed = b.inspect(&db)["unattributed"].clone();
    }
    assert_eq!(unattributed, 0, "{i}");
    assert_eq!(a.inspect(&db)["record_status"], "self");
    a.call(json!({"cmd": "release", "handle": h["handle"]}));
    let i = b.inspect(&db);
    assert_eq!(i["state"], "free");
    assert_eq!(i["record_status"], "released");
}

#[test]
fn metadata_lands_in_the_record() {
    let d = Dir::new();
    let db = d.path("app.db");
    let mut a = Agent::spawn();
    let got = a.call(
        json!({"cmd": "acquire", "target": db, "metadata": {"app": "open-duet", "port": 8000}}),
    );
    assert_eq!(
        got["record"]["metadata"],
        json!({"app": "open-duet", "port": 8000})
    );
    let text = std::fs::read_to_string(format!("{db}.backend-lease")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "schema",
        "generation",
        "pid",
        "host",
        "started_at",
        "target",
        "lease_path",
        "nonce",
        "boot_id",
        "pid_ns",
        "proc_start",
        "runtime",
        "library",
        "metadata",
    ] {
        assert!(rec.get(key).is_some(), "record lacks {key}: {text}");
    }
    assert!(rec.get("released_at").is_none());
    assert_eq!(
        rec["library"],
        format!("sidelease {}", env!("CARGO_PKG_VERSION"))
    );
}

/// An agent running as `nobody`, for the permission cases (needs root, which
/// the CI machine has; elsewhere these tests say they were skipped). The
/// agent binary is copied to a directory `nobody` can reach: the checkout
/// may live where other users cannot (under /root, or in a `mktemp -d`).
fn nobody_agent() -> Option<Agent> {
    agent_as(65534)
}

/// An agent running as `uid` (with the group of the same number), when
/// this test runs as root.
fn agent_as(uid: u32) -> Option<Agent> {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: permission cases need root to start an agent as another user");
        return None;
    }
    let mut cmd = std::process::Command::new(common::reachable_agent());
    std::os::unix::process::CommandExt::uid(&mut cmd, uid);
    std::os::unix::process::CommandExt::gid(&mut cmd, uid);
    Some(Agent::spawn_cmd(cmd))
}

/// A lock `nobody` holds on `file` from a process of its own (one process,
/// ended by its PID on drop).
struct StrangersLock(std::process::Child);

impl StrangersLock {
    fn take(file: &str) -> StrangersLock {
        use std::io::BufRead;
        let code = "import fcntl,os,sys,time\n\
                    fd=os.open(sys.argv[1],os.O_RDONLY)\n\
                    fcntl.flock(fd,fcntl.LOCK_EX|fcntl.LOCK_NB)\n\
                    print('held',flush=True)\n\
                    time.sleep(600)\n";
        let mut cmd = std::process::Command::new("python3");
        cmd.args(["-c", code, file])
            .stdout(std::process::Stdio::piped());
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
        // Dropped (killed and waited for) on every path, panics included.
        let mut lock = StrangersLock(cmd.spawn().unwrap());
        let mut line = String::new();
        let out = lock.0.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "held", "nobody could not lock {file}");
        lock
    }
}

impl Drop for StrangersLock {
    fn drop(&mut self) {
        kill_pid(i64::from(self.0.id()));
        let _ = self.0.wait();
    }
}

fn open_dir() -> Dir {
    let d = Dir::new();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn unwritable_existing_lease_file_is_locked_read_only() {
    let d = open_dir();
    let db = d.path("app.db");
    let mut root = Agent::spawn();
    let h = root.acquire_ok(&db);
    root.call(json!({"cmd": "release", "handle": h["handle"]}));
    // Shared on purpose with a group, read-only: the lock still works.
    let lp = format!("{db}.backend-lease");
    std::os::unix::fs::chown(&lp, Some(0), Some(65534)).unwrap();
    set_mode(&lp, 0o640);
    let Some(mut a) = nobody_agent() else { return };
    let got = a.acquire_ok(&db);
    assert_eq!(got["record_written"], false, "{got}");
    // It writes nothing, so it has no fencing token and cannot know how
    // its predecessor ended: unknown, never a made-up answer.
    assert_eq!(got["generation"], json!(null), "{got}");
    assert_eq!(got["previous_released_cleanly"], json!(null), "{got}");
    let mut b = nobody_agent().unwrap();
    let e = b.acquire_err(acquire(&db), "in_use");
    assert_eq!(
        e["holders"],
        json!([a.pid]),
        "the kernel, not the stale record, names the holder"
    );
    // The message leads with the kernel's holder and says what the record
    // left in the file is: not the holder's (it wrote none).
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("is leased by pid {} (", a.pid))
            && msg.contains(&format!(
                "): the lease file's record is of pid {}",
                root.pid
            )),
        "{e}"
    );
    assert_eq!(e["holder"], json!(null), "{e}");
    let i = b.inspect(&db);
    assert_eq!(i["state"], "held");
    assert_eq!(i["holders"], json!([a.pid]));
    // A second read-only holder after a crash of the first says unknown
    // too (it cannot tell), never "released cleanly".
    a.signal(libc::SIGKILL);
    let got = b.acquire_ok(&db);
    assert_eq!(got["generation"], json!(null), "{got}");
    assert_eq!(got["previous_released_cleanly"], json!(null), "{got}");
}

fn set_mode(path: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// (mode bits, uid, gid) of a file.
fn access_of(path: &str) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.mode() & 0o777, m.uid(), m.gid())
}

/// A database file `name` in `d` with this owner, group and mode; returns
/// its path and its lease file's path.
fn database(d: &Dir, name: &str, owner: (u32, u32), mode: u32) -> (String, String) {
    let db = d.path(name);
    std::fs::write(&db, b"").unwrap();
    std::os::unix::fs::chown(&db, Some(owner.0), Some(owner.1)).unwrap();
    set_mode(&db, mode);
    let lp = format!("{db}.backend-lease");
    (db, lp)
}

/// A root agent running with this umask.
fn agent_with_umask(mask: libc::mode_t) -> Agent {
    let mut cmd = std::process::Command::new(common::reachable_agent());
    // SAFETY: umask is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            libc::umask(mask);
            Ok(())
        });
    }
    Agent::spawn_cmd(cmd)
}

fn umasked(mode: u32) -> u32 {
    // SAFETY: umask is read and restored at once; no file is created in
    // between by this thread.
    let mask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    };
    mode & !mask
}

#[test]
fn a_stranger_cannot_block_the_lease_of_a_database_only_its_owner_writes() {
    let d = open_dir();
    let (db, lp) = database(&d, "app.db", (0, 0), 0o644);
    let mut root = Agent::spawn();
    let h = root.acquire_ok(&db);
    assert_eq!(access_of(&lp), (umasked(0o600), 0, 0));
    let Some(mut stranger) = nobody_agent() else {
        return;
    };
    // Nothing to open, so no lock to take: refused as a permission error,
    // never as "in use" (and it holds nothing afterwards).
    let e = stranger.acquire_err(acquire(&db), "io");
    assert_eq!(e["errno"], libc::EACCES, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("app.db.backend-lease"),
        "{e}"
    );
    // What it can still see: held, from the kernel; the record unreadable.
    let i = stranger.inspect(&db);
    assert_eq!(i["state"], "held", "{i}");
    assert_eq!(i["holders"], json!([root.pid]), "{i}");
    assert_eq!(i["record"], json!(null), "{i}");
    root.call(json!({"cmd": "release", "handle": h["handle"]}));
    let e = stranger.acquire_err(acquire(&db), "io");
    assert_eq!(e["errno"], libc::EACCES, "{e}");
    let mut again = Agent::spawn();
    assert_eq!(again.acquire_ok(&db)["generation"], next(&h));
}

#[test]
fn a_group_writable_database_gets_a_lease_its_group_shares() {
    let d = open_dir();
    let (db, lp) = database(&d, "app.db", (0, 65534), 0o664);
    // A group that shares files runs with umask 002.
    let mut root = agent_with_umask(0o002);
    let h = root.acquire_ok(&db);
    assert_eq!(access_of(&lp), (0o660, 0, 65534));
    let Some(mut member) = nobody_agent() else {
        return;
    };
    let e = member.acquire_err(acquire(&db), "in_use");
    assert_eq!(e["holders"], json!([root.pid]), "{e}");
    root.call(json!({"cmd": "release", "handle": h["handle"]}));
    let got = member.acquire_ok(&db);
    assert_eq!(got["record_written"], true, "{got}");
    assert_eq!(got["generation"], next(&h), "{got}");
    root.acquire_err(acquire(&db), "in_use");
}

#[test]
fn a_lease_root_creates_for_another_users_database_belongs_to_that_user() {
    let d = open_dir();
    let (db, lp) = database(&d, "app.db", (65534, 65534), 0o644);
    let mut root = Agent::spawn();
    let h = root.acquire_ok(&db);
    assert_eq!(access_of(&lp), (umasked(0o600), 65534, 65534));
    // Deleted under the holder: the copy its watch puts back is made the
    // same way, owner and group included.
    std::fs::remove_file(&lp).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    // (Made, then given away: wait for both, not just for the name.)
    let want = (umasked(0o600), 65534, 65534);
    while !(std::fs::metadata(&lp).is_ok() && access_of(&lp) == want) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(access_of(&lp), want);
    root.call(json!({"cmd": "release", "handle": h["handle"]}));
    let Some(mut owner) = nobody_agent() else {
        return;
    };
    let got = owner.acquire_ok(&db);
    assert_eq!(got["record_written"], true, "{got}");
    assert_eq!(got["generation"], next(&h), "{got}");
}

#[test]
fn a_lease_file_planted_in_a_sticky_shared_directory_is_refused() {
    let d = open_dir();
    set_mode(d.dir.path().to_str().unwrap(), 0o1777); // like /tmp
    let db = d.path("app.db");
    let Some(mut stranger) = nobody_agent() else {
        return;
    };
    // The stranger makes the lease file before the service does.
    let h = stranger.acquire_ok(&db);
    let mut root = Agent::spawn();
    let e = root.acquire_err(acquire(&db), "io");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("app.db.backend-lease") && msg.contains("planted") && msg.contains("65534"),
        "{e}"
    );
    // Letting go changes nothing: the file is still the stranger's.
    stranger.call(json!({"cmd": "release", "handle": h["handle"]}));
    root.acquire_err(acquire(&db), "io");
    // Unless the database is the stranger's too: then the lease is theirs
    // to make, and anyone who may open it may take it.
    std::fs::write(&db, b"").unwrap();
    std::os::unix::fs::chown(&db, Some(65534), Some(65534)).unwrap();
    let mut again = Agent::spawn();
    again.acquire_ok(&db);
}

#[test]
fn a_strangers_file_with_a_copied_record_does_not_block_the_lease() {
    let d = open_dir();
    let (db, lp) = database(&d, "app.db", (0, 0), 0o644);
    // A file of nobody's own on the same filesystem, claiming to be a
    // former lease file of this lease, held by nobody.
    let fake = d.path("fake");
    let record = json!({"schema": 1, "lease_path": lp, "file_name": "app.db.backend-lease"});
    std::fs::write(&fake, record.to_string()).unwrap();
    std::os::unix::fs::chown(&fake, Some(65534), Some(65534)).unwrap();
    if nobody_agent().is_none() {
        return;
    }
    let _held = StrangersLock::take(&fake);
    // The first acquisition of a new lease file runs the split guard.
    let mut root = Agent::spawn();
    let got = root.acquire_ok(&db);
    assert!(
        got["generation"].as_u64().unwrap() > 1_600_000_000_000_000,
        "a first lease file: the clock: {got}"
    );
    let i = root.inspect(&db);
    assert_eq!(i["state"], "held", "{i}");
    assert_eq!(i["orphans"], json!([]), "{i}");
}

#[test]
fn a_second_name_for_a_lease_file_in_a_sticky_shared_directory_is_refused() {
    let d = open_dir();
    set_mode(d.dir.path().to_str().unwrap(), 0o1777);
    let (public, _) = database(&d, "pub.db", (0, 0), 0o666);
    // A lease file anyone may open (the database is anyone's to write).
    let mut root = agent_with_umask(0);
    let h = root.acquire_ok(&public);
    root.call(json!({"cmd": "release", "handle": h["handle"]}));
    let private = d.path("priv.db");
    std::fs::write(&private, b"").unwrap();
    set_mode(&private, 0o600);
    // A stranger gives it the private database's lease file name (as the
    // kernel's protected_hardlinks lets it: it may read and write the file).
    std::fs::hard_link(
        format!("{public}.backend-lease"),
        format!("{private}.backend-lease"),
    )
    .unwrap();
    let e = root.acquire_err(acquire(&private), "io");
    assert!(e["message"].as_str().unwrap().contains("hard links"), "{e}");
    // The public one is refused too while it has two names.
    root.acquire_err(acquire(&public), "io");
}

#[test]
fn a_fifo_at_the_lease_path_never_hangs_an_acquirer() {
    let d = open_dir();
    set_mode(d.dir.path().to_str().unwrap(), 0o1777);
    let db = d.path("f.db");
    let lp = format!("{db}.backend-lease");
    let c = std::ffi::CString::new(lp.clone()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o444) }, 0);
    std::os::unix::fs::chown(&lp, Some(65534), Some(65534)).unwrap();
    set_mode(&lp, 0o444);
    let Some(mut other) = agent_as(2001) else {
        return;
    };
    let started = Instant::now();
    let e = other.acquire_err(
        json!({"cmd": "acquire", "target": db, "timeout": 1.0}),
        "io",
    );
    assert!(started.elapsed() < Duration::from_secs(5), "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("f.db.backend-lease"),
        "{e}"
    );
}

#[test]
fn a_file_lease_on_the_lease_file_fails_the_open_at_once() {
    use std::os::fd::AsRawFd;
    let d = Dir::new();
    let db = d.path("app.db");
    let mut a = Agent::spawn();
    let h = a.acquire_ok(&db);
    a.call(json!({"cmd": "release", "handle": h["handle"]}));
    // A read lease (F_SETLEASE) makes any open for writing wait for the
    // lease-break time (45 s by default) unless it is non-blocking.
    let f = std::fs::File::open(format!("{db}.backend-lease")).unwrap();
    // The lease holder is told of a break by SIGIO, which would end this
    // test process.
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    // SAFETY: fcntl(2) on a descriptor this test owns.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    assert_eq!(r, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
    let started = Instant::now();
    let e = a.acquire_err(acquire(&db), "io");
    assert!(started.elapsed() < Duration::from_secs(5), "{e}");
    assert_eq!(e["errno"], libc::EWOULDBLOCK, "{e}");
    drop(f);
    // The lease ends with the last descriptor of its open file: a child
    // another test thread forked a moment ago may hold a copy until it
    // execs (the descriptor is close-on-exec).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = a.call(acquire(&db));
        if r["ok"] == true {
            break;
        }
        assert_eq!(r["error"]["errno"], libc::EWOULDBLOCK, "{r}");
        assert!(Instant::now() < deadline, "the lease never went away: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reader_that_cannot_attribute_a_lock_says_unknown_not_free() {
    let d = open_dir();
    let db = d.path("app.db");
    let mut root = Agent::spawn();
    root.acquire_ok_with(json!({"cmd": "acquire", "target": db, "watch": false}));
    let lp = format!("{db}.backend-lease");
    std::fs::remove_file(&lp).unwrap();
    std::fs::write(&lp, b"").unwrap();
    set_mode(&lp, 0o644);
    assert_eq!(Agent::spawn().inspect(&db)["state"], "split");
    let Some(mut reader) = nobody_agent() else {
        return;
    };
    let i = reader.inspect(&db);
    assert_eq!(i["state"], "unknown", "{i}");
    // At least root's former file (other tests' locks may count too).
    assert!(i["unattributed"].as_u64().unwrap() >= 1, "{i}");
}

#[test]
fn unwritable_directory_without_a_lease_file_is_permission_denied() {
    let d = open_dir();
    let db = d.path("app.db");
    let Some(mut a) = nobody_agent() else { return };
    let e = a.acquire_err(acquire(&db), "io");
    assert_eq!(e["errno"], libc::EACCES);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("app.db.backend-lease"),
        "{e}"
    );
}
