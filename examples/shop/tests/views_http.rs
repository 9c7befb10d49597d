//! The shop's views over HTTP on a real socket: key lookups, index queries with ranges,
//! order, limits and cursor pages compared against a model computed from the commands
//! sent; read-your-writes with `min_position`; 504 past the bound; 400 for bad parameters;
//! and a restart that restores the views from their checkpoints.

mod common;

use eventfold::core::Position;
use eventfold::core::projection::Event;
use eventfold::core::time::rfc3339_ms;
use eventfold::http::HttpOptions;
use eventfold::log::testing::Intercept;
use eventfold::runtime::{ManualClock, Runtime, RuntimeOptions, ViewOptions};
use eventfold::store::{Store, StoreOptions};
use eventfold::{Index, Projection, Scope, ViewChanges};
use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shop::domain::{Customer, Order, OrderEvent};
use shop::views::{CustomersView, OrdersView};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A deliberately non-idempotent projection: counts the events of each order. Applied
/// twice, an event shows (an upsert-only view like `orders` converges under replay).
#[derive(Debug, Default)]
struct EventCounts;

impl Projection for EventCounts {
    const VIEW: &'static str = "event_counts";
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::number("n")]
    }
    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        let n = view.get(event.aggregate_id).map_or(0, |r| r["n"].as_u64().unwrap());
        view.upsert(event.aggregate_id, json!({"n": n + 1, "last_version": event.version}));
    }
}

/// 2024-05-06T00:00:00Z, a Monday.
const T0: i64 = 1_714_953_600_000;
const HOUR: i64 = 3_600_000;

struct Server {
    base: String,
    client: reqwest::Client,
    clock: ManualClock,
    runtime: Runtime,
    /// The positions of every command sent, merged: a query with it waits for all of them
    /// (one command's position names only its own partition).
    sent: std::sync::Mutex<Position>,
}

fn build(dir: &Path, clock: &ManualClock) -> Runtime {
    let log = common::test_log(dir);
    Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .aggregate::<Order>(())
    .aggregate::<Customer>(())
    .view::<OrdersView>()
    .view::<CustomersView>()
    .view::<EventCounts>()
    .build(Arc::new(log))
}

