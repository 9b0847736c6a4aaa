//! A process that ends `lead`'s command when `lead` cannot: a lease with a
//! bound (PostgreSQL: lost once the server has not confirmed its session
//! within `confirm_within`) lets a successor start once that bound passed,
//! and a `lead` stopped by SIGSTOP — which cannot be caught — would leave
//! its command working past that moment. So `lead` feeds a watchdog, a
//! process of its own in a process group of its own (a SIGSTOP of `lead`'s
//! group does not reach it), until when the lease counts as held, on the
//! machine's boot clock. When the feed has gone quiet and that moment is
//! near, and `lead` is stopped (where the platform can tell: `/proc`), the
//! watchdog SIGKILLs the command's group. While `lead` runs, the watchdog
//! does nothing, fed or not (a busy machine delays a feed): a loss is
//! `lead`'s to handle (`--on-lost`, `--kill-after`), unless `lead` has fed
//! nothing for `--kill-after` past the bound (hung).
//!
//! The command tells the watchdog its process group itself, between fork
//! and exec, after the first deadline is in the pipe: a `lead` stopped at
//! any moment never leaves a command running that its watchdog does not
//! watch. The watchdog signals a group only while it is sure the group is
//! the command's: `lead` disarms it, and waits for its answer, after the
//! command ended and before it is reaped (until then its PID, and so the
//! group's ID, cannot be taken by another process).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sidelease::platform::clock::boot_ms;
use sidelease::platform::process::{self_exe, stopped};
use sidelease::Lease;

/// The name of the hidden subcommand the watchdog runs as.
pub const SUBCOMMAND: &str = "__watchdog";

/// How long `lead` waits for the watchdog to start, and for its answer to
/// a disarm, before it ends it itself (a watchdog someone stopped).
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// The message that disarms; one with [`GROUP`] set names the command's
/// process group; any other is a deadline (boot clock, milliseconds).
const DISARM: u64 = u64::MAX;
const GROUP: u64 = 1 << 63;

/// The timing for a lease whose bound is `bound`, in milliseconds: the
/// group is killed `margin` before the lease's deadline once the feed has
/// been quiet for `quiet` (less than the margin, so a `lead` frozen just
/// before the deadline is caught by it), and the feed writes every `every`
/// (well within `quiet`).
#[derive(Clone, Copy)]
struct Timing {
    margin: u64,
    quiet: u64,
    every: Duration,
}

