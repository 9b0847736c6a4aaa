//! `sidelease lead TARGET -- CMD…`: an elector for a singleton. Campaign
//! (wait for the lease, woken by its release), run the command while
//! leader, end it when the lease is lost, step down when it ends by itself,
//! and campaign again, until a signal stops it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
// The back-off and the shortest term that is not a failure are the core
// elector's: every runtime's elector backs off alike.
use sidelease::elector::{backoff, MIN_TERM};
use sidelease::{CancelToken, Error, Lease, Options, Pending, Wait};

use crate::child::{self, Forward};
use crate::hold::OnLost;
use crate::progress::Progress;
use crate::EXIT_ERROR;

#[derive(Args)]
pub struct LeadArgs {
    target: PathBuf,
    #[arg(long, default_value = sidelease::DEFAULT_SUFFIX)]
    suffix: String,
    /// A JSON object stored in the holder record.
    #[arg(long)]
    metadata: Option<String>,
    #[arg(long)]
    allow_unsupported_fs: bool,
    /// Skip the split-domain guard (saves one read of /proc/locks).
    #[arg(long)]
    no_split_guard: bool,
    /// What to send the command when the lease is lost: SIGTERM or SIGKILL.
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// What a signal to `lead` changes: a campaign is cancelled, a command is
/// sent the signal, and no new campaign starts.
struct Stop {
    token: CancelToken,
    stopped: AtomicBool,
    child: Arc<Mutex<Forward>>,
}

impl Stop {
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Sleep up to `d`, or until stopped.
    fn pause(&self, d: Duration) {
        let step = Duration::from_millis(20);
        let mut left = d;
        while !left.is_zero() && !self.stopped() {
            let s = left.min(step);
            std::thread::sleep(s);
            left -= s;
        }
    }
}

fn options(a: &LeadArgs) -> Result<Options, Error> {
    let mut o = Options::new()
        .suffix(&a.suffix)
        .wait(Wait::Forever)
        .allow_unsupported_fs(a.allow_unsupported_fs)
        .split_guard(!a.no_split_guard)
        .runtime(format!("sidelease-cli {} (lead)", sidelease::VERSION));
    if let Some(m) = &a.metadata {
        o.metadata = Some(sidelease::record::parse_metadata(m)?);
    }
    Ok(o)
}

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

pub fn run(a: LeadArgs) -> ExitCode {
    if a.on_lost == OnLost::Ignore {
        eprintln!(
            "sidelease: --on-lost ignore: a leader's command must end when the lease is lost \
             (term or kill)"
        );
        return ExitCode::from(2);
    }
    let opts = match options(&a) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sidelease: {e}");
            return ExitCode::from(2);
        }
    };
    let token = match CancelToken::new() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sidelease: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let stop = Arc::new(Stop {
        token,
        stopped: AtomicBool::new(false),
        child: Arc::new(Mutex::new(Forward::default())),
    });
    let on_signal = stop.clone();
    let signals = child::on_signals(move |sig| {
        on_signal.stopped.store(true, Ordering::SeqCst);
        on_signal.token.cancel();
        child::slot(&on_signal.child).send(sig);
    });
    let code = campaign(&a, &opts, &stop);
    if let Some(h) = signals {
        h.close();
    }
    code
}

