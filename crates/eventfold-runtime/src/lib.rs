//! eventfold-runtime: runs aggregates on a [`Log`](eventfold_log::Log).
//!
//! For every registered aggregate type and partition, one **processor** task owns the
//! partition: it restores (the barrier), then takes commands from a bounded queue in
//! batches, deduplicates by command id, checks `If-Match`, runs `handle`/`apply`, and
//! commits events, state and dedup records as one [`CommitUnit`](eventfold_log::CommitUnit).
//! Callers are answered only after the commit is durable (I4).
//!
//! The HTTP layer talks to type-erased [`AggregateService`]s through a [`Runtime`].
//!
//! Registered views ([`RuntimeBuilder::view`]) run one projection task per source
//! partition (see [`view`]) and answer queries through [`ViewService`].

#![warn(missing_docs)]

mod changelog;
pub mod clock;
pub mod cluster;
mod command;
pub mod error;
mod exposition;
pub mod lookup;
pub mod metrics;
mod options;
pub mod process;
mod processor;
mod remote;
mod runtime;
mod service;
mod snapshot;
mod source;
pub mod view;

pub use clock::{Clock, ManualClock, SystemClock};
pub use cluster::{InstanceInfo, Registry};
pub use command::{CommandRequest, PartitionState, Topics};
pub use error::{Error, Result};
pub use options::RuntimeOptions;
pub use process::{ProcessOptions, ProcessReport, ProcessService, ProcessState, ProcessStateView, TimerView};
pub use runtime::{Runtime, RuntimeBuilder};
pub use service::{AggregateService, PartitionReport, StateView};
pub use view::{
    Condition, Query, QueryPage, QueryRow, RebuildStats, ViewOptions, ViewPartitionReport, ViewReport, ViewService,
    ViewState,
};
