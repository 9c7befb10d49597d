//! The accounts view, given/when/then: rows and index entries, no runtime.

use eventfold::ProjectionTest;
use quickstart::account::Event;
use quickstart::view::AccountsView;
use serde_json::json;

#[test]
fn the_view_follows_the_balance_and_indexes_owner_and_balance() {
    ProjectionTest::<AccountsView>::new()
        .given(
            "a-1",
            [
                Event::Opened { owner: "ann".into() },
                Event::Deposited { amount_cents: 500 },
            ],
        )
        .given("a-2", [Event::Opened { owner: "bob".into() }])
        .when("a-1", Event::Withdrawn { amount_cents: 200 })
        .then_row("a-1", json!({"owner": "ann", "balance_cents": 300}))
        .then_index("owner", "ann", &["a-1"])
        .then_index("balance_cents", "300", &["a-1"])
        .then_index("balance_cents", "0", &["a-2"])
        .then_no_errors();
}