/// Campaign, lead, step down, again: returns once stopped (0 when it was
/// not leading, the command's status when it was), or when the command
/// cannot be run at all.
fn campaign(a: &LeadArgs, opts: &Options, stop: &Stop) -> ExitCode {
    // A PostgreSQL target's password is never printed.
    let target = if crate::is_postgres(&a.target) {
        sidelease::pg::mask(&a.target.to_string_lossy())
    } else {
        a.target.display().to_string()
    };
    let mut errors = 0u32;
    loop {
        if stop.stopped() {
            eprintln!("sidelease: stopped: not leading {target}");
            return ExitCode::SUCCESS;
        }
        let mut progress = Progress::new();
        let waited = Pending::new(&a.target, opts)
            .and_then(|p| p.wait_reporting(Some(&stop.token), |c| progress.waiting(c)));
        progress.done();
        let lease = match waited {
            Ok(l) => l,
            Err(Error::Cancelled { .. }) => {
                eprintln!("sidelease: stopped: not leading {target}");
                return ExitCode::SUCCESS;
            }
            Err(e @ Error::InvalidArgument { .. }) => {
                eprintln!("sidelease: {e}");
                return ExitCode::from(2);
            }
            Err(e) => {
                errors += 1;
                let d = backoff(errors);
                eprintln!("sidelease: {e}; campaigning again in {}", seconds(d));
                stop.pause(d);
                continue;
            }
        };
        child::slot(&stop.child).arm();
        if stop.stopped() {
            // Stopped in the moment it was elected: nothing was started.
            drop(lease);
            eprintln!("sidelease: stopped: not leading {target}");
            return ExitCode::SUCCESS;
        }
        match lease.generation() {
            Some(g) => eprintln!("sidelease: elected: leading {target} (generation {g})"),
            None => eprintln!("sidelease: elected: leading {target}"),
        }
        let began = std::time::Instant::now();
        let led = lead(a, &lease, stop);
        if let Err(e) = lease.release() {
            eprintln!("sidelease: {e}");
        }
        let status = match led {
            Led::Ended(s, lost) => match lost {
                Some(reason) => {
                    eprintln!(
                        "sidelease: lost: {reason}; the command {}; campaigning again",
                        child::describe(s)
                    );
                    continue;
                }
                None => s,
            },
            Led::NotRun(code) => return code,
        };
        if stop.stopped() {
            eprintln!(
                "sidelease: stopped: stepped down, the command {}",
                child::describe(status)
            );
            return child::exit_code(status);
        }
        if status.success() && began.elapsed() >= MIN_TERM {
            errors = 0;
            eprintln!("sidelease: stepped down: the command exited; campaigning again");
        } else if status.success() {
            // A command that returns at once (or daemonizes and exits)
            // would otherwise be elected hundreds of times a second.
            errors += 1;
            let d = backoff(errors);
            eprintln!(
                "sidelease: stepped down: the command exited after {}; campaigning again in {}",
                seconds(began.elapsed()),
                seconds(d)
            );
            stop.pause(d);
        } else {
            errors += 1;
            let d = backoff(errors);
            eprintln!(
                "sidelease: stepped down: the command {}; campaigning again in {}",
                child::describe(status),
                seconds(d)
            );
            stop.pause(d);
        }
    }
}

enum Led {
    /// The command ended; the reason the lease was lost, if it was.
    Ended(std::process::ExitStatus, Option<String>),
    NotRun(ExitCode),
}

/// Run the command while `lease` is held: it holds the lease's descriptor
/// too — a PostgreSQL lease's session socket — so the lease outlives this
/// process until the command has ended (it never runs unleased), and it is
/// ended with this process, so a leader killed outright is succeeded at
/// once.
fn lead(a: &LeadArgs, lease: &Lease, stop: &Stop) -> Led {
    let lost: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let seen = lost.clone();
    let to_child = stop.child.clone();
    let on_lost = a.on_lost;
    let registered = lease.on_lost(move |l| {
        *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(l.reason.clone());
        on_lost.apply(&to_child);
    });
    if let Err(e) = registered {
        eprintln!("sidelease: {e}");
        return Led::NotRun(ExitCode::from(EXIT_ERROR));
    }
    let spawn = child::Spawn {
        command: &a.command,
        no_inherit: false,
        end_with_us: true,
    };
    let status =
        child::spawn(&spawn, lease, &stop.child).and_then(|mut c| child::wait(&mut c, &stop.child));
    match status {
        Ok(s) => {
            let why = lost.lock().unwrap_or_else(|e| e.into_inner()).take();
            Led::Ended(s, why)
        }
        Err(code) => Led::NotRun(code),
    }
}
