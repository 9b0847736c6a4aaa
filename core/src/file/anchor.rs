//! Re-anchoring (DESIGN §4a): when a held lease's path no longer names a
//! file the lease has locked — deleted, moved away, renamed over — the
//! holder opens the path again (creating it), locks whatever it names now,
//! checks its identity and writes its record there with its own generation,
//! so the kernel itself refuses every later contender in every namespace.
//! If another process locked the new file first, or the file cannot be put
//! back for longer than the slow re-check, the lease is lost.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, OFlags};
use rustix::io::Errno;

use crate::error::Lost;
use crate::faults;
use crate::file::access::{self, Access};
use crate::file::holders::{self, Lockers};
use crate::file::watch;
use crate::file::write_padded;
use crate::lease::{Anchor, Phase, Shared, State};
use crate::platform::process;
use crate::record::{self, Content, Record};
use crate::registry::{self, Flight, Key};

/// How soon to try again when the lease file could not be put back.
const RETRY: Duration = Duration::from_millis(250);
/// The file at the path found locked by another process is not lost at
/// once unless that process wrote its own record there (a sidelease holder
/// does, right after its lock and its guard): a contender locks it only
/// while its guard runs, before it is refused or gives the holder its
/// grace (see `acquire::REANCHOR_GRACE`). Retry this often; the lease is
/// lost once the same process(es) kept it locked this long, seen so in
/// this many looks in a row, without a record of their own. The looks
/// count because a time alone is no evidence on a crowded machine: a
/// holder whose thread did not run for 100 ms between two looks that
/// found the same contender (or none) saw nothing continuous.
const CONTENDED_RETRY: Duration = Duration::from_millis(1);
const CONTENDED_FOR: Duration = Duration::from_millis(100);
const CONTENDED_LOOKS: u32 = 20;
/// How long `ensure_held` waits for a re-anchor racing its own.
const NOW_BOUND: Duration = Duration::from_millis(20);
/// Most descriptors one lease keeps (each a former lease file still locked
/// so processes that opened it earlier stay excluded); beyond, the oldest
/// former ones are let go (their contenders re-check identity anyway).
const MAX_ANCHORS: usize = 16;

/// Other processes found holding the file now at the path, look after look.
pub(crate) struct Contention {
    since: Instant,
    /// The kernel's PIDs holding it exclusively (this namespace, sorted;
    /// empty: none seen). `None`: it was share-locked.
    by: Option<Vec<u32>>,
    looks: u32,
}

impl Contention {
    /// One more look that found the file locked: whether the same
    /// process(es) kept it locked exclusively long enough, and in enough
    /// looks, to be holding it. A shared lock excludes every exclusive one:
    /// it is never a rival's hold.
    fn look(slot: &mut Option<Contention>, lockers: Lockers, now: Instant) -> bool {
        let by = match lockers {
            Lockers::Shared => None,
            Lockers::Exclusive(by) => Some(by),
            Lockers::Unseen => Some(Vec::new()),
        };
        let c = match slot {
            Some(c) if c.by == by => {
                c.looks += 1;
                c
            }
            _ => slot.insert(Contention {
                since: now,
                by,
                looks: 1,
            }),
        };
        c.by.is_some() && now.duration_since(c.since) >= CONTENDED_FOR && c.looks >= CONTENDED_LOOKS
    }

    fn first(slot: &Option<Contention>) -> Option<u32> {
        slot.as_ref()
            .and_then(|c| c.by.as_ref())
            .and_then(|by| by.first().copied())
    }
}

enum Outcome {
    Whole,
    Retry(Instant),
    Lost(Lost),
}

/// Look at a held lease: is its path still one of its files? If not, put it
/// back. `sweep`: this is the slow periodic check, so also rewrite a record
/// someone overwrote. Returns when to look again, if the lease file could
/// not be put back yet.
pub(crate) fn check(shared: &Arc<Shared>, sweep: bool) -> Option<Instant> {
    match check_inner(shared, sweep) {
        Outcome::Whole => None,
        Outcome::Retry(at) => Some(at),
        Outcome::Lost(l) => {
            shared.mark_lost(l);
            None
        }
    }
}

