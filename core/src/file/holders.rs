//! Who holds a lease file, from the kernel: the PIDs whose descriptors own
//! the flock lock on the inode the lease path names.

use std::os::fd::BorrowedFd;

use crate::error::Contention;
use crate::platform::locks::{self, FlockLock};
use crate::platform::process::{self, FdScan, KernelKey};
use crate::record::Record;

/// PIDs whose descriptors own the lock `key`. `/proc/locks` names the
/// process that took the lock, which may have exited while a forked child
/// (or a command it started) keeps the descriptor; fdinfo `lock:` lines tell
/// who really holds it, so a listed PID is checked and, when it does not
/// hold the lock, every visible process is.
pub(crate) fn kernel_holders(key: KernelKey, locks: &[FlockLock]) -> Vec<u32> {
    kernel_view(key, locks).0
}

/// [`kernel_holders`], and the PIDs `/proc/locks` names as having taken the
/// lock that hold no descriptor of it now: the lock passed on from them (a
/// command they started, a child they forked, a descriptor they sent) —
/// the kernel's own account of an inherited lease, not a guess.
fn kernel_view(key: KernelKey, locks: &[FlockLock]) -> (Vec<u32>, Vec<u32>) {
    let mut listed: Vec<u32> = locks
        .iter()
        .filter(|l| l.ino == key.ino && l.on_device(key.major, key.minor))
        .map(|l| l.pid)
        .collect();
    listed.sort_unstable();
    listed.dedup();
    let mut holders = Vec::new();
    let mut unverified = false;
    let mut gone = Vec::new();
    for &pid in &listed {
        match process::holding_fd(pid, key) {
            FdScan::Found(_) | FdScan::Denied => holders.push(pid),
            FdScan::NotFound => unverified = true,
            FdScan::Gone => {
                unverified = true;
                gone.push(pid);
            }
        }
    }
    if unverified {
        for pid in process::all_pids().unwrap_or_default() {
            if !listed.contains(&pid) && matches!(process::holding_fd(pid, key), FdScan::Found(_)) {
                holders.push(pid);
            }
        }
        if holders.is_empty() {
            // Held by something this user cannot see: report what the
            // kernel lists rather than nothing, but never a process that
            // has ended (a listing read across changes may still carry a
            // lock let go since).
            holders = listed
                .iter()
                .copied()
                .filter(|p| !gone.contains(p))
                .collect();
        }
    }
    holders.sort_unstable();
    let takers = if holders.is_empty() {
        Vec::new()
    } else {
        listed
            .into_iter()
            .filter(|p| !holders.contains(p))
            .collect()
    };
    (holders, takers)
}

/// The holders of the lease file open (unlocked) as `fd`, for an in-use
/// answer. When the record names a process whose descriptors show it owns
/// the lock, that is the kernel's answer without reading `/proc/locks`
/// (whose read can cost an RCU grace period) or the mount table.
pub(crate) fn holders_of(fd: BorrowedFd<'_>, record_pid: Option<u32>) -> Vec<u32> {
    holders_and_takers_of(fd, record_pid).0
}

/// [`holders_of`], and the takers of the lock that no longer hold it (see
/// [`kernel_view`]; none when the record's process holds it).
pub(crate) fn holders_and_takers_of(
    fd: BorrowedFd<'_>,
    record_pid: Option<u32>,
) -> (Vec<u32>, Vec<u32>) {
    let Ok(st) = crate::platform::stat::fstat(fd) else {
        return (Vec::new(), Vec::new());
    };
    if let Some(pid) = record_pid {
        if matches!(
            process::holding_fd_of_file(pid, (st.st_dev, st.st_ino)),
            FdScan::Found(_)
        ) {
            return (vec![pid], Vec::new());
        }
    }
    let Ok((major, minor)) = process::kernel_device(fd) else {
        return (Vec::new(), Vec::new());
    };
    match locks::flock_locks_on(major, minor) {
        Ok(l) => kernel_view(
            KernelKey {
                major,
                minor,
                ino: st.st_ino,
            },
            &l,
        ),
        Err(_) => (Vec::new(), Vec::new()),
    }
}

/// Fills an in-use answer's holders from the lease file open as `fd` and
/// its record `rec`: the record names the process that holds the lock, or
/// it is a record left behind (released, its process gone) while something
/// else holds the lock, perhaps inherited from the record's process: then
/// it is no holder of ours, and the kernel's holders are named.
pub(crate) fn describe(c: &mut Contention, fd: BorrowedFd<'_>, rec: Option<Record>) {
    let takers;
    (c.holders, takers) = holders_and_takers_of(fd, rec.as_ref().and_then(|r| r.pid));
    if let Some(r) = rec {
        match record_is_holder(&r, &c.holders, &takers) {
            Ok(()) => c.holder = Some(r),
            Err(Note::Record(what)) => c.record_note = Some(what),
            Err(Note::Inherited(how)) => c.inherited = Some(how),
        }
    }
    if c.holder.is_none() {
        c.names = c
            .holders
            .iter()
            .filter_map(|&pid| process::name(pid).map(|n| (pid, n)))
            .collect();
    }
}

/// Who has the file open as `fd` locked now, by the kernel's table of
/// locks.
pub(crate) enum Lockers {
    /// These PIDs hold it exclusively.
    Exclusive(Vec<u32>),
    /// Only shared locks are listed (a contender's look: `unlocked_now`),
    /// so at that instant nothing held it exclusively.
    Shared,
    /// Nothing listed: let go in between, or held by a process this
    /// namespace cannot see, or no table of locks here.
    Unseen,
}

