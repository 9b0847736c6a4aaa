//! Who a wait waits for, on stderr: a line when the wait starts and one
//! whenever the holder changes (as apt's "waiting for the lock held by
//! process 1234"). On a terminal the line is rewritten in place.

use std::io::{IsTerminal, Write};

use sidelease::Contention;

pub struct Progress {
    tty: bool,
    open: bool,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            open: false,
        }
    }

    pub fn waiting(&mut self, c: &Contention) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            // Back to the line's start, cleared: one line, kept current.
            let _ = write!(err, "\r\x1b[Ksidelease: waiting: {c}");
            self.open = true;
        } else {
            let _ = writeln!(err, "sidelease: waiting: {c}");
        }
        let _ = err.flush();
    }

    /// The wait ended: a terminal's line is finished before anything else
    /// is printed.
    pub fn done(&mut self) {
        if self.open {
            eprintln!();
            self.open = false;
        }
    }
}