/// Put the lease file back now, in the caller's thread, when its path no
/// longer names it (`ensure_held`). A re-anchor in progress in another
/// thread is waited for, briefly.
pub(crate) fn check_now(shared: &Arc<Shared>) {
    let until = Instant::now() + NOW_BOUND;
    loop {
        match check_inner(shared, false) {
            Outcome::Whole => return,
            Outcome::Lost(l) => {
                shared.mark_lost(l);
                return;
            }
            Outcome::Retry(at) => {
                // Only a re-anchor racing this one (another thread's flight)
                // is worth waiting for; a path that cannot be made is not.
                let now = Instant::now();
                if at > now + CONTENDED_RETRY || now >= until {
                    watch::retry_at(shared, at);
                    return;
                }
                std::thread::sleep(at.saturating_duration_since(now));
            }
        }
    }
}

fn check_inner(shared: &Arc<Shared>, sweep: bool) -> Outcome {
    if !matches!(shared.state().phase, Phase::Held) {
        return Outcome::Whole;
    }
    // Every path the lease protects: the canonical one, and the one as
    // spelled through a symlink.
    let paths: Vec<std::path::PathBuf> = shared.paths().map(Path::to_path_buf).collect();
    for path in &paths {
        let now_names = match crate::platform::stat::lstat(path) {
            // An unlink notifies before the name leaves the dentry cache, so
            // a look right after the event can still find the unlinked file:
            // its link count (already 0) tells.
            Ok(st) if st.st_nlink == 0 => None,
            Ok(st) => Some((st.st_dev, st.st_ino)),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) => None,
            Err(e) => return failing(shared, &format!("lstat failed: {e}")),
        };
        {
            let mut st = shared.state();
            if let Some(key) = now_names {
                if let Some(i) = st.anchors.iter().position(|a| a.key == key) {
                    if sweep {
                        rewrite_if_overwritten(shared, &mut st.anchors[i]);
                    }
                    continue;
                }
            }
        }
        match reanchor(shared, path, now_names.is_some()) {
            Outcome::Whole => {}
            other => return other,
        }
    }
    let mut st = shared.state();
    st.failing_since = None;
    st.contended = None;
    Outcome::Whole
}

/// A record someone overwrote in place while the lease is held is written
/// again (the slow sweep only: watching writes would wake the watcher on
/// every acquisition's own write).
fn rewrite_if_overwritten(shared: &Shared, a: &mut Anchor) {
    if !a.writable {
        return;
    }
    let Ok(bytes) = process::read_at_most(a.fd(), a.len, record::RECORD_MAX_BYTES) else {
        return;
    };
    let trimmed = bytes.trim_ascii_end();
    if trimmed == a.line.trim_ascii_end() {
        return;
    }
    if let Ok(n) = write_padded(a.fd(), &shared.lease_path, &a.line, bytes.len()) {
        a.len = n;
    }
}

fn failing(shared: &Shared, why: &str) -> Outcome {
    failing_every(shared, why, RETRY)
}

fn failing_every(shared: &Shared, why: &str, retry: Duration) -> Outcome {
    let now = Instant::now();
    let since = *shared.state().failing_since.get_or_insert(now);
    let period = watch::recheck_period();
    if now.duration_since(since) >= period {
        return Outcome::Lost(Lost {
            lease_path: shared.lease_path.clone(),
            reason: format!(
                "the lease file could not be put back at its path for {} ({why})",
                seconds(period)
            ),
            holders: Vec::new(),
        });
    }
    Outcome::Retry(now + retry.min(period))
}

