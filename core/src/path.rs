//! From the caller's target to the one lease file every spelling of it names.
//!
//! Resolution happens in the kernel, so it obeys `fs.protected_symlinks` and
//! costs the same at any depth. Only the target's last component needs a
//! look: when it is not a symlink, `<target as spelled><suffix>` reaches the
//! same directory entry as the canonical spelling (the kernel follows every
//! directory symlink on the way), and the canonical path is read back from
//! the opened lease file (`/proc/self/fd/N`). A last component that is a
//! symlink, `.` or `..` is resolved through an `O_PATH` open of the target.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::platform::{paths, process};

/// A lease file as the caller's spelling reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Spelled {
    /// The lease file's path as it will be opened (absolute).
    pub lease: PathBuf,
    /// Its final component: `<target name><suffix>`.
    pub name: OsString,
}

/// Symlink hops followed by hand for a dangling target (as the kernel's own
/// limit, so a loop ends in an error rather than forever).
const MAX_LINK_HOPS: usize = 40;

pub fn validate_target(target: &Path) -> Result<()> {
    let bytes = target.as_os_str().as_bytes();
    if bytes.is_empty() {
        return Err(Error::invalid("target", "is an empty path"));
    }
    if bytes.contains(&0) {
        return Err(Error::invalid(
            "target",
            format!("{:?} contains a NUL byte", target),
        ));
    }
    Ok(())
}

/// Spell the lease file of `target`: one `readlink` of the target in the
/// common case (not a symlink: EINVAL; missing: ENOENT).
pub(crate) fn spell(target: &Path, suffix: &str) -> Result<Spelled> {
    validate_target(target)?;
    let trimmed = trim_trailing_slashes(target);
    let last = trimmed.file_name();
    let plain = match last {
        Some(_) => match process::read_link_bytes(trimmed) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(Error::io("open", parent_of(trimmed), Errno::NOTDIR))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                return Err(Error::io("open", trimmed, e))
            }
            Err(_) => false,
            Ok(_) => false,
        },
        None => false, // "/", ".", ".." or a path ending in them
    };
    let target = if plain {
        absolute(trimmed)?
    } else {
        canonical_target(trimmed)?
    };
    let Some(name) = target.file_name() else {
        return Err(Error::invalid(
            "target",
            format!(
                "{} resolves to {}, which has no name to put a lease file beside",
                trimmed.display(),
                target.display()
            ),
        ));
    };
    // A lease file named as the target, pasted from a message that names
    // it, would get a lease file of its own (`….backend-lease.backend-lease`)
    // and read as free while its database is held. A name that is the
    // suffix alone is nobody's lease file, and a file of another kind
    // whose name happens to end so (`poetry.lock`, suffix `.lock`) is a
    // target like any other.
    let named_as_lease = name.len() > suffix.len() && name.as_bytes().ends_with(suffix.as_bytes());
    if named_as_lease && !other_than_a_lease_file(&target) {
        let spelled = trimmed.as_os_str().as_bytes();
        let meant = match spelled.ends_with(suffix.as_bytes()) {
            true => target_of(trimmed, suffix),
            false => target_of(&target, suffix),
        };
        let hint = match meant.file_name() {
            Some(_) => format!("; did you mean {}?", meant.display()),
            None => String::new(),
        };
        return Err(Error::invalid(
            "target",
            format!(
                "{} is a lease file (its name ends in the suffix {suffix}){hint}",
                trimmed.display()
            ),
        ));
    }
    let mut name = name.to_owned();
    name.push(suffix);
    Ok(Spelled {
        lease: target.with_file_name(&name),
        name,
    })
}

/// Whether `path` is there and is not what sidelease leaves in a lease
/// file: a regular file holding neither nothing nor a holder record, or
/// not a regular file (a directory, a device).
fn other_than_a_lease_file(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false; // not there: named as a lease file, taken for one
    };
    if !meta.is_file() {
        return true;
    }
    if meta.len() > crate::record::RECORD_MAX_BYTES as u64 {
        return true;
    }
    match std::fs::read(path) {
        Ok(bytes) => matches!(
            crate::record::Content::parse(&bytes),
            crate::record::Content::Unreadable
        ),
        // Not ours to read: nothing says it is a lease file.
        Err(_) => true,
    }
}

