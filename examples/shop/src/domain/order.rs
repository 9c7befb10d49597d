//! The `order` aggregate: placing an order, adding items, and its lifecycle
//! `placed -> confirmed -> shipped`, with cancellation from `placed` or `confirmed`.

use eventfold::{Aggregate, Context, Reject};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The `CancelOrder` reason of an order cancelled because nobody confirmed it in time
/// (the order flow's expiry): refused (`not_placed`) unless the order is still `placed`.
pub const EXPIRED: &str = "expired";

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

/// Commands addressed to an order.
///
/// Commands come from clients, so unknown fields are refused rather than silently dropped:
/// a misspelt field must not turn into a default value. Serde enforces this for struct
/// variants only; unit variants such as `ConfirmOrder` ignore extra fields, which loses
/// nothing because they carry no data.
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

/// Facts about an order.
///
/// Events are stored forever, so they accept unknown fields: an older reader must still be
/// able to fold an event that a newer release enriched.
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

    /// Whether an order may go from `self` to `to`: the one place the lifecycle is written
    /// down, so the rules cannot drift apart between commands.
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

/// Why an order refuses a command. Each variant has a stable code (see [`Reject`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// `AddItem`, or `CancelOrder` with reason [`EXPIRED`], on an order that is no longer
    /// `placed`.
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
                "items can only be added, and an order expire, while it is placed, but it is {status}"
            ),
            Self::InvalidTransition { from, to } => {
                write!(f, "an order cannot go from {from} to {to}")
            }
        }
    }
}

impl Reject for OrderRejection {
    fn code(&self) -> &'static str {
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

/// The state of one order. `status` is `None` (JSON `null`) until the order is placed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
        // Only checked here; `apply` then trusts the event.
        add_line(self.total_cents, &sku, qty, price_cents)?;
        Ok(vec![OrderEvent::ItemAdded { sku, qty, price_cents }])
    }

    /// Checks that the order may move to `to`; the caller builds the event.
    fn transition(&self, to: OrderStatus) -> Result<(), OrderRejection> {
        let from = self.status.ok_or(OrderRejection::NotFound)?;
        if from.can_become(to) {
            Ok(())
        } else {
            Err(OrderRejection::InvalidTransition { from, to })
        }
    }
}

/// Adds one line to a running total, refusing quantity zero and any overflow: a client can
/// send any `u64`, and a panic in a handler would stop the whole partition.
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
    const TYPE: &'static str = "order";
    type Command = OrderCommand;
    type Event = OrderEvent;
    type Rejection = OrderRejection;
    type Config = ();

    fn handle(&self, command: OrderCommand, _ctx: &Context<'_, ()>) -> Result<Vec<OrderEvent>, OrderRejection> {
        match command {
            OrderCommand::PlaceOrder { customer_id, items } => self.place(customer_id, items),
            OrderCommand::AddItem { sku, qty, price_cents } => self.add_item(sku, qty, price_cents),
            OrderCommand::ConfirmOrder => {
                self.transition(OrderStatus::Confirmed)?;
                Ok(vec![OrderEvent::OrderConfirmed])
            }
            OrderCommand::CancelOrder { reason } => {
                // An expiry only cancels an order nobody confirmed: the order flow's timer
                // may fire while a confirmation is on its way to it.
                if reason == EXPIRED && self.status != Some(OrderStatus::Placed) {
                    return Err(match self.status {
                        None => OrderRejection::NotFound,
                        Some(status) => OrderRejection::NotPlaced { status },
                    });
                }
                self.transition(OrderStatus::Cancelled)?;
                Ok(vec![OrderEvent::OrderCancelled { reason }])
            }
            OrderCommand::ShipOrder => {
                self.transition(OrderStatus::Shipped)?;
                Ok(vec![OrderEvent::OrderShipped])
            }
        }
    }

    fn apply(&mut self, event: &OrderEvent) {
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
                // `handle` refused any overflow before emitting the event, so saturation is
                // unreachable for our own events; it only keeps `apply` infallible.
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
