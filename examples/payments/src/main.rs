//! `payments`: the shop's `payment` aggregate deployed as a service of its own, on its own
//! app id (`payments` by default), so that two separately deployed eventfold services
//! cooperate through the broker: the shop started with `--payments-app payments` has its
//! order flow read `payments.payment.events` and send `AuthorizePayment` to
//! `payments.payment.commands` (Kafka mode; both with the same `--partitions`).
//!
//! The payment domain is the shop crate's (`shop::domain::payment`): code shared by the
//! two services, as a contract crate would be.

use eventfold::App;
use eventfold::app::Services;
use shop::domain::{Payment, PaymentConfig};

/// The service's own flag, next to the standard ones.
#[derive(Debug, Clone, clap::Args)]
struct Flags {
    /// Payments above this amount (cents) are declined.
    #[arg(long, env = "EVENTFOLD_DECLINE_ABOVE_CENTS", default_value_t = PaymentConfig::default().decline_above_cents)]
    decline_above_cents: u64,
}

fn main() -> anyhow::Result<()> {
    App::new("payments", |flags: &Flags, s: &mut Services| {
        s.aggregate::<Payment>(PaymentConfig {
            decline_above_cents: flags.decline_above_cents,
        });
    })
    .about("eventfold example service: payments, reached by the shop's order flow across apps")
    .version(env!("CARGO_PKG_VERSION"))
    .run()
}