async fn start(dir: &Path) -> Server {
    let clock = ManualClock::at(T0);
    let runtime = build(dir, &clock);
    assert!(runtime.wait_restored(Duration::from_secs(10)).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = eventfold::http::router(
        runtime.clone(),
        HttpOptions {
            view_wait: Duration::from_millis(300),
            ..Default::default()
        },
    );
    tokio::spawn(eventfold::http::serve(listener, router, std::future::pending()));
    Server {
        base,
        client: reqwest::Client::new(),
        clock,
        runtime,
        sent: Default::default(),
    }
}

impl Server {
    /// Posts a command; returns its position (panics unless 200).
    async fn command(&self, ty: &str, id: &str, body: Value) -> String {
        let resp = self
            .client
            .post(format!("{}/v1/aggregates/{ty}/{id}/commands", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        let pos = body["position"].as_str().unwrap().to_owned();
        let mut sent = self.sent.lock().unwrap();
        for (topic, p, o) in Position::decode(&pos).unwrap().marks() {
            sent.advance(topic, p, o);
        }
        pos
    }

    /// The merged position of every command sent so far.
    fn sent_position(&self) -> String {
        self.sent.lock().unwrap().encode()
    }

    async fn get(&self, path_and_query: &str) -> (StatusCode, Value) {
        let resp = self
            .client
            .get(format!("{}{path_and_query}", self.base))
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    /// Follows `next_cursor` from `query` to the end; returns the keys of every page.
    async fn all_pages(&self, query: &str) -> Vec<Vec<String>> {
        let mut pages = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let q = match &cursor {
                Some(c) => format!("{query}&cursor={c}"),
                None => query.to_owned(),
            };
            let (st, body) = self.get(&q).await;
            assert_eq!(st, StatusCode::OK, "{q}: {body}");
            let keys: Vec<String> = body["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["key"].as_str().unwrap().to_owned())
                .collect();
            pages.push(keys);
            match body["next_cursor"].as_str() {
                Some(c) => {
                    assert!(
                        c.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                        "URL-safe cursor {c}"
                    );
                    cursor = Some(c.to_owned());
                }
                None => {
                    assert!(body["next_cursor"].is_null(), "{body}");
                    return pages;
                }
            }
            assert!(pages.len() < 1000, "cursor loop");
        }
    }
}

#[track_caller]
fn assert_error(status: StatusCode, body: &Value, want_status: StatusCode, code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| m.len() > 10), "{body}");
}

#[derive(Debug, Clone)]
struct ModelOrder {
    customer: String,
    status: &'static str,
    placed_at: i64,
    total: u64,
}

/// Sorts `(value, key)` pairs by value then key, ascending or descending, and returns keys.
fn ordered<V: Ord + Clone>(mut rows: Vec<(V, String)>, desc: bool) -> Vec<String> {
    rows.sort();
    if desc {
        rows.reverse();
    }
    rows.into_iter().map(|(_, k)| k).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_view_answers_like_the_model_page_by_page() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let mut rng = rand::rng();
    let mut model: BTreeMap<String, ModelOrder> = BTreeMap::new();
    for i in 0..80 {
        let id = format!("o-{i:03}");
        let customer = format!("c{}", rng.random_range(1..=4));
        let (qty, price) = (rng.random_range(1..5_u64), rng.random_range(0..3000_u64));
        s.clock.advance(rng.random_range(0..3) * HOUR); // some orders share a timestamp
        s.command(
            "order",
            &id,
            json!({"type":"PlaceOrder","customer_id":customer,"items":[{"sku":"x","qty":qty,"price_cents":price}]}),
        )
        .await;
        let mut o = ModelOrder {
            customer,
            status: "placed",
            placed_at: s.clock_now(),
            total: qty * price,
        };
        match rng.random_range(0..5) {
            0 => {
                s.command(
                    "order",
                    &id,
                    json!({"type":"AddItem","sku":"y","qty":1,"price_cents":99}),
                )
                .await;
                o.total += 99;
            }
            1 => {
                s.command("order", &id, json!({"type":"ConfirmOrder"})).await;
                o.status = "confirmed";
            }
            2 => {
                s.command("order", &id, json!({"type":"CancelOrder","reason":"test"}))
                    .await;
                o.status = "cancelled";
            }
            _ => {}
        }
        model.insert(id, o);
    }
    let mp = format!("min_position={}", s.sent_position());

    // Key lookup, with the row's exact shape.
    let (id, o) = model.iter().next().unwrap();
    let (st, body) = s.get(&format!("/v1/views/orders/{id}?{mp}")).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["key"], *id);
    assert_eq!(body["value"]["customer_id"], o.customer);
    assert_eq!(body["value"]["status"], o.status);
    assert_eq!(body["value"]["total_cents"], o.total);
    assert_eq!(body["value"]["placed_at"], rfc3339_ms(o.placed_at));
    let (st, body) = s.get("/v1/views/orders/o-nope").await;
    assert_error(st, &body, StatusCode::NOT_FOUND, "row_not_found");

    // Equality, every page size: pages concatenate to the model, no gap, no repeat.
    for limit in [1, 3, 7, 1000] {
        for c in ["c1", "c2"] {
            let pages = s
                .all_pages(&format!("/v1/views/orders?customer_id={c}&limit={limit}&{mp}"))
                .await;
            assert!(pages.iter().all(|p| p.len() <= limit));
            assert!(
                pages[..pages.len() - 1].iter().all(|p| p.len() == limit),
                "full pages but the last"
            );
            let got: Vec<String> = pages.concat();
            let want: Vec<String> = model
                .iter()
                .filter(|(_, o)| o.customer == c)
                .map(|(k, _)| k.clone())
                .collect();
            assert_eq!(got, want, "customer_id={c} limit={limit}");
        }
    }

    // Number ranges, both orders.
    for desc in [false, true] {
        let (lo, hi) = (1000, 6000);
        let order = if desc { "desc" } else { "asc" };
        let got = s
            .all_pages(&format!(
                "/v1/views/orders?total_cents_gte={lo}&total_cents_lt={hi}&order={order}&limit=4"
            ))
            .await
            .concat();
        let want = ordered(
            model
                .iter()
                .filter(|(_, o)| o.total >= lo && o.total < hi)
                .map(|(k, o)| (o.total, k.clone()))
                .collect(),
            desc,
        );
        assert_eq!(got, want, "total in [{lo},{hi}) {order}");
    }

    // Timestamp ranges with RFC 3339 bounds (and one in milliseconds).
    let (from, to) = (T0 + 10 * HOUR, T0 + 40 * HOUR);
    for q in [
        format!("placed_at_gte={}&placed_at_lt={}", rfc3339_ms(from), rfc3339_ms(to)),
        format!(
            "placed_at_gte={from}&placed_at_lt={}",
            rfc3339_ms(to).replace('Z', "%2B00:00")
        ),
    ] {
        let got = s.all_pages(&format!("/v1/views/orders?{q}&limit=5")).await.concat();
        let want = ordered(
            model
                .iter()
                .filter(|(_, o)| o.placed_at >= from && o.placed_at < to)
                .map(|(k, o)| (o.placed_at, k.clone()))
                .collect(),
            false,
        );
        assert_eq!(got, want, "{q}");
    }

    // The docs' question (docs/http-api.md): orders of c1 placed since `from` that are still unconfirmed:
    // the range drives, the equalities filter; small pages still concatenate correctly.
    for limit in [1, 2, 50] {
        let got = s
            .all_pages(&format!(
                "/v1/views/orders?status=placed&customer_id=c1&placed_at_gte={}&order=desc&limit={limit}",
                rfc3339_ms(from)
            ))
            .await
            .concat();
        let want = ordered(
            model
                .iter()
                .filter(|(_, o)| o.customer == "c1" && o.status == "placed" && o.placed_at >= from)
                .map(|(k, o)| (o.placed_at, k.clone()))
                .collect(),
            true,
        );
        assert_eq!(got, want, "docs/http-api.md query, limit {limit}");
    }

    // No condition: all rows in key order.
    let got = s.all_pages("/v1/views/orders?limit=30").await.concat();
    assert_eq!(got, model.keys().cloned().collect::<Vec<_>>());
    // Default limit is 20.
    let (_, body) = s.get("/v1/views/orders").await;
    assert_eq!(body["rows"].as_array().unwrap().len(), 20);
}

impl Server {
    fn clock_now(&self) -> i64 {
        use eventfold::runtime::Clock;
        self.clock.now_ms()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_with_the_position_of_a_command_sees_its_write() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    for i in 0..40 {
        let id = format!("ryw-{i}");
        let pos = s
            .command(
                "order",
                &id,
                json!({"type":"PlaceOrder","customer_id":"c-ryw","items":[{"sku":"x","qty":1,"price_cents":5}]}),
            )
            .await;
        let (st, body) = s.get(&format!("/v1/views/orders/{id}?min_position={pos}")).await;
        assert_eq!(st, StatusCode::OK, "key lookup right after the write: {body}");
        let pos = s.command("order", &id, json!({"type":"ConfirmOrder"})).await;
        let (st, body) = s
            .get(&format!(
                "/v1/views/orders?customer_id=c-ryw&status=confirmed&limit=1000&min_position={pos}"
            ))
            .await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(
            body["rows"].as_array().unwrap().len(),
            i + 1,
            "query right after the write"
        );
    }
}

/// A view lingering a minute after each notification (and polling as rarely) still
/// answers a query with `min_position` at once: the query cuts the linger short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_with_min_position_cuts_the_views_linger_short() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(T0);
    let runtime = Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .view_options(ViewOptions {
        linger: Duration::from_secs(60),
        poll_interval: Duration::from_secs(60),
        ..Default::default()
    })
    .aggregate::<Order>(())
    .aggregate::<Customer>(())
    .view::<OrdersView>()
    .view::<CustomersView>()
    .build(Arc::new(common::test_log(dir.path())));
    let s = serve(runtime, clock).await;
    for i in 0..3 {
        let id = format!("hurry-{i}");
        let pos = s
            .command(
                "order",
                &id,
                json!({"type":"PlaceOrder","customer_id":"c-h","items":[{"sku":"x","qty":1,"price_cents":5}]}),
            )
            .await;
        let started = Instant::now();
        let (st, body) = s.get(&format!("/v1/views/orders/{id}?min_position={pos}")).await;
        assert_eq!(st, StatusCode::OK, "the view applied the write: {body}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "answered after {:?}: the linger was not cut short",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_the_view_cannot_reach_is_504_with_the_current_position() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let pos = s
        .command(
            "order",
            "o-1",
            json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":5}]}),
        )
        .await;
    let (st, _) = s.get(&format!("/v1/views/orders/o-1?min_position={pos}")).await;
    assert_eq!(st, StatusCode::OK);
    let future = Position::at("shop.order.events", 0, 1_000_000).encode();
    for path in ["/v1/views/orders/o-1?", "/v1/views/orders?status=placed&"] {
        let started = Instant::now();
        let (st, body) = s.get(&format!("{path}min_position={future}")).await;
        assert_error(st, &body, StatusCode::GATEWAY_TIMEOUT, "view_behind");
        assert!(started.elapsed() >= Duration::from_millis(300), "waited the bound");
        let current = Position::decode(body["position"].as_str().expect("position in body")).unwrap();
        let reached: u64 = current.marks().map(|(_, _, o)| o).sum();
        assert_eq!(reached, 1, "the view applied the one event there is: {body}");
    }
    // Marks of another topic do not concern the view.
    let other = Position::at("shop.payment.events", 0, 1_000_000).encode();
    let (st, _) = s.get(&format!("/v1/views/orders/o-1?min_position={other}")).await;
    assert_eq!(st, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_are_400_with_error_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    s.command(
        "order",
        "o-1",
        json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":5}]}),
    )
    .await;
    for (q, code) in [
        ("/v1/views/orders?colour=red", "unknown_index"),
        ("/v1/views/orders?colour_gte=1", "unknown_index"),
        ("/v1/views/orders?order_by=colour", "unknown_index"),
        ("/v1/views/orders?total_cents=abc", "invalid_value"),
        ("/v1/views/orders?total_cents_gte=1e999", "invalid_value"),
        ("/v1/views/orders?placed_at_gte=yesterday", "invalid_value"),
        ("/v1/views/orders?limit=1001", "invalid_limit"),
        ("/v1/views/orders?limit=0", "invalid_limit"),
        ("/v1/views/orders?limit=-1", "invalid_limit"),
        ("/v1/views/orders?limit=ten", "invalid_limit"),
        ("/v1/views/orders?order=up", "invalid_order"),
        ("/v1/views/orders?cursor=!!!", "invalid_cursor"),
        ("/v1/views/orders?cursor=AAAA", "invalid_cursor"),
        ("/v1/views/orders?status=placed&status_gte=a", "conflicting_parameters"),
        (
            "/v1/views/orders?status=placed&status=confirmed",
            "conflicting_parameters",
        ),
        ("/v1/views/orders?min_position=nope", "invalid_position"),
        ("/v1/views/orders/o-1?min_position=nope", "invalid_position"),
        ("/v1/views/orders/o-1?status=placed", "unknown_parameter"),
        ("/v1/views/orders?total_cents_prefix=1", "unsupported_condition"),
        ("/v1/views/orders?placed_at_prefix=2024", "unsupported_condition"),
        ("/v1/views/orders?colour_prefix=r", "unknown_index"),
        (
            "/v1/views/orders?status=placed&status_prefix=p",
            "conflicting_parameters",
        ),
        (
            "/v1/views/orders?status_prefix=p&status_prefix=c",
            "conflicting_parameters",
        ),
    ] {
        let (st, body) = s.get(q).await;
        assert_error(st, &body, StatusCode::BAD_REQUEST, code);
    }
    let (st, body) = s.get("/v1/views/orders?limit=1000").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, body) = s.get("/v1/views/nope?x=1").await;
    assert_error(st, &body, StatusCode::NOT_FOUND, "unknown_view");
    let (st, body) = s.get("/v1/views/nope/k").await;
    assert_error(st, &body, StatusCode::NOT_FOUND, "unknown_view");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_of_another_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    for i in 0..3 {
        s.command(
            "order",
            &format!("o-{i}"),
            json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":5}]}),
        )
        .await;
    }
    let mut last = String::new();
    for _ in 0..100 {
        let (_, body) = s.get("/v1/views/orders?customer_id=c1&limit=1").await;
        if let Some(c) = body["next_cursor"].as_str() {
            last = c.to_owned();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!last.is_empty(), "a first page with a cursor");
    for q in [
        format!("/v1/views/orders?customer_id=c1&order=desc&cursor={last}"),
        format!("/v1/views/orders?status=placed&cursor={last}"),
        format!("/v1/views/orders?cursor={last}"),
    ] {
        let (st, body) = s.get(&q).await;
        assert_error(st, &body, StatusCode::BAD_REQUEST, "invalid_cursor");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_view_keeps_unique_emails_first_writer_wins() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let reg = |name: &str, email: &str| json!({"type":"RegisterCustomer","name":name,"email":email});
    let first = s.command("customer", "c1", reg("Ann", "a@x.test")).await;
    s.command("customer", "c2", reg("Bob", "b@x.test")).await;
    // "First" across partitions is the order the view applies them in: make c1 applied
    // before c3 is written.
    let (st, _) = s.get(&format!("/v1/views/customers/c1?min_position={first}")).await;
    assert_eq!(st, StatusCode::OK);
    let pos = s.command("customer", "c3", reg("Ann2", "a@x.test")).await;
    let keys = |body: &Value| -> Vec<String> {
        body["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let (st, body) = s
        .get(&format!("/v1/views/customers?email=a@x.test&min_position={pos}"))
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(keys(&body), ["c1"], "the first holder keeps the unique entry");
    let (st, body) = s.get("/v1/views/customers/c3").await;
    assert_eq!((st, &body["value"]["email"]), (StatusCode::OK, &json!("a@x.test")));
    let metrics = s.client.get(format!("{}/metrics", s.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("eventfold_view_unique_conflicts_total{view=\"customers\",index=\"email\"} 1"),
        "{metrics}"
    );
    // The holder moves: its old entry goes, the new one comes.
    let pos = s
        .command("customer", "c1", json!({"type":"ChangeEmail","email":"a2@x.test"}))
        .await;
    let (_, body) = s
        .get(&format!("/v1/views/customers?email=a2@x.test&min_position={pos}"))
        .await;
    assert_eq!(keys(&body), ["c1"]);
    let (_, body) = s.get("/v1/views/customers?email=a@x.test").await;
    assert!(keys(&body).is_empty(), "{body}");
    // A deleted customer leaves the view and frees its email.
    let pos = s.command("customer", "c2", json!({"type":"DeleteCustomer"})).await;
    let (st, body) = s.get(&format!("/v1/views/customers/c2?min_position={pos}")).await;
    assert_error(st, &body, StatusCode::NOT_FOUND, "row_not_found");
    let (_, body) = s.get("/v1/views/customers?email=b@x.test").await;
    assert!(keys(&body).is_empty(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_indexes_answer_prefix_queries() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;
    let mut all = Position::default();
    for (id, email) in [
        ("c1", "ann@a.test"),
        ("c2", "anna@b.test"),
        ("c3", "bob@b.test"),
        ("c4", "Ann@c.test"),
        ("c5", "an@x.test"),
        ("c6", "ann\u{0}@nul.test"),
    ] {
        let pos = s
            .command(
                "customer",
                id,
                json!({"type":"RegisterCustomer","name":"N","email":email}),
            )
            .await;
        for (topic, p, o) in Position::decode(&pos).unwrap().marks() {
            all.advance(topic, p, o);
        }
    }
    for (customer, order) in [
        ("c1", "o-1"),
        ("c10", "o-2"),
        ("c2", "o-3"),
        ("c1", "o-4"),
        ("c", "o-5"),
    ] {
        let pos = s
            .command(
                "order",
                order,
                json!({"type":"PlaceOrder","customer_id":customer,"items":[{"sku":"x","qty":1,"price_cents":5}]}),
            )
            .await;
        for (topic, p, o) in Position::decode(&pos).unwrap().marks() {
            all.advance(topic, p, o);
        }
    }
    let mp = format!("min_position={}", all.encode());
    // Rows come in value order (UTF-8 bytes, case-sensitive), a page at a time.
    for (query, want) in [
        ("customers?email_prefix=ann", vec!["c6", "c1", "c2"]),
        ("customers?email_prefix=ann%40", vec!["c1"]),
        ("customers?email_prefix=an", vec!["c5", "c6", "c1", "c2"]),
        ("customers?email_prefix=an&order=desc", vec!["c2", "c1", "c6", "c5"]),
        ("customers?email_prefix=ann&email_lt=anna", vec!["c6", "c1"]),
        ("customers?email_prefix=ann&email_gte=ann%40", vec!["c1", "c2"]),
        ("customers?email_prefix=A", vec!["c4"]),
        ("customers?email_prefix=", vec!["c4", "c5", "c6", "c1", "c2", "c3"]),
        ("customers?email_prefix=zz", vec![]),
        // On a non-unique index, and as a filter while another index drives.
        ("orders?customer_id_prefix=c1", vec!["o-1", "o-4", "o-2"]),
        (
            "orders?customer_id_prefix=c1&order_by=total_cents&order=desc",
            vec!["o-4", "o-2", "o-1"],
        ),
        (
            "orders?status=placed&customer_id_prefix=c",
            vec!["o-5", "o-1", "o-4", "o-2", "o-3"],
        ),
    ] {
        for limit in [1, 2, 100] {
            let got = s
                .all_pages(&format!("/v1/views/{query}&limit={limit}&{mp}"))
                .await
                .concat();
            assert_eq!(got, want, "{query} limit {limit}");
        }
    }
}

/// A view that sees every order event; new in the second phase of the readiness test, so
/// it starts from scratch over events that exist already.
#[derive(Debug, Default)]
struct LateView;

impl Projection for LateView {
    const VIEW: &'static str = "late";
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::number("version")]
    }
    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        view.upsert(event.aggregate_id, json!({"version": event.version}));
    }
}

/// A view that stops on the order of customer `bad` (an empty row key is refused).
#[derive(Debug, Default)]
struct FailsOnBad;

impl Projection for FailsOnBad {
    const VIEW: &'static str = "fails_on_bad";
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        Vec::new()
    }
    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        match event.payload {
            OrderEvent::OrderPlaced { customer_id, .. } if customer_id == "bad" => view.upsert("", json!({})),
            _ => view.upsert(event.aggregate_id, json!({})),
        }
    }
}

/// A partitioned view that keys rows by customer: rows outside the event's partition.
#[derive(Debug, Default)]
struct ByCustomerPartitioned;

impl Projection for ByCustomerPartitioned {
    const VIEW: &'static str = "by_customer";
    const SCOPE: Scope = Scope::Partitioned;
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        Vec::new()
    }
    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        if let OrderEvent::OrderPlaced { customer_id, .. } = event.payload {
            view.upsert(customer_id.as_str(), json!({"last_order": event.aggregate_id}));
        }
    }
}

/// A partitioned view with a unique index, which cannot be checked across instances.
#[derive(Debug, Default)]
struct UniquePartitioned;

impl Projection for UniquePartitioned {
    const VIEW: &'static str = "unique_partitioned";
    const SCOPE: Scope = Scope::Partitioned;
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::string("customer_id").unique()]
    }
    fn apply(&self, _: &Event<'_, OrderEvent>, _: &mut ViewChanges<'_>) {}
}

/// A partitioned view's rows must be keyed like their source: a row that falls in another
/// partition than its event stops that view partition with a message saying so (with one
/// instance nothing would notice, but with several the row would live on the wrong one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_view_refuses_rows_outside_the_events_partition() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(T0);
    let runtime = runtime_with(dir.path(), &clock, None, |b| b.view::<ByCustomerPartitioned>());
    let s = serve(runtime, clock).await;
    let place = |c: &str| json!({"type":"PlaceOrder","customer_id":c,"items":[{"sku":"x","qty":1,"price_cents":5}]});
    // Find an order id and a customer id that fall in different partitions.
    let partitions = s.runtime.log().partitions();
    let customer = "c-1";
    let order = (0..)
        .map(|n| format!("o-{n}"))
        .find(|o| {
            eventfold::core::partition::partition_for(o.as_bytes(), partitions)
                != eventfold::core::partition::partition_for(customer.as_bytes(), partitions)
        })
        .unwrap();
    s.command("order", &order, place(customer)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (st, body) = s.get("/readyz").await;
        if st == StatusCode::SERVICE_UNAVAILABLE {
            break body;
        }
        assert!(Instant::now() < deadline, "the view never failed: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let error = view_of(&body, "by_customer")["partitions"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        error.contains("is partitioned") && error.contains("row `c-1`") && error.contains("Scope::Replicated"),
        "{error}"
    );
}

#[test]
#[should_panic(expected = "is partitioned and declares unique index `customer_id`")]
fn a_partitioned_view_cannot_declare_a_unique_index() {
    let dir = tempfile::tempdir().unwrap();
    in_runtime(async {
        runtime_with(dir.path(), &ManualClock::at(T0), None, |b| {
            b.view::<UniquePartitioned>()
        });
    });
}

/// Serves `runtime` on port 0 like [`start`].
async fn serve(runtime: Runtime, clock: ManualClock) -> Server {
    assert!(runtime.wait_restored(Duration::from_secs(10)).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = eventfold::http::router(runtime.clone(), HttpOptions::default());
    tokio::spawn(eventfold::http::serve(listener, router, std::future::pending()));
    Server {
        base,
        client: reqwest::Client::new(),
        clock,
        runtime,
        sent: Default::default(),
    }
}

fn view_of<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["views"]
        .as_array()
        .unwrap_or_else(|| panic!("no views in {body}"))
        .iter()
        .find(|v| v["view"] == name)
        .unwrap_or_else(|| panic!("no view `{name}` in {body}"))
}

/// `/readyz` is 503 while a view catches up over the events that existed when it started
/// (here a view added to a service with history), naming it with its lag, while a view
/// restored from its checkpoint is ready; then 200 once it has caught up.
#[test]
fn readyz_reports_a_view_catching_up_then_ready() {
    let dir = tempfile::tempdir().unwrap();
    let orders = 120;
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let phase1 = rt();
    phase1.block_on(async {
        let s = start(dir.path()).await;
        let mut all = Position::default();
        for i in 0..orders {
            let pos = s
                .command(
                    "order",
                    &format!("o-{i}"),
                    json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":5}]}),
                )
                .await;
            for (topic, p, o) in Position::decode(&pos).unwrap().marks() {
                all.advance(topic, p, o);
            }
        }
        let (st, body) = s.get("/readyz").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(view_of(&body, "orders")["state"], "ready", "{body}");
        // Let the views apply everything, so they restart from a checkpoint at the end.
        let (st, _) = s.get(&format!("/v1/views/orders?min_position={}", all.encode())).await;
        assert_eq!(st, StatusCode::OK);
        drop(s.runtime);
    });
    phase1.shutdown_timeout(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(200));

    let phase2 = rt();
    phase2.block_on(async {
        let clock = ManualClock::at(T0);
        let log = common::test_log(dir.path());
        // Each read of the new view's catch-up takes 100 ms and brings 4 events: about
        // 30 events per partition take more than half a second.
        let log = Intercept::new(Arc::new(log)).slow_reads(Duration::from_millis(100));
        let runtime = Runtime::builder(RuntimeOptions {
            app_id: "shop".into(),
            ..Default::default()
        })
        .clock(Arc::new(clock.clone()))
        .view_options(ViewOptions {
            max_batch_events: 4,
            ..Default::default()
        })
        .aggregate::<Order>(())
        .aggregate::<Customer>(())
        .view::<OrdersView>()
        .view::<CustomersView>()
        .view::<LateView>()
        .build(Arc::new(log));
        let s = serve(runtime, clock).await;
        let (st, body) = s.get("/readyz").await;
        assert_error(st, &body, StatusCode::SERVICE_UNAVAILABLE, "not_ready");
        assert_eq!(
            body["partitions"],
            json!([]),
            "every aggregate partition restored: {body}"
        );
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("view `late` catching up"), "{message}");
        let late = view_of(&body, "late");
        assert_eq!(late["state"], "catching_up", "{body}");
        let lag = late["lag"].as_u64().unwrap();
        assert!(lag > 0 && lag <= orders, "{body}");
        let parts = late["partitions"].as_array().unwrap();
        assert!(!parts.is_empty(), "{body}");
        for p in parts {
            assert_eq!(p["state"], "catching_up", "{body}");
            assert!(p["end"].as_u64().unwrap() > p["applied"].as_u64().unwrap(), "{body}");
            assert_eq!(p["target"], p["end"], "nothing written since the start: {body}");
        }
        let restored = view_of(&body, "orders");
        assert_eq!(
            (&restored["state"], &restored["lag"], &restored["partitions"]),
            (&json!("ready"), &json!(0), &json!([])),
            "restored from its checkpoint: {body}"
        );
        // Then ready, for good.
        let deadline = Instant::now() + Duration::from_secs(20);
        let body = loop {
            let (st, body) = s.get("/readyz").await;
            if st == StatusCode::OK {
                break body;
            }
            assert!(Instant::now() < deadline, "the view never caught up: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(body["ready"], true);
        for name in ["orders", "late"] {
            let v = view_of(&body, name);
            assert_eq!((&v["state"], &v["lag"]), (&json!("ready"), &json!(0)), "{body}");
        }
        let late = view_of(&body, "late");
        let (st, rows) = s
            .get(&format!(
                "/v1/views/late?version=1&limit=1000&min_position={}",
                late["position"].as_str().unwrap()
            ))
            .await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(
            rows["rows"].as_array().unwrap().len() as u64,
            orders,
            "every order applied"
        );
        // Caught up once, ready for good: new writes the view has not applied yet (each
        // read takes 100 ms here) show as lag, not as unreadiness.
        let mut last = String::new();
        for i in 0..10 {
            last = s
                .command(
                    "order",
                    &format!("new-{i}"),
                    json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":5}]}),
                )
                .await;
        }
        let (st, body) = s.get("/readyz").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(view_of(&body, "late")["state"], "ready", "{body}");
        let (st, _) = s.get(&format!("/v1/views/late/new-9?min_position={last}")).await;
        assert_eq!(st, StatusCode::OK);
        drop(s.runtime);
    });
    phase2.shutdown_timeout(Duration::from_secs(5));
}

/// A view partition that stops makes `/readyz` 503, naming the view, the partition and
/// the reason; the other views stay ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_failed_view() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(T0);
    let log = common::test_log(dir.path());
    let runtime = Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .aggregate::<Order>(())
    .aggregate::<Customer>(())
    .view::<OrdersView>()
    .view::<CustomersView>()
    .view::<FailsOnBad>()
    .build(Arc::new(log));
    let s = serve(runtime, clock).await;
    let place = |c: &str| json!({"type":"PlaceOrder","customer_id":c,"items":[{"sku":"x","qty":1,"price_cents":5}]});
    let pos = s.command("order", "o-good", place("good")).await;
    let (st, _) = s
        .get(&format!("/v1/views/fails_on_bad/o-good?min_position={pos}"))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, body) = s.get("/readyz").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(view_of(&body, "fails_on_bad")["state"], "ready", "{body}");
    s.command("order", "o-bad", place("bad")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (st, body) = s.get("/readyz").await;
        if st == StatusCode::SERVICE_UNAVAILABLE {
            break body;
        }
        assert!(Instant::now() < deadline, "the view never failed: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(body["error"], "not_ready");
    assert!(
        body["message"].as_str().unwrap().contains("view `fails_on_bad` failed"),
        "{body}"
    );
    let v = view_of(&body, "fails_on_bad");
    assert_eq!(v["state"], "failed", "{body}");
    let p = &v["partitions"][0];
    assert_eq!(p["state"], "failed", "{body}");
    assert!(p["error"].as_str().unwrap().contains("row key"), "{body}");
    assert_eq!(view_of(&body, "orders")["state"], "ready", "{body}");
    let metrics = s.client.get(format!("{}/metrics", s.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let line = format!(
        "eventfold_view_up{{view=\"fails_on_bad\",partition=\"{}\"}} -1",
        p["partition"]
    );
    assert!(metrics.contains(&line), "{line} in {metrics}");
}

/// A rebuild that did not finish (its marker is still in the store) leaves a half-cleared
/// view: the service does not serve it, and `/readyz` says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_rebuild_keeps_the_view_failed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let mut b = eventfold::store::Batch::new();
        b.put_meta(&eventfold::runtime::view::rebuild_marker_key("orders"), 1);
        store.commit(b, true).unwrap();
    }
    let s = start(dir.path()).await;
    let (st, body) = s.get("/readyz").await;
    assert_error(st, &body, StatusCode::SERVICE_UNAVAILABLE, "not_ready");
    let orders = view_of(&body, "orders");
    assert_eq!(orders["state"], "failed", "{body}");
    let why = orders["partitions"][0]["error"].as_str().unwrap();
    assert!(why.contains("rebuild of view `orders` was interrupted"), "{why}");
    assert_eq!(view_of(&body, "customers")["state"], "ready", "{body}");
}

/// `order_totals` version 1: `{total}` per order.
#[derive(Debug, Default)]
struct TotalsV1;

impl Projection for TotalsV1 {
    const VIEW: &'static str = "order_totals";
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::number("total")]
    }
    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        if let OrderEvent::OrderPlaced { total_cents, .. } = event.payload {
            view.upsert(event.aggregate_id, json!({"total": total_cents}));
        }
    }
}