impl Timing {
    fn of(bound: Duration) -> Timing {
        // A quarter of the bound, up to 250 ms: the kill must beat the bound
        // on a machine that runs late too. On the 2-core CI machines a busy
        // CPU delayed a 10 ms wake-up by up to 98 ms, and a 50 ms margin was
        // overrun there. A larger one costs a running `lead` nothing: it is
        // acted on only once the feed went quiet as well.
        let margin = (bound.as_millis() as u64 / 4).clamp(4, 250);
        Timing {
            margin,
            quiet: margin / 2,
            every: Duration::from_millis((margin / 8).max(1)),
        }
    }
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
    /// Start a watchdog, fed from `lease` by a thread of its own until
    /// disarmed (`grace`: `--kill-after`); the first deadline is in its pipe when this returns. `None`
    /// when the lease needs none (a lease file); `None`, said on stderr,
    /// when a watchdog cannot be had (the command then runs unwatched, as
    /// before there were watchdogs).
    pub fn start(lease: &Lease, grace: Duration) -> Option<Watchdog> {
        let bound = lease.held_for()?;
        let fail = |why: &dyn std::fmt::Display| -> Option<Watchdog> {
            eprintln!(
                "sidelease: no watchdog for this term ({why}): a stopped lead cannot end its command"
            );
            None
        };
        let held = match lease.try_clone() {
            Ok(h) => h,
            Err(e) => return fail(&e),
        };
        // The bound as it stands now: most of it (confirmations come four
        // times within it).
        let timing = Timing::of(bound);
        let mut cmd = Command::new(self_exe());
        cmd.arg(SUBCOMMAND)
            .arg(timing.quiet.to_string())
            .arg(grace.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // A group of its own: neither a SIGSTOP of `lead`'s group nor the
        // terminal's Ctrl-Z and Ctrl-C reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return fail(&e),
        };
        let end = |child: &mut Child, why: &str| {
            let _ = child.kill();
            let _ = child.wait();
            fail(&why)
        };
        let (Some(mut to), Some(mut from)) = (child.stdin.take(), child.stdout.take()) else {
            return end(&mut child, "no pipe");
        };
        // Ready, and its first deadline given before any command starts.
        let first = deadline(lease, timing);
        if answer(&mut from, ANSWER_WITHIN) != Some(b'r')
            || to.write_all(&first.to_le_bytes()).is_err()
        {
            return end(&mut child, "it did not start");
        }
        // Writes never block the feed (and with it a disarm): a watchdog
        // that stopped reading misses deadlines it would not act on anyway.
        set_nonblocking(to.as_raw_fd());
        let to = Arc::new(Mutex::new(Some(to)));
        let fed = to.clone();
        let feed = std::thread::spawn(move || loop {
            let d = deadline(&held, timing);
            let mut slot = fed.lock().unwrap_or_else(|e| e.into_inner());
            let Some(pipe) = slot.as_mut() else { return };
            let _ = pipe.write(&d.to_le_bytes());
            drop(slot);
            std::thread::sleep(timing.every);
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
                .is_some_and(|p| p.write(&DISARM.to_le_bytes()).is_ok_and(|n| n == 8));
            *slot = None; // the feed stops
            ok
        };
        // Its handle on the lease is dropped before the term steps down.
        let _ = feed.join();
        if !(said && answer(&mut from, ANSWER_WITHIN) == Some(b'd')) {
            let _ = child.kill(); // our child, not reaped: its PID
        }
        let _ = child.wait();
    }
}

/// Until when the lease counts as held, less the margin, on the boot clock.
fn deadline(lease: &Lease, timing: Timing) -> u64 {
    let left = lease.held_for().unwrap_or_default().as_millis() as u64;
    (boot_ms() + left).saturating_sub(timing.margin) & !GROUP
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// The byte the watchdog wrote within `within`, if it did.
fn answer(from: &mut ChildStdout, within: Duration) -> Option<u8> {
    let fd = from.as_raw_fd();
    let end = boot_ms() + within.as_millis() as u64;
    loop {
        let mut fds = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        let left = end.saturating_sub(boot_ms());
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, left as i32) };
        if r > 0 {
            let mut b = 0u8;
            // SAFETY: reads one byte into `b`.
            let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
            return (n == 1).then_some(b);
        }
        if r == 0 || boot_ms() >= end {
            return None;
        }
    }
}

/// In the command's process, between fork and exec (async-signal-safe
/// calls only): tell the watchdog our process group (we lead it: our PID)
/// and wait until it has it.
pub fn gate((to, from): (i32, i32)) -> std::io::Result<()> {
    let msg = (GROUP | std::process::id() as u64).to_le_bytes();
    let mut tries = 0;
    // SAFETY: write, poll and read on descriptors open in this process.
    unsafe {
        loop {
            if libc::write(to, msg.as_ptr().cast(), 8) == 8 {
                break;
            }
            // The pipe is full (non-blocking): wait for room, a while.
            tries += 1;
            let mut fds = [libc::pollfd {
                fd: to,
                events: libc::POLLOUT,
                revents: 0,
            }];
            if tries > 10 || libc::poll(fds.as_mut_ptr(), 1, 100) < 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EPIPE));
            }
        }
        let mut b = 0u8;
        if libc::read(from, (&mut b as *mut u8).cast(), 1) != 1 || b != b'g' {
            return Err(std::io::Error::from_raw_os_error(libc::EPIPE));
        }
    }
    Ok(())
}

