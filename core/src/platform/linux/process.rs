//! Process identity and descriptors, as `/proc` tells them.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

pub use crate::platform::common::{
    alive, current, forget_pid_after_fork, host_name, pid, read_at_most, Credentials, FdScan,
    Identity, KernelKey, OpenFd, INIT_PID_NS,
};

pub(in crate::platform) fn read_identity(pid: u32) -> Identity {
    let proc_self = read_link_bytes(Path::new("/proc/self")).ok();
    Identity {
        pid,
        host: host_name(),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        machine_id: read_trimmed("/etc/machine-id"),
        pid_ns: crate::platform::stat::stat("/proc/self/ns/pid")
            .ok()
            .map(|s| s.st_ino),
        proc_start: start_time(pid),
        proc_is_ours: proc_self.as_deref() == Some(pid.to_string().as_bytes()),
        previous: None,
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// `readlink` with one system call for any path up to `PATH_MAX`.
pub fn read_link_bytes(path: &Path) -> io::Result<Vec<u8>> {
    read_link_into(path)
}

/// One `readlink` into a buffer the kernel fills, not zeroed first: with
/// `fd_path`'s and a record read's, three 4 KiB buffers were cleared on
/// every acquire (a sixth of the cycle's instructions as
/// bench/instructions.py counts them; about 2% of its time).
fn read_link_into<P: rustix::path::Arg>(path: P) -> io::Result<Vec<u8>> {
    const MAX: usize = 4096;
    let mut buf = Vec::with_capacity(MAX);
    let n = rustix::fs::readlinkat_raw(
        rustix::fs::CWD,
        path,
        rustix::buffer::spare_capacity(&mut buf),
    )?;
    if n >= MAX {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    Ok(buf)
}

/// The path the kernel knows an open descriptor by (`/proc/self/fd/N`).
pub fn fd_path(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut link = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let n = write_decimal(&mut link[14..], fd.as_raw_fd() as u32);
    let c = CStr::from_bytes_until_nul(&link[..15 + n])
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    read_link_into(c)
}

fn write_decimal(out: &mut [u8], mut v: u32) -> usize {
    let mut tmp = [0u8; 10];
    let mut i = 0;
    loop {
        tmp[i] = b'0' + (v % 10) as u8;
        i += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for j in 0..i {
        out[j] = tmp[i - 1 - j];
    }
    i
}

/// The name the kernel gives process `pid`: its `comm`, the executable's
/// name (at most 15 bytes, which the process may change), never its
/// arguments, which may hold a secret. Control characters read as `?`.
/// `None` when it cannot be read.
pub fn name(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let text = String::from_utf8_lossy(raw.strip_suffix(b"\n").unwrap_or(&raw));
    let name: String = text
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Start time of a process in clock ticks since boot (field 22 of its main
/// thread's `stat`, which is the process's), or `None` when no such process
/// is visible. Read through `task/PID/`: an emulator such as qemu-user
/// (Docker's way of running another architecture's images) makes up
/// `/proc/self/stat` and `/proc/<its own PID>/stat` for the program it runs,
/// with a start time of its own that can be a tick off the kernel's, which
/// every other process reads.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/task/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Whether the process `pid` is stopped (a SIGSTOP, a job-control stop, a
/// tracer's stop): any of its threads in state `T` or `t` (a stop reaches
/// the threads one by one, and one of them may be in `D` meanwhile).
/// `None` when no such process is visible.
pub fn stopped(pid: u32) -> Option<bool> {
    let state = |stat: &[u8]| {
        let close = stat.iter().rposition(|&b| b == b')')?;
        stat[close + 1..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .copied()
    };
    let main = std::fs::read(format!("/proc/{pid}/task/{pid}/stat")).ok()?;
    let is_stop = |s: Option<u8>| matches!(s, Some(b'T' | b't'));
    if is_stop(state(&main)) {
        return Some(true);
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Some(false);
    };
    Some(
        tasks
            .flatten()
            .any(|t| std::fs::read(t.path().join("stat")).is_ok_and(|stat| is_stop(state(&stat)))),
    )
}

/// Whether the process `pid` that started at `start` (clock ticks since
/// boot) has ended: `Some(true)` when no process has that PID, or when
/// every thread of it has exited (a zombie its parent has not reaped);
/// `Some(false)` while a thread of it runs. `None` when that cannot be
/// told: the PID names a process that started at another time (reused),
/// `/proc` would not say, or it is on its way out. A process on its way
/// out (a thread in `do_exit`, `PF_EXITING`, or one with a SIGKILL pending
/// that has not had a core yet) may have closed its files, so its
/// connections, before the kernel tells its children's `PR_SET_PDEATHSIG`
/// as its last step, so "exited" means its children were told. One look,
/// no wait: a caller that waits on it looks again (the fences).
pub fn exited(pid: u32, start: u64) -> Option<bool> {
    match tasks_exited(pid, start)? {
        Exit::Running => Some(false),
        Exit::Exited => Some(true),
        Exit::Exiting => None,
    }
}

enum Exit {
    Running,
    Exiting,
    Exited,
}

/// One look at every thread of `pid` (see `exited`).
fn tasks_exited(pid: u32, start: u64) -> Option<Exit> {
    // PF_EXITING, include/linux/sched.h.
    const PF_EXITING: u64 = 0x4;
    let leader = match std::fs::read(format!("/proc/{pid}/task/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (alive(pid) == Some(false)).then_some(Exit::Exited)
        }
        Err(_) => return None,
    };
    if parse_start_time(&leader)? != start {
        return None;
    }
    let mut exiting = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = match std::fs::read(task.ok()?.path().join("stat")) {
            Ok(s) => s,
            // That thread is gone already.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        };
        let (state, flags) = parse_state_and_flags(&stat)?;
        if matches!(state, b'Z' | b'X') {
            continue;
        }
        // A thread the SIGKILL has not reached yet (on a busy machine it
        // waits for a core; the thread that closed the connection had one)
        // has it pending: it can run no code of the program again.
        if flags & PF_EXITING == 0 {
            match task_status(pid, &stat)? {
                // That thread is gone since.
                None => continue,
                Some(status) if !sigkill_pending(&status) => return Some(Exit::Running),
                Some(_) => {}
            }
        }
        exiting = true;
    }
    if exiting {
        return Some(Exit::Exiting);
    }
    // A thread started, and the one that started it gone, between the
    // listing and the reads would have been missed: the kernel's count of
    // the process's threads, read after, says whether any lives (a zombie
    // leader counts itself until it is reaped).
    match std::fs::read(format!("/proc/{pid}/task/{pid}/stat")) {
        Ok(stat) if parse_start_time(&stat)? != start => None,
        Ok(stat) => Some(match parse_num_threads(&stat)? {
            0 | 1 => Exit::Exited,
            _ => Exit::Exiting,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            (alive(pid) == Some(false)).then_some(Exit::Exited)
        }
        Err(_) => None,
    }
}

/// The `status` of the thread whose `stat` is `stat` (its TID is field 1):
/// `Some(None)` when that thread is gone since (no such file, or `ESRCH`
/// from a read that began as it went), `None` when it cannot be read.
fn task_status(pid: u32, stat: &[u8]) -> Option<Option<Vec<u8>>> {
    let tid = std::str::from_utf8(stat.split(|&b| b == b' ').next()?).ok()?;
    match std::fs::read(format!("/proc/{pid}/task/{tid}/status")) {
        Ok(s) => Some(Some(s)),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            Some(None)
        }
        Err(_) => None,
    }
}

/// Whether a thread's `status` shows SIGKILL pending, for the thread
/// (`SigPnd`) or its process (`ShdPnd`): a signal that cannot be blocked,
/// caught or ignored, so the thread dies before it runs the program again.
fn sigkill_pending(status: &[u8]) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    status.split(|&b| b == b'\n').any(|line| {
        let Some(hex) = line
            .strip_prefix(b"SigPnd:")
            .or_else(|| line.strip_prefix(b"ShdPnd:"))
        else {
            return false;
        };
        std::str::from_utf8(hex)
            .ok()
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .is_some_and(|m| m & SIGKILL_BIT != 0)
    })
}

/// A task's state letter (field 3) and kernel flags (field 9) from its
/// `stat`, counted from the last `)` as `parse_start_time` does.
fn parse_state_and_flags(stat: &[u8]) -> Option<(u8, u64)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Fields 4 to 8, then 9.
    let flags = fields.nth(5)?.parse().ok()?;
    Some((state, flags))
}

/// How many threads the process has (field 20 of a `stat`).
fn parse_num_threads(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // Fields 3 (state) onwards; field 20 is index 17.
    rest.split_ascii_whitespace().nth(17)?.parse().ok()
}

/// The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_start_time(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // After the name come fields 3 (state) onwards; field 22 is index 19.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

pub fn credentials(pid: u32) -> Option<Credentials> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_credentials(&status)
}

pub fn parse_credentials(status: &str) -> Option<Credentials> {
    // "Uid:\treal\teffective\tsaved\tfilesystem"; access checks use the last.
    let ids = |key: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    Some(Credentials {
        uid: *ids("Uid:")?.get(3)?,
        gid: *ids("Gid:")?.get(3)?,
        groups: ids("Groups:").unwrap_or_default(),
    })
}

/// The descriptor numbers of `pid`.
pub fn fds_of(pid: u32) -> FdScan<Vec<u32>> {
    let dir = format!("/proc/{pid}/fd");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ESRCH) => FdScan::Gone,
                _ => FdScan::Denied,
            }
        }
    };
    FdScan::Found(
        entries
            .flatten()
            .filter_map(|e| {
                std::str::from_utf8(e.file_name().as_bytes())
                    .ok()?
                    .parse()
                    .ok()
            })
            .collect(),
    )
}

