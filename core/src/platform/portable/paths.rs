//! Paths as `realpath(3)` resolves them.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

pub fn resolve(p: &Path) -> io::Result<PathBuf> {
    std::fs::canonicalize(p)
}

/// A descriptor of `p` itself (a last symlink not followed): opened for
/// reading, so a file this user cannot read cannot be named this way.
pub fn open_path(p: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        p,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )?)
}

/// No such rule is known to hold: symlinks are followed as the kernel
/// follows them.
pub fn protected_symlinks() -> bool {
    false
}
