//! `fstat` of an open lease file. POSIX keeps no birth time: the age is
//! taken from the last status change (creation, rename, link, chmod,
//! write), never older than the file really is, so a file just created or
//! renamed into place is young and given its grace.

use std::os::fd::BorrowedFd;
use std::time::Duration;

pub use crate::platform::common::FileStat;

/// The call named in errors.
pub const CALL: &str = "fstat";

pub fn stat_with_age(fd: BorrowedFd<'_>) -> std::io::Result<FileStat> {
    let st = rustix::fs::fstat(fd)?;
    Ok(FileStat {
        st_mode: st.st_mode as u32,
        st_dev: st.st_dev as u64,
        st_ino: st.st_ino as u64,
        st_nlink: st.st_nlink as u64,
        st_size: st.st_size.max(0) as u64,
        st_uid: st.st_uid,
        st_gid: st.st_gid,
        age: since(st.st_ctime as i64, st.st_ctime_nsec as i64),
        untouched: (st.st_ctime, st.st_ctime_nsec) == (st.st_mtime, st.st_mtime_nsec),
    })
}

fn since(secs: i64, nsecs: i64) -> Option<Duration> {
    let at = std::time::UNIX_EPOCH.checked_add(Duration::new(
        secs.max(0) as u64,
        nsecs.clamp(0, 999_999_999) as u32,
    ))?;
    Some(
        std::time::SystemTime::now()
            .duration_since(at)
            .unwrap_or_default(),
    )
}
