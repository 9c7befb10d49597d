//! HTTP contract tests (DESIGN §6) over a real socket: every route, every status code,
//! every error body `{error, message}`. The aggregate is eventfold's test counter, whose
//! `Slow` command lets the tests provoke overload (503) and timeouts (504).
//!
//! Every test runs twice: on the embedded log (`embedded::*`) and on a real Kafka broker
//! (`kafka::*`, at `EVENTFOLD_KAFKA_BOOTSTRAP`, default 127.0.0.1:9092; never skipped).

use eventfold_core::testing::Counter;
use eventfold_http::HttpOptions;
use eventfold_log::Log;
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_log::kafka::{KafkaLog, KafkaOptions};
use eventfold_log::testing::Intercept;
use eventfold_runtime::{Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Embedded,
    Kafka,
}

tokio::task_local! {
    /// The backend of the running test (set by the generated test functions).
    static BACKEND: Backend;
}

fn backend() -> Backend {
    BACKEND.try_with(|b| *b).unwrap_or(Backend::Embedded)
}

fn kafka_bootstrap() -> String {
    let b = std::env::var("EVENTFOLD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let addr = b
        .split(',')
        .next()
        .unwrap()
        .parse()
        .expect("EVENTFOLD_KAFKA_BOOTSTRAP is host:port");
    if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).is_err() {
        panic!("no Kafka broker at {b}: start one with `scripts/kafka/broker.sh start` (Kafka tests never skip)");
    }
    b
}

/// The log of a test server: embedded, or Kafka with topics of a fresh app id.
fn open_log(dir: &std::path::Path, partitions: u32) -> (Arc<dyn Log>, String) {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    match backend() {
        Backend::Embedded => {
            let log = EmbeddedLog::open(
                store,
                Options {
                    partitions,
                    ..Default::default()
                },
            )
            .unwrap();
            (Arc::new(log), "test".to_owned())
        }
        Backend::Kafka => {
            let app = format!("ct{}", uuid::Uuid::now_v7().simple());
            let options = KafkaOptions::new(kafka_bootstrap(), partitions, format!("{app}-0"));
            let log = tokio::task::block_in_place(|| KafkaLog::open(options, store)).unwrap();
            (Arc::new(log), app)
        }
    }
}

