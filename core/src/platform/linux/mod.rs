//! Linux: `/proc` (locks, descriptors, identity), inotify, eventfd, `O_PATH`,
//! `statx`, `statfs` magic, `CLOCK_BOOTTIME`, `TCP_USER_TIMEOUT`. Where one
//! of them cannot be had (a sandbox's `/proc`, the user's inotify limit),
//! the question it answers falls back to what the portable implementation
//! does, and [`note_unavailable`](super::note_unavailable) records it.

pub(crate) use super::{note_unavailable, Missing};

pub const NAME: &str = "linux";

pub mod clock;
mod dirs;
pub mod filestat;
pub mod fsevents;
pub mod fskind;
pub mod locks;
pub mod mounts;
pub mod notify;
pub mod paths;
pub mod process;
pub mod random;
pub mod reaper;
pub mod sockopt;
pub mod wakefd;
