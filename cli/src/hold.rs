//! `sidelease hold TARGET -- CMD…`: acquire, run the command as a child,
//! forward SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, release when it exits and
//! exit with its status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use sidelease::{Error, Lease, Options, Pending, Wait};

use crate::child::{self, Forward};
use crate::progress::Progress;
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
    /// With `--on-lost term`: SIGKILL the command if it has not ended this
    /// many seconds after SIGTERM.
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = kill_after, allow_hyphen_values = true)]
    kill_after: Duration,
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

impl OnLost {
    /// Tell the command: SIGTERM then SIGKILL after `grace`, SIGKILL, or
    /// nothing.
    pub fn apply(self, child: &Arc<Mutex<Forward>>, grace: Duration) {
        match self {
            OnLost::Term => Forward::send_then_kill(child, libc::SIGTERM, grace),
            OnLost::Kill => child::slot(child).send(libc::SIGKILL),
            OnLost::Ignore => {}
        }
    }
}

/// `--kill-after`: seconds, zero or more (a fraction allowed).
pub fn kill_after(s: &str) -> Result<Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .filter(|d| *d <= Duration::from_secs(86_400))
        .ok_or_else(|| format!("{s:?} is not a number of seconds from 0 to 86400"))
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

/// Acquire; a wait tells who it waits for.
fn acquire(target: &std::path::Path, o: &Options) -> Result<Lease, Error> {
    if o.wait == Wait::NoWait {
        return Lease::acquire(target, o);
    }
    let mut progress = Progress::new();
    let got = Pending::new(target, o).and_then(|p| p.wait_reporting(None, |c| progress.waiting(c)));
    progress.done();
    got
}

pub fn run(a: HoldArgs) -> ExitCode {
    let lease = match options(&a).and_then(|o| acquire(&a.target, &o)) {
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
    let to_child = child.clone();
    let forward = child::on_signals(move |sig| child::slot(&to_child).send(sig));
    let (on_lost, grace) = (a.on_lost, a.kill_after);
    let lost_child = child.clone();
    let registered = lease.on_lost(move |lost| {
        eprintln!("sidelease: {lost}");
        on_lost.apply(&lost_child, grace);
    });
    if let Err(e) = registered {
        eprintln!("sidelease: {e}");
        return ExitCode::from(EXIT_ERROR);
    }
    let spawn = child::Spawn {
        command: &a.command,
        // A PostgreSQL lease lives in hold's session: it ends with hold.
        no_inherit: a.no_inherit || lease.is_postgres(),
        end_with_us: false,
        gate: None,
    };
    let status =
        child::spawn(&spawn, lease, &child).and_then(|mut c| child::wait(&mut c, &child, || {}));
    if let Some(h) = forward {
        h.close();
    }
    match status {
        Ok(s) => child::exit_code(s),
        Err(code) => code,
    }
}
