//! No file events: the holder's watch looks at every held lease on a timer
//! (`watch::POLL_EVERY`), comparing the path's device and inode with the
//! file it holds, and re-anchors when they differ. Nothing here can be
//! watched, so every call says so and the watch polls.

use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::registry::Key;

/// How long a contender gives the holder of a former lease file to put a
/// replaced one back: the holder's watch looks every `watch::POLL_EVERY`
/// (100 ms), so two of its rounds and its being scheduled fit in this.
pub const REANCHOR_GRACE: Duration = Duration::from_millis(250);

/// One event read from an instance (never: there are none).
pub struct Event {
    pub wd: i32,
    pub overflow: bool,
    pub gone: bool,
    pub written: bool,
}

/// No instance can be had.
/// No instances here: nothing to number a lease file above.
pub fn held_files_go_above() -> bool {
    false
}

pub fn open() -> Option<OwnedFd> {
    None
}

pub fn watch_held(_instance: BorrowedFd<'_>, _fd: RawFd, _writes: bool) -> std::io::Result<i32> {
    Err(super::unsupported("watching a file"))
}

pub fn unwatch(_instance: BorrowedFd<'_>, _wd: i32) {}

pub fn read(_instance: BorrowedFd<'_>, _buf: &mut [MaybeUninit<u8>], _each: impl FnMut(Event)) {}

/// What a directory's event means.
pub enum Heard {
    Nothing,
    PathChanged,
    Appeared,
}

/// The directories of lease paths, none of them watched: the timer's look
/// at each lease covers a directory renamed or replaced on its path.
#[derive(Default)]
pub struct Dirs;

impl Dirs {
    pub fn is_chained(&self, _dir_path: &Path, _dir: Key) -> bool {
        false
    }

    pub fn heard(&mut self, _instance: BorrowedFd<'_>, _ev: &Event) -> Heard {
        Heard::Nothing
    }

    pub fn chain(
        &mut self,
        _instance: BorrowedFd<'_>,
        _dir_path: &Path,
        _dir: Key,
    ) -> std::io::Result<bool> {
        Err(super::unsupported("watching a directory"))
    }

    pub fn set_creating(&mut self, _instance: BorrowedFd<'_>, _wanted: &[PathBuf]) -> (bool, bool) {
        (false, false)
    }

    pub fn clear(&mut self) {}
}
