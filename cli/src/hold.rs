//! `sidelease hold TARGET -- CMD…`: acquire, run the command as a child,
//! forward SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, release when it exits and
//! exit with its status.

use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Args, ValueEnum};
use sidelease::{Error, Lease, Options, Wait};

use crate::{EXIT_CONFLICT, EXIT_ERROR};

#[derive(Args)]
pub struct HoldArgs {
    target: PathBuf,
    /// Seconds to wait for the lease (0: one attempt; "inf": forever).
    #[arg(short = 'w', long, default_value_t = 0.0)]
    timeout: f64,
    #[arg(long, default_value = sidelease::DEFAULT_SUFFIX)]
    suffix: String,
    /// A JSON object stored in the holder record.
    #[arg(long)]
    metadata: Option<String>,
    /// Exit status when the lease is held elsewhere.
    #[arg(short = 'E', long, default_value_t = EXIT_CONFLICT)]
    conflict_exit_code: u8,
    /// Keep the lease descriptor out of the command (by default the command
    /// inherits one, so the lease lives as long as the command even if
    /// `hold` itself is killed).
    #[arg(long)]
    no_inherit: bool,
    #[arg(long)]
    allow_unsupported_fs: bool,
    /// Skip the split-domain guard (saves one read of /proc/locks).
    #[arg(long)]
    no_split_guard: bool,
    /// Do not watch the lease file while holding it (no re-anchoring when
    /// someone deletes, moves or replaces it, no lost signal).
    #[arg(long)]
    no_watch: bool,
    /// What to do to the command if the lease is lost while held (its file
    /// replaced and another process holding the new one): send it SIGTERM
    /// (as PostgreSQL shuts down when its lock file is gone), SIGKILL, or
    /// nothing.
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// Print nothing on success.
    #[arg(short, long)]
    quiet: bool,
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLost {
    Term,
    Kill,
    Ignore,
}

fn options(a: &HoldArgs) -> Result<Options, Error> {
    let mut o = Options::new()
        .suffix(&a.suffix)
        .wait(Wait::from_secs_f64(a.timeout)?)
        .allow_unsupported_fs(a.allow_unsupported_fs)
        .split_guard(!a.no_split_guard)
        .watch(!a.no_watch)
        .runtime(format!("sidelease-cli {}", sidelease::VERSION));
    if let Some(m) = &a.metadata {
        o.metadata = Some(sidelease::record::parse_metadata(m)?);
    }
    Ok(o)
}

pub fn run(a: HoldArgs) -> ExitCode {
    let lease = match options(&a).and_then(|o| Lease::acquire(&a.target, &o)) {
        Ok(l) => l,
        Err(e @ (Error::InUse(_) | Error::Timeout(_))) => {
            eprintln!("sidelease: {e}");
            return ExitCode::from(a.conflict_exit_code);
        }
        Err(e) => {
            eprintln!("sidelease: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    if !a.quiet && lease.previous_released_cleanly() == Some(false) {
        eprintln!(
            "sidelease: the previous holder of {} did not release it cleanly",
            lease.target().display()
        );
    }
    let code = run_child(&a, &lease);
    if let Err(e) = lease.release() {
        eprintln!("sidelease: {e}");
    }
    code
}

fn run_child(a: &HoldArgs, lease: &Lease) -> ExitCode {
    let child = Arc::new(Mutex::new(Forward::default()));
    let forward = forward_signals(child.clone());
    let on_lost = a.on_lost;
    let lost_child = child.clone();
    let registered = lease.on_lost(move |lost| {
        eprintln!("sidelease: {lost}");
        match on_lost {
            OnLost::Term => child_slot(&lost_child).send(libc::SIGTERM),
            OnLost::Kill => child_slot(&lost_child).send(libc::SIGKILL),
            OnLost::Ignore => {}
        }
    });
    if let Err(e) = registered {
        eprintln!("sidelease: {e}");
        return ExitCode::from(EXIT_ERROR);
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..]);
    cmd.env("SIDELEASE_LEASE_PATH", lease.lease_path());
    // A PostgreSQL lease lives in this process's session: nothing to hand on.
    let inherited = if a.no_inherit || lease.is_postgres() {
        None
    } else {
        match lease.inheritable_fd() {
            Ok(fd) => {
                cmd.env("SIDELEASE_LEASE_FD", fd.as_raw_fd().to_string());
                Some(fd)
            }
            Err(e) => {
                eprintln!("sidelease: {e}");
                return ExitCode::from(EXIT_ERROR);
            }
        }
    };
    let spawned = cmd.spawn();
    drop(inherited); // the child has its copy now
    let mut spawned_child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sidelease: cannot run {:?}: {e}", a.command[0]);
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    child_slot(&child).started(spawned_child.id() as i32);
    let status = loop {
        match spawned_child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("sidelease: waiting for the command: {e}");
                return ExitCode::from(EXIT_ERROR);
            }
        }
    };
    child_slot(&child).pid = 0;
    if let Some(h) = forward {
        h.close();
    }
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
        _ => ExitCode::from(EXIT_ERROR),
    }
}

/// Where forwarded signals go: the command's PID once it runs, and a signal
/// that came before that, delivered as soon as it does.
#[derive(Default)]
struct Forward {
    pid: i32,
    pending: Option<i32>,
}

impl Forward {
    fn send(&mut self, sig: i32) {
        if self.pid > 0 {
            // SAFETY: kill has no memory effects; the PID is our child.
            unsafe { libc::kill(self.pid, sig) };
        } else {
            self.pending = Some(sig);
        }
    }

    fn started(&mut self, pid: i32) {
        self.pid = pid;
        if let Some(sig) = self.pending.take() {
            self.send(sig);
        }
    }
}

fn child_slot(f: &Mutex<Forward>) -> std::sync::MutexGuard<'_, Forward> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

/// Catch the signals a terminal or a supervisor sends and pass them on to
/// the command, so `hold` outlives it and releases after it.
fn forward_signals(child: Arc<Mutex<Forward>>) -> Option<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT]).ok()?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        for sig in signals.forever() {
            child_slot(&child).send(sig);
        }
    });
    Some(handle)
}
