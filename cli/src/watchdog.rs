//! A process that ends `lead`'s command when `lead` cannot: a lease with a
//! bound (PostgreSQL: lost once the server has not confirmed its session
//! within `confirm_within`) lets a successor start once that bound passed,
//! and a `lead` stopped by SIGSTOP — which cannot be caught — would leave
//! its command working past that moment. So `lead` feeds a watchdog, a
//! process of its own in a process group of its own (a SIGSTOP of `lead`'s
//! group does not reach it), how much longer the lease counts as held; fed
//! nothing more by then, the watchdog SIGKILLs the command's group.
//!
//! The watchdog signals a process group only while it is sure the group is
//! the command's: `lead` disarms it, and waits for its answer, after the
//! command ended and before it is reaped (until then its PID, and so the
//! group's ID, cannot be taken by another process).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sidelease::Lease;

/// Ended this much before the lease's bound passes: what a SIGKILL takes
/// to land, and the feed's own delay, with room to spare.
pub const MARGIN: Duration = Duration::from_millis(50);

/// How long `lead` waits for the watchdog's answer to a disarm before it
/// ends the watchdog itself (a watchdog someone stopped).
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// The name of the hidden subcommand the watchdog runs as.
pub const SUBCOMMAND: &str = "__watchdog";

/// The message that disarms; one with [`GROUP`] set names the command's
/// process group; any other is milliseconds left.
const DISARM: u64 = u64::MAX;
const GROUP: u64 = 1 << 63;

/// In the command's process, between fork and exec (async-signal-safe
/// calls only): tell the watchdog our process group (we lead it: our PID)
/// and wait until it has it. A `lead` stopped at any moment thus never
/// leaves a command working that its watchdog does not know of.
pub fn gate((to, from): (i32, i32)) -> std::io::Result<()> {
    // SAFETY: getpid, write and read on descriptors open in this process.
    unsafe {
        let msg = (GROUP | libc::getpid() as u64).to_le_bytes();
        if libc::write(to, msg.as_ptr().cast(), 8) != 8 {
            return Err(std::io::Error::last_os_error());
        }
        let mut b = 0u8;
        if libc::read(from, (&mut b as *mut u8).cast(), 1) != 1 {
            return Err(std::io::Error::other("the watchdog did not answer"));
        }
    }
    Ok(())
}

/// `lead`'s end of a watchdog.
pub struct Watchdog {
    child: Child,
    to: Arc<Mutex<Option<ChildStdin>>>,
    from: ChildStdout,
    /// The feed, which keeps a handle on the lease until it ends.
    feed: std::thread::JoinHandle<()>,
}

impl Watchdog {
    /// Start a watchdog, fed from `lease` every quarter of the margin by a
    /// thread of its own until disarmed. `None` (said on stderr) when the
    /// lease needs none (a lease file) or the watchdog cannot be started.
    /// The command then starts through [`gate`].
    pub fn start(lease: &Lease) -> Option<Watchdog> {
        lease.held_for()?;
        let held = lease.try_clone().ok()?;
        let exe = std::env::current_exe().ok()?;
        let mut cmd = Command::new(exe);
        cmd.arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // A group of its own: neither a SIGSTOP of `lead`'s group nor the
        // terminal's Ctrl-Z and Ctrl-C reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("sidelease: cannot start the watchdog: {e}");
                return None;
            }
        };
        let to = Arc::new(Mutex::new(child.stdin.take()));
        let from = child.stdout.take()?;
        let fed = to.clone();
        let feed = std::thread::spawn(move || loop {
            let left = held.held_for().unwrap_or_default();
            let mut slot = fed.lock().unwrap_or_else(|e| e.into_inner());
            let Some(pipe) = slot.as_mut() else { return };
            let ms = left.saturating_sub(MARGIN).as_millis() as u64;
            if pipe.write_all(&ms.to_le_bytes()).is_err() {
                return;
            }
            drop(slot);
            std::thread::sleep(MARGIN / 4);
        });
        Some(Watchdog {
            child,
            to,
            from,
            feed,
        })
    }

    /// The descriptors the command's start goes through (see [`gate`]).
    pub fn gate_fds(&self) -> Option<(i32, i32)> {
        let to = self.to.lock().unwrap_or_else(|e| e.into_inner());
        Some((to.as_ref()?.as_raw_fd(), self.from.as_raw_fd()))
    }

    /// The command ended (and is not reaped yet): the watchdog signals
    /// nothing from now on. Returns once it said so, or was ended.
    pub fn disarm(self) {
        let Watchdog {
            mut child,
            to,
            mut from,
            feed,
        } = self;
        let said = {
            let mut slot = to.lock().unwrap_or_else(|e| e.into_inner());
            let ok = slot
                .as_mut()
                .is_some_and(|p| p.write_all(&DISARM.to_le_bytes()).is_ok());
            *slot = None; // the feed stops
            ok
        };
        // Its handle on the lease is dropped before the term steps down.
        let _ = feed.join();
        if !(said && answered(&mut from, ANSWER_WITHIN)) {
            let _ = child.kill(); // our child, not reaped: its PID
        }
        let _ = child.wait();
    }
}

/// Whether the watchdog wrote its answer within `within`.
fn answered(from: &mut ChildStdout, within: Duration) -> bool {
    let mut fds = [libc::pollfd {
        fd: from.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis() as i32) };
        if r > 0 {
            let mut b = [0u8; 1];
            return from.read(&mut b).is_ok_and(|n| n == 1);
        }
        if r == 0 || Instant::now() >= deadline {
            return false;
        }
    }
}

/// The watchdog itself: SIGKILL the command's group when a deadline
/// passes unfed or `lead` is gone (its end of the pipe closed); answer a
/// disarm and exit.
pub fn run() -> std::process::ExitCode {
    let mut group: Option<i32> = None;
    let mut deadline: Option<Instant> = None;
    let mut input = std::io::stdin().lock();
    let mut pending = Vec::with_capacity(8);
    let kill = |group: Option<i32>, why: &str| {
        let Some(g) = group.filter(|&g| g > 1) else {
            return;
        };
        // SAFETY: kill has no memory effects; the group is the command's
        // until `lead` disarms us, which it does before reaping it.
        unsafe { libc::kill(-g, libc::SIGKILL) };
        eprintln!("sidelease: watchdog: {why}: killed the command (process group {g})");
    };
    let mut killed = false;
    loop {
        let timeout = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).as_millis() as i32,
            None => -1,
        };
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout) };
        if r == 0 {
            if !killed {
                kill(
                    group,
                    "the leader did not confirm its lease in time (stopped, or its server silent)",
                );
                killed = group.is_some();
            }
            deadline = None;
            continue;
        }
        if r < 0 {
            continue; // EINTR
        }
        let mut buf = [0u8; 64];
        let n = match input.read(&mut buf) {
            Ok(0) | Err(_) => {
                kill(group, "the leader is gone");
                return std::process::ExitCode::SUCCESS;
            }
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while pending.len() >= 8 {
            let msg = u64::from_le_bytes(pending[..8].try_into().unwrap_or([0; 8]));
            pending.drain(..8);
            let out = |b: &[u8]| {
                let mut o = std::io::stdout();
                let _ = o.write_all(b).and_then(|()| o.flush());
            };
            if msg == DISARM {
                out(b"d");
                return std::process::ExitCode::SUCCESS;
            }
            if msg & GROUP != 0 {
                group = Some((msg & !GROUP) as i32);
                out(b"g");
                continue;
            }
            deadline = Some(Instant::now() + Duration::from_millis(msg));
        }
    }
}
