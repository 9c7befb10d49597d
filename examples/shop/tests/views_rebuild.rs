//! `shop views rebuild <view>` as a child process: after a rebuild from the event log the
//! views answer exactly as before; a rebuild is refused while the service runs, and for
//! an unknown view. The same in Kafka mode, against a real broker
//! (`EVENTFOLD_KAFKA_BOOTSTRAP`, default 127.0.0.1:9092): the rebuild reads the events
//! topics into the stopped instance's local store.

mod common;

use common::{get, post, shop, start};
use eventfold::core::partition::partition_for;
use eventfold::core::{Outcome, Position};
use eventfold::log::Log;
use eventfold::runtime::view::rebuild;
use eventfold::runtime::{CommandRequest, Runtime, RuntimeOptions, ViewOptions};
use eventfold::store::Batch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use shop::domain::{Customer, Order};
use shop::views::{CustomersView, OrdersView};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// The queries whose answers must survive a rebuild (every page, rows with values).
const QUERIES: [&str; 9] = [
    "/v1/views/orders?limit=7",
    "/v1/views/orders?customer_id=c1&limit=4",
    "/v1/views/orders?status=confirmed&order=desc&limit=3",
    "/v1/views/orders?total_cents_gte=500&total_cents_lt=3000&order=desc&limit=5",
    "/v1/views/orders?customer_id_prefix=c1&order_by=placed_at&limit=6",
    "/v1/views/orders?status=placed&customer_id=c2&placed_at_gte=2000-01-01",
    "/v1/views/customers?limit=4",
    "/v1/views/customers?email_prefix=a&order=desc",
    "/v1/views/customers?email_gte=b&limit=2",
];

