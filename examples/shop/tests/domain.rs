//! Given/when/then tests of the shop aggregates through the public harness: for every
//! rule one accepted and one rejected case, plus state and JSON shape checks.

use eventfold::{AggregateTest, Reject};
use shop::domain::{
    Customer, CustomerCommand, CustomerEvent, CustomerStatus, LineItem, Order, OrderCommand, OrderEvent, OrderStatus,
    Payment, PaymentCommand, PaymentConfig, PaymentEvent, PaymentStatus,
};

fn item(sku: &str, qty: u32, price_cents: u64) -> LineItem {
    LineItem {
        sku: sku.into(),
        qty,
        price_cents,
    }
}

fn place(items: Vec<LineItem>) -> OrderCommand {
    OrderCommand::PlaceOrder {
        customer_id: "c1".into(),
        items,
    }
}

fn placed(items: Vec<LineItem>) -> OrderEvent {
    let total_cents = items.iter().map(|i| u64::from(i.qty) * i.price_cents).sum();
    OrderEvent::OrderPlaced {
        customer_id: "c1".into(),
        items,
        total_cents,
    }
}

fn apples() -> Vec<LineItem> {
    vec![item("apple", 2, 150)]
}

fn add(sku: &str, qty: u32, price_cents: u64) -> OrderCommand {
    OrderCommand::AddItem {
        sku: sku.into(),
        qty,
        price_cents,
    }
}

fn cancel() -> OrderCommand {
    OrderCommand::CancelOrder {
        reason: "changed my mind".into(),
    }
}

fn cancelled() -> OrderEvent {
    OrderEvent::OrderCancelled {
        reason: "changed my mind".into(),
    }
}

/// The events that bring an order into `status`.
fn order_history(status: OrderStatus) -> Vec<OrderEvent> {
    let mut events = vec![placed(apples())];
    match status {
        OrderStatus::Placed => {}
        OrderStatus::Confirmed => events.push(OrderEvent::OrderConfirmed),
        OrderStatus::Cancelled => events.push(cancelled()),
        OrderStatus::Shipped => events.extend([OrderEvent::OrderConfirmed, OrderEvent::OrderShipped]),
    }
    events
}

fn order_in(status: OrderStatus) -> AggregateTest<Order> {
    AggregateTest::<Order>::new().given(order_history(status))
}

// ---- order: PlaceOrder ----

#[test]
fn place_order_emits_total_and_sets_state() {
    AggregateTest::<Order>::new()
        .when(place(vec![item("apple", 2, 150), item("pear", 1, 99)]))
        .then([OrderEvent::OrderPlaced {
            customer_id: "c1".into(),
            items: vec![item("apple", 2, 150), item("pear", 1, 99)],
            total_cents: 399,
        }])
        .then_state(|s| {
            assert_eq!(s.status, Some(OrderStatus::Placed));
            assert_eq!(s.customer_id, "c1");
            assert_eq!(s.items.len(), 2);
            assert_eq!(s.total_cents, 399);
        });
}

#[test]
fn place_order_twice_is_rejected() {
    order_in(OrderStatus::Placed)
        .when(place(apples()))
        .then_rejected("already_placed");
    // Placing again stays refused in every later status too.
    order_in(OrderStatus::Cancelled)
        .when(place(apples()))
        .then_rejected("already_placed");
}

#[test]
fn place_order_without_items_is_rejected() {
    AggregateTest::<Order>::new()
        .when(place(vec![]))
        .then_rejected("no_items");
}

#[test]
fn place_order_with_quantity_one_is_accepted() {
    AggregateTest::<Order>::new()
        .when(place(vec![item("apple", 1, 150)]))
        .then([placed(vec![item("apple", 1, 150)])]);
}

#[test]
fn place_order_with_quantity_zero_is_rejected() {
    let t = AggregateTest::<Order>::new().when(place(vec![item("apple", 2, 150), item("pear", 0, 99)]));
    let Err(rejection) = t.result() else {
        panic!("expected a rejection")
    };
    assert!(
        rejection.to_string().contains("pear"),
        "message names the line: {rejection}"
    );
    t.then_rejected("invalid_quantity");
}

#[test]
fn place_order_with_free_item_is_accepted() {
    // A price of zero is fine; a negative price cannot be decoded at all (see the serde
    // tests below).
    AggregateTest::<Order>::new()
        .when(place(vec![item("sticker", 3, 0)]))
        .then([placed(vec![item("sticker", 3, 0)])])
        .then_state(|s| assert_eq!(s.total_cents, 0));
}