/// "60s", "1.5s".
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn reanchor(shared: &Arc<Shared>, path: &Path, replaced: bool) -> Outcome {
    faults::step("anchor.begin");
    // Threads of this process acquiring the same lease wait for the
    // re-anchor (and then share it) instead of racing it for the new file.
    let id = registry::attempt_id();
    let flight = match Flight::claim(path, id, Instant::now() + Duration::from_secs(1), |_| {
        None::<()>
    }) {
        Ok(f) => f,
        Err(_) => return Outcome::Retry(Instant::now() + Duration::from_millis(1)),
    };
    let mut st = shared.state();
    if !matches!(st.phase, Phase::Held) {
        return Outcome::Whole;
    }
    let mut rounds = 0;
    let (anchor, key) = loop {
        rounds += 1;
        if rounds > 8 {
            drop(st);
            return failing(shared, "the file kept being replaced");
        }
        let (fd, slot, writable) = match open_for_anchor(path, &shared.target, &shared.access) {
            // Above our inotify instances, as an acquisition's (claim).
            Ok((fd, slot, w)) => (watch::above_instances(fd, slot), slot, w),
            Err(e) => {
                drop(st);
                drop(flight);
                return failing(
                    shared,
                    &format!("open failed: {}", crate::error::os_message(&e)),
                );
            }
        };
        faults::step("anchor.opened");
        // SAFETY: open until closed below or handed to the anchor.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(fst) = crate::platform::stat::fstat(bfd) else {
            registry::close_listed(fd, slot);
            continue;
        };
        let key: Key = (fst.st_dev, fst.st_ino);
        match rustix::fs::flock(bfd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {
                let now = Instant::now();
                if committed(shared, bfd, key) {
                    let lost = rival(shared, bfd, replaced, Contention::first(&st.contended));
                    registry::close_listed(fd, slot);
                    return Outcome::Lost(lost);
                }
                // Who holds it now: the window starts again whenever that
                // changes (one refused contender after another is nobody
                // holding the file).
                let outcome = if Contention::look(&mut st.contended, holders::lockers(bfd), now) {
                    Outcome::Lost(rival(
                        shared,
                        bfd,
                        replaced,
                        Contention::first(&st.contended),
                    ))
                } else {
                    // Looked at every millisecond, never more slowly: a
                    // contender that finds the file free once this lock
                    // ends must find it put back. A lock that never settles
                    // (shared, or changing hands for ever) is a file that
                    // cannot be put back, lost after the slow recheck.
                    drop(st);
                    failing_every(
                        shared,
                        "the file at its path stayed locked by other processes, shared or \
                         changing hands",
                        CONTENDED_RETRY,
                    )
                };
                registry::close_listed(fd, slot);
                return outcome;
            }
            Err(_) => {
                registry::close_listed(fd, slot);
                continue;
            }
        }
        faults::step("anchor.locked");
        // Watched before the identity check, so a replacement after the
        // check is an event (the watch stays on a file we end up not
        // holding; it is removed when it next fires).
        watch::add_anchor(shared, bfd, key);
        match crate::platform::stat::lstat(path) {
            Ok(now) if (now.st_dev, now.st_ino) == key && now.st_nlink > 0 => {}
            _ => {
                let _ = rustix::fs::flock(bfd, FlockOperation::Unlock);
                registry::close_listed(fd, slot);
                continue;
            }
        }
        // The directory the file is in now: after the directory was
        // renamed, replaced or mounted over it is another one, and the
        // guard must recognise this file by it (and by its path).
        let dir = crate::platform::stat::stat(crate::path::parent_of(path))
            .map(|d| (d.st_dev, d.st_ino))
            .unwrap_or((0, 0));
        faults::step("anchor.checked");
        if let Some(lost) = held_since(shared, bfd, key) {
            let _ = rustix::fs::flock(bfd, FlockOperation::Unlock);
            registry::close_listed(fd, slot);
            return Outcome::Lost(lost);
        }
        let rec = Record {
            device: Some(key.0),
            inode: Some(key.1),
            // This holder did not check the new file for orphans (it holds
            // one itself): the next holder must run the guard.
            split_checked: Some(false),
            dir_device: Some(dir.0),
            dir_inode: Some(dir.1),
            ..shared.record.clone()
        };
        let line = rec.to_line();
        let size = fst.st_size.max(0) as usize;
        let len = if writable {
            write_padded(bfd, path, &line, size).unwrap_or(size)
        } else {
            size
        };
        break (
            Anchor {
                fd,
                slot,
                key,
                writable,
                line,
                len,
            },
            key,
        );
    };
    let let_go = push_anchor(&mut st, anchor);
    st.failing_since = None;
    st.contended = None;
    drop(st);
    let reg = registry::get();
    let mut g = reg.lock();
    // A file let go is no longer this lease's: once closed its inode
    // number may name another lease file, which must not be shared as
    // this one. So it leaves the registry first, and is closed under the
    // registry's lock, which every sharing takes.
    g.forget(shared, let_go.iter().map(|a| a.key));
    for old in let_go {
        let _ = rustix::fs::flock(old.fd(), FlockOperation::Unlock);
        registry::close_listed(old.fd, old.slot);
    }
    if matches!(shared.state().phase, Phase::Held) {
        g.insert(key, shared.clone());
    }
    flight.end_locked(&mut g);
    Outcome::Whole
}

