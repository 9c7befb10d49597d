//! The `payment` aggregate: authorize (or decline above a configured limit), then capture
//! or void.

use eventfold::{Aggregate, Context, Reject};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Static configuration of the payment aggregate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaymentConfig {
    /// Authorizations strictly above this amount are declined. The limit itself is allowed.
    pub decline_above_cents: u64,
}

impl Default for PaymentConfig {
    /// 10,000.00: high enough for normal orders, low enough that a load test can provoke
    /// a decline on purpose.
    fn default() -> Self {
        Self {
            decline_above_cents: 1_000_000,
        }
    }
}

/// Commands addressed to a payment. Unknown fields are refused so a misspelt field cannot
/// silently become a default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum PaymentCommand {
    /// Asks to authorize `amount_cents` for an order.
    AuthorizePayment {
        /// The order this payment is for.
        order_id: String,
        /// The amount in cents; must be above zero.
        amount_cents: u64,
    },
    /// Captures an authorized payment.
    CapturePayment,
    /// Voids an authorized, not yet captured payment.
    VoidPayment,
}

/// Facts about a payment. Events accept unknown fields so an older reader can still fold
/// events a newer release enriched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum PaymentEvent {
    /// The amount was authorized.
    PaymentAuthorized {
        /// The order this payment is for.
        order_id: String,
        /// The authorized amount in cents.
        amount_cents: u64,
    },
    /// The authorization was declined. This is an outcome, not a rejection: the attempt is
    /// recorded so that the order's process can react to it.
    PaymentDeclined {
        /// The order this payment is for.
        order_id: String,
        /// The amount that was asked for, in cents.
        amount_cents: u64,
        /// Why it was declined.
        reason: String,
    },
    /// The authorized amount was captured.
    PaymentCaptured,
    /// The authorization was voided.
    PaymentVoided,
}

/// Where a payment is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Authorized; may be captured or voided.
    Authorized,
    /// Declined; final.
    Declined,
    /// Captured; final.
    Captured,
    /// Voided; final.
    Voided,
}

impl PaymentStatus {
    /// The name used in JSON and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authorized => "authorized",
            Self::Declined => "declined",
            Self::Captured => "captured",
            Self::Voided => "voided",
        }
    }
}

impl fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a payment refuses a command. Each variant has a stable code (see [`Reject`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PaymentRejection {
    /// `AuthorizePayment` on a payment that was already authorized or declined: each
    /// payment is attempted once, a retry uses a new payment id.
    AlreadyAuthorized {
        /// The payment's current status.
        status: PaymentStatus,
    },
    /// `AuthorizePayment` for zero cents.
    InvalidAmount,
    /// Capture or void of a payment that was never authorized.
    NotFound,
    /// A lifecycle move the payment does not allow.
    InvalidTransition {
        /// The payment's current status.
        from: PaymentStatus,
        /// The status the command asked for.
        to: PaymentStatus,
    },
}

impl fmt::Display for PaymentRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyAuthorized { status } => {
                write!(f, "the payment was already submitted for authorization and is {status}")
            }
            Self::InvalidAmount => f.write_str("the amount must be above zero"),
            Self::NotFound => f.write_str("the payment does not exist"),
            Self::InvalidTransition { from, to } => {
                write!(f, "a payment cannot go from {from} to {to}")
            }
        }
    }
}

impl Reject for PaymentRejection {
    fn code(&self) -> &'static str {
        match self {
            Self::AlreadyAuthorized { .. } => "already_authorized",
            Self::InvalidAmount => "invalid_amount",
            Self::NotFound => "payment_not_found",
            Self::InvalidTransition { .. } => "invalid_transition",
        }
    }
}

/// The state of one payment. `status` is `None` (JSON `null`) before authorization.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Payment {
    /// Where the payment is in its lifecycle; `None` before authorization.
    pub status: Option<PaymentStatus>,
    /// The order this payment is for (empty before authorization).
    pub order_id: String,
    /// The amount asked for, in cents.
    pub amount_cents: u64,
    /// Why the payment was declined, if it was.
    pub decline_reason: Option<String>,
}

impl Payment {
    fn authorize(
        &self,
        order_id: String,
        amount_cents: u64,
        config: &PaymentConfig,
    ) -> Result<Vec<PaymentEvent>, PaymentRejection> {
        if let Some(status) = self.status {
            return Err(PaymentRejection::AlreadyAuthorized { status });
        }
        if amount_cents == 0 {
            return Err(PaymentRejection::InvalidAmount);
        }
        let limit = config.decline_above_cents;
        if amount_cents > limit {
            let reason = format!("amount of {amount_cents} cents is above the limit of {limit} cents");
            return Ok(vec![PaymentEvent::PaymentDeclined {
                order_id,
                amount_cents,
                reason,
            }]);
        }
        Ok(vec![PaymentEvent::PaymentAuthorized { order_id, amount_cents }])
    }

    /// Capture and void both leave `authorized` only, so one check covers them; every
    /// other status (declined, captured, voided) is final.
    fn leave_authorized(&self, to: PaymentStatus) -> Result<(), PaymentRejection> {
        match self.status {
            None => Err(PaymentRejection::NotFound),
            Some(PaymentStatus::Authorized) => Ok(()),
            Some(from) => Err(PaymentRejection::InvalidTransition { from, to }),
        }
    }
}

impl Aggregate for Payment {
    const TYPE: &'static str = "payment";
    type Command = PaymentCommand;
    type Event = PaymentEvent;
    type Rejection = PaymentRejection;
    type Config = PaymentConfig;

    fn handle(
        &self,
        command: PaymentCommand,
        ctx: &Context<'_, PaymentConfig>,
    ) -> Result<Vec<PaymentEvent>, PaymentRejection> {
        match command {
            PaymentCommand::AuthorizePayment { order_id, amount_cents } => {
                self.authorize(order_id, amount_cents, ctx.config)
            }
            PaymentCommand::CapturePayment => {
                self.leave_authorized(PaymentStatus::Captured)?;
                Ok(vec![PaymentEvent::PaymentCaptured])
            }
            PaymentCommand::VoidPayment => {
                self.leave_authorized(PaymentStatus::Voided)?;
                Ok(vec![PaymentEvent::PaymentVoided])
            }
        }
    }

    fn apply(&mut self, event: &PaymentEvent) {
        match event {
            PaymentEvent::PaymentAuthorized { order_id, amount_cents } => {
                self.status = Some(PaymentStatus::Authorized);
                self.order_id.clone_from(order_id);
                self.amount_cents = *amount_cents;
            }
            PaymentEvent::PaymentDeclined {
                order_id,
                amount_cents,
                reason,
            } => {
                self.status = Some(PaymentStatus::Declined);
                self.order_id.clone_from(order_id);
                self.amount_cents = *amount_cents;
                self.decline_reason = Some(reason.clone());
            }
            PaymentEvent::PaymentCaptured => self.status = Some(PaymentStatus::Captured),
            PaymentEvent::PaymentVoided => self.status = Some(PaymentStatus::Voided),
        }
    }
}