#[test]
fn place_order_with_huge_total_is_rejected_not_panicking() {
    AggregateTest::<Order>::new()
        .when(place(vec![item("gold", 2, u64::MAX)]))
        .then_rejected("total_overflow");
    // Each line fits, their sum does not.
    AggregateTest::<Order>::new()
        .when(place(vec![item("a", 1, u64::MAX), item("b", 1, 1)]))
        .then_rejected("total_overflow");
}

#[test]
fn place_order_with_largest_total_is_accepted() {
    AggregateTest::<Order>::new()
        .when(place(vec![item("a", 1, u64::MAX - 1), item("b", 1, 1)]))
        .then_state(|s| assert_eq!(s.total_cents, u64::MAX));
}

// ---- order: AddItem ----

#[test]
fn add_item_while_placed_updates_total() {
    order_in(OrderStatus::Placed)
        .when(add("pear", 3, 99))
        .then([OrderEvent::ItemAdded {
            sku: "pear".into(),
            qty: 3,
            price_cents: 99,
        }])
        .then_state(|s| {
            assert_eq!(s.total_cents, 300 + 297);
            assert_eq!(s.items, vec![item("apple", 2, 150), item("pear", 3, 99)]);
            assert_eq!(s.status, Some(OrderStatus::Placed));
        });
}

#[test]
fn add_item_to_missing_order_is_rejected() {
    AggregateTest::<Order>::new()
        .when(add("pear", 1, 99))
        .then_rejected("order_not_found");
}

#[test]
fn add_item_after_placed_is_rejected() {
    for status in [OrderStatus::Confirmed, OrderStatus::Cancelled, OrderStatus::Shipped] {
        order_in(status).when(add("pear", 1, 99)).then_rejected("not_placed");
    }
}

#[test]
fn add_item_with_quantity_zero_is_rejected() {
    order_in(OrderStatus::Placed)
        .when(add("pear", 0, 99))
        .then_rejected("invalid_quantity");
}

#[test]
fn add_item_overflowing_total_is_rejected() {
    AggregateTest::<Order>::new()
        .given([placed(vec![item("a", 1, u64::MAX - 10)])])
        .when(add("b", 1, 11))
        .then_rejected("total_overflow")
        .then_state(|s| assert_eq!(s.total_cents, u64::MAX - 10));
    AggregateTest::<Order>::new()
        .given([placed(vec![item("a", 1, u64::MAX - 10)])])
        .when(add("b", 1, 10))
        .then_state(|s| assert_eq!(s.total_cents, u64::MAX));
}

// ---- order: lifecycle ----

#[test]
fn confirm_from_placed_is_accepted() {
    order_in(OrderStatus::Placed)
        .when(OrderCommand::ConfirmOrder)
        .then([OrderEvent::OrderConfirmed])
        .then_state(|s| assert_eq!(s.status, Some(OrderStatus::Confirmed)));
}

#[test]
fn confirm_from_other_status_is_rejected() {
    for status in [OrderStatus::Confirmed, OrderStatus::Cancelled, OrderStatus::Shipped] {
        order_in(status)
            .when(OrderCommand::ConfirmOrder)
            .then_rejected("invalid_transition");
    }
    AggregateTest::<Order>::new()
        .when(OrderCommand::ConfirmOrder)
        .then_rejected("order_not_found");
}

#[test]
fn invalid_transition_message_names_both_statuses() {
    let t = order_in(OrderStatus::Shipped).when(OrderCommand::ConfirmOrder);
    let Err(rejection) = t.result() else {
        panic!("expected a rejection")
    };
    assert_eq!(rejection.code(), "invalid_transition");
    assert_eq!(rejection.to_string(), "an order cannot go from shipped to confirmed");
}

#[test]
fn cancel_from_placed_or_confirmed_is_accepted() {
    for status in [OrderStatus::Placed, OrderStatus::Confirmed] {
        order_in(status)
            .when(cancel())
            .then([cancelled()])
            .then_state(|s| assert_eq!(s.status, Some(OrderStatus::Cancelled)));
    }
}

#[test]
fn cancel_from_final_status_is_rejected() {
    for status in [OrderStatus::Cancelled, OrderStatus::Shipped] {
        order_in(status).when(cancel()).then_rejected("invalid_transition");
    }
    AggregateTest::<Order>::new()
        .when(cancel())
        .then_rejected("order_not_found");
}

