//! `sidelease lead`, run as real processes: one leader among campaigners,
//! succeeded at once when killed, never two at a time.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../core/tests/common/mod.rs"]
mod common;

const BIN: &str = env!("CARGO_BIN_EXE_sidelease");

/// A command for `lead` that proves it leads alone: it locks `crit` without
/// waiting, notes an overlap (and the commands running then) if it cannot,
/// then appends the PIDs of its `lead` and of itself to `leaders`. `crit` is
/// on descriptor 200, above the lease's: with it on 0 the next leader once
/// found it still locked by a killed leader that was already gone a moment
/// later (the microseconds in which an exiting process lets go of its
/// files one after another).
const LEADER: &str = r#"exec 200<>"$1"; flock -n 200 || { echo "overlap $PPID $$ $(date +%s.%N)" >> "$2"; ps -eo pid,ppid,stat,args | grep "^ *[0-9]* *[0-9]* *[A-Za-z+]* *sleep 600" >> "$2"; }; echo $PPID $$ >> "$3"; exec sleep 600"#;

/// The `lead` and the command of a line of `leaders`.
fn pids(line: &str) -> (u32, u32) {
    let mut it = line.split(' ').map(|p| p.parse().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// A `lead` process, killed if a failed assertion leaves it running.
struct Lead(Child);

impl Drop for Lead {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Lead {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

fn lead(dir: &Path, cmd: &[&str]) -> Lead {
    let db = dir.join("app.db");
    Lead(
        Command::new(BIN)
            .arg("lead")
            .arg(&db)
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

fn leader(dir: &Path) -> Lead {
    leader_of(dir, &dir.join("app.db").to_string_lossy())
}

/// A campaigner for `target` running `LEADER` with its files in `dir`.
fn leader_of(dir: &Path, target: &str) -> Lead {
    let p = |n: &str| dir.join(n).to_str().unwrap().to_owned();
    Lead(
        Command::new(BIN)
            .args(["lead", target, "--", "bash", "-c", LEADER, "bash"])
            .args([p("crit"), p("overlaps"), p("leaders")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Wait until `path` has more than `n` lines; the new ones.
fn more_lines(path: &Path, n: usize, bound: Duration) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        let l = lines(path);
        if l.len() > n {
            return l[n..].to_vec();
        }
        assert!(
            t0.elapsed() < bound,
            "no new line in {} after {bound:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn signal(c: &Lead, sig: i32) {
    // SAFETY: kill(2) on a PID this test started; no memory is shared.
    unsafe { libc::kill(c.id() as i32, sig) };
}

/// Wait until `c` has its signal handlers in place (a process signalled
/// before that simply dies, as any would).
fn catches_sigterm(c: &Lead) {
    let t0 = Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{}/status", c.id())).unwrap();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (libc::SIGTERM - 1)) != 0 {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} never caught SIGTERM",
            c.id()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn wait_bounded(child: &mut Lead, bound: Duration) -> std::process::ExitStatus {
    let child = &mut child.0;
    let deadline = Instant::now() + bound;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!(
                "process {} did not exit in {bound:?}; killed it",
                child.id()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What an ended `lead` wrote to stderr.
fn stderr_of(c: &mut Lead) -> String {
    let mut err = String::new();
    std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    err
}

/// Campaigners for `target`: the leader SIGKILLed `rounds` times in a row,
/// a new campaigner started each time. Checks one new leader per kill,
/// never the killed one, and no overlap; returns the campaigners left, the
/// current leader's `lead` PID and the failover times, sorted.
fn kill_leaders(
    dir: &Path,
    target: &str,
    campaigners: usize,
    rounds: usize,
    bound: Duration,
) -> (Vec<Lead>, u32, Vec<Duration>) {
    let leaders = dir.join("leaders");
    let mut crowd: Vec<Lead> = (0..campaigners).map(|_| leader_of(dir, target)).collect();
    let mut seen = more_lines(&leaders, 0, Duration::from_secs(20)).len();
    let mut failover = Vec::new();
    for round in 0..rounds {
        let now = pids(&lines(&leaders)[seen - 1]).0;
        let i = crowd
            .iter()
            .position(|c| c.id() == now)
            .expect("the leader is a campaigner");
        let mut killed = crowd.swap_remove(i);
        let t0 = Instant::now();
        signal(&killed, libc::SIGKILL);
        let new = more_lines(&leaders, seen, bound);
        failover.push(t0.elapsed());
        assert_eq!(new.len(), 1, "round {round}: one leader at a time: {new:?}");
        let next = pids(&new[0]).0;
        assert_ne!(next, now, "round {round}: a killed leader does not lead");
        assert!(
            crowd.iter().any(|c| c.id() == next),
            "round {round}: {next} campaigns"
        );
        seen += 1;
        let _ = killed.0.wait();
        crowd.push(leader_of(dir, target));
    }
    assert_eq!(
        lines(&dir.join("overlaps")),
        Vec::<String>::new(),
        "two commands led at once"
    );
    failover.sort();
    let now = pids(&lines(&leaders)[seen - 1]).0;
    (crowd, now, failover)
}

/// Stop every campaigner, the leader `now` last (stopped first, it would
/// step down and one of them be elected): the leader passes the signal to
/// its command and ends with its status, the others end at once with 0.
fn stop_all(mut crowd: Vec<Lead>, now: u32) -> Vec<String> {
    crowd.sort_by_key(|c| c.id() == now);
    let mut errs = Vec::new();
    for mut c in crowd {
        catches_sigterm(&c);
        signal(&c, libc::SIGTERM);
        let st = wait_bounded(&mut c, Duration::from_secs(10));
        let err = stderr_of(&mut c);
        if c.id() == now {
            assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{err}");
            assert!(err.contains("stopped: stepped down"), "{err}");
        } else {
            assert_eq!(st.code(), Some(0), "{err}");
            assert!(err.contains("stopped: not leading"), "{err}");
        }
        errs.push(err);
    }
    errs
}

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
    let out = Command::new(BIN).arg("status").arg(&db).output().unwrap();
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
    // Each successor waits out the bound (a crash looks like a terminate):
    // a short one keeps the test short.
    let name = common::unique("lead");
    let target = format!(
        "{}?lease={name}&confirm_within=300",
        common::env("SIDELEASE_TEST_PG")
    );
    let d = tempfile::tempdir().unwrap();
    let (crowd, now, failover) = kill_leaders(d.path(), &target, 3, 20, Duration::from_secs(10));
    assert!(
        failover[0] >= Duration::from_millis(300),
        "the bound was waited out: {failover:?}"
    );
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
        Command::new(BIN)
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
            "stepped down: the command exited after 0.0s; campaigning again in 0.1s",
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

/// `--on-lost term` escalates: a command that traps SIGTERM and keeps
/// working is SIGKILLed `--kill-after` seconds later, and `lead` says the
/// lease was lost at once, not once the command ended (issue 35).
#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let runs = dir.join("runs");
    let script =
        r#"trap 'echo TERM >> "$1"' TERM; echo "run $$" >> "$1"; while :; do sleep 0.02; done"#;
    let db = dir.join("app.db");
    let mut c = Lead(
        Command::new(BIN)
            .arg("lead")
            .arg(&db)
            .args(["--kill-after", "0.5", "--", "sh", "-c", script, "sh"])
            .arg(&runs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let first = more_lines(&runs, 0, Duration::from_secs(10));
    let pid: i32 = first[0].strip_prefix("run ").unwrap().parse().unwrap();
    let rival_path = dir.join("rival");
    let rival = std::fs::File::create(&rival_path).unwrap();
    assert_eq!(
        // SAFETY: flock(2) on a descriptor this test owns.
        unsafe { libc::flock(rival.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    std::fs::rename(&rival_path, dir.join("app.db.backend-lease")).unwrap();
    assert_eq!(more_lines(&runs, 1, Duration::from_secs(5)), ["TERM"]);
    let termed = Instant::now();
    let alive = || Path::new(&format!("/proc/{pid}")).exists();
    while alive() {
        assert!(
            termed.elapsed() < Duration::from_secs(5),
            "the command outlived SIGTERM by 5 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let lasted = termed.elapsed();
    assert!(
        lasted >= Duration::from_millis(400),
        "killed {lasted:?} after SIGTERM, before its grace"
    );
    // Not leading (the rival holds the file): a stop ends `lead`.
    std::thread::sleep(Duration::from_millis(100));
    signal(&c, libc::SIGTERM);
    assert_eq!(wait_bounded(&mut c, Duration::from_secs(5)).code(), Some(0));
    drop(rival);
    let err = stderr_of(&mut c);
    let lost_at = err
        .find("sidelease: the lease was lost (")
        .unwrap_or_else(|| panic!("{err}"));
    let killed_at = err
        .find("did not end within 0.5s of the signal: sending SIGKILL")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(lost_at < killed_at, "the loss is told first: {err}");
    assert!(err.contains("(SIGKILL after 0.5s)"), "{err}");
}

/// A command that daemonizes — a double fork, `setsid`, every descriptor
/// closed, the inherited lease descriptor too — and exits: the daemon is
/// ended before the term ends, so it never works beside the next term's
/// command (issue 35). `lead` is their subreaper; the portable platform
/// has none (docs/platforms.md).
#[test]
#[cfg_attr(
    feature = "portable",
    ignore = "portable platform: no subreaper, a daemon the command leaves is not found"
)]
fn a_daemon_the_command_leaves_behind_is_ended_with_its_term() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let daemons = dir.join("daemons");
    let script = r#"
        n=$(cat "$1" 2>/dev/null | wc -l)
        ( setsid bash -c 'exec 0<&- 1>&- 2>&-; eval "exec $SIDELEASE_LEASE_FD<&-"; echo $$ >> "$1"; while :; do sleep 0.05; done' bash "$1" & )
        while [ "$(cat "$1" 2>/dev/null | wc -l)" -le "$n" ]; do sleep 0.01; done
        exit 0"#;
    let mut c = lead(dir, &["sh", "-c", script, "sh", daemons.to_str().unwrap()]);
    let first = more_lines(&daemons, 0, Duration::from_secs(10));
    let pid: u32 = first[0].trim().parse().unwrap();
    let alive = |p: u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    };
    let t0 = Instant::now();
    while alive(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the daemon {pid} outlived its term by 5 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The next term's daemon starts only after the first one is gone.
    let second = more_lines(&daemons, 1, Duration::from_secs(10));
    let pid2: u32 = second[0].trim().parse().unwrap();
    signal(&c, libc::SIGTERM);
    wait_bounded(&mut c, Duration::from_secs(10));
    let t1 = Instant::now();
    while alive(pid2) {
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "{pid2} outlived lead"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = stderr_of(&mut c);
    // The daemon, and the `sleep` it was running, if it was: each term.
    let told = err
        .lines()
        .filter(|l| {
            l.strip_prefix("sidelease: ended ")
                .and_then(|r| r.strip_suffix(" process(es) the command left behind"))
                .is_some_and(|n| n == "1" || n == "2")
        })
        .count();
    assert!(told >= 2, "{err}");
}

/// The state letter of a process (`T` stopped, `Z` zombie), or None once
/// it is gone.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

fn await_state(pid: u32, want: &[Option<char>], what: &str) {
    let t0 = Instant::now();
    while !want.contains(&state_of(pid)) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            state_of(pid)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Ctrl-Z (SIGTSTP) stops the command with `lead` (it runs in a process
/// group of its own, out of the terminal's reach), and once `lead` is
/// continued the command goes on only if the lease is still held: lost in
/// the meantime, the command is killed, never continued (issue 35).
#[test]
fn a_stopped_lead_stops_its_command_and_continues_it_only_while_held() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ticks = dir.join("ticks");
    let script = r#"echo $$ > "$1.pid"; while :; do echo tick >> "$1"; sleep 0.01; done"#;
    let mut c = lead(dir, &["sh", "-c", script, "sh", ticks.to_str().unwrap()]);
    more_lines(&ticks, 0, Duration::from_secs(10));
    catches_sigterm(&c);
    let pid: u32 = std::fs::read_to_string(dir.join("ticks.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let frozen = |c: &Lead| {
        signal(c, libc::SIGTSTP);
        await_state(c.id(), &[Some('T')], "lead stopped");
        await_state(pid, &[Some('T')], "the command stopped with lead");
        let n = lines(&ticks).len();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            lines(&ticks).len(),
            n,
            "the command worked while lead was stopped"
        );
        n
    };
    // Held all along: continued with `lead`.
    let n = frozen(&c);
    signal(&c, libc::SIGCONT);
    more_lines(&ticks, n, Duration::from_secs(5));
    // Lost while stopped (a rival's file renamed over the lease file):
    // killed, never continued.
    let n = frozen(&c);
    let rival_path = dir.join("rival");
    let rival = std::fs::File::create(&rival_path).unwrap();
    assert_eq!(
        // SAFETY: flock(2) on a descriptor this test owns.
        unsafe { libc::flock(rival.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    std::fs::rename(&rival_path, dir.join("app.db.backend-lease")).unwrap();
    signal(&c, libc::SIGCONT);
    await_state(pid, &[None, Some('Z')], "the command was killed");
    assert_eq!(lines(&ticks).len(), n, "the command went on after the loss");
    // Not leading (the rival holds the file): a stop ends `lead`.
    std::thread::sleep(Duration::from_millis(100));
    signal(&c, libc::SIGTERM);
    assert_eq!(wait_bounded(&mut c, Duration::from_secs(5)).code(), Some(0));
    drop(rival);
    let err = stderr_of(&mut c);
    assert!(err.contains("continued, but "), "{err}");
}

#[test]
fn kill_after_must_be_seconds() {
    for bad in ["-1", "soon", "NaN", "1e9"] {
        let out = Command::new(BIN)
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
    let out = Command::new(BIN)
        .args(["lead", "--on-lost", "ignore"])
        .arg(d.path().join("app.db"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--on-lost ignore"),
        "{out:?}"
    );
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
        Command::new(BIN)
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
        Command::new(BIN)
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
