//! The driver's TLS hook: a rustls handshake over the lease's own socket,
//! its errors said plainly, and the channel binding computed here (not
//! trusted to a connector crate).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use rustls::{CertificateError, Error as TlsError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

use super::binding;

pub(crate) struct Connector {
    pub config: Arc<rustls::ClientConfig>,
    pub name: ServerName<'static>,
    /// The host as the URL names it, and where the roots came from, for
    /// the errors.
    pub host: String,
    pub roots: String,
    /// Set to the protocol version once a handshake succeeded: whether the
    /// session is encrypted (the driver keeps the stream to itself).
    pub used: Arc<std::sync::OnceLock<&'static str>>,
    /// Set once the server agreed to TLS and the handshake began.
    pub tried: Arc<std::sync::atomic::AtomicBool>,
    /// A cancel request's connection: its shutdown first reads until the
    /// server closes the session (see `socket::ClosedByPeer`), before TLS
    /// says its own goodbye, which a pooler would read as the client
    /// gone.
    pub linger: bool,
}

pub(crate) struct Stream<S>(tokio_rustls::client::TlsStream<S>, bool);

impl<S> TlsConnect<S> for Connector
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        self.tried.store(true, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async move {
            tokio_rustls::TlsConnector::from(self.config.clone())
                .connect(self.name.clone(), stream)
                .await
                .map(|s| {
                    let v = match s.get_ref().1.protocol_version() {
                        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                        _ => "TLS",
                    };
                    let _ = self.used.set(v);
                    Stream(s, self.linger)
                })
                .map_err(|e| self.explain(e))
        })
    }
}

impl Connector {
    fn explain(&self, e: io::Error) -> io::Error {
        let Some(err) = e.get_ref().and_then(|i| i.downcast_ref::<TlsError>()) else {
            return e;
        };
        let host = &self.host;
        let msg = match err {
            TlsError::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => format!(
                    "the server's certificate is not signed by a CA in {} (unknown CA)",
                    self.roots
                ),
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => format!(
                    "the server's certificate does not name the host {host} (host name \
                     mismatch; sslmode=verify-ca checks the CA only)"
                ),
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    format!("the server's certificate has expired ({err})")
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    format!("the server's certificate is not valid yet ({err})")
                }
                CertificateError::Revoked => {
                    "the server's certificate is revoked (sslcrl lists it)".to_owned()
                }
                _ => format!("the server's certificate was refused: {err}"),
            },
            TlsError::AlertReceived(alert) => format!(
                "the server ended the TLS handshake ({alert:?}); if it asks for a client \
                 certificate, give sslcert and sslkey"
            ),
            _ => format!("TLS handshake with {host} failed: {err}"),
        };
        io::Error::new(io::ErrorKind::InvalidData, msg)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let leaf = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first());
        match leaf.and_then(|c| binding::end_point(c)) {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if me.1 {
            let mut scratch = [0u8; 256];
            loop {
                let mut buf = ReadBuf::new(&mut scratch);
                match Pin::new(&mut me.0).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(_)) => break,
                    Poll::Pending => return Poll::Pending,
                }
            }
            me.1 = false;
        }
        Pin::new(&mut me.0).poll_shutdown(cx)
    }
}
