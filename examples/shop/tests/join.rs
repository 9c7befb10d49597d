//! The `orders` view's join (DESIGN §7, enrichment): every row carries its customer's
//! current email, `null` when the customer is unknown or deleted, on both backends and
//! across two Kafka instances; a query with the position of an email change waits for
//! the lookup table too. The shop binary, checked over HTTP.

mod common;

use common::{get, post_with, start};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const ORDERS: usize = 40;

/// Sends `body` to aggregate `ty`/`id` in the session whose last position is `session`
/// (retrying 503 while partitions move); returns the merged position.
fn command(url: &str, ty: &str, id: &str, body: Value, session: &str) -> String {
    let path = format!("/v1/aggregates/{ty}/{id}/commands");
    let deadline = Instant::now() + Duration::from_secs(60);
    let headers: &[(&str, &str)] = if session.is_empty() {
        &[]
    } else {
        &[("X-Session-Position", session)]
    };
    loop {
        let (status, answer) = post_with(url, &path, &body.to_string(), headers);
        if status == 200 {
            return answer["position"].as_str().unwrap().to_owned();
        }
        assert!(
            status == 503 && Instant::now() < deadline,
            "{ty}/{id}: {status} {answer}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `customer_email` of every order row of `customer`, read through `url` once the
/// view has applied `position`.
fn emails(url: &str, customer: &str, position: &str) -> Vec<Value> {
    let (status, body) = get(
        url,
        &format!("/v1/views/orders?customer_id={customer}&limit=1000&min_position={position}"),
    );
    assert_eq!(status, 200, "{body}");
    body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["value"]["customer_email"].clone())
        .collect()
}

fn the_join(write: &str, read: &str) {
    let run = rand::random::<u32>();
    let customer = format!("jc{run}");
    // Orders placed before the customer exists: joined as null.
    let mut last = String::new();
    for i in 0..ORDERS {
        let body = json!({
            "type": "PlaceOrder",
            "customer_id": customer,
            "items": [{"sku": "s", "qty": 1, "price_cents": 100}],
        });
        last = command(write, "order", &format!("j{run}-{i}"), body, &last);
    }
    assert_eq!(emails(read, &customer, &last), vec![Value::Null; ORDERS]);
    // Registered: every row shows the email.
    let email = format!("{customer}@x.test");
    let pos = command(
        write,
        "customer",
        &customer,
        json!({"type": "RegisterCustomer", "name": "J", "email": email}),
        &last,
    );
    assert_eq!(emails(read, &customer, &pos), vec![json!(email); ORDERS]);
    // A key lookup joins too.
    let (status, row) = get(read, &format!("/v1/views/orders/j{run}-0?min_position={pos}"));
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["value"]["customer_email"], json!(email));
    // Changed: every row, at once, with the change's position.
    let changed = format!("new-{customer}@x.test");
    let pos = command(
        write,
        "customer",
        &customer,
        json!({"type": "ChangeEmail", "email": changed}),
        &pos,
    );
    assert_eq!(emails(read, &customer, &pos), vec![json!(changed); ORDERS]);
    // Deleted: null again (the orders stay; the shop's process managers are off here).
    let pos = command(write, "customer", &customer, json!({"type": "DeleteCustomer"}), &pos);
    assert_eq!(emails(read, &customer, &pos), vec![Value::Null; ORDERS]);
}

#[test]
fn orders_carry_their_customers_current_email_on_the_embedded_log() {
    let dir = tempfile::tempdir().unwrap();
    let (_shop, url, _) = start(dir.path(), &["--partitions", "4", "--no-process-managers"]);
    the_join(&url, &url);
}

#[test]
fn orders_carry_their_customers_current_email_across_two_kafka_instances() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("join{}", rand::random::<u32>());
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let flags = |id: &str| {
        [
            "--kafka",
            bootstrap.as_str(),
            "--app-id",
            app.as_str(),
            "--partitions",
            "4",
            "--instance-id",
            id,
            "--no-process-managers",
        ]
        .map(str::to_owned)
    };
    let (fa, fb) = (flags("a"), flags("b"));
    let fa: Vec<&str> = fa.iter().map(String::as_str).collect();
    let fb: Vec<&str> = fb.iter().map(String::as_str).collect();
    let (_a, url_a, _) = start(da.path(), &fa);
    let (_b, url_b, _) = start(db.path(), &fb);
    let deadline = Instant::now() + Duration::from_secs(60);
    while [&url_a, &url_b].iter().any(|u| get(u, "/readyz").0 != 200) {
        assert!(Instant::now() < deadline, "the two instances did not settle");
        std::thread::sleep(Duration::from_millis(200));
    }
    the_join(&url_a, &url_b);
}
