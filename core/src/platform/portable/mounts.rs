//! No events for the mount table: a directory mounted over is seen by the
//! holder's timer (the path's device and inode change).

use std::os::fd::OwnedFd;

use rustix::event::PollFlags;

pub fn watch() -> Option<OwnedFd> {
    None
}

pub const EVENTS: PollFlags = PollFlags::PRI;

pub fn changed(_revents: PollFlags) -> bool {
    false
}
