//! `eventfold_http::forward::Forwarder` over real sockets: an "owner" axum server, a "front"
//! server whose fallback forwards everything to it, and a client talking to the front.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use eventfold_http::forward::{FORWARDED_BY, Forwarder};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Serves `router` on a fresh port of 127.0.0.1 and returns its base URL.
async fn serve(router: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// Echoes what arrived: `{method, path, query, x_test, forwarded_by, host, body}`, with
/// status 201 and a response header of its own.
async fn echo(req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let header = |name: &str| parts.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    let doc = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "x_test": header("x-test"),
        "forwarded_by": header(FORWARDED_BY),
        "host": header("host"),
        "connection_named": header("x-hop"),
        "body": String::from_utf8(body.to_vec()).unwrap(),
        "body_len": body.len(),
    });
    (
        StatusCode::CREATED,
        [("x-owner", "yes"), ("etag", "\"7\"")],
        axum::Json(doc),
    )
        .into_response()
}

/// An SSE stream: event `1` at once, event `2` only once `release` is notified, then the end.
async fn sse(State(release): State<Arc<Notify>>) -> impl IntoResponse {
    let events = futures_util::stream::unfold(0u32, move |n| {
        let release = release.clone();
        async move {
            match n {
                0 => Some((Ok::<_, Infallible>(Event::default().data("1")), 1)),
                1 => {
                    release.notified().await;
                    Some((Ok(Event::default().data("2")), 2))
                }
                _ => None,
            }
        }
    });
    Sse::new(events)
}

async fn rejected() -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        axum::Json(json!({"error": "insufficient_funds", "message": "no"})),
    )
        .into_response()
}

/// The owner server; `release` lets its SSE stream go on.
async fn owner(release: Arc<Notify>) -> String {
    let router = Router::new()
        .route("/sse", get(sse))
        .route("/rejected", any(rejected))
        .fallback(echo)
        .with_state(release);
    serve(router).await
}

/// A front server forwarding every request to `target`.
async fn front(target: String, timeout: Duration) -> String {
    let forwarder = Arc::new(Forwarder::new("front-1", timeout));
    let router = Router::new().fallback(move |req: Request| {
        let (forwarder, target) = (forwarder.clone(), target.clone());
        async move { forwarder.forward(&target, req).await }
    });
    serve(router).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test]
async fn method_path_query_headers_and_body_pass_through_both_ways() {
    let owner_url = owner(Arc::new(Notify::new())).await;
    let front_url = front(owner_url.clone(), Duration::from_secs(5)).await;
    let body = "x".repeat(200_000);
    let resp = client()
        .post(format!(
            "{front_url}/v1/aggregates/order/o-1/commands?min_position=abc&x=1"
        ))
        .header("x-test", "hello")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "must not pass")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()["x-owner"], "yes");
    assert_eq!(resp.headers()["etag"], "\"7\"");
    let got: Value = resp.json().await.unwrap();
    let owner_host = owner_url.trim_start_matches("http://");
    assert_eq!(got["method"], "POST");
    assert_eq!(got["path"], "/v1/aggregates/order/o-1/commands");
    assert_eq!(got["query"], "min_position=abc&x=1");
    assert_eq!(got["x_test"], "hello");
    assert_eq!(got["forwarded_by"], "front-1", "the owner sees the hop marker");
    assert_eq!(got["host"], owner_host, "Host names the owner, not the front");
    assert_eq!(
        got["connection_named"],
        Value::Null,
        "headers named in Connection are hop-by-hop"
    );
    assert_eq!(got["body_len"], 200_000);
    assert_eq!(got["body"], body);

    let resp = client().get(format!("{front_url}/v1/x/y")).send().await.unwrap();
    let got: Value = resp.json().await.unwrap();
    assert_eq!((got["method"].as_str(), got["query"].as_str()), (Some("GET"), None));
    assert_eq!(got["body"], "");

    let mut headers = HeaderMap::new();
    headers.insert(FORWARDED_BY, "front-1".parse().unwrap());
    assert!(Forwarder::already_forwarded(&headers));
}

#[tokio::test]
async fn error_statuses_and_bodies_of_the_owner_pass_through() {
    let front_url = front(owner(Arc::new(Notify::new())).await, Duration::from_secs(5)).await;
    let resp = client().post(format!("{front_url}/rejected")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let got: Value = resp.json().await.unwrap();
    assert_eq!(got, json!({"error": "insufficient_funds", "message": "no"}));
}

#[tokio::test]
async fn sse_events_stream_through_before_the_owner_ends_the_response() {
    let release = Arc::new(Notify::new());
    let front_url = front(owner(release.clone()).await, Duration::from_secs(5)).await;
    let mut seen = String::new();
    // The owner holds event 2 back until released: the headers and event 1 must arrive on
    // their own, while the owner's response is still open.
    let mut stream = tokio::time::timeout(Duration::from_secs(10), async {
        let resp = client()
            .get(format!("{front_url}/sse"))
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let mut stream = resp.bytes_stream();
        while !seen.contains("data: 1\n\n") {
            let chunk = stream.next().await.expect("stream ended early").unwrap();
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        stream
    })
    .await
    .unwrap_or_else(|_| panic!("event 1 did not stream through while the owner's response was open"));
    assert!(!seen.contains("data: 2"), "event 2 was not released yet: {seen:?}");
    release.notify_one();
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = stream.next().await {
            seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    })
    .await
    .expect("the stream ends after event 2");
    assert!(seen.ends_with("data: 2\n\n"), "{seen:?}");
}

async fn expect_owner_unavailable(resp: reqwest::Response, target: &str, reason: &str) {
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "owner_unavailable", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains(target), "the message names the owner: {message}");
    assert!(
        message.contains(reason),
        "the message gives the reason ({reason}): {message}"
    );
}

#[tokio::test]
async fn an_unreachable_owner_gives_503_owner_unavailable() {
    // A port nobody listens on any more.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let front_url = front(dead.clone(), Duration::from_secs(5)).await;
    let resp = client()
        .post(format!("{front_url}/v1/x"))
        .body("{}")
        .send()
        .await
        .unwrap();
    expect_owner_unavailable(resp, &dead, "onnect").await;
}

#[tokio::test]
async fn an_owner_that_does_not_answer_gives_503_after_the_timeout() {
    // Accepts connections, never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let front_url = front(silent.clone(), Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let resp = client().get(format!("{front_url}/v1/x")).send().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the timeout");
    expect_owner_unavailable(resp, &silent, "no response within").await;
}
