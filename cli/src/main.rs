//! `sidelease`: inspect a lease, or run a command while holding it (like
//! `flock(1)`).

mod child;
mod hold;
mod jobctl;
mod lead;
mod progress;
mod status;
mod watchdog;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit status of `hold` when the lease is held by someone else (or the wait
/// timed out), unless `--conflict-exit-code` says otherwise: EX_TEMPFAIL.
pub const EXIT_CONFLICT: u8 = 75;
/// Exit status for any other sidelease failure: EX_OSERR.
pub const EXIT_ERROR: u8 = 71;

#[derive(Parser)]
#[command(
    name = "sidelease",
    version,
    about = "One exclusive lease per database: a kernel lock on a sidecar file on one machine, \
             a PostgreSQL advisory lock across hosts",
    long_about = "One exclusive lease per database: a kernel lock on a sidecar file \
                  (TARGET.backend-lease) on one machine, or a PostgreSQL session advisory \
                  lock across hosts when TARGET is postgresql://[user[:password]@]host[:port]/\
                  database?lease=NAME. The same lease as the Rust, C, Python, Node and Bun \
                  libraries take."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show who holds the lease of TARGET: from the kernel for a file (a
    /// database path), from pg_locks and pg_stat_activity for a
    /// postgresql://…?lease=NAME target.
    ///
    /// Exit status: 0 free, 3 held, 4 split (a live process holds a deleted
    /// former lease file), 5 unknown, 66 free but no such file and no lease
    /// file (a mistyped path?), 71 error.
    Status {
        target: PathBuf,
        #[arg(long, default_value = sidelease::DEFAULT_SUFFIX)]
        suffix: String,
        /// Print the inspection as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command while holding the lease of TARGET (a database path, or
    /// a postgresql://…?lease=NAME target, held while hold itself runs).
    ///
    /// Exit status: the command's own (128+N if a signal N ended it); 75 (or
    /// --conflict-exit-code) if the lease is held elsewhere; 71 on any other
    /// sidelease error; 126/127 if the command cannot be run.
    Hold(hold::HoldArgs),
    /// Elect one leader among every `lead` of TARGET: campaign for the
    /// lease (woken by its release), run the command while leader, end it
    /// (SIGTERM, or --on-lost kill) when the lease is lost, step down when
    /// it exits, and campaign again, until a signal stops it. The command
    /// holds the lease too and, on Linux, dies with `lead`.
    ///
    /// Exit status: 0 when stopped while not leading; the command's own
    /// (128+N for a signal N) when stopped while leading; 126/127 if the
    /// command cannot be run; 2 for bad arguments.
    Lead(lead::LeadArgs),
    /// `lead`'s watchdog over its command's process group (internal).
    #[command(name = "__watchdog", hide = true)]
    Watchdog { quiet: String, grace: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Status {
            target,
            suffix,
            json,
        } => status::run(&target, &suffix, json),
        Command::Hold(args) => hold::run(args),
        Command::Lead(args) => lead::run(args),
        Command::Watchdog { quiet, grace } => watchdog::run(&quiet, &grace),
    }
}

/// Whether a target or lease path is a PostgreSQL URL.
pub(crate) fn is_postgres(p: &std::path::Path) -> bool {
    sidelease::pg::is_target(p)
}
