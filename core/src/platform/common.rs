//! What both implementations share: the shapes of their answers, and the
//! few steps that are plain POSIX (a cached PID, reading a file whole).

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::time::Duration;

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO`): a process
/// whose `/proc/self/ns/pid` has it sees every process of the machine.
pub const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// Who this process is, for the holder record. Fields the platform cannot
/// provide are `None`.
#[derive(Debug, Clone)]
pub struct Identity {
    pub pid: u32,
    pub host: Option<String>,
    pub boot_id: Option<String>,
    pub machine_id: Option<String>,
    pub pid_ns: Option<u64>,
    pub proc_start: Option<u64>,
    /// Whether `/proc` is this process's own view (so `/proc/locks` lists
    /// the locks of every process this PID namespace can see).
    pub proc_is_ours: bool,
    /// The identity this one replaced (a forked parent's), kept reachable.
    pub(super) previous: Option<&'static Identity>,
}

impl Identity {
    /// Can this process see every lock and process on the machine? Only in
    /// the initial PID namespace with its own `/proc`: a child namespace's
    /// `/proc/locks` silently omits locks held outside it.
    pub fn sees_everything(&self) -> bool {
        self.proc_is_ours && self.pid_ns == Some(INIT_PID_NS)
    }
}

static PID: AtomicU32 = AtomicU32::new(0);

/// This process's PID without a system call (cached; the fork handler
/// forgets it in the child).
pub fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = rustix::process::getpid().as_raw_nonzero().get() as u32;
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// Fork child handler: async-signal-safe (one atomic store).
pub fn forget_pid_after_fork() {
    PID.store(0, Ordering::Relaxed);
}

/// This process's identity, computed once per PID: a forked child sees its
/// own, and the lookup takes no lock (it may run right after `fork`).
pub fn current() -> &'static Identity {
    static CURRENT: AtomicPtr<Identity> = AtomicPtr::new(std::ptr::null_mut());
    let pid = pid();
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: every pointer stored is a leaked Box, never freed.
    if let Some(id) = unsafe { p.as_ref() } {
        if id.pid == pid {
            return id;
        }
    }
    let mut id = super::imp::process::read_identity(pid);
    // SAFETY: as above.
    id.previous = unsafe { p.as_ref() };
    let fresh: &'static mut Identity = Box::leak(Box::new(id));
    CURRENT.store(fresh, Ordering::Release);
    fresh
}

/// This machine's host name (`uname`), as records name it.
pub fn host_name() -> Option<String> {
    rustix::system::uname()
        .nodename()
        .to_str()
        .ok()
        .map(str::to_owned)
}

/// Whether a process `pid` exists (`kill(pid, 0)`: no signal is sent); a
/// process this user may not signal exists. `None` for a PID no process
/// can have.
pub fn alive(pid: u32) -> Option<bool> {
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    match rustix::process::test_kill_process(p) {
        Ok(()) | Err(rustix::io::Errno::PERM) => Some(true),
        Err(rustix::io::Errno::SRCH) => Some(false),
        Err(_) => None,
    }
}

/// What a look at another process's descriptors found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdScan<T> {
    Found(T),
    NotFound,
    /// `/proc/PID/fd` could not be read: another user, or a non-dumpable
    /// process. Nothing can be said of its descriptors.
    Denied,
    /// No such process.
    Gone,
}

/// Who a process acts as for file permissions: its filesystem uid and gid
/// and its supplementary groups (from `/proc/PID/status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Would the kernel let this process write a file with this mode,
    /// owner and group? (Root may; ACLs and capabilities other than root's
    /// are not considered.)
    pub fn may_write(&self, mode: u32, uid: u32, gid: u32) -> bool {
        if self.uid == 0 {
            return true;
        }
        if self.uid == uid {
            return mode & 0o200 != 0;
        }
        if self.gid == gid || self.groups.contains(&gid) {
            return mode & 0o020 != 0;
        }
        mode & 0o002 != 0
    }
}

/// A lock as the kernel lists it: device numbers as `/proc/locks` prints
/// them (which on overlayfs or btrfs differ from what `stat` says) and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelKey {
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
}

/// A descriptor of another process on a file: its number, and the file's
/// size and link count when it was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFd {
    pub fd: u32,
    pub size: u64,
    pub nlink: u64,
}

/// Read a regular file from offset 0: one `pread` sized from `hint` (its
/// `st_size`), more only if the file grew; at most `limit + 1` bytes, so an
/// oversized file is seen as such.
pub fn read_at_most(fd: BorrowedFd<'_>, hint: usize, limit: usize) -> io::Result<Vec<u8>> {
    let cap = limit + 1;
    // Read into spare capacity, not a zeroed buffer: the kernel fills what
    // is read, and clearing the rest cost every acquire as much as the read.
    let mut size = (hint + 4096).min(cap);
    let mut buf = Vec::with_capacity(size);
    loop {
        let at = buf.len();
        let want = size - at;
        buf.reserve_exact(want);
        let spare = &mut buf.spare_capacity_mut()[..want];
        match rustix::io::pread(fd, spare, at as u64) {
            Ok(([], _)) => break,
            Ok((read, _)) => {
                let n = read.len();
                // SAFETY: pread initialized these `n` bytes of the spare capacity.
                unsafe { buf.set_len(at + n) };
                if buf.len() < size {
                    // A short read of a regular file is its end.
                    break;
                }
                if size == cap {
                    break;
                }
                size = (size * 2).min(cap);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf)
}

/// One granted `flock` lock as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlockLock {
    pub pid: u32,
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
    pub exclusive: bool,
}

impl FlockLock {
    pub fn on_device(&self, major: u32, minor: u32) -> bool {
        self.major == major && self.minor == minor
    }
}

/// The filesystem a lease directory is on, and whether `flock` can be
/// trusted there (`local`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsKind {
    pub magic: u32,
    pub name: &'static str,
    pub local: bool,
}

/// What `statx` says of an open lease file.
pub struct FileStat {
    pub st_mode: u32,
    pub st_dev: u64,
    pub st_ino: u64,
    pub st_nlink: u64,
    pub st_size: u64,
    pub st_uid: u32,
    pub st_gid: u32,
    pub age: Option<Duration>,
    /// Whether nothing happened to the inode since its content was last
    /// written (no rename, link, chmod: status-change time = modification
    /// time).
    pub untouched: bool,
}

impl FileStat {
    /// The file type, from `st_mode`.
    pub fn file_type(&self) -> rustix::fs::FileType {
        super::stat::file_type(self.st_mode)
    }
}

#[cfg(test)]
mod tests {
    use super::read_at_most;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn read(content: &[u8], hint: usize, limit: usize) -> Vec<u8> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(content).unwrap();
        read_at_most(f.as_fd(), hint, limit).unwrap()
    }

    #[test]
    fn reads_the_whole_file_up_to_one_byte_past_the_limit() {
        let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(read(b"", 0, 100), b"");
        assert_eq!(read(b"record", 6, 100), b"record");
        // Larger than the first read (hint + 4 KiB): the buffer grows.
        assert_eq!(read(&big, 0, 100_000), big);
        // A hint that undersells or oversells the size changes nothing.
        assert_eq!(read(&big, 40_000, 100_000), big);
        assert_eq!(read(&big[..10], 1 << 20, 100_000), &big[..10]);
        // Oversized: limit + 1 bytes, so the caller sees it is too big.
        assert_eq!(read(&big, 0, 9_999), &big[..10_000]);
        assert_eq!(read(&big, 0, 0), &big[..1]);
        assert_eq!(read(&big[..4097], 0, 4096), &big[..4097]);
    }
}
