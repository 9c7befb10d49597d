//! eventfold-core: the pure heart of eventfold.
//!
//! Everything a user writes (aggregates) and everything the other crates agree on
//! (the record envelope, header names, positions, outcomes, partitioning) lives here.
//! **API boundary:** this crate does no I/O, spawns nothing and reads no clock.

#![warn(missing_docs)]

pub mod aggregate;
pub mod codec;
pub mod envelope;
pub mod error;
pub mod harness;
pub mod lookup;
pub mod partition;
pub mod position;
pub mod process;
pub mod process_harness;
pub mod projection;
mod rejections;
pub mod testing;
pub mod time;

pub use aggregate::{Aggregate, Context, Reject};
pub use envelope::{EventView, Outcome, Record, RecordRef};
pub use error::{Error, Result};
pub use harness::AggregateTest;
pub use lookup::{LookupRows, Lookups, NoLookups};
pub use position::Position;
pub use process::{
    Action, Actions, CommandOutcome, EventMeta, Input, ProcessContext, ProcessManager, Refusal, Subscription,
};
pub use process_harness::{Expect, ProcessTest};
pub use projection::{Index, IndexKind, IndexValue, Join, Projection, ProjectionTest, Scope, ViewChanges};