/// `order_totals` version 2: another row shape and another index.
#[derive(Debug, Default)]
struct TotalsV2;

impl Projection for TotalsV2 {
    const VIEW: &'static str = "order_totals";
    const VERSION: u32 = 2;
    type Source = Order;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::number("lines")]
    }
    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        if let OrderEvent::OrderPlaced { total_cents, items, .. } = event.payload {
            view.upsert(
                event.aggregate_id,
                json!({"total_cents": total_cents, "lines": items.len()}),
            );
        }
    }
}

/// A runtime over the store in `dir` with `register`ed views; reads take `slow` each.
fn runtime_with(
    dir: &Path,
    clock: &ManualClock,
    slow: Option<Duration>,
    register: impl FnOnce(eventfold::runtime::RuntimeBuilder) -> eventfold::runtime::RuntimeBuilder,
) -> Runtime {
    let log = common::test_log(dir);
    let log: Arc<dyn eventfold::log::Log> = match slow {
        Some(d) => Arc::new(Intercept::new(Arc::new(log)).slow_reads(d)),
        None => Arc::new(log),
    };
    let builder = Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .view_options(ViewOptions {
        max_batch_events: 4,
        ..Default::default()
    })
    .aggregate::<Order>(());
    register(builder).build(log)
}

fn in_runtime(f: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(f);
    rt.shutdown_timeout(Duration::from_secs(5));
    // The store closes once every task holding it is gone.
    std::thread::sleep(Duration::from_millis(200));
}

