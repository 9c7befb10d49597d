//! Crash test of the order flow (DESIGN §7) on the embedded log: clients place and confirm
//! orders (some above the decline limit, some never confirmed, left to expire within a
//! short `--order-expiry-secs`) while the shop is SIGKILLed at random instants and
//! restarted, at least 20 times. Afterwards, checked from outside over HTTP only:
//!
//! - every order ends with exactly one terminal event, consistent with its amount and
//!   history: shipped when confirmed and within the limit, cancelled `payment_declined`
//!   when confirmed above it, cancelled `expired` when never confirmed;
//! - every confirmed order has exactly one authorization outcome on `pay-<order>`, and an
//!   order never confirmed has none;
//! - no confirmed order was cancelled as expired; an expired order was cancelled once;
//! - the process manager has nothing left over (timers, commands outstanding).
//!
//! `FLOWS_CRASH_SEED=<u64>` fixes the random choices (timing stays nondeterministic).

mod common;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

const ORDERS: u64 = 160;
const CLIENTS: u64 = 4;
const KILLS: u32 = 20;
/// Kills of the Kafka variant (each restart restores from the broker: slower).
const KAFKA_KILLS: u32 = 12;
const DECLINE_ABOVE: u64 = 10_000;
const EXPIRY_SECS: &str = "2";

async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let resp = http.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn events(http: &reqwest::Client, base: &str, aggregate: &str, id: &str) -> Vec<Value> {
    let (status, body) = get(http, &format!("{base}/v1/aggregates/{aggregate}/{id}/events")).await;
    match status {
        404 => Vec::new(),
        200 => body.as_array().unwrap().clone(),
        other => panic!("events of {aggregate}/{id}: {other} {body}"),
    }
}

/// What a client did with one order.
struct Placed {
    id: String,
    total: u64,
    /// The client's `ConfirmOrder` was accepted (200).
    confirmed: bool,
}

async fn client(i: u64, seed: u64, http: reqwest::Client, base: Arc<RwLock<String>>) -> Vec<Placed> {
    let mut rng = StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut out = Vec::new();
    for n in (i..ORDERS).step_by(CLIENTS as usize) {
        let id = format!("o-{n}");
        let total = if rng.random_bool(0.2) {
            DECLINE_ABOVE + rng.random_range(1..1000)
        } else {
            rng.random_range(1..DECLINE_ABOVE)
        };
        let path = format!("/v1/aggregates/order/{id}/commands");
        let place = json!({
            "type": "PlaceOrder",
            "customer_id": format!("c-{i}"),
            "items": [{"sku": "sku", "qty": 1, "price_cents": total}],
        });
        let (status, body) = common::submit(&http, &base, &path, &format!("place-{id}"), &place).await;
        assert_eq!(status, 200, "PlaceOrder {id}: {body}");
        // A quarter is left to expire; the others are confirmed at once or a little later.
        let mut confirmed = false;
        if rng.random_bool(0.75) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
            let (status, body) = common::submit(
                &http,
                &base,
                &path,
                &format!("confirm-{id}"),
                &json!({"type": "ConfirmOrder"}),
            )
            .await;
            match status {
                200 => confirmed = true,
                // The expiry won the race (the restarts can take longer than the expiry).
                422 => assert_eq!(body["error"], "invalid_transition", "ConfirmOrder {id}: {body}"),
                other => panic!("ConfirmOrder {id}: {other} {body}"),
            }
        }
        out.push(Placed { id, total, confirmed });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_flow_survives_sigkills_exactly_once() {
    crash_run(None).await;
}

/// Kafka mode, two instances of one app: one or the other is SIGKILLed and restarted
/// (once kept down past the session timeout, so the group moves its partitions and
/// perhaps the order flow to the other, and back); the same checks, plus an independent
/// read_committed consumer over the events topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_flow_survives_sigkills_exactly_once_on_kafka() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("flowcrash{}", rand::random::<u32>());
    crash_run(Some((bootstrap, app))).await;
}

