//! Session consistency (DESIGN §5) from outside, on both backends: a client that threads
//! `X-Session-Position` through writes to many partitions reads all of them with one
//! `min_position`; a query with several `min_position`s waits for all; bad tokens are 400
//! `invalid_position`. On Kafka the writes go through one instance (forwarded to the
//! partitions' owners) and the reads through the other.

mod common;

use base64::Engine as _;
use common::{get, post_with, start};
use eventfold::core::partition::partition_for;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const PARTITIONS: u32 = 8;
const ORDERS: usize = 24;

/// Places `order` for `customer`, sending `session` as `X-Session-Position`; retries 503
/// (a partition moving between instances). Returns the answer's position.
fn place(url: &str, order: &str, customer: &str, session: Option<&str>) -> String {
    let body = json!({
        "type": "PlaceOrder",
        "customer_id": customer,
        "items": [{"sku": "s", "qty": 1, "price_cents": 100}],
    })
    .to_string();
    let path = format!("/v1/aggregates/order/{order}/commands");
    let key = format!("place-{order}");
    let mut headers = vec![("Idempotency-Key", key.as_str())];
    if let Some(s) = session {
        headers.push(("X-Session-Position", s));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, answer) = post_with(url, &path, &body, &headers);
        if status == 200 {
            return answer["position"].as_str().unwrap().to_owned();
        }
        assert!(status == 503 && Instant::now() < deadline, "{order}: {status} {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ORDERS` order ids `<prefix>-<i>`, as many on every partition (ids picked by their
/// partition, so the writes cover all of them whatever the prefix).
fn spread(prefix: &str) -> Vec<String> {
    let per = ORDERS / PARTITIONS as usize;
    let mut count = [0usize; PARTITIONS as usize];
    let mut ids = Vec::new();
    for i in 0.. {
        let id = format!("{prefix}-{i}");
        let p = partition_for(id.as_bytes(), PARTITIONS) as usize;
        if count[p] < per {
            count[p] += 1;
            ids.push(id);
            if ids.len() == ORDERS {
                break;
            }
        }
    }
    ids
}

/// The order-events partitions a position token names (`v1;topic:partition:offset;...`).
fn partitions_in(token: &str, app: &str) -> BTreeSet<u32> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let topic = format!("{app}.order.events:");
    text.split(';')
        .filter_map(|mark| mark.strip_prefix(topic.as_str()))
        .map(|rest| rest.split(':').next().unwrap().parse().unwrap())
        .collect()
}

fn keys(body: &Value) -> BTreeSet<String> {
    body["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

/// Writes through `write`, reads through `read`: the checks of the module docs.
fn a_session_reads_all_its_writes(write: &str, read: &str, app: &str) {
    let run = rand::random::<u32>();
    // Threaded: each write carries the previous answer's position.
    let customer = format!("sess-{run}");
    let mut last: Option<String> = None;
    let mut orders = BTreeSet::new();
    for order in spread(&format!("s{run}")) {
        last = Some(place(write, &order, &customer, last.as_deref()));
        orders.insert(order);
    }
    let written: BTreeSet<u32> = orders.iter().map(|o| partition_for(o.as_bytes(), PARTITIONS)).collect();
    assert_eq!(written.len(), PARTITIONS as usize, "the orders cover {written:?}");
    let last = last.unwrap();
    assert_eq!(
        partitions_in(&last, app),
        written,
        "the last position merges every write of the session"
    );
    let (status, body) = get(
        read,
        &format!("/v1/views/orders?customer_id={customer}&limit=100&min_position={last}"),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(keys(&body), orders, "one query with the last position sees every write");

    // Not threaded: one position per write, all of them given to one query.
    let customer = format!("many-{run}");
    let mut tokens = Vec::new();
    let mut orders = BTreeSet::new();
    for order in spread(&format!("m{run}")) {
        tokens.push(place(write, &order, &customer, None));
        orders.insert(order);
    }
    let query: String = tokens.iter().map(|t| format!("&min_position={t}")).collect();
    let (status, body) = get(
        read,
        &format!("/v1/views/orders?customer_id={customer}&limit=100{query}"),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(keys(&body), orders, "a query waits for every min_position");
    // A key lookup takes several too.
    let one = orders.iter().next().unwrap();
    let (status, body) = get(
        read,
        &format!("/v1/views/orders/{one}?min_position={}{query}", tokens[0]),
    );
    assert_eq!(status, 200, "{body}");

    // Bad tokens: 400 invalid_position, and the command is not run.
    let (status, body) = post_with(
        write,
        "/v1/aggregates/order/bad-session/commands",
        r#"{"type":"PlaceOrder","customer_id":"c","items":[{"sku":"s","qty":1,"price_cents":1}]}"#,
        &[("X-Session-Position", "not a token")],
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_position")),
        "{body}"
    );
    let (status, _) = get(write, "/v1/aggregates/order/bad-session");
    assert_eq!(status, 404, "a command with a bad session position is not run");
    let (status, body) = get(
        read,
        &format!("/v1/views/orders?customer_id=x&min_position={last}&min_position=%21"),
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_position")),
        "{body}"
    );
}

#[test]
fn a_session_reads_all_its_writes_on_the_embedded_log() {
    let dir = tempfile::tempdir().unwrap();
    let (_shop, url, _) = start(dir.path(), &["--partitions", "8", "--no-process-managers"]);
    a_session_reads_all_its_writes(&url, &url, "shop");
}

#[test]
fn a_session_reads_all_its_writes_across_two_kafka_instances() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("session{}", rand::random::<u32>());
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let flags = |id: &'static str| {
        vec![
            "--kafka".to_owned(),
            bootstrap.clone(),
            "--app-id".to_owned(),
            app.clone(),
            "--partitions".to_owned(),
            "8".to_owned(),
            "--instance-id".to_owned(),
            id.to_owned(),
            "--no-process-managers".to_owned(),
        ]
    };
    let (fa, fb) = (flags("a"), flags("b"));
    let fa: Vec<&str> = fa.iter().map(String::as_str).collect();
    let fb: Vec<&str> = fb.iter().map(String::as_str).collect();
    let (_a, url_a, _) = start(da.path(), &fa);
    let (_b, url_b, _) = start(db.path(), &fb);
    // Both own some partitions before the writes (the group has settled).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let owned = |url: &str| {
            let (status, ready) = get(url, "/readyz");
            let n = ready["owned_partitions"].as_u64().unwrap_or(0);
            (status == 200).then_some(n)
        };
        if let (Some(a), Some(b)) = (owned(&url_a), owned(&url_b))
            && a > 0
            && b > 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the two instances did not share the partitions"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    a_session_reads_all_its_writes(&url_a, &url_b, &app);
}
