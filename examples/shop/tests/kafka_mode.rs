//! `shop --kafka` against a real broker: commands processed exactly once, checked by an
//! independent read_committed consumer of `<app>.order.events` (rdkafka directly, not
//! eventfold's code path); then the instance is killed and started on an EMPTY data
//! directory (a fresh machine) and restores states and outcomes from the topics.
//!
//! Needs a broker at `EVENTFOLD_KAFKA_BOOTSTRAP` (default 127.0.0.1:9092), which
//! `scripts/test.sh` starts. Without one the test fails; it never skips.

mod common;

use common::{get, get_text, post, read_committed, start};
use rdkafka::config::ClientConfig;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// The broker, and a fresh app id (so fresh topics) with `prefix`.
fn setup(prefix: &str) -> (String, String) {
    (common::kafka_bootstrap(), format!("{prefix}{}", rand::random::<u32>()))
}

#[test]
fn shop_on_kafka_is_exactly_once_and_restores_on_an_empty_data_directory() {
    let (bootstrap, app) = setup("kt");
    let dir1 = tempfile::tempdir().unwrap();
    // The order flow would add events these checks do not expect (its own test: flows.rs).
    let flags = [
        "--kafka",
        bootstrap.as_str(),
        "--app-id",
        app.as_str(),
        "--no-process-managers",
    ];
    let (shop1, url, lines) = start(dir1.path(), &flags);
    assert!(lines.join("\n").contains("Kafka at"), "{lines:?}");

    // 10 orders placed and confirmed, 5 refused commands, every one with its own key.
    let mut acked: BTreeMap<String, (u16, Value)> = BTreeMap::new();
    let place = r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"s","qty":1,"price_cents":100}]}"#;
    for i in 0..10 {
        for (key, body) in [
            (format!("place-{i}"), place),
            (format!("confirm-{i}"), r#"{"type":"ConfirmOrder"}"#),
        ] {
            let (st, b) = post(&url, &format!("/v1/aggregates/order/o-{i}/commands"), body, &key);
            assert_eq!(st, 200, "{key}: {b}");
            acked.insert(key, (st, b));
        }
    }
    for i in 0..5 {
        let key = format!("late-add-{i}");
        let body = r#"{"type":"AddItem","sku":"x","qty":1,"price_cents":5}"#;
        let (st, b) = post(&url, &format!("/v1/aggregates/order/o-{i}/commands"), body, &key);
        assert_eq!((st, b["error"].as_str()), (422, Some("not_placed")), "{b}");
        acked.insert(key, (st, b));
    }
    // A replayed key returns the original outcome (I3).
    let (st, again) = post(&url, "/v1/aggregates/order/o-3/commands", place, "place-3");
    assert_eq!((st, &again), (200, &acked["place-3"].1));

    // /metrics splits the commits' time by transaction step; each step that a command
    // over HTTP goes through took time (send_offsets too: every unit carries the
    // partition's consumed offset, the zombie fence).
    let metrics = get_text(&url, "/metrics");
    for stage in ["produce", "send_offsets", "delivery", "commit", "local_write"] {
        let prefix = format!("eventfold_log_transaction_stage_seconds_total{{backend=\"kafka\",stage=\"{stage}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&prefix));
        let seconds: f64 = line
            .and_then(|l| l[prefix.len()..].parse().ok())
            .unwrap_or_else(|| panic!("no {prefix}in /metrics:\n{metrics}"));
        assert!(seconds > 0.0, "{stage}: {seconds} s");
    }
    // The views at the end of partitions this instance owns and restored read its local
    // copy (`Coordinated::set_sole_writer`): idle, they ask the broker nothing. (Before, each view
    // partition sent a ListOffsets at every poll: about 10 a second from an idle shop.)
    let broker_requests = || -> u64 {
        get_text(&url, "/metrics")
            .lines()
            .filter(|l| l.starts_with("eventfold_log_broker_requests_total{"))
            .map(|l| {
                l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .expect("a counter") as u64
            })
            .sum()
    };
    let before = broker_requests();
    assert!(before > 0, "the restores asked for the partitions' ends");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(broker_requests(), before, "requests to the broker from an idle shop");

    // The independent consumer sees every acknowledged event exactly once (I1, I2).
    let events = read_committed(&bootstrap, &format!("{app}.order.events"), 8);
    assert_eq!(
        events.len(),
        20,
        "two events per order, nothing for refusals or replays"
    );
    let mut versions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, headers, _) in &events {
        versions
            .entry(key.clone())
            .or_default()
            .push(headers["ef-version"].parse().unwrap());
        let cmd = &headers["ef-command-id"];
        let (st, ack) = &acked[cmd];
        assert_eq!(*st, 200, "event of command {cmd} which was not accepted");
        assert_eq!(ack["aggregate_id"].as_str(), Some(key.as_str()));
        for h in [
            "ef-type",
            "ef-id",
            "ef-aggregate-id",
            "ef-correlation-id",
            "ef-causation-id",
            "content-type",
        ] {
            assert!(headers.contains_key(h), "header {h} on every event");
        }
    }
    assert!(
        versions.values().all(|v| v == &[1, 2]),
        "versions 1..n per aggregate: {versions:?}"
    );

    // The orders view follows the topic: every order confirmed (each partition's end is
    // past its last record: transaction markers take offsets too), and the instance ready.
    let confirmed = |url: &str, min: &str| -> usize {
        let (st, b) = get(url, &format!("/v1/views/orders?status=confirmed&limit=100{min}"));
        assert_eq!(st, 200, "{b}");
        b["rows"].as_array().unwrap().len()
    };
    let pos = acked["confirm-9"].1["position"].as_str().unwrap().to_owned();
    assert_eq!(confirmed(&url, &format!("&min_position={pos}")), 10);
    let ready = |url: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (st, b) = get(url, "/readyz");
            if st == 200 {
                return b;
            }
            assert!(Instant::now() < deadline, "not ready: {b}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let b = ready(&url);
    assert!(
        b["views"].as_array().unwrap().iter().all(|v| v["state"] == "ready"),
        "{b}"
    );

    // The state topic keeps an accepted command's outcome as a reference to its events
    // (in the same transaction), a refusal's as its JSON; the new instance below restores
    // both.
    let state: HashMap<String, Value> = read_committed(&bootstrap, &format!("{app}.order.state"), 8)
        .into_iter()
        .map(|(key, _, value)| (key, value))
        .collect();
    assert_eq!(
        state["cmd/place-7"]["events"],
        serde_json::json!({"aggregate_id": "o-7", "version": 1, "count": 1}),
        "{}",
        state["cmd/place-7"]
    );
    assert!(state["cmd/place-7"].get("outcome").is_none());
    assert_eq!(
        state["cmd/late-add-1"]["outcome"]["rejected"]["error"].as_str(),
        Some("not_placed"),
        "{}",
        state["cmd/late-add-1"]
    );

    // SIGKILL, then a new instance on an EMPTY data directory: everything comes back
    // from the topics (I5).
    let states: Vec<Value> = (0..10)
        .map(|i| get(&url, &format!("/v1/aggregates/order/o-{i}")).1)
        .collect();
    drop(shop1);
    let dir2 = tempfile::tempdir().unwrap();
    // Everything restores in bulk (the changelogs, and the orders view's partitions).
    let bulk = [&flags[..], &["--bulk-min-records", "1"]].concat();
    let (_shop2, url, _) = start(dir2.path(), &bulk);
    // The views rebuild from the topics on the new machine: ready once caught up.
    ready(&url);
    assert_eq!(confirmed(&url, ""), 10, "the orders view rebuilt from the topic");
    for (i, before) in states.iter().enumerate() {
        let (st, now) = get(&url, &format!("/v1/aggregates/order/o-{i}"));
        assert_eq!(
            (st, &now),
            (200, before),
            "state of o-{i} restored from the state topic"
        );
        let (_, evs) = get(&url, &format!("/v1/aggregates/order/o-{i}/events"));
        assert_eq!(
            evs.as_array().unwrap().len(),
            2,
            "events of o-{i} readable after restore"
        );
    }
    for key in ["place-7", "confirm-2", "late-add-1"] {
        let i = key.rsplit('-').next().unwrap();
        let body = if key.starts_with("place") {
            place
        } else {
            r#"{"type":"ConfirmOrder"}"#
        };
        let body = if key.starts_with("late") {
            r#"{"type":"AddItem","sku":"x","qty":1,"price_cents":5}"#
        } else {
            body
        };
        let (st, b) = post(&url, &format!("/v1/aggregates/order/o-{i}/commands"), body, key);
        assert_eq!(
            (st, &b),
            (acked[key].0, &acked[key].1),
            "outcome of {key} restored from the state topic"
        );
    }
    let (st, b) = post(
        &url,
        "/v1/aggregates/order/o-0/commands",
        r#"{"type":"ShipOrder"}"#,
        "ship-0",
    );
    assert_eq!(
        (st, b["version"].as_u64()),
        (200, Some(3)),
        "versions continue after restore: {b}"
    );
    let events = read_committed(&bootstrap, &format!("{app}.order.events"), 8);
    assert_eq!(events.len(), 21, "the restarted instance wrote nothing twice");
}

/// Produces `value` keyed by `key` to `topic` with the given headers (murmur2 partitioner,
/// as Kafka's Java clients use by default).
fn produce(bootstrap: &str, topic: &str, key: &str, value: &str, hdrs: &[(&str, &str)], partition: Option<i32>) {
    use rdkafka::message::OwnedHeaders;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("partitioner", "murmur2_random")
        .create()
        .unwrap();
    let mut h = OwnedHeaders::new();
    for (k, v) in hdrs {
        h = h.insert(rdkafka::message::Header {
            key: k,
            value: Some(*v),
        });
    }
    let mut record = BaseRecord::to(topic).key(key).payload(value).headers(h);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// Waits until the results topic holds an outcome for every key in `keys`.
fn outcomes(bootstrap: &str, topic: &str, keys: &[&str]) -> HashMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let got: HashMap<String, Value> = read_committed(bootstrap, topic, 8)
            .into_iter()
            .map(|(k, _, v)| (k, v))
            .collect();
        if keys.iter().all(|k| got.contains_key(*k)) {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "outcomes of {keys:?} did not appear on {topic}: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn commands_produced_by_any_kafka_client_are_processed_once() {
    let (bootstrap, app) = setup("kc");
    let dir = tempfile::tempdir().unwrap();
    // The order flow would add events these checks do not expect (its own test: flows.rs).
    let flags = [
        "--kafka",
        bootstrap.as_str(),
        "--app-id",
        app.as_str(),
        "--no-process-managers",
    ];
    let (shop1, url, _) = start(dir.path(), &flags);
    let commands = format!("{app}.order.commands");
    let results = format!("{app}.order.results");
    // Only a key, a JSON value and ef-type, as DESIGN §2 allows.
    let place = r#"{"customer_id":"c9","items":[{"sku":"s","qty":1,"price_cents":10}]}"#;
    let send = |value: &str, hdrs: &[(&str, &str)], partition: Option<i32>| {
        produce(&bootstrap, &commands, "x-1", value, hdrs, partition)
    };
    send(place, &[("ef-type", "PlaceOrder"), ("ef-command-id", "ext-1")], None);
    send("not json", &[("ef-command-id", "ext-bad")], None);
    send(r#"{"type":"ConfirmOrder"}"#, &[("ef-command-id", "ext-2")], None);
    // The same command id again (a producer retry): executed once.
    send(place, &[("ef-type", "PlaceOrder"), ("ef-command-id", "ext-1")], None);
    // On another partition than murmur2 gives: refused, the aggregate keeps one owner.
    let home = eventfold::core::partition::partition_for(b"x-1", 8) as i32;
    let wrong = (home + 1) % 8;
    send(
        r#"{"type":"ShipOrder"}"#,
        &[("ef-command-id", "ext-wrong")],
        Some(wrong),
    );

    let got = outcomes(&bootstrap, &results, &["ext-1", "ext-bad", "ext-2", "ext-wrong"]);
    assert_eq!(got["ext-1"]["accepted"]["version"], 1, "{got:?}");
    assert_eq!(got["ext-2"]["accepted"]["version"], 2, "{got:?}");
    assert_eq!(got["ext-bad"]["rejected"]["error"], "malformed_command");
    assert_eq!(got["ext-wrong"]["rejected"]["error"], "malformed_command");
    assert!(
        got["ext-wrong"]["rejected"]["message"]
            .as_str()
            .unwrap()
            .contains("murmur2")
    );
    let (st, state) = get(&url, "/v1/aggregates/order/x-1");
    assert_eq!(
        (st, state["version"].as_u64(), state["state"]["status"].as_str()),
        (200, Some(2), Some("confirmed"))
    );
    let events = read_committed(&bootstrap, &format!("{app}.order.events"), 8);
    assert_eq!(events.len(), 2, "the repeated command id ran once: {events:?}");

    // Consumed offsets were committed with the effects: a restart re-executes nothing.
    drop(shop1);
    let (_shop2, url, _) = start(dir.path(), &flags);
    send(r#"{"type":"ShipOrder"}"#, &[("ef-command-id", "ext-3")], None);
    let got = outcomes(&bootstrap, &results, &["ext-3"]);
    assert_eq!(got["ext-3"]["accepted"]["version"], 3, "{got:?}");
    assert_eq!(
        read_committed(&bootstrap, &format!("{app}.order.events"), 8).len(),
        3,
        "nothing ran twice after the restart"
    );
    assert_eq!(get(&url, "/v1/aggregates/order/x-1").1["version"], 3);
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Waits until the instances at `urls` are ready and own every partition between them.
fn wait_split(urls: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (mut owned, mut total, mut ready) = (0, 0, true);
        for url in urls {
            let (st, b) = get(url, "/readyz");
            ready &= st == 200;
            owned += b["owned_partitions"].as_u64().unwrap_or(0);
            total = b["partitions"].as_u64().unwrap_or(0);
        }
        if ready && total > 0 && owned == total {
            return;
        }
        assert!(Instant::now() < deadline, "{owned} of {total} partitions owned");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The orders of `customer` in the `orders` view of `url`, all pages, as (key, status).
fn orders_of(url: &str, customer: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/v1/views/orders?customer_id={customer}&limit=3{cursor}");
        let (st, b) = get(url, &path);
        assert_eq!(st, 200, "{path}: {b}");
        for row in b["rows"].as_array().unwrap() {
            out.push((
                row["key"].as_str().unwrap().to_owned(),
                row["value"]["status"].as_str().unwrap_or_default().to_owned(),
            ));
        }
        match b["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

/// The keys a query returns, page by page with `limit` rows per page.
fn paged_keys(url: &str, query: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/v1/views/orders?{query}&limit={limit}{cursor}");
        let (st, b) = get(url, &path);
        assert_eq!(st, 200, "{path}: {b}");
        let rows = b["rows"].as_array().unwrap();
        assert!(rows.len() <= limit, "{path}: {b}");
        out.extend(rows.iter().map(|r| r["key"].as_str().unwrap().to_owned()));
        match b["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

/// Partitions of the `orders` view each instance serves itself (from `/metrics`: state 2
/// is "served by another instance").
fn view_partitions_served(url: &str) -> (usize, usize) {
    let body = get_text(url, "/metrics");
    let lines: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("eventfold_view_up{view=\"orders\""))
        .collect();
    (lines.iter().filter(|l| !l.ends_with(" 2")).count(), lines.len())
}

/// Every order's row, the same through both instances, and index queries whose pages
/// (merged from both instances' parts) concatenate to the one-page answer.
fn check_orders_view(urls: &[&str], ids: &[String]) {
    for id in ids {
        let rows: Vec<Value> = urls
            .iter()
            .map(|u| {
                let (st, row) = get(u, &format!("/v1/views/orders/{id}"));
                assert_eq!(st, 200, "{u}: {row}");
                row
            })
            .collect();
        assert!(rows.windows(2).all(|w| w[0] == w[1]), "{id}: {rows:?}");
    }
    for query in [
        "order_by=placed_at&order=desc",
        "total_cents_gte=0",
        "status=placed&order=desc",
    ] {
        let whole = paged_keys(urls[0], query, 1000);
        for url in urls {
            for limit in [1, 2, 5] {
                assert_eq!(paged_keys(url, query, limit), whole, "{url}: {query}, pages of {limit}");
            }
        }
        let mut unique = whole.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), whole.len(), "{query}: a row twice: {whole:?}");
        if query == "total_cents_gte=0" {
            let mut expected = ids.to_vec();
            expected.sort();
            assert_eq!(unique, expected);
        }
    }
}

/// Two instances on Kafka split the partitions; commands go to either. Each instance
/// materializes every view partition from the events topics, so either answers any key
/// lookup (after the writer's position, read-your-writes across instances) and any index
/// query, with the same answer; an instance killed and restarted answers the same again.
#[test]
fn two_instances_answer_every_view_query_alike() {
    let (bootstrap, app) = setup("kv");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let flags = |id: &'static str| {
        vec![
            "--kafka".to_owned(),
            bootstrap.clone(),
            "--app-id".to_owned(),
            app.clone(),
            "--instance-id".to_owned(),
            id.to_owned(),
            "--no-process-managers".to_owned(),
        ]
    };
    let (fa, fb) = (flags("a"), flags("b"));

    let (_a, url_a, _) = start(dir_a.path(), &as_strs(&fa));
    let (b, url_b, _) = start(dir_b.path(), &as_strs(&fb));
    wait_split(&[&url_a, &url_b]);

    let place = |c: &str| {
        format!(r#"{{"type":"PlaceOrder","customer_id":"{c}","items":[{{"sku":"s","qty":1,"price_cents":100}}]}}"#)
    };
    let mut expected: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for i in 0..12 {
        let (via, other) = if i % 2 == 0 { (&url_a, &url_b) } else { (&url_b, &url_a) };
        let customer = format!("c{}", i % 3);
        let id = format!("o-{i}");
        let (st, ack) = post(
            via,
            &format!("/v1/aggregates/order/{id}/commands"),
            &place(&customer),
            "",
        );
        assert_eq!(st, 200, "{ack}");
        let mut status = "placed";
        if i % 4 == 0 {
            let (st, ack2) = post(
                other,
                &format!("/v1/aggregates/order/{id}/commands"),
                r#"{"type":"ConfirmOrder"}"#,
                "",
            );
            assert_eq!(st, 200, "{ack2}");
            status = "confirmed";
        }
        // The row is visible on both instances once they applied the last write.
        let (_, last) = get(via, &format!("/v1/aggregates/order/{id}"));
        assert_eq!(last["version"], if status == "confirmed" { 2 } else { 1 }, "{last}");
        for url in [&url_a, &url_b] {
            let (_, evs) = get(url, &format!("/v1/aggregates/order/{id}/events"));
            assert_eq!(
                evs.as_array().map(Vec::len),
                last["version"].as_u64().map(|v| v as usize),
                "{evs}"
            );
        }
        expected.entry(customer).or_default().push((id, status.to_owned()));
    }
    // Read-your-writes across instances: a write through one, read at once through the
    // other with its position.
    let (st, ack) = post(&url_a, "/v1/aggregates/order/o-99/commands", &place("c9"), "");
    assert_eq!(st, 200, "{ack}");
    let pos = ack["position"].as_str().unwrap();
    let (st, row) = get(&url_b, &format!("/v1/views/orders/o-99?min_position={pos}"));
    assert_eq!((st, row["value"]["customer_id"].as_str()), (200, Some("c9")), "{row}");
    expected
        .entry("c9".into())
        .or_default()
        .push(("o-99".into(), "placed".into()));
    // An equality query lists its rows in row-key order.
    expected.values_mut().for_each(|rows| rows.sort());

    let wait_rows = |url: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let all: BTreeMap<String, Vec<(String, String)>> =
                expected.keys().map(|c| (c.clone(), orders_of(url, c))).collect();
            if all == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "view rows at {url}: {all:?}, expected {expected:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_rows(&url_a);
    wait_rows(&url_b);
    // `orders` is partitioned: each instance applies and holds only its share.
    let ((served_a, total), (served_b, _)) = (view_partitions_served(&url_a), view_partitions_served(&url_b));
    assert!(
        served_a > 0 && served_b > 0 && served_a + served_b == total,
        "orders partitions served: a {served_a}, b {served_b} of {total}"
    );
    let ids: Vec<String> = expected.values().flatten().map(|(id, _)| id.clone()).collect();
    check_orders_view(&[&url_a, &url_b], &ids);

    // b is killed and restarted on its data directory: the same rows, none lost or doubled.
    drop(b);
    let (_b, url_b, _) = start(dir_b.path(), &as_strs(&fb));
    wait_split(&[&url_a, &url_b]);
    wait_rows(&url_b);
    wait_rows(&url_a);
    for c in expected.keys() {
        assert_eq!(orders_of(&url_a, c), orders_of(&url_b, c));
    }
    check_orders_view(&[&url_a, &url_b], &ids);
}

/// Topics created beforehand that cannot hold what eventfold keeps in them (an events
/// topic with a finite retention, a state topic that deletes, a commands topic with
/// another partition count) stop the start: the shop exits with an error naming each of
/// them and the setting to change, before it serves anything.
#[test]
fn topics_that_would_lose_data_stop_the_start() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let (bootstrap, app) = setup("kp");
    let (events, state, commands) = (
        format!("{app}.order.events"),
        format!("{app}.payment.state"),
        format!("{app}.customer.commands"),
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let created = rt
        .block_on(admin.create_topics(
            [
                &NewTopic::new(&events, 8, TopicReplication::Fixed(1)).set("retention.ms", "604800000"),
                &NewTopic::new(&state, 8, TopicReplication::Fixed(1)).set("cleanup.policy", "delete"),
                &NewTopic::new(&commands, 3, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        ))
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");

    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--kafka",
        bootstrap.as_str(),
        "--app-id",
        app.as_str(),
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ];
    let mut child = common::shop(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("shop runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "shop still ran after 60 s instead of refusing to start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the start is refused: {stderr}");
    for part in [
        events.as_str(),
        "retention.ms=604800000",
        "set retention.ms=-1",
        state.as_str(),
        "cleanup.policy=delete",
        "set cleanup.policy=compact",
        commands.as_str(),
        "has 3 partitions but this log expects 8",
    ] {
        assert!(stderr.contains(part), "stderr names {part:?}: {stderr}");
    }
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("curl"),
        "nothing was served"
    );
}

/// One record batch of a partition's segment files: its record count, compression codec
/// (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd) and whether it is a transaction marker.
#[derive(Debug)]
struct StoredBatch {
    records: u32,
    compression: u16,
    control: bool,
}

/// The record batches the broker stored for `topic`, read from its segment files in
/// `log_dir` (Kafka's v2 batch header: base offset, length, leader epoch, magic, CRC,
/// attributes, ..., record count).
fn stored_batches(log_dir: &std::path::Path, topic: &str) -> Vec<StoredBatch> {
    let mut batches = Vec::new();
    let prefix = format!("{topic}-");
    let dirs = std::fs::read_dir(log_dir).unwrap_or_else(|e| {
        panic!(
            "cannot list the broker's log dir {} ({e}): this test reads the broker's segment files, so the broker must run on this machine",
            log_dir.display()
        )
    });
    for dir in dirs.flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        if name.strip_prefix(&prefix).is_none_or(|p| p.parse::<u32>().is_err()) {
            continue;
        }
        for file in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if file.path().extension().is_none_or(|e| e != "log") {
                continue;
            }
            let bytes = std::fs::read(file.path()).unwrap();
            let mut at = 0;
            while at + 12 <= bytes.len() {
                let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
                let batch = &bytes[at + 12..(at + 12 + len).min(bytes.len())];
                assert!(
                    batch.len() == len && len >= 49,
                    "a whole v2 batch in {}",
                    file.path().display()
                );
                assert_eq!(batch[4], 2, "magic 2 in {}", file.path().display());
                let attributes = u16::from_be_bytes([batch[9], batch[10]]);
                batches.push(StoredBatch {
                    records: u32::from_be_bytes(batch[45..49].try_into().unwrap()),
                    compression: attributes & 7,
                    control: attributes & 0x20 != 0,
                });
                at += 12 + len;
            }
        }
    }
    batches
}

/// eventfold's producers compress their batches with LZ4 (the broker then validates them
/// without allocating every record's headers), unless `--kafka-config` chooses otherwise:
/// checked in the segment files the broker wrote.
#[test]
fn producers_write_lz4_batches_unless_the_config_says_otherwise() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;

    let bootstrap = common::kafka_bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let metadata = admin.inner().fetch_metadata(None, Duration::from_secs(10)).unwrap();
    let node = metadata.brokers()[0].id();
    let described = rt
        .block_on(admin.describe_configs([&ResourceSpecifier::Broker(node)], &AdminOptions::new()))
        .unwrap();
    let config = described[0].as_ref().expect("the broker's configs");
    let log_dirs = config
        .get("log.dirs")
        .and_then(|e| e.value.clone())
        .or_else(|| config.get("log.dir").and_then(|e| e.value.clone()))
        .expect("the broker names its log dirs");
    let log_dir = std::path::PathBuf::from(log_dirs.split(',').next().unwrap());

    for (extra, codec) in [(None, 3), (Some("compression.type=none"), 0)] {
        let (_, app) = setup("kz");
        let dir = tempfile::tempdir().unwrap();
        let mut flags = vec![
            "--kafka",
            bootstrap.as_str(),
            "--app-id",
            app.as_str(),
            "--partitions",
            "2",
            "--no-process-managers",
        ];
        if let Some(e) = extra {
            flags.extend(["--kafka-config", e]);
        }
        let (shop, url, _) = start(dir.path(), &flags);
        // Eight clients at once, so that transactions hold several records a partition.
        std::thread::scope(|s| {
            for c in 0..8 {
                let url = url.as_str();
                s.spawn(move || {
                    let place =
                        r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"s","qty":1,"price_cents":100}]}"#;
                    for i in 0..25 {
                        let (st, b) = post(
                            url,
                            &format!("/v1/aggregates/order/z{c}-{i}/commands"),
                            place,
                            &format!("z{c}-{i}"),
                        );
                        assert_eq!(st, 200, "{b}");
                    }
                });
            }
        });
        drop(shop);
        // An event per command; its state and its outcome on the state topic.
        for (topic, expected) in [
            (format!("{app}.order.events"), 200),
            (format!("{app}.order.state"), 400),
        ] {
            let data: Vec<StoredBatch> = stored_batches(&log_dir, &topic)
                .into_iter()
                .filter(|b| !b.control)
                .collect();
            let records: u32 = data.iter().map(|b| b.records).sum();
            assert_eq!(
                records, expected,
                "{topic}: every command's records are stored: {data:?}"
            );
            let multi: Vec<&StoredBatch> = data.iter().filter(|b| b.records > 1).collect();
            assert!(!multi.is_empty(), "{topic}: some batch holds several records: {data:?}");
            // librdkafka sends a batch uncompressed when compressing does not make it
            // smaller, which can happen to a lone record; several always shrink.
            assert!(
                multi.iter().all(|b| b.compression == codec),
                "{topic} ({extra:?}): every batch of several records has codec {codec}: {data:?}"
            );
            if codec == 0 {
                assert!(
                    data.iter().all(|b| b.compression == 0),
                    "{topic}: nothing compressed: {data:?}"
                );
            }
        }
    }
}
