//! The shop's flows (DESIGN §7) end to end on the embedded log: the `shop` binary as a
//! child process, checked over HTTP only. Payment on confirm, ship when paid, cancel
//! when declined, expiry (with `--order-expiry-secs`), the process manager's own
//! endpoint, `/readyz` and `/metrics`, and a SIGKILL in the middle of flows.

mod common;

use common::{confirm, events, get, get_text, place, post, start, types};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const DECLINE_ABOVE: u64 = 10_000;

/// The order flow's state in a `/readyz` body.
fn flow_state(ready: &Value) -> String {
    ready["process_managers"]
        .as_array()
        .and_then(|pms| pms.iter().find(|p| p["name"] == "order_flow"))
        .and_then(|p| p["state"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Waits until the order's last event is `last` (and returns its events).
fn wait_for_last(url: &str, order: &str, last: &str, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let e = events(url, "order", order);
        if e.last().and_then(|e| e["type"].as_str()) == Some(last) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "order {order} did not end with {last} within {within:?}: {:?}",
            types(&e)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_shops_flows_run_on_the_embedded_log() {
    let dir = tempfile::tempdir().unwrap();
    let limit = DECLINE_ABOVE.to_string();
    let flags = [
        "--order-expiry-secs",
        "2",
        "--decline-above-cents",
        &limit,
        "--partitions",
        "4",
    ];
    let (_shop, url, _) = start(dir.path(), &flags);
    the_shops_flows(&url, "o");
}

/// The same on Kafka: one instance runs the order flow, its rows in the changelog topic.
#[test]
fn the_shops_flows_run_on_kafka() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("flows{}", rand::random::<u32>());
    let dir = tempfile::tempdir().unwrap();
    let limit = DECLINE_ABOVE.to_string();
    let flags = [
        "--kafka",
        &bootstrap,
        "--app-id",
        &app,
        "--order-expiry-secs",
        "2",
        "--decline-above-cents",
        &limit,
        "--partitions",
        "4",
    ];
    let (_shop, url, _) = start(dir.path(), &flags);
    // Ready once the group has assigned the order flow here (`remote` before).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, ready) = get(&url, "/readyz");
        if flow_state(&ready) == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "the order flow did not start here: {ready}");
        std::thread::sleep(Duration::from_millis(100));
    }
    the_shops_flows(&url, "k");
    // Its rows went to the changelog topic too (partition 0: one instance runs it).
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let topic = format!("{app}.order_flow.state");
    let (low, high) = consumer.fetch_watermarks(&topic, 0, Duration::from_secs(10)).unwrap();
    assert!(high > low, "{topic} holds the flow's rows: {low}..{high}");
    // An ended flow's state row is deleted with a tombstone (a null value, which the
    // topic's compaction removes), not an empty record kept for ever.
    let ended: &[u8] = b"s\0k-paid";
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "tombstone-checker")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let (mut written, mut tombstone, mut read) = (false, false, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Up to the high watermark, minus the transaction markers at its end.
    while read < high - 1 && !(written && tombstone) && Instant::now() < deadline {
        use rdkafka::message::Message;
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        read = m.offset() + 1;
        if m.key() == Some(ended) {
            match m.payload() {
                Some(p) => {
                    assert!(!p.is_empty(), "a removal is a null value, not an empty one");
                    written = true;
                }
                None => tombstone = true,
            }
        }
    }
    assert!(
        written && tombstone,
        "{topic}: the state of k-paid written {written}, then a tombstone {tombstone}"
    );
}

/// Every flow once, checked over HTTP; order ids start with `prefix`.
fn the_shops_flows(url: &str, prefix: &str) {
    let o = |name: &str| format!("{prefix}-{name}");
    let pm = |name: &str| format!("/v1/process-managers/order_flow/{}", o(name));
    // /readyz lists the process manager, ready.
    let (status, ready) = get(url, "/readyz");
    assert_eq!(status, 200, "{ready}");
    let pms = ready["process_managers"].as_array().unwrap();
    let names: Vec<&str> = pms.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["customer_orders", "order_flow"], "{ready}");
    assert_eq!(flow_state(&ready), "ready");

    // Payment on confirm, ship when paid.
    place(url, &o("paid"), 500);
    // The flow reacts after the order's commit: wait (bounded) until it has.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, state) = loop {
        let (status, state) = get(url, &pm("paid"));
        if status != 404 || Instant::now() > deadline {
            break (status, state);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status, 200, "the flow keeps the placed order: {state}");
    assert_eq!(state["name"], "order_flow");
    assert_eq!(state["key"], o("paid").as_str());
    assert_eq!(state["state"]["stage"], "placed");
    assert_eq!(state["timers"][0]["id"], "expiry");
    assert!(state["timers"][0]["due"].as_str().unwrap().ends_with('Z'), "{state}");
    assert_eq!(confirm(url, &o("paid")).0, 200);
    let order = wait_for_last(url, &o("paid"), "OrderShipped", Duration::from_secs(10));
    assert_eq!(types(&order), ["OrderPlaced", "OrderConfirmed", "OrderShipped"]);
    let payment = events(url, "payment", &format!("pay-{}", o("paid")));
    assert_eq!(types(&payment), ["PaymentAuthorized"]);
    assert_eq!(payment[0]["payload"]["order_id"], o("paid").as_str());
    assert_eq!(payment[0]["payload"]["amount_cents"], 500);
    // The flow's commands carry deterministic ids; their events carry the flow's
    // correlation id (the confirmation's) and, as causation, the event reacted to.
    let ship = &order[2];
    let confirmed = &order[1];
    assert_eq!(ship["correlation_id"], confirmed["correlation_id"], "{ship}");
    assert_eq!(
        payment[0]["correlation_id"], confirmed["correlation_id"],
        "{}",
        payment[0]
    );
    assert_eq!(payment[0]["causation_id"], confirmed["id"], "{}", payment[0]);
    assert_eq!(ship["causation_id"], payment[0]["id"], "{ship}");
    assert!(
        ship["command_id"].as_str().unwrap().starts_with("order_flow:"),
        "{ship}"
    );

    // Cancel when declined.
    place(url, &o("declined"), DECLINE_ABOVE + 1);
    assert_eq!(confirm(url, &o("declined")).0, 200);
    let order = wait_for_last(url, &o("declined"), "OrderCancelled", Duration::from_secs(10));
    assert_eq!(order.last().unwrap()["payload"]["reason"], "payment_declined");
    assert_eq!(
        types(&events(url, "payment", &format!("pay-{}", o("declined")))),
        ["PaymentDeclined"]
    );

    // Expiry: an order left placed is cancelled as expired; a confirmed one is not.
    place(url, &o("left"), 700);
    place(url, &o("kept"), 700);
    assert_eq!(confirm(url, &o("kept")).0, 200);
    let order = wait_for_last(url, &o("left"), "OrderCancelled", Duration::from_secs(10));
    assert_eq!(types(&order), ["OrderPlaced", "OrderCancelled"]);
    assert_eq!(order[1]["payload"]["reason"], "expired");
    std::thread::sleep(Duration::from_millis(2500));
    let kept = wait_for_last(url, &o("kept"), "OrderShipped", Duration::from_secs(10));
    assert_eq!(types(&kept), ["OrderPlaced", "OrderConfirmed", "OrderShipped"]);

    // Finished flows keep nothing; unknown names and keys are 404 with the usual body.
    let (status, body) = get(url, &pm("paid"));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "not_found");
    let (status, body) = get(url, "/v1/process-managers/nope/o-paid");
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "unknown_process_manager");

    let metrics = get_text(url, "/metrics");
    let reactions = metrics
        .lines()
        .find(|l| l.starts_with("eventfold_process_manager_reactions_total{name=\"order_flow\"}"))
        .unwrap_or_else(|| panic!("no reactions metric in\n{metrics}"));
    let n: u64 = reactions.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 10, "{reactions}");
    assert!(
        metrics.contains("eventfold_process_manager_timers_pending{name=\"order_flow\"} 0"),
        "every timer fired or was cancelled:\n{metrics}"
    );
}

