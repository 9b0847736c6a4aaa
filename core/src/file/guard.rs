//! The split-domain guard (DESIGN §3.8): is a live process still holding a
//! former lease file of this lease — deleted, moved away, replaced, or the
//! same file reached through another mount of the directory?
//!
//! Former lease files are recognised by identity, never by the text of a
//! `/proc/PID/fd` link: every exclusive flock on the machine is a candidate
//! (a directory mounted over keeps its former files on the filesystem
//! underneath); its holder is found through `/proc/locks` and, when the PID
//! listed there is gone or reused, through every process's fdinfo; the
//! candidate is an orphan of this lease when the record inside it (read
//! through the holder's descriptor) names this lease: its directory and
//! file name, or its canonical path (which survives the directory being
//! renamed, replaced or mounted over).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::Result;
use crate::platform::locks;
use crate::platform::process::{self, FdScan, KernelKey, OpenFd};
use crate::record::{self, Content, Record};
use crate::registry;

/// A live process holding a former lease file of this lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Orphan {
    /// The process holding it (this process's PID namespace).
    pub pid: u32,
    /// The former lease file's inode number (on its own filesystem, which
    /// may be one mounted over since).
    pub inode: u64,
    /// The holder's descriptor on it, as in `/proc/PID/fd`.
    #[serde(skip)]
    pub fd: Option<u32>,
    /// The record inside it, read through the holder's descriptor.
    #[serde(skip)]
    pub record: Option<Record>,
}

/// The lease being checked.
pub(crate) struct Me<'a> {
    pub lease_path: &'a Path,
    /// The lease file's path as the caller spelled it (absolute; differs
    /// from `lease_path` when a symlink is on the way).
    pub spelled: &'a Path,
    /// The database: only a process that may write it (or, while it does
    /// not exist, its directory) can have held this lease.
    pub target: &'a Path,
    pub name: &'a OsStr,
    /// Its directory as (device, inode).
    pub dir: (u64, u64),
    /// The `stat` device of the lease file's filesystem, when known: this
    /// process's own lease files there are recognised from the registry
    /// instead of being read back through `/proc/self/fd`.
    pub file_dev: Option<u64>,
}

impl Me<'_> {
    fn owns(&self, r: &Record) -> bool {
        let canon = self.lease_path.to_string_lossy();
        let spelled = self.spelled.to_string_lossy();
        r.names_lease(self.dir, &self.name.to_string_lossy(), &[&canon, &spelled])
    }
}

#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub orphans: Vec<Orphan>,
    /// Exclusive flock locks on the device that could not be attributed:
    /// their holder's descriptors or content were not readable by this user,
    /// or no visible process holds them.
    pub unattributed: usize,
    /// Deleted files without a record, held: possibly a former lease file
    /// whose holder has not yet put back what someone truncated or
    /// overwrote in it. Only a brand-new lease file needs to wait for that.
    pub undecided: usize,
    /// Whether the scan saw every lock that could matter.
    pub complete: bool,
}

pub(crate) struct Outcome {
    pub orphan: Option<Orphan>,
    pub complete: bool,
    pub undecided: bool,
}

/// The guard of an acquisition that holds the lock through `fd`: the first
/// orphan found, and whether the check was complete.
pub(crate) fn check(fd: BorrowedFd<'_>, me: &Me<'_>) -> Result<Outcome> {
    let key = match process::own_lock(fd) {
        Ok(Some(k)) => k,
        // No fdinfo to read (no /proc): nothing can be seen.
        _ => return Ok(blind()),
    };
    Ok(outcome(scan(
        (key.major, key.minor),
        Some(key.ino),
        me,
        true,
    )))
}

/// The same look before locking the file at the path (`fd`, not locked by
/// this attempt): a former file still held means the attempt is refused
/// without ever locking the file at the path, so a holder putting its file
/// back there is never kept out by contenders that will be refused anyway.
pub(crate) fn precheck(fd: BorrowedFd<'_>, ino: u64, me: &Me<'_>) -> Outcome {
    match process::kernel_device(fd) {
        Ok(home) => outcome(scan(home, Some(ino), me, true)),
        Err(_) => blind(),
    }
}