async fn crash_run(kafka: Option<(String, String)>) {
    let seed = std::env::var("FLOWS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("flows crash test: FLOWS_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let limit = DECLINE_ABOVE.to_string();
    let mut args: Vec<String> = [
        "--order-expiry-secs",
        EXPIRY_SECS,
        "--decline-above-cents",
        &limit,
        "--partitions",
        "4",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some((bootstrap, app)) = &kafka {
        args.extend(
            [
                "--kafka",
                bootstrap,
                "--app-id",
                app,
                "--kafka-session-timeout-secs",
                "6",
            ]
            .map(str::to_owned),
        );
    }
    // One instance on the embedded log, two on Kafka (each its own id and directory).
    let instances = if kafka.is_some() { 2 } else { 1 };
    let dirs: Vec<tempfile::TempDir> = (0..instances).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |i: usize| {
        let dir = dirs[i].path().to_owned();
        let mut args = args.clone();
        if kafka.is_some() {
            args.extend(["--instance-id".to_owned(), format!("i{i}")]);
        }
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            common::start(&dir, &a)
        })
    };
    let mut shops = Vec::new();
    let mut urls = Vec::new();
    for i in 0..instances {
        let (shop, url, _) = start(i).await.unwrap();
        shops.push(Some(shop));
        urls.push(url);
    }
    let base = Arc::new(RwLock::new(urls[0].clone()));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(i, seed, http.clone(), base.clone())))
        .collect();

    let kills = if kafka.is_some() { KAFKA_KILLS } else { KILLS };
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        let victim = rng.random_range(0..instances);
        // Clients go to the other instance meanwhile (on Kafka it forwards or sends
        // through the commands topic).
        *base.write().unwrap() = urls[(victim + 1) % instances].clone();
        drop(shops[victim].take()); // SIGKILL and reap
        if kafka.is_some() && k == kills / 2 {
            // Down past the session timeout: the group rebalances its partitions away.
            tokio::time::sleep(Duration::from_secs(8)).await;
        }
        let (s, url, _) = start(victim).await.unwrap();
        shops[victim] = Some(s);
        urls[victim] = url;
        *base.write().unwrap() = urls[victim].clone();
    }
    let mut placed = Vec::new();
    for c in clients {
        placed.extend(c.await.unwrap());
    }
    assert_eq!(placed.len() as u64, ORDERS);
    // Once more after the load, then let every flow finish (expiries included).
    drop(shops[0].take());
    let (shop, url, _) = start(0).await.unwrap();
    shops[0] = Some(shop);
    urls[0] = url.clone();
    eprintln!("flows crash test: {kills} kills under load, one after ({instances} instance(s))");

    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for p in &placed {
        let declined = p.total > DECLINE_ABOVE;
        let (last, reason) = match (p.confirmed, declined) {
            (true, false) => ("OrderShipped", None),
            (true, true) => ("OrderCancelled", Some("payment_declined")),
            (false, _) => ("OrderCancelled", Some("expired")),
        };
        let order = loop {
            let e = events(&http, &url, "order", &p.id).await;
            let terminal = e
                .iter()
                .filter(|e| matches!(e["type"].as_str(), Some("OrderShipped" | "OrderCancelled")))
                .count();
            if terminal > 0 || Instant::now() > deadline {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let types: Vec<&str> = order.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let expected: Vec<&str> = if p.confirmed {
            vec!["OrderPlaced", "OrderConfirmed", last]
        } else {
            vec!["OrderPlaced", last]
        };
        if types != expected {
            failures.push(format!(
                "order {} (total {}): events {types:?}, expected {expected:?}",
                p.id, p.total
            ));
            continue;
        }
        if let Some(r) = reason
            && order.last().unwrap()["payload"]["reason"] != r
        {
            failures.push(format!(
                "order {}: cancelled as {}, expected {r}",
                p.id,
                order.last().unwrap()["payload"]
            ));
        }
        let payment = events(&http, &url, "payment", &format!("pay-{}", p.id)).await;
        let outcomes: Vec<&str> = payment.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let expected: &[&str] = match (p.confirmed, declined) {
            (true, false) => &["PaymentAuthorized"],
            (true, true) => &["PaymentDeclined"],
            (false, _) => &[],
        };
        if outcomes != expected {
            failures.push(format!("payment pay-{}: {outcomes:?}, expected {expected:?}", p.id));
        }
    }
    let expired = placed.iter().filter(|p| !p.confirmed).count();
    eprintln!(
        "flows crash test: {} orders, {} confirmed, {expired} left to expire, {} failures",
        placed.len(),
        placed.len() - expired,
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        expired > 0 && expired < placed.len(),
        "the mix needs both kinds: {expired} expired"
    );

    if let Some((bootstrap, app)) = &kafka {
        let confirmed = placed.iter().filter(|p| p.confirmed).count();
        let failures = common::check_flow_topics(
            bootstrap,
            &format!("{app}.order.events"),
            &format!("{app}.payment.events"),
            confirmed,
        );
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    // Nothing left over once every flow has ended (an instance that does not run the
    // order flow reports zeros).
    let settle = Instant::now() + Duration::from_secs(10);
    for url in &urls {
        loop {
            let metrics = http
                .get(format!("{url}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let zero = |g: &str| metrics.contains(&format!("eventfold_process_manager_{g}{{name=\"order_flow\"}} 0\n"));
            if zero("timers_pending") && zero("commands_outstanding") {
                break;
            }
            assert!(Instant::now() < settle, "the order flow kept work pending:\n{metrics}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    drop(shops);
}
