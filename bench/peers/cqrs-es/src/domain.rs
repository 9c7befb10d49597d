//! The `order` aggregate of eventfold's shop example (`examples/shop/src/domain/order.rs`),
//! ported to cqrs-es: the same commands, events, JSON shapes, rules and rejection codes.
//!
//! The only structural difference is the trait: cqrs-es's `handle` takes `&mut self` and
//! writes events into an [`EventSink`] (which also applies them), where eventfold's returns
//! them. The decision itself is the pure [`Order::decide`], a line-by-line copy of
//! eventfold's `handle`.

use cqrs_es::event_sink::EventSink;
use cqrs_es::{Aggregate, DomainEvent};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One line of an order. Quantities and prices are unsigned so a negative value cannot
/// even be decoded; money is in cents so no rounding ever happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineItem {
    /// Stock keeping unit of the product.
    pub sku: String,
    /// How many units; must be above zero.
    pub qty: u32,
    /// Price of one unit in cents; zero is allowed (a free item).
    pub price_cents: u64,
}

/// Commands addressed to an order (internally tagged: `{"type": "PlaceOrder", ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum OrderCommand {
    /// Creates the order with its first items.
    PlaceOrder {
        /// The customer who places the order.
        customer_id: String,
        /// At least one line.
        items: Vec<LineItem>,
    },
    /// Adds one line while the order is still `placed`.
    AddItem {
        /// Stock keeping unit of the product.
        sku: String,
        /// How many units; must be above zero.
        qty: u32,
        /// Price of one unit in cents.
        price_cents: u64,
    },
    /// Moves the order from `placed` to `confirmed`.
    ConfirmOrder,
    /// Cancels a `placed` or `confirmed` order.
    CancelOrder {
        /// Why the order was cancelled, free text.
        reason: String,
    },
    /// Moves the order from `confirmed` to `shipped`.
    ShipOrder,
}

/// Facts about an order (internally tagged, like eventfold's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum OrderEvent {
    /// The order was placed; `total_cents` is the sum of `qty * price_cents`.
    OrderPlaced {
        /// The customer who placed the order.
        customer_id: String,
        /// The lines as placed.
        items: Vec<LineItem>,
        /// Sum of all lines in cents.
        total_cents: u64,
    },
    /// A line was added to a placed order.
    ItemAdded {
        /// Stock keeping unit of the product.
        sku: String,
        /// How many units.
        qty: u32,
        /// Price of one unit in cents.
        price_cents: u64,
    },
    /// The order was confirmed.
    OrderConfirmed,
    /// The order was cancelled.
    OrderCancelled {
        /// Why the order was cancelled.
        reason: String,
    },
    /// The order was shipped.
    OrderShipped,
}

impl OrderEvent {
    /// The variant name, which is also the `"type"` field of its JSON.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::OrderPlaced { .. } => "OrderPlaced",
            Self::ItemAdded { .. } => "ItemAdded",
            Self::OrderConfirmed => "OrderConfirmed",
            Self::OrderCancelled { .. } => "OrderCancelled",
            Self::OrderShipped => "OrderShipped",
        }
    }
}

impl DomainEvent for OrderEvent {
    fn event_type(&self) -> String {
        self.type_name().to_owned()
    }

    fn event_version(&self) -> String {
        "1".to_owned()
    }
}

/// Where an order is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Placed; items may still be added.
    Placed,
    /// Confirmed; may be shipped or cancelled.
    Confirmed,
    /// Cancelled; final.
    Cancelled,
    /// Shipped; final.
    Shipped,
}

impl OrderStatus {
    /// The name used in JSON and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Placed => "placed",
            Self::Confirmed => "confirmed",
            Self::Cancelled => "cancelled",
            Self::Shipped => "shipped",
        }
    }

    /// Whether an order may go from `self` to `to`.
    fn can_become(self, to: Self) -> bool {
        use OrderStatus::{Cancelled, Confirmed, Placed, Shipped};
        matches!(
            (self, to),
            (Placed, Confirmed) | (Placed, Cancelled) | (Confirmed, Cancelled) | (Confirmed, Shipped)
        )
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an order refuses a command; [`OrderRejection::code`] is the stable error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderRejection {
    /// `PlaceOrder` on an order that exists already.
    AlreadyPlaced,
    /// `PlaceOrder` without any line.
    NoItems,
    /// A line with quantity zero.
    InvalidQuantity {
        /// The offending line's sku.
        sku: String,
    },
    /// The order total would not fit in a `u64` of cents.
    TotalOverflow,
    /// A command other than `PlaceOrder` on an order that was never placed.
    NotFound,
    /// `AddItem` on an order that is no longer `placed`.
    NotPlaced {
        /// The order's current status.
        status: OrderStatus,
    },
    /// A lifecycle move the order does not allow.
    InvalidTransition {
        /// The order's current status.
        from: OrderStatus,
        /// The status the command asked for.
        to: OrderStatus,
    },
}

impl OrderRejection {
    /// The stable code sent as `error` in the 422 body (the same as eventfold's).
    pub fn code(&self) -> &'static str {
        match self {
            Self::AlreadyPlaced => "already_placed",
            Self::NoItems => "no_items",
            Self::InvalidQuantity { .. } => "invalid_quantity",
            Self::TotalOverflow => "total_overflow",
            Self::NotFound => "order_not_found",
            Self::NotPlaced { .. } => "not_placed",
            Self::InvalidTransition { .. } => "invalid_transition",
        }
    }
}

