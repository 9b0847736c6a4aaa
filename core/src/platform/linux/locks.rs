//! Parsers for the kernel's lock listings: `/proc/locks` and the `lock:` lines
//! of `/proc/PID/fdinfo/FD`. Both print one lock per line in the same form:
//! `N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INO START END` (device in hex).

use std::cell::RefCell;
use std::io;

pub use crate::platform::common::FlockLock;

/// Parse one lock line (with or without the `lock:` prefix of fdinfo).
/// Returns `None` for waiters, non-flock locks and lines it does not know.
pub fn parse_line(line: &str) -> Option<FlockLock> {
    let line = line.strip_prefix("lock:").unwrap_or(line);
    let mut it = line.split_ascii_whitespace();
    let _id = it.next()?;
    let kind = it.next()?;
    if kind != "FLOCK" {
        // Includes "->" (a blocked waiter), POSIX, OFDLCK, LEASE, DELEG.
        return None;
    }
    let _advisory = it.next()?;
    let exclusive = match it.next()? {
        "WRITE" => true,
        "READ" => false,
        _ => return None,
    };
    let pid: i64 = it.next()?.parse().ok()?;
    let mut dev = it.next()?.splitn(3, ':');
    let major = u32::from_str_radix(dev.next()?, 16).ok()?;
    let minor = u32::from_str_radix(dev.next()?, 16).ok()?;
    let ino = dev.next()?.parse().ok()?;
    Some(FlockLock {
        pid: u32::try_from(pid).ok()?,
        major,
        minor,
        ino,
        exclusive,
    })
}

/// Every granted flock lock on one device, as `/proc/locks` lists them now.
/// The listing grows with the machine's lock count, so only the lines of the
/// device asked about are kept, and the read buffer is reused per thread.
pub fn flock_locks_on(major: u32, minor: u32) -> io::Result<Vec<FlockLock>> {
    flock_locks_where(|l| l.on_device(major, minor))
}

/// Every granted exclusive flock lock, on any device (a former lease file
/// may sit on a filesystem the directory was since mounted over).
pub fn exclusive_flock_locks() -> io::Result<Vec<FlockLock>> {
    flock_locks_where(|l| l.exclusive)
}

fn flock_locks_where(keep: impl Fn(&FlockLock) -> bool) -> io::Result<Vec<FlockLock>> {
    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        let mut last: Vec<u8> = Vec::new();
        let mut read = || -> io::Result<(Vec<FlockLock>, usize, bool)> {
            let pages = match read_proc_file("/proc/locks", &mut buf) {
                Ok(pages) => pages,
                Err(e) => {
                    // A sandbox's /proc, or one mounted with restrictions:
                    // holders cannot be named, and the lock itself is asked
                    // instead.
                    super::note_unavailable(super::Missing::LockTable);
                    return Err(e);
                }
            };
            let text = std::str::from_utf8(&buf).map_err(io::Error::other)?;
            // Whole listings compared, not the locks kept: a change among
            // the others (POSIX locks, other devices) moves this one's
            // entries across pages all the same.
            let same = *buf == last;
            if pages > 1 || !last.is_empty() {
                last.clear();
                last.extend_from_slice(&buf);
            }
            Ok((parse_listing(text, &keep), pages, same))
        };
        let (first, pages, _) = read()?;
        settled(first, pages, || read().map(|(l, _, same)| (l, same)))
    })
}

/// How many more times a listing that took several reads is read for two
/// that agree.
const REREADS: usize = 3;

/// The kernel prints `/proc/locks` a page per read, taking its lock for
/// each page only, and finds its place again by counting entries: a lock
/// taken between two pages (added at the head of the list) shows the last
/// entry of the page before again, and one let go before the reader's place
/// hides the next one. A listing that fit one read is whole. Otherwise it
/// is read again until two in a row are the same text (nothing moved while
/// either was read); a table that never stops changing gives every lock any read saw,
/// since each caller checks a listed lock against the holder's descriptors
/// before naming it, while a lock missed is a holder missed.
fn settled(
    first: Vec<FlockLock>,
    pages: usize,
    mut again: impl FnMut() -> io::Result<(Vec<FlockLock>, bool)>,
) -> io::Result<Vec<FlockLock>> {
    if pages <= 1 {
        return Ok(first);
    }
    let mut seen = first;
    for _ in 0..REREADS {
        let (next, same) = again()?;
        if same {
            return Ok(next);
        }
        seen.extend_from_slice(&next);
        seen.sort_unstable();
        seen.dedup();
    }
    Ok(seen)
}

/// The listing's locks that `keep` keeps, sorted, each once.
fn parse_listing(text: &str, keep: impl Fn(&FlockLock) -> bool) -> Vec<FlockLock> {
    let mut locks: Vec<FlockLock> = text
        .lines()
        .filter_map(parse_line)
        .filter(|l| keep(l))
        .collect();
    locks.sort_unstable();
    locks.dedup();
    locks
}

