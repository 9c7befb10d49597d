//! Property test of the shop's views against a model, over real HTTP.
//!
//! Each case starts the shop's aggregates and views on a fresh embedded log, sends a
//! random sequence of order and customer commands (many of them rejected by the domain
//! rules), and folds the events of the **accepted** commands, as returned in the
//! responses, into a plain model of the rows. Then it asks random queries — equality,
//! ranges, string prefixes, several conditions at once, `order_by`, both orders, random limits —
//! and follows every `next_cursor`: the pages must concatenate to exactly the model's
//! answer, in the documented order (driving value, then key), with no gap or repeat.
//! Half of the cases use a tiny scan budget (`ViewOptions::max_scanned`), so pages end
//! early and cursors resume in the middle of filtered runs.
//!
//! Orders name registered customers half of the time: every order row read must carry
//! its customer's current email (`customer_email`, joined from the `customers` lookup
//! table), `null` when the customer is unknown or deleted, as the model says.
//!
//! The same cases also run on Kafka with **two instances** (in-process runtimes, each with
//! its own store, HTTP server and registry entry, splitting the order partitions):
//! `orders` is partitioned, so every query is scattered to both and merged, key lookups
//! are forwarded, and requests go to either instance in turn. A third instance runs the
//! customers (their commands go there); the two order instances hold the `customers`
//! lookup table from its events.
//!
//! On one instance, each case ends with both views rebuilt offline from a copy of the
//! events and served again: every row and email as the model says.
//!
//! Replay one case with `EVENTFOLD_PROPTEST_SEED=<seed>`; run more with
//! `EVENTFOLD_PROPTEST_CASES=<n>` (default 24; the Kafka test runs a quarter of them, at
//! least 2).

mod common;

use eventfold::core::Position;
use eventfold::core::time::{parse_rfc3339_ms, rfc3339_ms};
use eventfold::http::HttpOptions;
use eventfold::log::Log;
use eventfold::log::kafka::{KafkaLog, KafkaOptions};
use eventfold::runtime::view::rebuild;
use eventfold::runtime::{ManualClock, Registry, Runtime, RuntimeOptions, ViewOptions};
use eventfold::store::{Store, StoreOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use shop::domain::{Customer, Order};
use shop::views::{CustomersView, OrdersView};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// 2024-05-06T00:00:00Z.
const T0: i64 = 1_714_953_600_000;
const HOUR: i64 = 3_600_000;

const CUSTOMER_IDS: [&str; 5] = ["c1", "c2", "c3", "c10", "c2x"];
/// Few addresses, sharing prefixes, so unique conflicts and prefix queries both happen.
const EMAILS: [&str; 8] = [
    "ann@a.test",
    "anna@a.test",
    "ann@b.test",
    "bob@b.test",
    "bo@b.test",
    "zed@z.test",
    "Ann@a.test",
    "ann@a.testx",
];

/// A value as the views order it: numbers numerically, strings by their UTF-8 bytes
/// (which is how Rust orders `String`s).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum V {
    Num(i128),
    Str(String),
}

#[derive(Debug, Clone)]
struct OrderRow {
    customer_id: String,
    status: String,
    placed_at: i64,
    total_cents: u64,
}

impl OrderRow {
    fn field(&self, index: &str) -> V {
        match index {
            "customer_id" => V::Str(self.customer_id.clone()),
            "status" => V::Str(self.status.clone()),
            "placed_at" => V::Num(self.placed_at.into()),
            "total_cents" => V::Num(self.total_cents.into()),
            _ => unreachable!("{index}"),
        }
    }
}

#[derive(Debug, Default)]
struct Model {
    orders: BTreeMap<String, OrderRow>,
    customers: BTreeMap<String, String>,
    /// email -> the customer holding it in the unique `email` index (first writer wins;
    /// a value is not handed over when its holder lets it go).
    email_holder: BTreeMap<String, String>,
}