fn blind() -> Outcome {
    Outcome {
        orphan: None,
        complete: false,
        undecided: false,
    }
}

fn outcome(s: Scan) -> Outcome {
    Outcome {
        orphan: s.orphans.into_iter().next(),
        complete: s.complete,
        undecided: s.undecided > 0,
    }
}

/// Every orphan of this lease among the exclusive flock locks of the
/// machine, except the lock on the inode the path names now (`current`, on
/// the lease file's device `home`, kernel numbering). Former files are
/// looked for on every device: the directory may have been mounted over
/// since, and then the former file is on the filesystem underneath.
/// `first_only` stops at the first one.
pub(crate) fn scan(home: (u32, u32), current: Option<u64>, me: &Me<'_>, first_only: bool) -> Scan {
    let mut out = Scan::default();
    let Ok(all) = locks::exclusive_flock_locks() else {
        return out; // incomplete: no kernel view
    };
    crate::faults::step("guard.listed");
    let (major, minor) = home;
    let own = OwnLeases::new(me);
    // One look at each holder's descriptors for all its candidates: a
    // process holding many leases is read once, not once per lease.
    let mut by_pid: BTreeMap<u32, Vec<KernelKey>> = BTreeMap::new();
    for l in &all {
        let at_home = l.on_device(major, minor);
        if at_home && Some(l.ino) == current {
            continue;
        }
        if at_home && l.pid == process::pid() && own.elsewhere(l.ino) {
            continue;
        }
        by_pid.entry(l.pid).or_default().push(KernelKey {
            major: l.major,
            minor: l.minor,
            ino: l.ino,
        });
    }
    drop(own); // the registry's lock: nothing below may hold it
    let mut unresolved: Vec<KernelKey> = Vec::new();
    for (pid, keys) in by_pid {
        crate::faults::step("guard.process");
        let inos: Vec<u64> = keys.iter().map(|k| k.ino).collect();
        match process::fds_on(pid, &inos) {
            FdScan::Found(open) => {
                for (key, fds) in keys.into_iter().zip(open) {
                    match judge(me, pid, key, &fds) {
                        Judged::Orphan(o) => {
                            out.orphans.push(*o);
                            if first_only {
                                return out;
                            }
                        }
                        Judged::NotOurs => {}
                        Judged::Undecided => out.undecided += 1,
                        // The PID the kernel lists took the lock but no
                        // longer has it open (or is another process now):
                        // whoever kept its descriptor holds it.
                        Judged::NotHeldHere => unresolved.push(key),
                    }
                }
            }
            FdScan::Denied => out.unattributed += keys.len(),
            FdScan::NotFound | FdScan::Gone => unresolved.extend(keys),
        }
    }
    if !unresolved.is_empty() {
        let (missing, bare) = attribute(&mut out, me, &unresolved, first_only);
        if first_only && !out.orphans.is_empty() {
            return out;
        }
        if !missing.is_empty() {
            // Where this process cannot see every process the scan is
            // incomplete anyway: nothing to wait for, but a lock released
            // while the scan ran still does not count.
            let limit = if process::current().sees_everything() {
                SETTLE_LIMIT
            } else {
                Duration::ZERO
            };
            out.unattributed += settle(&mut out, me, missing, &bare, first_only, limit);
        }
    }
    out.complete = out.unattributed == 0 && process::current().sees_everything();
    out
}

enum Judged {
    Orphan(Box<Orphan>),
    NotOurs,
    /// Cannot be told yet (see [`Scan::undecided`]).
    Undecided,
    NotHeldHere,
}

