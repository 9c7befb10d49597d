//! End-to-end tests of the load generator against a tiny in-test HTTP server.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use eventfold_tools::load::{self, Ids, Limit, LoadOptions, Summary};
use serde_json::{Value, json};

/// How the test server answers.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// 200 to everything.
    Accept,
    /// 503 with `Retry-After: 0` on the first attempt of each key, then 200.
    UnavailableOnFirstAttempt,
    /// This status to everything.
    Always(StatusCode),
    /// 500 when the request number `n` in the key `{run}-{n}` is a multiple of 10.
    FailEveryTenth,
    /// 200 after this long.
    Slow(Duration),
    /// 200 with `Authorization: Bearer <this>`, else 401.
    RequireToken(&'static str),
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    aggregate_type: String,
    id: String,
    key: String,
    body: Value,
}

#[derive(Clone)]
struct Server {
    mode: Mode,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn attempts_by_key(&self) -> HashMap<String, usize> {
        let mut attempts = HashMap::new();
        for seen in self.seen() {
            *attempts.entry(seen.key).or_default() += 1;
        }
        attempts
    }
}

async fn command(
    State(server): State<Server>,
    Path((aggregate_type, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .map(|key| key.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let first_attempt = {
        let mut seen = server.seen.lock().unwrap();
        let first = !seen.iter().any(|s| s.key == key);
        seen.push(Seen {
            aggregate_type,
            id: id.clone(),
            key: key.clone(),
            body,
        });
        first
    };
    let accepted = Json(json!({"aggregate_id": id, "version": 1, "events": [], "position": "x"}));
    let authorization = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
    match server.mode {
        Mode::RequireToken(token) if authorization == Some(format!("Bearer {token}")) => accepted.into_response(),
        Mode::RequireToken(_) => (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "unauthenticated", "message": "no token"})),
        )
            .into_response(),
        Mode::Accept => accepted.into_response(),
        Mode::Slow(delay) => {
            tokio::time::sleep(delay).await;
            accepted.into_response()
        }
        Mode::UnavailableOnFirstAttempt if first_attempt => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "0")],
            Json(json!({"error": "restoring", "message": "try again"})),
        )
            .into_response(),
        Mode::UnavailableOnFirstAttempt => accepted.into_response(),
        Mode::Always(status) => (status, Json(json!({"error": "boom", "message": "always fails"}))).into_response(),
        Mode::FailEveryTenth => {
            let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
            if n.is_multiple_of(10) {
                StatusCode::INTERNAL_SERVER_ERROR.into_response()
            } else {
                accepted.into_response()
            }
        }
    }
}

