//! Job control for `lead` (Ctrl-Z). The command runs in a process group of
//! its own, so that a loss can signal all of it; that puts it out of the
//! terminal's reach, and a SIGTSTP would stop `lead` alone and leave the
//! command working on, unwatched, past the moment a successor may start.
//! So `lead` catches SIGTSTP (and SIGTTIN, SIGTTOU), stops the command's
//! group, then itself (a command being started first: see
//! `child::once_started`). Once continued, it lets the command go on only if
//! the lease is still held, asked now (`ensure_held_now`: for PostgreSQL a
//! round trip to the server), and kills it otherwise.
//!
//! A SIGSTOP sent to `lead` alone cannot be caught: see docs/platforms.md.

use std::sync::{Arc, Mutex};

use sidelease::Lease;

use crate::child::{self, Forward};

/// The lease of the term in progress, if any (a handle of its own).
pub type Current = Arc<Mutex<Option<Lease>>>;

pub fn current(c: &Current) -> std::sync::MutexGuard<'_, Option<Lease>> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handle the stop signals on a thread of their own.
pub fn on_stop_signals(
    forward: Arc<Mutex<Forward>>,
    lease: Current,
) -> Option<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGTSTP, SIGTTIN, SIGTTOU};
    let mut signals = signal_hook::iterator::Signals::new([SIGTSTP, SIGTTIN, SIGTTOU]).ok()?;
    let handle = signals.handle();
    std::thread::spawn(move || loop {
        // Every stop signal that came since the last look is one stop.
        if signals.wait().count() == 0 {
            if signals.is_closed() {
                return;
            }
            continue;
        }
        {
            // Held until `lead` is continued: no command starts between
            // the look at the slot and the stop.
            let mut f = child::once_started(&forward);
            f.signal_running(libc::SIGSTOP);
            // SAFETY: raise(3) has no memory effects; SIGSTOP stops every
            // thread of this process until a SIGCONT.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        // A stop signal caught while this stop waited for a start is part
        // of it, as the kernel drops those pending at a SIGCONT.
        let _ = signals.pending().count();
        let verdict = current(&lease).as_ref().map(Lease::ensure_held_now);
        let mut f = child::slot(&forward);
        match verdict {
            Some(Ok(())) | None => f.signal_running(libc::SIGCONT),
            Some(Err(e)) => {
                eprintln!("sidelease: continued, but {e}: killing the command");
                f.signal_running(libc::SIGKILL);
                // A stopped process dies of SIGKILL as it is; continue
                // the rest of its group so nothing stays stopped.
                f.signal_running(libc::SIGCONT);
            }
        }
    });
    Some(handle)
}
