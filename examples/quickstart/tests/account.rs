//! The account's rules, given/when/then: no runtime, no I/O.

use eventfold::AggregateTest;
use quickstart::account::{Account, Command, Event};

fn opened() -> Event {
    Event::Opened { owner: "ann".into() }
}

#[test]
fn an_account_opens_once() {
    AggregateTest::<Account>::new()
        .when(Command::Open { owner: "ann".into() })
        .then([opened()])
        .then_state(|s| assert_eq!(s.owner.as_deref(), Some("ann")));
    AggregateTest::<Account>::new()
        .given([opened()])
        .when(Command::Open { owner: "bob".into() })
        .then_rejected("already_open");
}

#[test]
fn deposits_and_withdrawals_move_the_balance() {
    AggregateTest::<Account>::new()
        .given([opened(), Event::Deposited { amount_cents: 500 }])
        .when(Command::Withdraw { amount_cents: 200 })
        .then([Event::Withdrawn { amount_cents: 200 }])
        .then_state(|s| assert_eq!(s.balance_cents, 300));
}

#[test]
fn a_withdrawal_beyond_the_balance_is_rejected() {
    AggregateTest::<Account>::new()
        .given([opened(), Event::Deposited { amount_cents: 500 }])
        .when(Command::Withdraw { amount_cents: 501 })
        .then_rejected("insufficient_funds")
        .then_state(|s| assert_eq!(s.balance_cents, 500));
}

#[test]
fn money_moves_only_in_an_open_account_and_in_amounts_above_zero() {
    AggregateTest::<Account>::new()
        .when(Command::Deposit { amount_cents: 100 })
        .then_rejected("not_open");
    AggregateTest::<Account>::new()
        .given([opened()])
        .when(Command::Deposit { amount_cents: 0 })
        .then_rejected("invalid_amount");
    AggregateTest::<Account>::new()
        .given([opened(), Event::Deposited { amount_cents: u64::MAX }])
        .when(Command::Deposit { amount_cents: 1 })
        .then_rejected("invalid_amount");
}
