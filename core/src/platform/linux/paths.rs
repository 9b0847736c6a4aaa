//! What the kernel says about a path: its canonical name through an
//! `O_PATH` open (every symlink followed by the kernel, protected ones
//! refused), and its `fs.protected_symlinks` rule.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// The canonical path of an existing file or directory.
pub fn resolve(p: &Path) -> io::Result<PathBuf> {
    let fd = rustix::fs::open(p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    match super::process::fd_path(fd.as_fd()) {
        Ok(b) => Ok(PathBuf::from(OsString::from_vec(b))),
        // No /proc: resolve in user space.
        Err(_) => std::fs::canonicalize(p),
    }
}

/// A descriptor that names `p` itself (a last symlink not followed), for
/// `fstat` and the kernel's name of it, whether or not it can be read.
pub fn open_path(p: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        p,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?)
}

/// Whether the kernel refuses to follow a symlink in a sticky
/// world-writable directory unless the follower or the directory's owner
/// owns it (`fs.protected_symlinks`).
pub fn protected_symlinks() -> bool {
    std::fs::read_to_string("/proc/sys/fs/protected_symlinks").is_ok_and(|s| s.trim() != "0")
}
