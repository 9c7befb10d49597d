//! Benchmark peer for eventfold: the shop `order` aggregate on cqrs-es + postgres-es,
//! served over eventfold's HTTP routes and bodies so `eventfold load` drives both alike.

pub mod domain;
pub mod http;
