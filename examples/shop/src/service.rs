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
    /// Kafka mode: authorize payments in this other app's `payment` aggregate (for example
    /// the `payments` example service, started with the same --partitions and
    /// --kafka) instead of the shop's own: the order flow reads `<app>.payment.events`
    /// and sends to `<app>.payment.commands`, and the shop runs no `payment` aggregate.
    #[arg(long, env = "EVENTFOLD_PAYMENTS_APP", value_name = "APP_ID")]
    pub payments_app: Option<String>,
}

/// Registers the shop's aggregates, views and process managers (the order flow: payment
/// on confirm, ship when paid, cancel when declined, expiry; and the cascading delete of
/// a deleted customer's orders; `--no-process-managers` leaves both out).
pub fn register(flags: &ShopFlags, s: &mut Services) {
    s.aggregate::<Order>(());
    if flags.payments_app.is_none() {
        s.aggregate::<Payment>(PaymentConfig {
            decline_above_cents: flags.decline_above_cents,
        });
    }
    s.aggregate::<Customer>(())
        .process_manager::<OrderFlow>(FlowConfig {
            order_expiry: Duration::from_secs(flags.order_expiry_secs),
            payments_app: flags.payments_app.clone(),
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
