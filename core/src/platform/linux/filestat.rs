//! `fstat` plus the file's age, in the one system call `statx` makes.

use std::os::fd::BorrowedFd;
use std::time::Duration;

pub use crate::platform::common::FileStat;

/// The call named in errors.
pub const CALL: &str = "statx";

pub fn stat_with_age(fd: BorrowedFd<'_>) -> std::io::Result<FileStat> {
    use rustix::fs::{AtFlags, StatxFlags};
    let x = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
    )?;
    let has_btime = x.stx_mask & StatxFlags::BTIME.bits() != 0;
    let age = has_btime.then(|| {
        let born = std::time::UNIX_EPOCH
            + Duration::new(x.stx_btime.tv_sec.max(0) as u64, x.stx_btime.tv_nsec);
        std::time::SystemTime::now()
            .duration_since(born)
            .unwrap_or_default()
    });
    let untouched =
        (x.stx_ctime.tv_sec, x.stx_ctime.tv_nsec) == (x.stx_mtime.tv_sec, x.stx_mtime.tv_nsec);
    Ok(FileStat {
        st_mode: u32::from(x.stx_mode),
        st_dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
        st_ino: x.stx_ino,
        st_nlink: u64::from(x.stx_nlink),
        st_size: x.stx_size,
        st_uid: x.stx_uid,
        st_gid: x.stx_gid,
        age,
        untouched,
    })
}
