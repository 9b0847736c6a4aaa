//! What the lease file tells a new holder before it writes: whether the
//! previous record vouches that no former file is held (so the split guard
//! may be skipped), how young the file is (a holder of a former one may not
//! have put it back yet), and the next fencing generation.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::platform::filestat::stat_with_age;
use crate::platform::process;
use crate::record::{self, Content, Salvaged};
use crate::registry::Key;

/// Can the split guard be skipped? Yes when the previous record was written
/// by a holder of this very inode whose own acquisition was split-checked by
/// a complete check. An orphan (a live holder of a former inode) can only
/// exist if the file at the path was deleted or replaced while held, and
/// then the path names a new inode whose first holder has no such record and
/// runs the guard; by induction every later holder of the same inode may
/// trust the chain. A blind check (a child PID namespace, locks of other
/// users) writes `split_checked: false`, so it never vouches. The read
/// matters: `/proc/locks` takes the kernel's global file-lock rwsem for
/// writing, which costs an RCU grace period (milliseconds) whenever it has
/// not been taken recently.
///
/// The record must also be this lease's (its path is this lease file's),
/// and the file must not have been touched since that record was written
/// (its status-change time is its modification time): a file that was a
/// lease file before — another database's, or this one's from an earlier
/// life — renamed over the live one carries a record that vouches for its
/// own inode, and a rename changes only the status-change time.
pub(crate) fn vouched_for(
    previous: &Content,
    (dev, ino): Key,
    lease_path: &Path,
    untouched: bool,
) -> bool {
    untouched
        && matches!(previous, Content::Record(r)
        if r.inode == Some(ino) && r.device == Some(dev) && r.split_checked == Some(true)
            && r.lease_path.as_deref().map(Path::new) == Some(lease_path))
}

/// Does the file open as `fd` vouch for itself now (see [`vouched_for`]),
/// read before it is locked? A young file that does needs no look for
/// former files before the lock: its record's writer held this inode at
/// this path and its complete guard saw none, so no holder of a former file
/// can be putting one back. Only a shortcut past that look, never past the
/// guard: the claim reads the record again under the lock and scans after
/// it when the record no longer vouches. Before, each of 256 waits
/// released together on lease files made less than a second earlier read
/// the mount table and `/proc/locks` before its lock (issue 38).
pub(crate) fn vouches_now(fd: BorrowedFd<'_>, key: Key, lease_path: &Path) -> bool {
    let Ok(st) = stat_with_age(fd) else {
        return false;
    };
    let untouched = st.untouched && st.st_nlink > 0;
    let bytes = match process::read_at_most(fd, st.st_size as usize, record::RECORD_MAX_BYTES) {
        Ok(bytes) if bytes.len() <= record::RECORD_MAX_BYTES => bytes,
        _ => return false,
    };
    let content = Content::parse(&bytes);
    let Content::Record(r) = &content else {
        return false;
    };
    // A record copied into a file made later (a backup restored, on an
    // inode number the filesystem gave out again) names this inode too:
    // only one written after the file was born vouches for it before the
    // lock, where the look it spares would have seen a former file.
    let born = st
        .age
        .and_then(|a| SystemTime::now().checked_sub(a))
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok());
    let written = r
        .started_at
        .as_deref()
        .and_then(record::parse_rfc3339_millis);
    let after_birth = match (written, born) {
        (Some(w), Some(b)) => u128::from(w) + BIRTH_SLACK_MS >= b.as_millis(),
        _ => false,
    };
    after_birth && vouched_for(&content, key, lease_path, untouched)
}

/// File times come from the kernel's coarse clock (up to a tick behind)
/// and records are written to the millisecond: a record written just after
/// its file was made may read as up to this much older than the file.
const BIRTH_SLACK_MS: u128 = 10;

/// Does the record in the held file `fd` name its holder: written for this
/// very inode under the name of `lease_path` (another database's lease file
/// renamed over ours is not waited out; the directory may be named
/// otherwise in a container's mounts), not released, by a process running
/// here now?
/// A waiter whose file was deleted or replaced while another process held
/// it waits on it while it does: that holder is one that puts a file back
/// at the path (or one the split guard would refuse every acquirer for: a
/// holder told its lease is lost keeps its files until it lets go). A
/// record of a process gone or released, or of another file, leaves a lock
/// that holds no lease an acquirer through the path can see (the command a
/// killed `sidelease hold` handed the file to): waiting on it would wait
/// that process out (issue 35). `None`: no record to tell (an empty file,
/// as `flock(1)` leaves it, or one someone truncated or overwrote under its
/// holder). Only the boot is compared, not the host name or machine id: a
/// container on this kernel has its own. A writer in another PID namespace
/// cannot be looked up, so it counts as running.
pub(crate) fn writer_holds(fd: BorrowedFd<'_>, (dev, ino): Key, lease_path: &Path) -> Option<bool> {
    let bytes = match process::read_at_most(fd, 0, record::RECORD_MAX_BYTES) {
        Ok(bytes) if bytes.len() <= record::RECORD_MAX_BYTES => bytes,
        _ => return None,
    };
    let Content::Record(r) = Content::parse(&bytes) else {
        return None;
    };
    let me = process::current();
    let other_boot = matches!((&r.boot_id, &me.boot_id), (Some(x), Some(y)) if x != y);
    if r.released_at.is_some()
        || r.inode != Some(ino)
        || r.device != Some(dev)
        || r.lease_path
            .as_deref()
            .and_then(|p| Path::new(p).file_name())
            != lease_path.file_name()
        || other_boot
    {
        return Some(false);
    }
    let Some(pid) = r.pid else {
        return Some(false);
    };
    if matches!((r.pid_ns, me.pid_ns), (Some(a), Some(b)) if a != b) {
        return Some(true);
    }
    Some(match r.proc_start {
        Some(start) => match process::exited(pid, start) {
            Some(exited) => !exited,
            // Not told: on its way out, or its PID now names a process
            // that started at another time (more than a tick apart: under
            // qemu a process reads its own start time a tick off).
            None => !matches!(process::start_time(pid), Some(s) if s.abs_diff(start) > 1),
        },
        None => process::alive(pid) != Some(false),
    })
}