/// Add `anchor`, taking the oldest but the first out past [`MAX_ANCHORS`]:
/// the files to let go (still open and locked).
fn push_anchor(st: &mut State, anchor: Anchor) -> Vec<Anchor> {
    let mut let_go = Vec::new();
    st.anchors.push(anchor);
    while st.anchors.len() > MAX_ANCHORS {
        // Keep the first (an inherited descriptor may be its copy) and the
        // newest; let the oldest in between go.
        let old = st.anchors.remove(1);
        if st.inherited == Some(old.key) {
            st.anchors.insert(1, old);
            break;
        }
        let_go.push(old);
    }
    let_go
}

fn open_for_anchor(
    path: &Path,
    target: &Path,
    access: &Access,
) -> std::io::Result<(i32, u32, bool)> {
    // NONBLOCK: a FIFO planted at the path, or a file lease (F_SETLEASE) on
    // the file, must not block the open (it changes nothing for a regular
    // file's reads, writes or flock).
    let base = OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK;
    let open = |flags: OFlags| {
        registry::open_listed(|| {
            Ok(rustix::fs::open(
                path,
                flags,
                crate::platform::stat::mode(access::CREATE_MODE),
            )?)
        })
    };
    let flatten =
        |r: std::io::Result<crate::error::Result<(i32, u32)>>| -> std::io::Result<(i32, u32)> {
            r?.map_err(|e| std::io::Error::other(e.to_string()))
        };
    // Exclusive first, so only a file this process put back is given the
    // former file's owner and group. When it cannot be created (the
    // directory is gone, immutable, not ours to write), that is the error:
    // only an existing file may be taken read-only.
    let r = match open(base | OFlags::RDWR | OFlags::CREATE | OFlags::EXCL) {
        Ok(r) => {
            let (fd, slot) = flatten(Ok(r))?;
            // SAFETY: just opened; the caller closes it or hands it on.
            access::apply(unsafe { BorrowedFd::borrow_raw(fd) }, access);
            return Ok((fd, slot, true));
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => open(base | OFlags::RDWR),
        Err(e) => match crate::platform::stat::lstat(path) {
            Ok(_) => open(base | OFlags::RDWR),
            Err(_) => return Err(e),
        },
    };
    let (fd, slot, writable) = match r {
        Ok(r) => flatten(Ok(r)).map(|(fd, slot)| (fd, slot, true))?,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM)
            ) =>
        {
            match flatten(open(base | OFlags::RDONLY)) {
                Ok((fd, slot)) => (fd, slot, false),
                // Gone in between: what failed is the write access.
                Err(e2) if e2.raw_os_error() == Some(libc::ENOENT) => return Err(e),
                Err(e2) => return Err(e2),
            }
        }
        Err(e) => return Err(e),
    };
    // Someone else made this file in the moment the path was free: the same
    // rule as for an acquirer (in a shared sticky directory, a stranger's
    // file is not adopted).
    // SAFETY: just opened; closed below or returned to the caller.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let planted = crate::platform::stat::fstat(bfd)
        .map_err(std::io::Error::from)
        .and_then(|st| {
            access::not_planted(path, target, (st.st_dev, st.st_ino, st.st_uid, st.st_nlink))
                .map_err(|e| std::io::Error::other(e.to_string()))
        });
    if let Err(e) = planted {
        registry::close_listed(fd, slot);
        return Err(e);
    }
    Ok((fd, slot, writable))
}

/// Whether the process that locked the file now at the path (`key`) wrote
/// its own record there: a sidelease holder does as soon as its lock and
/// its guard are done, so that one holds the lease file, not merely looks.
fn committed(shared: &Shared, fd: BorrowedFd<'_>, key: Key) -> bool {
    let Ok(bytes) = process::read_at_most(fd, 4096, record::RECORD_MAX_BYTES) else {
        return false;
    };
    matches!(Content::parse(&bytes), Content::Record(r)
        if r.device == Some(key.0) && r.inode == Some(key.1) && r.released_at.is_none()
            && r.nonce.is_some() && r.nonce != shared.record.nonce)
}