/// Does descriptor `fd` of `pid` belong to the open file description that
/// owns the flock lock `key`? Its fdinfo carries the lock line only then.
pub fn fd_holds(pid: u32, fd: u32, key: KernelKey) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .is_ok_and(|info| super::locks::fdinfo_holds(&info, key.major, key.minor, key.ino))
}

/// Find the descriptor of `pid` that owns the lock `key` (as `/proc/locks`
/// names it). Descriptors are first matched by inode number (a `stat`
/// through `/proc/PID/fd/N`), and only those have their fdinfo read.
pub fn holding_fd(pid: u32, key: KernelKey) -> FdScan<u32> {
    find_fd(pid, |fd, st| st.st_ino == key.ino && fd_holds(pid, fd, key))
}

/// For each of the inodes `inos` (all on one device), the descriptors of
/// `pid` open on a file with that inode number, from one pass over its
/// descriptors (a `stat` of each).
pub fn fds_on(pid: u32, inos: &[u64]) -> FdScan<Vec<Vec<OpenFd>>> {
    let fds = match fds_of(pid) {
        FdScan::Found(f) => f,
        FdScan::NotFound => return FdScan::NotFound,
        FdScan::Denied => return FdScan::Denied,
        FdScan::Gone => return FdScan::Gone,
    };
    let mut wanted: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, ino) in inos.iter().enumerate() {
        wanted.entry(*ino).or_default().push(i);
    }
    let mut out = vec![Vec::new(); inos.len()];
    for fd in fds {
        let Ok(st) = crate::platform::stat::stat(format!("/proc/{pid}/fd/{fd}")) else {
            continue;
        };
        for &i in wanted
            .get(&st.st_ino)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            out[i].push(OpenFd {
                fd,
                size: st.st_size.max(0) as u64,
                nlink: st.st_nlink,
            });
        }
    }
    FdScan::Found(out)
}