impl fmt::Display for OrderRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyPlaced => f.write_str("the order has already been placed"),
            Self::NoItems => f.write_str("an order needs at least one item"),
            Self::InvalidQuantity { sku } => {
                write!(f, "the quantity of item {sku:?} must be above zero")
            }
            Self::TotalOverflow => f.write_str("the order total is too large"),
            Self::NotFound => f.write_str("the order does not exist"),
            Self::NotPlaced { status } => write!(
                f,
                "items can only be added while the order is placed, but it is {status}"
            ),
            Self::InvalidTransition { from, to } => {
                write!(f, "an order cannot go from {from} to {to}")
            }
        }
    }
}

impl std::error::Error for OrderRejection {}

/// The state of one order. `status` is `None` (JSON `null`) until the order is placed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Where the order is in its lifecycle; `None` before it is placed.
    pub status: Option<OrderStatus>,
    /// The customer who placed the order (empty before it is placed).
    pub customer_id: String,
    /// All lines, in the order they were placed or added.
    pub items: Vec<LineItem>,
    /// Sum of `qty * price_cents` over all lines.
    pub total_cents: u64,
}

impl Order {
    /// Decides a command against the current state: eventfold's `Order::handle`.
    pub fn decide(&self, command: OrderCommand) -> Result<Vec<OrderEvent>, OrderRejection> {
        match command {
            OrderCommand::PlaceOrder { customer_id, items } => self.place(customer_id, items),
            OrderCommand::AddItem { sku, qty, price_cents } => self.add_item(sku, qty, price_cents),
            OrderCommand::ConfirmOrder => {
                self.transition(OrderStatus::Confirmed)?;
                Ok(vec![OrderEvent::OrderConfirmed])
            }
            OrderCommand::CancelOrder { reason } => {
                self.transition(OrderStatus::Cancelled)?;
                Ok(vec![OrderEvent::OrderCancelled { reason }])
            }
            OrderCommand::ShipOrder => {
                self.transition(OrderStatus::Shipped)?;
                Ok(vec![OrderEvent::OrderShipped])
            }
        }
    }

    fn place(&self, customer_id: String, items: Vec<LineItem>) -> Result<Vec<OrderEvent>, OrderRejection> {
        if self.status.is_some() {
            return Err(OrderRejection::AlreadyPlaced);
        }
        if items.is_empty() {
            return Err(OrderRejection::NoItems);
        }
        let mut total_cents: u64 = 0;
        for item in &items {
            total_cents = add_line(total_cents, &item.sku, item.qty, item.price_cents)?;
        }
        Ok(vec![OrderEvent::OrderPlaced {
            customer_id,
            items,
            total_cents,
        }])
    }

    fn add_item(&self, sku: String, qty: u32, price_cents: u64) -> Result<Vec<OrderEvent>, OrderRejection> {
        match self.status {
            None => return Err(OrderRejection::NotFound),
            Some(OrderStatus::Placed) => {}
            Some(status) => return Err(OrderRejection::NotPlaced { status }),
        }
        add_line(self.total_cents, &sku, qty, price_cents)?;
        Ok(vec![OrderEvent::ItemAdded { sku, qty, price_cents }])
    }

    fn transition(&self, to: OrderStatus) -> Result<(), OrderRejection> {
        let from = self.status.ok_or(OrderRejection::NotFound)?;
        if from.can_become(to) {
            Ok(())
        } else {
            Err(OrderRejection::InvalidTransition { from, to })
        }
    }