impl Model {
    /// Folds one accepted event (as returned by the command endpoint) into the model.
    fn apply(&mut self, ty: &str, id: &str, event: &Value) {
        let p = &event["payload"];
        let ts = parse_rfc3339_ms(event["timestamp"].as_str().unwrap()).expect("RFC 3339 timestamp");
        match (ty, p["type"].as_str().unwrap()) {
            ("order", "OrderPlaced") => {
                let row = OrderRow {
                    customer_id: p["customer_id"].as_str().unwrap().to_owned(),
                    status: "placed".into(),
                    placed_at: ts,
                    total_cents: p["total_cents"].as_u64().unwrap(),
                };
                self.orders.insert(id.to_owned(), row);
            }
            ("order", "ItemAdded") => {
                let o = self.orders.get_mut(id).expect("placed before");
                o.total_cents += p["qty"].as_u64().unwrap() * p["price_cents"].as_u64().unwrap();
            }
            ("order", t) => {
                let status = match t {
                    "OrderConfirmed" => "confirmed",
                    "OrderCancelled" => "cancelled",
                    "OrderShipped" => "shipped",
                    _ => panic!("unexpected order event {event}"),
                };
                self.orders.get_mut(id).expect("placed before").status = status.into();
            }
            ("customer", "CustomerRegistered" | "EmailChanged") => {
                let email = p["email"].as_str().unwrap().to_owned();
                let old = self.customers.insert(id.to_owned(), email.clone());
                self.move_email(id, old, Some(email));
            }
            ("customer", "CustomerDeleted") => {
                let old = self.customers.remove(id);
                self.move_email(id, old, None);
            }
            _ => panic!("unexpected event {event}"),
        }
    }

    fn move_email(&mut self, id: &str, old: Option<String>, new: Option<String>) {
        if old == new {
            return;
        }
        if let Some(old) = old
            && self.email_holder.get(&old).map(String::as_str) == Some(id)
        {
            self.email_holder.remove(&old);
        }
        if let Some(new) = new {
            self.email_holder.entry(new).or_insert_with(|| id.to_owned());
        }
    }
}

/// One condition of a query, as sent.
#[derive(Debug, Clone)]
enum Cond {
    Eq(V),
    Gte(V),
    Lt(V),
    /// A string prefix (string indexes only).
    Prefix(String),
}

impl Cond {
    fn holds(&self, v: &V) -> bool {
        match self {
            Cond::Eq(x) => v == x,
            Cond::Gte(x) => v >= x,
            Cond::Lt(x) => v < x,
            Cond::Prefix(p) => matches!(v, V::Str(s) if s.starts_with(p.as_str())),
        }
    }

    fn suffix(&self) -> &'static str {
        match self {
            Cond::Eq(_) => "",
            Cond::Gte(_) => "_gte",
            Cond::Lt(_) => "_lt",
            Cond::Prefix(_) => "_prefix",
        }
    }

    fn is_range(&self) -> bool {
        !matches!(self, Cond::Eq(_))
    }
}

/// A random query: conditions in the order they are sent, and the shape of the answer.
#[derive(Debug, Clone)]
struct Q {
    conds: Vec<(&'static str, Cond)>,
    order_by: Option<&'static str>,
    desc: Option<bool>,
    limit: Option<usize>,
}

impl Q {
    fn limit(&self) -> usize {
        self.limit.unwrap_or(20)
    }

    /// The driving index by the documented rule: `order_by`, else the first index with a
    /// range or prefix, else the first index with an equality; none: key order.
    fn driving(&self) -> Option<&'static str> {
        self.order_by
            .or_else(|| self.conds.iter().find(|(_, c)| c.is_range()).map(|(i, _)| *i))
            .or_else(|| self.conds.first().map(|(i, _)| *i))
    }

    fn query_string(&self, view: &str, format: &dyn Fn(&str, &V) -> String) -> String {
        let mut q = Vec::new();
        for (index, c) in &self.conds {
            let text = match c {
                Cond::Eq(v) | Cond::Gte(v) | Cond::Lt(v) => format(index, v),
                Cond::Prefix(p) => p.clone(),
            };
            q.push(format!("{index}{}={}", c.suffix(), pct(&text)));
        }
        if let Some(o) = self.order_by {
            q.push(format!("order_by={o}"));
        }
        if let Some(d) = self.desc {
            q.push(format!("order={}", if d { "desc" } else { "asc" }));
        }
        if let Some(l) = self.limit {
            q.push(format!("limit={l}"));
        }
        format!("/v1/views/{view}?{}", q.join("&"))
    }