/// Every page of every query, and a few key lookups, waiting for `min_position`.
fn answers(url: &str, min_position: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for q in QUERIES {
        let mut cursor: Option<String> = None;
        let mut rows = Vec::new();
        loop {
            let mut path = format!("{q}&min_position={min_position}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (st, body) = get(url, &path);
            assert_eq!(st, 200, "{path}: {body}");
            rows.extend(body["rows"].as_array().unwrap().iter().cloned());
            match body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        out.push((q.to_owned(), Value::Array(rows)));
    }
    for key in ["orders/o-3", "orders/o-40", "customers/cu-2", "customers/cu-5"] {
        let path = format!("/v1/views/{key}?min_position={min_position}");
        let (st, body) = get(url, &path);
        out.push((path, serde_json::json!({"status": st, "body": body})));
    }
    out
}

fn stop(mut s: common::Shop) {
    let pid = s.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(s.0.wait().unwrap().success());
}

/// Sends orders and customer commands (some refused); returns the position of every
/// accepted command and the number of order and customer events written.
fn fill(url: &str, orders: usize, customers: usize) -> (Position, usize, usize) {
    let mut all = Position::default();
    let mut order_events = 0;
    let mut customer_events = 0;
    let mut send = |ty: &str, id: &str, body: String| {
        let (st, b) = post(url, &format!("/v1/aggregates/{ty}/{id}/commands"), &body, "");
        if st == 422 {
            return;
        }
        assert_eq!(st, 200, "{ty}/{id} {body}: {b}");
        let n = b["events"].as_array().unwrap().len();
        match ty {
            "order" => order_events += n,
            _ => customer_events += n,
        }
        for (topic, p, o) in Position::decode(b["position"].as_str().unwrap()).unwrap().marks() {
            all.advance(topic, p, o);
        }
    };
    for i in 0..orders {
        let customer = format!("c{}", i % 12);
        let body = format!(
            r#"{{"type":"PlaceOrder","customer_id":"{customer}","items":[{{"sku":"x","qty":{},"price_cents":{}}}]}}"#,
            1 + i % 3,
            (i * 137) % 2000
        );
        send("order", &format!("o-{i}"), body);
        match i % 4 {
            0 => send("order", &format!("o-{i}"), r#"{"type":"ConfirmOrder"}"#.into()),
            1 => send(
                "order",
                &format!("o-{i}"),
                r#"{"type":"AddItem","sku":"y","qty":2,"price_cents":250}"#.into(),
            ),
            2 => send(
                "order",
                &format!("o-{i}"),
                r#"{"type":"CancelOrder","reason":"r"}"#.into(),
            ),
            _ => send("order", &format!("o-{i}"), r#"{"type":"ShipOrder"}"#.into()), // 422: not confirmed
        }
    }
    // Distinct addresses: with duplicates, which row keeps a unique value depends on the
    // order partitions are applied in, which a rebuild does not reproduce.
    for i in 0..customers {
        let email = format!("{}{i}@x.test", ["ann", "bob", "al", "cy"][i % 4]);
        send(
            "customer",
            &format!("cu-{i}"),
            format!(r#"{{"type":"RegisterCustomer","name":"n{i}","email":"{email}"}}"#),
        );
        if i % 5 == 0 {
            send(
                "customer",
                &format!("cu-{i}"),
                format!(r#"{{"type":"ChangeEmail","email":"new-{email}"}}"#),
            );
        }
        if i % 7 == 3 {
            send("customer", &format!("cu-{i}"), r#"{"type":"DeleteCustomer"}"#.into());
        }
    }
    (all, order_events, customer_events)
}

#[test]
fn a_rebuilt_view_answers_the_same_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // The order flow's reactions would add events this test does not count.
    let (shop1, url, _) = start(dir.path(), &["--partitions", "4", "--no-process-managers"]);
    let (all, order_events, customer_events) = fill(&url, 60, 20);
    let min = all.encode();
    let before = answers(&url, &min);
    assert!(
        before
            .iter()
            .any(|(_, rows)| rows.as_array().is_some_and(|r| r.len() > 10)),
        "the queries have answers worth comparing"
    );
    stop(shop1);

    for (view, events) in [("orders", order_events), ("customers", customer_events)] {
        let out = shop(&["views", "rebuild", view, "--data-dir", d, "--partitions", "4"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            stdout.contains(&format!("rebuilt view `{view}`: {events} events in ")),
            "{stdout}"
        );
        assert!(stdout.contains("events/s"), "{stdout}");
    }

    let (shop2, url, _) = start(dir.path(), &["--partitions", "4", "--no-process-managers"]);
    // The store admits one process: no rebuild under a running service.
    let out = shop(&["views", "rebuild", "orders", "--data-dir", d, "--partitions", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("is the service still running"), "{err}");
    let after = answers(&url, &min);
    for ((q, a), (_, b)) in before.iter().zip(&after) {
        assert_eq!(a, b, "{q} answers the same after the rebuild");
    }
    let (st, body) = get(&url, "/readyz");
    assert_eq!(st, 200, "{body}");
    stop(shop2);

    let out = shop(&["views", "rebuild", "nope", "--data-dir", d]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("unknown view `nope`; views: orders, customers"), "{err}");
}

#[test]
fn a_view_rebuilt_from_kafka_answers_the_same_as_before() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("kr{}", rand::random::<u32>());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let flags = [
        "--kafka",
        bootstrap.as_str(),
        "--app-id",
        app.as_str(),
        "--partitions",
        "4",
        "--instance-id",
        "i1",
        "--no-process-managers",
    ];
    let (shop1, url, _) = start(dir.path(), &flags);
    let (all, order_events, customer_events) = fill(&url, 40, 12);
    let min = all.encode();
    let before = answers(&url, &min);
    assert!(
        before
            .iter()
            .any(|(_, rows)| rows.as_array().is_some_and(|r| r.len() > 10)),
        "the queries have answers worth comparing"
    );
    stop(shop1);
    let events_before = common::read_committed(&bootstrap, &format!("{app}.order.events"), 4).len();

    // A source that cannot be read fails the rebuild before it touches the view.
    let wrong = format!("{app}x");
    let mut args = vec!["views", "rebuild", "orders", "--data-dir", d];
    args.extend_from_slice(&flags);
    assert_eq!(args[7], "--app-id");
    args[8] = wrong.as_str();
    let out = shop(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("topic `{wrong}.order.events` does not exist")),
        "{err}"
    );
    {
        let store = eventfold::store::Store::open(dir.path(), &Default::default()).unwrap();
        let marker = eventfold::runtime::view::rebuild_marker_key("orders");
        assert_eq!(store.get_meta(&marker).unwrap(), None, "no rebuild marker left");
        assert!(store.count_view_rows("orders").unwrap() > 0, "the view was not cleared");
    }

    for (view, events) in [("orders", order_events), ("customers", customer_events)] {
        let mut args = vec!["views", "rebuild", view, "--data-dir", d];
        args.extend_from_slice(&flags);
        let out = shop(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            stdout.contains(&format!("rebuilt view `{view}`: {events} events in ")),
            "{stdout}"
        );
        assert!(stdout.contains("events/s"), "{stdout}");
    }
    // The rebuild only read: no event was added to the topic.
    let events_after = common::read_committed(&bootstrap, &format!("{app}.order.events"), 4).len();
    assert_eq!(events_before, events_after);
    assert_eq!(events_after, order_events);

    let (shop2, url, _) = start(dir.path(), &flags);
    // The store admits one process: no rebuild under a running instance.
    let mut args = vec!["views", "rebuild", "orders", "--data-dir", d];
    args.extend_from_slice(&flags);
    let out = shop(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("is the service still running"), "{err}");
    let after = answers(&url, &min);
    for ((q, a), (_, b)) in before.iter().zip(&after) {
        assert_eq!(a, b, "{q} answers the same after the rebuild");
    }
    let (st, body) = get(&url, "/readyz");
    assert_eq!(st, 200, "{body}");
    stop(shop2);
}

/// Sends one command in-process; returns the position of its events when accepted.
async fn send(runtime: &Runtime, ty: &str, id: &str, body: Value) -> Option<Position> {
    let outcome = runtime
        .aggregate(ty)
        .unwrap()
        .submit(CommandRequest {
            aggregate_id: id.to_owned(),
            body: serde_json::to_vec(&body).unwrap(),
            idempotency_key: None,
            expected_version: None,
            correlation_id: None,
            causation_id: None,
        })
        .await
        .unwrap();
    match outcome {
        Outcome::Accepted(a) => Some(Position::decode(&a.position).unwrap()),
        Outcome::Rejected { .. } => None,
    }
}

/// A rebuilt view is stored byte for byte like the live one built from the same events:
/// rows, index entries (a unique index with conflicts included) and checkpoints. Also
/// with tiny batches, a rebuild memory that overflows at every batch (so every batch is
/// written early and rows are read back from the store), and three threads over four
/// partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_view_is_stored_exactly_like_the_live_one() {
    const PARTITIONS: u32 = 4;
    let live_dir = tempfile::tempdir().unwrap();
    let live_log: Arc<dyn Log> = Arc::new(common::test_log(live_dir.path()));
    let runtime = Runtime::builder(RuntimeOptions {
        app_id: "shop".into(),
        ..Default::default()
    })
    .aggregate::<Order>(())
    .aggregate::<Customer>(())
    .view::<OrdersView>()
    .view::<CustomersView>()
    .build(live_log.clone());
    assert!(runtime.wait_restored(Duration::from_secs(30)).await);

    let mut rng = StdRng::seed_from_u64(4);
    let mut all = Position::default();
    let mut accepted = |p: Option<Position>| {
        for (topic, part, o) in p.iter().flat_map(|p| p.marks()) {
            all.advance(topic, part, o);
        }
    };
    for i in 0..200 {
        let body = json!({"type": "PlaceOrder", "customer_id": format!("c{}", rng.random_range(0..9)),
            "items": [{"sku": "a", "qty": rng.random_range(1..4), "price_cents": rng.random_range(0..3000)}]});
        accepted(send(&runtime, "order", &format!("o-{i}"), body).await);
    }
    for _ in 0..500 {
        let id = format!("o-{}", rng.random_range(0..200));
        let body = match rng.random_range(0..4) {
            0 => json!({"type": "AddItem", "sku": "b", "qty": 2, "price_cents": rng.random_range(0..900)}),
            1 => json!({"type": "ConfirmOrder"}),
            2 => json!({"type": "CancelOrder", "reason": "r"}),
            _ => json!({"type": "ShipOrder"}),
        };
        accepted(send(&runtime, "order", &id, body).await);
    }
    // Duplicate addresses only among customers of one partition: across partitions, which
    // row keeps a unique value depends on the order the live partitions ran in.
    let email = |rng: &mut StdRng, id: &str| {
        let p = partition_for(id.as_bytes(), PARTITIONS);
        format!("u{}@p{p}.test", rng.random_range(0..3))
    };
    for i in 0..60 {
        let id = format!("cu-{i}");
        let body = json!({"type": "RegisterCustomer", "name": format!("n{i}"), "email": email(&mut rng, &id)});
        accepted(send(&runtime, "customer", &id, body).await);
    }
    for _ in 0..120 {
        let id = format!("cu-{}", rng.random_range(0..60));
        let body = match rng.random_range(0..3) {
            0 => json!({"type": "ChangeEmail", "email": email(&mut rng, &id)}),
            1 => json!({"type": "DeleteCustomer"}),
            _ => json!({"type": "RegisterCustomer", "name": "again", "email": email(&mut rng, &id)}),
        };
        accepted(send(&runtime, "customer", &id, body).await);
    }
    for view in ["orders", "customers"] {
        let svc = runtime.view(view).unwrap();
        let marks = all.marks().filter(|(t, _, _)| *t == svc.source_topic());
        let mut min = Position::default();
        for (t, p, o) in marks {
            min.advance(t, p, o);
        }
        svc.wait_for(&min, Duration::from_secs(30)).await.unwrap();
    }
    let live = |view: &str| live_log.store().dump_view(view).unwrap();
    assert!(live("orders").len() > 200 * 5, "every order has a row and four entries");
    assert!(
        live("customers").iter().filter(|(t, _, _)| *t == "view_index").count() > 5,
        "customers hold unique entries"
    );

    // The same events in another store, where the views are rebuilt.
    let copy_dir = tempfile::tempdir().unwrap();
    let copy: Arc<dyn Log> = Arc::new(common::test_log(copy_dir.path()));
    let mut batch = Batch::new();
    let mut order_events = 0;
    for topic in ["shop.order.events", "shop.customer.events"] {
        for p in 0..PARTITIONS {
            for (offset, record) in live_log.read(topic, p, 0, usize::MAX).await.unwrap() {
                batch.put_log(topic, p, offset, &record);
                order_events += u64::from(topic == "shop.order.events");
            }
        }
    }
    copy.store().commit(batch, true).unwrap();
    // Every row in memory (parsed or as JSON); written after every chunk; and parsed rows
    // demoted to JSON all the time (a few rows' worth of memory for them).
    let tight = ViewOptions {
        rebuild_batch_events: 7,
        rebuild_cache_bytes: 0,
        rebuild_threads: 3,
        ..Default::default()
    };
    let demoting = ViewOptions {
        rebuild_batch_events: 5,
        rebuild_hot_bytes: 6_000,
        rebuild_threads: 2,
        ..Default::default()
    };
    for options in [ViewOptions::default(), tight, demoting] {
        let mut progress = |_, _| {};
        let stats = rebuild::<OrdersView>(copy.clone(), "shop", &options, &mut progress)
            .await
            .unwrap();
        assert_eq!(stats.events, order_events, "every order event: {stats:?}");
        let stats = rebuild::<CustomersView>(copy.clone(), "shop", &options, &mut progress)
            .await
            .unwrap();
        assert!(stats.unique_conflicts > 0, "the data has unique conflicts: {stats:?}");
        for view in ["orders", "customers"] {
            let rebuilt = copy.store().dump_view(view).unwrap();
            assert_eq!(rebuilt.len(), live(view).len(), "{view}: as many entries");
            assert!(rebuilt == live(view), "{view}: the same entries, byte for byte");
        }
    }

    // A live service on a store with the events and no views: the orders view's
    // partitions catch up in bulk, also one whose earlier bulk catch-up was interrupted
    // (its marker and a stray row of its own are there); once with a memory so small
    // that every chunk is written early. The view is stored exactly like the live one.
    let stray = (0..)
        .map(|i| format!("stray-{i}"))
        .find(|k| partition_for(k.as_bytes(), PARTITIONS) == 1)
        .unwrap();
    for (cache, hot, threads) in [(64 << 20, 512 << 20, 2), (0, 0, 3), (64 << 20, 4_000, 1)] {
        let bulk_dir = tempfile::tempdir().unwrap();
        let bulk_log: Arc<dyn Log> = Arc::new(common::test_log(bulk_dir.path()));
        let mut batch = Batch::new();
        for p in 0..PARTITIONS {
            for (offset, record) in live_log.read("shop.order.events", p, 0, usize::MAX).await.unwrap() {
                batch.put_log("shop.order.events", p, offset, &record);
            }
        }
        batch.put_view_row("orders", &stray, b"{}");
        batch.put_meta("view_bulk/orders/1", 1);
        bulk_log.store().commit(batch, true).unwrap();
        let runtime = Runtime::builder(RuntimeOptions {
            app_id: "shop".into(),
            ..Default::default()
        })
        .aggregate::<Order>(())
        .aggregate::<Customer>(())
        .view::<OrdersView>()
        .view::<CustomersView>()
        .view_options(ViewOptions {
            bulk_catch_up_min_events: 1,
            rebuild_cache_bytes: cache,
            rebuild_hot_bytes: hot,
            rebuild_threads: threads,
            rebuild_batch_events: 13,
            ..Default::default()
        })
        .build(bulk_log.clone());
        let svc = runtime.view("orders").unwrap();
        let mut min = Position::default();
        for (t, p, o) in all.marks().filter(|(t, _, _)| *t == svc.source_topic()) {
            min.advance(t, p, o);
        }
        svc.wait_for(&min, Duration::from_secs(30)).await.unwrap();
        let bulk = bulk_log.store().dump_view("orders").unwrap();
        assert_eq!(
            bulk.len(),
            live("orders").len(),
            "orders caught up in bulk: as many entries"
        );
        assert!(
            bulk == live("orders"),
            "orders caught up in bulk: the same entries, byte for byte"
        );
        assert!(
            bulk_log.store().get_meta("view_bulk/orders/1").unwrap().is_none(),
            "marker removed"
        );
    }
}
