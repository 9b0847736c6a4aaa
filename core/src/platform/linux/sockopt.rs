//! How a PostgreSQL connection's socket notices a silent peer: keepalives
//! after `idle`, every `interval`, given up after `count` unanswered; and
//! data unacknowledged for `user_timeout` ends the connection (RFC 5482).

use std::os::fd::BorrowedFd;
use std::time::Duration;

use rustix::net::sockopt;

pub fn keepalive(
    fd: BorrowedFd<'_>,
    idle: Duration,
    interval: Duration,
    count: u32,
    user_timeout: Duration,
) -> std::io::Result<()> {
    sockopt::set_socket_keepalive(fd, true)?;
    sockopt::set_tcp_keepidle(fd, idle)?;
    sockopt::set_tcp_keepintvl(fd, interval)?;
    sockopt::set_tcp_keepcnt(fd, count)?;
    sockopt::set_tcp_user_timeout(fd, user_timeout.as_millis() as u32)?;
    Ok(())
}

/// A stream socket that is close-on-exec and non-blocking from its first
/// moment: no child started by another thread can inherit it.
pub fn stream_socket(family: rustix::net::AddressFamily) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::net::{SocketFlags, SocketType};
    Ok(rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?)
}
