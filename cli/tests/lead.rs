//! `sidelease lead`, run as real processes: one leader among campaigners,
//! succeeded at once when killed, never two at a time.

use std::os::fd::AsRawFd;

use std::process::Stdio;
use std::time::{Duration, Instant};

#[path = "../../core/tests/common/mod.rs"]
mod common;
mod leading;

use leading::*;

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: a command is not ended with its lead (no PR_SET_PDEATHSIG); it keeps leading until it exits (docs/platforms.md)"
)]
fn a_killed_leader_is_succeeded_at_once_and_two_never_lead() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let db = dir.join("app.db");
    let (crowd, now, failover) =
        kill_leaders(dir, &db.to_string_lossy(), 4, 100, Duration::from_secs(5));
    eprintln!(
        "lead: failover after SIGKILL, 100 times: median {:?}, p99 {:?}",
        failover[50], failover[98]
    );
    stop_all(crowd, now);
    let out = common::command(BIN)
        .arg("status")
        .arg(&db)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "free once every lead stopped: {out:?}"
    );
}

#[test]
fn a_killed_leaders_command_leads_until_it_ends_never_beside_another() {
    // Where the command is not ended with its lead (the portable platform;
    // on Linux, a command that left lead's process tree would be the same):
    // it holds the lease's descriptor, so nobody else leads while it runs.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let leaders = dir.join("leaders");
    let mut crowd: Vec<Lead> = (0..2).map(|_| leader(dir)).collect();
    let first = more_lines(&leaders, 0, Duration::from_secs(10));
    let (lead_pid, cmd_pid) = pids(&first[0]);
    let i = crowd.iter().position(|c| c.id() == lead_pid).unwrap();
    let mut killed = crowd.swap_remove(i);
    let t0 = Instant::now();
    signal(&killed, libc::SIGKILL);
    let _ = killed.0.wait();
    if cfg!(feature = "portable") {
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            lines(&leaders).len(),
            1,
            "no leader beside the running command"
        );
        // SAFETY: kill(2) on the command this test's lead started.
        unsafe { libc::kill(cmd_pid as i32, libc::SIGKILL) };
    }
    let next = more_lines(&leaders, 1, Duration::from_secs(5));
    assert_eq!(pids(&next[0]).0, crowd[0].id(), "after {:?}", t0.elapsed());
    assert_eq!(
        lines(&dir.join("overlaps")),
        Vec::<String>::new(),
        "two led at once"
    );
    // Stopped, so its command ends too (killing it would leave the command
    // running where it is not ended with its lead).
    let mut last = crowd.pop().unwrap();
    catches_sigterm(&last);
    signal(&last, libc::SIGTERM);
    let st = wait_bounded(&mut last, Duration::from_secs(10));
    assert_eq!(st.code(), Some(128 + libc::SIGTERM));
}

#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: a command is not ended with its lead (no PR_SET_PDEATHSIG) (docs/platforms.md)"
)]
fn a_killed_leader_on_postgresql_is_succeeded_and_two_never_lead() {
    // The command holds a copy of the session's socket: the session ends
    // once both the killed lead and its command (ended with it) are gone,
    // and a campaigner waiting in pg_advisory_lock on a connection of its
    // own is granted the lock.
    // A killed leader on this host has provably ended: its successor does
    // not wait out its bound (issue 37). The portable platform cannot prove
    // it, and waits (a short bound keeps the test short).
    let name = common::unique("lead");
    let target = format!(
        "{}?lease={name}&confirm_within=300",
        common::env("SIDELEASE_TEST_PG")
    );
    let d = tempfile::tempdir().unwrap();
    let (crowd, now, failover) = kill_leaders(d.path(), &target, 3, 20, Duration::from_secs(10));
    if cfg!(feature = "portable") {
        assert!(
            failover[0] >= Duration::from_millis(300),
            "the bound was waited out: {failover:?}"
        );
    } else {
        assert!(
            failover[10] < Duration::from_millis(300),
            "no bound waited out after a SIGKILL: {failover:?}"
        );
    }
    eprintln!(
        "lead (PostgreSQL): failover after SIGKILL, 20 times: median {:?}, max {:?}",
        failover[10], failover[19]
    );
    for err in stop_all(crowd, now) {
        assert!(!err.contains("app-secret"), "no password on stderr: {err}");
    }
}