/// The canonical lease path of an open lease file, from the kernel. `None`
/// when the kernel's name for it does not end in the expected file name (it
/// was renamed since it was opened: open again).
pub(crate) fn canonical_from_fd(
    fd: std::os::fd::BorrowedFd<'_>,
    spelled: &Spelled,
) -> Option<PathBuf> {
    let bytes = match process::fd_path(fd) {
        Ok(b) => b,
        // The kernel does not name open files (no /proc, the portable
        // platform): the directory as realpath resolves it now, with the
        // file name (the spelling, made absolute, when even that fails).
        Err(_) => {
            let dir = paths::resolve(parent_of(&spelled.lease));
            return Some(dir.map_or_else(|_| spelled.lease.clone(), |d| d.join(&spelled.name)));
        }
    };
    let path = PathBuf::from(OsString::from_vec(bytes));
    (path.file_name() == Some(spelled.name.as_os_str()) && path.is_absolute()).then_some(path)
}

/// The target a lease path belongs to (the lease path without its suffix).
pub(crate) fn target_of(lease: &Path, suffix: &str) -> PathBuf {
    let bytes = lease.as_os_str().as_bytes();
    let cut = bytes.len().saturating_sub(suffix.len());
    PathBuf::from(OsStr::from_bytes(&bytes[..cut]))
}

pub(crate) fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        Some(_) => Path::new("."),
        None => Path::new("/"),
    }
}

fn trim_trailing_slashes(p: &Path) -> &Path {
    let mut b = p.as_os_str().as_bytes();
    while b.len() > 1 && b.ends_with(b"/") {
        b = &b[..b.len() - 1];
    }
    Path::new(OsStr::from_bytes(b))
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    let cwd = std::env::current_dir().map_err(|e| Error::io("getcwd", Path::new("."), e))?;
    Ok(cwd.join(p))
}

/// The canonical path of an existing target through an `O_PATH` open (the
/// kernel follows every symlink, protected ones refused); for a dangling
/// symlink, its hops are followed by hand with the same protection, and the
/// parent directory of the missing file is resolved instead.
fn canonical_target(target: &Path) -> Result<PathBuf> {
    let mut path = target.to_path_buf();
    for _ in 0..MAX_LINK_HOPS {
        match kernel_resolve(&path) {
            Ok(p) => return Ok(p),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(Error::io("open", &path, e)),
        }
        // Missing: a dangling symlink to follow, or a file to create in an
        // existing directory.
        let name = match path.file_name() {
            Some(n) => n.to_owned(),
            None => {
                return Err(Error::invalid(
                    "target",
                    format!("{} does not end in a file name", target.display()),
                ))
            }
        };
        let parent = parent_of(&path).to_path_buf();
        let dir = match kernel_resolve(&parent) {
            Ok(d) => d,
            Err(e) => return Err(Error::io("open", &parent, e)),
        };
        match process::read_link_bytes(&dir.join(&name)) {
            Ok(dest) => {
                check_protected_symlink(&dir, &name).map_err(|e| Error::io("open", &path, e))?;
                path = dir.join(OsString::from_vec(dest));
                continue;
            }
            Err(_) => return Ok(dir.join(name)),
        }
    }
    Err(Error::io(
        "open",
        target,
        io::Error::from_raw_os_error(libc::ELOOP),
    ))
}

fn kernel_resolve(p: &Path) -> io::Result<PathBuf> {
    paths::resolve(p)
}

