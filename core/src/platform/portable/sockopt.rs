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
