//! Keeping a command's descendants within reach (`sidelease lead`): as a
//! child subreaper, this process inherits every orphaned descendant, so a
//! command that daemonizes (a double fork, `setsid`, every descriptor
//! closed) is still found, and ended, when its term is over.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

/// Become the subreaper of this process's descendants. Whether it took.
pub fn become_subreaper() -> io::Result<bool> {
    // SAFETY: prctl with integer arguments touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

/// (parent, state) of a process, from `/proc/PID/stat`.
fn parent_and_state(pid: u32) -> Option<(u32, u8)> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold anything, ')' included: parse after the last.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    let mut f = rest.split(' ');
    let state = f.next()?.bytes().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((ppid, state))
}

/// The descendants of `root`, with whether each is a zombie.
fn descendants_of(root: u32) -> io::Result<Vec<(u32, bool)>> {
    let mut children: BTreeMap<u32, Vec<(u32, bool)>> = BTreeMap::new();
    for pid in super::process::all_pids()? {
        if let Some((ppid, state)) = parent_and_state(pid) {
            children.entry(ppid).or_default().push((pid, state == b'Z'));
        }
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &(c, zombie) in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push((c, zombie));
            next.push(c);
        }
    }
    Ok(out)
}

/// End every live descendant of this process: SIGTERM each, SIGKILL those
/// still running `grace` later, reaping those that are its children now,
/// until none is left or `grace` + `bound` has passed. Returns how many
/// there were; an error when they could not be listed, or some outlived
/// the bound.
pub fn end_descendants(grace: Duration, bound: Duration) -> io::Result<usize> {
    let me = std::process::id();
    let start = Instant::now();
    let (kill_at, until) = (start + grace, start + grace + bound);
    let mut termed = std::collections::BTreeSet::new();
    loop {
        let live: Vec<u32> = descendants_of(me)?
            .into_iter()
            .filter(|&(_, zombie)| !zombie)
            .map(|(p, _)| p)
            .collect();
        let now = Instant::now();
        for &p in &live {
            let sig = if now >= kill_at {
                libc::SIGKILL
            } else if termed.insert(p) {
                libc::SIGTERM
            } else {
                continue;
            };
            // SAFETY: kill has no memory effects. The PID is a descendant
            // listed a moment ago; one that exited since is reparented to
            // this process as a zombie and cannot be reused until reaped.
            unsafe { libc::kill(p as i32, sig) };
        }
        // Reap every child that has ended (orphans reparented to us).
        loop {
            // SAFETY: waitpid with a null status pointer writes nothing.
            let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            if r <= 0 {
                break;
            }
        }
        if live.is_empty() {
            return Ok(termed.len());
        }
        if now >= until {
            return Err(io::Error::other(format!(
                "{} processes the command left behind were still running {:.1}s after SIGKILL",
                live.len(),
                bound.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
