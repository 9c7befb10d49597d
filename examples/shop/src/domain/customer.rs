//! The `customer` aggregate: register once, change the email, delete for good.

use eventfold::{Aggregate, Context, Reject};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Commands addressed to a customer. Unknown fields are refused so a misspelt field cannot
/// silently become a default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum CustomerCommand {
    /// Registers the customer.
    RegisterCustomer {
        /// Display name; must not be blank.
        name: String,
        /// Email address; must look like `local@domain`.
        email: String,
    },
    /// Changes the email address of a registered customer.
    ChangeEmail {
        /// The new address; must look like `local@domain`.
        email: String,
    },
    /// Deletes the customer; nothing can change afterwards.
    DeleteCustomer,
}

/// Facts about a customer. Events accept unknown fields so an older reader can still fold
/// events a newer release enriched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum CustomerEvent {
    /// The customer was registered.
    CustomerRegistered {
        /// Display name.
        name: String,
        /// Email address.
        email: String,
    },
    /// The email address changed.
    EmailChanged {
        /// The new address.
        email: String,
    },
    /// The customer was deleted.
    CustomerDeleted,
}

/// Whether a customer is active or deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CustomerStatus {
    /// Registered and not deleted.
    Active,
    /// Deleted; final.
    Deleted,
}

/// Why a customer refuses a command. Each variant has a stable code (see [`Reject`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CustomerRejection {
    /// `RegisterCustomer` on a customer that exists already.
    AlreadyRegistered,
    /// The name is empty or only whitespace.
    EmptyName,
    /// The email has no `@` with something on both sides.
    InvalidEmail {
        /// The refused address.
        email: String,
    },
    /// A command other than `RegisterCustomer` on a customer that was never registered.
    NotFound,
    /// Any command on a deleted customer.
    Deleted,
}

impl fmt::Display for CustomerRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyRegistered => f.write_str("the customer is already registered"),
            Self::EmptyName => f.write_str("the name must not be empty"),
            Self::InvalidEmail { email } => write!(f, "{email:?} is not a valid email address"),
            Self::NotFound => f.write_str("the customer does not exist"),
            Self::Deleted => f.write_str("the customer was deleted and cannot change"),
        }
    }
}

impl Reject for CustomerRejection {
    fn code(&self) -> &'static str {
        match self {
            Self::AlreadyRegistered => "already_registered",
            Self::EmptyName => "empty_name",
            Self::InvalidEmail { .. } => "invalid_email",
            Self::NotFound => "customer_not_found",
            Self::Deleted => "customer_deleted",
        }
    }
}

/// The state of one customer. `status` is `None` (JSON `null`) before registration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Customer {
    /// `None` before registration.
    pub status: Option<CustomerStatus>,
    /// Display name (empty before registration).
    pub name: String,
    /// Current email address (empty before registration).
    pub email: String,
}

/// A deliberately loose check: real validation means sending a mail, so this only catches
/// values that are plainly not an address (no `@`, or nothing before or after it).
fn check_email(email: &str) -> Result<(), CustomerRejection> {
    match email.split_once('@') {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => Ok(()),
        _ => Err(CustomerRejection::InvalidEmail {
            email: email.to_owned(),
        }),
    }
}

impl Customer {
    /// Lets a command through only for an active customer; deletion is checked first
    /// because it is final and explains every later refusal.
    fn require_active(&self) -> Result<(), CustomerRejection> {
        match self.status {
            None => Err(CustomerRejection::NotFound),
            Some(CustomerStatus::Deleted) => Err(CustomerRejection::Deleted),
            Some(CustomerStatus::Active) => Ok(()),
        }
    }

    fn register(&self, name: String, email: String) -> Result<Vec<CustomerEvent>, CustomerRejection> {
        match self.status {
            None => {}
            Some(CustomerStatus::Deleted) => return Err(CustomerRejection::Deleted),
            Some(CustomerStatus::Active) => return Err(CustomerRejection::AlreadyRegistered),
        }
        if name.trim().is_empty() {
            return Err(CustomerRejection::EmptyName);
        }
        check_email(&email)?;
        Ok(vec![CustomerEvent::CustomerRegistered { name, email }])
    }
}

impl Aggregate for Customer {
    const TYPE: &'static str = "customer";
    type Command = CustomerCommand;
    type Event = CustomerEvent;
    type Rejection = CustomerRejection;
    type Config = ();

    fn handle(
        &self,
        command: CustomerCommand,
        _ctx: &Context<'_, ()>,
    ) -> Result<Vec<CustomerEvent>, CustomerRejection> {
        match command {
            CustomerCommand::RegisterCustomer { name, email } => self.register(name, email),
            CustomerCommand::ChangeEmail { email } => {
                self.require_active()?;
                check_email(&email)?;
                Ok(vec![CustomerEvent::EmailChanged { email }])
            }
            CustomerCommand::DeleteCustomer => {
                self.require_active()?;
                Ok(vec![CustomerEvent::CustomerDeleted])
            }
        }
    }

    fn apply(&mut self, event: &CustomerEvent) {
        match event {
            CustomerEvent::CustomerRegistered { name, email } => {
                self.status = Some(CustomerStatus::Active);
                self.name.clone_from(name);
                self.email.clone_from(email);
            }
            CustomerEvent::EmailChanged { email } => self.email.clone_from(email),
            CustomerEvent::CustomerDeleted => self.status = Some(CustomerStatus::Deleted),
        }
    }
}