#[test]
fn flows_complete_exactly_once_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let limit = DECLINE_ABOVE.to_string();
    let args = [
        "--order-expiry-secs",
        "3",
        "--decline-above-cents",
        &limit,
        "--partitions",
        "4",
    ];
    let orders: Vec<(String, u64, bool)> = (0..60)
        .map(|i| {
            let total = if i % 5 == 0 { DECLINE_ABOVE + 1 } else { 100 + i };
            // Every fourth order is left to expire.
            (format!("o-{i}"), total, i % 4 != 3)
        })
        .collect();
    {
        let (mut shop, url, _) = start(dir.path(), &args);
        for (id, total, _) in &orders {
            place(&url, id, *total);
        }
        for (id, _, confirmed) in &orders {
            if *confirmed {
                assert_eq!(confirm(&url, id).0, 200);
            }
        }
        // Killed while flows are under way: some reacted to, some in the outbox.
        shop.0.kill().unwrap();
        shop.0.wait().unwrap();
    }
    let (_shop, url, _) = start(dir.path(), &args);
    for (id, total, confirmed) in &orders {
        let declined = *total > DECLINE_ABOVE;
        let (last, reason) = match (confirmed, declined) {
            (true, false) => ("OrderShipped", None),
            (true, true) => ("OrderCancelled", Some("payment_declined")),
            (false, _) => ("OrderCancelled", Some("expired")),
        };
        let e = wait_for_last(&url, id, last, Duration::from_secs(20));
        let expected: &[&str] = if *confirmed {
            &["OrderPlaced", "OrderConfirmed", last]
        } else {
            &["OrderPlaced", last]
        };
        assert_eq!(types(&e), expected, "order {id}");
        if let Some(r) = reason {
            assert_eq!(e.last().unwrap()["payload"]["reason"], r, "order {id}");
        }
        let payment = types(&events(&url, "payment", &format!("pay-{id}")));
        match (confirmed, declined) {
            (true, false) => assert_eq!(payment, ["PaymentAuthorized"], "order {id}"),
            (true, true) => assert_eq!(payment, ["PaymentDeclined"], "order {id}"),
            (false, _) => assert!(payment.is_empty(), "order {id}: {payment:?}"),
        }
    }
    // Nothing left over: every flow ended, every timer fired or was cancelled.
    std::thread::sleep(Duration::from_millis(300));
    let metrics = get_text(&url, "/metrics");
    for gauge in ["timers_pending", "commands_outstanding"] {
        let line = format!("eventfold_process_manager_{gauge}{{name=\"order_flow\"}} 0");
        assert!(metrics.contains(&line), "expected {line} in\n{metrics}");
    }
}