/// Is this lease file young enough that a holder of a former one may not
/// have put it back yet? How much longer to wait if so. Without a birth time
/// a file with no record in it counts as new.
pub(crate) fn young(
    age: Option<Duration>,
    previous: &Content,
    grace: Duration,
) -> Option<Duration> {
    match age {
        Some(a) if a < grace => Some(grace - a),
        Some(_) => None,
        None => matches!(previous, Content::Empty | Content::Unreadable).then_some(grace),
    }
}

/// One more than the previous holder's generation; a generation that cannot
/// grow refuses the lease rather than wrapping (the fencing token would
/// repeat). Where the file does not say what the last generation was — a
/// file created now, an emptied one, bytes naming none — the generation
/// jumps to the clock ([`clock_floor`]) rather than starting again at 1: a
/// new file may be one that replaced a deleted lease file (an operator's
/// `rm`, a rival's rename), whose holders counted up from an earlier jump.
pub(crate) fn next_generation(previous: &Content, bytes: &[u8], path: &Path) -> Result<u64> {
    let prev = match previous {
        Content::Record(r) => Salvaged::Found(r.generation.unwrap_or(0)),
        Content::Empty => Salvaged::Nothing,
        Content::Unreadable => record::salvage_generation(bytes),
    };
    match prev {
        Salvaged::Found(g) => g
            .checked_add(1)
            .ok_or_else(|| cannot_grow(path, &g.to_string())),
        Salvaged::Nothing => Ok(clock_floor()),
        Salvaged::TooLarge => Err(cannot_grow(path, "it does not fit in 64 bits")),
    }
}

fn cannot_grow(path: &Path, why: &str) -> Error {
    Error::io(
        "pwrite",
        path,
        std::io::Error::other(format!(
            "the previous holder's generation cannot grow ({why}); the fencing token would \
             repeat, so the lease is refused: an operator must reset the lease file"
        )),
    )
}

/// A generation no earlier one can equal when the record that said the
/// last one is gone: microseconds since the Unix epoch. Every acquisition
/// takes longer than a microsecond, so generations counted up one by one
/// from an earlier jump stay below a later one, and a counter that started
/// at 1 never comes near it. Only a clock set back between two jumps could
/// make one repeat.
pub(crate) fn clock_floor() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_micros()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_survives_a_torn_record() {
        use crate::record::salvage_generation;
        assert_eq!(salvage_generation(b"garbage"), Salvaged::Nothing);
        assert_eq!(
            salvage_generation(
                b"{\"schema\":1,\"generation\":18,\"pid\":2}\n\"generation\":17,\"pi"
            ),
            Salvaged::Found(18)
        );
        assert_eq!(
            salvage_generation(b"\"generation\": 99999999999999999999999"),
            Salvaged::TooLarge
        );
    }

    #[test]
    fn generation_never_wraps() {
        let p = Path::new("/x");
        let max =
            Content::parse(format!("{{\"schema\":1,\"generation\":{}}}", u64::MAX).as_bytes());
        let e = next_generation(&max, b"", p).unwrap_err();
        assert!(e.to_string().contains("cannot grow"), "{e}");
        let e = next_generation(
            &Content::Unreadable,
            b"\"generation\":99999999999999999999999",
            p,
        )
        .unwrap_err();
        assert!(e.to_string().contains("64 bits"), "{e}");
    }

    #[test]
    fn a_generation_that_was_wiped_out_jumps_past_every_earlier_one() {
        let p = Path::new("/x");
        let before = clock_floor();
        // An empty file (new or emptied), and bytes that name no
        // generation: the clock.
        let empty = next_generation(&Content::Empty, b"", p).unwrap();
        let garbage = next_generation(&Content::Unreadable, b"\0\0xx", p).unwrap();
        for g in [empty, garbage] {
            assert!(g >= before && g <= clock_floor(), "{g}");
            // Far above any counter that started at 1.
            assert!(g > 1_000_000_000_000_000, "{g}");
        }
        // A torn record that still names its generation continues from it.
        let torn = next_generation(&Content::Unreadable, b"{\"generation\":41,\"pi", p);
        assert_eq!(torn.unwrap(), 42);
    }
}
