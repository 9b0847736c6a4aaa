//! POSIX says nothing of a filesystem's type (`statvfs` has no such
//! field), so a network filesystem cannot be told from a local one and is
//! not refused: docs/platforms.md says so, and `allow_unsupported_fs`
//! changes nothing here.

use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::error::Result;

pub use crate::platform::common::FsKind;

const UNKNOWN: FsKind = FsKind {
    magic: 0,
    name: "a filesystem of unknown type",
    local: false,
};

pub fn of_dir(_dir: &Path) -> Result<FsKind> {
    Ok(UNKNOWN)
}

pub fn check_dir(dir: &Path, _allow_unsupported: bool) -> Result<FsKind> {
    of_dir(dir)
}

pub fn check_fd(_fd: BorrowedFd<'_>, _dev: u64, _path: &Path, _allow: bool) -> Result<()> {
    Ok(())
}