/// Kafka mode, two instances: the order flow runs on one; SIGKILLed, the consumer group
/// moves it to the other, which restores its rows from the changelog and goes on. Every
/// flow completes once, checked over HTTP and by an independent read_committed consumer.
#[test]
fn the_order_flow_moves_to_the_other_instance_on_kafka() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("flowsduo{}", rand::random::<u32>());
    let flags = |id: &str| -> Vec<String> {
        [
            "--kafka",
            &bootstrap,
            "--app-id",
            &app,
            "--instance-id",
            id,
            "--partitions",
            "4",
            "--kafka-session-timeout-secs",
            "6",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let (owned_a, owned_b) = (flags("a"), flags("b"));
    let fa: Vec<&str> = owned_a.iter().map(String::as_str).collect();
    let fb: Vec<&str> = owned_b.iter().map(String::as_str).collect();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, url_a, _) = start(da.path(), &fa);
    let (b, url_b, _) = start(db.path(), &fb);
    let owner =
        |urls: &[&str]| -> Option<usize> { urls.iter().position(|u| flow_state(&get(u, "/readyz").1) == "ready") };
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(i) = owner(&[&url_a, &url_b]) {
            break i;
        }
        assert!(Instant::now() < deadline, "no instance runs the order flow");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut guards = [Some(a), Some(b)];
    let urls = [url_a.clone(), url_b.clone()];
    let survivor = urls[1 - first].clone();

    let orders: Vec<String> = (0..20).map(|i| format!("d-{i}")).collect();
    // While partitions move (the killed instance's after the session timeout), a command
    // may get 503 or 504: retried with its key, as a client does.
    let send = |id: &str, body: Value| {
        let path = format!("/v1/aggregates/order/{id}/commands");
        let key = format!("{}-{id}", body["type"].as_str().unwrap());
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (status, answer) = post(&survivor, &path, &body.to_string(), &key);
            if status < 500 {
                assert_eq!(status, 200, "{path}: {answer}");
                return;
            }
            assert!(Instant::now() < deadline, "{path}: still {status} {answer}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let place_and_confirm = |id: &str| {
        send(
            id,
            json!({"type": "PlaceOrder", "customer_id": "c", "items": [{"sku": "s", "qty": 1, "price_cents": 100}]}),
        );
        send(id, json!({"type": "ConfirmOrder"}));
    };
    for id in &orders[..10] {
        place_and_confirm(id);
    }
    for id in &orders[..5] {
        wait_for_last(&survivor, id, "OrderShipped", Duration::from_secs(20));
    }
    // The owner dies with flows under way.
    drop(guards[first].take());
    for id in &orders[10..] {
        place_and_confirm(id);
    }
    for id in &orders {
        let e = wait_for_last(&survivor, id, "OrderShipped", Duration::from_secs(60));
        assert_eq!(
            types(&e),
            ["OrderPlaced", "OrderConfirmed", "OrderShipped"],
            "order {id}"
        );
        let p = events(&survivor, "payment", &format!("pay-{id}"));
        assert_eq!(types(&p), ["PaymentAuthorized"], "order {id}");
    }
    assert_eq!(owner(&[&survivor]), Some(0), "the survivor runs the order flow now");
    // Independently: one authorization and one shipment per order in the topics.
    let payments = common::read_committed(&bootstrap, &format!("{app}.payment.events"), 4);
    let shipments = common::read_committed(&bootstrap, &format!("{app}.order.events"), 4);
    for id in &orders {
        let pay = format!("pay-{id}");
        let n = payments.iter().filter(|(k, _, _)| *k == pay).count();
        assert_eq!(n, 1, "{pay}: {n} payment events in the topic");
        let shipped = shipments
            .iter()
            .filter(|(k, _, v)| k == id && v["type"] == "OrderShipped")
            .count();
        assert_eq!(shipped, 1, "{id}: {shipped} OrderShipped in the topic");
    }
    drop(guards);
}

/// The cascading delete (DESIGN §7) on both backends: deleting a customer cancels its
/// placed and confirmed orders with `customer_deleted`, leaves its ended orders and other
/// customers' orders alone, and cancels an order placed after the deletion.
fn the_cascade(url: &str, prefix: &str) {
    let c = format!("{prefix}-cust");
    let o = |n: &str| format!("{prefix}-{n}");
    let post_to = |path: String, body: Value| {
        let (status, answer) = post(url, &path, &body.to_string(), "");
        assert_eq!(status, 200, "{path}: {answer}");
    };
    post_to(
        format!("/v1/aggregates/customer/{c}/commands"),
        json!({"type": "RegisterCustomer", "name": "Ann", "email": format!("{c}@x.test")}),
    );
    let place_for = |order: &str, customer: &str| {
        post_to(
            format!("/v1/aggregates/order/{order}/commands"),
            json!({"type": "PlaceOrder", "customer_id": customer, "items": [{"sku": "s", "qty": 1, "price_cents": 100}]}),
        );
    };
    for n in ["placed", "confirmed", "shipped", "cancelled"] {
        place_for(&o(n), &c);
    }
    place_for(&o("other"), &format!("{prefix}-someone-else"));
    assert_eq!(confirm(url, &o("shipped")).0, 200);
    wait_for_last(url, &o("shipped"), "OrderShipped", Duration::from_secs(20));
    post_to(
        format!("/v1/aggregates/order/{}/commands", o("cancelled")),
        json!({"type": "CancelOrder", "reason": "changed my mind"}),
    );
    // Confirmed just before the deletion: the cascade cancels it, unless the order flow
    // shipped it first; either way it ends once.
    post_to(
        format!("/v1/aggregates/order/{}/commands", o("confirmed")),
        json!({"type": "ConfirmOrder"}),
    );
    post_to(
        format!("/v1/aggregates/customer/{c}/commands"),
        json!({"type": "DeleteCustomer"}),
    );
    wait_for_last(url, &o("placed"), "OrderCancelled", Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(20);
    let confirmed = loop {
        let e = events(url, "order", &o("confirmed"));
        let ended = e
            .iter()
            .any(|e| e["type"] == "OrderCancelled" || e["type"] == "OrderShipped");
        if ended || Instant::now() > deadline {
            break e;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Placed after the deletion: cancelled as soon as the cascade reads it.
    place_for(&o("late"), &c);
    let late = wait_for_last(url, &o("late"), "OrderCancelled", Duration::from_secs(20));
    assert_eq!(late.last().unwrap()["payload"]["reason"], "customer_deleted");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        types(&events(url, "order", &o("shipped"))),
        ["OrderPlaced", "OrderConfirmed", "OrderShipped"]
    );
    let cancelled = events(url, "order", &o("cancelled"));
    assert_eq!(types(&cancelled), ["OrderPlaced", "OrderCancelled"]);
    assert_eq!(cancelled[1]["payload"]["reason"], "changed my mind");
    assert_eq!(types(&events(url, "order", &o("other"))), ["OrderPlaced"]);
    let placed = events(url, "order", &o("placed"));
    assert_eq!(types(&placed), ["OrderPlaced", "OrderCancelled"]);
    assert_eq!(placed[1]["payload"]["reason"], "customer_deleted");
    let confirmed_after = events(url, "order", &o("confirmed"));
    assert_eq!(
        confirmed_after.len(),
        confirmed.len(),
        "nothing after its end: {confirmed_after:?}"
    );
    match types(&confirmed).as_slice() {
        [_, _, last] if last == "OrderShipped" => {}
        [_, _, last] if last == "OrderCancelled" => {
            assert_eq!(confirmed[2]["payload"]["reason"], "customer_deleted");
        }
        other => panic!("the confirmed order: {other:?}"),
    }
}

#[test]
fn a_deleted_customers_orders_are_cancelled_on_the_embedded_log() {
    let dir = tempfile::tempdir().unwrap();
    let (_shop, url, _) = start(dir.path(), &["--partitions", "4"]);
    the_cascade(&url, "e");
}

#[test]
fn a_deleted_customers_orders_are_cancelled_on_kafka() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("cascade{}", rand::random::<u32>());
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--kafka", &bootstrap, "--app-id", &app, "--partitions", "4"];
    let (_shop, url, _) = start(dir.path(), &flags);
    the_cascade(&url, "k");
}
