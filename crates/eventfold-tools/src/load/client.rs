//! The load generator's HTTP/1.1 client: one keep-alive connection per worker, driven
//! through hyper's connection API directly.
//!
//! The load generator shares the machine with the service it measures, so its own cost
//! per request is taken from the service. A pooled general-purpose client (reqwest: a pool
//! lock, URL handling, redirect and timeout layers per request) cost a quarter of what the
//! service itself spent (bench/FINDINGS.md, "Moved from code comments").
//! A worker here owns its connection: no pool, the `Host` header is prepared once, and
//! the connection is dropped (and opened again on the next attempt)
//! after any error, a timeout or a `Connection: close`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{
    AUTHORIZATION, CONNECTION, CONTENT_TYPE, HOST, HeaderMap, HeaderName, HeaderValue, IF_NONE_MATCH, RETRY_AFTER,
};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Body of a request: a command's JSON or nothing (a GET).
type Body = Either<Full<Bytes>, Empty<Bytes>>;

/// Where requests go: `host:port` to connect to and the `Host` header to send.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    addr: String,
    host: HeaderValue,
    /// `Bearer <token>` for a service with `--auth-tokens`.
    authorization: Option<HeaderValue>,
}

impl Target {
    /// The target of a base URL such as `http://127.0.0.1:8080` (plain HTTP only), sending
    /// `token` as a bearer token if given.
    pub(crate) fn of(url: &reqwest::Url, token: Option<&str>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            url.scheme() == "http",
            "url {url} is not plain http:// (the load generator speaks HTTP/1.1 without TLS)"
        );
        let host = url.host_str().ok_or_else(|| anyhow::anyhow!("url {url} has no host"))?;
        let port = url.port_or_known_default().unwrap_or(80);
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_owned(),
        };
        let authorization = token
            .map(|t| {
                let mut value = HeaderValue::from_str(&format!("Bearer {t}"))
                    .map_err(|_| anyhow::anyhow!("the token must be visible ASCII"))?;
                value.set_sensitive(true);
                Ok::<_, anyhow::Error>(value)
            })
            .transpose()?;
        Ok(Self {
            // `host_str` keeps an IPv6 host's brackets: `[::1]:8080` parses as an address.
            addr: format!("{host}:{port}"),
            host: HeaderValue::from_str(&authority)?,
            authorization,
        })
    }
}

/// What one request got back.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) retry_after: Option<Duration>,
    /// The response body (read to its end in any case, to reuse the connection).
    pub(crate) body: Bytes,
}

/// One worker's connection, opened on first use and again after a failure.
#[derive(Default)]
pub(crate) struct Connection {
    sender: Option<SendRequest<Body>>,
    /// Time spent opening connections (TCP connect and HTTP/1.1 handshake) since the last
    /// `take_connect_time`.
    connecting: Option<Duration>,
}

/// A request: its path (with query) and, for a command (a POST), its idempotency key and
/// body; without one it is a GET, conditional with `If-None-Match` when `if_none_match`
/// is set.
pub(crate) struct Call<'a> {
    pub(crate) path: &'a str,
    pub(crate) command: Option<(&'a str, Bytes)>,
    pub(crate) if_none_match: Option<&'a str>,
}

impl Connection {
    /// How long the calls since the last take spent opening a connection (`None`: they
    /// reused one).
    pub(crate) fn take_connect_time(&mut self) -> Option<Duration> {
        self.connecting.take()
    }

    /// Sends `call` and reads the response to its end, within `timeout` (connecting
    /// included). Any failure closes the connection and is returned as text with its causes.
    pub(crate) async fn send(&mut self, target: &Target, call: Call<'_>, timeout: Duration) -> Result<Reply, String> {
        match tokio::time::timeout(timeout, self.exchange(target, call)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                Err(format!("no complete response within {timeout:?}"))
            }
        }
    }

    async fn exchange(&mut self, target: &Target, call: Call<'_>) -> Result<Reply, String> {
        let sender = match &mut self.sender {
            Some(s) if !s.is_closed() => s,
            _ => {
                let began = std::time::Instant::now();
                let opened = connect(target).await;
                *self.connecting.get_or_insert(Duration::ZERO) += began.elapsed();
                self.sender.insert(opened?)
            }
        };
        sender.ready().await.map_err(|e| error_chain(&e))?;
        let mut builder = Request::builder().uri(call.path).header(HOST, target.host.clone());
        if let Some(etag) = call.if_none_match {
            builder = builder.header(IF_NONE_MATCH, etag);
        }
        if let Some(credentials) = &target.authorization {
            builder = builder.header(AUTHORIZATION, credentials.clone());
        }
        let request = match call.command {
            Some((key, body)) => builder
                .method(Method::POST)
                .header(IDEMPOTENCY_KEY, key)
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(Either::Left(Full::new(body))),
            None => builder.method(Method::GET).body(Either::Right(Empty::new())),
        }
        .map_err(|e| format!("invalid request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("error sending request: {}", error_chain(&e)))?;
        let status = response.status().as_u16();
        let retry_after = parse_retry_after(response.headers());
        let close = response
            .headers()
            .get(CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        // Read the body to the end so the connection can carry the next request.
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("error reading the response body: {}", error_chain(&e)))?
            .to_bytes();
        if close {
            self.sender = None;
        }
        Ok(Reply {
            status,
            retry_after,
            body,
        })
    }
}

async fn connect(target: &Target) -> Result<SendRequest<Body>, String> {
    let stream = TcpStream::connect(&target.addr)
        .await
        .map_err(|e| format!("error connecting to {}: {e}", target.addr))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("error setting TCP_NODELAY: {e}"))?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("error starting HTTP/1.1 on {}: {}", target.addr, error_chain(&e)))?;
    // Drives the connection until it closes; its error reaches the sender's next call.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// An error with its sources, e.g. `error sending request: connection refused`.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// `Retry-After` in seconds (HTTP dates are not supported and fall back to backoff).
fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: f64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Duration::try_from_secs_f64(seconds).ok()
}