/// The lock `key`, listed for `pid`, which has the descriptors `fds` open
/// on files with its inode number (on any device: numbers repeat across
/// filesystems, so each is looked at). The content is judged first and the
/// fdinfo read only for a former file of this lease: most locks on a
/// machine are not this lease's. A *deleted* file without a record may be
/// this lease's former file whose holder has not yet put back what someone
/// truncated or overwrote in it, so it is left undecided (a brand-new lease
/// file then waits its grace); a linked one is nobody's lease file.
fn judge(me: &Me<'_>, pid: u32, key: KernelKey, fds: &[OpenFd]) -> Judged {
    match fds {
        [] => Judged::NotHeldHere,
        [one] => judge_fd(me, pid, key, one),
        many => {
            // Several files with this inode number: only the one whose
            // descriptor owns the lock counts.
            let mut held = false;
            for o in many {
                if !process::fd_holds(pid, o.fd, key) {
                    continue;
                }
                held = true;
                match judge_fd(me, pid, key, o) {
                    Judged::NotHeldHere => {}
                    j => return j,
                }
            }
            if held {
                Judged::NotOurs
            } else {
                Judged::NotHeldHere
            }
        }
    }
}

fn judge_fd(me: &Me<'_>, pid: u32, key: KernelKey, o: &OpenFd) -> Judged {
    let deleted = o.nlink == 0;
    if o.size > record::RECORD_MAX_BYTES as u64 || (o.size == 0 && !deleted) {
        return Judged::NotOurs;
    }
    let record = match process::read_through_fd(pid, o.fd, record::RECORD_MAX_BYTES) {
        Ok(bytes) => match Content::parse(&bytes) {
            Content::Record(r) if me.owns(&r) => r,
            Content::Record(_) => return Judged::NotOurs,
            _ if deleted => return Judged::Undecided,
            _ => return Judged::NotOurs,
        },
        // Closed since it was listed (or another process now): look again
        // the slow way, which counts it only if the kernel still lists it.
        Err(_) => return Judged::NotHeldHere,
    };
    if !may_own(me, pid) {
        return Judged::NotOurs;
    }
    if process::fd_holds(pid, o.fd, key) {
        Judged::Orphan(Box::new(Orphan {
            pid,
            inode: key.ino,
            fd: Some(o.fd),
            record: Some(*record),
        }))
    } else {
        Judged::NotHeldHere
    }
}

/// Whether the process `pid` may write the database (or, while it does not
/// exist, its directory). A record can be copied into any file by anyone:
/// a stranger holding such a file is not a holder of a former lease file,
/// and must not be able to block the lease by faking one. When it cannot be
/// told, the holder counts (refusing is the safe side).
fn may_own(me: &Me<'_>, pid: u32) -> bool {
    let Some(who) = process::credentials(pid) else {
        return true;
    };
    let st = crate::platform::stat::stat(me.target)
        .or_else(|_| crate::platform::stat::stat(crate::path::parent_of(me.target)));
    match st {
        Ok(st) => who.may_write(st.st_mode, st.st_uid, st.st_gid),
        Err(_) => true,
    }
}

/// Lease files this process holds (every anchor, former ones too) on the
/// lease file's filesystem whose records name another lease: the registry
/// knows what it wrote there, so they need no reading. (A record someone
/// overwrote is put back by the holder's watch.) Each is looked up as the
/// kernel lists it, under one lock of the registry for the whole listing:
/// a set of every held lease, built for each scan, made a new lease file's
/// acquisition grow with the number held (issue 38).
struct OwnLeases<'a, 'm> {
    me: &'a Me<'m>,
    held: Option<(u64, std::sync::MutexGuard<'static, registry::Inner>)>,
}

impl<'a, 'm> OwnLeases<'a, 'm> {
    fn new(me: &'a Me<'m>) -> Self {
        let held = me
            .file_dev
            .zip(registry::existing())
            .map(|(dev, reg)| (dev, reg.lock()));
        OwnLeases { me, held }
    }

