//! From the caller's target to the one lease file every spelling of it names.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A target resolved to its canonical spelling, and its lease file beside it.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub target: PathBuf,
    pub lease_path: PathBuf,
}

/// Symlink hops followed for a target that does not exist yet (as the kernel's
/// own limit, so a loop ends in an error rather than forever).
const MAX_LINK_HOPS: usize = 40;

pub fn resolve(target: &Path, suffix: &str) -> Result<Resolved> {
    validate_target(target)?;
    let resolved = canonical_target(target)?;
    if resolved.file_name().is_none() {
        return Err(Error::invalid(
            "target",
            format!(
                "{} resolves to {}, which has no name to put a lease file beside",
                target.display(),
                resolved.display()
            ),
        ));
    }
    let mut lease = OsString::from(resolved.as_os_str());
    lease.push(suffix);
    Ok(Resolved {
        target: resolved,
        lease_path: PathBuf::from(lease),
    })
}

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

/// `realpath` of the target; when it does not exist yet, follow any dangling
/// symlinks by hand and resolve the parent directory instead, so the lease
/// file is the same before and after the database is created.
fn canonical_target(target: &Path) -> Result<PathBuf> {
    match std::fs::canonicalize(target) {
        Ok(p) => return Ok(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("realpath", target, e)),
    }
    let mut path = target.to_path_buf();
    for _ in 0..MAX_LINK_HOPS {
        let name = match path.file_name() {
            Some(n) => n.to_owned(),
            None => {
                return Err(Error::invalid(
                    "target",
                    format!("{} does not end in a file name", target.display()),
                ))
            }
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        match std::fs::read_link(&path) {
            Ok(dest) => {
                path = parent.join(dest);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(Error::io("readlink", &path, e)),
        }
        // A parent that is not a directory fails later, at open, naming the
        // lease path.
        let dir = std::fs::canonicalize(&parent).map_err(|e| Error::io("realpath", &parent, e))?;
        return Ok(dir.join(name));
    }
    Err(Error::io(
        "realpath",
        target,
        io::Error::from_raw_os_error(libc::ELOOP),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn existing_and_missing_targets_name_the_same_lease() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let before = resolve(&db, ".backend-lease").unwrap();
        std::fs::write(&db, b"").unwrap();
        let after = resolve(&db, ".backend-lease").unwrap();
        assert_eq!(before.lease_path, after.lease_path);
        assert!(after.lease_path.ends_with("app.db.backend-lease"));
        assert!(after.lease_path.is_absolute());
    }

    #[test]
    fn symlinks_are_followed_even_when_dangling() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.db");
        let link = dir.path().join("link.db");
        symlink("real.db", &link).unwrap();
        let dangling = resolve(&link, ".l").unwrap();
        std::fs::write(&real, b"").unwrap();
        let live = resolve(&link, ".l").unwrap();
        assert_eq!(dangling.lease_path, live.lease_path);
        assert!(live.lease_path.ends_with("real.db.l"));
    }

    #[test]
    fn bad_targets_are_named() {
        let e = resolve(Path::new(""), ".l").unwrap_err();
        assert!(e.to_string().contains("`target`: is an empty path"), "{e}");
        let e = resolve(Path::new("/"), ".l").unwrap_err();
        assert!(e.to_string().contains("`target`"), "{e}");
        let e = resolve(Path::new("/nonexistent-dir-xyz/app.db"), ".l").unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOENT));
        assert!(e.to_string().contains("/nonexistent-dir-xyz"), "{e}");
    }
}
