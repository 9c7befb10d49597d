//! The `accounts` view: every account with its owner and balance, queryable by either.

use crate::account::{self, Account};
use eventfold::projection::Event;
use eventfold::{Index, Projection, ViewChanges};
use serde_json::json;

/// `accounts`: one row per account, key = account id, `{"owner", "balance_cents"}`.
/// Indexes: `owner` (string: equality, ranges, prefixes) and `balance_cents` (number:
/// equality and ranges), served at `/v1/views/accounts?owner=ann`.
#[derive(Debug, Default)]
pub struct AccountsView;

impl Projection for AccountsView {
    const VIEW: &'static str = "accounts";
    type Source = Account;

    fn indexes(&self) -> Vec<Index> {
        vec![Index::string("owner"), Index::number("balance_cents")]
    }

    fn apply(&self, event: &Event<'_, account::Event>, view: &mut ViewChanges<'_>) {
        let id = event.aggregate_id;
        let balance = |row: &serde_json::Value| row["balance_cents"].as_u64().unwrap_or(0);
        match event.payload {
            account::Event::Opened { owner } => view.upsert(id, json!({"owner": owner, "balance_cents": 0})),
            account::Event::Deposited { amount_cents } => view.update(id, |row| {
                row["balance_cents"] = json!(balance(row).saturating_add(*amount_cents));
            }),
            account::Event::Withdrawn { amount_cents } => view.update(id, |row| {
                row["balance_cents"] = json!(balance(row).saturating_sub(*amount_cents));
            }),
        }
    }
}
