//! The shop's views: `orders` (query orders by customer, status, date or total) and
//! `customers` (look customers up by email).
//!
//! Both are pure projections (see `eventfold::Projection`); the runtime keeps them up to
//! date from the `order` and `customer` events and serves them under `/v1/views/...`.
//! With several instances (Kafka mode), `orders` is **partitioned** (each instance holds
//! the orders of the partitions it owns; queries are routed and merged) and `customers`
//! is **replicated** (every instance holds every customer, so `email` stays unique across
//! all of them, and `orders` rows join it as a lookup table).

use crate::domain::{Customer, CustomerEvent, LineItem, Order, OrderEvent, OrderStatus};
use eventfold::core::projection::{Event, Index, Join, Projection, Scope, ViewChanges};
use serde_json::{Value, json};

/// `orders`: one row per order, key = order id:
/// `{customer_id, status, placed_at, total_cents, items, customer_email}` (`placed_at` is
/// the RFC 3339 timestamp of the `OrderPlaced` event). Indexes: `customer_id` and
/// `status` (strings), `placed_at` (timestamp) and `total_cents` (number); every index
/// answers equality and ranges. Partitioned: rows are keyed by the order id, in the
/// order's partition. `customer_email` is joined when a row is read, from the `customers`
/// view (a lookup table every instance holds): the customer's current email, `null` when
/// the customer is unknown or deleted.
#[derive(Debug, Default)]
pub struct OrdersView;

impl Projection for OrdersView {
    const VIEW: &'static str = "orders";
    const SCOPE: Scope = Scope::Partitioned;
    type Source = Order;

    fn indexes(&self) -> Vec<Index> {
        vec![
            Index::string("customer_id"),
            Index::string("status"),
            Index::timestamp("placed_at"),
            Index::number("total_cents"),
        ]
    }

    fn joins(&self) -> Vec<Join> {
        vec![Join::lookup(
            "customer_email",
            "customer_id",
            CustomersView::VIEW,
            "email",
        )]
    }

    fn apply(&self, event: &Event<'_, OrderEvent>, view: &mut ViewChanges<'_>) {
        let id = event.aggregate_id;
        let set_status = |view: &mut ViewChanges<'_>, status: OrderStatus| {
            view.update(id, |row| row["status"] = json!(status));
        };
        match event.payload {
            OrderEvent::OrderPlaced {
                customer_id,
                items,
                total_cents,
            } => view.upsert(
                id,
                json!({
                    "customer_id": customer_id,
                    "status": OrderStatus::Placed,
                    "placed_at": event.timestamp(),
                    "total_cents": total_cents,
                    "items": items,
                }),
            ),
            OrderEvent::ItemAdded { sku, qty, price_cents } => view.update(id, |row| {
                // The aggregate refused any overflow before emitting the event.
                let line = u64::from(*qty).saturating_mul(*price_cents);
                let total = row["total_cents"].as_u64().unwrap_or(0).saturating_add(line);
                row["total_cents"] = json!(total);
                let item = LineItem {
                    sku: sku.clone(),
                    qty: *qty,
                    price_cents: *price_cents,
                };
                match row["items"].as_array_mut() {
                    Some(items) => items.push(json!(item)),
                    None => row["items"] = json!([item]),
                }
            }),
            OrderEvent::OrderConfirmed => set_status(view, OrderStatus::Confirmed),
            OrderEvent::OrderCancelled { .. } => set_status(view, OrderStatus::Cancelled),
            OrderEvent::OrderShipped => set_status(view, OrderStatus::Shipped),
        }
    }
}

/// `customers`: one row per **active** customer, key = customer id:
/// `{name, email, registered_at}`. A deleted customer's row is removed (so its email is
/// free again in the unique `email` index). `email` is a unique index: when two customers
/// hold the same address, the first keeps the index entry and the conflict is counted in
/// `eventfold_view_unique_conflicts_total` (the aggregate cannot see other customers, so
/// the view is where duplicates become visible).
#[derive(Debug, Default)]
pub struct CustomersView;

impl Projection for CustomersView {
    const VIEW: &'static str = "customers";
    type Source = Customer;

    fn indexes(&self) -> Vec<Index> {
        vec![Index::string("email").unique()]
    }

    fn apply(&self, event: &Event<'_, CustomerEvent>, view: &mut ViewChanges<'_>) {
        let id = event.aggregate_id;
        match event.payload {
            CustomerEvent::CustomerRegistered { name, email } => view.upsert(
                id,
                json!({"name": name, "email": email, "registered_at": event.timestamp()}),
            ),
            CustomerEvent::EmailChanged { email } => view.update(id, |row| row["email"] = Value::from(email.as_str())),
            CustomerEvent::CustomerDeleted => view.delete(id),
        }
    }
}
