//! `stat`, `lstat` and `fstat` with one set of field widths on every target.
//!
//! The kernel's `struct stat` differs between targets: `st_nlink` is a `u64`
//! on Linux x86-64 and a `u32` on Linux arm64, `st_mode` a `u16` and
//! `st_dev` an `i32` on macOS. Code outside this folder compares devices,
//! inodes and modes across calls and keys maps with them, so it sees the
//! widest form, and rustix's mode and file-type constructors are reached
//! through here, where the narrowing back is written once.

use std::os::fd::AsFd;

use rustix::fs::{FileType, Mode, RawMode};
use rustix::path::Arg;

/// The fields of `struct stat` this library reads, widened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub st_dev: u64,
    pub st_ino: u64,
    /// The file type and permission bits (`S_IFMT | 0o7777`).
    pub st_mode: u32,
    pub st_nlink: u64,
    pub st_uid: u32,
    pub st_gid: u32,
    pub st_size: i64,
}

impl Stat {
    // The casts widen (or keep) each field: the source widths are the
    // target's, never wider than these.
    #[allow(clippy::unnecessary_cast)]
    fn of(st: &rustix::fs::Stat) -> Stat {
        Stat {
            st_dev: st.st_dev as u64,
            st_ino: st.st_ino as u64,
            st_mode: st.st_mode as u32,
            st_nlink: st.st_nlink as u64,
            st_uid: st.st_uid,
            st_gid: st.st_gid,
            st_size: st.st_size as i64,
        }
    }

    /// The file type, from `st_mode`.
    pub fn file_type(&self) -> FileType {
        file_type(self.st_mode)
    }

    /// `(device, inode)`: what names one file while it exists.
    pub fn key(&self) -> (u64, u64) {
        (self.st_dev, self.st_ino)
    }
}

/// `stat(2)`: follows a final symbolic link.
pub fn stat<P: Arg>(path: P) -> rustix::io::Result<Stat> {
    rustix::fs::stat(path).map(|st| Stat::of(&st))
}

/// `lstat(2)`: a final symbolic link is itself the answer.
pub fn lstat<P: Arg>(path: P) -> rustix::io::Result<Stat> {
    rustix::fs::lstat(path).map(|st| Stat::of(&st))
}

/// `fstat(2)` of an open descriptor.
pub fn fstat<Fd: AsFd>(fd: Fd) -> rustix::io::Result<Stat> {
    rustix::fs::fstat(fd).map(|st| Stat::of(&st))
}

/// The file type in a widened `st_mode`.
pub fn file_type(st_mode: u32) -> FileType {
    FileType::from_raw_mode(raw_mode(st_mode))
}

/// Permission bits (`0o7777` at most) as rustix's `Mode`: every target's
/// `mode_t` holds them.
pub fn mode(bits: u32) -> Mode {
    Mode::from_raw_mode(raw_mode(bits & 0o7777))
}

// `mode_t` is `u32` on Linux and `u16` on macOS; type and permission bits
// fit in 16 bits on both.
#[allow(clippy::unnecessary_cast)]
fn raw_mode(bits: u32) -> RawMode {
    bits as RawMode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_of_a_file_matches_its_descriptor() {
        // A scratch file in a directory the test owns, gone with it.
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let path = dir.join("f");
        let f = std::fs::File::create(&path).unwrap();
        let by_fd = fstat(&f).unwrap();
        let by_path = stat(&path).unwrap();
        assert_eq!(by_fd, by_path);
        assert_eq!(by_fd.file_type(), FileType::RegularFile);
        assert_eq!(by_fd.st_nlink, 1);
        assert_eq!(lstat(dir).unwrap().file_type(), FileType::Directory);
    }

    #[test]
    fn mode_keeps_permission_bits_only() {
        assert_eq!(mode(0o100644).bits(), Mode::from_raw_mode(0o644).bits());
        assert_eq!(mode(0o4755).bits(), Mode::from_raw_mode(0o4755).bits());
    }
}