/// The file now at the path is free, but its record is another holder's
/// whose hold came after ours began: a later generation, or a record
/// written (acquired, put back, released) since we acquired. Someone held
/// the lease while this holder's file was not at the path (it was
/// truncated and moved aside, say, and the guard could not tell it from an
/// unrelated lock), and may have let go since. Taking the file back would
/// hide that the hold was broken: the lease is lost. A record of an
/// earlier hold (an old lease file renamed over ours), ours, or none
/// proves nothing.
fn held_since(shared: &Shared, fd: BorrowedFd<'_>, key: Key) -> Option<Lost> {
    let mine = &shared.record;
    let bytes = process::read_at_most(fd, 4096, record::RECORD_MAX_BYTES).ok()?;
    let Content::Record(r) = Content::parse(&bytes) else {
        return None;
    };
    // A hold of this very file at this lease's path (not a copy, nor
    // another database's lease file renamed over ours), neither ours nor
    // the one ours followed.
    let displaced = matches!(&shared.previous, Content::Record(p) if p.nonce == r.nonce);
    if r.nonce.is_none()
        || r.nonce == mine.nonce
        || displaced
        || (r.device, r.inode) != (Some(key.0), Some(key.1))
        || r.lease_path.as_deref().map(Path::new) != Some(shared.lease_path.as_path())
    {
        return None;
    }
    let later_generation = matches!((r.generation, mine.generation), (Some(g), Some(o)) if g > o);
    // Timestamps as written: UTC, milliseconds, one fixed width, so they
    // order as strings; a release in the very millisecond we began counts.
    fn stamp(t: &Option<String>) -> Option<&str> {
        t.as_deref().filter(|t| t.len() == 24 && t.ends_with('Z'))
    }
    let since = stamp(&mine.started_at).is_some_and(|begun| {
        [&r.started_at, &r.released_at]
            .into_iter()
            .filter_map(stamp)
            .any(|t| t >= begun)
    });
    if !(later_generation || since) {
        return None;
    }
    let who = match r.pid {
        Some(p) => format!("pid {p}"),
        None => "another process".into(),
    };
    let generation = r
        .generation
        .map(|g| format!(" (generation {g})"))
        .unwrap_or_default();
    Some(Lost {
        lease_path: shared.lease_path.clone(),
        reason: format!(
            "the lease file was deleted, moved or replaced while held, and {who} held the \
             lease since{generation}"
        ),
        holders: Vec::new(),
    })
}

/// Another process locked the file now at the path: who, and what happened.
/// `seen`: a process found holding it earlier (asked first, before the
/// kernel's lock list).
fn rival(shared: &Shared, fd: BorrowedFd<'_>, replaced: bool, seen: Option<u32>) -> Lost {
    let bytes = process::read_at_most(fd, 4096, record::RECORD_MAX_BYTES).unwrap_or_default();
    let rec = Content::parse(&bytes).record().cloned();
    let holders = holders::holders_of(fd, rec.as_ref().and_then(|r| r.pid).or(seen));
    let runtime = |r: &Record| {
        r.runtime
            .as_ref()
            .map(|rt| format!(" ({rt})"))
            .unwrap_or_default()
    };
    let me = process::current();
    let who = match (&rec, holders.first()) {
        // A record from another PID namespace names a PID of that
        // namespace: say so, and give the kernel's PID here.
        (Some(r), here) if r.pid.is_some() && r.pid_ns.is_some() && r.pid_ns != me.pid_ns => {
            format!(
                "pid {} of another PID namespace{}{}",
                r.pid.unwrap_or_default(),
                runtime(r),
                here.map(|p| format!(", pid {p} here"))
                    .unwrap_or_else(|| ", not visible here".into())
            )
        }
        (Some(r), _) if r.pid.is_some() => {
            format!("pid {}{}", r.pid.unwrap_or_default(), runtime(r))
        }
        (_, Some(p)) => format!("pid {p}"),
        _ => "another process".to_string(),
    };
    let what = if replaced {
        "was replaced by another file"
    } else {
        "was deleted or moved away"
    };
    Lost {
        lease_path: shared.lease_path.clone(),
        reason: format!(
            "the lease file {what} while held, and {who} holds the file now at its path"
        ),
        holders,
    }
}
