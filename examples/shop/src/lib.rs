//! shop: the eventfold example service (orders, payments, customers).
//!
//! `domain` holds the pure aggregates; `service` wires them into an eventfold runtime on
//! the embedded log and serves the HTTP API. The binary `shop` is a thin CLI over both.

pub mod domain;
pub mod service;
