//! The directories a held lease's path runs through. A lease protects a
//! path: renaming, removing or replacing any directory on it (or mounting
//! over one, which `platform::mounts` hears) makes the path lead elsewhere
//! while the lease file itself sees nothing. So every directory of the
//! path, from the first one below `/` to the lease file's own, is watched
//! for what only that gives — `IN_MOVE_SELF`, `IN_DELETE_SELF`,
//! `IN_UNMOUNT` — never for what happens inside it (a SQLite database
//! beside the lease file creates and deletes its journal on every
//! transaction). One chain per directory, shared by every lease in it.
//! (A directory can only be removed once it is empty, so the lease file's
//! own `IN_ATTRIB` comes first; its `IN_DELETE_SELF` comes only when the
//! holder lets go of the file it kept open inside, which keeps the
//! directory's dentry alive.)
//!
//! While a lease file cannot be put back (its directory is gone), the
//! deepest directory of its path that still exists is also watched for
//! entries being created or moved in, so the holder puts the file back as
//! soon as the path can lead to it again.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use rustix::fs::inotify::{self, WatchFlags};
use rustix::io::Errno;

use super::fsevents::Event;
use crate::registry::Key;

/// What a directory of a lease path is watched for.
pub(crate) const CHAIN: WatchFlags = WatchFlags::MOVE_SELF
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::DONT_FOLLOW);

/// A symlink on a lease path is watched as itself: renamed, replaced or
/// removed (a renamed-over link gets `IN_ATTRIB` as its link count falls).
const LINK: WatchFlags = WatchFlags::MOVE_SELF
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DONT_FOLLOW);

/// And, while a lease file cannot be put back, its deepest existing
/// directory for this too.
const CREATING: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ATTRIB);

/// One watched directory (or symlink on a lease path).
pub struct Dir {
    pub path: PathBuf,
    /// Also watched for entries appearing (see [`CREATING`]).
    pub creating: bool,
    /// A symlink, watched as itself.
    pub link: bool,
}

#[derive(Default)]
pub struct Dirs {
    /// By watch descriptor.
    pub by_wd: HashMap<i32, Dir>,
    /// A lease directory's path, whose whole chain is watched: the
    /// directory it led to (device, inode) and the watch descriptors.
    pub chains: HashMap<PathBuf, (Key, Vec<i32>)>,
}

/// What a directory's event means.
pub enum Heard {
    /// Not one of these directories.
    Nothing,
    /// A directory of some lease path moved, vanished or was unmounted:
    /// every lease must be looked at, and chains made again.
    PathChanged,
    /// Something appeared in a directory where a lease file is missing.
    Appeared,
}

impl Dirs {
    pub fn is_chained(&self, dir_path: &Path, dir: Key) -> bool {
        self.chains.get(dir_path).is_some_and(|(k, _)| *k == dir)
    }

    /// Forget a directory watch (the kernel dropped it, or it is no longer
    /// on the path it was added for) and every chain through it.
    fn drop_wd(&mut self, wd: i32) {
        self.by_wd.remove(&wd);
        self.chains.retain(|_, (_, wds)| !wds.contains(&wd));
    }

    pub fn heard(&mut self, inotify: BorrowedFd<'_>, ev: &Event) -> Heard {
        use inotify::ReadFlags as R;
        let (wd, flags) = (ev.wd, ev.flags);
        let Some(dir) = self.by_wd.get(&wd) else {
            return Heard::Nothing;
        };
        if flags.contains(R::IGNORED) {
            self.drop_wd(wd);
            return Heard::PathChanged;
        }
        if flags.intersects(R::MOVE_SELF | R::DELETE_SELF | R::UNMOUNT)
            || (dir.link && flags.contains(R::ATTRIB))
        {
            // The watch stays on the inode, which is no longer where the
            // path goes: let it go; the chain is made again by path.
            let _ = inotify::remove_watch(inotify, wd);
            self.drop_wd(wd);
            return Heard::PathChanged;
        }
        if dir.creating && flags.intersects(R::CREATE | R::MOVED_TO | R::ATTRIB) {
            return Heard::Appeared;
        }
        Heard::Nothing
    }

