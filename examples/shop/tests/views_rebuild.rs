//! `shop views rebuild <view>` as a child process: after a rebuild from the event log the
//! views answer exactly as before; a rebuild is refused while the service runs, and for
//! an unknown view.

mod common;

use common::{get, post, shop, start};
use eventfold::core::Position;
use serde_json::Value;
use std::process::Command;

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

#[test]
fn a_rebuilt_view_answers_the_same_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (shop1, url, _) = start(dir.path(), &["--partitions", "4"]);
    let mut all = Position::default();
    let mut order_events = 0;
    let mut customer_events = 0;
    let mut send = |ty: &str, id: &str, body: String| {
        let (st, b) = post(&url, &format!("/v1/aggregates/{ty}/{id}/commands"), &body, "");
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
    for i in 0..60 {
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
    for i in 0..20 {
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

    let (shop2, url, _) = start(dir.path(), &["--partitions", "4"]);
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
