//! The lease-file engine: an exclusive `flock` on a persistent sidecar file
//! holding the holder record, judged from the kernel, kept whole by the
//! holder's watch.

pub(crate) mod access;
pub(crate) mod acquire;
pub(crate) mod anchor;
pub(crate) mod guard;
mod hold;
pub(crate) mod holders;
mod inspect;
pub(crate) mod previous;
pub mod watch;

pub(crate) use acquire::FilePending;
pub(crate) use hold::{write_padded, FileHold};
pub(crate) use inspect::inspect;

/// In a forked child: the watch's thread and descriptors are the parent's.
pub(crate) fn after_fork_in_child() {
    watch::after_fork_in_child();
}
