//! The command `hold` and `lead` run while holding a lease: started with
//! the lease's path (and, for a lease file, a descriptor of it) in its
//! environment, sent the signals its supervisor gets, and its exit status
//! passed on.

use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitCode, ExitStatus};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sidelease::Lease;

use crate::EXIT_ERROR;

/// How often an escalation looks whether the command ended.
const ESCALATION_TICK: Duration = Duration::from_millis(10);

/// Where forwarded signals go: the command's PID once it runs, and a signal
/// that came before that, delivered as soon as it does.
#[derive(Default)]
pub struct Forward {
    pid: i32,
    pending: Option<i32>,
    /// The command leads a process group of its own: signal all of it.
    group: bool,
    /// A command ended and the next was not armed for: a signal now (a
    /// loss told after the command ended) is for nobody.
    idle: bool,
    /// Which command this is (one more for each started): an escalation
    /// meant for one never reaches the next.
    run: u64,
    /// A command is being started: it may already run (from its exec on)
    /// while its PID is not known here yet.
    spawning: bool,
}

/// Told when a start ends (`Forward::spawning` back to false). Waited on
/// with `lead`'s one `Forward` only (`once_started`): a condition variable
/// may not serve two mutexes.
static SPAWN_ENDED: Condvar = Condvar::new();

impl Forward {
    pub fn send(&mut self, sig: i32) {
        if self.pid > 0 {
            let to = if self.group { -self.pid } else { self.pid };
            // SAFETY: kill has no memory effects; the PID is our child,
            // not yet reaped (see `wait`), or the group it leads.
            unsafe { libc::kill(to, sig) };
        } else if !self.idle {
            self.pending = Some(sig);
        }
    }

    /// Signal the command if one runs now; never kept for a later one.
    pub fn signal_running(&mut self, sig: i32) {
        if self.pid > 0 {
            self.send(sig);
        }
    }

    /// A new command is about to start: a signal from now on is for it.
    pub fn arm(&mut self) {
        self.idle = false;
    }

    pub fn started(&mut self, pid: i32) {
        self.pid = pid;
        self.run += 1;
        if let Some(sig) = self.pending.take() {
            self.send(sig);
        }
    }

    /// Send `sig` to the command, then SIGKILL after `grace` unless that
    /// very command ended by then (the `--on-lost term` escalation: a
    /// command that traps or ignores SIGTERM must not keep working for
    /// long beside the next holder's).
    pub fn send_then_kill(forward: &Arc<Mutex<Forward>>, sig: i32, grace: Duration) {
        let (run, signalled) = {
            let mut f = slot(forward);
            f.send(sig);
            // Running: this command; pending: the one about to start.
            let run = if f.pid > 0 { f.run } else { f.run + 1 };
            (run, f.pid > 0 || f.pending.is_some())
        };
        if !signalled {
            return;
        }
        let forward = forward.clone();
        std::thread::spawn(move || {
            let until = Instant::now() + grace;
            loop {
                {
                    let mut f = slot(&forward);
                    let running = f.run == run && f.pid > 0;
                    let to_come = f.run < run && f.pending.is_some();
                    if !running && !to_come {
                        return; // it ended, or never started
                    }
                    if running && Instant::now() >= until {
                        eprintln!(
                            "sidelease: the command did not end within {:.1}s of the signal: \
                             sending SIGKILL",
                            grace.as_secs_f64()
                        );
                        f.send(libc::SIGKILL);
                        return;
                    }
                }
                std::thread::sleep(ESCALATION_TICK.min(grace).max(Duration::from_millis(1)));
            }
        });
    }

    pub fn ended(&mut self) {
        self.pid = 0;
        self.pending = None;
        self.idle = true;
    }
}

pub fn slot(f: &Mutex<Forward>) -> MutexGuard<'_, Forward> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slot once no command is being started. A stop (Ctrl-Z) must wait
/// for the start to end: the command runs from its exec on, and the PID to
/// stop it by is known here only once `spawn` returns (a stop that came in
/// between stopped `lead` alone and left the command working on). A start
/// ends within an exec's time, failed or not; for a PostgreSQL lease once
/// the watchdog has the command's group too, which a running watchdog
/// answers at once (one stopped by someone holds the start, and `lead`,
/// until it runs again).
pub fn once_started(f: &Mutex<Forward>) -> MutexGuard<'_, Forward> {
    SPAWN_ENDED
        .wait_while(slot(f), |f| f.spawning)
        .unwrap_or_else(|e| e.into_inner())
}