#[test]
fn a_terminated_postgresql_session_ends_the_command_and_the_leader_campaigns_again() {
    let name = common::unique("lead");
    let target = format!("{}?lease={name}", common::env("SIDELEASE_TEST_PG"));
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    let script =
        r#"trap 'echo TERM >> "$1"; exit 9' TERM; echo run >> "$1"; while :; do sleep 0.02; done"#;
    let mut c = Lead(
        common::command(BIN)
            .args(["lead", &target, "--", "sh", "-c", script, "sh"])
            .arg(&runs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    more_lines(&runs, 0, Duration::from_secs(20));
    let killed = common::psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name LIKE 'sidelease {}@%' AND application_name LIKE '%{name}'",
        c.id()
    ));
    assert_eq!(killed, "1", "the leader's session");
    assert_eq!(
        more_lines(&runs, 1, Duration::from_secs(5)),
        ["TERM"],
        "ended on loss"
    );
    assert_eq!(
        more_lines(&runs, 2, Duration::from_secs(10)),
        ["run"],
        "elected again"
    );
    catches_sigterm(&c);
    signal(&c, libc::SIGTERM);
    assert_eq!(
        wait_bounded(&mut c, Duration::from_secs(10)).code(),
        Some(9)
    );
    let err = stderr_of(&mut c);
    assert!(
        err.contains("sidelease: lost: ") && err.contains("administrator command"),
        "{err}"
    );
    assert_eq!(err.matches("elected: leading").count(), 2, "{err}");
    assert!(!err.contains("app-secret"), "no password on stderr: {err}");
}

/// The server frees the lock the moment the leader's session is ended and
/// grants a waiting campaigner at once, while the old leader learns of it
/// from its socket: the new term waits out the bound before its command
/// starts, so the old command is gone by then.
#[test]
fn a_terminated_leaders_command_is_gone_before_its_successor_starts() {
    let name = common::unique("lead");
    let target = format!(
        "{}?lease={name}&confirm_within=300",
        common::env("SIDELEASE_TEST_PG")
    );
    let d = tempfile::tempdir().unwrap();
    let leaders = d.path().join("leaders");
    let crowd: Vec<Lead> = (0..3).map(|_| leader_of(d.path(), &target)).collect();
    let mut seen = more_lines(&leaders, 0, Duration::from_secs(20)).len();
    for round in 0..4 {
        let now = pids(&lines(&leaders)[seen - 1]).0;
        let t0 = Instant::now();
        let ended = common::psql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name LIKE 'sidelease {now}@%' AND application_name LIKE '%{name}' \
             AND state IS NOT NULL"
        ));
        assert_eq!(ended, "1", "round {round}: the leader's session");
        let new = more_lines(&leaders, seen, Duration::from_secs(10));
        let took = t0.elapsed();
        assert_eq!(new.len(), 1, "round {round}: one leader at a time: {new:?}");
        assert!(
            took >= Duration::from_millis(300),
            "round {round}: the successor waited out the bound: {took:?}"
        );
        seen += 1;
    }
    assert_eq!(
        lines(&d.path().join("overlaps")),
        Vec::<String>::new(),
        "two commands led at once"
    );
    let now = pids(&lines(&leaders)[seen - 1]).0;
    for err in stop_all(crowd, now) {
        assert!(!err.contains("app-secret"), "no password on stderr: {err}");
    }
}