#[test]
fn ship_from_confirmed_is_accepted() {
    order_in(OrderStatus::Confirmed)
        .when(OrderCommand::ShipOrder)
        .then([OrderEvent::OrderShipped])
        .then_state(|s| {
            assert_eq!(s.status, Some(OrderStatus::Shipped));
            // Shipping keeps what was ordered.
            assert_eq!(s.total_cents, 300);
        });
}

#[test]
fn ship_from_other_status_is_rejected() {
    for status in [OrderStatus::Placed, OrderStatus::Cancelled, OrderStatus::Shipped] {
        order_in(status)
            .when(OrderCommand::ShipOrder)
            .then_rejected("invalid_transition");
    }
    AggregateTest::<Order>::new()
        .when(OrderCommand::ShipOrder)
        .then_rejected("order_not_found");
}

// ---- order: JSON ----

#[test]
fn readme_place_order_json_decodes() {
    let json = r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"apple","qty":2,"price_cents":150}]}"#;
    let command: OrderCommand = serde_json::from_str(json).expect("README command decodes");
    assert_eq!(command, place(apples()));
}

#[test]
fn unit_command_decodes_from_type_alone() {
    let command: OrderCommand = serde_json::from_str(r#"{"type":"ConfirmOrder"}"#).expect("decodes");
    assert_eq!(command, OrderCommand::ConfirmOrder);
}

#[test]
fn command_with_unknown_field_is_refused() {
    let json = r#"{"type":"PlaceOrder","customer_id":"c1","itmes":[],"items":[]}"#;
    assert!(serde_json::from_str::<OrderCommand>(json).is_err());
    let json = r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"a","qty":1,"price_cents":1,"discount":5}]}"#;
    assert!(serde_json::from_str::<OrderCommand>(json).is_err());
    let json = r#"{"type":"CancelOrder","reason":"x","why":"y"}"#;
    assert!(serde_json::from_str::<OrderCommand>(json).is_err());
    // Unit variants such as `ConfirmOrder` are the exception: serde ignores extra fields
    // next to the tag for them even with `deny_unknown_fields`, and they carry no data a
    // typo could lose.
}

#[test]
fn negative_price_or_quantity_cannot_be_decoded() {
    let json = r#"{"type":"AddItem","sku":"a","qty":1,"price_cents":-1}"#;
    assert!(serde_json::from_str::<OrderCommand>(json).is_err());
    let json = r#"{"type":"AddItem","sku":"a","qty":-1,"price_cents":1}"#;
    assert!(serde_json::from_str::<OrderCommand>(json).is_err());
}

#[test]
fn event_serializes_with_type_first() {
    let json = serde_json::to_string(&placed(apples())).expect("serializes");
    assert_eq!(
        json,
        r#"{"type":"OrderPlaced","customer_id":"c1","items":[{"sku":"apple","qty":2,"price_cents":150}],"total_cents":300}"#
    );
    assert_eq!(
        serde_json::to_string(&OrderEvent::OrderShipped).expect("serializes"),
        r#"{"type":"OrderShipped"}"#
    );
}

#[test]
fn event_round_trips() {
    for event in [placed(apples()), OrderEvent::OrderConfirmed, cancelled()] {
        let json = serde_json::to_string(&event).expect("serializes");
        let back: OrderEvent = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, event);
    }
}

#[test]
fn order_state_json_shape() {
    let empty = serde_json::to_value(Order::default()).expect("serializes");
    assert_eq!(empty["status"], serde_json::Value::Null);

    order_in(OrderStatus::Confirmed)
        .when(add("x", 1, 1))
        .then_rejected("not_placed")
        .then_state(|s| {
            assert_eq!(
                serde_json::to_value(s).expect("serializes"),
                serde_json::json!({
                    "status": "confirmed",
                    "customer_id": "c1",
                    "items": [{"sku": "apple", "qty": 2, "price_cents": 150}],
                    "total_cents": 300,
                })
            );
        });
}

// ---- payment ----

fn authorize(amount_cents: u64) -> PaymentCommand {
    PaymentCommand::AuthorizePayment {
        order_id: "o1".into(),
        amount_cents,
    }
}

fn authorized(amount_cents: u64) -> PaymentEvent {
    PaymentEvent::PaymentAuthorized {
        order_id: "o1".into(),
        amount_cents,
    }
}

fn declined() -> PaymentEvent {
    PaymentEvent::PaymentDeclined {
        order_id: "o1".into(),
        amount_cents: 2_000_000,
        reason: "amount of 2000000 cents is above the limit of 1000000 cents".into(),
    }
}

