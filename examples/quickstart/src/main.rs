//! The service binary: `App` brings the standard flags, the embedded log (default) or
//! Kafka (`--kafka host:port`), the HTTP API and graceful shutdown.

use eventfold::App;
use eventfold::app::{NoFlags, Services};
use quickstart::account::Account;
use quickstart::view::AccountsView;

fn main() -> anyhow::Result<()> {
    App::new(env!("CARGO_PKG_NAME"), |_: &NoFlags, s: &mut Services| {
        s.aggregate::<Account>(()).view::<AccountsView>();
    })
    .about("bank accounts: open, deposit, withdraw; the accounts view")
    .version(env!("CARGO_PKG_VERSION"))
    .run()
}