/// The kernel's `fs.protected_symlinks` rule, for a dangling symlink this
/// library follows by hand: in a sticky world-writable directory, follow
/// only a link owned by the follower or by the directory's owner.
fn check_protected_symlink(dir: &Path, name: &OsStr) -> io::Result<()> {
    if !paths::protected_symlinks() {
        return Ok(());
    }
    let d = crate::platform::stat::stat(dir)?;
    let l = crate::platform::stat::lstat(dir.join(name))?;
    let sticky_world_writable = d.st_mode & 0o1002 == 0o1002;
    let me = rustix::process::geteuid().as_raw();
    if !sticky_world_writable || l.st_uid == me || l.st_uid == d.st_uid {
        return Ok(());
    }
    Err(io::Error::from_raw_os_error(libc::EACCES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn spelled(t: &Path) -> PathBuf {
        spell(t, ".backend-lease").unwrap().lease
    }

    #[test]
    fn existing_and_missing_targets_name_the_same_lease() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let before = spelled(&db);
        std::fs::write(&db, b"").unwrap();
        let after = spelled(&db);
        assert_eq!(before, after);
        assert!(after.ends_with("app.db.backend-lease"));
        assert!(after.is_absolute());
    }

    #[test]
    fn symlinks_are_followed_even_when_dangling() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap().join("real.db");
        let link = dir.path().join("link.db");
        symlink("real.db", &link).unwrap();
        let dangling = spelled(&link);
        std::fs::write(&real, b"").unwrap();
        let live = spelled(&link);
        assert_eq!(dangling, live);
        assert_eq!(live, real.with_file_name("real.db.backend-lease"));
    }

    #[test]
    fn trailing_slashes_dot_and_dotdot() {
        let dir = tempfile::tempdir().unwrap();
        let canon = std::fs::canonicalize(dir.path()).unwrap();
        let data = canon.join("data");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        let want = canon.join("data.backend-lease");
        assert_eq!(spelled(&data), want);
        assert_eq!(spelled(&dir.path().join("data/")), want);
        assert_eq!(spelled(&dir.path().join("data/.")), want);
        assert_eq!(spelled(&dir.path().join("data/sub/..")), want);
    }

    #[test]
    fn bad_targets_are_named() {
        let e = spell(Path::new(""), ".l").unwrap_err();
        assert!(e.to_string().contains("`target`: is an empty path"), "{e}");
        let e = spell(Path::new("/"), ".l").unwrap_err();
        assert!(e.to_string().contains("`target`"), "{e}");
    }

    #[test]
    fn a_lease_file_as_the_target_is_refused_naming_its_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let lease = dir.path().join("app.db.backend-lease");
        std::fs::write(&lease, b"").unwrap();
        let e = spell(&lease, ".backend-lease").unwrap_err();
        let want = format!(
            "`target`: {} is a lease file (its name ends in the suffix .backend-lease); \
             did you mean {}?",
            lease.display(),
            db.display()
        );
        assert!(e.to_string().contains(&want), "{e}");
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        // Through a symlink, the file it names; missing, the same.
        let link = dir.path().join("current");
        std::os::unix::fs::symlink(&lease, &link).unwrap();
        let e = spell(&link, ".backend-lease").unwrap_err();
        assert!(e.to_string().contains("is a lease file"), "{e}");
        let e = spell(&dir.path().join("gone.db.l"), ".l").unwrap_err();
        assert!(e.to_string().contains("did you mean"), "{e}");
        // Another suffix's lease file is a target like any other; so is a
        // file of another kind whose name ends in the suffix, and a name
        // that is the suffix alone.
        assert!(spell(&lease, ".lock").is_ok());
        let poetry = dir.path().join("poetry.lock");
        std::fs::write(&poetry, b"[[package]]\nname = \"x\"\n").unwrap();
        assert!(spell(&poetry, ".lock").is_ok());
        assert!(spell(&dir.path().join(".lock"), ".lock").is_ok());
        // A holder record in it: a lease file.
        std::fs::write(&poetry, br#"{"schema":1,"pid":1}"#).unwrap();
        let e = spell(&poetry, ".lock").unwrap_err();
        assert!(e.to_string().contains("is a lease file"), "{e}");
    }

    #[test]
    fn target_of_strips_the_suffix() {
        assert_eq!(
            target_of(Path::new("/a/app.db.backend-lease"), ".backend-lease"),
            Path::new("/a/app.db")
        );
    }
}