    /// Watch every directory of the path to `dir_path`, which leads to the
    /// directory `dir`: each component as spelled (a symlink as itself),
    /// and, when a symlink is on the way, each directory of the path it
    /// leads to. `Ok(true)`: watched; `Ok(false)`: the path does not lead
    /// to that directory any more (look at the lease again); `Err`: the
    /// kernel refused a watch (the user's watch limit): the lease must be
    /// polled.
    pub fn chain(
        &mut self,
        inotify: BorrowedFd<'_>,
        dir_path: &Path,
        dir: Key,
    ) -> std::io::Result<bool> {
        if self.is_chained(dir_path, dir) {
            return Ok(true);
        }
        let mut paths: Vec<PathBuf> = ancestors(dir_path)
            .into_iter()
            .map(Path::to_path_buf)
            .collect();
        if let Ok(real) = std::fs::canonicalize(dir_path) {
            if real != dir_path {
                for p in ancestors(&real) {
                    if !paths.iter().any(|q| q == p) {
                        paths.push(p.to_path_buf());
                    }
                }
            }
        }
        let mut wds = Vec::new();
        for d in &paths {
            let link = crate::platform::stat::lstat(d.as_path())
                .is_ok_and(|st| st.file_type().is_symlink());
            let mask = if link { LINK } else { CHAIN };
            match inotify::add_watch(inotify, d.as_path(), mask | WatchFlags::MASK_ADD) {
                Ok(wd) => {
                    let entry = self.by_wd.entry(wd).or_insert_with(|| Dir {
                        path: d.clone(),
                        creating: false,
                        link,
                    });
                    entry.link |= link;
                    wds.push(wd);
                }
                // The path changed under us: the lease's check says how.
                Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
        // Watched from here on; did the path still lead to the same
        // directory once the watches were in place? If not, a change came
        // before them.
        match crate::platform::stat::stat(dir_path) {
            Ok(st) if (st.st_dev, st.st_ino) == dir => {
                self.chains.insert(dir_path.to_path_buf(), (dir, wds));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Make the set of directories watched for entries appearing exactly
    /// `wanted` (the deepest existing directory of each lease path whose
    /// file cannot be put back). Returns whether a watch was added (what
    /// appeared before it is heard by no event, so look again now; a watch
    /// that cannot be added leaves the retry timer alone) and whether one
    /// was dropped (the chains through it must be made again).
    pub fn set_creating(&mut self, inotify: BorrowedFd<'_>, wanted: &[PathBuf]) -> (bool, bool) {
        let mut added = false;
        let stale: Vec<i32> = self
            .by_wd
            .iter()
            .filter(|(_, d)| d.creating && !wanted.contains(&d.path))
            .map(|(wd, _)| *wd)
            .collect();
        let dropped = !stale.is_empty();
        for wd in stale {
            // The wider mask cannot be narrowed in place without its path
            // (which may lead elsewhere now): drop it; chains are made
            // again by path.
            let _ = inotify::remove_watch(inotify, wd);
            self.drop_wd(wd);
        }
        for p in wanted {
            if self.by_wd.values().any(|d| d.creating && &d.path == p) {
                continue;
            }
            if let Ok(wd) = inotify::add_watch(inotify, p, CREATING | CHAIN | WatchFlags::MASK_ADD)
            {
                let d = self.by_wd.entry(wd).or_insert_with(|| Dir {
                    path: p.clone(),
                    creating: false,
                    link: false,
                });
                d.creating = true;
                added = true;
            }
        }
        (added, dropped)
    }

    pub fn clear(&mut self) {
        self.by_wd.clear();
        self.chains.clear();
    }
}

/// The directories of an absolute path below `/`, outermost first
/// (`/srv/app` gives `/srv`, `/srv/app`).
fn ancestors(dir: &Path) -> Vec<&Path> {
    let mut v: Vec<&Path> = dir
        .ancestors()
        .filter(|p| p.parent().is_some() && !p.as_os_str().is_empty())
        .collect();
    v.reverse();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_below_the_root() {
        assert_eq!(
            ancestors(Path::new("/srv/app/data")),
            vec![
                Path::new("/srv"),
                Path::new("/srv/app"),
                Path::new("/srv/app/data")
            ]
        );
        assert!(ancestors(Path::new("/")).is_empty());
    }
}