/// Find the descriptor of `pid` that owns the flock lock on the file `stat`
/// knows as (device, inode). The fdinfo lock line of that very file names
/// it with the kernel's device numbers, so only its inode is compared there.
pub fn holding_fd_of_file(pid: u32, (dev, ino): (u64, u64)) -> FdScan<u32> {
    find_fd(pid, |fd, st| {
        (st.st_dev, st.st_ino) == (dev, ino)
            && std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).is_ok_and(|info| {
                info.lines()
                    .filter(|l| l.starts_with("lock:"))
                    .filter_map(super::locks::parse_line)
                    .any(|l| l.ino == ino)
            })
    })
}

fn find_fd(
    pid: u32,
    mut matches: impl FnMut(u32, &crate::platform::stat::Stat) -> bool,
) -> FdScan<u32> {
    let fds = match fds_of(pid) {
        FdScan::Found(f) => f,
        FdScan::NotFound => return FdScan::NotFound,
        FdScan::Denied => return FdScan::Denied,
        FdScan::Gone => return FdScan::Gone,
    };
    // Highest first: a lease file sidelease holds is numbered above the
    // library's own descriptors (file::watch::order), so it is found
    // without a look at each of those.
    let mut fds = fds;
    fds.sort_unstable_by(|a, b| b.cmp(a));
    for fd in fds {
        let Ok(st) = crate::platform::stat::stat(format!("/proc/{pid}/fd/{fd}")) else {
            continue;
        };
        if matches(fd, &st) {
            return FdScan::Found(fd);
        }
    }
    FdScan::NotFound
}

