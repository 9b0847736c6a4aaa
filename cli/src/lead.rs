//! `sidelease lead TARGET -- CMD…`: an elector for a singleton. Campaign
//! (wait for the lease, woken by its release), run the command while
//! leader, end it when the lease is lost, step down when it ends by itself,
//! and campaign again, until a signal stops it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::Args;
// The core's elector, as every runtime's: the same campaign, fence and
// back-off.
use sidelease::elector::{backoff, Elector, Ended, Event, Outcome, Term, MIN_TERM};
use sidelease::platform::reaper;
use sidelease::{Error, Options};

use crate::child::{self, Forward};
use crate::hold::OnLost;
use crate::jobctl;
use crate::progress::Progress;
use crate::watchdog::Watchdog;
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
    // `hold`'s `ignore` is not offered: a leader's command must end.
    /// What to send the command when the lease is lost: SIGTERM or SIGKILL.
    #[arg(
        long,
        default_value = "term",
        value_parser = clap::builder::PossibleValuesParser::new(["term", "kill"])
            .map(|v| if v == "kill" { OnLost::Kill } else { OnLost::Term })
    )]
    on_lost: OnLost,
    /// With `--on-lost term`: SIGKILL the command's process group if the
    /// command has not ended this many seconds after SIGTERM.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "5",
        value_parser = crate::hold::kill_after,
        allow_hyphen_values = true
    )]
    kill_after: Duration,
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

fn options(a: &LeadArgs) -> Result<Options, Error> {
    let mut o = Options::new()
        .suffix(&a.suffix)
        .allow_unsupported_fs(a.allow_unsupported_fs)
        .split_guard(!a.no_split_guard)
        // The command gets a copy of the lease (a PostgreSQL lease's own
        // session's socket), so a killed lead's lock outlives it no longer
        // than its command.
        .inheritable(true)
        .runtime(format!("sidelease-cli {} (lead)", sidelease::VERSION));
    if let Some(m) = &a.metadata {
        o.metadata = Some(sidelease::record::parse_metadata(m)?);
    }
    Ok(o)
}

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn usage_or_error(e: &Error) -> ExitCode {
    eprintln!("sidelease: {e}");
    match e {
        Error::InvalidArgument { .. } => ExitCode::from(2),
        _ => ExitCode::from(EXIT_ERROR),
    }
}

pub fn run(a: LeadArgs) -> ExitCode {
    let elector = match options(&a).and_then(|o| Elector::new(&a.target, &o)) {
        Ok(e) => Arc::new(e),
        Err(e) => return usage_or_error(&e),
    };
    // Orphaned descendants of the command (a daemon it started) become
    // ours, so each term can end them all before the lease is let go.
    let reaping = reaper::become_subreaper().unwrap_or(false);
    let child = Arc::new(Mutex::new(Forward::default()));
    let lease: jobctl::Current = Arc::default();
    let stops = jobctl::on_stop_signals(child.clone(), lease.clone());
    tell(&elector, (a.on_lost, a.kill_after), &child);
    let (stopper, to_child) = (elector.clone(), child.clone());
    let signals = child::on_signals(move |sig| {
        stopper.stop();
        child::slot(&to_child).send(sig);
    });
    let ctl = Ctl {
        child,
        lease,
        reaping,
    };
    let code = campaign(&a, &elector, &ctl);
    for h in [signals, stops].into_iter().flatten() {
        h.close();
    }
    code
}

/// What the elector tells goes to stderr, and a loss to the command.
fn tell(elector: &Elector, (on_lost, grace): (OnLost, Duration), child: &Arc<Mutex<Forward>>) {
    let progress = Mutex::new(Progress::new());
    let target = elector.target();
    let child = child.clone();
    elector.on_event(move |e| {
        let mut progress = progress.lock().unwrap_or_else(|e| e.into_inner());
        match e {
            Event::Waiting(c) => return progress.waiting(c),
            Event::Lost { reason } => {
                // Said now, not once the command has ended: a command that
                // takes its time to stop leaves no doubt meanwhile.
                eprintln!(
                    "sidelease: the lease was lost ({reason}): ending the command \
                     (SIGKILL after {})",
                    match on_lost {
                        OnLost::Term => seconds(grace),
                        _ => "0.0s".into(),
                    }
                );
                return on_lost.apply(&child, grace);
            }
            _ => progress.done(),
        }
        match e {
            Event::Elected {
                generation: Some(g),
            } => eprintln!("sidelease: elected: leading {target} (generation {g})"),
            Event::Elected { generation: None } => {
                eprintln!("sidelease: elected: leading {target}")
            }
            Event::Error { error, retry_in } => {
                eprintln!(
                    "sidelease: {error}; campaigning again in {}",
                    seconds(*retry_in)
                )
            }
            _ => {}
        }
    });
}