pub(crate) fn lockers(fd: BorrowedFd<'_>) -> Lockers {
    let Ok(st) = crate::platform::stat::fstat(fd) else {
        return Lockers::Unseen;
    };
    let Ok((major, minor)) = process::kernel_device(fd) else {
        return Lockers::Unseen;
    };
    let Ok(table) = locks::flock_locks_on(major, minor) else {
        return Lockers::Unseen;
    };
    let on: Vec<FlockLock> = table.into_iter().filter(|l| l.ino == st.st_ino).collect();
    if on.is_empty() {
        return Lockers::Unseen;
    }
    let exclusive: Vec<FlockLock> = on.into_iter().filter(|l| l.exclusive).collect();
    if exclusive.is_empty() {
        return Lockers::Shared;
    }
    Lockers::Exclusive(kernel_holders(
        KernelKey {
            major,
            minor,
            ino: st.st_ino,
        },
        &exclusive,
    ))
}

/// Whether the record `r` is the record of a process in `holders` (the
/// kernel's, this namespace). When it is not, what it is instead, said for
/// an in-use message that leads with the kernel's holder: a record
/// released, or left by a process that does not hold the lock (gone, its
/// PID reused, another boot, another host), while something that wrote no
/// record holds it.
fn record_is_holder(r: &Record, holders: &[u32], takers: &[u32]) -> Result<(), Note> {
    let me = process::current();
    let who = || {
        let mut s = format!("pid {}", r.pid.map_or("?".into(), |p| p.to_string()));
        let about: Vec<String> = r
            .runtime
            .iter()
            .cloned()
            .chain(r.metadata.as_ref().map(crate::error::metadata_text))
            .collect();
        if !about.is_empty() {
            s += &format!(" ({})", about.join(", "));
        }
        if let Some(h) = &r.host {
            s += &format!(" on {h}");
        }
        s
    };
    if let Some(at) = &r.released_at {
        return Err(Note::Record(format!(
            "the lease file's record is of {}, which released it at {at}",
            who()
        )));
    }
    let differs =
        |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(x), Some(y)) if x != y);
    if holders.is_empty() {
        // Nothing the kernel names to compare with (a platform that lists
        // no lock holders, or a holder this reader cannot see). The record
        // still names no holder when its process is not running here: a
        // process it started, or handed the lease file to, holds the lock
        // (a SIGKILLed `sidelease hold` whose command lives on). Never name
        // a process that is not alive.
        let local = !differs(&r.host, &me.host)
            && !differs(&r.machine_id, &me.machine_id)
            && !differs(&r.boot_id, &me.boot_id);
        let gone = r.pid.is_some_and(|pid| process::alive(pid) == Some(false));
        if local && gone {
            return Err(Note::Record(format!(
                "the lease file's record is of {}, which is not running here: a process it \
                 started, or handed the lease file to, holds the lease",
                who()
            )));
        }
        return Ok(());
    }
    if differs(&r.host, &me.host) || differs(&r.machine_id, &me.machine_id) {
        return Err(Note::Record(format!(
            "the lease file's record is of {}, another host",
            who()
        )));
    }
    if differs(&r.boot_id, &me.boot_id) {
        return Err(Note::Record(format!(
            "the lease file's record is of {}, before the machine last booted",
            who()
        )));
    }
    let same_start = |pid: u32| match r.proc_start {
        Some(s) => process::start_time(pid) == Some(s),
        None => true,
    };
    let holds = match (r.pid, r.pid_ns) {
        // Another PID namespace: a holder whose namespace and start time
        // are the record's is the process it names.
        (Some(_), Some(ns)) if Some(ns) != me.pid_ns => holders
            .iter()
            .any(|&h| process::pid_namespace(h) == Some(ns) && same_start(h)),
        (Some(pid), _) => holders.contains(&pid) && same_start(pid),
        (None, _) => false,
    };
    if holds {
        return Ok(());
    }
    // The kernel lists the record's process as the one that took the lock,
    // and another process holds it through a descriptor it got from that
    // one: the holder inherited the lease (`hold`'s command, a forked
    // child). Only a PID of this namespace compares with /proc/locks'.
    let ours = r.pid_ns.is_none() || r.pid_ns == me.pid_ns;
    if let Some(pid) = r.pid.filter(|p| ours && takers.contains(p)) {
        let state = match process::alive(pid) {
            Some(false) => ", now gone",
            // A PID of another process now (its start time differs).
            Some(true) if r.proc_start.is_some() && !same_start(pid) => ", now gone",
            Some(true) if r.proc_start.is_some() => ", which no longer holds it",
            _ => "",
        };
        return Err(Note::Inherited(format!("inherited from {}{state}", who())));
    }
    Err(Note::Record(format!(
        "the lease file's record is of {}, which does not hold it: the holder inherited \
         the lock (a command that process started) or locked the file without writing a \
         record",
        who()
    )))
}

/// What a lease file's record is when it names no holder, for an in-use
/// message.
enum Note {
    /// The record is another process's (released, gone, another host…).
    Record(String),
    /// The holders inherited the lock from the process the record names,
    /// by the kernel's table of locks ("inherited from pid N (…), now
    /// gone"): said beside each holder's name.
    Inherited(String),
}
