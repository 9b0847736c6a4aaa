//! What the tests of `sidelease lead` share: `lead` processes, the files
//! their commands write, signals.
#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sidelease");

/// A command for `lead` that proves it leads alone: it locks `crit` without
/// waiting, notes an overlap (and the commands running then) if it cannot,
/// then appends the PIDs of its `lead` and of itself to `leaders`. `crit` is
/// on descriptor 200, above the lease's: with it on 0 the next leader once
/// found it still locked by a killed leader that was already gone a moment
/// later (the microseconds in which an exiting process lets go of its
/// files one after another).
pub const LEADER: &str = r#"exec 200<>"$1"; flock -n 200 || { echo "overlap $PPID $$ $(date +%s.%N)" >> "$2"; ps -eo pid,ppid,stat,args | grep "^ *[0-9]* *[0-9]* *[A-Za-z+]* *sleep 600" >> "$2"; }; echo $PPID $$ >> "$3"; exec sleep 600"#;

/// The `lead` and the command of a line of `leaders`.
pub fn pids(line: &str) -> (u32, u32) {
    let mut it = line.split(' ').map(|p| p.parse().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// A `lead` process, killed if a failed assertion leaves it running; what
/// it said so far is printed then, for the failure's story.
pub struct Lead(pub Child);

impl Drop for Lead {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        if let (true, Some(err)) = (std::thread::panicking(), self.0.stderr.as_mut()) {
            // What is there now: its command or its watchdog may still hold
            // the pipe open, and a read to the end would wait for them.
            let fd = std::os::fd::AsRawFd::as_raw_fd(err);
            // SAFETY: fcntl on the pipe this test reads.
            unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
            let mut said = Vec::new();
            let _ = std::io::Read::read_to_end(err, &mut said);
            eprintln!(
                "lead {} said:\n{}",
                self.0.id(),
                String::from_utf8_lossy(&said)
            );
        }
    }
}

impl Lead {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

pub fn lead(dir: &Path, cmd: &[&str]) -> Lead {
    let db = dir.join("app.db");
    Lead(
        crate::common::command(BIN)
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

pub fn leader(dir: &Path) -> Lead {
    leader_of(dir, &dir.join("app.db").to_string_lossy())
}

/// A campaigner for `target` running `LEADER` with its files in `dir`.
pub fn leader_of(dir: &Path, target: &str) -> Lead {
    let p = |n: &str| dir.join(n).to_str().unwrap().to_owned();
    Lead(
        crate::common::command(BIN)
            .args(["lead", target, "--", "bash", "-c", LEADER, "bash"])
            .args([p("crit"), p("overlaps"), p("leaders")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Wait until `path` has more than `n` lines; the new ones.
pub fn more_lines(path: &Path, n: usize, bound: Duration) -> Vec<String> {
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

pub fn signal(c: &Lead, sig: i32) {
    // SAFETY: kill(2) on a PID this test started; no memory is shared.
    unsafe { libc::kill(c.id() as i32, sig) };
}

/// Wait until `c` has its signal handlers in place (a process signalled
/// before that simply dies, as any would).
pub fn catches_sigterm(c: &Lead) {
    let t0 = Instant::now();
    if std::env::var_os("SIDELEASE_TEST_EMULATOR").is_some_and(|e| !e.is_empty()) {
        return has_spoken(c, t0);
    }
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

/// `catches_sigterm` under qemu-user, which catches every signal itself:
/// /proc's SigCgt tells nothing of `lead`'s handlers. `lead` has them in
/// place before it campaigns, and a campaign's first word (elected,
/// waiting) goes to stderr: wait until its pipe holds something, read
/// nothing (the test reads it whole at the end).
fn has_spoken(c: &Lead, t0: Instant) {
    use std::os::fd::AsRawFd;
    let fd =
        c.0.stderr
            .as_ref()
            .expect("lead's stderr is piped")
            .as_raw_fd();
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, ours; fd is the open read end of
        // the pipe this test made.
        assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) }, 0);
        if queued > 0 {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} wrote nothing to stderr within 10 s",
            c.id()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn wait_bounded(child: &mut Lead, bound: Duration) -> std::process::ExitStatus {
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
pub fn stderr_of(c: &mut Lead) -> String {
    let mut err = String::new();
    std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    err
}

/// Campaigners for `target`: the leader SIGKILLed `rounds` times in a row,
/// a new campaigner started each time. Checks one new leader per kill,
/// never the killed one, and no overlap; returns the campaigners left, the
/// current leader's `lead` PID and the failover times, sorted.
pub fn kill_leaders(
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
pub fn stop_all(mut crowd: Vec<Lead>, now: u32) -> Vec<String> {
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
