//! No file events to wake a waiter: every wait polls the lock on a
//! bounded back-off (`acquire`: 1 ms doubling to 50 ms), so a release is
//! seen within 50 ms.

use std::os::fd::BorrowedFd;
use std::path::Path;

pub use crate::platform::cancel::CancelToken;

/// A wait's watch of the lease file: none can be set here.
#[derive(Default)]
pub struct ChangeWatch;

impl ChangeWatch {
    pub fn new() -> ChangeWatch {
        ChangeWatch
    }

    /// Never armed: the waiter polls.
    pub fn arm(&mut self, _path: &Path, _identity: (u64, u64)) -> bool {
        super::note_unavailable(super::Missing::FileEvents);
        false
    }

    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    pub fn clear(&self) {}
}

/// No thread to stop or start around a fork.
pub(crate) fn pause() {}

pub(crate) fn resume() {}

pub fn instances() -> usize {
    0
}

/// No instance: nothing a lease file's descriptor must be numbered above.
pub fn highest_instance() -> i32 {
    -1
}

pub(crate) fn after_fork_in_child() {}