    /// Folds one event into the state: eventfold's `Order::apply`.
    fn fold(&mut self, event: &OrderEvent) {
        match event {
            OrderEvent::OrderPlaced {
                customer_id,
                items,
                total_cents,
            } => {
                self.status = Some(OrderStatus::Placed);
                self.customer_id.clone_from(customer_id);
                self.items.clone_from(items);
                self.total_cents = *total_cents;
            }
            OrderEvent::ItemAdded { sku, qty, price_cents } => {
                let line = u64::from(*qty).saturating_mul(*price_cents);
                self.total_cents = self.total_cents.saturating_add(line);
                self.items.push(LineItem {
                    sku: sku.clone(),
                    qty: *qty,
                    price_cents: *price_cents,
                });
            }
            OrderEvent::OrderConfirmed => self.status = Some(OrderStatus::Confirmed),
            OrderEvent::OrderCancelled { .. } => self.status = Some(OrderStatus::Cancelled),
            OrderEvent::OrderShipped => self.status = Some(OrderStatus::Shipped),
        }
    }
}

/// Adds one line to a running total, refusing quantity zero and any overflow.
fn add_line(total_cents: u64, sku: &str, qty: u32, price_cents: u64) -> Result<u64, OrderRejection> {
    if qty == 0 {
        return Err(OrderRejection::InvalidQuantity { sku: sku.to_owned() });
    }
    u64::from(qty)
        .checked_mul(price_cents)
        .and_then(|line| total_cents.checked_add(line))
        .ok_or(OrderRejection::TotalOverflow)
}

impl Aggregate for Order {
    // The `aggregate_type` column of the postgres-es `events` table.
    const TYPE: &'static str = "order";
    type Command = OrderCommand;
    type Event = OrderEvent;
    type Error = OrderRejection;
    type Services = ();

    async fn handle(
        &mut self,
        command: OrderCommand,
        _services: &(),
        sink: &EventSink<Self>,
    ) -> Result<(), OrderRejection> {
        for event in self.decide(command)? {
            sink.write(event, self).await;
        }
        Ok(())
    }