/// The lock this process holds through `fd`, as the kernel lists it.
pub fn own_lock(fd: BorrowedFd<'_>) -> io::Result<Option<KernelKey>> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .inspect_err(|_| super::note_unavailable(super::Missing::Descriptors))?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("lock:"))
        .filter_map(super::locks::parse_line)
        .find(|l| l.exclusive)
        .map(|l| KernelKey {
            major: l.major,
            minor: l.minor,
            ino: l.ino,
        }))
}

/// The device numbers `/proc/locks` uses for files reached through `fd`:
/// the superblock's, from the mount table (`stat` may say otherwise on
/// overlayfs and btrfs).
pub fn kernel_device(fd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    let mnt_id = info
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .map(str::trim)
        .ok_or_else(|| io::Error::other("no mnt_id in fdinfo"))?;
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    for line in table.lines() {
        let mut f = line.split(' ');
        if f.next() != Some(mnt_id) {
            continue;
        }
        let dev = f
            .nth(1)
            .ok_or_else(|| io::Error::other("short mountinfo line"))?;
        let (ma, mi) = dev
            .split_once(':')
            .ok_or_else(|| io::Error::other("bad mountinfo device"))?;
        let parse = |s: &str| s.parse::<u32>().map_err(io::Error::other);
        return Ok((parse(ma)?, parse(mi)?));
    }
    Err(io::Error::other(format!("mount {mnt_id} not in mountinfo")))
}

/// Read up to `limit` bytes of what `pid`'s descriptor `fd` has open, from
/// offset 0 (for a deleted or moved file, through `/proc/PID/fd/N`).
pub fn read_through_fd(pid: u32, fd: u32, limit: usize) -> io::Result<Vec<u8>> {
    let f = rustix::fs::open(
        format!("/proc/{pid}/fd/{fd}"),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let st = crate::platform::stat::fstat(&f)?;
    if st.file_type() != rustix::fs::FileType::RegularFile {
        return Ok(Vec::new());
    }
    read_at_most(f.as_fd(), st.st_size.max(0) as usize, limit)
}

/// The PID namespace (the inode of `/proc/PID/ns/pid`) of a process this
/// user may look at.
pub fn pid_namespace(pid: u32) -> Option<u64> {
    crate::platform::stat::stat(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|s| s.st_ino)
}

/// Whether nothing can be written into the open file: it is immutable or
/// append-only (`chattr +i`/`+a`), or its mount is read-only.
pub fn unwritable(fd: BorrowedFd<'_>) -> bool {
    use rustix::fs::{AtFlags, StatVfsMountFlags, StatxAttributes, StatxFlags};
    let attrs = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS)
        .map(|x| x.stx_attributes)
        .unwrap_or(StatxAttributes::empty());
    let read_only_mount =
        rustix::fs::fstatvfs(fd).is_ok_and(|v| v.f_flag.contains(StatVfsMountFlags::RDONLY));
    attrs.intersects(StatxAttributes::IMMUTABLE | StatxAttributes::APPEND) || read_only_mount
}

/// Every PID visible in `/proc`.
pub fn all_pids() -> io::Result<Vec<u32>> {
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| {
            std::str::from_utf8(e.file_name().as_bytes())
                .ok()?
                .parse()
                .ok()
        })
        .collect())
}

/// This process's umask, from `/proc/self/status` (reading it with
/// `umask(2)` means setting it, which races with other threads).
pub fn umask() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
}

/// What `stat` says of the file another process has open as `fd`.
pub fn stat_fd(pid: u32, fd: u32) -> io::Result<crate::platform::stat::Stat> {
    Ok(crate::platform::stat::stat(format!("/proc/{pid}/fd/{fd}"))?)
}

/// This program, to start again as a helper: the running binary even if
/// its file was replaced (a package upgrade) since.
pub fn self_exe() -> std::path::PathBuf {
    std::path::PathBuf::from("/proc/self/exe")
}