/// Read a whole /proc file with one open and as few reads as it takes
/// (`/proc` reports size 0, so std's size-guided reads start tiny). Returns
/// how many reads brought bytes.
fn read_proc_file(path: &str, buf: &mut Vec<u8>) -> io::Result<usize> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    buf.clear();
    if buf.capacity() < 16 * 1024 {
        buf.reserve(16 * 1024);
    }
    let mut pages = 0;
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity());
        }
        let spare = buf.spare_capacity_mut();
        let (filled, _) = match rustix::io::read(&fd, spare) {
            Ok(r) => r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let n = filled.len();
        if n == 0 {
            return Ok(pages);
        }
        pages += 1;
        // SAFETY: `read` initialised the first `n` spare bytes.
        unsafe { buf.set_len(buf.len() + n) };
    }
}

/// Does this fdinfo text carry a flock line for the given inode (that is, is
/// this descriptor one of the open file description that owns the lock)?
pub fn fdinfo_holds(fdinfo: &str, major: u32, minor: u32, ino: u64) -> bool {
    fdinfo
        .lines()
        .filter(|l| l.starts_with("lock:"))
        .filter_map(parse_line)
        .any(|l| l.on_device(major, minor) && l.ino == ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flock_lines_and_skips_the_rest() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 4243 fd:01:1234567 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 99 00:1d:10 0 EOF\n\
                    3: FLOCK  ADVISORY  READ  7 00:2d:42 0 EOF\n\
                    4: OFDLCK ADVISORY  WRITE -1 00:06:1 0 EOF\n\
                    garbage\n";
        let got: Vec<_> = text.lines().filter_map(parse_line).collect();
        assert_eq!(
            got,
            vec![
                FlockLock {
                    pid: 4242,
                    major: 0xfd,
                    minor: 1,
                    ino: 1234567,
                    exclusive: true
                },
                FlockLock {
                    pid: 7,
                    major: 0,
                    minor: 0x2d,
                    ino: 42,
                    exclusive: false
                },
            ]
        );
    }

    #[test]
    fn fdinfo_lock_lines() {
        let info = "pos:\t0\nflags:\t02100002\nmnt_id:\t30\nino:\t77\n\
                    lock:\t1: FLOCK  ADVISORY  WRITE 10 08:01:77 0 EOF\n";
        assert!(fdinfo_holds(info, 8, 1, 77));
        assert!(!fdinfo_holds(info, 8, 1, 78));
        assert!(!fdinfo_holds(info, 8, 2, 77));
        assert!(!fdinfo_holds("pos:\t0\nino:\t77\n", 8, 1, 77));
    }

    #[test]
    fn reads_this_machines_proc_locks() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("x")).unwrap();
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        let st = crate::platform::stat::fstat(&f).unwrap();
        let (ma, mi) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
        let locks = flock_locks_on(ma, mi).unwrap();
        let me = std::process::id();
        assert!(locks
            .iter()
            .any(|l| l.ino == st.st_ino && l.pid == me && l.exclusive));
    }

    fn lock(pid: u32, ino: u64) -> FlockLock {
        FlockLock {
            pid,
            major: 8,
            minor: 1,
            ino,
            exclusive: true,
        }
    }

    #[test]
    fn a_lock_listed_twice_is_one_lock() {
        let text = "1: FLOCK  ADVISORY  WRITE 10 08:01:77 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 9 08:01:5 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 10 08:01:77 0 EOF\n";
        assert_eq!(
            parse_listing(text, |_| true),
            vec![lock(9, 5), lock(10, 77)]
        );
    }

    #[test]
    fn a_listing_of_several_pages_is_read_until_two_agree() {
        // One page: whole, never read again.
        let once = settled(vec![lock(1, 1)], 1, || panic!("read again")).unwrap();
        assert_eq!(once, vec![lock(1, 1)]);
        // The first read missed lock 2; the next two are the same text.
        let mut reads = vec![
            (vec![lock(1, 1), lock(2, 2)], false),
            (vec![lock(1, 1), lock(2, 2)], true),
        ]
        .into_iter();
        let got = settled(vec![lock(1, 1)], 3, || Ok(reads.next().unwrap())).unwrap();
        assert_eq!(got, vec![lock(1, 1), lock(2, 2)]);
        assert_eq!(reads.len(), 0);
        // Never two alike: every lock any read saw.
        let mut n = 1;
        let got = settled(vec![lock(1, 1)], 3, || {
            n += 1;
            Ok((vec![lock(1, 1), lock(n, n as u64)], false))
        })
        .unwrap();
        assert_eq!(n, 1 + REREADS as u32);
        assert_eq!(got, (1..=n).map(|i| lock(i, i as u64)).collect::<Vec<_>>());
    }
}