/// A new projection version builds side by side while the old one keeps serving (and
/// follows new events); queries switch once the new one has caught up, the old data is
/// removed, and a restart with only the new version serves it at once.
#[test]
fn a_new_projection_version_builds_side_by_side_then_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let orders = 60;
    let place =
        |i: usize| json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":10 + i}]});
    in_runtime(async {
        let clock = ManualClock::at(T0);
        let s = serve(runtime_with(dir.path(), &clock, None, |b| b.view::<TotalsV1>()), clock).await;
        for i in 0..orders {
            s.command("order", &format!("o-{i}"), place(i)).await;
        }
        let all = s.sent_position();
        let (st, body) = s.get(&format!("/v1/views/order_totals/o-1?min_position={all}")).await;
        assert_eq!((st, &body["value"]), (StatusCode::OK, &json!({"total": 11})));
        // Let every partition apply everything, so version 1 restarts at the end.
        let (st, body) = s.get("/readyz").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while s
            .runtime
            .view("order_totals")
            .unwrap()
            .position()
            .marks()
            .map(|(_, _, o)| o)
            .sum::<u64>()
            < orders as u64
        {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(s.runtime);
    });

    in_runtime(async {
        let clock = ManualClock::at(T0 + HOUR);
        let runtime = runtime_with(dir.path(), &clock, Some(Duration::from_millis(100)), |b| {
            b.view::<TotalsV1>().view::<TotalsV2>()
        });
        let s = serve(runtime, clock).await;
        // Version 1 answers, the instance is ready, version 2 builds.
        let (st, body) = s.get("/v1/views/order_totals/o-1").await;
        assert_eq!((st, &body["value"]), (StatusCode::OK, &json!({"total": 11})));
        let (st, body) = s.get("/readyz").await;
        assert_eq!(st, StatusCode::OK, "the old version serves: {body}");
        let v = view_of(&body, "order_totals");
        assert_eq!((&v["version"], &v["state"]), (&json!(1), &json!("ready")), "{body}");
        assert_eq!(v["building"]["version"], 2, "{body}");
        assert_eq!(v["building"]["state"], "catching_up", "{body}");
        // The old version follows new events while the new one builds.
        let pos = s.command("order", "o-new", place(1000)).await;
        let (st, body) = s.get(&format!("/v1/views/order_totals/o-new?min_position={pos}")).await;
        assert_eq!(
            (st, &body["value"]),
            (StatusCode::OK, &json!({"total": 1010})),
            "{body}"
        );
        let (st, body) = s.get("/v1/views/order_totals?lines=1").await;
        assert_error(st, &body, StatusCode::BAD_REQUEST, "unknown_index");
        // Then version 2 takes over.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, body) = s.get("/v1/views/order_totals/o-1").await;
            if body["value"] == json!({"total_cents": 11, "lines": 1}) {
                break;
            }
            assert_eq!(body["value"], json!({"total": 11}), "one version or the other");
            assert!(Instant::now() < deadline, "version 2 never took over");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (st, body) = s.get("/readyz").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        let v = view_of(&body, "order_totals");
        assert_eq!((&v["version"], &v["building"]), (&json!(2), &Value::Null), "{body}");
        let got = s
            .all_pages(&format!("/v1/views/order_totals?lines=1&limit=1000&min_position={pos}"))
            .await
            .concat();
        assert_eq!(
            got.len(),
            orders + 1,
            "every order, the one written during the build too"
        );
        // The old version's rows and entries are removed.
        let store = s.runtime.log().store().clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.count_view_rows("order_totals").unwrap() > 0 {
            assert!(Instant::now() < deadline, "version 1 data still there");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.count_view_rows("order_totals@v2").unwrap(), orders as u64 + 1);
        drop(s.runtime);
    });

    in_runtime(async {
        let clock = ManualClock::at(T0 + 2 * HOUR);
        let s = serve(runtime_with(dir.path(), &clock, None, |b| b.view::<TotalsV2>()), clock).await;
        let (st, body) = s.get("/readyz").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(view_of(&body, "order_totals")["version"], 2, "{body}");
        let (_, body) = s.get("/v1/views/order_totals/o-new").await;
        assert_eq!(body["value"], json!({"total_cents": 1010, "lines": 1}));
        drop(s.runtime);
    });
}

