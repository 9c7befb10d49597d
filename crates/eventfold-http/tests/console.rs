//! The web console's serving and the listings it reads, over real sockets: the page and its
//! assets with their media types, Content-Security-Policy, caching and ETag, open without a
//! token while every listing needs `read`; `GET /v1/aggregates`, `/v1/views` and
//! `/v1/process-managers` with real state after commands. (The pages themselves are driven
//! in headless Chromium by `scripts/console_test.py`.)

use eventfold_core::projection::Event;
use eventfold_core::testing::{Counter, CounterEvent};
use eventfold_core::{
    Actions, EventMeta, Index, Input, ProcessContext, ProcessManager, Projection, Subscription, ViewChanges,
};
use eventfold_http::HttpOptions;
use eventfold_http::auth::{Auth, AuthOptions, RateLimit, Role, entry_line};
use eventfold_http::console::CONTENT_SECURITY_POLICY;
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_runtime::{Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const READER: &str = "console-reader-0123456789";
const WRITER: &str = "console-writer-0123456789";

/// `totals`: one row per counter, indexed by `total`.
#[derive(Debug, Default)]
struct Totals;

impl Projection for Totals {
    const VIEW: &'static str = "totals";
    type Source = Counter;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::number("total"), Index::string("label").unique()]
    }
    fn apply(&self, event: &Event<'_, CounterEvent>, view: &mut ViewChanges<'_>) {
        let CounterEvent::Added { n } = event.payload;
        view.upsert(event.aggregate_id, json!({"total": n, "label": event.aggregate_id}));
    }
}

/// `tally`: counts what it sees; sends nothing.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Tally {
    seen: u64,
}

impl ProcessManager for Tally {
    const NAME: &'static str = "tally";
    type Event = CounterEvent;
    type Config = ();
    fn subscriptions(_: &()) -> Vec<Subscription<CounterEvent>> {
        vec![Subscription::to::<Counter>(|e| e)]
    }
    fn correlate(_: &CounterEvent, meta: &EventMeta<'_>) -> Option<String> {
        Some(meta.aggregate_id.to_owned())
    }
    fn react(&mut self, _: Input<'_, CounterEvent>, _: &ProcessContext<'_, ()>, _: &mut Actions) {
        self.seen += 1;
    }
}

struct Server {
    base: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
}

