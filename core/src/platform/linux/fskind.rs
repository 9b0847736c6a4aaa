//! Which filesystem a lease directory is on, and whether `flock` can be
//! trusted there.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

pub use crate::platform::common::FsKind;

/// Magic numbers of `statfs(2)`, compared as u32. Local filesystems pass;
/// network, cluster and FUSE filesystems are refused, and so is anything this
/// table does not know.
const KNOWN: &[(u32, &str, bool)] = &[
    (0xEF53, "ext2/3/4", true),
    (0x5846_5342, "xfs", true),
    (0x9123_683E, "btrfs", true),
    (0x0102_1994, "tmpfs", true),
    (0x794C_7630, "overlayfs", true),
    (0x2FC1_2FC1, "zfs", true),
    (0xF2F5_2010, "f2fs", true),
    (0xCA45_1A4E, "bcachefs", true),
    (0x8584_58F6, "ramfs", true),
    (0x6969, "nfs", false),
    (0x517B, "smb", false),
    (0xFF53_4D42, "cifs", false),
    (0xFE53_4D42, "smb2", false),
    (0x6573_5546, "fuse", false),
    (0x0102_1997, "9p", false),
    (0x00C3_6400, "ceph", false),
    (0x5346_414F, "afs", false),
    (0x6B41_4653, "afs", false),
    (0x7375_7245, "coda", false),
    (0x7461_636F, "ocfs2", false),
    (0x0116_1970, "gfs2", false),
    (0x4750_4653, "gpfs", false),
    (0x0BD0_0BD0, "lustre", false),
    (0x9FA0, "proc", false),
    (0x6265_6572, "sysfs", false),
];

pub fn classify(magic: u32) -> FsKind {
    KNOWN
        .iter()
        .find(|(m, _, _)| *m == magic)
        .map(|&(magic, name, local)| FsKind { magic, name, local })
        .unwrap_or(FsKind {
            magic,
            name: "an unknown filesystem",
            local: false,
        })
}

pub fn of_dir(dir: &Path) -> Result<FsKind> {
    let st = rustix::fs::statfs(dir).map_err(|e| Error::io("statfs", dir, e))?;
    // f_type is a signed word on x86-64; the magic is its low 32 bits.
    Ok(classify(st.f_type as u32))
}

/// Refuse a lease directory whose filesystem is not known to be local,
/// unless the caller allowed it.
pub fn check_dir(dir: &Path, allow_unsupported: bool) -> Result<FsKind> {
    let kind = of_dir(dir)?;
    if kind.local || allow_unsupported {
        return Ok(kind);
    }
    Err(Error::UnsupportedFilesystem {
        path: dir.to_path_buf(),
        fstype: kind.name.to_string(),
        magic: kind.magic,
    })
}

/// Devices already found local, so a lease file on them needs no `fstatfs`
/// per acquisition (lock-free: it is read right after `fork` too).
static LOCAL: [AtomicU64; 32] = [const { AtomicU64::new(0) }; 32];
static NEXT: AtomicU64 = AtomicU64::new(0);

fn known_local(dev: u64) -> bool {
    LOCAL
        .iter()
        .any(|d| d.load(Ordering::Relaxed) == dev.wrapping_add(1))
}

fn remember_local(dev: u64) {
    let i = NEXT.fetch_add(1, Ordering::Relaxed) as usize % LOCAL.len();
    LOCAL[i].store(dev.wrapping_add(1), Ordering::Relaxed);
}

/// Refuse an open lease file (device `dev` by `fstat`) whose filesystem is
/// not known to be local; the verdict is remembered per device.
pub fn check_fd(fd: BorrowedFd<'_>, dev: u64, path: &Path, allow_unsupported: bool) -> Result<()> {
    if allow_unsupported || known_local(dev) {
        return Ok(());
    }
    let st = rustix::fs::fstatfs(fd).map_err(|e| Error::io("fstatfs", path, e))?;
    let kind = classify(st.f_type as u32);
    if kind.local {
        remember_local(dev);
        return Ok(());
    }
    Err(Error::UnsupportedFilesystem {
        path: crate::path::parent_of(path).to_path_buf(),
        fstype: kind.name.to_string(),
        magic: kind.magic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_sorts_local_from_remote() {
        assert!(classify(0xEF53).local);
        assert!(classify(0x0102_1994).local);
        assert_eq!(classify(0x6969).name, "nfs");
        assert!(!classify(0x6573_5546).local);
        assert!(!classify(0xFF53_4D42).local);
        assert!(!classify(0x1234_5678).local);
    }

    #[test]
    fn refusal_names_the_filesystem_and_the_override() {
        let e = Error::UnsupportedFilesystem {
            path: "/mnt/share".into(),
            fstype: "nfs".into(),
            magic: 0x6969,
        };
        let text = e.to_string();
        assert!(
            text.contains("nfs") && text.contains("allow_unsupported_fs"),
            "{text}"
        );
    }

    #[test]
    fn temp_dir_is_local() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_dir(dir.path(), false).is_ok());
    }
}
