//! A descriptor that turns readable when rung and stays readable until
//! drained: the read end of a pipe (every Unix has one; eventfd is Linux's).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::{fcntl_getfd, fcntl_setfd, FdFlags};

pub struct WakeFd {
    read: OwnedFd,
    write: OwnedFd,
}

impl WakeFd {
    /// The call named in errors.
    pub const CALL: &'static str = "pipe";

    pub fn new() -> io::Result<WakeFd> {
        // pipe(2) then close-on-exec: another thread's fork+exec in between
        // would leak these two descriptors into its child (pipe2 is not on
        // every Unix).
        let (read, write) = rustix::pipe::pipe()?;
        for fd in [&read, &write] {
            let flags = fcntl_getfd(fd)?;
            fcntl_setfd(fd, flags | FdFlags::CLOEXEC)?;
            let fl = rustix::fs::fcntl_getfl(fd)?;
            rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK)?;
        }
        Ok(WakeFd { read, write })
    }

    /// Make it readable. A full pipe is readable already.
    pub fn ring(&self) {
        let _ = rustix::io::write(&self.write, &[1u8]);
    }

    /// Consume the rings.
    pub fn drain(&self) {
        let mut b = [0u8; 64];
        while matches!(rustix::io::read(&self.read, &mut b), Ok(n) if n > 0) {}
    }

    /// Its descriptors, for a fork child handler to close.
    pub fn raw(&self) -> [RawFd; 2] {
        [self.read.as_raw_fd(), self.write.as_raw_fd()]
    }
}

impl AsFd for WakeFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}