    /// The model's answer: the keys of the rows whose values satisfy every condition,
    /// ordered by (driving value, key), reversed for `desc`. A row without a value for
    /// the driving index is not in it.
    fn answer(&self, rows: &[(String, BTreeMap<&'static str, V>)]) -> Vec<String> {
        let driving = self.driving();
        let mut hits: Vec<(Option<V>, String)> = rows
            .iter()
            .filter(|(_, vals)| self.conds.iter().all(|(i, c)| vals.get(i).is_some_and(|v| c.holds(v))))
            .filter_map(|(k, vals)| match driving {
                Some(d) => vals.get(d).map(|v| (Some(v.clone()), k.clone())),
                None => Some((None, k.clone())),
            })
            .collect();
        hits.sort();
        if self.desc == Some(true) {
            hits.reverse();
        }
        hits.into_iter().map(|(_, k)| k).collect()
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn pick<'a, T>(rng: &mut StdRng, xs: &'a [T]) -> &'a T {
    &xs[rng.random_range(0..xs.len())]
}

/// A value for `index` of the orders view: often one that exists, sometimes not.
fn order_value(rng: &mut StdRng, model: &Model, index: &'static str) -> V {
    let existing: Vec<V> = model.orders.values().map(|o| o.field(index)).collect();
    if !existing.is_empty() && rng.random_bool(0.6) {
        return pick(rng, &existing).clone();
    }
    match index {
        "customer_id" => V::Str(pick(rng, &CUSTOMER_IDS[..]).to_string()),
        "status" => V::Str(pick(rng, &["a", "c", "confirmed", "p", "placed", "s", "z"]).to_string()),
        "placed_at" => V::Num((T0 + rng.random_range(-2..80) * HOUR).into()),
        _ => V::Num(rng.random_range(0..12_000).into()),
    }
}

fn random_cond(rng: &mut StdRng, value: &mut dyn FnMut(&mut StdRng) -> V) -> Cond {
    match rng.random_range(0..4) {
        0 => Cond::Eq(value(rng)),
        1 => Cond::Gte(value(rng)),
        2 => Cond::Lt(value(rng)),
        _ => match value(rng) {
            // The first 0..=n characters of a value: often a real prefix, sometimes all
            // or nothing.
            V::Str(s) => {
                let n = rng.random_range(0..=s.chars().count());
                Cond::Prefix(s.chars().take(n).collect())
            }
            v => Cond::Eq(v),
        },
    }
}

/// Adds `cond` unless it conflicts with what `index` already has (an equality and a
/// range on one index, or the same bound twice, are 400s tested elsewhere).
fn add(q: &mut Q, index: &'static str, cond: Cond) {
    let clash = q.conds.iter().any(|(i, c)| {
        *i == index && (c.is_range() != cond.is_range() || !cond.is_range() || c.suffix() == cond.suffix())
    });
    if !clash {
        q.conds.push((index, cond));
    }
}

fn random_shape(rng: &mut StdRng, q: &mut Q, indexes: &[&'static str]) {
    if rng.random_bool(0.2) {
        q.order_by = Some(*pick(rng, indexes));
    }
    q.desc = match rng.random_range(0..3) {
        0 => None,
        1 => Some(false),
        _ => Some(true),
    };
    q.limit = match rng.random_range(0..6) {
        0 => None,
        1 => Some(1000),
        _ => Some(rng.random_range(1..=9)),
    };
}

fn random_orders_query(rng: &mut StdRng, model: &Model) -> Q {
    const INDEXES: [&str; 4] = ["customer_id", "status", "placed_at", "total_cents"];
    let mut q = Q {
        conds: Vec::new(),
        order_by: None,
        desc: None,
        limit: None,
    };
    for _ in 0..rng.random_range(0..=3) {
        let index = *pick(rng, &INDEXES);
        let cond = random_cond(rng, &mut |rng| order_value(rng, model, index));
        add(&mut q, index, cond);
    }
    random_shape(rng, &mut q, &INDEXES);
    q
}

fn random_customers_query(rng: &mut StdRng, model: &Model) -> Q {
    let mut q = Q {
        conds: Vec::new(),
        order_by: None,
        desc: None,
        limit: None,
    };
    let held: Vec<String> = model.email_holder.keys().cloned().collect();
    for _ in 0..rng.random_range(0..=2) {
        let cond = random_cond(rng, &mut |rng| {
            let e = if !held.is_empty() && rng.random_bool(0.5) {
                pick(rng, &held).clone()
            } else {
                pick(rng, &EMAILS[..]).to_string()
            };
            V::Str(e)
        });
        add(&mut q, "email", cond);
    }
    random_shape(rng, &mut q, &["email"]);
    q
}

struct Case {
    seed: u64,
    /// The instances; requests go to each in turn.
    bases: Vec<String>,
    turn: std::cell::Cell<usize>,
    /// Whether customers (and the `customers` view) are part of the case.
    customers: bool,
    /// Where customer commands go when not to the instances in turn (Kafka: the instance
    /// that runs the customer aggregate).
    customer_base: Option<String>,
    client: reqwest::Client,
    clock: ManualClock,
    model: Model,
    /// Every accepted command's position, merged: queries wait for all of them.
    all: Position,
    /// The scan budget in force (pages may end early below the row count).
    max_scanned: usize,
    /// Queries checked, and how many of them had a non-empty answer.
    queries: usize,
    non_empty: usize,
}

fn build(dir: &Path, clock: &ManualClock, max_scanned: usize) -> Runtime {
    let log = common::test_log(dir);
    Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .view_options(ViewOptions {
        max_scanned,
        ..Default::default()
    })
    .aggregate::<Order>(())
    .aggregate::<Customer>(())
    .view::<OrdersView>()
    .view::<CustomersView>()
    .build(Arc::new(log))
}

impl Case {
    fn new(seed: u64, bases: Vec<String>, clock: ManualClock, max_scanned: usize) -> Self {
        Case {
            seed,
            bases,
            turn: std::cell::Cell::new(0),
            customers: true,
            customer_base: None,
            client: reqwest::Client::new(),
            clock,
            model: Model::default(),
            all: Position::default(),
            max_scanned,
            queries: 0,
            non_empty: 0,
        }
    }

    /// The next instance in turn.
    fn base(&self) -> &str {
        let n = self.turn.get();
        self.turn.set(n + 1);
        &self.bases[n % self.bases.len()]
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.get_at(self.base(), path).await
    }

    async fn get_at(&self, base: &str, path: &str) -> (StatusCode, Value) {
        let resp = self.client.get(format!("{base}{path}")).send().await.unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    /// Sends a command; folds its events into the model when accepted. Rejections (422)
    /// are expected and change nothing.
    async fn command(&mut self, ty: &str, id: &str, body: Value) -> Option<String> {
        let base = match (&self.customer_base, ty) {
            (Some(b), "customer") => b.clone(),
            _ => self.base().to_owned(),
        };
        let resp = self
            .client
            .post(format!("{base}/v1/aggregates/{ty}/{id}/commands"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let out: Value = resp.json().await.unwrap();
        match status {
            StatusCode::OK => {
                for e in out["events"].as_array().unwrap() {
                    self.model.apply(ty, id, e);
                }
                let pos = out["position"].as_str().unwrap().to_owned();
                for (topic, p, o) in Position::decode(&pos).unwrap().marks() {
                    self.all.advance(topic, p, o);
                }
                Some(pos)
            }
            StatusCode::UNPROCESSABLE_ENTITY => None,
            _ => panic!("seed {}: {ty}/{id} {body}: {status} {out}", self.seed),
        }
    }

    async fn random_commands(&mut self, rng: &mut StdRng, n: usize) {
        for _ in 0..n {
            if !self.customers || rng.random_bool(0.7) {
                let id = format!("o-{:02}", rng.random_range(0..30));
                let item = |rng: &mut StdRng| {
                    json!({"sku": pick(rng, &["apple", "pear"]), "qty": rng.random_range(0..4),
                           "price_cents": rng.random_range(0..1500)})
                };
                let body = match rng.random_range(0..9) {
                    0..=2 => {
                        let items: Vec<Value> = (0..rng.random_range(0..3)).map(|_| item(rng)).collect();
                        // Half of the orders name a customer the case registers (joined).
                        let customer = if self.customers && rng.random_bool(0.5) {
                            format!("cust-{}", rng.random_range(0..8))
                        } else {
                            pick(rng, &CUSTOMER_IDS[..]).to_string()
                        };
                        json!({"type":"PlaceOrder","customer_id":customer,"items":items})
                    }
                    3 | 4 => {
                        let mut i = item(rng);
                        i["type"] = json!("AddItem");
                        i
                    }
                    5 | 6 => json!({"type":"ConfirmOrder"}),
                    7 => json!({"type":"CancelOrder","reason":"changed my mind"}),
                    _ => json!({"type":"ShipOrder"}),
                };
                // Some orders share a timestamp, most do not.
                self.clock.advance(rng.random_range(0..3) * HOUR);
                self.command("order", &id, body).await;
            } else {
                let id = format!("cust-{}", rng.random_range(0..8));
                let email = if rng.random_bool(0.05) {
                    "not-an-email".to_owned()
                } else {
                    pick(rng, &EMAILS[..]).to_string()
                };
                let body = match rng.random_range(0..6) {
                    0..=2 => json!({"type":"RegisterCustomer","name":"N","email":email}),
                    3 | 4 => json!({"type":"ChangeEmail","email":email}),
                    _ => json!({"type":"DeleteCustomer"}),
                };
                // The unique index keeps the first writer *in the order the view applies
                // events*, which across partitions is only fixed if each write is applied
                // before the next: wait for it (read-your-writes) before going on, on every
                // instance (each applies the replicated view itself).
                if let Some(pos) = self.command("customer", &id, body).await {
                    for base in &self.bases {
                        let path = format!("/v1/views/customers/{id}?min_position={pos}");
                        let (st, body) = self.get_at(base, &path).await;
                        assert!(
                            st == StatusCode::OK || st == StatusCode::NOT_FOUND,
                            "seed {}: {st} {body}",
                            self.seed
                        );
                    }
                }
            }
        }
    }

    /// Runs `q` through every page; checks page sizes and that the pages concatenate to
    /// `want`.
    async fn check(&mut self, view: &str, q: &Q, want: &[String], rows_in_view: usize) {
        self.queries += 1;
        self.non_empty += usize::from(!want.is_empty());
        let base_query = q.query_string(view, &|index, v| match v {
            V::Num(n) if index == "placed_at" && n % 2 == 0 => rfc3339_ms(*n as i64),
            V::Num(n) => n.to_string(),
            V::Str(s) => s.clone(),
        });
        let min = self.min_position();
        let mut got: Vec<String> = Vec::new();
        let mut pages = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("{base_query}{min}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (st, body) = self.get(&path).await;
            assert_eq!(st, StatusCode::OK, "seed {}: {path}: {body}", self.seed);
            let keys: Vec<String> = body["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["key"].as_str().unwrap().to_owned())
                .collect();
            assert!(
                keys.len() <= q.limit(),
                "seed {}: {path}: page over the limit",
                self.seed
            );
            pages.push(keys.len());
            got.extend(keys);
            match body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
            assert!(
                pages.len() <= 4 * rows_in_view + 4,
                "seed {}: {path}: cursor loop",
                self.seed
            );
        }
        assert_eq!(
            got, want,
            "seed {}: {base_query} (pages {pages:?}, max_scanned {})",
            self.seed, self.max_scanned
        );
        // With a budget above the row count, only a filter-free end can make a page short:
        // every page but the last is full.
        if self.max_scanned > rows_in_view {
            assert!(
                pages[..pages.len() - 1].iter().all(|n| *n == q.limit()),
                "seed {}: {base_query}: short page before the end: {pages:?}",
                self.seed
            );
        }
    }

    /// `&min_position=<every accepted write>`, or nothing before the first one.
    fn min_position(&self) -> String {
        match self.all.marks().next() {
            Some(_) => format!("&min_position={}", self.all.encode()),
            None => String::new(),
        }
    }

    /// Key lookups of every id ever used: present rows equal the model, the others 404.
    async fn check_keys(&self) {
        let min = self.min_position();
        for i in 0..30 {
            let id = format!("o-{i:02}");
            let (st, body) = self
                .get(&format!("/v1/views/orders/{id}?{}", min.trim_start_matches('&')))
                .await;
            match self.model.orders.get(&id) {
                Some(o) => {
                    assert_eq!(st, StatusCode::OK, "seed {}: {id}: {body}", self.seed);
                    let v = &body["value"];
                    assert_eq!(v["customer_id"], o.customer_id, "seed {}: {id}", self.seed);
                    assert_eq!(v["status"], o.status, "seed {}: {id}", self.seed);
                    assert_eq!(v["total_cents"], o.total_cents, "seed {}: {id}", self.seed);
                    assert_eq!(v["placed_at"], rfc3339_ms(o.placed_at), "seed {}: {id}", self.seed);
                    let email = self.model.customers.get(&o.customer_id);
                    assert_eq!(
                        v["customer_email"],
                        json!(email),
                        "seed {}: {id} of customer {}",
                        self.seed,
                        o.customer_id
                    );
                }
                None => assert_eq!(st, StatusCode::NOT_FOUND, "seed {}: {id}: {body}", self.seed),
            }
        }
        for i in 0..if self.customers { 8 } else { 0 } {
            let id = format!("cust-{i}");
            let (st, body) = self
                .get(&format!("/v1/views/customers/{id}?{}", min.trim_start_matches('&')))
                .await;
            match self.model.customers.get(&id) {
                Some(email) => assert_eq!(
                    (st, &body["value"]["email"]),
                    (StatusCode::OK, &json!(email)),
                    "seed {}: {id}",
                    self.seed
                ),
                None => assert_eq!(st, StatusCode::NOT_FOUND, "seed {}: {id}: {body}", self.seed),
            }
        }
    }
}

fn random_budget(rng: &mut StdRng) -> usize {
    if rng.random_bool(0.5) {
        rng.random_range(1..12)
    } else {
        10_000
    }
}

async fn run_case(seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(T0);
    let max_scanned = random_budget(&mut rng);
    let runtime = build(dir.path(), &clock, max_scanned);
    assert!(runtime.wait_restored(Duration::from_secs(10)).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = eventfold::http::router(runtime.clone(), HttpOptions::default());
    let server = tokio::spawn(eventfold::http::serve(listener, router, std::future::pending()));
    let mut case = Case::new(seed, vec![base], clock.clone(), max_scanned);
    let counts = case.rounds(&mut rng).await;
    // After a rebuild: the same events in another store, both views rebuilt offline, then
    // served: every row (and its customer's email) still as the model says.
    let copy_dir = tempfile::tempdir().unwrap();
    let copy: Arc<dyn Log> = Arc::new(common::test_log(copy_dir.path()));
    let mut batch = eventfold::store::Batch::new();
    for topic in ["shop.order.events", "shop.customer.events"] {
        for p in 0..runtime.log().partitions() {
            for (offset, record) in runtime.log().read(topic, p, 0, usize::MAX).await.unwrap() {
                batch.put_log(topic, p, offset, &record);
            }
        }
    }
    copy.store().commit(batch, true).unwrap();
    let options = ViewOptions::default();
    rebuild::<OrdersView>(copy.clone(), "shop", &options, &mut |_, _| {})
        .await
        .unwrap();
    rebuild::<CustomersView>(copy.clone(), "shop", &options, &mut |_, _| {})
        .await
        .unwrap();
    server.abort();
    drop(runtime);
    let rebuilt = Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .clock(Arc::new(clock))
    .aggregate::<Order>(())
    .aggregate::<Customer>(())
    .view::<OrdersView>()
    .view::<CustomersView>()
    .build(copy);
    assert!(rebuilt.wait_restored(Duration::from_secs(10)).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    case.bases = vec![format!("http://{}", listener.local_addr().unwrap())];
    let router = eventfold::http::router(rebuilt.clone(), HttpOptions::default());
    let server = tokio::spawn(eventfold::http::serve(listener, router, std::future::pending()));
    case.check_keys().await;
    server.abort();
    drop(rebuilt);
    counts
}

/// One instance of the Kafka case: its runtime, registry and HTTP server.
struct Instance {
    runtime: Runtime,
    registry: Arc<Registry>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

/// What an instance of the Kafka case runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The order aggregate and view, with the customers lookup table from the events the
    /// customers instance writes (a customer aggregate here would take partitions the
    /// order instances split).
    Orders,
    /// The customer aggregate and its view.
    Customers,
}

async fn kafka_instance(
    bootstrap: &str,
    app: &str,
    (id, role): (&str, Role),
    clock: &ManualClock,
    max_scanned: usize,
) -> (Instance, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let options = KafkaOptions {
        session_timeout: Duration::from_secs(6),
        ..KafkaOptions::new(bootstrap, PARTITIONS, format!("{app}-{id}"))
    };
    let log: Arc<dyn Log> = Arc::new(tokio::task::block_in_place(|| KafkaLog::open(options, store)).unwrap());
    let registry =
        tokio::task::block_in_place(|| Registry::start(log.clone(), app, id, &base, Duration::from_millis(500)))
            .unwrap();
    let r = registry.clone();
    let builder = Runtime::builder(RuntimeOptions {
        app_id: app.into(),
        instance_id: id.into(),
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .view_options(ViewOptions {
        max_scanned,
        ..Default::default()
    })
    .on_ownership(Arc::new(move |owned| r.set_owned(owned)));
    let builder = match role {
        Role::Orders => builder.aggregate::<Order>(()).view::<OrdersView>(),
        Role::Customers => builder.aggregate::<Customer>(()),
    };
    let runtime = builder.view::<CustomersView>().build(log);
    let router = eventfold::http::router(
        runtime.clone(),
        HttpOptions {
            registry: Some(registry.clone()),
            ..Default::default()
        },
    );
    let server = tokio::spawn(eventfold::http::serve(listener, router, std::future::pending()));
    let instance = Instance {
        runtime,
        registry,
        server,
        _dir: dir,
    };
    (instance, base)
}

/// Partitions per topic in the Kafka case (few, so both instances own some of each type).
const PARTITIONS: u32 = 4;

async fn run_kafka_case(seed: u64, bootstrap: &str) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = ManualClock::at(T0);
    let max_scanned = random_budget(&mut rng);
    let app = format!("vm{seed}x{:08x}", rand::random::<u32>());
    let (a, url_a) = kafka_instance(bootstrap, &app, ("a", Role::Orders), &clock, max_scanned).await;
    let (b, url_b) = kafka_instance(bootstrap, &app, ("b", Role::Orders), &clock, max_scanned).await;
    // Both instances own order partitions, and each knows who owns what.
    let owners = |r: &Registry| -> Vec<(u32, Option<String>)> {
        (0..PARTITIONS)
            .map(|p| (p, r.owner("order", p).map(|o| o.instance_id)))
            .collect()
    };
    let split = |r: &Registry| {
        let o = owners(r);
        o.iter().all(|(_, i)| i.is_some())
            && o.iter().any(|(_, i)| i.as_deref() == Some("a"))
            && o.iter().any(|(_, i)| i.as_deref() == Some("b"))
    };
    for i in [&a, &b] {
        assert!(
            i.registry.wait_for(split, Duration::from_secs(60)).await,
            "seed {seed}: the instances did not split the partitions: {:?}",
            owners(&i.registry)
        );
        assert!(i.runtime.wait_restored(Duration::from_secs(30)).await);
    }
    eprintln!("seed {seed}: order partitions {:?}", owners(&a.registry));
    let (c, url_c) = kafka_instance(bootstrap, &app, ("c", Role::Customers), &clock, max_scanned).await;
    assert!(c.runtime.wait_restored(Duration::from_secs(60)).await);
    let mut case = Case::new(seed, vec![url_a, url_b], clock, max_scanned);
    case.customer_base = Some(url_c);
    let counts = case.rounds(&mut rng).await;
    for i in [a, b, c] {
        i.registry.leave().await;
        i.server.abort();
        drop(i.runtime);
    }
    counts
}

impl Case {
    /// The random commands and queries of one case; returns (queries, non-empty answers).
    async fn rounds(&mut self, rng: &mut StdRng) -> (usize, usize) {
        let case = self;
        // Two rounds: queries after a first batch of writes, then after more writes (updates
        // move index entries; deletes remove rows).
        for _ in 0..2 {
            let n = rng.random_range(20..90);
            case.random_commands(rng, n).await;
            case.check_keys().await;
            let orders: Vec<(String, BTreeMap<&'static str, V>)> = case
                .model
                .orders
                .iter()
                .map(|(k, o)| {
                    let vals = ["customer_id", "status", "placed_at", "total_cents"]
                        .into_iter()
                        .map(|i| (i, o.field(i)))
                        .collect();
                    (k.clone(), vals)
                })
                .collect();
            for _ in 0..30 {
                let q = random_orders_query(rng, &case.model);
                let want = q.answer(&orders);
                case.check("orders", &q, &want, orders.len()).await;
            }
            // Only the holder of an address is in the unique index.
            if !case.customers {
                continue;
            }
            let customers: Vec<(String, BTreeMap<&'static str, V>)> = case
                .model
                .customers
                .keys()
                .map(|k| {
                    let held = case.model.email_holder.iter().find(|(_, h)| *h == k);
                    let vals = held.map(|(e, _)| ("email", V::Str(e.clone()))).into_iter().collect();
                    (k.clone(), vals)
                })
                .collect();
            for _ in 0..15 {
                let q = random_customers_query(rng, &case.model);
                let want = q.answer(&customers);
                case.check("customers", &q, &want, customers.len()).await;
            }
        }
        (case.queries, case.non_empty)
    }
}

/// The seeds to run: `EVENTFOLD_PROPTEST_SEED` alone, else `cases` (of
/// `EVENTFOLD_PROPTEST_CASES`, default 24, through `scale`) from a fresh base seed per run
/// (printed), so CI explores new cases over time.
fn seeds(label: &str, scale: impl Fn(u64) -> u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("EVENTFOLD_PROPTEST_SEED") {
        return vec![s.parse().expect("EVENTFOLD_PROPTEST_SEED is a u64")];
    }
    let cases = scale(
        std::env::var("EVENTFOLD_PROPTEST_CASES")
            .ok()
            .map(|n| n.parse().expect("EVENTFOLD_PROPTEST_CASES is a number"))
            .unwrap_or(24),
    );
    let base: u64 = rand::random::<u32>().into();
    eprintln!(
        "{label}: seeds {base}..{} (replay one with EVENTFOLD_PROPTEST_SEED)",
        base + cases
    );
    (base..base + cases).collect()
}

/// Runs `case` for every seed on a fresh runtime each and checks the answers were worth
/// comparing (mostly non-empty).
fn run_seeds<F: std::future::Future<Output = (usize, usize)>>(label: &str, seeds: Vec<u64>, case: impl Fn(u64) -> F) {
    let (mut queries, mut non_empty) = (0, 0);
    for seed in seeds {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (q, n) = rt.block_on(case(seed));
        rt.shutdown_timeout(Duration::from_secs(5));
        queries += q;
        non_empty += n;
    }
    // The generator must produce answers worth comparing, not mostly empty ones.
    assert!(non_empty * 2 > queries, "{non_empty} of {queries} answers non-empty");
    eprintln!("{label}: {queries} queries ({non_empty} with rows) checked against the model");
}

#[test]
fn views_answer_every_query_like_a_model_of_the_accepted_events() {
    run_seeds("views_model", seeds("views_model", |n| n), run_case);
}

/// The same property on Kafka with two instances (see the module docs); a quarter of the
/// cases (at least 2): each starts two instances and waits for the group to split.
#[test]
fn views_answer_every_query_like_a_model_across_two_kafka_instances() {
    let bootstrap = common::kafka_bootstrap();
    let label = "views_model on Kafka";
    run_seeds(label, seeds(label, |n| (n / 4).max(2)), |seed| {
        run_kafka_case(seed, &bootstrap)
    });
}
