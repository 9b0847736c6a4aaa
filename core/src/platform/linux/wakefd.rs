//! A descriptor that turns readable when rung and stays readable until
//! drained, to wake a thread's `poll` or an event loop: an eventfd.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::event::{eventfd, EventfdFlags};

pub struct WakeFd {
    fd: OwnedFd,
}

impl WakeFd {
    /// The call named in errors.
    pub const CALL: &'static str = "eventfd";

    pub fn new() -> io::Result<WakeFd> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(WakeFd { fd })
    }

    /// Make it readable (the counter only grows, so it stays readable).
    pub fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Consume the rings.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }

    /// Its descriptors, for a fork child handler to close (`-1`: none).
    pub fn raw(&self) -> [RawFd; 2] {
        [self.fd.as_raw_fd(), -1]
    }
}

impl AsFd for WakeFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
