//! eventfold's operations and load tools, behind the `eventfold` ops CLI (`src/bin`):
//! [`load`] (HTTP load generator, `eventfold load`), [`load_topic`] (load on the Kafka
//! command topics, `eventfold load-topic`) and [`drop_app`] (delete an app's Kafka topics
//! and group, `eventfold drop-app`).
//!
//! A crate of its own so that a service, which links the `eventfold` facade, does not link
//! the tools' HTTP client, histograms and progress bars. The tools talk to a service only
//! over HTTP or through its Kafka topics, so they do not depend on the facade either.

#![warn(missing_docs)]

pub mod drop_app;
pub mod load;
pub mod load_topic;
