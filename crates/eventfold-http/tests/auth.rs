//! Authentication, authorization and limits over real sockets: the router with a token
//! file, served by `serve_with`, asked by reqwest and by raw TCP clients that send slowly.
//! (The shop's `tests/auth.rs` covers the flags, SIGHUP reloads and the refusal to start.)

use eventfold_core::testing::Counter;
use eventfold_http::auth::{Auth, AuthOptions, RateLimit, Role, entry_line};
use eventfold_http::forward::Forwarder;
use eventfold_http::{HttpOptions, ServerLimits};
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_runtime::{Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use reqwest::StatusCode;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const READER: &str = "r-token-0123456789";
const WRITER: &str = "w-token-0123456789";
const ADMIN: &str = "a-token-0123456789";

struct Server {
    base: String,
    addr: SocketAddr,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// The three tokens, one per role, as a token file in `dir`.
fn token_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    let lines = [
        entry_line("reader", Role::Read, READER).unwrap(),
        entry_line("writer", Role::Write, WRITER).unwrap(),
        entry_line("admin", Role::Admin, ADMIN).unwrap(),
    ];
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// A server with the `counter` aggregate; `auth`: with the three tokens and these options.
async fn start(auth: Option<AuthOptions>, mut options: HttpOptions, limits: ServerLimits) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), &StoreOptions::default()).unwrap();
    let log = EmbeddedLog::open(
        store,
        Options {
            partitions: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let runtime = Runtime::builder(RuntimeOptions {
        app_id: "test".into(),
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(Arc::new(log));
    assert!(runtime.wait_restored(Duration::from_secs(10)).await);
    options.auth = auth.map(|o| Arc::new(Auth::open(token_file(dir.path()), o).unwrap()));
    let listener = eventfold_http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let router = eventfold_http::router(runtime, options);
    tokio::spawn(eventfold_http::serve_with(
        listener,
        router,
        limits,
        std::future::pending(),
    ));
    Server {
        base: format!("http://{addr}"),
        addr,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

/// Limits high enough not to be met, so that a test sees only what it sets.
fn unlimited() -> AuthOptions {
    AuthOptions {
        rate: RateLimit {
            per_second: 0,
            burst: 1,
        },
        protect_metrics: false,
    }
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Server {
    async fn call(&self, method: &str, path: &str, token: Option<&str>) -> Answer {
        let mut req = match method {
            "POST" => self
                .client
                .post(format!("{}{path}", self.base))
                .body(r#"{"type":"Add","n":1}"#),
            _ => self.client.get(format!("{}{path}", self.base)),
        };
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let (status, headers) = (r.status(), r.headers().clone());
        let text = r.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer { status, headers, body }
    }
}

/// `a` is the error `code` (with a message, as every error).
fn assert_error(a: &Answer, status: u16, code: &str) {
    assert_eq!(a.status.as_u16(), status, "{}", a.body);
    assert_eq!(a.body["error"], code, "{}", a.body);
    assert!(a.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_gets_401_403_or_200_on_a_command_a_read_and_an_admin_route() {
    let s = start(Some(unlimited()), HttpOptions::default(), ServerLimits::default()).await;
    let command = ("POST", "/v1/aggregates/counter/c-1/commands");
    let read = ("GET", "/v1/aggregates/counter/c-1/events");
    let admin = ("GET", "/v1/cluster");
    // Without a token, or with a wrong one or another scheme: 401 with the challenge.
    for (method, path) in [command, read, admin] {
        for token in [None, Some("not-a-token"), Some(&READER[1..])] {
            let a = s.call(method, path, token).await;
            assert_error(&a, 401, "unauthenticated");
            let challenge = a.headers["www-authenticate"].to_str().unwrap();
            assert!(challenge.starts_with("Bearer"), "{challenge}");
            assert_eq!(challenge.contains("invalid_token"), token.is_some(), "{challenge}");
        }
    }
    let basic = s
        .client
        .get(format!("{}/v1/aggregates/counter/c-1/events", s.base))
        .basic_auth("reader", Some(READER))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED, "only Bearer counts");
    // Each role: (route, status).
    let expect = [
        (READER, [(command, 403), (read, 200), (admin, 403)]),
        (WRITER, [(command, 200), (read, 200), (admin, 403)]),
        (ADMIN, [(command, 200), (read, 200), (admin, 200)]),
    ];
    for (token, routes) in expect {
        for ((method, path), status) in routes {
            let a = s.call(method, path, Some(token)).await;
            if status == 403 {
                assert_error(&a, 403, "forbidden");
                let m = a.body["message"].as_str().unwrap();
                assert!(m.contains("needs `write`") || m.contains("needs `admin`"), "{m}");
            } else {
                assert_eq!(a.status.as_u16(), status, "{token} {method} {path}: {}", a.body);
            }
        }
    }
    // The commands of the write and admin tokens ran, the read token's did not.
    let events = s.call("GET", "/v1/aggregates/counter/c-1/events", Some(READER)).await;
    assert_eq!(events.body.as_array().map(Vec::len), Some(2), "{}", events.body);
    // The scheme's name is case-insensitive.
    let lower = s
        .client
        .get(format!("{}/v1/aggregates/counter/c-1", s.base))
        .header("authorization", format!("bearer {READER}"))
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_stay_open_and_metrics_is_open_unless_protected() {
    let s = start(Some(unlimited()), HttpOptions::default(), ServerLimits::default()).await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(s.call("GET", path, None).await.status, StatusCode::OK, "{path}");
        // A bad token on an open route does not matter.
        assert_eq!(s.call("GET", path, Some("junk")).await.status, StatusCode::OK, "{path}");
    }
    assert_error(&s.call("GET", "/openapi.json", None).await, 401, "unauthenticated");
    let protected = AuthOptions {
        protect_metrics: true,
        ..unlimited()
    };
    let s = start(Some(protected), HttpOptions::default(), ServerLimits::default()).await;
    assert_error(&s.call("GET", "/metrics", None).await, 401, "unauthenticated");
    assert_eq!(s.call("GET", "/metrics", Some(READER)).await.status, StatusCode::OK);
    assert_eq!(s.call("GET", "/healthz", None).await.status, StatusCode::OK);
    // The document says what each operation needs.
    let doc = s.call("GET", "/openapi.json", Some(READER)).await.body;
    let op = |path: &str, method: &str| doc["paths"][path][method].clone();
    assert_eq!(
        op("/v1/aggregates/{type}/{id}/commands", "post")["x-eventfold-role"],
        "write"
    );
    assert_eq!(op("/v1/aggregates/{type}/{id}", "get")["x-eventfold-role"], "read");
    assert_eq!(op("/v1/cluster", "get")["x-eventfold-role"], "admin");
    assert_eq!(op("/metrics", "get")["x-eventfold-role"], "read");
    assert_eq!(op("/healthz", "get")["security"], serde_json::json!([]));
    assert!(op("/v1/cluster", "get")["responses"]["403"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_rate_gets_429_with_retry_after_and_others_do_not() {
    let limited = AuthOptions {
        rate: RateLimit {
            per_second: 1,
            burst: 3,
        },
        protect_metrics: false,
    };
    let s = start(Some(limited), HttpOptions::default(), ServerLimits::default()).await;
    let path = "/v1/aggregates/counter/c-1";
    for _ in 0..3 {
        assert_eq!(s.call("GET", path, Some(READER)).await.status, StatusCode::NOT_FOUND);
    }
    let a = s.call("GET", path, Some(READER)).await;
    assert_error(&a, 429, "rate_limited");
    let retry: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert_eq!(retry, 1, "one request a second: the next fits within a second");
    // Another token has its own bucket; open routes have none.
    assert_eq!(s.call("GET", path, Some(WRITER)).await.status, StatusCode::NOT_FOUND);
    for _ in 0..5 {
        assert_eq!(s.call("GET", "/healthz", None).await.status, StatusCode::OK);
    }
    // After the wait, the token is let through again.
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(s.call("GET", path, Some(READER)).await.status, StatusCode::NOT_FOUND);
}

/// Opens a connection and sends a command's headers announcing `len` bytes of body, and no
/// body: the request holds its slot until the body deadline.
async fn stalled_command(addr: SocketAddr, len: usize) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/aggregates/counter/c-9/commands HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_bound_in_flight_get_503_overloaded_and_probes_still_answer() {
    let options = HttpOptions {
        max_in_flight: 2,
        body_read_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let s = start(None, options, ServerLimits::default()).await;
    let path = "/v1/aggregates/counter/c-1";
    assert_eq!(s.call("GET", path, None).await.status, StatusCode::NOT_FOUND);
    let first = stalled_command(s.addr, 10).await;
    let second = stalled_command(s.addr, 10).await;
    // Both are in their handlers' guard once their headers are read.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let a = s.call("GET", path, None).await;
        if a.status != StatusCode::NOT_FOUND || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_error(&refused, 503, "overloaded");
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(s.call("GET", "/healthz", None).await.status, StatusCode::OK);
    assert_eq!(s.call("GET", "/readyz", None).await.status, StatusCode::OK);
    // A client gone frees its slot.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let a = s.call("GET", path, None).await;
        if a.status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was not freed: {}", a.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(second);
}

/// Sends `GET /healthz` on `c` and reads its answer's status line within `within`.
async fn ask_health(c: &mut TcpStream, within: Duration) -> Option<String> {
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.ok()?;
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(within, c.read(&mut buf)).await.ok()?.ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_bound_wait_until_one_closes() {
    let limits = ServerLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
    };
    let s = start(None, HttpOptions::default(), limits).await;
    let mut a = TcpStream::connect(s.addr).await.unwrap();
    let mut b = TcpStream::connect(s.addr).await.unwrap();
    let wait = Duration::from_secs(2);
    assert_eq!(ask_health(&mut a, wait).await.as_deref(), Some("HTTP/1.1 200 OK"));
    assert_eq!(ask_health(&mut b, wait).await.as_deref(), Some("HTTP/1.1 200 OK"));
    // The third connects (the kernel's queue) but is not served while two are open.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    assert_eq!(ask_health(&mut c, Duration::from_millis(700)).await, None);
    drop(a);
    let mut status = String::new();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(wait, c.read(&mut buf))
        .await
        .expect("served once a slot is free")
        .unwrap();
    status.push_str(&String::from_utf8_lossy(&buf[..n]));
    assert!(status.starts_with("HTTP/1.1 200 OK"), "{status}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_its_headers_byte_by_byte_is_cut_off() {
    let limits = ServerLimits {
        header_read_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let s = start(None, HttpOptions::default(), limits).await;
    let head = b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nuser-agent: slowloris\r\naccept: */*\r\n\r\n";
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let started = Instant::now();
    let mut sent = 0;
    // One byte every 100 ms: the whole head would take about 7 s.
    let cut = loop {
        if sent == head.len() {
            break None;
        }
        if c.write_all(&head[sent..sent + 1]).await.is_err() {
            break Some(started.elapsed());
        }
        sent += 1;
        // The server closing shows as EOF (or a reset) on a read.
        let mut byte = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(100), c.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break Some(started.elapsed()),
            Ok(Ok(n)) => panic!("answered a request it had not fully read: {:?}", &byte[..n]),
            Err(_) => {}
        }
    };
    let cut = cut.unwrap_or_else(|| {
        panic!(
            "the whole head went out over {:?} and the connection stayed",
            started.elapsed()
        )
    });
    assert!(sent < head.len(), "cut off before the end of the headers");
    assert!(
        cut >= Duration::from_millis(900) && cut < Duration::from_secs(3),
        "cut off after {cut:?}, the timeout is 1 s"
    );
    // A normal client is served meanwhile and afterwards.
    assert_eq!(s.call("GET", "/healthz", None).await.status, StatusCode::OK);
    // A kept-alive connection that sends nothing after its answer is closed too.
    let mut idle = TcpStream::connect(s.addr).await.unwrap();
    assert_eq!(
        ask_health(&mut idle, Duration::from_secs(2)).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    let started = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest))
        .await
        .expect("an idle connection is closed")
        .ok();
    let idle_for = started.elapsed();
    assert!(
        idle_for >= Duration::from_millis(800) && idle_for < Duration::from_secs(3),
        "closed after {idle_for:?} idle, the timeout is 1 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes() {
    let options = HttpOptions {
        body_read_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let s = start(None, options, ServerLimits::default()).await;
    let body = br#"{"type":"Add","n":1}"#;
    let mut c = stalled_command(s.addr, body.len()).await;
    let started = Instant::now();
    // Half of the body, then nothing.
    c.write_all(&body[..body.len() / 2]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains(r#""error":"request_timeout""#), "{text}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // Nothing was run.
    let a = s.call("GET", "/v1/aggregates/counter/c-9", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    // A body in time is served.
    let a = s.call("POST", "/v1/aggregates/counter/c-9/commands", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
}

/// What a scattered query sends on to another instance: the caller's own token (the
/// other instance checks it), not a credential of the forwarding instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scattered_query_carries_the_callers_token_and_the_owner_checks_it() {
    // The "other instance": the same service with the three tokens.
    let owner = start(Some(unlimited()), HttpOptions::default(), ServerLimits::default()).await;
    let forwarder = Forwarder::new("front", Duration::from_secs(5));
    let path = "/v1/aggregates/counter/c-1";
    let ask = |token: Option<&str>| {
        let value = token.map(|t| reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).unwrap());
        let forwarder = forwarder.clone();
        let base = owner.base.clone();
        async move {
            forwarder
                .shard(&base, path, &[0], Duration::ZERO, value.as_ref())
                .await
                .unwrap()
                .status
        }
    };
    assert_eq!(ask(None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(ask(Some("unknown")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(ask(Some(READER)).await, StatusCode::NOT_FOUND, "read: let through");
    // A forwarded request: the whole request goes on, its Authorization with it.
    let front = {
        let forwarder = forwarder.clone();
        let base = owner.base.clone();
        let router = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let forwarder = forwarder.clone();
            let base = base.clone();
            async move { forwarder.forward(&base, req).await }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(eventfold_http::serve(listener, router, std::future::pending()));
        url
    };
    let client = reqwest::Client::new();
    let cmd = format!("{front}/v1/aggregates/counter/c-1/commands");
    let send = |token: &'static str| {
        client
            .post(&cmd)
            .bearer_auth(token)
            .body(r#"{"type":"Add","n":1}"#)
            .send()
    };
    assert_eq!(send(READER).await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(send(WRITER).await.unwrap().status(), StatusCode::OK);
    let anonymous = client.get(format!("{front}{path}")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    // Marking a request as forwarded (or as a part of a scattered query) buys nothing:
    // the owner checks the token as for any request.
    let marked = |req: reqwest::RequestBuilder| {
        req.header(eventfold_http::forward::FORWARDED_BY, "front")
            .header(eventfold_http::forward::SHARD_PARTITIONS, "0,1")
    };
    let direct = format!("{}/v1/aggregates/counter/c-1/commands", owner.base);
    let st = marked(client.post(&direct).body(r#"{"type":"Add","n":1}"#))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let st = marked(client.post(&direct).bearer_auth(READER).body(r#"{"type":"Add","n":1}"#))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, StatusCode::FORBIDDEN);
    let st = marked(client.get(format!("{}/v1/cluster", owner.base)).bearer_auth(WRITER))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, StatusCode::FORBIDDEN);
}