/// Views restore from their checkpoints: after a restart nothing is applied twice (the
/// totals would double) and nothing written meanwhile is missed.
#[test]
fn views_restore_from_their_checkpoints_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let run = |phase: u32| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = start(dir.path()).await;
            // Restored from the checkpoint at once, not replayed from the start.
            let restored = s.runtime.view("event_counts").unwrap().position();
            assert_eq!(restored.marks().map(|(_, _, o)| o).sum::<u64>(), 40 * u64::from(phase));
            // Every command's position, merged: queries wait for all partitions.
            let mut all = eventfold::core::Position::default();
            for i in 0..20 {
                let id = format!("p{phase}-{i}");
                s.command(
                    "order",
                    &id,
                    json!({"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"x","qty":1,"price_cents":10}]}),
                )
                .await;
                // Not idempotent in the view: applied twice, the total would be 208.
                let pos = s
                    .command(
                        "order",
                        &id,
                        json!({"type":"AddItem","sku":"y","qty":1,"price_cents":99}),
                    )
                    .await;
                for (topic, p, o) in eventfold::core::Position::decode(&pos).unwrap().marks() {
                    all.advance(topic, p, o);
                }
            }
            let pos = all.encode();
            let n = 20 * (phase as usize + 1);
            let got = s
                .all_pages(&format!("/v1/views/orders?customer_id=c1&limit=7&min_position={pos}"))
                .await
                .concat();
            assert_eq!(got.len(), n, "phase {phase}: {got:?}");
            let (_, body) = s
                .get(&format!(
                    "/v1/views/orders?total_cents=109&limit=1000&min_position={pos}"
                ))
                .await;
            assert_eq!(body["rows"].as_array().unwrap().len(), n, "phase {phase}: {body}");
            let (_, body) = s.get("/v1/views/orders?total_cents_gte=110&limit=1000").await;
            assert_eq!(body["rows"], json!([]), "nothing applied twice");
            let got = s
                .all_pages(&format!("/v1/views/event_counts?n=2&limit=9&min_position={pos}"))
                .await
                .concat();
            assert_eq!(got.len(), n, "every order's 2 events applied exactly once: {got:?}");
            let (_, body) = s
                .get(&format!("/v1/views/event_counts?n_gte=3&min_position={pos}"))
                .await;
            assert_eq!(body["rows"], json!([]), "nothing applied twice");
            drop(s.runtime);
        });
        rt.shutdown_timeout(Duration::from_secs(5));
    };
    run(0);
    // The store is closed once every task holding it is gone; reopen with retries.
    std::thread::sleep(Duration::from_millis(200));
    run(1);
}
