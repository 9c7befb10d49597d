//! The `customer_orders` process manager: cascading delete between the shop's services
//! (DESIGN §7). `CustomerDeleted` of `c` sends `CancelOrder {reason: "customer_deleted"}`
//! to every order `c` placed; an order refuses it unless it is still `placed` or
//! `confirmed`, so shipped and cancelled orders are left as they are.
//!
//! The rule for an order placed while or after the customer is deleted (the order does
//! not know its customer's state, so placing it succeeds): it is cancelled the same way
//! as soon as this process manager reads its `OrderPlaced`, which then finds the customer
//! deleted. Each order is cancelled at most once: the command's id derives from the event
//! that caused it.

use super::{CustomerEvent, Order, OrderCommand, OrderEvent};
use crate::domain::Customer;
use eventfold::{Actions, EventMeta, Input, ProcessContext, ProcessManager, Subscription};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The `CancelOrder` reason of an order whose customer was deleted.
pub const CUSTOMER_DELETED: &str = "customer_deleted";

/// What the cascade reads.
#[derive(Debug, Clone)]
pub enum CascadeEvent {
    /// An event of an order.
    Order(OrderEvent),
    /// An event of a customer.
    Customer(CustomerEvent),
}

/// The state of one customer's cascade (keyed by customer id).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomerOrders {
    /// Orders the customer placed (until the customer is deleted).
    pub orders: BTreeSet<String>,
    /// The customer was deleted: orders placed from now on are cancelled at once.
    pub deleted: bool,
}

fn cancel(actions: &mut Actions, order: &str) {
    actions.send::<Order>(
        order,
        OrderCommand::CancelOrder {
            reason: CUSTOMER_DELETED.into(),
        },
    );
}

impl ProcessManager for CustomerOrders {
    const NAME: &'static str = "customer_orders";
    type Event = CascadeEvent;
    type Config = ();

    fn subscriptions(_: &()) -> Vec<Subscription<CascadeEvent>> {
        vec![
            Subscription::to::<Order>(CascadeEvent::Order),
            Subscription::to::<Customer>(CascadeEvent::Customer),
        ]
    }

    fn correlate(event: &CascadeEvent, meta: &EventMeta<'_>) -> Option<String> {
        match event {
            CascadeEvent::Order(OrderEvent::OrderPlaced { customer_id, .. }) => Some(customer_id.clone()),
            CascadeEvent::Customer(CustomerEvent::CustomerDeleted) => Some(meta.aggregate_id.to_owned()),
            _ => None,
        }
    }

    fn react(&mut self, input: Input<'_, CascadeEvent>, _: &ProcessContext<'_, ()>, actions: &mut Actions) {
        // Outcomes: a refusal means the order had ended already; nothing to do.
        let Input::Event { event, meta } = input else {
            return;
        };
        match event {
            CascadeEvent::Order(OrderEvent::OrderPlaced { .. }) if self.deleted => cancel(actions, meta.aggregate_id),
            CascadeEvent::Order(OrderEvent::OrderPlaced { .. }) => {
                self.orders.insert(meta.aggregate_id.to_owned());
            }
            CascadeEvent::Customer(CustomerEvent::CustomerDeleted) => {
                self.deleted = true;
                for order in std::mem::take(&mut self.orders) {
                    cancel(actions, &order);
                }
            }
            _ => {}
        }
    }
}