#[test]
fn a_command_that_ends_steps_down_and_campaigns_again_backing_off_after_failures() {
    // A term of 1 s or more that ends with 0 campaigns again at once; one
    // that fails, or returns at once (as `true`, or a command that
    // daemonizes), waits 0.1 s, 0.2 s, 0.4 s, ... first.
    for (script, watch_ms, at_least, at_most, says) in [
        (
            "sleep 1.05; exit 0",
            2600,
            2,
            3,
            "stepped down: the command exited; campaigning again\n",
        ),
        (
            "exit 0",
            1200,
            2,
            6,
            // (How long `sh` took to start and exit is the machine's: 0.0s
            // or, on a busy one, 0.1s.)
            "; campaigning again in 0.1s",
        ),
        (
            "exit 3",
            1200,
            2,
            6,
            "stepped down: the command exited with status 3; campaigning again in 0.1s",
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let runs = dir.join("runs");
        let script = format!(r#"echo run >> "$1"; {script}"#);
        let mut c = lead(dir, &["sh", "-c", &script, "sh", runs.to_str().unwrap()]);
        catches_sigterm(&c);
        std::thread::sleep(Duration::from_millis(watch_ms));
        signal(&c, libc::SIGTERM);
        wait_bounded(&mut c, Duration::from_secs(5));
        let n = lines(&runs).len();
        let err = stderr_of(&mut c);
        assert!(
            (at_least..=at_most).contains(&n),
            "{script}: {n} runs\n{err}"
        );
        assert!(err.contains(says), "{script}: {err}");
        if script.ends_with("exit 0") && !script.contains("sleep") {
            // The first term: a command that returned at once.
            let first = err.lines().find(|l| l.contains("stepped down"));
            assert!(
                first.is_some_and(|l| {
                    l.contains("stepped down: the command exited after 0.")
                        && l.ends_with("s; campaigning again in 0.1s")
                }),
                "{script}: {err}"
            );
        }
        if script.contains("exit 3") {
            assert!(
                err.contains("campaigning again in 0.4s"),
                "doubling back-off: {err}"
            );
        }
        if script.contains("sleep") {
            assert!(
                !err.contains("campaigning again in"),
                "no back-off after a term: {err}"
            );
        }
    }
}

#[test]
fn the_leaders_whole_process_group_is_told_and_nothing_pends_for_the_next_term() {
    // The command's children are signalled with it (it leads a process
    // group of its own); a loss told after the command ended is for
    // nobody, so the next term's command is not ended on arrival.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let runs = dir.join("runs");
    let script = r#"sh -c 'trap "echo CHILD-TERM >> \"$1\"; exit 0" TERM; echo child >> "$1"; while :; do sleep 0.02; done' sh "$1" &
echo run >> "$1"; wait"#;
    let mut c = lead(dir, &["sh", "-c", script, "sh", runs.to_str().unwrap()]);
    more_lines(&runs, 1, Duration::from_secs(10));
    catches_sigterm(&c);
    signal(&c, libc::SIGTERM);
    wait_bounded(&mut c, Duration::from_secs(10));
    // Told before `lead` exited; the grandchild's trap runs once its
    // `sleep 0.02` ends, which on a loaded machine can be after that.
    let t0 = Instant::now();
    let got = loop {
        let got = lines(&runs);
        if got.contains(&"CHILD-TERM".to_string()) || t0.elapsed() > Duration::from_secs(5) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        got.contains(&"CHILD-TERM".to_string()),
        "the grandchild was told: {got:?}"
    );
}

#[test]
fn a_lost_lease_ends_the_command_and_the_leader_campaigns_again() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let runs = dir.join("runs");
    let script =
        r#"trap 'echo TERM >> "$1"; exit 9' TERM; echo run >> "$1"; while :; do sleep 0.02; done"#;
    let mut c = lead(dir, &["sh", "-c", script, "sh", runs.to_str().unwrap()]);
    more_lines(&runs, 0, Duration::from_secs(10));
    // A plain flock(1)-style lock on a file renamed over the lease file.
    let rival_path = dir.join("rival");
    let rival = std::fs::File::create(&rival_path).unwrap();
    assert_eq!(
        // SAFETY: flock(2) on a descriptor this test owns.
        unsafe { libc::flock(rival.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    std::fs::rename(&rival_path, dir.join("app.db.backend-lease")).unwrap();
    assert_eq!(
        more_lines(&runs, 1, Duration::from_secs(5)),
        ["TERM"],
        "ended on loss"
    );
    // Campaigning again: the rival holds the file at the path now.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lines(&runs).len(),
        2,
        "no command runs while the rival holds it"
    );
    drop(rival);
    assert_eq!(
        more_lines(&runs, 2, Duration::from_secs(5)),
        ["run"],
        "elected again"
    );
    signal(&c, libc::SIGTERM);
    assert_eq!(wait_bounded(&mut c, Duration::from_secs(5)).code(), Some(9));
    let err = stderr_of(&mut c);
    assert!(
        err.contains("sidelease: lost: ") && err.contains("campaigning again"),
        "{err}"
    );
    assert_eq!(err.matches("elected: leading").count(), 2, "{err}");
}
#[test]
fn kill_after_must_be_seconds() {
    for bad in ["-1", "soon", "NaN", "1e9"] {
        let out = common::command(BIN)
            .args(["lead", "/tmp/x.db", "--kill-after", bad, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--kill-after"), "{bad}: {err}");
    }
}

#[test]
fn lead_refuses_to_ignore_a_loss() {
    let d = tempfile::tempdir().unwrap();
    let out = common::command(BIN)
        .args(["lead", "--on-lost", "ignore"])
        .arg(d.path().join("app.db"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'ignore' for '--on-lost <ON_LOST>'")
            && err.contains("[possible values: term, kill]"),
        "{err}"
    );
    // Its help offers only what it takes (issue 39: it offered `ignore`).
    let help = common::command(BIN)
        .args(["lead", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[possible values: term, kill]"), "{help}");
    assert!(!help.contains("ignore"), "{help}");
}

/// A wait for a PostgreSQL lease names its holder, from the holder's row,
/// within 1 s and once (the server grants a blocking waiter the lock
/// itself, so a change of holder during the wait is not seen).
#[test]
fn a_postgresql_wait_names_the_holder_once() {
    use std::io::{BufRead, BufReader};
    let name = common::unique("wait");
    let target = format!("{}?lease={name}", common::env("SIDELEASE_TEST_PG"));
    let mut first = Lead(
        common::command(BIN)
            .args(["hold", &target, "--", "sh", "-c", "echo READY; sleep 1.5"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut ready = String::new();
    BufReader::new(first.0.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "READY");
    let t0 = Instant::now();
    let mut waiter = Lead(
        common::command(BIN)
            .args(["hold", &target, "--timeout", "20", "--", "true"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let err = BufReader::new(waiter.0.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in err.lines() {
            let _ = tx.send((Instant::now(), line.unwrap()));
        }
    });
    let (at, line) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        at - t0 < Duration::from_secs(1),
        "within 1 s: {:?}",
        at - t0
    );
    assert!(
        line.starts_with("sidelease: waiting: ")
            && line.contains(&format!("is leased by pid {} (sidelease-cli", first.id())),
        "{line}"
    );
    assert!(!line.contains("app-secret"), "no password: {line}");
    assert_eq!(
        wait_bounded(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
    assert!(
        rx.try_iter()
            .all(|(_, l)| !l.starts_with("sidelease: waiting: ")),
        "once"
    );
}