/// Campaign, lead, step down, again: returns once stopped (0 when it was
/// not leading, the command's status when it was), or when the command
/// cannot be run at all.
/// What the terms of one `lead` share.
struct Ctl {
    child: Arc<Mutex<Forward>>,
    /// The lease of the term in progress, for the job control.
    lease: jobctl::Current,
    /// This process is its descendants' subreaper.
    reaping: bool,
}

fn campaign(a: &LeadArgs, elector: &Elector, ctl: &Ctl) -> ExitCode {
    let child = &ctl.child;
    let target = elector.target();
    let not_leading = || {
        eprintln!("sidelease: stopped: not leading {target}");
        ExitCode::SUCCESS
    };
    loop {
        let term = match elector.campaign() {
            Ok(Some(t)) => t,
            Ok(None) => return not_leading(),
            Err(e) => return usage_or_error(&e),
        };
        child::slot(child).arm();
        if term.cancelled() == Some(Ended::Stopped) {
            // Stopped in the moment it was elected: nothing was started.
            drop(term);
            return not_leading();
        }
        let status = match lead(a, &term, ctl) {
            Ok(s) => s,
            Err(code) => {
                term.step_down(Outcome::Failed("the command could not be run".into()));
                return code;
            }
        };
        let lasted = term.elapsed();
        let outcome = match status.success() {
            true => Outcome::Returned,
            false => Outcome::Failed(child::describe(status)),
        };
        let again = || seconds(backoff(elector.snapshot().failures));
        match term.step_down(outcome) {
            Ended::Lost(reason) => eprintln!(
                "sidelease: lost: {reason}; the command {}; campaigning again",
                child::describe(status)
            ),
            Ended::Stopped => {
                eprintln!(
                    "sidelease: stopped: stepped down, the command {}",
                    child::describe(status)
                );
                return child::exit_code(status);
            }
            Ended::Released if lasted >= MIN_TERM => {
                eprintln!("sidelease: stepped down: the command exited; campaigning again")
            }
            // A command that returns at once (or daemonizes and exits)
            // would otherwise be elected hundreds of times a second.
            Ended::Released => eprintln!(
                "sidelease: stepped down: the command exited after {}; campaigning again in {}",
                seconds(lasted),
                again()
            ),
            Ended::Failed(why) => eprintln!(
                "sidelease: stepped down: the command {why}; campaigning again in {}",
                again()
            ),
        }
    }
}

/// Run the command while the term lasts: it holds the lease's descriptor
/// too — a PostgreSQL lease's session socket — so the lease outlives this
/// process until the command has ended (it never runs unleased), and it is
/// ended with this process, so a leader killed outright is succeeded at
/// once. A loss signals it (the listener in `tell`). Once it ended, so does
/// every process it left behind (`reaping`: orphans come to us): SIGTERM,
/// SIGKILL after `--kill-after`, before the term ends: nothing of a term
/// works beside the next one.
fn lead(a: &LeadArgs, term: &Term, ctl: &Ctl) -> Result<std::process::ExitStatus, ExitCode> {
    // Before the command: it starts only once the watchdog knows it.
    let dog = Watchdog::start(term.lease(), a.kill_after);
    let spawn = child::Spawn {
        command: &a.command,
        no_inherit: false,
        end_with_us: true,
        gate: dog.as_ref().and_then(Watchdog::gate_fds),
    };
    *jobctl::current(&ctl.lease) = term.lease().try_clone().ok();
    let child = &ctl.child;
    let status = match child::spawn(&spawn, term.lease(), child) {
        Ok(mut c) => child::wait(&mut c, child, move || dog.map_or((), Watchdog::disarm)),
        Err(code) => {
            if let Some(d) = dog {
                d.disarm();
            }
            Err(code)
        }
    };
    // The term's own handle is the one stepped down.
    if let Some(l) = jobctl::current(&ctl.lease).take() {
        let _ = l.release();
    }
    if ctl.reaping {
        match reaper::end_descendants(a.kill_after, LEFT_BEHIND_BOUND) {
            Ok(0) => {}
            Ok(n) => eprintln!("sidelease: ended {n} process(es) the command left behind"),
            Err(e) => eprintln!("sidelease: {e}"),
        }
    }
    status
}

/// How long the processes a command left behind may take to die once
/// SIGKILLed (a process in uninterruptible sleep dies when it wakes).
const LEFT_BEHIND_BOUND: Duration = Duration::from_secs(5);