/// The events that bring a payment into `status`.
fn payment_history(status: PaymentStatus) -> Vec<PaymentEvent> {
    match status {
        PaymentStatus::Authorized => vec![authorized(500)],
        PaymentStatus::Declined => vec![declined()],
        PaymentStatus::Captured => vec![authorized(500), PaymentEvent::PaymentCaptured],
        PaymentStatus::Voided => vec![authorized(500), PaymentEvent::PaymentVoided],
    }
}

fn payment_in(status: PaymentStatus) -> AggregateTest<Payment> {
    AggregateTest::<Payment>::new().given(payment_history(status))
}

#[test]
fn payment_config_default_limit_is_ten_thousand() {
    assert_eq!(PaymentConfig::default().decline_above_cents, 1_000_000);
}

#[test]
fn authorize_within_limit_is_accepted() {
    AggregateTest::<Payment>::new()
        .when(authorize(500))
        .then([authorized(500)])
        .then_state(|s| {
            assert_eq!(s.status, Some(PaymentStatus::Authorized));
            assert_eq!(s.order_id, "o1");
            assert_eq!(s.amount_cents, 500);
        });
    // The limit itself is still authorized.
    AggregateTest::<Payment>::new()
        .when(authorize(1_000_000))
        .then([authorized(1_000_000)]);
}

#[test]
fn authorize_above_limit_is_declined() {
    AggregateTest::<Payment>::new()
        .when(authorize(2_000_000))
        .then([declined()])
        .then_state(|s| {
            assert_eq!(s.status, Some(PaymentStatus::Declined));
            assert!(s.decline_reason.is_some());
        });
    AggregateTest::<Payment>::new()
        .with_config(PaymentConfig {
            decline_above_cents: 100,
        })
        .when(authorize(101))
        .then_state(|s| assert_eq!(s.status, Some(PaymentStatus::Declined)));
    AggregateTest::<Payment>::new()
        .with_config(PaymentConfig {
            decline_above_cents: 100,
        })
        .when(authorize(100))
        .then([authorized(100)]);
}

#[test]
fn authorize_twice_is_rejected() {
    for status in [
        PaymentStatus::Authorized,
        PaymentStatus::Declined,
        PaymentStatus::Captured,
        PaymentStatus::Voided,
    ] {
        payment_in(status)
            .when(authorize(500))
            .then_rejected("already_authorized");
    }
}

#[test]
fn authorize_zero_is_rejected() {
    AggregateTest::<Payment>::new()
        .when(authorize(0))
        .then_rejected("invalid_amount");
    AggregateTest::<Payment>::new().when(authorize(1)).then([authorized(1)]);
}

#[test]
fn capture_authorized_is_accepted() {
    payment_in(PaymentStatus::Authorized)
        .when(PaymentCommand::CapturePayment)
        .then([PaymentEvent::PaymentCaptured])
        .then_state(|s| {
            assert_eq!(s.status, Some(PaymentStatus::Captured));
            assert_eq!(s.amount_cents, 500);
        });
}

#[test]
fn capture_other_than_authorized_is_rejected() {
    for status in [PaymentStatus::Declined, PaymentStatus::Captured, PaymentStatus::Voided] {
        payment_in(status)
            .when(PaymentCommand::CapturePayment)
            .then_rejected("invalid_transition");
    }
    AggregateTest::<Payment>::new()
        .when(PaymentCommand::CapturePayment)
        .then_rejected("payment_not_found");
}

#[test]
fn void_authorized_is_accepted() {
    payment_in(PaymentStatus::Authorized)
        .when(PaymentCommand::VoidPayment)
        .then([PaymentEvent::PaymentVoided])
        .then_state(|s| assert_eq!(s.status, Some(PaymentStatus::Voided)));
}

#[test]
fn void_captured_or_final_is_rejected() {
    for status in [PaymentStatus::Captured, PaymentStatus::Declined, PaymentStatus::Voided] {
        payment_in(status)
            .when(PaymentCommand::VoidPayment)
            .then_rejected("invalid_transition");
    }
    AggregateTest::<Payment>::new()
        .when(PaymentCommand::VoidPayment)
        .then_rejected("payment_not_found");
}