    fn elsewhere(&self, ino: u64) -> bool {
        let Some((dev, g)) = &self.held else {
            return false;
        };
        g.holder_of((*dev, ino))
            .is_some_and(|s| !self.me.owns(&s.record))
    }
}

/// Is the lock `key`, held by `pid` through `fd`, a former file of this
/// lease? Its record says.
fn examine(out: &mut Scan, me: &Me<'_>, pid: u32, fd: u32, key: KernelKey) {
    match process::read_through_fd(pid, fd, record::RECORD_MAX_BYTES) {
        Ok(bytes) => match Content::parse(&bytes) {
            Content::Record(r) => {
                if me.owns(&r) && may_own(me, pid) {
                    out.orphans.push(Orphan {
                        pid,
                        inode: key.ino,
                        fd: Some(fd),
                        record: Some(*r),
                    });
                }
            }
            // As in `judge`: a deleted file without a record is undecided.
            _ => {
                let deleted = process::stat_fd(pid, fd).is_ok_and(|st| st.st_nlink == 0);
                if deleted {
                    out.undecided += 1;
                }
            }
        },
        Err(_) => out.unattributed += 1,
    }
}

/// Find the holders of `keys` (locks whose listed PID does not hold them)
/// among every process and examine each: the keys left without one, and
/// the processes seen with no descriptor open (see [`settle`]).
fn attribute(
    out: &mut Scan,
    me: &Me<'_>,
    keys: &[KernelKey],
    first_only: bool,
) -> (Vec<KernelKey>, Vec<u32>) {
    let (found, bare) = find_holders(keys);
    for (key, pid, fd) in &found {
        examine(out, me, *pid, *fd, *key);
        if first_only && !out.orphans.is_empty() {
            break;
        }
    }
    let left = keys
        .iter()
        .filter(|k| !found.iter().any(|(f, _, _)| f == *k))
        .copied()
        .collect();
    (left, bare)
}

/// The longest a scan waits for locks whose holder is on its way out (see
/// [`settle`]): their release took up to 36 ms here with both cores busy.
const SETTLE_LIMIT: Duration = Duration::from_millis(100);

/// How many of `missing` (listed by the kernel, held through no descriptor
/// any process shows) stay so: those the scan cannot attribute.
///
/// Such a lock is nearly always one whose holder is exiting. The kernel
/// takes an exiting process's descriptors out of /proc before it closes
/// them; the close of a lease file waits for the files opened after it
/// (closed newest first: an inotify instance with watches waits for an RCU
/// grace period), and a last close after the process's final step is left
/// to a kernel worker a tick later. That takes up to tens of milliseconds.
/// Counted at once, every acquisition on the machine meanwhile ran an
/// incomplete guard, and a new lease file waited out its grace for a
/// process that was not its holder (found by running the Rust test
/// binaries side by side, where `lead`'s tests kill holders).
///
/// So while a missing lock's listed PID is on its way out or gone, or a
/// process seen without descriptors (`bare`) is on its way out, the scan
/// looks again each millisecond, up to `limit` ([`SETTLE_LIMIT`]; zero
/// looks once and never waits): a lock gone by
/// then does not count, nor one whose holder is found by then (a descriptor
/// received from a Unix socket). One that stays (a descriptor in flight, a
/// process hidden from this one) counts, and the scan is incomplete. With
/// no process leaving, nothing is waited for.
fn settle(
    out: &mut Scan,
    me: &Me<'_>,
    mut missing: Vec<KernelKey>,
    bare: &[u32],
    first_only: bool,
    limit: Duration,
) -> usize {
    let mut exiting: Vec<(u32, u64)> = if limit.is_zero() {
        Vec::new()
    } else {
        bare.iter()
            .filter_map(|&pid| Some((pid, process::start_time(pid)?)))
            .collect()
    };
    let deadline = Instant::now() + limit;
    let mut waited = false;
    loop {
        let Ok(still) = locks::exclusive_flock_locks() else {
            return missing.len();
        };
        let listed = |k: &KernelKey| {
            still
                .iter()
                .find(|l| l.ino == k.ino && l.on_device(k.major, k.minor))
        };
        missing.retain(|k| listed(k).is_some());
        if missing.is_empty() {
            return 0;
        }
        if Instant::now() >= deadline {
            break;
        }
        // `exited` cannot tell (None) while a process is on its way out.
        exiting.retain(|&(pid, start)| process::exited(pid, start).is_none());
        let taker_leaving =
            missing
                .iter()
                .filter_map(listed)
                .any(|l| match process::start_time(l.pid) {
                    None => true,
                    Some(start) => process::exited(l.pid, start) != Some(false),
                });
        if !taker_leaving && exiting.is_empty() {
            break;
        }
        crate::faults::step("guard.settle");
        std::thread::sleep(Duration::from_millis(1));
        waited = true;
    }
    if waited {
        missing = attribute(out, me, &missing, first_only).0;
    }
    missing.len()
}

/// Look through every visible process for the descriptors that own the
/// given locks (one pass for all of them), and the processes seen with no
/// descriptor open: kernel threads, and processes on their way out.
fn find_holders(keys: &[KernelKey]) -> (Vec<(KernelKey, u32, u32)>, Vec<u32>) {
    let mut found = Vec::new();
    let mut bare = Vec::new();
    let mut left: Vec<KernelKey> = keys.to_vec();
    for pid in process::all_pids().unwrap_or_default() {
        if left.is_empty() {
            break;
        }
        let FdScan::Found(fds) = process::fds_of(pid) else {
            continue;
        };
        if fds.is_empty() {
            bare.push(pid);
        }
        for fd in fds {
            let Ok(st) = process::stat_fd(pid, fd) else {
                continue;
            };
            // (Inode numbers repeat across devices: the fdinfo tells which.)
            let hit = left
                .iter()
                .position(|k| k.ino == st.st_ino && process::fd_holds(pid, fd, *k));
            if let Some(i) = hit {
                found.push((left.swap_remove(i), pid, fd));
                if left.is_empty() {
                    break;
                }
            }
        }
    }
    (found, bare)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::process::{Command, Stdio};

    /// A scan settles only where the platform lists the machine's locks
    /// (not the portable one: its scan ends before).
    fn lock_table() -> bool {
        let listed = locks::exclusive_flock_locks().is_ok();
        if !listed {
            eprintln!("not given: this platform lists no locks");
        }
        listed
    }

    /// The key the kernel lists a lock on `path` under.
    fn key_of(path: &Path) -> KernelKey {
        use std::os::fd::AsFd;
        let f = std::fs::File::open(path).unwrap();
        let (major, minor) = process::kernel_device(f.as_fd()).unwrap();
        let ino = crate::platform::stat::stat(path).unwrap().st_ino;
        KernelKey { major, minor, ino }
    }

    fn settle_for(path: &Path, limit: Duration) -> (usize, Duration) {
        let me = Me {
            lease_path: path,
            spelled: path,
            target: path,
            name: OsStr::new("x"),
            dir: (0, 0),
            file_dev: None,
        };
        let started = Instant::now();
        let left = settle(
            &mut Scan::default(),
            &me,
            vec![key_of(path)],
            &[],
            false,
            limit,
        );
        (left, started.elapsed())
    }

    /// Where a process cannot see every process (`limit` zero) the scan
    /// still looks once more: a lock released while it ran does not count.
    #[test]
    fn a_lock_gone_by_the_second_look_does_not_count_even_without_waiting() {
        if !lock_table() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("released");
        std::fs::write(&path, b"").unwrap();
        assert_eq!(settle_for(&path, Duration::ZERO).0, 0);
        assert_eq!(settle_for(&path, SETTLE_LIMIT).0, 0);
    }

    /// A lock whose listed PID is gone (its descriptor kept by a process it
    /// started): with a limit the scan waits and then finds the keeper;
    /// with none it counts the lock at once.
    #[test]
    fn a_zero_limit_never_waits_for_a_taker_that_is_gone() {
        if !lock_table() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inherited");
        std::fs::write(&path, b"").unwrap();
        // The shell takes the lock, leaves it to a `sleep` and exits.
        let mut sh = Command::new("sh")
            .arg("-c")
            .arg("exec 9>\"$1\"; flock -x 9; sleep 30 </dev/null >/dev/null 2>&1 & echo $!")
            .arg("sh")
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = String::new();
        sh.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        sh.wait().unwrap();
        let keeper: i32 = out.trim().parse().unwrap();
        let (zero, took) = settle_for(&path, Duration::ZERO);
        let (limited, waited) = settle_for(&path, SETTLE_LIMIT);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(keeper).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        assert_eq!(zero, 1, "counted at once");
        assert!(took < Duration::from_millis(50), "did not wait: {took:?}");
        assert_eq!(limited, 0, "the keeper was found after the wait");
        assert!(waited >= SETTLE_LIMIT, "waited the limit: {waited:?}");
    }
}
