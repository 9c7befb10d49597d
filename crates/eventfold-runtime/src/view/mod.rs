//! Views: projection processors that tail a source events topic, and the query side.
//!
//! One task per (view, source partition) reads the source events from its checkpoint with
//! [`Log::read`], applies the [`Projection`], and commits the row changes, the index
//! entries (old ones removed, new ones added) and the next source offset in **one** store
//! batch: a view is exactly-once without Kafka transactions, and restores from its
//! checkpoint after a restart with no duplicate and no gap. It wakes on the source
//! aggregate service's commit notifications, and polls as a fallback.
//!
//! Each partition publishes the offset it has applied, so a query carrying a
//! [`Position`] can wait (bounded) until the view has applied every mark of its source
//! topic: read-your-writes.
//!
//! **Readiness.** When a partition's worker starts, it takes the source's end offset as
//! its catch-up target (like the restore barrier of the command path). Until it has
//! applied that far (or a read finds nothing more: in Kafka, transaction markers take
//! offsets that are never read) the partition is [`ViewState::CatchingUp`] (a new view,
//! or one rebuilt from scratch, answers from a partial view meanwhile), then
//! [`ViewState::Ready`] for good: the ordinary lag of a live view under load is reported,
//! but does not flip readiness back (which would make `/readyz` flap under load). A
//! stopped partition is [`ViewState::Failed`]. [`ViewService::report`] gives the state,
//! lag and position.
//!
//! **Scopes.** A [`Scope::Replicated`] view applies every partition on every instance. A
//! [`Scope::Partitioned`] view applies partition p only while this instance owns the source
//! partition p ([`ViewState::Remote`] otherwise); taking p (back) it continues from its own
//! checkpoint, whose rows are the fold up to there. Its rows must fall in their event's
//! partition (checked on apply), and its queries answer for the partitions served here
//! ([`ViewService::query_partitions`]); the HTTP layer forwards and merges across instances.
//!
//! **Versions and rebuilds.** A view is stored under [`storage_name`] of its
//! [`Projection::VERSION`], so two versions can live side by side while the runtime
//! switches from one to the other (see `RuntimeBuilder::view`). [`rebuild`] rebuilds a
//! view offline from offset 0.

// The names the docs above link to.
#[cfg(doc)]
use eventfold_core::{Position, Projection, Scope};
#[cfg(doc)]
use eventfold_log::Log;

// Layout: `live` (the workers' loop, their commits, the bulk catch-up) and `offline` (the
// rebuild) both apply source events read by `events` through `fold` (the projection over
// a batch's pending rows, the index entries it moves); `overlay` is the in-memory view
// both bulk paths build; `service` is the `ViewService` handle (progress, readiness,
// reports), `query` its read side; `storage` names what a view is stored under; `options`
// holds `ViewOptions`; `versions` runs the versions of a view side by side and switches
// between them. This module only declares and re-exports, so the modules under it
// import each other in one direction.
mod events;
mod fold;
mod live;
mod offline;
mod options;
mod overlay;
mod query;
mod service;
mod storage;
mod versions;

pub(crate) use live::start;
pub use offline::{RebuildStats, rebuild};
pub use options::ViewOptions;
pub use query::{Condition, Query, QueryPage, QueryRow};
pub use service::{ViewPartitionReport, ViewReport, ViewService, ViewState};
pub use storage::{rebuild_marker_key, serving_version_key, storage_name};
pub(crate) use versions::{ViewSlot, ViewStarter, connect_lookups, start_slots};