/// A server with an aggregate type, a view and a process manager; `tokens`: with a read
/// and a write token.
async fn start(tokens: bool) -> Server {
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
    .view::<Totals>()
    .process_manager::<Tally>(())
    .build(Arc::new(log));
    assert!(runtime.wait_restored(Duration::from_secs(10)).await);
    let mut options = HttpOptions::default();
    if tokens {
        let path = dir.path().join("tokens");
        let lines = [
            entry_line("reader", Role::Read, READER).unwrap(),
            entry_line("writer", Role::Write, WRITER).unwrap(),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let unlimited = AuthOptions {
            rate: RateLimit {
                per_second: 0,
                burst: 1,
            },
            protect_metrics: false,
        };
        options.auth = Some(Arc::new(Auth::open(path, unlimited).unwrap()));
    }
    let listener = eventfold_http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = eventfold_http::router(runtime, options);
    tokio::spawn(eventfold_http::serve(listener, router, std::future::pending()));
    Server {
        base,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Server {
    async fn call(&self, method: &str, path: &str, token: Option<&str>, headers: &[(&str, &str)]) -> Answer {
        let mut req = match method {
            "POST" => self.client.post(format!("{}{path}", self.base)),
            _ => self.client.get(format!("{}{path}", self.base)),
        };
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if method == "POST" {
            req = req.body(r#"{"type":"Add","n":3}"#);
        }
        let r = req.send().await.unwrap();
        let (status, headers) = (r.status(), r.headers().clone());
        Answer {
            status,
            headers,
            text: r.text().await.unwrap(),
        }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.call("GET", path, token, &[]).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_and_its_assets_are_served_with_their_types_and_security_headers() {
    let s = start(true).await;
    for (path, media) in [
        ("/console", "text/html; charset=utf-8"),
        ("/console/index.html", "text/html; charset=utf-8"),
        ("/console/console.js", "text/javascript; charset=utf-8"),
        ("/console/console.css", "text/css; charset=utf-8"),
        ("/console/icon.svg", "image/svg+xml"),
    ] {
        // No token: the files hold no data.
        let a = s.get(path, None).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text);
        assert_eq!(a.headers["content-type"], media, "{path}");
        assert_eq!(a.headers["content-security-policy"], CONTENT_SECURITY_POLICY, "{path}");
        assert_eq!(a.headers["cache-control"], "no-cache", "{path}");
        assert_eq!(a.headers["x-content-type-options"], "nosniff", "{path}");
        assert!(!a.text.is_empty(), "{path}");
        // Revalidation: the same ETag answers 304 with no body, another one the file.
        let etag = a.headers["etag"].to_str().unwrap().to_owned();
        let same = s.call("GET", path, None, &[("If-None-Match", &etag)]).await;
        assert_eq!(same.status, StatusCode::NOT_MODIFIED, "{path}");
        assert!(same.text.is_empty());
        assert_eq!(same.headers["content-security-policy"], CONTENT_SECURITY_POLICY);
        let other = s.call("GET", path, None, &[("If-None-Match", "\"0000\"")]).await;
        assert_eq!(other.status, StatusCode::OK, "{path}");
    }
    let csp = CONTENT_SECURITY_POLICY;
    assert!(csp.starts_with("default-src 'self'") && !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
    // The page loads its script and style from this origin and has none inline (the policy
    // would block it: the page would silently not work).
    let page = s.get("/console", None).await.text;
    assert!(
        page.contains(r#"<script src="/console/console.js" defer></script>"#),
        "{page}"
    );
    assert!(page.contains(r#"href="/console/console.css""#));
    assert_eq!(page.matches("<script").count(), 1, "one script, external");
    assert!(!page.contains("<style") && !page.contains("style="), "no inline style");
    let handlers: Vec<&str> = page
        .split(|c: char| c.is_whitespace())
        .filter(|w| {
            w.starts_with("on") && w.contains('=') && w[2..w.find('=').unwrap()].chars().all(|c| c.is_ascii_lowercase())
        })
        .collect();
    assert!(handlers.is_empty(), "inline event handlers: {handlers:?}");
    // An unknown asset: the API's JSON 404.
    let missing = s.get("/console/nope.js", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["error"], "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listings_need_a_read_token_and_commands_a_write_token() {
    let s = start(true).await;
    for path in ["/v1/aggregates", "/v1/views", "/v1/process-managers"] {
        let a = s.get(path, None).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(a.json()["error"], "unauthenticated");
        let a = s.get(path, Some(READER)).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text);
    }
    // What the console's command form shows a read token.
    let a = s
        .call("POST", "/v1/aggregates/counter/c-1/commands", Some(READER), &[])
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(a.json()["error"], "forbidden");
    let a = s
        .call("POST", "/v1/aggregates/counter/c-1/commands", Some(WRITER), &[])
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listings_show_types_views_and_process_managers_with_their_real_state() {
    let s = start(false).await;
    let types = s.get("/v1/aggregates", None).await;
    assert_eq!(
        types.json(),
        json!({"aggregates": [{"type": "counter", "partitions": 2}]})
    );
    for id in ["a", "b", "c"] {
        let a = s
            .call("POST", &format!("/v1/aggregates/counter/{id}/commands"), None, &[])
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    }
    // The view and the process manager apply the three events in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (views, pms) = loop {
        let views = s.get("/v1/views", None).await.json();
        let pms = s.get("/v1/process-managers", None).await.json();
        let applied: u64 = views["views"][0]["applied"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["offset"].as_u64().unwrap())
            .sum();
        if (applied == 3 && pms["process_managers"][0]["reactions"] == 3) || Instant::now() > deadline {
            break (views, pms);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let v = &views["views"][0];
    assert_eq!(views["views"].as_array().unwrap().len(), 1, "{views}");
    assert_eq!(v["view"], "totals");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["lag"], 0);
    assert_eq!(v["version"], 1);
    assert_eq!(v["source"], "counter");
    // A unique index makes a view replicated (a value must be unique across all rows).
    assert_eq!(v["scope"], "replicated");
    assert!(v.get("building").is_none(), "no rebuild runs: {v}");
    assert_eq!(
        v["indexes"],
        json!([
            {"name": "total", "field": "/total", "kind": "number", "unique": false},
            {"name": "label", "field": "/label", "kind": "string", "unique": true},
        ])
    );
    let applied: Vec<(u64, u64)> = v["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["partition"].as_u64().unwrap(), m["offset"].as_u64().unwrap()))
        .collect();
    assert_eq!(applied.iter().map(|(_, o)| o).sum::<u64>(), 3, "{v}");
    assert!(applied.iter().all(|(p, _)| *p < 2), "{v}");
    let pm = &pms["process_managers"][0];
    assert_eq!(pm["name"], "tally");
    assert_eq!(pm["state"], "ready", "{pm}");
    assert_eq!(pm["reactions"], 3, "{pm}");
    assert_eq!(pm["lag"], 0, "{pm}");
    for field in ["timers_pending", "timers_overdue", "commands_outstanding"] {
        assert_eq!(pm[field], 0, "{field}: {pm}");
    }
}
