//! The shop's registrations and its own flags; [`eventfold::App`] does the rest (the
//! standard flags, embedded or Kafka wiring, HTTP, shutdown, `views rebuild`).

use crate::domain::{Customer, CustomerOrders, FlowConfig, Order, OrderFlow, Payment, PaymentConfig};
use crate::views::{CustomersView, OrdersView};
use eventfold::App;
use eventfold::app::Services;
use std::time::Duration;

/// The shop's own flags, next to the standard ones (each also reads an `EVENTFOLD_*`
/// environment variable).
#[derive(Debug, Clone, clap::Args)]
pub struct ShopFlags {
    /// Payments above this amount (cents) are declined.
    #[arg(long, env = "EVENTFOLD_DECLINE_ABOVE_CENTS", default_value_t = PaymentConfig::default().decline_above_cents)]
    pub decline_above_cents: u64,
    /// Seconds an order may stay `placed` before the order flow cancels it as expired.
    #[arg(long, env = "EVENTFOLD_ORDER_EXPIRY_SECS", default_value_t = 3600)]
    pub order_expiry_secs: u64,
}

/// Registers the shop's aggregates, views and process managers (the order flow: payment
/// on confirm, ship when paid, cancel when declined, expiry; and the cascading delete of
/// a deleted customer's orders; `--no-process-managers` leaves both out).
pub fn register(flags: &ShopFlags, s: &mut Services) {
    s.aggregate::<Order>(())
        .aggregate::<Payment>(PaymentConfig {
            decline_above_cents: flags.decline_above_cents,
        })
        .aggregate::<Customer>(())
        .process_manager::<OrderFlow>(FlowConfig {
            order_expiry: Duration::from_secs(flags.order_expiry_secs),
        })
        .process_manager::<CustomerOrders>(())
        .view::<OrdersView>()
        .view::<CustomersView>();
}

/// The shop service.
pub fn app() -> App<ShopFlags> {
    App::new("shop", register)
        .about("eventfold example service: orders, payments, customers")
        .version(env!("CARGO_PKG_VERSION"))
        .hint(|addr| {
            format!(
                "try:  curl -s -X POST http://{addr}/v1/aggregates/order/o-1/commands -H 'Idempotency-Key: k-1' \\\n        -d '{{\"type\":\"PlaceOrder\",\"customer_id\":\"c1\",\"items\":[{{\"sku\":\"apple\",\"qty\":2,\"price_cents\":150}}]}}'"
            )
        })
}
