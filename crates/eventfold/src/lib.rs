//! eventfold: event-sourced services on Apache Kafka or an embedded log.
//!
//! This facade re-exports the crates a service needs; [`App`] is a service binary's entry
//! point (standard flags, embedded or Kafka wiring, HTTP, shutdown, `views rebuild`). The
//! ops and load tools (the `eventfold` CLI) are the `eventfold-tools` crate, which a
//! service does not link.

#![warn(missing_docs)]

pub mod app;
pub mod process;
pub mod rebuild;

pub use eventfold_core as core;
pub use eventfold_http as http;
pub use eventfold_log as log;
pub use eventfold_runtime as runtime;
pub use eventfold_store as store;

pub use app::App;
pub use eventfold_core::projection;
pub use eventfold_core::rejections;
pub use eventfold_core::{
    Actions, Aggregate, AggregateTest, Context, EventMeta, Expect, Index, Input, ProcessContext, ProcessManager,
    ProcessTest, Projection, ProjectionTest, Refusal, Reject, Scope, Subscription, ViewChanges,
};
pub use eventfold_core::{IndexValue, Join, Outcome, Position};

/// The traits and types a service's domain code uses, for `use eventfold::prelude::*;`.
/// The projection's input event is `ProjectionEvent` here (`eventfold::projection::Event`),
/// so that it does not clash with a domain's own `Event`.
pub mod prelude {
    pub use crate::rejections;
    pub use eventfold_core::projection::Event as ProjectionEvent;
    pub use eventfold_core::{
        Actions, Aggregate, Context, EventMeta, Index, Input, Join, ProcessContext, ProcessManager, Projection,
        Refusal, Reject, Scope, Subscription, ViewChanges,
    };
}
