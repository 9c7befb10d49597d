//! The shop domain: pure aggregates for orders, payments and customers.
//!
//! Every aggregate only takes data and returns data (see `eventfold::Aggregate`); the
//! runtime does the I/O. Commands and events are internally tagged serde enums so each
//! JSON document names its `type` first.

pub mod cascade;
pub mod customer;
pub mod flow;
pub mod order;
pub mod payment;

pub use cascade::{CascadeEvent, CustomerOrders};
pub use customer::{Customer, CustomerCommand, CustomerEvent, CustomerRejection, CustomerStatus};
pub use flow::{FlowConfig, FlowEvent, FlowStage, OrderFlow};
pub use order::{LineItem, Order, OrderCommand, OrderEvent, OrderRejection, OrderStatus};
pub use payment::{Payment, PaymentCommand, PaymentConfig, PaymentEvent, PaymentRejection, PaymentStatus};
