//! Crash test of the cascading delete (DESIGN §7, `customer_orders`), on both backends:
//! clients register customers, place orders for them, delete some of the customers and
//! place a few more orders for them afterwards, while the shop is SIGKILLed at random
//! instants and restarted. Afterwards, checked from outside over HTTP: every order of a
//! deleted customer ends cancelled exactly once with `customer_deleted` (those placed
//! after the deletion too), and no order of another customer is touched.
//!
//! The orders stay `placed` (never confirmed; the expiry is an hour), so that nothing but
//! the cascade ends them. `CASCADE_CRASH_SEED=<u64>` fixes the random choices.

mod common;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

const CUSTOMERS: u64 = 24;
const ORDERS_PER_CUSTOMER: u64 = 4;
const CLIENTS: u64 = 4;

/// One customer's orders: (order id, placed after the customer's deletion).
struct CustomerRun {
    deleted: bool,
    orders: Vec<(String, bool)>,
}

async fn client(i: u64, seed: u64, http: reqwest::Client, base: Arc<RwLock<String>>) -> Vec<CustomerRun> {
    let mut rng = StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut out = Vec::new();
    for n in (i..CUSTOMERS).step_by(CLIENTS as usize) {
        let c = format!("cc-{n}");
        let ok = |(status, body): (u16, Value), what: &str| assert_eq!(status, 200, "{what}: {body}");
        let register = json!({"type": "RegisterCustomer", "name": "n", "email": format!("{c}@x.test")});
        let path = format!("/v1/aggregates/customer/{c}/commands");
        ok(
            common::submit(&http, &base, &path, &format!("reg-{c}"), &register).await,
            "RegisterCustomer",
        );
        let deleted = rng.random_bool(0.5);
        let mut orders = Vec::new();
        for k in 0..ORDERS_PER_CUSTOMER {
            // Of a deleted customer, the last order is placed after the deletion.
            let after = deleted && k == ORDERS_PER_CUSTOMER - 1;
            if after {
                let body = json!({"type": "DeleteCustomer"});
                ok(
                    common::submit(&http, &base, &path, &format!("del-{c}"), &body).await,
                    "DeleteCustomer",
                );
            }
            let o = format!("{c}-o{k}");
            let place = json!({
                "type": "PlaceOrder",
                "customer_id": c,
                "items": [{"sku": "s", "qty": 1, "price_cents": 100}],
            });
            let opath = format!("/v1/aggregates/order/{o}/commands");
            ok(
                common::submit(&http, &base, &opath, &format!("place-{o}"), &place).await,
                "PlaceOrder",
            );
            orders.push((o, after));
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        }
        out.push(CustomerRun { deleted, orders });
    }
    out
}

async fn events(http: &reqwest::Client, base: &str, id: &str) -> Vec<Value> {
    let url = format!("{base}/v1/aggregates/order/{id}/events");
    let resp = http.get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    match resp.status().as_u16() {
        404 => Vec::new(),
        200 => resp.json::<Value>().await.unwrap().as_array().unwrap().clone(),
        other => panic!("GET {url}: {other}"),
    }
}

async fn crash_run(kafka: Option<(String, String)>) {
    let seed = std::env::var("CASCADE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("cascade crash test: CASCADE_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut args: Vec<String> = ["--partitions", "4"].map(str::to_owned).to_vec();
    if let Some((bootstrap, app)) = &kafka {
        args.extend(["--kafka", bootstrap, "--app-id", app].map(str::to_owned));
    }
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let (dir, args) = (dir.path().to_owned(), args.clone());
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            common::start(&dir, &a)
        })
    };
    let (mut shop, url, _) = start().await.unwrap();
    let base = Arc::new(RwLock::new(url));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(i, seed, http.clone(), base.clone())))
        .collect();
    let kills = if kafka.is_some() { 8 } else { 20 };
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        drop(shop); // SIGKILL and reap
        let (s, url, _) = start().await.unwrap();
        shop = s;
        *base.write().unwrap() = url;
    }
    let mut runs = Vec::new();
    for c in clients {
        runs.extend(c.await.unwrap());
    }
    drop(shop);
    let (_shop, url, _) = start().await.unwrap();
    eprintln!("cascade crash test: {kills} kills under load, one after");

    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for run in &runs {
        for (o, after) in &run.orders {
            let e = loop {
                let e = events(&http, &url, o).await;
                if !run.deleted || e.len() >= 2 || Instant::now() > deadline {
                    break e;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let types: Vec<&str> = e.iter().map(|e| e["type"].as_str().unwrap()).collect();
            if run.deleted {
                let reason = e.get(1).map(|e| &e["payload"]["reason"]);
                if types != ["OrderPlaced", "OrderCancelled"] || reason != Some(&json!("customer_deleted")) {
                    failures.push(format!(
                        "order {o} of a deleted customer (placed after: {after}): {e:?}"
                    ));
                }
            } else if types != ["OrderPlaced"] {
                failures.push(format!("order {o} of a kept customer was touched: {types:?}"));
            }
        }
    }
    // Once more after a pause: nothing else arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for run in runs.iter().filter(|r| !r.deleted) {
        for (o, _) in &run.orders {
            if events(&http, &url, o).await.len() != 1 {
                failures.push(format!("order {o} of a kept customer was touched late"));
            }
        }
    }
    let deleted = runs.iter().filter(|r| r.deleted).count();
    eprintln!(
        "cascade crash test: {} customers, {deleted} deleted, {} failures",
        runs.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        deleted > 0 && deleted < runs.len(),
        "the mix needs both kinds: {deleted} deleted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cascade_survives_sigkills_exactly_once() {
    crash_run(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cascade_survives_sigkills_exactly_once_on_kafka() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("cascrash{}", rand::random::<u32>());
    crash_run(Some((bootstrap, app))).await;
}
