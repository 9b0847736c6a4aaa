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
        if let Err(e) = read_proc_file("/proc/locks", &mut buf) {
            // A sandbox's /proc, or one mounted with restrictions: holders
            // cannot be named, and the lock itself is asked instead.
            super::note_unavailable(super::Missing::LockTable);
            return Err(e);
        }
        let text = std::str::from_utf8(&buf).map_err(io::Error::other)?;
        Ok(text
            .lines()
            .filter_map(parse_line)
            .filter(|l| keep(l))
            .collect())
    })
}

/// Read a whole /proc file with one open and as few reads as it takes
/// (`/proc` reports size 0, so std's size-guided reads start tiny).
fn read_proc_file(path: &str, buf: &mut Vec<u8>) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    buf.clear();
    if buf.capacity() < 16 * 1024 {
        buf.reserve(16 * 1024);
    }
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
            return Ok(());
        }
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
}
