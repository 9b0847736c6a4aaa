//! Who may open a lease file. `flock` needs only a descriptor, and a
//! read-only one will do, so whoever can open the lease file can take the
//! lease: a new one is opened to exactly those who may write the database.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Mutex;

use rustix::fs::{Gid, Uid};

use crate::error::{Error, Result};
use crate::path;

/// How a lease file is (re)created: its final permission bits, whether the
/// process umask narrows them, and the owner and group it should have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub mode: u32,
    pub umask: bool,
    pub owner: Option<(u32, u32)>,
}

/// The mode a lease file is created with: owner only, until its owner and
/// group are right (see [`apply`]); widening it earlier would let the wrong
/// group open it in between and keep the descriptor.
pub(crate) const CREATE_MODE: u32 = 0o600;

/// For a new lease file of `target`: read and write for exactly the classes
/// (owner, group, other) that may write the target, owned like it; `0600`
/// while the target does not exist. The umask applies.
pub(crate) fn for_target(target: &Path) -> Access {
    match crate::platform::stat::stat(target) {
        Ok(st) => Access {
            mode: for_writers(st.st_mode),
            umask: true,
            owner: Some((st.st_uid, st.st_gid)),
        },
        Err(_) => Access {
            mode: 0o600,
            umask: true,
            owner: None,
        },
    }
}

/// Read and write for each class that has write permission in `mode`, and
/// always for the owner (who may make the target writable at will).
pub(crate) fn for_writers(mode: u32) -> u32 {
    [(0o020, 0o060), (0o002, 0o006)]
        .iter()
        .filter(|(w, _)| mode & w != 0)
        .fold(0o600, |acc, (_, rw)| acc | rw)
}

/// Of an existing lease file, so a copy put back is made exactly like it.
pub(crate) fn of_file(mode: u32, uid: u32, gid: u32) -> Access {
    Access {
        mode: mode & 0o777,
        umask: false,
        owner: Some((uid, gid)),
    }
}

/// This process's umask; owner-only when it cannot be read.
fn umask() -> u32 {
    crate::platform::process::umask().unwrap_or(0o077)
}

/// Make a lease file this process has just created (with [`CREATE_MODE`])
/// what `access` says: first its owner (as root) and group, then its mode.
/// Where the group cannot be given (this user is not a member of it), the
/// file's group gets what others get, since its members are others to the
/// database.
pub(crate) fn apply(fd: BorrowedFd<'_>, access: &Access) {
    let Ok(st) = crate::platform::stat::fstat(fd) else {
        return;
    };
    let mut mode = access.mode;
    if access.umask {
        mode &= !umask();
    }
    if let Some((uid, gid)) = access.owner {
        let owner =
            (rustix::process::geteuid().is_root() && st.st_uid != uid).then(|| Uid::from_raw(uid));
        let group = (st.st_gid != gid).then(|| Gid::from_raw(gid));
        if (owner.is_some() || group.is_some())
            && rustix::fs::fchown(fd, owner, group).is_err()
            && group.is_some()
        {
            mode = (mode & 0o707) | ((mode & 0o007) << 3);
        }
    }
    if mode != st.st_mode & 0o777 {
        let _ = rustix::fs::fchmod(fd, crate::platform::stat::mode(mode));
    }
}

/// Refuse a lease file someone else planted in a sticky directory that
/// others may write (such as `/tmp`): whoever owns the file decides who may
/// open it, and so who may take the lease. The rule is the kernel's
/// `fs.protected_regular`, which refuses `O_CREAT` over such a file; the
/// lease file is opened without `O_CREAT` first, so it is checked here. The
/// owner may be this user, root, the directory's owner or the database's
/// owner. There, a second name for the file is refused too (a hard link
/// made to a file someone may open is a planted lease file by another
/// name). `file` is (device, inode, owner, links); the directory is looked
/// at once per file and process.
pub(crate) fn not_planted(
    lease_path: &Path,
    target: &Path,
    (dev, ino, uid, nlink): (u64, u64, u32, u64),
) -> Result<()> {
    let cached = vetted((dev, ino, uid));
    let shared_sticky = match cached {
        Some(s) => s,
        None => {
            let dir = path::parent_of(lease_path);
            let Ok(d) = crate::platform::stat::stat(dir) else {
                return Ok(());
            };
            let shared_sticky = d.st_mode & 0o1000 != 0 && d.st_mode & 0o022 != 0;
            if shared_sticky
                && uid != 0
                && uid != d.st_uid
                && uid != rustix::process::geteuid().as_raw()
                && crate::platform::stat::stat(target).map_or(true, |t| t.st_uid != uid)
            {
                return Err(refused(
                    lease_path,
                    format!(
                        "the lease file belongs to uid {uid}, who owns neither the directory \
                         nor the database"
                    ),
                ));
            }
            vet((dev, ino, uid), shared_sticky);
            shared_sticky
        }
    };
    if shared_sticky && nlink > 1 {
        return Err(refused(
            lease_path,
            format!("the lease file has {nlink} names (hard links)"),
        ));
    }
    Ok(())
}

/// Lease files (device, inode, owner) found not planted, and whether their
/// directory is sticky and shared. Its own lock, only ever tried: the
/// holder's watch checks a file it puts back while holding the lease's
/// state, so waiting here could deadlock against a release (and after a
/// fork the lock may belong to a thread that is gone). Not getting the lock
/// only means looking at the directory again.
static VETTED: Mutex<Option<HashMap<FileId, bool>>> = Mutex::new(None);

/// A file as (device, inode, owner).
type FileId = (u64, u64, u32);

fn vetted(file: FileId) -> Option<bool> {
    let g = VETTED.try_lock().ok()?;
    g.as_ref()?.get(&file).copied()
}

fn vet(file: FileId, shared_sticky: bool) {
    if let Ok(mut g) = VETTED.try_lock() {
        g.get_or_insert_with(HashMap::new)
            .insert(file, shared_sticky);
    }
}

fn refused(lease_path: &Path, why: String) -> Error {
    Error::io(
        "open",
        lease_path,
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{why}, in a sticky directory others may write: it may have been planted to \
                 control the lease, so it is refused (remove it as its owner or root, or keep \
                 the lease in a directory others cannot write)"
            ),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_get_read_and_write_and_nobody_else_does() {
        assert_eq!(for_writers(0o100644), 0o600);
        assert_eq!(for_writers(0o100664), 0o660);
        assert_eq!(for_writers(0o100666), 0o666);
        assert_eq!(for_writers(0o100444), 0o600);
        assert_eq!(for_writers(0o40755), 0o600);
        assert_eq!(for_writers(0o100602), 0o606);
    }

    #[test]
    fn a_missing_target_gives_owner_only() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            for_target(&d.path().join("nope")),
            Access {
                mode: 0o600,
                umask: true,
                owner: None
            }
        );
    }
}
