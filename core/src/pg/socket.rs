//! The socket of a lease connection, opened by this library rather than by
//! the driver so it is listed for the fork handler like a lease file: a
//! forked child closes its copy at once, so a holder that dies ends its
//! session even if a child it forked lives on. TCP keepalives and
//! `TCP_USER_TIMEOUT` bound how long a dead peer goes unnoticed.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{BorrowedFd, FromRawFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rustix::net::{sockopt, AddressFamily};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::Host;

use crate::registry;

/// Keepalive probes start after this much silence…
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);
/// …are sent this often…
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// …and this many unanswered ones end the connection.
pub const KEEPALIVE_COUNT: u32 = 3;
/// Data unacknowledged for this long ends the connection.
pub const USER_TIMEOUT: Duration = Duration::from_secs(3);

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

pub(crate) struct Listed {
    stream: Option<Stream>,
    fd: RawFd,
    slot: u32,
}

impl Drop for Listed {
    fn drop(&mut self) {
        match self.stream.take() {
            Some(s) => registry::close_listed_by(self.fd, self.slot, s),
            None => registry::close_listed(self.fd, self.slot),
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut().stream.as_mut() {
            Some(Stream::Tcp($s)) => $e,
            Some(Stream::Unix($s)) => $e,
            None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    };
}

impl AsyncRead for Listed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Listed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, b))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// A cancel request's socket, whose shutdown first waits for the server to
/// close it: the server (or a pooler) closes once it has taken the
/// request, as libpq waits for. A client that closes first makes
/// PgBouncer 1.18 (Debian 12's) exit on a fatal error ("bad client
/// state"), freeing a client its cancel still pointed at; every client of
/// the pooler then loses its connection. Bounded by the caller.
pub(crate) struct ClosedByPeer(pub Listed);

impl AsyncRead for ClosedByPeer {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClosedByPeer {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, b)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let inner = &mut self.get_mut().0;
        // Whatever the server sends (nothing, or its side of a TLS
        // session's end) is read and dropped until it closes.
        let mut scratch = [0u8; 256];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut *inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => break,
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(inner).poll_shutdown(cx)
    }
}

fn listed_socket(family: AddressFamily) -> io::Result<Listed> {
    let opened = registry::open_listed(|| crate::platform::sockopt::stream_socket(family))?;
    let (fd, slot) = opened.map_err(|e| io::Error::other(e.to_string()))?;
    Ok(Listed {
        stream: None,
        fd,
        slot,
    })
}

impl Listed {
    /// This end's and the peer's TCP addresses: a server reached directly
    /// sees exactly them as its client's and its own (`None` over a Unix
    /// socket).
    pub(crate) fn tcp_ends(&self) -> Option<(SocketAddr, SocketAddr)> {
        match &self.stream {
            Some(Stream::Tcp(s)) => Some((s.local_addr().ok()?, s.peer_addr().ok()?)),
            _ => None,
        }
    }

    /// The descriptor's number: valid while the connection that owns the
    /// socket runs (see `Conn::hand_on`).
    pub(crate) fn raw(&self) -> RawFd {
        self.fd
    }

    fn borrowed(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is open while the Listed exists.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }

    /// Hand the descriptor to tokio; on failure tokio has closed it.
    fn adopt(mut self, unix: bool) -> io::Result<Listed> {
        let made = if unix {
            // SAFETY: ours; from here the stream owns it.
            let std = unsafe { std::os::unix::net::UnixStream::from_raw_fd(self.fd) };
            UnixStream::from_std(std).map(Stream::Unix)
        } else {
            // SAFETY: as above.
            let std = unsafe { std::net::TcpStream::from_raw_fd(self.fd) };
            TcpStream::from_std(std).map(Stream::Tcp)
        };
        match made {
            Ok(s) => {
                self.stream = Some(s);
                Ok(self)
            }
            Err(e) => {
                registry::close_listed_by(self.fd, self.slot, ());
                std::mem::forget(self);
                Err(e)
            }
        }
    }

    async fn connected(&self) -> io::Result<()> {
        match &self.stream {
            Some(Stream::Tcp(s)) => s.writable().await?,
            Some(Stream::Unix(s)) => s.writable().await?,
            None => return Err(io::ErrorKind::NotConnected.into()),
        }
        match sockopt::socket_error(self.borrowed())? {
            Ok(()) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

async fn tcp(addr: SocketAddr) -> io::Result<Listed> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let s = listed_socket(family)?;
    let fd = s.borrowed();
    sockopt::set_tcp_nodelay(fd, true)?;
    crate::platform::sockopt::keepalive(
        fd,
        KEEPALIVE_IDLE,
        KEEPALIVE_INTERVAL,
        KEEPALIVE_COUNT,
        USER_TIMEOUT,
    )?;
    match rustix::net::connect(fd, &addr) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let s = s.adopt(false)?;
    s.connected().await?;
    Ok(s)
}

async fn unix(path: &Path) -> io::Result<Listed> {
    let s = listed_socket(AddressFamily::UNIX)?;
    let addr = rustix::net::SocketAddrUnix::new(path)?;
    match rustix::net::connect(s.borrowed(), &addr) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let s = s.adopt(true)?;
    s.connected().await?;
    Ok(s)
}

/// Connect to the first host of `config` that answers, each address within
/// `timeout`; with the host's name if it was reached over TCP.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
    timeout: Duration,
) -> io::Result<(Listed, Option<String>)> {
    let ports = config.get_ports();
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no host to connect to");
    for (i, host) in config.get_hosts().iter().enumerate() {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let tries: Vec<Result<SocketAddr, &Path>> = match host {
            Host::Tcp(h) => match (h.as_str(), port).to_socket_addrs() {
                Ok(a) => a.map(Ok).collect(),
                Err(e) => {
                    last = io::Error::new(e.kind(), format!("cannot resolve {h}: {e}"));
                    continue;
                }
            },
            Host::Unix(dir) => vec![Err(dir.as_path())],
        };
        for t in tries {
            let attempt = async {
                match t {
                    Ok(addr) => tcp(addr).await,
                    Err(dir) => unix(&dir.join(format!(".s.PGSQL.{port}"))).await,
                }
            };
            match tokio::time::timeout(timeout, attempt).await {
                Ok(Ok(s)) => {
                    let name = match host {
                        Host::Tcp(h) => Some(h.clone()),
                        Host::Unix(_) => None,
                    };
                    return Ok((s, name));
                }
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no answer within {:.1}s", timeout.as_secs_f64()),
                    )
                }
            }
        }
    }
    Err(last)
}
