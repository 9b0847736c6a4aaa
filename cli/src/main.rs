//! `sidelease`: inspect a lease, or run a command while holding it (like
//! `flock(1)`).

mod hold;
mod status;

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
    about = "One exclusive lease per database, on one machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show who holds the lease of TARGET, from the kernel.
    ///
    /// Exit status: 0 free, 3 held, 4 split (a live process holds a deleted
    /// former lease file), 5 unknown, 71 error.
    Status {
        target: PathBuf,
        #[arg(long, default_value = sidelease::DEFAULT_SUFFIX)]
        suffix: String,
        /// Print the inspection as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command while holding the lease of TARGET.
    ///
    /// Exit status: the command's own (128+N if a signal N ended it); 75 (or
    /// --conflict-exit-code) if the lease is held elsewhere; 71 on any other
    /// sidelease error; 126/127 if the command cannot be run.
    Hold(hold::HoldArgs),
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
    }
}

/// Whether a target or lease path is a PostgreSQL URL.
pub(crate) fn is_postgres(p: &std::path::Path) -> bool {
    sidelease::pg::is_target(p)
}
