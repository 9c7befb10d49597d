//! How [`Forwarder`](crate::forward::Forwarder) reaches another instance: TCP, and TLS on
//! top for an `https://` owner, verified with the configuration it was given. hyper's own
//! client with this connector rather than reqwest's TLS: reqwest with rustls wants a
//! process-wide crypto provider (or aws-lc), which every other reqwest client of the
//! process would then need too.

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Connects over TCP, with a TLS handshake for `https` (bounded with the connect).
#[derive(Clone)]
pub(crate) struct Connector {
    tcp: HttpConnector,
    tls: TlsConnector,
    timeout: Duration,
}

impl Connector {
    pub(crate) fn new(tls: Arc<rustls::ClientConfig>, timeout: Duration) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(timeout));
        Self {
            tcp,
            tls: TlsConnector::from(tls),
            timeout,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
        let (connecting, tls, timeout) = (self.tcp.call(uri), self.tls.clone(), self.timeout);
        Box::pin(async move {
            let tcp = connecting.await?.into_inner();
            if !https {
                return Ok(TokioIo::new(Stream::Plain(tcp)));
            }
            let name = ServerName::try_from(host)?;
            let stream = tokio::time::timeout(timeout, tls.connect(name, tcp))
                .await
                .map_err(|_| format!("no TLS handshake within {timeout:?}"))??;
            Ok(TokioIo::new(Stream::Tls(Box::new(stream))))
        })
    }
}

/// A connection to another instance.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(s) => s.connected(),
            Self::Tls(s) => s.get_ref().0.connected(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
