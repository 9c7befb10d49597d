//! HTTPS over real sockets: the router served by `serve_tls` with a certificate made at
//! test time, asked by a TLS client that trusts its CA, one that does not, a plain HTTP
//! client, a client that never finishes its handshake, and the forwarder.

#[path = "support/certs.rs"]
mod certs;

use axum::body::Body;
use axum::http::Request;
use eventfold_core::testing::Counter;
use eventfold_http::forward::Forwarder;
use eventfold_http::tls::{self, Tls};
use eventfold_http::{HttpOptions, ServerLimits};
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_runtime::{Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Server {
    addr: SocketAddr,
    certs: certs::Certs,
    _dir: tempfile::TempDir,
}

/// A server with the `counter` aggregate, serving HTTPS with a fresh CA's certificate.
async fn start(limits: ServerLimits) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs::generate(dir.path(), "server");
    let store = Store::open(&dir.path().join("store"), &StoreOptions::default()).unwrap();
    let log = EmbeddedLog::open(store, Options::default()).unwrap();
    let runtime = Runtime::builder(RuntimeOptions {
        app_id: "test".into(),
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(Arc::new(log));
    assert!(runtime.wait_restored(Duration::from_secs(10)).await);
    let tls = Tls::from_pem_files(&certs.cert, &certs.key).unwrap();
    let listener = eventfold_http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let router = eventfold_http::router(runtime, HttpOptions::default());
    tokio::spawn(eventfold_http::serve_tls(
        listener,
        router,
        limits,
        tls,
        std::future::pending(),
    ));
    Server { addr, certs, _dir: dir }
}

/// `request` over TLS to `addr` as `localhost`, trusting `ca`; the whole answer.
async fn https(addr: SocketAddr, ca: &std::path::Path, request: &str) -> std::io::Result<String> {
    let config = tls::client_config(tls::certificates(ca).unwrap()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let mut stream = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

const COMMAND: &str = "POST /v1/aggregates/counter/c-1/commands HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
                       Content-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"type\":\"Add\",\"n\":1}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_ca_gets_answers_over_https() {
    let server = start(ServerLimits::default()).await;
    let answer = https(server.addr, &server.certs.ca, COMMAND).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let read = "GET /v1/aggregates/counter/c-1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let answer = https(server.addr, &server.certs.ca, read).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""version":1"#), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_refuses_the_server() {
    let server = start(ServerLimits::default()).await;
    let other = tempfile::tempdir().unwrap();
    let other = certs::generate(other.path(), "other");
    let err = https(server.addr, &other.ca, COMMAND).await.unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_gets_no_answer() {
    let server = start(ServerLimits::default()).await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(COMMAND.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
    // Closed (or reset) without an HTTP answer; at most a TLS alert.
    assert!(read.is_ok(), "the connection stays open");
    assert!(!String::from_utf8_lossy(&answer).contains("HTTP/1.1"), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_does_not_finish_in_time_is_cut_off() {
    let server = start(ServerLimits {
        header_read_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let started = Instant::now();
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "a silent client keeps its connection past the timeout");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // The server still serves.
    let answer = https(server.addr, &server.certs.ca, COMMAND).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarder_reaches_an_https_owner_only_when_it_trusts_its_ca() {
    let server = start(ServerLimits::default()).await;
    let base = format!("https://localhost:{}", server.addr.port());
    let request = || Request::builder().uri("/healthz").body(Body::empty()).unwrap();
    let trusting = tls::client_config(tls::certificates(&server.certs.ca).unwrap()).unwrap();
    let forwarder = Forwarder::with_tls("front", Duration::from_secs(5), Some(Arc::new(trusting)));
    let answer = forwarder.forward(&base, request()).await;
    assert_eq!(answer.status(), 200);
    let stranger = Forwarder::new("front", Duration::from_secs(5));
    let answer = stranger.forward(&base, request()).await;
    assert_eq!(answer.status(), 503);
    let body = axum::body::to_bytes(answer.into_body(), 1 << 16).await.unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("owner_unavailable") && body.contains("certificate"),
        "{body}"
    );
}

#[test]
fn files_that_are_not_pem_are_refused_with_their_name() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs::generate(dir.path(), "files");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let err = Tls::from_pem_files(&junk, &certs.key).unwrap_err().to_string();
    assert!(err.contains("junk.pem") && err.contains("no PEM certificates"), "{err}");
    let err = Tls::from_pem_files(&certs.cert, &junk).unwrap_err().to_string();
    assert!(err.contains("junk.pem") && err.contains("private key"), "{err}");
    let other = certs::generate(dir.path(), "other");
    let err = Tls::from_pem_files(&certs.cert, &other.key).unwrap_err().to_string();
    assert!(err.contains("do not make a server identity"), "{err}");
}
