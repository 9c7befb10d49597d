//! The `account` aggregate: open it, deposit, withdraw; the balance never goes below zero.

use eventfold::{Aggregate, Context};
use serde::{Deserialize, Serialize};

/// What a client asks of an account, e.g. `{"type": "Deposit", "amount_cents": 500}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum Command {
    /// Opens the account for `owner`.
    Open { owner: String },
    /// Puts `amount_cents` in.
    Deposit { amount_cents: u64 },
    /// Takes `amount_cents` out, at most the balance.
    Withdraw { amount_cents: u64 },
}

/// What happened to an account: the facts `apply` folds into the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    /// The account was opened for `owner`.
    Opened { owner: String },
    /// `amount_cents` were deposited.
    Deposited { amount_cents: u64 },
    /// `amount_cents` were withdrawn.
    Withdrawn { amount_cents: u64 },
}

eventfold::rejections! {
    /// Why an account refuses a command: each variant's code is the `error` of the HTTP
    /// 422 answer, its message the `message`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Rejection {
        /// `Open` of an account that is already open.
        AlreadyOpen = "already_open" => "the account is already open",
        /// `Deposit` or `Withdraw` before `Open`.
        NotOpen = "not_open" => "the account is not open",
        /// An amount of zero, or a deposit that would take the balance past `u64::MAX`.
        InvalidAmount = "invalid_amount" => "the amount must be above zero and keep the balance within u64",
        /// `Withdraw` of more than the balance.
        InsufficientFunds { balance_cents: u64, amount_cents: u64 } = "insufficient_funds"
            => "cannot withdraw {amount_cents} cents, the balance is {balance_cents}",
    }
}

/// The state of one account.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Account {
    /// Who owns the account; `None` until it is opened.
    pub owner: Option<String>,
    /// The balance in cents.
    pub balance_cents: u64,
}

impl Aggregate for Account {
    const TYPE: &'static str = "account";
    type Command = Command;
    type Event = Event;
    type Rejection = Rejection;
    type Config = ();

    fn handle(&self, command: Command, _: &Context<'_, ()>) -> Result<Vec<Event>, Rejection> {
        let balance_cents = self.balance_cents;
        match command {
            Command::Open { .. } if self.owner.is_some() => Err(Rejection::AlreadyOpen),
            Command::Open { owner } => Ok(vec![Event::Opened { owner }]),
            _ if self.owner.is_none() => Err(Rejection::NotOpen),
            Command::Deposit { amount_cents: 0 } | Command::Withdraw { amount_cents: 0 } => {
                Err(Rejection::InvalidAmount)
            }
            Command::Deposit { amount_cents } if balance_cents.checked_add(amount_cents).is_none() => {
                Err(Rejection::InvalidAmount)
            }
            Command::Deposit { amount_cents } => Ok(vec![Event::Deposited { amount_cents }]),
            Command::Withdraw { amount_cents } if amount_cents > balance_cents => Err(Rejection::InsufficientFunds {
                balance_cents,
                amount_cents,
            }),
            Command::Withdraw { amount_cents } => Ok(vec![Event::Withdrawn { amount_cents }]),
        }
    }

    fn apply(&mut self, event: &Event) {
        // `handle` refused overdrafts and overflows, so this arithmetic is exact.
        match event {
            Event::Opened { owner } => self.owner = Some(owner.clone()),
            Event::Deposited { amount_cents } => self.balance_cents += amount_cents,
            Event::Withdrawn { amount_cents } => self.balance_cents -= amount_cents,
        }
    }
}