/// Have the kernel SIGKILL this process when the thread that started it
/// ends (`PR_SET_PDEATHSIG`): a command run by a leader dies with it, so a
/// leader killed outright is succeeded at once. For a child between fork
/// and exec (async-signal-safe). `parent`: the PID that started it; if that
/// one is gone already, the request came too late and this fails.
pub fn end_with_parent(parent: u32) -> io::Result<bool> {
    // SAFETY: prctl and getppid touch no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::getppid() } as u32 != parent {
        return Err(io::Error::other("the process that started it has ended"));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stopped_process_is_told_from_a_running_one() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = c.id();
        assert_eq!(super::stopped(pid), Some(false));
        let signal = |sig| {
            // SAFETY: kill(2) on the child this test started.
            unsafe { libc::kill(pid as i32, sig) };
        };
        signal(libc::SIGSTOP);
        let t0 = std::time::Instant::now();
        while super::stopped(pid) != Some(true) {
            assert!(t0.elapsed().as_secs() < 5, "not seen stopped");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        signal(libc::SIGCONT);
        while super::stopped(pid) != Some(false) {
            assert!(t0.elapsed().as_secs() < 5, "not seen continued");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        c.kill().unwrap();
        c.wait().unwrap();
        assert_eq!(super::stopped(pid), None, "reaped: no such process");
    }

    #[test]
    fn a_pending_sigkill_is_read_from_a_threads_status() {
        let status = |pnd: &str, shd: &str| {
            format!("Name:\tx\nState:\tR (running)\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\nSigBlk:\t0000000000000100\n")
        };
        assert!(!super::sigkill_pending(
            status("0000000000000000", "0000000000000000").as_bytes()
        ));
        assert!(super::sigkill_pending(
            status("0000000000000100", "0000000000000000").as_bytes()
        ));
        assert!(super::sigkill_pending(
            status("0000000000000000", "0000000000004100").as_bytes()
        ));
        // SIGTERM (15) and SIGSTOP (19) pending are not SIGKILL.
        assert!(!super::sigkill_pending(
            status("0000000000004000", "0000000000040000").as_bytes()
        ));
        assert!(!super::sigkill_pending(b""));
    }

    use super::*;

    #[test]
    fn credentials_come_from_the_filesystem_ids() {
        let status =
            "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t50\t51\t52\t53\nGroups:\t7 8 \n";
        let c = parse_credentials(status).unwrap();
        assert_eq!((c.uid, c.gid, c.groups.clone()), (1003, 53, vec![7, 8]));
        assert!(c.may_write(0o600, 1003, 0));
        assert!(!c.may_write(0o400, 1003, 0) && !c.may_write(0o466, 1003, 0));
        assert!(c.may_write(0o660, 0, 8) && !c.may_write(0o640, 0, 8));
        assert!(c.may_write(0o662, 0, 9) && !c.may_write(0o660, 0, 9));
        let me = credentials(pid()).unwrap();
        assert_eq!(me.uid, rustix::process::geteuid().as_raw());
    }

    #[test]
    fn start_time_and_threads_are_fields_22_and_20_even_with_odd_names() {
        let stat = b"4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                     1 2 0 0 20 0 1 0 987654 12345 100 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time(b"garbage"), None);
        assert_eq!(parse_num_threads(stat), Some(1));
        assert_eq!(parse_num_threads(b"garbage"), None);
    }

    #[test]
    fn identity_of_this_process() {
        let id = current();
        assert_eq!(id.pid, std::process::id());
        assert_eq!(pid(), std::process::id());
        assert!(id.proc_start.is_some());
        assert!(id.boot_id.is_some());
        assert!(id.pid_ns.is_some());
        assert!(id.proc_is_ours);
        assert_eq!(start_time(id.pid), id.proc_start);
        assert!(std::ptr::eq(id, current()));
    }

    #[test]
    fn fd_paths_and_own_locks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let canon = std::fs::canonicalize(&p).unwrap();
        assert_eq!(fd_path(f.as_fd()).unwrap(), canon.as_os_str().as_bytes());
        assert_eq!(own_lock(f.as_fd()).unwrap(), None);
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        let k = own_lock(f.as_fd()).unwrap().expect("a lock line");
        let st = crate::platform::stat::fstat(&f).unwrap();
        assert_eq!(k.ino, st.st_ino);
        assert_eq!(kernel_device(f.as_fd()).unwrap(), (k.major, k.minor));
        assert_eq!(
            holding_fd(pid(), k),
            FdScan::Found(f.as_fd().as_raw_fd_u32())
        );
        let bytes = read_through_fd(pid(), f.as_fd().as_raw_fd_u32(), 10).unwrap();
        assert!(bytes.is_empty());
    }

    trait RawU32 {
        fn as_raw_fd_u32(&self) -> u32;
    }
    impl RawU32 for BorrowedFd<'_> {
        fn as_raw_fd_u32(&self) -> u32 {
            use std::os::fd::AsRawFd;
            self.as_raw_fd() as u32
        }
    }
}
