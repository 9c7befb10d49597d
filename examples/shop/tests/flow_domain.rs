//! The order flow (process manager) through its given/when/then harness: every flow of
//! DESIGN §7 that it runs, refusals included. No runtime involved.

use eventfold::{Expect, ProcessTest};
use shop::domain::flow::{EXPIRY_TIMER, PAYMENT_DECLINED};
use shop::domain::order::EXPIRED;
use shop::domain::{
    FlowConfig, FlowStage, LineItem, Order, OrderCommand, OrderEvent, OrderFlow, Payment, PaymentCommand, PaymentEvent,
};
use std::time::Duration;

const HOUR_MS: i64 = 3_600_000;

fn placed(total_cents: u64) -> OrderEvent {
    OrderEvent::OrderPlaced {
        customer_id: "c-1".into(),
        items: vec![LineItem {
            sku: "sku-1".into(),
            qty: 1,
            price_cents: total_cents,
        }],
        total_cents,
    }
}

fn flow() -> ProcessTest<OrderFlow> {
    ProcessTest::<OrderFlow>::new().at(1_000)
}

#[test]
fn placing_an_order_starts_its_expiry_timer() {
    flow()
        .when::<Order>("o-1", placed(500))
        .then([Expect::schedule(EXPIRY_TIMER, 1_000 + HOUR_MS)])
        .then_timers("o-1", &[(EXPIRY_TIMER, 1_000 + HOUR_MS)])
        .then_state("o-1", |s| {
            assert_eq!(s.stage, Some(FlowStage::Placed));
            assert_eq!(s.total_cents, 500);
        });
}

#[test]
fn the_expiry_is_configurable() {
    ProcessTest::<OrderFlow>::new()
        .with_config(FlowConfig {
            order_expiry: Duration::from_secs(2),
            ..FlowConfig::default()
        })
        .at(10)
        .when::<Order>("o-1", placed(500))
        .then([Expect::schedule(EXPIRY_TIMER, 2_010)]);
}

#[test]
fn payment_on_confirm_asks_for_the_total_with_added_items() {
    flow()
        .given::<Order>(
            "o-1",
            [
                placed(500),
                OrderEvent::ItemAdded {
                    sku: "sku-2".into(),
                    qty: 3,
                    price_cents: 100,
                },
            ],
        )
        .when::<Order>("o-1", OrderEvent::OrderConfirmed)
        .then([
            Expect::cancel(EXPIRY_TIMER),
            Expect::send::<Payment>(
                "pay-o-1",
                PaymentCommand::AuthorizePayment {
                    order_id: "o-1".into(),
                    amount_cents: 800,
                },
            ),
        ])
        .then_timers("o-1", &[]);
}

#[test]
fn with_a_payments_app_the_authorization_goes_there_and_its_payment_events_drive_the_flow() {
    ProcessTest::<OrderFlow>::new()
        .with_config(FlowConfig {
            payments_app: Some("payments".into()),
            ..FlowConfig::default()
        })
        .at(1_000)
        .given::<Order>("o-1", [placed(500)])
        .when::<Order>("o-1", OrderEvent::OrderConfirmed)
        .then([
            Expect::cancel(EXPIRY_TIMER),
            Expect::send_to::<Payment>(
                "payments",
                "pay-o-1",
                PaymentCommand::AuthorizePayment {
                    order_id: "o-1".into(),
                    amount_cents: 500,
                },
            ),
        ])
        .when_accepted("payment", "pay-o-1", 1)
        .then_nothing()
        .when::<Payment>(
            "pay-o-1",
            PaymentEvent::PaymentAuthorized {
                order_id: "o-1".into(),
                amount_cents: 500,
            },
        )
        .then([Expect::send::<Order>("o-1", OrderCommand::ShipOrder)]);
}

#[test]
fn ship_when_paid() {
    flow()
        .given::<Order>("o-1", [placed(500), OrderEvent::OrderConfirmed])
        .when::<Payment>(
            "pay-o-1",
            PaymentEvent::PaymentAuthorized {
                order_id: "o-1".into(),
                amount_cents: 500,
            },
        )
        .then([Expect::send::<Order>("o-1", OrderCommand::ShipOrder)])
        .when_accepted("order", "o-1", 4)
        .then_nothing()
        .when::<Order>("o-1", OrderEvent::OrderShipped)
        .then([Expect::finish()])
        .then_state("o-1", |s| assert_eq!(*s, OrderFlow::default()));
}

