//! Who this process is, from `getpid` and `uname` only, and nothing of
//! other processes' descriptors: every look at them answers "cannot see"
//! (`FdScan::Denied`), which every caller takes as unknown.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

pub use crate::platform::common::{
    alive, current, forget_pid_after_fork, host_name, pid, read_at_most, Credentials, FdScan,
    Identity, KernelKey, OpenFd, INIT_PID_NS,
};

use super::{note_unavailable, unsupported, Missing};

pub(in crate::platform) fn read_identity(pid: u32) -> Identity {
    Identity {
        pid,
        host: host_name(),
        boot_id: None,
        machine_id: None,
        pid_ns: None,
        proc_start: None,
        proc_is_ours: false,
        previous: None,
    }
}

pub fn read_link_bytes(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    Ok(std::fs::read_link(path)?.into_os_string().into_vec())
}

/// The kernel's name of an open file: not to be had, so callers keep the
/// name they opened it by.
pub fn fd_path(_fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    Err(unsupported("the name of an open file"))
}

/// No process names without `/proc`.
pub fn name(_pid: u32) -> Option<String> {
    None
}

pub fn start_time(_pid: u32) -> Option<u64> {
    None
}

/// Whether the process `pid` is stopped: not to be told without `/proc`
/// (callers act as if it were).
pub fn stopped(_pid: u32) -> Option<bool> {
    None
}

/// Whether the process `pid` has ended: `Some(true)` when no process has
/// that PID; otherwise unknown (no start time to tell a reused PID by, no
/// zombie to see).
pub fn exited(pid: u32, _start: u64) -> Option<bool> {
    (alive(pid) == Some(false)).then_some(true)
}

pub fn credentials(_pid: u32) -> Option<Credentials> {
    None
}

fn unseen<T>() -> FdScan<T> {
    note_unavailable(Missing::Descriptors);
    FdScan::Denied
}

pub fn fds_of(_pid: u32) -> FdScan<Vec<u32>> {
    unseen()
}

pub fn fd_holds(_pid: u32, _fd: u32, _key: KernelKey) -> bool {
    false
}

pub fn holding_fd(_pid: u32, _key: KernelKey) -> FdScan<u32> {
    unseen()
}

pub fn fds_on(_pid: u32, _inos: &[u64]) -> FdScan<Vec<Vec<OpenFd>>> {
    unseen()
}

pub fn holding_fd_of_file(_pid: u32, _file: (u64, u64)) -> FdScan<u32> {
    unseen()
}

/// Which lock this descriptor holds, as the kernel lists it: unknown.
pub fn own_lock(_fd: BorrowedFd<'_>) -> io::Result<Option<KernelKey>> {
    note_unavailable(Missing::Descriptors);
    Err(unsupported("the locks of a descriptor"))
}

pub fn kernel_device(_fd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    Err(unsupported("the kernel's device number of a mount"))
}

pub fn read_through_fd(_pid: u32, _fd: u32, _limit: usize) -> io::Result<Vec<u8>> {
    note_unavailable(Missing::Descriptors);
    Err(unsupported("another process's descriptors"))
}

pub fn pid_namespace(_pid: u32) -> Option<u64> {
    None
}

/// On a read-only mount (`statvfs`); immutable and append-only flags are
/// not portable.
pub fn unwritable(fd: BorrowedFd<'_>) -> bool {
    use rustix::fs::StatVfsMountFlags;
    rustix::fs::fstatvfs(fd).is_ok_and(|v| v.f_flag.contains(StatVfsMountFlags::RDONLY))
}

pub fn all_pids() -> io::Result<Vec<u32>> {
    note_unavailable(Missing::Descriptors);
    Err(unsupported("the list of processes"))
}

/// Reading the umask means setting it (`umask(2)`), which races with other
/// threads: unknown.
pub fn umask() -> Option<u32> {
    None
}

pub fn stat_fd(_pid: u32, _fd: u32) -> io::Result<crate::platform::stat::Stat> {
    Err(unsupported("another process's descriptors"))
}

/// This program, to start again as a helper, as the system names it (a
/// file replaced since is the new one).
pub fn self_exe() -> std::path::PathBuf {
    std::env::current_exe().unwrap_or_else(|_| std::path::PathBuf::from("sidelease"))
}

/// Nothing ends a command with its parent here: `Ok(false)`, and the
/// command keeps what it inherited until it exits.
pub fn end_with_parent(_parent: u32) -> io::Result<bool> {
    Ok(false)
}
