//! Keepalives only (`SO_KEEPALIVE`, the system's timing): their timing and
//! `TCP_USER_TIMEOUT` are not portable. The holder's own bound
//! (`confirm_within`) still ends a lease whose server went silent.

use std::os::fd::BorrowedFd;
use std::time::Duration;

pub fn keepalive(
    fd: BorrowedFd<'_>,
    _idle: Duration,
    _interval: Duration,
    _count: u32,
    _user_timeout: Duration,
) -> std::io::Result<()> {
    Ok(rustix::net::sockopt::set_socket_keepalive(fd, true)?)
}

/// A stream socket, then close-on-exec and non-blocking: POSIX has no
/// `SOCK_CLOEXEC` (macOS lacks it), so a child another thread starts in
/// between can inherit it; fork itself is held off by the caller.
pub fn stream_socket(family: rustix::net::AddressFamily) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    use rustix::io::{fcntl_setfd, FdFlags};
    let fd = rustix::net::socket(family, rustix::net::SocketType::STREAM, None)?;
    fcntl_setfd(&fd, FdFlags::CLOEXEC)?;
    fcntl_setfl(&fd, fcntl_getfl(&fd)? | OFlags::NONBLOCK)?;
    // macOS has no MSG_NOSIGNAL: a write after the server reset the
    // connection would raise SIGPIPE, which kills a C program that does not
    // ignore it (Rust's own sockets set this too). Built, not run here.
    #[cfg(target_vendor = "apple")]
    rustix::net::sockopt::set_socket_nosigpipe(&fd, true)?;
    Ok(fd)
}
