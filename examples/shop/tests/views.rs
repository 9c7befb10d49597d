//! Given/when/then tests of the shop's projections through the public harness.

use eventfold::ProjectionTest;
use serde_json::json;
use shop::domain::{CustomerEvent, LineItem, OrderEvent};
use shop::views::{CustomersView, OrdersView};

/// 2024-05-06T00:00:00Z.
const T0: i64 = 1_714_953_600_000;

fn placed(customer: &str, qty: u32, price_cents: u64) -> OrderEvent {
    OrderEvent::OrderPlaced {
        customer_id: customer.into(),
        items: vec![LineItem {
            sku: "apple".into(),
            qty,
            price_cents,
        }],
        total_cents: u64::from(qty) * price_cents,
    }
}

#[test]
fn an_order_read_carries_its_customers_current_email_or_null() {
    let row = |email: serde_json::Value| {
        json!({
            "customer_id": "c1",
            "status": "placed",
            "placed_at": "2024-05-06T00:00:00.000Z",
            "total_cents": 300,
            "items": [{"sku": "apple", "qty": 2, "price_cents": 150}],
            "customer_email": email,
        })
    };
    let t = ProjectionTest::<OrdersView>::new()
        .at(T0)
        .when("o-1", placed("c1", 2, 150));
    // Unknown customer: null.
    let t = t.then_read("o-1", row(json!(null)));
    // Known: the customers view's email, whatever it is when the row is read.
    let t = t
        .with_table_row("customers", "c1", Some(json!({"name": "A", "email": "a@x.test"})))
        .then_read("o-1", row(json!("a@x.test")))
        .with_table_row("customers", "c1", Some(json!({"name": "A", "email": "b@x.test"})))
        .then_read("o-1", row(json!("b@x.test")));
    // Deleted (the customers view removes its row): null again; the stored row never
    // held the email.
    t.with_table_row("customers", "c1", None)
        .then_read("o-1", row(json!(null)))
        .then_row(
            "o-1",
            json!({
                "customer_id": "c1",
                "status": "placed",
                "placed_at": "2024-05-06T00:00:00.000Z",
                "total_cents": 300,
                "items": [{"sku": "apple", "qty": 2, "price_cents": 150}],
            }),
        );
}

#[test]
fn a_placed_order_becomes_a_row_with_its_timestamp() {
    ProjectionTest::<OrdersView>::new()
        .at(T0)
        .when("o-1", placed("c1", 2, 150))
        .then_row(
            "o-1",
            json!({
                "customer_id": "c1",
                "status": "placed",
                "placed_at": "2024-05-06T00:00:00.000Z",
                "total_cents": 300,
                "items": [{"sku": "apple", "qty": 2, "price_cents": 150}],
            }),
        )
        .then_index("customer_id", "c1", &["o-1"])
        .then_index("status", "placed", &["o-1"])
        .then_index("placed_at", "2024-05-06T02:00:00+02:00", &["o-1"])
        .then_index("total_cents", "300", &["o-1"])
        .then_no_errors();
}

#[test]
fn added_items_raise_the_total_and_keep_placed_at() {
    let t = ProjectionTest::<OrdersView>::new()
        .at(T0)
        .given("o-1", [placed("c1", 1, 100)])
        .when(
            "o-1",
            OrderEvent::ItemAdded {
                sku: "pear".into(),
                qty: 3,
                price_cents: 90,
            },
        )
        .then_index("total_cents", "370", &["o-1"])
        .then_index("placed_at", &T0.to_string(), &["o-1"]);
    let row = &t.rows()["o-1"];
    assert_eq!(row["items"].as_array().unwrap().len(), 2);
    assert_eq!(row["items"][1], json!({"sku": "pear", "qty": 3, "price_cents": 90}));
}

#[test]
fn status_follows_the_lifecycle() {
    ProjectionTest::<OrdersView>::new()
        .given("o-1", [placed("c1", 1, 100)])
        .given("o-2", [placed("c1", 1, 100), OrderEvent::OrderConfirmed])
        .given(
            "o-3",
            [
                placed("c2", 1, 100),
                OrderEvent::OrderConfirmed,
                OrderEvent::OrderShipped,
            ],
        )
        .when("o-4", placed("c2", 1, 100))
        .when("o-4", OrderEvent::OrderCancelled { reason: "x".into() })
        .then_index("status", "placed", &["o-1"])
        .then_index("status", "confirmed", &["o-2"])
        .then_index("status", "shipped", &["o-3"])
        .then_index("status", "cancelled", &["o-4"])
        .then_index("customer_id", "c1", &["o-1", "o-2"]);
}

#[test]
fn events_of_an_order_never_placed_change_nothing() {
    let t = ProjectionTest::<OrdersView>::new().when("o-9", OrderEvent::OrderConfirmed);
    assert!(t.rows().is_empty());
}

#[test]
fn customers_are_rows_until_deleted_and_indexed_by_email() {
    ProjectionTest::<CustomersView>::new()
        .at(T0)
        .given(
            "c1",
            [CustomerEvent::CustomerRegistered {
                name: "Ann".into(),
                email: "ann@x.test".into(),
            }],
        )
        .then_row(
            "c1",
            json!({"name": "Ann", "email": "ann@x.test", "registered_at": "2024-05-06T00:00:00.000Z"}),
        )
        .when(
            "c1",
            CustomerEvent::EmailChanged {
                email: "ann@y.test".into(),
            },
        )
        .then_index("email", "ann@y.test", &["c1"])
        .then_index("email", "ann@x.test", &[])
        .when("c1", CustomerEvent::CustomerDeleted)
        .then_no_row("c1")
        .then_index("email", "ann@y.test", &[]);
}

#[test]
fn the_email_index_is_declared_unique() {
    let idx = eventfold::Projection::indexes(&CustomersView);
    assert!(idx.iter().any(|i| i.name == "email" && i.unique), "{idx:?}");
}
