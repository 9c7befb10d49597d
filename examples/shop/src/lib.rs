//! shop: the eventfold example service (orders, payments, customers).
//!
//! `domain` holds the pure aggregates; `service` wires them into an eventfold runtime on
//! the embedded log and serves the HTTP API; `views` holds the projections behind
//! `/v1/views/orders` and `/v1/views/customers`. The binary `shop` is a thin CLI over both.

pub mod domain;
pub mod service;
pub mod views;