    fn apply(&mut self, event: OrderEvent) {
        self.fold(&event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cqrs_es::test::TestFramework;

    type Fw = TestFramework<Order>;

    fn item(sku: &str, qty: u32, price_cents: u64) -> LineItem {
        LineItem {
            sku: sku.to_owned(),
            qty,
            price_cents,
        }
    }

    fn placed() -> OrderEvent {
        OrderEvent::OrderPlaced {
            customer_id: "c1".to_owned(),
            items: vec![item("a", 2, 150)],
            total_cents: 300,
        }
    }

    fn place(items: Vec<LineItem>) -> OrderCommand {
        OrderCommand::PlaceOrder {
            customer_id: "c1".to_owned(),
            items,
        }
    }

    fn add(sku: &str, qty: u32, price_cents: u64) -> OrderCommand {
        OrderCommand::AddItem {
            sku: sku.to_owned(),
            qty,
            price_cents,
        }
    }

    fn cancel() -> OrderCommand {
        OrderCommand::CancelOrder {
            reason: "changed my mind".to_owned(),
        }
    }

    fn cancelled() -> OrderEvent {
        OrderEvent::OrderCancelled {
            reason: "changed my mind".to_owned(),
        }
    }

    // --- PlaceOrder ---

    #[test]
    fn place_order_emits_order_placed_with_total() {
        Fw::with(())
            .given_no_previous_events()
            .when(place(vec![item("a", 2, 150), item("b", 1, 0)]))
            .then_expect_events(vec![OrderEvent::OrderPlaced {
                customer_id: "c1".to_owned(),
                items: vec![item("a", 2, 150), item("b", 1, 0)],
                total_cents: 300,
            }]);
    }

    #[test]
    fn place_order_twice_is_already_placed() {
        Fw::with(())
            .given(vec![placed()])
            .when(place(vec![item("a", 1, 1)]))
            .then_expect_error(OrderRejection::AlreadyPlaced);
    }

    #[test]
    fn place_order_after_cancel_is_still_already_placed() {
        Fw::with(())
            .given(vec![placed(), cancelled()])
            .when(place(vec![item("a", 1, 1)]))
            .then_expect_error(OrderRejection::AlreadyPlaced);
    }

    #[test]
    fn place_order_without_items_is_no_items() {
        Fw::with(())
            .given_no_previous_events()
            .when(place(vec![]))
            .then_expect_error(OrderRejection::NoItems);
    }

    #[test]
    fn place_order_with_zero_quantity_is_invalid_quantity() {
        Fw::with(())
            .given_no_previous_events()
            .when(place(vec![item("a", 1, 1), item("b", 0, 1)]))
            .then_expect_error(OrderRejection::InvalidQuantity { sku: "b".to_owned() });
    }

    #[test]
    fn place_order_overflowing_total_is_total_overflow() {
        Fw::with(())
            .given_no_previous_events()
            .when(place(vec![item("a", 2, u64::MAX)]))
            .then_expect_error(OrderRejection::TotalOverflow);
        Fw::with(())
            .given_no_previous_events()
            .when(place(vec![item("a", 1, u64::MAX), item("b", 1, 1)]))
            .then_expect_error(OrderRejection::TotalOverflow);
    }

    // --- AddItem ---

    #[test]
    fn add_item_to_placed_order_emits_item_added() {
        Fw::with(())
            .given(vec![placed()])
            .when(add("b", 3, 10))
            .then_expect_events(vec![OrderEvent::ItemAdded {
                sku: "b".to_owned(),
                qty: 3,
                price_cents: 10,
            }]);
    }

    #[test]
    fn add_item_to_missing_order_is_not_found() {
        Fw::with(())
            .given_no_previous_events()
            .when(add("b", 1, 1))
            .then_expect_error(OrderRejection::NotFound);
    }

    #[test]
    fn add_item_after_confirm_is_not_placed() {
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed])
            .when(add("b", 1, 1))
            .then_expect_error(OrderRejection::NotPlaced {
                status: OrderStatus::Confirmed,
            });
        Fw::with(())
            .given(vec![placed(), cancelled()])
            .when(add("b", 1, 1))
            .then_expect_error(OrderRejection::NotPlaced {
                status: OrderStatus::Cancelled,
            });
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed, OrderEvent::OrderShipped])
            .when(add("b", 1, 1))
            .then_expect_error(OrderRejection::NotPlaced {
                status: OrderStatus::Shipped,
            });
    }

    #[test]
    fn add_item_with_zero_quantity_is_invalid_quantity() {
        Fw::with(())
            .given(vec![placed()])
            .when(add("b", 0, 1))
            .then_expect_error(OrderRejection::InvalidQuantity { sku: "b".to_owned() });
    }

    #[test]
    fn add_item_overflowing_total_is_total_overflow() {
        Fw::with(())
            .given(vec![placed()])
            .when(add("b", 1, u64::MAX - 299))
            .then_expect_error(OrderRejection::TotalOverflow);
        // Exactly reaching u64::MAX is still accepted.
        Fw::with(())
            .given(vec![placed()])
            .when(add("b", 1, u64::MAX - 300))
            .then_expect_events(vec![OrderEvent::ItemAdded {
                sku: "b".to_owned(),
                qty: 1,
                price_cents: u64::MAX - 300,
            }]);
    }

    // --- ConfirmOrder ---

    #[test]
    fn confirm_placed_order_emits_order_confirmed() {
        Fw::with(())
            .given(vec![placed()])
            .when(OrderCommand::ConfirmOrder)
            .then_expect_events(vec![OrderEvent::OrderConfirmed]);
    }

    #[test]
    fn confirm_missing_order_is_not_found() {
        Fw::with(())
            .given_no_previous_events()
            .when(OrderCommand::ConfirmOrder)
            .then_expect_error(OrderRejection::NotFound);
    }

    #[test]
    fn confirm_twice_is_invalid_transition() {
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed])
            .when(OrderCommand::ConfirmOrder)
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Confirmed,
                to: OrderStatus::Confirmed,
            });
        Fw::with(())
            .given(vec![placed(), cancelled()])
            .when(OrderCommand::ConfirmOrder)
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Cancelled,
                to: OrderStatus::Confirmed,
            });
    }

    // --- CancelOrder ---

    #[test]
    fn cancel_placed_or_confirmed_order_emits_order_cancelled() {
        Fw::with(())
            .given(vec![placed()])
            .when(cancel())
            .then_expect_events(vec![cancelled()]);
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed])
            .when(cancel())
            .then_expect_events(vec![cancelled()]);
    }

    #[test]
    fn cancel_missing_order_is_not_found() {
        Fw::with(())
            .given_no_previous_events()
            .when(cancel())
            .then_expect_error(OrderRejection::NotFound);
    }

    #[test]
    fn cancel_shipped_or_cancelled_order_is_invalid_transition() {
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed, OrderEvent::OrderShipped])
            .when(cancel())
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Shipped,
                to: OrderStatus::Cancelled,
            });
        Fw::with(())
            .given(vec![placed(), cancelled()])
            .when(cancel())
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Cancelled,
                to: OrderStatus::Cancelled,
            });
    }

    // --- ShipOrder ---

    #[test]
    fn ship_confirmed_order_emits_order_shipped() {
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed])
            .when(OrderCommand::ShipOrder)
            .then_expect_events(vec![OrderEvent::OrderShipped]);
    }

    #[test]
    fn ship_missing_order_is_not_found() {
        Fw::with(())
            .given_no_previous_events()
            .when(OrderCommand::ShipOrder)
            .then_expect_error(OrderRejection::NotFound);
    }

    #[test]
    fn ship_unconfirmed_order_is_invalid_transition() {
        Fw::with(())
            .given(vec![placed()])
            .when(OrderCommand::ShipOrder)
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Placed,
                to: OrderStatus::Shipped,
            });
        Fw::with(())
            .given(vec![placed(), OrderEvent::OrderConfirmed, OrderEvent::OrderShipped])
            .when(OrderCommand::ShipOrder)
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Shipped,
                to: OrderStatus::Shipped,
            });
        Fw::with(())
            .given(vec![placed(), cancelled()])
            .when(OrderCommand::ShipOrder)
            .then_expect_error(OrderRejection::InvalidTransition {
                from: OrderStatus::Cancelled,
                to: OrderStatus::Shipped,
            });
    }

    // --- State and wire format ---

    #[test]
    fn apply_folds_the_lifecycle() {
        let mut order = Order::default();
        order.apply(placed());
        order.apply(OrderEvent::ItemAdded {
            sku: "b".to_owned(),
            qty: 2,
            price_cents: 5,
        });
        assert_eq!(order.status, Some(OrderStatus::Placed));
        assert_eq!(order.total_cents, 310);
        assert_eq!(order.items.len(), 2);
        order.apply(OrderEvent::OrderConfirmed);
        assert_eq!(order.status, Some(OrderStatus::Confirmed));
        order.apply(OrderEvent::OrderShipped);
        assert_eq!(order.status, Some(OrderStatus::Shipped));
        assert_eq!(
            serde_json::to_value(&order).unwrap(),
            serde_json::json!({
                "status": "shipped",
                "customer_id": "c1",
                "items": [{"sku": "a", "qty": 2, "price_cents": 150},
                          {"sku": "b", "qty": 2, "price_cents": 5}],
                "total_cents": 310
            })
        );
    }

    #[test]
    fn json_shapes_match_eventfold() {
        let cmd: OrderCommand = serde_json::from_str(
            r#"{"type":"PlaceOrder","customer_id":"c0","items":[{"sku":"sku-1","qty":1,"price_cents":100}]}"#,
        )
        .unwrap();
        assert_eq!(cmd, place_for("c0"));
        assert_eq!(
            serde_json::to_value(OrderEvent::OrderConfirmed).unwrap(),
            serde_json::json!({"type": "OrderConfirmed"})
        );
        assert_eq!(
            serde_json::to_value(Order::default()).unwrap(),
            serde_json::json!({"status": null, "customer_id": "", "items": [], "total_cents": 0})
        );
        // Struct variants refuse unknown fields, as eventfold's do.
        assert!(serde_json::from_str::<OrderCommand>(r#"{"type":"CancelOrder","reason":"x","oops":1}"#).is_err());
    }

    fn place_for(customer: &str) -> OrderCommand {
        OrderCommand::PlaceOrder {
            customer_id: customer.to_owned(),
            items: vec![item("sku-1", 1, 100)],
        }
    }

    #[test]
    fn rejection_codes_match_eventfold() {
        let cases = [
            (OrderRejection::AlreadyPlaced, "already_placed"),
            (OrderRejection::NoItems, "no_items"),
            (OrderRejection::InvalidQuantity { sku: "x".into() }, "invalid_quantity"),
            (OrderRejection::TotalOverflow, "total_overflow"),
            (OrderRejection::NotFound, "order_not_found"),
            (
                OrderRejection::NotPlaced {
                    status: OrderStatus::Shipped,
                },
                "not_placed",
            ),
            (
                OrderRejection::InvalidTransition {
                    from: OrderStatus::Placed,
                    to: OrderStatus::Shipped,
                },
                "invalid_transition",
            ),
        ];
        for (rejection, code) in cases {
            assert_eq!(rejection.code(), code);
        }
        assert_eq!(
            OrderRejection::InvalidTransition {
                from: OrderStatus::Placed,
                to: OrderStatus::Shipped
            }
            .to_string(),
            "an order cannot go from placed to shipped"
        );
    }
}