/// Catch the signals a terminal or a supervisor sends and hand each to
/// `on_signal` (on a thread of its own), so the caller outlives the
/// command and releases after it.
pub fn on_signals(
    on_signal: impl Fn(i32) + Send + 'static,
) -> Option<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT]).ok()?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        for sig in signals.forever() {
            on_signal(sig);
        }
    });
    Some(handle)
}

/// How the command is started.
pub struct Spawn<'a> {
    pub command: &'a [String],
    /// Keep the lease's descriptor out of it (for a PostgreSQL lease, a
    /// copy of its session's socket).
    pub no_inherit: bool,
    /// Have the kernel end it when this process dies (where it can), and
    /// start it in a process group of its own, signalled as a whole.
    pub end_with_us: bool,
    /// Start it through a watchdog's gate (`watchdog::gate`).
    pub gate: Option<(i32, i32)>,
}

/// Start the command with the lease's path (and descriptor) in its
/// environment. On failure, the exit status to end with: 127 when the
/// command is not found, 126 when it cannot be run, 71 otherwise.
pub fn spawn(
    s: &Spawn<'_>,
    lease: &Lease,
    forward: &Arc<Mutex<Forward>>,
) -> Result<Child, ExitCode> {
    let mut cmd = std::process::Command::new(&s.command[0]);
    cmd.args(&s.command[1..]);
    cmd.env("SIDELEASE_LEASE_PATH", lease.lease_path());
    let inherited = if s.no_inherit {
        None
    } else {
        match lease.inheritable_fd() {
            // A session's socket is only kept open, never for the command
            // to use: it is not named.
            Ok(fd) if lease.is_postgres() => Some(fd),
            Ok(fd) => {
                cmd.env("SIDELEASE_LEASE_FD", fd.as_raw_fd().to_string());
                Some(fd)
            }
            Err(e) => {
                eprintln!("sidelease: {e}");
                return Err(ExitCode::from(EXIT_ERROR));
            }
        }
    };
    if s.end_with_us {
        cmd.process_group(0);
        slot(forward).group = true;
        let parent = std::process::id();
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || sidelease::platform::process::end_with_parent(parent).map(|_| ()));
        }
    }
    if let Some(fds) = s.gate {
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || crate::watchdog::gate(fds));
        }
    }
    slot(forward).spawning = true;
    let spawned = cmd.spawn();
    drop(inherited); // the child has its copy now
    test_hook_after_spawn();
    let mut f = slot(forward);
    f.spawning = false;
    if let Ok(c) = &spawned {
        f.started(c.id() as i32);
    }
    drop(f);
    SPAWN_ENDED.notify_all();
    match spawned {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("sidelease: cannot run {:?}: {e}", s.command[0]);
            Err(ExitCode::from(
                if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                },
            ))
        }
    }
}

/// Debug (test) builds only: with `SIDELEASE_TEST_SPAWN_PAUSE_MS` set, the
/// command runs that long before its PID is known here, so a test reaches
/// the moment a stop comes in between (cli/tests/containment.rs).
#[cfg(debug_assertions)]
fn test_hook_after_spawn() {
    let pause = std::env::var("SIDELEASE_TEST_SPAWN_PAUSE_MS").ok();
    if let Some(ms) = pause.and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
fn test_hook_after_spawn() {}

/// Wait for the command; its PID is forgotten once it ended, before it is
/// reaped, so a signal never reaches a process that took the PID over
/// (`ended` runs then too: `lead`'s watchdog is disarmed).
pub fn wait(
    child: &mut Child,
    forward: &Mutex<Forward>,
    ended: impl FnOnce(),
) -> Result<ExitStatus, ExitCode> {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value (plain C data).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid only fills `info`; WNOWAIT leaves the child
        // unreaped, so its PID stays ours until `child.wait()` below.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                child.id(),
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    slot(forward).ended();
    ended();
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("sidelease: waiting for the command: {e}");
                return Err(ExitCode::from(EXIT_ERROR));
            }
        }
    };
    Ok(status)
}

/// The command's status as ours: its code, or 128+N for a signal N.
pub fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
        _ => ExitCode::from(EXIT_ERROR),
    }
}

/// "exited with status 3", "was ended by signal 9".
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was ended by signal {sig}"),
        _ => "ended".into(),
    }
}