struct Server {
    base: String,
    runtime: Runtime,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn start_with(options: RuntimeOptions, partitions: u32) -> Server {
    let server = start_gated(options, partitions, |log| log).await;
    assert!(
        server.runtime.wait_restored(Duration::from_secs(10)).await,
        "partitions restore"
    );
    server
}

/// Starts a server whose log is wrapped by `wrap` (e.g. to hold the restore), without
/// waiting for the partitions to restore.
async fn start_gated(
    options: RuntimeOptions,
    partitions: u32,
    wrap: impl FnOnce(Arc<dyn Log>) -> Arc<dyn Log>,
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (log, app_id) = open_log(dir.path(), partitions);
    let runtime = Runtime::builder(RuntimeOptions { app_id, ..options })
        .aggregate::<Counter>(())
        .build(wrap(log));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = eventfold_http::router(
        runtime.clone(),
        HttpOptions {
            max_body_bytes: 1024,
            ..Default::default()
        },
    );
    tokio::spawn(eventfold_http::serve(listener, router, std::future::pending()));
    // Kafka mode: the partitions are this server's once the consumer group assigned them.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !runtime.has_joined() {
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer group assigns partitions"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Server {
        base,
        runtime,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

async fn start() -> Server {
    start_with(RuntimeOptions::default(), 4).await
}

impl Server {
    async fn post(
        &self,
        id: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = self
            .client
            .post(format!("{}/v1/aggregates/counter/{id}/commands", self.base))
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        (status, headers, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let resp = self.client.get(format!("{}{path}", self.base)).send().await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        (status, headers, resp.json().await.unwrap_or(Value::Null))
    }
}

/// Every error body is `{error: <code>, message: <sentence>}` (extra fields allowed).
#[track_caller]
fn assert_error(body: &Value, code: &str) {
    assert_eq!(body["error"], code, "error code in {body}");
    let msg = body["message"]
        .as_str()
        .unwrap_or_else(|| panic!("message is a string in {body}"));
    assert!(msg.len() > 10, "message is a sentence: {body}");
}

async fn post_command_answers_200_with_outcome_and_replays_it_for_the_same_key() {
    let s = start().await;
    let (st, _, body) = s
        .post("c-1", r#"{"type":"Add","n":5}"#, &[("Idempotency-Key", "key-1")])
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["aggregate_id"], "c-1");
    assert_eq!(body["version"], 1);
    let ev = &body["events"][0];
    assert_eq!(
        (ev["version"].as_u64(), ev["type"].as_str(), ev["command_id"].as_str()),
        (Some(1), Some("Added"), Some("key-1"))
    );
    assert_eq!(ev["payload"], json!({"type": "Added", "n": 5}));
    assert!(ev["timestamp"].as_str().unwrap().ends_with('Z'));
    let pos = eventfold_core::Position::decode(body["position"].as_str().unwrap()).unwrap();
    assert_eq!(pos.marks().count(), 1, "position names the events partition");

    // Same key: the original outcome, nothing executed again.
    let (st2, _, again) = s
        .post("c-1", r#"{"type":"Add","n":5}"#, &[("Idempotency-Key", "key-1")])
        .await;
    assert_eq!(st2, StatusCode::OK);
    assert_eq!(again, body, "a replayed key returns the original outcome (I3)");
    let (_, _, state) = s.get("/v1/aggregates/counter/c-1").await;
    assert_eq!(state["version"], 1, "the duplicate wrote nothing");

    // Without a key every POST is a new command.
    let (_, _, b) = s.post("c-1", r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!(b["version"], 2);
}

async fn post_command_bad_input_gets_400_404_413_with_error_bodies() {
    let s = start().await;
    for (body, code) in [
        ("{not json", "malformed_command"),
        (r#"{"n":1}"#, "malformed_command"),
        (r#"[1,2]"#, "malformed_command"),
        (r#"{"type":"Add","n":"five"}"#, "malformed_command"),
        (r#"{"type":"Explode"}"#, "unknown_command_type"),
    ] {
        let (st, _, b) = s.post("c-1", body, &[]).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body} -> {b}");
        assert_error(&b, code);
    }
    let (st, _, b) = s.post("c-1", r#"{"type":"Add","n":1}"#, &[("If-Match", "three")]).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_error(&b, "invalid_if_match");
    let (st, _, b) = s
        .post("c-1", r#"{"type":"Add","n":1}"#, &[("Idempotency-Key", "has space")])
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_error(&b, "bad_request");
    let (st, _, b) = s.post("bad%01id", r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_error(&b, "bad_request");

    let resp = s
        .client
        .post(format!("{}/v1/aggregates/nope/x/commands", s.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_error(&resp.json().await.unwrap(), "unknown_aggregate_type");

    let big = format!(r#"{{"type":"Add","n":1,"pad":"{}"}}"#, "x".repeat(2000));
    let (st, _, b) = s.post("c-1", &big, &[]).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&b, "payload_too_large");
    assert!(b["message"].as_str().unwrap().contains("1024"), "names the limit: {b}");

    // Nothing of the bad requests was written; the service still works.
    assert_eq!(s.get("/v1/aggregates/counter/c-1").await.0, StatusCode::NOT_FOUND);
    assert_eq!(s.post("c-1", r#"{"type":"Add","n":1}"#, &[]).await.0, StatusCode::OK);
}

async fn if_match_gets_412_on_mismatch_and_rejections_get_422() {
    let s = start().await;
    assert_eq!(s.post("c-2", r#"{"type":"Add","n":60}"#, &[]).await.0, StatusCode::OK);
    let (st, _, b) = s.post("c-2", r#"{"type":"Add","n":1}"#, &[("If-Match", "\"5\"")]).await;
    assert_eq!(st, StatusCode::PRECONDITION_FAILED);
    assert_error(&b, "version_mismatch");
    assert_eq!(
        (b["expected_version"].as_u64(), b["actual_version"].as_u64()),
        (Some(5), Some(1))
    );
    let (st, _, b) = s.post("c-2", r#"{"type":"Add","n":1}"#, &[("If-Match", "\"1\"")]).await;
    assert_eq!((st, b["version"].as_u64()), (StatusCode::OK, Some(2)));
    // If-Match "0": only while the aggregate does not exist.
    assert_eq!(
        s.post("c-new", r#"{"type":"Add","n":1}"#, &[("If-Match", "\"0\"")])
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        s.post("c-new", r#"{"type":"Add","n":1}"#, &[("If-Match", "\"0\"")])
            .await
            .0,
        StatusCode::PRECONDITION_FAILED
    );

    let (st, _, b) = s
        .post("c-2", r#"{"type":"Add","n":50}"#, &[("Idempotency-Key", "too-much")])
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_error(&b, "limit_exceeded");
    assert_eq!(
        b.as_object().unwrap().len(),
        2,
        "422 body is exactly {{error, message}}: {b}"
    );
    // A rejected command wrote nothing, and its replay is the same rejection.
    let (_, _, state) = s.get("/v1/aggregates/counter/c-2").await;
    assert_eq!(state["version"], 2);
    let (st, _, again) = s
        .post("c-2", r#"{"type":"Add","n":1}"#, &[("Idempotency-Key", "too-much")])
        .await;
    assert_eq!((st, again), (StatusCode::UNPROCESSABLE_ENTITY, b));
    // A rejected first command leaves no aggregate behind.
    assert_eq!(
        s.post("c-never", r#"{"type":"Add","n":500}"#, &[]).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(s.get("/v1/aggregates/counter/c-never").await.0, StatusCode::NOT_FOUND);
}

async fn overload_gets_503_with_retry_after() {
    let s = start_with(
        RuntimeOptions {
            queue_capacity: 1,
            max_batch: 1,
            ..Default::default()
        },
        1,
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (client, base) = (s.client.clone(), s.base.clone());
        tasks.push(tokio::spawn(async move {
            let r = client
                .post(format!("{base}/v1/aggregates/counter/c-{i}/commands"))
                .body(r#"{"type":"Slow","ms":300}"#)
                .send()
                .await
                .unwrap();
            let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
            (r.status(), retry, r.json::<Value>().await.unwrap())
        }));
    }
    let mut overloaded = 0;
    for t in tasks {
        let (st, retry, body) = t.await.unwrap();
        if st == StatusCode::SERVICE_UNAVAILABLE {
            overloaded += 1;
            assert_error(&body, "overloaded");
            assert_eq!(retry.as_deref(), Some("1"), "Retry-After on 503");
        } else {
            assert_eq!(st, StatusCode::OK, "{body}");
        }
    }
    assert!(
        overloaded >= 4,
        "a queue of 1 behind a slow command must refuse most of 8 ({overloaded} refused)"
    );
}

async fn slow_outcome_gets_504_and_a_retry_with_the_same_key_is_safe() {
    let s = start_with(
        RuntimeOptions {
            command_timeout: Duration::from_millis(100),
            ..Default::default()
        },
        1,
    )
    .await;
    let (st, _, b) = s
        .post("c-3", r#"{"type":"Slow","ms":400}"#, &[("Idempotency-Key", "slow-1")])
        .await;
    assert_eq!(st, StatusCode::GATEWAY_TIMEOUT);
    assert_error(&b, "outcome_unknown");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, _, b) = s
        .post("c-3", r#"{"type":"Slow","ms":400}"#, &[("Idempotency-Key", "slow-1")])
        .await;
    assert_eq!(st, StatusCode::OK, "the retry gets the stored outcome at once: {b}");
    let m = s.runtime.aggregate("counter").unwrap().metrics();
    assert_eq!(
        m.counted(eventfold_runtime::metrics::CommandOutcome::Duplicate),
        1,
        "executed once"
    );
}

async fn get_state_has_etag_and_404s() {
    let s = start().await;
    let (st, _, b) = s.get("/v1/aggregates/counter/none").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_error(&b, "aggregate_not_found");
    let (st, _, b) = s.get("/v1/aggregates/nope/x").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_error(&b, "unknown_aggregate_type");
    s.post("c-4", r#"{"type":"Add","n":2}"#, &[]).await;
    s.post("c-4", r#"{"type":"Add","n":3}"#, &[]).await;
    let (st, h, b) = s.get("/v1/aggregates/counter/c-4").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(h["etag"], "\"2\"");
    assert_eq!(b, json!({"id": "c-4", "version": 2, "state": {"total": 5}}));
    let r = s
        .client
        .get(format!("{}/v1/aggregates/counter/c-4", s.base))
        .header("If-None-Match", "\"2\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
}

async fn get_events_reads_from_version_and_400s_on_bad_query() {
    let s = start().await;
    for n in 1..=5 {
        s.post("c-5", &format!(r#"{{"type":"Add","n":{n}}}"#), &[]).await;
    }
    let (st, _, b) = s.get("/v1/aggregates/counter/c-5/events").await;
    assert_eq!(st, StatusCode::OK);
    let versions: Vec<u64> = b
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    for key in [
        "version",
        "type",
        "id",
        "command_id",
        "correlation_id",
        "causation_id",
        "timestamp",
        "payload",
    ] {
        assert!(b[0].get(key).is_some(), "event has {key}: {}", b[0]);
    }
    // Without a process manager in between, an event's cause is its command.
    assert_eq!(b[0]["causation_id"], b[0]["command_id"], "{}", b[0]);
    let (_, _, b) = s.get("/v1/aggregates/counter/c-5/events?from_version=4").await;
    assert_eq!(
        b.as_array()
            .unwrap()
            .iter()
            .map(|e| e["payload"]["n"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![4, 5]
    );
    let (_, _, b) = s.get("/v1/aggregates/counter/c-5/events?from_version=2&limit=2").await;
    assert_eq!(b.as_array().unwrap().len(), 2);
    let (_, _, b) = s.get("/v1/aggregates/counter/never/events").await;
    assert_eq!(b, json!([]));
    let (st, _, b) = s.get("/v1/aggregates/counter/c-5/events?from_version=abc").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_error(&b, "invalid_query");
}

async fn events_follow_live_over_sse() {
    let s = start().await;
    s.post("c-6", r#"{"type":"Add","n":1}"#, &[]).await;
    let resp = s
        .client
        .get(format!("{}/v1/aggregates/counter/c-6/events?from_version=1", s.base))
        .header("Accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let mut next_version = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while next_version <= 3 {
        if next_version == 2 && !text.contains("id: 2") {
            // The first event arrived from storage; now write two more and see them live.
            s.post("c-6", r#"{"type":"Add","n":2}"#, &[]).await;
            s.post("c-6", r#"{"type":"Add","n":3}"#, &[]).await;
        }
        let chunk = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("SSE events in time")
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while text.contains(&format!("id: {next_version}\n")) {
            next_version += 1;
        }
    }
    assert!(text.contains("event: Added"), "{text}");
    let data: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        data.iter().map(|e| e["version"].as_u64().unwrap()).collect::<Vec<_>>(),
        vec![1, 2, 3],
        "{text}"
    );
}

async fn health_ready_metrics_cluster_and_unknown_routes() {
    let s = start().await;
    let (st, _, b) = s.get("/healthz").await;
    assert_eq!((st, b), (StatusCode::OK, json!({"status": "ok"})));
    let (st, _, b) = s.get("/readyz").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(b["ready"], true);
    s.post("m-1", r#"{"type":"Add","n":1}"#, &[]).await;
    s.post("m-1", r#"{"type":"Add","n":500}"#, &[]).await;
    let text = s
        .client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("eventfold_commands_total{aggregate=\"counter\",outcome=\"accepted\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("eventfold_commands_total{aggregate=\"counter\",outcome=\"rejected\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("eventfold_commit_latency_seconds_count{aggregate=\"counter\"} 2"),
        "{text}"
    );
    // Both commands reached their partition; a malformed one (a 400) is not timed.
    let (st, _, _) = s.post("m-1", r#"{"type":"Add""#, &[]).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let text = s
        .client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("# TYPE eventfold_command_latency_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("eventfold_command_latency_seconds_count{aggregate=\"counter\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("eventfold_command_latency_seconds_bucket{aggregate=\"counter\",le=\"+Inf\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("eventfold_commit_batch_commands_bucket{aggregate=\"counter\",le=\"1\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("eventfold_restore_progress{aggregate=\"counter\",partition=\"3\"} 1"),
        "{text}"
    );
    let (st, _, b) = s.get("/v1/cluster").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        b["backend"],
        if backend() == Backend::Kafka {
            "kafka"
        } else {
            "embedded"
        }
    );
    assert_eq!(b["partitions"].as_array().unwrap().len(), 4);
    let (st, _, b) = s.get("/v1/nothing").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_error(&b, "not_found");
    let r = s
        .client
        .delete(format!("{}/v1/aggregates/counter/m-1", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_error(&r.json().await.unwrap(), "method_not_allowed");
}

async fn corrupt_state_stops_its_partition_only() {
    let s = start().await;
    let parts = 4;
    let part = |id: &str| eventfold_core::partition::partition_for(id.as_bytes(), parts);
    let bad = "victim";
    let same = (0..)
        .map(|i| format!("same-{i}"))
        .find(|id| part(id) == part(bad))
        .unwrap();
    let other = (0..)
        .map(|i| format!("other-{i}"))
        .find(|id| part(id) != part(bad))
        .unwrap();
    assert_eq!(s.post(&other, r#"{"type":"Add","n":1}"#, &[]).await.0, StatusCode::OK);
    // Flip the stored state of `victim` on disk, as a bad sector would.
    s.runtime
        .log()
        .store()
        .overwrite_state_raw("counter", bad, b"\x00\x01garbage")
        .unwrap();

    let (st, _, b) = s.get(&format!("/v1/aggregates/counter/{bad}")).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_error(&b, "corrupt_record");
    let (st, _, b) = s.post(bad, r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_error(&b, "partition_failed");
    let msg = b["message"].as_str().unwrap();
    assert!(
        msg.contains("state") && msg.contains(bad) && msg.contains("checksum"),
        "names what is corrupt: {msg}"
    );
    // The partition stays stopped for every aggregate on it ...
    let (st, _, b) = s.post(&same, r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_error(&b, "partition_failed");
    // ... while the other partitions keep serving.
    let (st, _, b) = s.post(&other, r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!((st, b["version"].as_u64()), (StatusCode::OK, Some(2)));
    let (st, _, b) = s.get("/readyz").await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&b, "not_ready");
    assert_eq!(b["partitions"][0]["partition"], part(bad));
    assert_eq!(b["partitions"][0]["state"], "failed");
}

async fn undecodable_stored_state_stops_its_partition_with_a_clear_error() {
    let s = start_with(RuntimeOptions::default(), 1).await;
    // Checksum fine, content not a Counter: as after an incompatible change of the state type.
    let mut b = eventfold_store::Batch::new();
    b.put_state("counter", "old-shape", 3, br#"{"total":"three"}"#);
    s.runtime.log().store().commit(b, true).unwrap();
    let (st, _, b) = s.post("old-shape", r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_error(&b, "partition_failed");
    let msg = b["message"].as_str().unwrap();
    assert!(
        msg.contains("state does not decode") && msg.contains("counter/old-shape"),
        "{msg}"
    );
}

async fn restoring_partitions_show_in_readyz_and_get_503_past_the_queue_bound() {
    let gate = std::sync::Mutex::new(None);
    let s = start_gated(
        RuntimeOptions {
            restore_queue_limit: 1,
            ..Default::default()
        },
        1,
        |log| {
            let (gated, g) = Intercept::new(log).gate_end_offsets();
            *gate.lock().unwrap() = Some(g);
            Arc::new(gated)
        },
    )
    .await;
    let gate = gate.lock().unwrap().take().unwrap();
    let (st, h, b) = s.get("/readyz").await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&b, "not_ready");
    assert!(h.contains_key("retry-after"));
    assert_eq!(b["partitions"][0]["state"], "restoring");
    // One command may wait for the barrier; the next one is refused with 503.
    let (client, base) = (s.client.clone(), s.base.clone());
    let waiting = tokio::spawn(async move {
        client
            .post(format!("{base}/v1/aggregates/counter/w/commands"))
            .body(r#"{"type":"Add","n":1}"#)
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (st, h, b) = s.post("x", r#"{"type":"Add","n":1}"#, &[]).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert_error(&b, "partition_restoring");
    assert_eq!(h["retry-after"], "1");
    gate.open();
    assert_eq!(
        waiting.await.unwrap().unwrap().status(),
        StatusCode::OK,
        "the waiting command runs after the barrier"
    );
    assert!(s.runtime.wait_restored(Duration::from_secs(5)).await);
    assert_eq!(s.get("/readyz").await.0, StatusCode::OK);
}

/// Generates one test per backend for each contract check.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::BACKEND.scope(super::Backend::Embedded, super::$name()).await
                }
            )*
        }
        mod kafka {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::BACKEND.scope(super::Backend::Kafka, super::$name()).await
                }
            )*
        }
    };
}

on_both_backends!(
    post_command_answers_200_with_outcome_and_replays_it_for_the_same_key,
    post_command_bad_input_gets_400_404_413_with_error_bodies,
    if_match_gets_412_on_mismatch_and_rejections_get_422,
    overload_gets_503_with_retry_after,
    slow_outcome_gets_504_and_a_retry_with_the_same_key_is_safe,
    get_state_has_etag_and_404s,
    get_events_reads_from_version_and_400s_on_bad_query,
    events_follow_live_over_sse,
    health_ready_metrics_cluster_and_unknown_routes,
    corrupt_state_stops_its_partition_only,
    undecodable_stored_state_stops_its_partition_with_a_clear_error,
    restoring_partitions_show_in_readyz_and_get_503_past_the_queue_bound,
);