#[test]
fn cancel_when_declined() {
    flow()
        .given::<Order>("o-1", [placed(5_000_000), OrderEvent::OrderConfirmed])
        .when::<Payment>(
            "pay-o-1",
            PaymentEvent::PaymentDeclined {
                order_id: "o-1".into(),
                amount_cents: 5_000_000,
                reason: "over the limit".into(),
            },
        )
        .then([Expect::send::<Order>(
            "o-1",
            OrderCommand::CancelOrder {
                reason: PAYMENT_DECLINED.into(),
            },
        )])
        .when::<Order>(
            "o-1",
            OrderEvent::OrderCancelled {
                reason: PAYMENT_DECLINED.into(),
            },
        )
        .then([Expect::finish()]);
}

#[test]
fn an_order_left_placed_expires() {
    flow()
        .given::<Order>("o-1", [placed(500)])
        .when_timer("o-1", EXPIRY_TIMER)
        .then([Expect::send::<Order>(
            "o-1",
            OrderCommand::CancelOrder { reason: EXPIRED.into() },
        )])
        .when::<Order>("o-1", OrderEvent::OrderCancelled { reason: EXPIRED.into() })
        .then([Expect::finish()]);
}

#[test]
fn an_expiry_refused_by_an_order_confirmed_meanwhile_changes_nothing() {
    // The timer fired before the flow read the confirmation; the order refuses the
    // expiry (it is confirmed), and the flow goes on to the payment.
    flow()
        .given::<Order>("o-1", [placed(500)])
        .when_timer("o-1", EXPIRY_TIMER)
        .then([Expect::send::<Order>(
            "o-1",
            OrderCommand::CancelOrder { reason: EXPIRED.into() },
        )])
        .when::<Order>("o-1", OrderEvent::OrderConfirmed)
        .then([
            Expect::cancel(EXPIRY_TIMER),
            Expect::send::<Payment>(
                "pay-o-1",
                PaymentCommand::AuthorizePayment {
                    order_id: "o-1".into(),
                    amount_cents: 500,
                },
            ),
        ])
        .when_refused("order", "o-1", "not_placed")
        .then_nothing()
        .then_state("o-1", |s| assert_eq!(s.stage, Some(FlowStage::AwaitingPayment)));
}

#[test]
fn a_cancelled_or_confirmed_order_does_not_expire() {
    flow()
        .given::<Order>("o-1", [placed(500)])
        .when::<Order>(
            "o-1",
            OrderEvent::OrderCancelled {
                reason: "changed my mind".into(),
            },
        )
        .then([Expect::finish()])
        .then_timers("o-1", &[]);
    flow()
        .given::<Order>("o-2", [placed(500), OrderEvent::OrderConfirmed])
        .then_timers("o-2", &[]);
}

#[test]
fn a_refused_payment_changes_nothing() {
    flow()
        .given::<Order>("o-1", [placed(500), OrderEvent::OrderConfirmed])
        .when_refused("payment", "pay-o-1", "already_authorized")
        .then_nothing()
        .then_state("o-1", |s| assert_eq!(s.stage, Some(FlowStage::AwaitingPayment)));
}

#[test]
fn captures_and_voids_are_not_for_the_flow() {
    flow()
        .when::<Payment>("pay-o-1", PaymentEvent::PaymentCaptured)
        .then_ignored();
}

// The cascading delete (`customer_orders`).

use shop::domain::cascade::CUSTOMER_DELETED;
use shop::domain::{Customer, CustomerEvent, CustomerOrders};

fn cancel_deleted() -> OrderCommand {
    OrderCommand::CancelOrder {
        reason: CUSTOMER_DELETED.into(),
    }
}

#[test]
fn deleting_a_customer_cancels_every_order_it_placed() {
    ProcessTest::<CustomerOrders>::new()
        .given::<Order>("o-1", [placed(100)])
        .given::<Order>("o-2", [placed(200)])
        .when::<Customer>("c-1", CustomerEvent::CustomerDeleted)
        .then([
            Expect::send::<Order>("o-1", cancel_deleted()),
            Expect::send::<Order>("o-2", cancel_deleted()),
        ])
        // An order that had ended refuses: nothing more to do.
        .when_refused("order", "o-2", "invalid_transition")
        .then_nothing();
}

#[test]
fn an_order_placed_after_the_deletion_is_cancelled_when_it_is_read() {
    ProcessTest::<CustomerOrders>::new()
        .given::<Customer>("c-1", [CustomerEvent::CustomerDeleted])
        .when::<Order>("o-9", placed(100))
        .then([Expect::send::<Order>("o-9", cancel_deleted())]);
}

#[test]
fn other_customers_and_other_events_are_left_alone() {
    ProcessTest::<CustomerOrders>::new()
        .given::<Order>("o-1", [placed(100)])
        .when::<Customer>("c-2", CustomerEvent::CustomerDeleted)
        .then_nothing()
        .when::<Order>("o-1", OrderEvent::OrderConfirmed)
        .then_ignored()
        .when::<Customer>("c-1", CustomerEvent::EmailChanged { email: "a@b.c".into() })
        .then_ignored();
}