/// The watchdog itself. `quiet`: half the margin the deadlines carry;
/// `grace`: `lead`'s `--kill-after` (both milliseconds). Once a deadline
/// passed, SIGKILLs the command's group if `lead` is stopped, looking every
/// few milliseconds; a `lead` that runs handles the loss itself, however
/// late its feed (a busy machine woke a thread up to 98 ms late here),
/// unless it has fed nothing for `grace` past the bound (hung). Where the
/// platform cannot tell a stopped process, a feed quiet for `quiet` past
/// the deadline counts as a stop. Answers a disarm and exits; exits when
/// `lead` is gone (the kernel ends the command with it).
pub fn run(quiet: &str, grace: &str) -> std::process::ExitCode {
    let ms = |name: &str, v: &str| {
        let n = v.parse::<u64>().ok();
        if n.is_none() {
            eprintln!("sidelease {SUBCOMMAND}: {name}: not a number of milliseconds: {v:?}");
        }
        n
    };
    let (Some(quiet), Some(grace)) = (ms("quiet", quiet), ms("grace", grace)) else {
        return std::process::ExitCode::from(2);
    };
    let lead = std::os::unix::process::parent_id();
    let say = |b: &[u8]| {
        let mut o = std::io::stdout();
        let _ = o.write_all(b).and_then(|()| o.flush());
    };
    say(b"r");
    let mut group: Option<i32> = None;
    let mut deadline: Option<u64> = None;
    let mut heard = boot_ms();
    let mut killed = false;
    let mut pending: Vec<u8> = Vec::with_capacity(16);
    // The margin before the bound that the deadlines carry (Timing::of).
    let margin = quiet.saturating_mul(2);
    // A running `lead` past its deadline is looked at this often: a stop
    // is caught within it, fed or not.
    let recheck = quiet.clamp(1, 5);
    loop {
        let now = boot_ms();
        let mut wake = None;
        if let (Some(g), Some(d), false) = (group, deadline, killed) {
            // From the bound on, as long again as `lead` gives its command
            // after a SIGTERM (at least the margin), counted from the last
            // feed if that is later: a running `lead` that fed nothing for
            // that long is hung.
            let hung = d
                .saturating_add(margin)
                .saturating_add(grace.max(margin))
                .max(heard.saturating_add(grace.max(margin)));
            let why = if now < d {
                wake = Some(d);
                None
            } else {
                match stopped(lead) {
                    Some(true) => Some("its lease's bound is near and it is stopped"),
                    Some(false) if now < hung => {
                        // Running: it handles the loss itself; look again
                        // (it may be stopped by then, or hung).
                        wake = Some(now + recheck.min(hung - now));
                        None
                    }
                    Some(false) => {
                        Some("its lease's bound passed and it runs, fed nothing since: hung?")
                    }
                    // Not to be told here: silence for `quiet` counts as
                    // a stop.
                    None if now < heard.saturating_add(quiet) => {
                        wake = Some(heard.saturating_add(quiet));
                        None
                    }
                    None => Some("its lease's bound is near: stopped?"),
                }
            };
            if let Some(why) = why {
                // SAFETY: kill has no memory effects; the group is the
                // command's until `lead` disarms us, which it does before
                // reaping it.
                unsafe { libc::kill(-g, libc::SIGKILL) };
                eprintln!(
                    "sidelease: watchdog: lead did not feed it ({why}): killed the command \
                     (process group {g})"
                );
                killed = true;
                continue;
            }
        }
        let timeout = wake.map_or(-1, |at| at.saturating_sub(now).min(i32::MAX as u64) as i32);
        let mut fds = [libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout) } <= 0 {
            continue; // the deadline, or EINTR: look again
        }
        let mut buf = [0u8; 512];
        // SAFETY: reads into `buf`, straight from the pipe (no buffer of
        // ours that poll would not see).
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return std::process::ExitCode::SUCCESS; // lead is gone
        }
        heard = boot_ms();
        pending.extend_from_slice(&buf[..n as usize]);
        while pending.len() >= 8 {
            let mut m = [0u8; 8];
            m.copy_from_slice(&pending[..8]);
            pending.drain(..8);
            let msg = u64::from_le_bytes(m);
            if msg == DISARM {
                say(b"d");
                return std::process::ExitCode::SUCCESS;
            } else if msg & GROUP != 0 {
                group = Some((msg & !GROUP) as i32);
                say(b"g");
            } else {
                deadline = Some(msg);
            }
        }
    }
}