/// `GET /v1/views/{view}/{key}`: 200 for keys `k0..k9`, 404 otherwise; records the key
/// (method GET: no idempotency key, no body).
async fn view_row(
    State(server): State<Server>,
    Path((view, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    assert!(
        headers.get("idempotency-key").is_none(),
        "a query carries no idempotency key"
    );
    server.seen.lock().unwrap().push(Seen {
        aggregate_type: view,
        id: key.clone(),
        key: String::new(),
        body: Value::Null,
    });
    if key
        .strip_prefix('k')
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n < 10)
    {
        Json(json!({"key": key})).into_response()
    } else {
        StatusCode::NOT_FOUND.into_response()
    }
}

/// Starts the server on a free port; returns its base URL.
async fn start(mode: Mode) -> (String, Server) {
    start_on(mode, "127.0.0.1:0").await
}

/// Starts the server on `addr`; returns its base URL.
async fn start_on(mode: Mode, addr: &str) -> (String, Server) {
    let server = Server {
        mode,
        seen: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/aggregates/{type}/{id}/commands", post(command))
        .route("/v1/views/{view}/{key}", axum::routing::get(view_row))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, server)
}

fn options(url: &str, count: u64) -> LoadOptions {
    LoadOptions {
        url: url.to_owned(),
        limit: Limit::Count(count),
        concurrency: 8,
        ..LoadOptions::default()
    }
}

fn assert_percentiles_monotonic(summary: &Summary) {
    let l = summary.latency_ms;
    assert!(l.p50 > 0.0, "{l:?}");
    assert!(
        l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p99_9 && l.p99_9 <= l.max,
        "{l:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_count_requests_each_with_a_distinct_key() {
    let (url, server) = start(Mode::Accept).await;

    let summary = load::run(options(&url, 200)).await.unwrap();

    let seen = server.seen();
    assert_eq!(seen.len(), 200);
    assert_eq!(server.attempts_by_key().len(), 200, "every key distinct");
    let ids: BTreeSet<_> = seen.iter().map(|s| s.id.clone()).collect();
    assert_eq!(ids.len(), 200, "the preset uses a fresh id per request");
    for s in &seen {
        assert_eq!(s.aggregate_type, "order");
        assert!(s.id.starts_with("load-"), "{}", s.id);
        assert_eq!(s.body["type"], "PlaceOrder");
        let customer = s.body["customer_id"].as_str().unwrap();
        let worker: usize = customer.strip_prefix('c').unwrap().parse().unwrap();
        assert!(worker < 8, "{customer}");
        assert!(s.key.starts_with(&summary.run_id), "{}", s.key);
    }

    assert_eq!(summary.requests, 200);
    assert_eq!(summary.status_count(200), 200);
    assert_eq!(summary.status.len(), 1, "{:?}", summary.status);
    assert_eq!((summary.errors, summary.retries, summary.failed()), (0, 0, 0));
    assert_eq!(summary.warmup_requests, 0);
    assert!(summary.throughput_per_s() > 0.0);
    assert!(!summary.interrupted);
    assert_percentiles_monotonic(&summary);
    summary.check().unwrap();

    let json = summary.to_json();
    assert_eq!(json["requests"], 200);
    assert_eq!(json["status"]["200"], 200);
    for code in ["412", "422", "503", "504", "errors"] {
        assert_eq!(json["status"][code], 0, "{code}");
    }
    assert_eq!(json["retries"], 0);
    assert_eq!(json["passed"], true);
    assert_eq!(json["error_rate"], 0.0);
    assert!(json["throughput_per_s"].as_f64().unwrap() > 0.0);
    assert!(json["elapsed_s"].as_f64().unwrap() > 0.0);
    for p in ["p50", "p90", "p99", "p99_9", "max", "mean"] {
        assert!(json["latency_ms"][p].as_f64().unwrap() > 0.0, "{p}");
    }

    let table = summary.to_string();
    for needle in ["200 requests", "p99.9", "504", "errors", ": ok"] {
        assert!(table.contains(needle), "{needle:?} missing from\n{table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_503_with_the_same_key() {
    let (url, server) = start(Mode::UnavailableOnFirstAttempt).await;

    let summary = load::run(options(&url, 200)).await.unwrap();

    let attempts = server.attempts_by_key();
    assert_eq!(attempts.len(), 200);
    assert!(
        attempts.values().all(|&n| n == 2),
        "each key is sent once, answered 503, and retried once with the same key"
    );
    assert_eq!(server.seen().len(), 400);
    assert_eq!(summary.requests, 200);
    assert_eq!(summary.retries, 200);
    assert_eq!(summary.status_count(200), 200);
    assert_eq!(summary.status_count(503), 0);
    assert_eq!(summary.to_json()["retries"], 200);
    assert_percentiles_monotonic(&summary);
    summary.check().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gives_up_after_the_configured_retries() {
    let (url, server) = start(Mode::Always(StatusCode::SERVICE_UNAVAILABLE)).await;
    let opts = LoadOptions {
        retries: 2,
        // No Retry-After here, so the backoff applies; keep it short.
        retry_after_max: Duration::from_millis(5),
        ..options(&url, 20)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(server.seen().len(), 60);
    assert!(server.attempts_by_key().values().all(|&n| n == 3));
    assert_eq!(summary.requests, 20);
    assert_eq!(summary.retries, 40);
    assert_eq!(summary.status_count(503), 20);
    assert_eq!(summary.to_json()["status"]["503"], 20);
    assert!(!summary.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_rate_above_the_threshold_fails_the_run() {
    let (url, server) = start(Mode::Always(StatusCode::INTERNAL_SERVER_ERROR)).await;

    let summary = load::run(options(&url, 200)).await.unwrap();

    assert_eq!(server.seen().len(), 200, "500 is not retried");
    assert_eq!(summary.status_count(500), 200);
    assert_eq!(summary.failed(), 200);
    assert_eq!(summary.error_rate(), 1.0);
    let message = summary.check().unwrap_err().to_string();
    assert!(message.contains("200 of 200 requests failed"), "{message}");
    assert!(message.contains("--max-error-rate"), "{message}");
    let json = summary.to_json();
    assert_eq!(json["passed"], false);
    assert_eq!(json["status"]["500"], 200);
    assert!(summary.to_string().contains("FAILED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threshold_compares_the_failed_fraction() {
    let (url, _server) = start(Mode::FailEveryTenth).await;

    let at_limit = load::run(LoadOptions {
        max_error_rate: 0.1,
        ..options(&url, 200)
    })
    .await
    .unwrap();
    assert_eq!(at_limit.status_count(500), 20);
    assert_eq!(at_limit.status_count(200), 180);
    assert_eq!(at_limit.error_rate(), 0.1);
    at_limit.check().unwrap();

    let below_limit = load::run(LoadOptions {
        max_error_rate: 0.09,
        ..options(&url, 200)
    })
    .await
    .unwrap();
    assert_eq!(below_limit.failed(), 20);
    assert!(below_limit.check().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_count_as_success_and_conflicts_do_not() {
    let (url, _) = start(Mode::Always(StatusCode::UNPROCESSABLE_ENTITY)).await;
    let rejected = load::run(options(&url, 50)).await.unwrap();
    assert_eq!(rejected.status_count(422), 50);
    assert_eq!(rejected.succeeded(), 50);
    rejected.check().unwrap();

    let (url, _) = start(Mode::Always(StatusCode::PRECONDITION_FAILED)).await;
    let conflicts = load::run(options(&url, 50)).await.unwrap();
    assert_eq!(conflicts.status_count(412), 50);
    assert_eq!(conflicts.to_json()["status"]["412"], 50);
    assert!(conflicts.check().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_the_offered_load() {
    let (url, server) = start(Mode::Accept).await;
    let opts = LoadOptions {
        rate: Some(200.0),
        ..options(&url, 100)
    };

    let started = Instant::now();
    let summary = load::run(opts).await.unwrap();
    let wall = started.elapsed();

    // Request 99 is due at 99 / 200 = 0.495 s after the start.
    assert!(wall >= Duration::from_millis(450), "{wall:?}");
    assert!(wall < Duration::from_secs(5), "{wall:?}");
    assert!(summary.elapsed >= Duration::from_millis(450), "{:?}", summary.elapsed);
    assert!(summary.throughput_per_s() <= 225.0, "{}", summary.throughput_per_s());
    assert_eq!(summary.requests, 100);
    assert_eq!(server.seen().len(), 100);
    assert_eq!(summary.to_json()["target_rate_per_s"], 200.0);
    assert_percentiles_monotonic(&summary);
    // A request's start lag is part of its latency, so every percentile is too.
    let (lag, latency) = (summary.start_lag_ms.expect("measured with a rate"), summary.latency_ms);
    assert!(
        lag.p50 <= latency.p50 && lag.p99 <= latency.p99 && lag.max <= latency.max,
        "{lag:?} {latency:?}"
    );
    assert!(summary.to_json()["start_lag_ms"]["p99"].is_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_that_falls_behind_its_schedule_reports_the_start_lag() {
    // One worker, 100 requests/s due, 50 ms per response: request n is due at 10n ms but
    // leaves at about 50n ms, so the last of 10 leaves about 360 ms late.
    let (url, _) = start(Mode::Slow(Duration::from_millis(50))).await;
    let opts = LoadOptions {
        rate: Some(100.0),
        concurrency: 1,
        ..options(&url, 10)
    };
    let summary = load::run(opts).await.unwrap();
    assert_eq!(summary.succeeded(), 10);
    let lag = summary.start_lag_ms.expect("measured with a rate");
    assert!(lag.max >= 300.0, "{lag:?}");
    assert!(lag.max <= summary.latency_ms.max, "{lag:?} {:?}", summary.latency_ms);
    let text = summary.to_string();
    assert!(text.contains("start lag"), "{text}");

    // Closed loop (no rate): nothing is scheduled, so there is no start lag to report.
    let (url, _) = start(Mode::Accept).await;
    let closed = load::run(options(&url, 10)).await.unwrap();
    assert!(closed.start_lag_ms.is_none());
    assert!(closed.to_json()["start_lag_ms"].is_null());
    assert!(!closed.to_string().contains("start lag"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_for_a_duration() {
    let (url, server) = start(Mode::Accept).await;
    let opts = LoadOptions {
        limit: Limit::Duration(Duration::from_millis(300)),
        rate: Some(100.0),
        ..options(&url, 1)
    };

    let started = Instant::now();
    let summary = load::run(opts).await.unwrap();
    let wall = started.elapsed();

    assert!(wall >= Duration::from_millis(290), "{wall:?}");
    assert!(wall < Duration::from_secs(3), "{wall:?}");
    // Requests due at 0, 10, ..., 290 ms.
    assert_eq!(summary.requests, 30);
    assert_eq!(server.seen().len(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_requests_are_sent_but_not_measured() {
    let (url, server) = start(Mode::Accept).await;
    let opts = LoadOptions {
        warmup: Duration::from_millis(200),
        ..options(&url, 50)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(summary.requests, 50);
    assert!(summary.warmup_requests > 0);
    assert_eq!(server.seen().len() as u64, 50 + summary.warmup_requests);
    assert_eq!(summary.status_count(200), 50);
    assert!(summary.elapsed < Duration::from_millis(200), "{:?}", summary.elapsed);
    // The warm-up's requests opened the workers' connections; they are counted too.
    assert!((1..=8).contains(&summary.connects), "{}", summary.connects);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_template_and_sequential_ids() {
    let (url, server) = start(Mode::Accept).await;
    let opts = LoadOptions {
        aggregate_type: "counter".to_owned(),
        body: r#"{"type":"Add","n":{n},"worker":{worker},"id":"{id}"}"#.to_owned(),
        ids: Ids::Sequential { count: 5 },
        id_prefix: "ctr-".to_owned(),
        ..options(&url, 200)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(summary.requests, 200);
    let seen = server.seen();
    let mut numbers = BTreeSet::new();
    for s in &seen {
        assert_eq!(s.aggregate_type, "counter");
        assert_eq!(s.body["id"].as_str().unwrap(), s.id, "{{id}} matches the path");
        let n = s.body["n"].as_u64().unwrap();
        assert_eq!(s.id, format!("ctr-{}", n % 5), "sequential ids cycle");
        assert!(s.body["worker"].as_u64().unwrap() < 8);
        numbers.insert(n);
    }
    assert_eq!(numbers, (0..200).collect(), "{{n}} is the global sequence number");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_ids_stay_within_the_range() {
    let (url, server) = start(Mode::Accept).await;
    let opts = LoadOptions {
        ids: Ids::Random { count: 3 },
        seed: Some(7),
        ..options(&url, 100)
    };

    load::run(opts).await.unwrap();

    let ids: BTreeSet<_> = server.seen().into_iter().map(|s| s.id).collect();
    let expected: BTreeSet<_> = (0..3).map(|k| format!("load-{k}")).collect();
    assert_eq!(ids, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_are_retried_and_counted() {
    // A port that was just free: connecting is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let opts = LoadOptions {
        retries: 2,
        retry_after_max: Duration::from_millis(5),
        concurrency: 2,
        ..options(&url, 10)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(summary.requests, 10);
    assert_eq!(summary.errors, 10);
    assert_eq!(summary.retries, 20);
    assert!(summary.first_error.is_some());
    assert_eq!(summary.to_json()["status"]["errors"], 10);
    assert!(summary.check().is_err());
}

#[tokio::test]
async fn invalid_options_are_rejected_before_sending() {
    let opts = LoadOptions {
        body: "{not json".to_owned(),
        ..LoadOptions::default()
    };
    let error = load::run(opts).await.unwrap_err().to_string();
    assert!(error.contains("not valid JSON"), "{error}");
}

/// Runs the `eventfold` binary to completion off the async runtime.
async fn eventfold(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_eventfold"))
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn load_args(url: &str, extra: &[&str]) -> Vec<String> {
    let base = ["load", "--url", url, "--count", "50", "--concurrency", "4"];
    base.iter().chain(extra).map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exits_non_zero_above_the_error_rate() {
    let (url, _) = start(Mode::Always(StatusCode::INTERNAL_SERVER_ERROR)).await;

    let output = eventfold(load_args(&url, &["--json", "--quiet"])).await;

    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["requests"], 50);
    assert_eq!(json["status"]["500"], 50);
    assert_eq!(json["passed"], false);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("50 of 50 requests failed"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_prints_a_table_and_succeeds() {
    let (url, server) = start(Mode::Accept).await;

    let output = eventfold(load_args(
        &url,
        &["--type", "counter", "--body", r#"{"n":{n}}"#, "--ids", "4"],
    ))
    .await;

    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("50 requests"), "{stdout}");
    assert!(stdout.contains("p99.9"), "{stdout}");
    assert_eq!(server.seen().len(), 50);
    assert!(server.seen().iter().all(|s| s.aggregate_type == "counter"));
}

#[tokio::test]
async fn cli_rejects_conflicting_and_incomplete_flags() {
    let url = "http://127.0.0.1:1";
    for extra in [
        &["--duration", "1s"][..],
        &["--body", "{}"][..],
        &["--sequential-ids"][..],
        &["--warmup", "ten"][..],
    ] {
        let output = eventfold(load_args(url, extra)).await;
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {output:?}");
    }
}

#[tokio::test]
async fn cli_help_documents_every_flag() {
    let output = eventfold(vec!["load".into(), "--help".into()]).await;
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--url",
        "--preset",
        "--type",
        "--body",
        "--ids",
        "--id-prefix",
        "--sequential-ids",
        "--concurrency",
        "--duration",
        "--count",
        "--rate",
        "--warmup",
        "--retries",
        "--retry-after-max",
        "--timeout",
        "--max-error-rate",
        "--seed",
        "--json",
        "--quiet",
    ] {
        let lines: Vec<&str> = help.lines().collect();
        let at = lines
            .iter()
            .position(|line| {
                let line = line.trim_start();
                line.starts_with('-') && line.split([' ', ',', '=']).any(|word| word == flag)
            })
            .unwrap_or_else(|| panic!("{flag} missing from\n{help}"));
        // Long help puts the description on the lines after the flag.
        let description = lines.get(at + 1).map_or("", |line| line.trim());
        assert!(
            !description.is_empty() && !description.starts_with('-'),
            "{flag} has no description in\n{help}"
        );
    }
    assert!(help.contains("shop-orders"), "{help}");
    assert!(
        help.contains("{id} (aggregate id), {n} (global request number) and {worker}"),
        "{help}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_mode_sends_queries_to_the_path_template() {
    let (url, server) = start(Mode::Accept).await;
    let opts = LoadOptions {
        get: Some("/v1/views/orders/{id}".into()),
        ids: Ids::Sequential { count: 10 },
        id_prefix: "k".into(),
        ..options(&url, 40)
    };
    let summary = load::run(opts).await.unwrap();
    assert_eq!(summary.status_count(200), 40, "{summary}");
    assert!(summary.url.starts_with("GET "), "{}", summary.url);
    let seen = server.seen();
    assert_eq!(seen.len(), 40);
    assert!(seen.iter().all(|s| s.aggregate_type == "orders"));
    let keys: BTreeSet<_> = seen.iter().map(|s| s.id.clone()).collect();
    assert_eq!(keys.len(), 10);

    // Keys past k9 are 404: failures, which the summary counts.
    let opts = LoadOptions {
        get: Some("/v1/views/orders/x{id}".into()),
        ids: Ids::Sequential { count: 10 },
        id_prefix: "k".into(),
        ..options(&url, 10)
    };
    let summary = load::run(opts).await.unwrap();
    assert_eq!(summary.status_count(404), 10);
    assert!(summary.check().is_err());
}

/// A raw HTTP/1.1 server on a free port that answers each request with `status` and then,
/// when `close` is set, `Connection: close` and closes; with `silent` it reads and never
/// answers. It answers nothing before it has accepted `answer_after` connections (waiting
/// at most 5 s), so that every worker of a run gets a request before any is done. Counts
/// the connections it accepted.
async fn raw_server(close: bool, silent: bool, answer_after: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One request: its head and the Content-Length bytes after it.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buf.len() < end + 4 + len {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    }
                    buf.drain(..end + 4 + len);
                    let gate = tokio::time::Instant::now() + Duration::from_secs(5);
                    while counter.load(std::sync::atomic::Ordering::SeqCst) < answer_after
                        && tokio::time::Instant::now() < gate
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    if silent {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    let body = r#"{"aggregate_id":"x","version":1,"events":[],"position":"p"}"#;
                    let connection = if close { "close" } else { "keep-alive" };
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: {connection}\r\n\r\n{body}",
                        body.len()
                    );
                    if socket.write_all(response.as_bytes()).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (url, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_closes_is_opened_again() {
    let (url, accepted) = raw_server(true, false, 0).await;
    let opts = LoadOptions {
        retries: 0,
        concurrency: 2,
        ..options(&url, 20)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(summary.status_count(200), 20, "{:?}", summary.first_error);
    assert_eq!(summary.errors, 0);
    // `Connection: close` after every response: one connection per request.
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 20);
    assert_eq!(summary.connects, 20);
    let connect = summary.connect_ms.expect("connections were opened");
    // Opening a connection is part of a request's time: never longer than the slowest.
    assert!(
        connect.max > 0.0 && connect.max <= summary.latency_ms.max,
        "{connect:?}"
    );
    assert_eq!(summary.to_json()["connects"], 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_carry_many_requests() {
    // Workers connect on their first request: without the gate two of them could take all
    // 60 before the third starts, and it would open no connection.
    let (url, accepted) = raw_server(false, false, 3).await;
    let opts = LoadOptions {
        retries: 0,
        concurrency: 3,
        ..options(&url, 60)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(summary.status_count(200), 60, "{:?}", summary.first_error);
    // One connection per worker, kept for the whole run.
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(summary.connects, 3, "the generator counts the connections it opened");
    assert!(summary.connect_ms.is_some_and(|c| c.max <= summary.latency_ms.max));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_without_an_answer_times_out_and_is_retried_on_a_new_connection() {
    let (url, accepted) = raw_server(false, true, 0).await;
    let opts = LoadOptions {
        retries: 1,
        retry_after_max: Duration::from_millis(5),
        timeout: Duration::from_millis(200),
        concurrency: 1,
        ..options(&url, 2)
    };

    let summary = load::run(opts).await.unwrap();

    assert_eq!(summary.errors, 2);
    assert_eq!(summary.retries, 2);
    let error = summary.first_error.clone().unwrap();
    assert!(error.contains("no complete response within 200ms"), "{error}");
    // Every attempt after a timeout connects again: 2 requests x 2 attempts.
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_url_is_served() {
    let (url, server) = start_on(Mode::Accept, "[::1]:0").await;
    assert!(url.starts_with("http://[::1]:"), "{url}");

    let summary = load::run(options(&url, 10)).await.unwrap();

    assert_eq!(summary.status_count(200), 10, "{:?}", summary.first_error);
    assert_eq!(server.seen().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_the_bearer_token_with_every_request() {
    let (url, server) = start(Mode::RequireToken("s3cret")).await;
    let summary = load::run(LoadOptions {
        token: Some("s3cret".into()),
        ..options(&url, 50)
    })
    .await
    .unwrap();
    assert_eq!(summary.status.get(&200), Some(&50), "{:?}", summary.status);
    assert_eq!(server.seen().len(), 50);
    // Without it (the check can fail): every request is refused.
    let summary = load::run(options(&url, 20)).await.unwrap();
    assert_eq!(summary.status.get(&401), Some(&20), "{:?}", summary.status);
    // A token that cannot be a header value is refused before anything is sent.
    let bad = LoadOptions {
        token: Some("line\nbreak".into()),
        ..options(&url, 1)
    };
    assert!(bad.validate().is_err());
}