#[test]
fn payment_json_shapes() {
    let command: PaymentCommand =
        serde_json::from_str(r#"{"type":"AuthorizePayment","order_id":"o1","amount_cents":500}"#).expect("decodes");
    assert_eq!(command, authorize(500));
    let json = serde_json::to_string(&authorized(500)).expect("serializes");
    assert_eq!(
        json,
        r#"{"type":"PaymentAuthorized","order_id":"o1","amount_cents":500}"#
    );
    let state = serde_json::to_value(Payment::default()).expect("serializes");
    assert_eq!(state["status"], serde_json::Value::Null);
}

// ---- customer ----

fn register(name: &str, email: &str) -> CustomerCommand {
    CustomerCommand::RegisterCustomer {
        name: name.into(),
        email: email.into(),
    }
}

fn registered() -> CustomerEvent {
    CustomerEvent::CustomerRegistered {
        name: "Ada".into(),
        email: "ada@example.com".into(),
    }
}

fn change_email(email: &str) -> CustomerCommand {
    CustomerCommand::ChangeEmail { email: email.into() }
}

fn active_customer() -> AggregateTest<Customer> {
    AggregateTest::<Customer>::new().given([registered()])
}

fn deleted_customer() -> AggregateTest<Customer> {
    AggregateTest::<Customer>::new().given([registered(), CustomerEvent::CustomerDeleted])
}

#[test]
fn register_is_accepted() {
    AggregateTest::<Customer>::new()
        .when(register("Ada", "ada@example.com"))
        .then([registered()])
        .then_state(|s| {
            assert_eq!(s.status, Some(CustomerStatus::Active));
            assert_eq!(s.name, "Ada");
            assert_eq!(s.email, "ada@example.com");
        });
}

#[test]
fn register_twice_is_rejected() {
    active_customer()
        .when(register("Ada", "ada@example.com"))
        .then_rejected("already_registered");
}

#[test]
fn register_with_invalid_email_is_rejected() {
    for email in ["", "ada", "ada@", "@example.com"] {
        AggregateTest::<Customer>::new()
            .when(register("Ada", email))
            .then_rejected("invalid_email");
    }
}

#[test]
fn register_with_blank_name_is_rejected() {
    for name in ["", "   "] {
        AggregateTest::<Customer>::new()
            .when(register(name, "ada@example.com"))
            .then_rejected("empty_name");
    }
}

#[test]
fn change_email_is_accepted() {
    active_customer()
        .when(change_email("ada@lovelace.org"))
        .then([CustomerEvent::EmailChanged {
            email: "ada@lovelace.org".into(),
        }])
        .then_state(|s| {
            assert_eq!(s.email, "ada@lovelace.org");
            assert_eq!(s.name, "Ada");
        });
}

#[test]
fn change_email_to_invalid_is_rejected() {
    active_customer()
        .when(change_email("not-an-address"))
        .then_rejected("invalid_email")
        .then_state(|s| assert_eq!(s.email, "ada@example.com"));
}

#[test]
fn change_email_of_missing_customer_is_rejected() {
    AggregateTest::<Customer>::new()
        .when(change_email("ada@example.com"))
        .then_rejected("customer_not_found");
}

#[test]
fn delete_is_accepted() {
    active_customer()
        .when(CustomerCommand::DeleteCustomer)
        .then([CustomerEvent::CustomerDeleted])
        .then_state(|s| assert_eq!(s.status, Some(CustomerStatus::Deleted)));
}

#[test]
fn delete_missing_customer_is_rejected() {
    AggregateTest::<Customer>::new()
        .when(CustomerCommand::DeleteCustomer)
        .then_rejected("customer_not_found");
}

#[test]
fn nothing_changes_after_delete() {
    deleted_customer()
        .when(change_email("ada@lovelace.org"))
        .then_rejected("customer_deleted");
    deleted_customer()
        .when(CustomerCommand::DeleteCustomer)
        .then_rejected("customer_deleted");
    deleted_customer()
        .when(register("Ada", "ada@example.com"))
        .then_rejected("customer_deleted");
}

#[test]
fn customer_json_shapes() {
    let command: CustomerCommand = serde_json::from_str(r#"{"type":"ChangeEmail","email":"a@b"}"#).expect("decodes");
    assert_eq!(command, change_email("a@b"));
    assert!(serde_json::from_str::<CustomerCommand>(r#"{"type":"ChangeEmail","email":"a@b","name":"x"}"#).is_err());
    let json = serde_json::to_string(&registered()).expect("serializes");
    assert_eq!(
        json,
        r#"{"type":"CustomerRegistered","name":"Ada","email":"ada@example.com"}"#
    );
}
