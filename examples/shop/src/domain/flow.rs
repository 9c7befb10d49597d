//! The `order_flow` process manager: what happens to an order after it is placed
//! (DESIGN §7, the shop's flows).
//!
//! - **payment on confirm**: `OrderConfirmed` of `o` sends `AuthorizePayment {order_id: o,
//!   amount_cents: <total>}` to payment `pay-<o>`;
//! - **ship when paid**: `PaymentAuthorized` of `pay-<o>` sends `ShipOrder` to `o`;
//! - **cancel when declined**: `PaymentDeclined` sends `CancelOrder {reason:
//!   "payment_declined"}` to `o`;
//! - **expiry**: an order still `placed` `order_expiry_ms` after `OrderPlaced` gets
//!   `CancelOrder {reason: "expired"}`; the order itself refuses that unless it is still
//!   placed, so a confirmation racing the timer wins.
//!
//! With `FlowConfig::payments_app` the payments are another app's (Kafka mode): the flow
//! reads that app's payment events and sends it the authorizations, through its topics.
//!
//! The flow of an order ends with its terminal event (shipped or cancelled). A refused
//! command (for example an expiry that lost to a confirmation) changes nothing.

use super::order::EXPIRED;
use super::{Order, OrderCommand, OrderEvent, Payment, PaymentCommand, PaymentEvent};
use eventfold::{Actions, EventMeta, Input, ProcessContext, ProcessManager, Subscription};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The prefix of an order's payment id: order `o` is paid by payment `pay-o`.
pub const PAYMENT_PREFIX: &str = "pay-";

/// The `CancelOrder` reason of an order whose payment was declined.
pub const PAYMENT_DECLINED: &str = "payment_declined";

/// The id of the expiry timer.
pub const EXPIRY_TIMER: &str = "expiry";

/// Configuration of the order flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowConfig {
    /// How long an order may stay `placed` before it is cancelled as expired.
    pub order_expiry: Duration,
    /// Kafka mode: the app whose `payment` aggregate authorizes payments (e.g. the
    /// `payments` example service): the flow reads `<app>.payment.events` and sends
    /// `AuthorizePayment` to `<app>.payment.commands`. `None`: this service's own.
    pub payments_app: Option<String>,
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            order_expiry: Duration::from_secs(3600),
            payments_app: None,
        }
    }
}

/// What the order flow reads.
#[derive(Debug, Clone)]
pub enum FlowEvent {
    /// An event of an order.
    Order(OrderEvent),
    /// An event of a payment.
    Payment(PaymentEvent),
}

/// Where an order's flow stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowStage {
    /// Placed: the expiry timer runs.
    Placed,
    /// Confirmed: the payment is being authorized.
    AwaitingPayment,
    /// Paid: the shipment is on its way to the order.
    Shipping,
    /// Declined: the cancellation is on its way to the order.
    Cancelling,
}

/// The state of one order's flow (keyed by order id). The default is "no flow".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderFlow {
    /// `None` before the order is placed (or after its flow ended).
    pub stage: Option<FlowStage>,
    /// The order's total so far, for the payment.
    pub total_cents: u64,
}

impl ProcessManager for OrderFlow {
    const NAME: &'static str = "order_flow";
    type Event = FlowEvent;
    type Config = FlowConfig;

    fn subscriptions(config: &FlowConfig) -> Vec<Subscription<FlowEvent>> {
        let payments = match &config.payments_app {
            Some(app) => Subscription::from_app::<Payment>(app.clone(), FlowEvent::Payment),
            None => Subscription::to::<Payment>(FlowEvent::Payment),
        };
        vec![Subscription::to::<Order>(FlowEvent::Order), payments]
    }

    fn correlate(event: &FlowEvent, meta: &EventMeta<'_>) -> Option<String> {
        match event {
            FlowEvent::Order(_) => Some(meta.aggregate_id.to_owned()),
            FlowEvent::Payment(PaymentEvent::PaymentAuthorized { order_id, .. })
            | FlowEvent::Payment(PaymentEvent::PaymentDeclined { order_id, .. }) => Some(order_id.clone()),
            FlowEvent::Payment(_) => None,
        }
    }

    fn react(&mut self, input: Input<'_, FlowEvent>, ctx: &ProcessContext<'_, FlowConfig>, actions: &mut Actions) {
        let order = ctx.key;
        match input {
            Input::Event { event, .. } => match event {
                FlowEvent::Order(OrderEvent::OrderPlaced { total_cents, .. }) => {
                    self.stage = Some(FlowStage::Placed);
                    self.total_cents = total_cents;
                    actions.schedule_in(ctx, EXPIRY_TIMER, ctx.config.order_expiry);
                }
                FlowEvent::Order(OrderEvent::ItemAdded { qty, price_cents, .. }) => {
                    let line = u64::from(qty).saturating_mul(price_cents);
                    self.total_cents = self.total_cents.saturating_add(line);
                }
                FlowEvent::Order(OrderEvent::OrderConfirmed) => {
                    self.stage = Some(FlowStage::AwaitingPayment);
                    actions.cancel(EXPIRY_TIMER);
                    let payment = format!("{PAYMENT_PREFIX}{order}");
                    let authorize = PaymentCommand::AuthorizePayment {
                        order_id: order.to_owned(),
                        amount_cents: self.total_cents,
                    };
                    match &ctx.config.payments_app {
                        Some(app) => actions.send_to::<Payment>(app.clone(), payment, authorize),
                        None => actions.send::<Payment>(payment, authorize),
                    }
                }
                FlowEvent::Order(OrderEvent::OrderCancelled { .. } | OrderEvent::OrderShipped) => actions.finish(),
                FlowEvent::Payment(PaymentEvent::PaymentAuthorized { .. }) => {
                    self.stage = Some(FlowStage::Shipping);
                    actions.send::<Order>(order, OrderCommand::ShipOrder);
                }
                FlowEvent::Payment(PaymentEvent::PaymentDeclined { .. }) => {
                    self.stage = Some(FlowStage::Cancelling);
                    actions.send::<Order>(
                        order,
                        OrderCommand::CancelOrder {
                            reason: PAYMENT_DECLINED.into(),
                        },
                    );
                }
                FlowEvent::Payment(_) => {}
            },
            Input::Timer { id, .. } if id == EXPIRY_TIMER && self.stage == Some(FlowStage::Placed) => {
                actions.send::<Order>(order, OrderCommand::CancelOrder { reason: EXPIRED.into() });
            }
            // A timer of a flow that moved on, or an outcome: the order's own events tell
            // the flow where it stands, so an accepted command needs nothing here, and a
            // refused one (an expiry that lost to a confirmation, a payment authorized
            // before) has nothing to undo.
            Input::Timer { .. } | Input::Outcome(_) => {}
        }
    }
}
