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

use crate::error::{Error, Result};
use crate::lookup::{JoinCache, JoinError, LookupTable, Tables};
use crate::service::{AggregateService, Topics};
use eventfold_core::envelope::headers;
use eventfold_core::partition::partition_for;
use eventfold_core::projection::{Event, Join, RowReader};
use eventfold_core::{Aggregate, Index, IndexKind, IndexValue, Position, Projection, RecordRef, Scope, ViewChanges};
use eventfold_log::Log;
use eventfold_store::{Batch, Scan, Store, encode_prefix, encode_value, view_checkpoint_key};
use foldhash::HashMap;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{broadcast, watch};

mod offline;
pub use offline::{RebuildStats, rebuild};

/// How often an idle partition of a partitioned view checks whether this instance took
/// its source partition over.
const OWNERSHIP_POLL: Duration = Duration::from_millis(100);

/// Keys per ingestion when a view's data is cleared ([`eventfold_store::Store::clear_view`]):
/// about 60 MiB of keys held at a time.
pub(crate) const CLEAR_BATCH: usize = 1 << 20;

/// Options of the view processors and queries (defaults in parentheses).
#[derive(Debug, Clone)]
pub struct ViewOptions {
    /// Most source events applied per store batch (512).
    pub max_batch_events: usize,
    /// How often a partition re-reads its source without a notification (500 ms).
    pub poll_interval: Duration,
    /// After a notification, how long a partition waits for more events before it reads
    /// (10 ms): fewer, larger store batches under load, at most this much extra lag for
    /// queries without `min_position`. A query with a `min_position` the partition has not
    /// applied yet cuts the wait short, so read-your-writes does not pay it. A partition
    /// reads again at once only after a batch of at least a quarter of `max_batch_events`
    /// (a backlog); after a smaller one it waits for the next notification and this linger
    /// too (each batch costs a read, a store batch and a checkpoint write, whatever its
    /// size).
    pub linger: Duration,
    /// Most index entries a query examines before it returns a short page with a cursor
    /// (10,000); bounds the work of post-filters.
    pub max_scanned: usize,
    /// [`rebuild`]: most source events read and applied as one chunk (16,384).
    pub rebuild_batch_events: usize,
    /// [`rebuild`]: bytes of the view (rows as JSON, index entries, unique-index owners)
    /// built in memory before it is written to the store (256 MiB, shared by the
    /// threads). A view that fits is written once, sorted; past it the memory is written
    /// early and the rebuild goes on over the store, slower.
    pub rebuild_cache_bytes: usize,
    /// [`rebuild`]: memory for rows kept parsed after they change (512 MiB, shared by the
    /// threads, on top of `rebuild_cache_bytes`): the next event of the same entity
    /// changes such a row without parsing its JSON again. Past it the rows changed least
    /// recently are serialized. 0 keeps every row as JSON.
    pub rebuild_hot_bytes: usize,
    /// [`rebuild`]: threads applying events, each for its own partitions (the machine's
    /// available parallelism). Only partitioned views use more than one: the rows of a
    /// replicated view may come from any partition. Also how many partitions of a live
    /// view catch up in bulk at once.
    pub rebuild_threads: usize,
    /// A partition of a live partitioned view with no checkpoint (a new instance, a new
    /// projection version) and at least this many source events to apply catches up in
    /// bulk, like a rebuild (50,000): in memory (its share of `rebuild_cache_bytes`),
    /// written once by ingestion, its checkpoint last; its rows appear when it is done.
    pub bulk_catch_up_min_events: u64,
}

impl Default for ViewOptions {
    fn default() -> Self {
        Self {
            max_batch_events: 512,
            poll_interval: Duration::from_millis(500),
            linger: Duration::from_millis(10),
            max_scanned: 10_000,
            rebuild_batch_events: 16_384,
            rebuild_cache_bytes: 256 << 20,
            rebuild_hot_bytes: 512 << 20,
            rebuild_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            bulk_catch_up_min_events: 50_000,
        }
    }
}

/// A condition of a query on one index: equality, a half-open range, a string prefix
/// (string indexes only), or a prefix within a range.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Condition {
    /// Value must equal this.
    pub eq: Option<IndexValue>,
    /// Value must be at or above this.
    pub gte: Option<IndexValue>,
    /// Value must be below this.
    pub lt: Option<IndexValue>,
    /// Value must be a string starting with this (by UTF-8 bytes, case-sensitive).
    pub prefix: Option<String>,
}

/// A view query: one index drives the scan (and the order); conditions on other indexes
/// filter the rows it yields.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The index whose order the rows come in; `None`: row key order (then `conditions`
    /// only filter).
    pub order_by: Option<String>,
    /// Conditions by index name.
    pub conditions: BTreeMap<String, Condition>,
    /// Highest values first.
    pub descending: bool,
    /// Most rows returned.
    pub limit: usize,
    /// Continue after this scan position (from [`QueryPage::next`]).
    pub after: Option<Vec<u8>>,
}

/// One row of a query's answer.
#[derive(Debug)]
pub struct QueryRow {
    /// Row key.
    pub key: String,
    /// The row's document.
    pub value: Box<RawValue>,
    /// Its scan position: the rows of one query sort by it (bytes, ascending or descending
    /// with the query) on every instance, so the answers of several instances merge by it
    /// and it can continue a query ([`Query::after`]).
    pub position: Vec<u8>,
}

/// One page of answers.
#[derive(Debug)]
pub struct QueryPage {
    /// The rows in order.
    pub rows: Vec<QueryRow>,
    /// Scan position to continue from; `None` on the last page.
    pub next: Option<Vec<u8>>,
}

struct PartitionProgress {
    applied: watch::Sender<u64>,
    failure: Mutex<Option<String>>,
    /// Set once the worker has applied the source up to its end offset at start.
    caught_up: AtomicBool,
    /// That end offset (`u64::MAX` until the worker has read it).
    target: AtomicU64,
    /// A query waits for an offset not applied yet (`min_position`): the worker cuts its
    /// linger short (a permit stored while it is not lingering cuts the next one).
    hurry: tokio::sync::Notify,
}

/// Readiness of a view (or of one of its partitions); see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViewState {
    /// Applying the events that were in the source when the view started.
    CatchingUp,
    /// Caught up once; follows the source live.
    Ready,
    /// Stopped after an error (see `error`); restart the service after fixing the cause.
    Failed,
    /// A partitioned view's partition owned by another instance (Kafka mode): that
    /// instance applies it and answers for its rows.
    Remote,
}

/// One partition of a view, as `/readyz` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ViewPartitionReport {
    /// Source partition.
    pub partition: u32,
    /// Readiness.
    pub state: ViewState,
    /// Next source offset to apply.
    pub applied: u64,
    /// The source's end offset now (of the local log; in Kafka mode of its local cache).
    pub end: u64,
    /// Events not applied yet (`end - applied`).
    pub lag: u64,
    /// The catch-up target (the source's end when the view started), once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<u64>,
    /// Why it stopped, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of a view: the worst state of its partitions, the total lag, the position it
/// has applied, and the partitions that are not ready.
#[derive(Debug, Clone, Serialize)]
pub struct ViewReport {
    /// View name.
    pub view: String,
    /// `failed` if a partition failed, else `catching_up` if one catches up, else `ready`.
    pub state: ViewState,
    /// Events of the source not applied yet, over all partitions.
    pub lag: u64,
    /// What the view has applied, as a position token (compare with a command's).
    pub position: String,
    /// The partitions that are not ready (empty when the view is ready).
    pub partitions: Vec<ViewPartitionReport>,
    /// The projection version answering queries.
    pub version: u32,
    /// A newer version being built side by side (queries switch to it once it is
    /// ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub building: Option<Box<ViewReport>>,
}

/// The query face of one view. Cheap to share (`Arc`).
pub struct ViewService {
    name: &'static str,
    /// The projection's version, and the name its rows, entries and checkpoints are
    /// stored under ([`storage_name`]).
    version: u32,
    storage: String,
    /// Set when a newer version took over: the workers stop.
    retired: AtomicBool,
    workers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    source: Topics,
    /// The source aggregate type.
    source_type: &'static str,
    scope: Scope,
    /// The source's service, which knows the partitions this instance owns (live
    /// partitioned views only; `None`: every partition is applied and served here).
    owner: Option<Arc<dyn AggregateService>>,
    indexes: Vec<Index>,
    store: Store,
    options: ViewOptions,
    partitions: Vec<PartitionProgress>,
    unique_conflicts: Vec<AtomicU64>,
    /// Partitions catching up in bulk at once (`rebuild_threads`).
    bulk: Arc<tokio::sync::Semaphore>,
    /// Fields filled from lookup tables when rows are read.
    joins: Vec<Join>,
    /// The lookup tables the joins read (set by the runtime once every view exists; an
    /// offline rebuild has none and serves nothing).
    tables: OnceLock<Tables>,
}

impl std::fmt::Debug for ViewService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewService")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LookupTable for ViewService {
    fn row(&self, key: &str) -> Result<Option<Value>> {
        Ok(match self.get(key)? {
            Some(raw) => serde_json::from_str(raw.get()).ok(),
            None => None,
        })
    }

    fn raw(&self, key: &str) -> Result<Option<Vec<u8>>> {
        if key.is_empty() || key.len() > eventfold_core::projection::MAX_ROW_KEY_BYTES {
            return Ok(None);
        }
        // A lookup table is replicated: every row is here (no ownership check). Its own
        // joins, if any, are not applied to what other views join from it.
        Ok(self.store.get_view_row(&self.storage, key)?)
    }

    fn wait<'a>(
        &'a self,
        min: &'a Position,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(self.wait_own(min, timeout))
    }
}

fn corrupt(table: &'static str, key: String, reason: impl Into<String>) -> Error {
    Error::Store(eventfold_store::Error::Corrupt {
        table,
        key,
        reason: reason.into(),
    })
}

fn raw_json(view: &str, key: &str, json: Vec<u8>) -> Result<Box<RawValue>> {
    String::from_utf8(json)
        .ok()
        .and_then(|s| RawValue::from_string(s).ok())
        .ok_or_else(|| corrupt("view_row", format!("{view}/{key}"), "row is not JSON"))
}

impl ViewService {
    /// The view name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// The projection version this service holds.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The name its data is stored under ([`storage_name`]).
    pub fn storage(&self) -> &str {
        &self.storage
    }

    /// Stops the workers (a newer version took over) and waits for them to finish their
    /// current batch.
    pub(crate) async fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        let handles = std::mem::take(&mut *self.workers.lock().expect("not poisoned"));
        for h in handles {
            let _ = h.await;
        }
    }

    /// The declared indexes.
    pub fn indexes(&self) -> &[Index] {
        &self.indexes
    }

    /// The index called `name`.
    pub fn index(&self, name: &str) -> Option<&Index> {
        self.indexes.iter().find(|i| i.name == name)
    }

    /// The source events topic.
    pub fn source_topic(&self) -> &str {
        &self.source.events
    }

    /// The source aggregate type (whose partitions a partitioned view follows).
    pub fn source_type(&self) -> &str {
        self.source_type
    }

    /// Where the rows live (see [`Scope`]).
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The partition of row `key` (that of the source aggregate with the same id).
    pub fn partition_of(&self, key: &str) -> u32 {
        partition_for(key.as_bytes(), self.partitions.len() as u32)
    }

    /// Whether this instance applies and serves partition `p`: always for a replicated
    /// view; for a partitioned one, while this instance owns the source partition.
    pub fn is_local(&self, p: u32) -> bool {
        match (&self.owner, self.scope) {
            (Some(source), Scope::Partitioned) => !source.partition_is_remote(p),
            _ => true,
        }
    }

    /// The partitions this instance serves now.
    pub fn local_partitions(&self) -> Vec<u32> {
        (0..self.partitions.len() as u32)
            .filter(|p| self.is_local(*p))
            .collect()
    }

    /// How far the view has applied its source, as a position token's marks.
    pub fn position(&self) -> Position {
        let mut pos = Position::default();
        for (p, part) in self.partitions.iter().enumerate() {
            pos.advance(&self.source.events, p as u32, *part.applied.borrow());
        }
        pos
    }

    /// Waits until the view has applied every mark of `min` on its source topic (marks of
    /// other topics do not concern it), and so have the lookup tables its joins read, at
    /// most `timeout`.
    pub async fn wait_for(&self, min: &Position, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.wait_own(min, timeout).await?;
        // A row read joins the lookup tables: they must have applied the position too.
        if let Some(tables) = self.tables.get() {
            for join in &self.joins {
                if let Some(table) = tables.table(join.table) {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    table.wait(min, left).await?;
                }
            }
        }
        Ok(())
    }

    /// [`Self::wait_for`] of this view's own partitions.
    async fn wait_own(&self, min: &Position, timeout: Duration) -> Result<()> {
        let mut waits = Vec::new();
        for (topic, p, offset) in min.marks() {
            if topic != &*self.source.events {
                continue;
            }
            let part = self.partitions.get(p as usize).ok_or_else(|| {
                Error::BadRequest(format!(
                    "min_position names partition {p} of `{topic}`, which has {} partitions",
                    self.partitions.len()
                ))
            })?;
            // A partition served elsewhere is waited for where it is served.
            if self.is_local(p) {
                if *part.applied.borrow() < offset {
                    part.hurry.notify_one();
                }
                waits.push((part.applied.subscribe(), offset));
            }
        }
        let all = async {
            for (mut rx, offset) in waits {
                // The sender lives as long as the service; an error cannot happen here.
                let _ = rx.wait_for(|applied| *applied >= offset).await;
            }
        };
        if tokio::time::timeout(timeout, all).await.is_ok() {
            return Ok(());
        }
        let failures: Vec<String> = self
            .partitions
            .iter()
            .enumerate()
            .filter_map(|(p, part)| {
                part.failure
                    .lock()
                    .expect("not poisoned")
                    .as_ref()
                    .map(|f| format!("partition {p}: {f}"))
            })
            .collect();
        Err(Error::ViewBehind {
            view: self.name.to_owned(),
            waited: timeout,
            position: self.position().encode(),
            failures,
        })
    }

    /// Whether every partition served here has caught up (and none failed).
    pub fn is_ready(&self) -> bool {
        (0..self.partitions.len()).all(|p| matches!(self.state(p), ViewState::Ready | ViewState::Remote))
    }

    /// Whether a partition has stopped.
    pub fn has_failed(&self) -> bool {
        (0..self.partitions.len()).any(|p| self.state(p) == ViewState::Failed)
    }

    fn state(&self, p: usize) -> ViewState {
        let part = &self.partitions[p];
        if part.failure.lock().expect("not poisoned").is_some() {
            ViewState::Failed
        } else if !self.is_local(p as u32) {
            ViewState::Remote
        } else if part.caught_up.load(Ordering::Acquire) {
            ViewState::Ready
        } else {
            ViewState::CatchingUp
        }
    }

    /// State, lag and position of the view (the lag against the local log, or in Kafka
    /// mode its local cache).
    pub fn report(&self) -> ViewReport {
        let mut report = ViewReport {
            view: self.name.to_owned(),
            state: ViewState::Ready,
            lag: 0,
            position: self.position().encode(),
            partitions: Vec::new(),
            version: self.version,
            building: None,
        };
        for (p, part) in self.partitions.iter().enumerate() {
            let applied = *part.applied.borrow();
            // The end of the local log (embedded) or of its local cache (Kafka, written
            // after every commit): no broker round trip per probe, which under load could
            // wait for open transactions.
            let end = match self.store.log_end(&self.source.events, p as u32) {
                Ok(end) => end.max(applied),
                Err(e) => {
                    tracing::warn!(view = self.name, partition = p, error = %e, "cannot read the source end offset");
                    applied
                }
            };
            let state = self.state(p);
            if state == ViewState::Remote {
                continue;
            }
            let lag = end.saturating_sub(applied);
            report.lag += lag;
            report.state = match (report.state, state) {
                (ViewState::Failed, _) | (_, ViewState::Failed) => ViewState::Failed,
                (ViewState::CatchingUp, _) | (_, ViewState::CatchingUp) => ViewState::CatchingUp,
                _ => ViewState::Ready,
            };
            if state != ViewState::Ready {
                let target = part.target.load(Ordering::Acquire);
                report.partitions.push(ViewPartitionReport {
                    partition: p as u32,
                    state,
                    applied,
                    end,
                    lag,
                    target: (target != u64::MAX).then_some(target),
                    error: part.failure.lock().expect("not poisoned").clone(),
                });
            }
        }
        report
    }

    /// Row `key`, if present. A partitioned view answers only for the partitions it
    /// serves ([`Error::NotOwner`] otherwise: ask the owner).
    pub fn get(&self, key: &str) -> Result<Option<Box<RawValue>>> {
        if key.is_empty() || key.len() > eventfold_core::projection::MAX_ROW_KEY_BYTES {
            return Ok(None);
        }
        let p = self.partition_of(key);
        if !self.is_local(p) {
            return Err(self.not_owner(p));
        }
        match self.store.get_view_row(&self.storage, key)? {
            Some(json) => self.read_row(key, json, &mut JoinCache::default()).map(Some),
            None => Ok(None),
        }
    }

    /// A stored row as served: with its joins filled from the lookup tables.
    fn read_row(&self, key: &str, json: Vec<u8>, cache: &mut JoinCache) -> Result<Box<RawValue>> {
        if self.joins.is_empty() {
            return raw_json(self.name, key, json);
        }
        match crate::lookup::fill(&json, &self.joins, self.tables.get(), cache) {
            Ok(joined) => raw_json(self.name, key, joined),
            Err(JoinError::Row(reason)) => Err(corrupt("view_row", format!("{}/{key}", self.name), reason)),
            Err(JoinError::Table(e)) => Err(e),
        }
    }

    /// Gives the view its lookup tables (once).
    pub(crate) fn set_tables(&self, tables: Tables) {
        let _ = self.tables.set(tables);
    }

    /// The joins of its rows.
    pub fn joins(&self) -> &[Join] {
        &self.joins
    }

    fn not_owner(&self, p: u32) -> Error {
        Error::NotOwner {
            aggregate: self.source_type.to_owned(),
            partition: p,
        }
    }

    /// Runs `query`: scans the driving index, filters by the other conditions. A
    /// partitioned view answers for the partitions it serves (see [`Self::query_partitions`]).
    pub fn query(&self, query: &Query) -> Result<QueryPage> {
        self.query_partitions(query, None)
    }

    /// Runs `query` over the rows of `partitions` (`None`: every partition served here).
    /// A partitioned view refuses partitions it does not serve ([`Error::NotOwner`]); its
    /// store may still hold rows of partitions it served before, which are left out. A
    /// replicated view holds every row and ignores `partitions`.
    pub fn query_partitions(&self, query: &Query, partitions: Option<&[u32]>) -> Result<QueryPage> {
        let wanted: Option<Vec<bool>> = match self.scope {
            Scope::Replicated => None,
            Scope::Partitioned => {
                let mut wanted = vec![false; self.partitions.len()];
                let list = partitions.map_or_else(|| self.local_partitions(), <[u32]>::to_vec);
                for p in list {
                    if p as usize >= wanted.len() {
                        return Err(Error::BadRequest(format!(
                            "view `{}` has {} partitions, not {p}",
                            self.name,
                            wanted.len()
                        )));
                    }
                    if !self.is_local(p) {
                        return Err(self.not_owner(p));
                    }
                    wanted[p as usize] = true;
                }
                Some(wanted)
            }
        };
        let unknown = |name: &str| Error::BadRequest(format!("view `{}` has no index `{name}`", self.name));
        let enc = |v: &Option<IndexValue>| v.as_ref().map(encode_value);
        for (name, c) in &query.conditions {
            let idx = self.index(name).ok_or_else(|| unknown(name))?;
            if c.prefix.is_some() && idx.kind != IndexKind::String {
                return Err(Error::BadRequest(format!(
                    "index `{name}` of view `{}` holds {:?} values; a prefix applies to string indexes",
                    self.name, idx.kind
                )));
            }
        }
        let enc_prefix = |c: &Condition| c.prefix.as_deref().map(encode_prefix);
        let mut scan = Scan {
            descending: query.descending,
            limit: query.limit,
            max_scanned: self.options.max_scanned,
            after: query.after.clone(),
            ..Default::default()
        };
        if let Some(name) = &query.order_by {
            self.index(name).ok_or_else(|| unknown(name))?;
            if let Some(c) = query.conditions.get(name) {
                scan.eq = enc(&c.eq);
                scan.gte = enc(&c.gte);
                scan.lt = enc(&c.lt);
                scan.prefix = enc_prefix(c);
            }
        }
        let mut filters = Vec::new();
        for (name, c) in &query.conditions {
            if Some(name) == query.order_by.as_ref() {
                continue;
            }
            let idx = self.index(name).ok_or_else(|| unknown(name))?;
            filters.push((idx, enc(&c.eq), enc(&c.gte), enc(&c.lt), enc_prefix(c)));
        }
        let count = self.partitions.len() as u32;
        let mut filter = |key: &str, json: &[u8]| -> bool {
            if let Some(wanted) = &wanted
                && !wanted[partition_for(key.as_bytes(), count) as usize]
            {
                return false;
            }
            if filters.is_empty() {
                return true;
            }
            let Ok(doc) = serde_json::from_slice::<Value>(json) else {
                return false;
            };
            filters.iter().all(|(idx, eq, gte, lt, prefix)| {
                let Ok(Some(v)) = idx.extract(&doc) else {
                    return false;
                };
                let v = encode_value(&v);
                eq.as_ref().is_none_or(|e| v == *e)
                    && gte.as_ref().is_none_or(|g| v >= *g)
                    && lt.as_ref().is_none_or(|l| v < *l)
                    && prefix.as_ref().is_none_or(|p| v.starts_with(p))
            })
        };
        let page = self
            .store
            .scan_view(&self.storage, query.order_by.as_deref(), &scan, &mut filter)?;
        let mut cache = JoinCache::default();
        let rows = page
            .rows
            .into_iter()
            .map(|h| {
                Ok(QueryRow {
                    value: self.read_row(&h.key, h.json, &mut cache)?,
                    key: h.key,
                    position: h.position,
                })
            })
            .collect::<Result<_>>()?;
        Ok(QueryPage { rows, next: page.next })
    }

    /// Prometheus lines of this view.
    pub(crate) fn render_metrics(&self, applied: &mut String, up: &mut String, conflicts: &mut String) {
        for p in 0..self.partitions.len() {
            let v = match self.state(p) {
                ViewState::Ready => 1,
                ViewState::CatchingUp => 0,
                ViewState::Failed => -1,
                ViewState::Remote => 2,
            };
            let _ = writeln!(up, "eventfold_view_up{{view=\"{}\",partition=\"{p}\"}} {v}", self.name);
        }
        for (p, part) in self.partitions.iter().enumerate() {
            let _ = writeln!(
                applied,
                "eventfold_view_applied_offset{{view=\"{}\",partition=\"{p}\"}} {}",
                self.name,
                *part.applied.borrow()
            );
        }
        for (idx, n) in self.indexes.iter().zip(&self.unique_conflicts) {
            if idx.unique {
                let _ = writeln!(
                    conflicts,
                    "eventfold_view_unique_conflicts_total{{view=\"{}\",index=\"{}\"}} {}",
                    self.name,
                    idx.name,
                    n.load(Ordering::Relaxed)
                );
            }
        }
    }
}

/// Builds the query side of projection `P` over the source topics `source`, from the
/// stored checkpoints; returns it with the projection and each partition's next offset.
fn service<P: Projection>(
    log: &Arc<dyn Log>,
    source: Topics,
    owner: Option<Arc<dyn AggregateService>>,
    options: &ViewOptions,
) -> (Arc<ViewService>, Arc<P>, Vec<u64>) {
    let projection = Arc::new(P::default());
    let indexes = projection.indexes();
    if P::SCOPE == Scope::Partitioned
        && let Some(idx) = indexes.iter().find(|i| i.unique)
    {
        panic!(
            "view `{}` is partitioned and declares unique index `{}`: uniqueness across all rows needs every row in one place; make the view Scope::Replicated",
            P::VIEW,
            idx.name
        );
    }
    for (i, idx) in indexes.iter().enumerate() {
        assert!(
            indexes[..i].iter().all(|o| o.name != idx.name),
            "view `{}` declares index `{}` twice",
            P::VIEW,
            idx.name
        );
        assert!(
            !idx.name.is_empty() && !idx.name.contains('\0'),
            "invalid index name {:?}",
            idx.name
        );
    }
    let store = log.store().clone();
    let storage = storage_name(P::VIEW, P::VERSION);
    let mut partitions = Vec::new();
    let mut starts = Vec::new();
    for p in 0..log.partitions() {
        let from = store
            .get_meta(&view_checkpoint_key(&storage, &source.events, p))
            .unwrap_or_else(|e| panic!("cannot read the checkpoint of view `{}`: {e}", P::VIEW))
            .unwrap_or(0);
        partitions.push(PartitionProgress {
            applied: watch::Sender::new(from),
            failure: Mutex::new(None),
            caught_up: AtomicBool::new(false),
            target: AtomicU64::new(u64::MAX),
            hurry: tokio::sync::Notify::new(),
        });
        starts.push(from);
    }
    let svc = Arc::new(ViewService {
        name: P::VIEW,
        version: P::VERSION,
        storage,
        retired: AtomicBool::new(false),
        workers: Mutex::new(Vec::new()),
        source,
        source_type: <P::Source as Aggregate>::TYPE,
        scope: P::SCOPE,
        owner,
        unique_conflicts: indexes.iter().map(|_| AtomicU64::new(0)).collect(),
        indexes,
        store,
        options: options.clone(),
        partitions,
        bulk: Arc::new(tokio::sync::Semaphore::new(options.rebuild_threads.max(1))),
        joins: projection.joins(),
        tables: OnceLock::new(),
    });
    (svc, projection, starts)
}

/// The name a view's rows, index entries and checkpoints are stored under: the view name
/// for version 1 (what views were stored under before versions existed), `<view>@v<n>`
/// for later versions, so two versions can live side by side.
pub fn storage_name(view: &str, version: u32) -> String {
    match version {
        1 => view.to_owned(),
        v => format!("{view}@v{v}"),
    }
}

/// The meta entry holding the version of `view` that answers queries.
pub fn serving_version_key(view: &str) -> String {
    format!("view_version/{view}")
}

/// The meta entry present while partition `partition` of the view stored as `storage`
/// catches up in bulk (or was interrupted doing so: its rows are then removed before it
/// starts again).
fn bulk_marker_key(storage: &str, partition: u32) -> String {
    format!("view_bulk/{storage}/{partition}")
}

/// The meta entry present while a rebuild of the view stored as `storage` is under way
/// (or was interrupted): a view with this marker is not served (its partitions are
/// `failed`).
pub fn rebuild_marker_key(storage: &str) -> String {
    format!("rebuild/{storage}")
}

/// Starts the processors of projection `P` over the source service `source`.
///
/// `source` is `None` for a replicated view of an aggregate type this instance does not
/// run (a lookup table of events others write): it reads `topics` the same way, polling
/// (no commit here announces new events).
pub(crate) fn start<P: Projection>(
    log: &Arc<dyn Log>,
    topics: Topics,
    source: Option<&Arc<dyn AggregateService>>,
    options: &ViewOptions,
) -> Arc<ViewService> {
    let (svc, projection, starts) = service::<P>(log, topics, source.cloned(), options);
    // A rebuild that did not finish left the view half cleared: serving it (or building
    // on it) would be wrong, so its partitions stop until the rebuild is run again.
    match log.store().get_meta(&rebuild_marker_key(&svc.storage)) {
        Ok(None) => {}
        Ok(Some(_)) => {
            let reason = format!(
                "a rebuild of view `{}` was interrupted; run the rebuild again before serving it",
                P::VIEW
            );
            tracing::error!(view = P::VIEW, %reason, "view not started");
            for part in &svc.partitions {
                *part.failure.lock().expect("not poisoned") = Some(reason.clone());
            }
            return svc;
        }
        Err(e) => panic!("cannot read the rebuild marker of view `{}`: {e}", P::VIEW),
    }
    for (p, from) in starts.into_iter().enumerate() {
        let worker = Worker {
            projection: projection.clone(),
            svc: svc.clone(),
            log: log.clone(),
            partition: p as u32,
            partitions: log.partitions(),
            next: from,
        };
        let wake = match source {
            Some(s) => s.subscribe(),
            None => broadcast::channel(1).1, // closed at once: the worker polls
        };
        let handle = tokio::spawn(worker.run(wake));
        svc.workers.lock().expect("not poisoned").push(handle);
    }
    svc
}

/// Why a worker step failed.
enum Step {
    /// Reading the source failed: worth retrying.
    Read(String),
    /// Applying or storing failed: the view partition stops.
    Fatal(String),
}

impl From<ReadFailure> for Step {
    fn from(f: ReadFailure) -> Self {
        match f {
            ReadFailure::Read(e) => Step::Read(e),
            ReadFailure::Decode(e) => Step::Fatal(e),
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read(e) | Self::Fatal(e) => f.write_str(e),
        }
    }
}

struct Worker<P: Projection> {
    projection: Arc<P>,
    svc: Arc<ViewService>,
    log: Arc<dyn Log>,
    partition: u32,
    /// The source's partition count (to route notifications by aggregate id).
    partitions: u32,
    next: u64,
}

/// The event type of a projection's source aggregate.
type SourceEvent<P> = <<P as Projection>::Source as Aggregate>::Event;

/// A source event as a projection sees it: its envelope and its payload, decoded (a
/// rebuild decodes on its reader's thread).
struct Decoded<E> {
    offset: u64,
    aggregate_id: String,
    version: u64,
    event_type: Arc<str>,
    timestamp_ms: i64,
    payload: E,
}

/// Why [`read_events`] stopped.
enum ReadFailure {
    /// The log could not be read (worth retrying).
    Read(String),
    /// A record is not an event of the source (the view partition stops there).
    Decode(String),
}

/// Reads up to `max` events of `topic`/`partition` from `from` on, those below `end`,
/// and decodes them; the first that does not decode fails them all. Reads through
/// [`Log::read_with`]: nothing of a record is copied but its aggregate id and payload.
async fn read_events<P: Projection>(
    log: &dyn Log,
    topic: &str,
    partition: u32,
    from: u64,
    max: usize,
    end: u64,
) -> Result<Vec<Decoded<SourceEvent<P>>>, ReadFailure> {
    let mut events = Vec::with_capacity(max.min(16_384));
    let mut failed = None;
    // Event type names: a few, shared by every event of their type.
    let mut types: Vec<Arc<str>> = Vec::new();
    log.read_with(topic, partition, from, max, &mut |offset, record| {
        if offset >= end {
            return false;
        }
        match decode::<P>(topic, partition, offset, record, &mut types) {
            Ok(event) => {
                events.push(event);
                true
            }
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })
    .await
    .map_err(|e| ReadFailure::Read(format!("cannot read {topic}/{partition}: {e}")))?;
    match failed {
        Some(e) => Err(ReadFailure::Decode(e)),
        None => Ok(events),
    }
}

/// Decodes the event at `offset` of `topic`/`partition`.
fn decode<P: Projection>(
    topic: &str,
    partition: u32,
    offset: u64,
    record: RecordRef<'_>,
    types: &mut Vec<Arc<str>>,
) -> Result<Decoded<SourceEvent<P>>, String> {
    let payload = serde_json::from_slice(record.value)
        .map_err(|e| format!("event {topic}/{partition}@{offset} does not decode: {e}"))?;
    let aggregate_id = record
        .header_str(headers::AGGREGATE_ID)
        .or_else(|| std::str::from_utf8(record.key).ok())
        .ok_or_else(|| format!("event {topic}/{partition}@{offset} has no aggregate id"))?
        .to_owned();
    let version = record
        .header_str(headers::VERSION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let name = record.header_str(headers::TYPE).unwrap_or("unknown");
    let event_type = match types.iter().find(|t| &***t == name) {
        Some(t) => t.clone(),
        None => {
            let t: Arc<str> = Arc::from(name);
            types.push(t.clone());
            t
        }
    };
    Ok(Decoded {
        offset,
        aggregate_id,
        version,
        event_type,
        timestamp_ms: record.timestamp_ms,
        payload,
    })
}

/// What a batch finds committed before it: rows and unique-index owners.
trait Committed {
    /// Row `key` of the view.
    fn row(&self, key: &str) -> Result<Option<Value>>;
    /// Row `key` of the view, about to change: its new version is passed to
    /// [`Worker::change`] in this batch (an overlay may hand over its copy).
    fn row_to_change(&self, key: &str) -> Result<Option<Value>> {
        self.row(key)
    }
    /// The row holding `value` in unique index `index` (by position).
    fn owner(&self, index: usize, value: &[u8]) -> Result<Option<String>>;
}

/// The live workers' committed state: the store.
struct Stored<'a> {
    store: &'a Store,
    view: &'a str,
    indexes: &'a [Index],
}

impl Committed for Stored<'_> {
    fn row(&self, key: &str) -> Result<Option<Value>> {
        load_row(self.store, self.view, key)
    }

    fn owner(&self, index: usize, value: &[u8]) -> Result<Option<String>> {
        Ok(self.store.get_view_unique(self.view, self.indexes[index].name, value)?)
    }
}

/// Rows as the projection reads them: this batch's pending changes over what is
/// committed. Rows read from `base` are kept in `loaded`, so the change that follows a
/// read (an `update`) does not read and parse the row a second time.
struct Rows<'a> {
    pending: RefCell<&'a mut HashMap<String, Option<Value>>>,
    loaded: &'a RefCell<HashMap<String, Option<Value>>>,
    /// Whether [`Worker::change`] needs the committed row to move index entries; without
    /// it, a row read from `base` is handed out without keeping a copy in `loaded`, and a
    /// row about to change is taken, not cloned (see [`RowReader::row_to_change`]).
    keep_loaded: bool,
    base: &'a dyn Committed,
    error: RefCell<Option<String>>,
}

impl Rows<'_> {
    fn read(&self, key: &str, to_change: bool) -> Option<Value> {
        let take = to_change && !self.keep_loaded;
        {
            let mut pending = self.pending.borrow_mut();
            match pending.get(key) {
                // Its new version replaces it in `pending` before the batch goes on (a
                // deletion stays: nothing replaces it).
                Some(Some(_)) if take => return pending.remove(key).flatten(),
                Some(v) => return v.clone(),
                None => {}
            }
        }
        if let Some(v) = self.loaded.borrow().get(key) {
            return v.clone();
        }
        let read = if take {
            self.base.row_to_change(key)
        } else {
            self.base.row(key)
        };
        match read {
            Ok(v) if self.keep_loaded => {
                self.loaded.borrow_mut().insert(key.to_owned(), v.clone());
                v
            }
            Ok(v) => v,
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e.to_string());
                None
            }
        }
    }
}

impl RowReader for Rows<'_> {
    fn row(&self, key: &str) -> Option<Value> {
        self.read(key, false)
    }

    fn row_to_change(&self, key: &str) -> Option<Value> {
        self.read(key, true)
    }
}

fn load_row(store: &Store, view: &str, key: &str) -> Result<Option<Value>> {
    match store.get_view_row(view, key)? {
        Some(json) => parse_row(view, key, &json).map(Some),
        None => Ok(None),
    }
}

fn parse_row(view: &str, key: &str, json: &[u8]) -> Result<Value> {
    serde_json::from_slice(json).map_err(|e| corrupt("view_row", format!("{view}/{key}"), e.to_string()))
}

/// A value of a unique index: (index position, encoded value).
type UniqueValue = (usize, Vec<u8>);

/// Changes of one batch, each key once (a store batch must not touch a key twice).
#[derive(Default)]
struct Pending {
    rows: HashMap<String, Option<Value>>,
    /// Committed rows read during this batch and not changed yet (see [`Rows`]).
    loaded: RefCell<HashMap<String, Option<Value>>>,
    /// (index position, encoded value, row key or "" in a unique index) -> the row key
    /// to put, or `None` to delete.
    entries: BTreeMap<(usize, Vec<u8>, String), Option<String>>,
    /// A unique index value -> the row holding it.
    owners: HashMap<UniqueValue, Option<String>>,
    /// Leave the entries of non-unique indexes out of `entries`: the caller derives them
    /// from the final rows (a rebuild into an empty view).
    derive_plain_entries: bool,
}

/// The fallback poll doubles this many times at most while a partition idles.
const IDLE_POLL_DOUBLINGS: u32 = 3;

/// The fallback poll's interval after `idle` reads in a row that found nothing: `base`,
/// doubling from the second one up to `base << IDLE_POLL_DOUBLINGS`. New events of the
/// partition committed here wake the worker at once whatever it is.
fn idle_poll(base: Duration, idle: u32) -> Duration {
    base.saturating_mul(1 << idle.saturating_sub(1).min(IDLE_POLL_DOUBLINGS))
}

impl<P: Projection> Worker<P> {
    async fn run(mut self, mut wake: broadcast::Receiver<(Arc<str>, u64)>) {
        let topic = self.svc.source.events.clone();
        let svc = self.svc.clone();
        let progress = &svc.partitions[self.partition as usize];
        // Whether this instance serves the partition: always for a replicated view; for a
        // partitioned one, while it owns the source partition.
        let mut serving = false;
        let mut target = u64::MAX;
        // Reads in a row that found nothing: the fallback poll slows down while the
        // partition idles (on Kafka each poll at the end asks the broker for the end).
        let mut idle_polls: u32 = 0;
        loop {
            if svc.retired.load(Ordering::Acquire) {
                return;
            }
            if !svc.is_local(self.partition) {
                if serving {
                    tracing::info!(
                        view = P::VIEW,
                        partition = self.partition,
                        "view partition moved to another instance"
                    );
                    serving = false;
                    progress.caught_up.store(false, Ordering::Release);
                }
                tokio::time::sleep(OWNERSHIP_POLL).await;
                continue;
            }
            if !serving {
                // The catch-up target: the source's end now (see the module docs on
                // readiness). A partition taken over continues from its own checkpoint:
                // the rows stored with it are the fold up to there.
                // The log may be away (a broker restart, which is also when partitions
                // move): retry like a failed read.
                target = match self.log.end_offset(&topic, self.partition).await {
                    Ok(end) => end,
                    Err(e) => {
                        tracing::warn!(view = P::VIEW, partition = self.partition, error = %e, "cannot read the source's end offset; retrying");
                        tokio::time::sleep(self.svc.options.poll_interval.max(Duration::from_millis(500))).await;
                        continue;
                    }
                };
                progress.target.store(target, Ordering::Release);
                if svc.scope == Scope::Partitioned {
                    match self.bulk_catch_up(&topic, target).await {
                        Ok(true) => {}
                        Ok(false) => continue, // retired, or the partition moved away
                        Err(Step::Read(e)) => {
                            tracing::warn!(view = P::VIEW, partition = self.partition, error = %e, "bulk catch-up: read failed; retrying");
                            tokio::time::sleep(self.svc.options.poll_interval.max(Duration::from_millis(500))).await;
                            continue;
                        }
                        Err(Step::Fatal(e)) => return self.fail(e),
                    }
                }
                serving = true;
                if svc.scope == Scope::Partitioned {
                    tracing::info!(
                        view = P::VIEW,
                        partition = self.partition,
                        from = self.next,
                        target,
                        "view partition served here"
                    );
                }
            }
            if self.next >= target && !progress.caught_up.load(Ordering::Relaxed) {
                tracing::debug!(
                    view = P::VIEW,
                    partition = self.partition,
                    target,
                    "view partition caught up"
                );
                progress.caught_up.store(true, Ordering::Release);
            }
            match self.step(&topic, self.svc.options.max_batch_events).await {
                // Nothing left to read: caught up even if `next` is below the target, as
                // in Kafka, where transaction markers take offsets but are never read.
                Ok(0) => {
                    idle_polls = idle_polls.saturating_add(1);
                    if !progress.caught_up.load(Ordering::Relaxed) {
                        tracing::debug!(
                            view = P::VIEW,
                            partition = self.partition,
                            next = self.next,
                            target,
                            "view partition caught up"
                        );
                        progress.caught_up.store(true, Ordering::Release);
                    }
                }
                // A backlog: read on at once.
                Ok(n) if n.saturating_mul(4) >= self.svc.options.max_batch_events => {
                    idle_polls = 0;
                    continue;
                }
                // Under a steady load, reading again at once made batches of one or two
                // events: wait for the next notification and the linger (about 5% less
                // CPU per command for the shop at 10,000 commands/s).
                Ok(_) => idle_polls = 0,
                // The log's read failed (Kafka: the broker is away): reads are idempotent,
                // try again from the same checkpoint.
                Err(Step::Read(e)) => {
                    tracing::warn!(view = P::VIEW, partition = self.partition, error = %e, "view read failed; retrying");
                    tokio::time::sleep(self.svc.options.poll_interval.max(Duration::from_millis(500))).await;
                    continue;
                }
                Err(Step::Fatal(e)) => return self.fail(e),
            }
            tokio::select! {
                closed = self.wait_for_own_partition(&mut wake) => {
                    if closed {
                        // The source is gone (shutdown); keep polling at the slow pace.
                        tokio::time::sleep(self.svc.options.poll_interval).await;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(self.svc.options.linger) => {}
                        _ = progress.hurry.notified() => {}
                    }
                    while wake.try_recv().is_ok() {}
                }
                // A query waiting for a position (`wait_for`) reads at once.
                _ = progress.hurry.notified() => {}
                _ = tokio::time::sleep(idle_poll(self.svc.options.poll_interval, idle_polls)) => {}
            }
        }
    }

    /// Catches this partition of a partitioned view up to `target` like an offline
    /// rebuild, when it has no checkpoint (so no rows of its own: the view is partitioned)
    /// and at least `bulk_catch_up_min_events` to apply: folds the events in memory
    /// ([`offline::Overlay`], on blocking threads), writes the rows and entries by
    /// ingestion, then the checkpoint. A durable marker covers the partition meanwhile:
    /// found at the next start (a crash, or the partition moved away), the rows written so
    /// far are removed and the catch-up starts over. Returns false, with `next`
    /// unchanged, when the view retires or the partition moves away midway.
    async fn bulk_catch_up(&mut self, topic: &Arc<str>, target: u64) -> Result<bool, Step> {
        let store = self.log.store().clone();
        let marker = bulk_marker_key(&self.svc.storage, self.partition);
        let blocking = |f: Box<dyn FnOnce() -> eventfold_store::Result<()> + Send>| async move {
            match tokio::task::spawn_blocking(f).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Step::Fatal(format!("bulk catch-up: {e}"))),
                Err(e) => Err(Step::Fatal(format!("bulk catch-up task failed: {e}"))),
            }
        };
        let interrupted = store
            .get_meta(&marker)
            .map_err(|e| Step::Fatal(format!("cannot read {marker}: {e}")))?
            .is_some();
        let checkpoint = view_checkpoint_key(&self.svc.storage, topic, self.partition);
        if interrupted {
            let (s, view, (p, n)) = (
                store.clone(),
                self.svc.storage.clone(),
                (self.partition, self.partitions),
            );
            let (marker, checkpoint) = (marker.clone(), checkpoint.clone());
            blocking(Box::new(move || {
                let removed = s.clear_view_rows(&view, &|key| partition_for(key.as_bytes(), n) == p)?;
                tracing::warn!(view = %view, partition = p, removed, "removed the rows of an interrupted bulk catch-up");
                let mut b = Batch::new();
                b.delete_meta(&checkpoint);
                b.delete_meta(&marker);
                s.commit(b, true)
            }))
            .await?;
            self.next = 0;
            self.svc.partitions[self.partition as usize].applied.send_replace(0);
        }
        let min = self.svc.options.bulk_catch_up_min_events;
        if self.next != 0 || target < min.max(1) {
            return Ok(true);
        }
        let _permit = self.svc.bulk.clone().acquire_owned().await.expect("never closed");
        let started = std::time::Instant::now();
        let (s, m) = (store.clone(), marker.clone());
        blocking(Box::new(move || {
            let mut b = Batch::new();
            b.put_meta(&m, 1);
            s.commit(b, true)
        }))
        .await?;
        let mut overlay = Some(offline::Overlay::new(
            store.clone(),
            self.svc.clone(),
            self.svc.options.rebuild_threads,
        ));
        let mut next = 0;
        let max = self.svc.options.rebuild_batch_events.max(1);
        while next < target {
            if self.svc.retired.load(Ordering::Acquire) || !self.svc.is_local(self.partition) {
                return Ok(false); // the marker stays: the next start removes what was written
            }
            let events = read_events::<P>(&*self.log, topic, self.partition, next, max, u64::MAX)
                .await
                .map_err(Step::from)?;
            let Some(last) = events.last().map(|e| e.offset) else {
                break; // only offsets without records are left (Kafka's transaction markers)
            };
            let worker = self.handle();
            let mut o = overlay.take().expect("put back after each chunk");
            let topic = topic.clone();
            let (o, folded) = tokio::task::spawn_blocking(move || {
                let mut pending = Pending {
                    derive_plain_entries: o.whole,
                    ..Default::default()
                };
                let folded = worker.fold(&mut pending, &topic, &events, &o);
                if folded.is_ok() {
                    o.take(pending);
                }
                (o, folded)
            })
            .await
            .map_err(|e| Step::Fatal(format!("bulk catch-up task failed: {e}")))?;
            folded.map_err(Step::Fatal)?;
            next = last + 1;
            overlay = Some(o);
            let o = overlay.as_mut().expect("just put back");
            if o.bytes > o.max_bytes {
                let (s, write) = (store.clone(), o.spill());
                blocking(Box::new(move || s.ingest_view(write, false).map(drop))).await?;
            }
        }
        let write = overlay.as_mut().expect("put back after each chunk").spill();
        let s = store.clone();
        blocking(Box::new(move || {
            s.ingest_view(write, false)?;
            let mut b = Batch::new();
            b.put_meta(&checkpoint, next);
            b.delete_meta(&marker);
            s.commit(b, true)
        }))
        .await?;
        tracing::info!(
            view = P::VIEW,
            partition = self.partition,
            events = next,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "view partition caught up in bulk"
        );
        self.next = next;
        self.svc.partitions[self.partition as usize].applied.send_replace(next);
        Ok(true)
    }

    /// A copy of this worker for a blocking thread (its checkpoint is not shared).
    fn handle(&self) -> Worker<P> {
        Worker {
            projection: self.projection.clone(),
            svc: self.svc.clone(),
            log: self.log.clone(),
            partition: self.partition,
            partitions: self.partitions,
            next: self.next,
        }
    }

    /// Reads up to `max` source events from the checkpoint, applies them and commits the
    /// rows, index entries and next offset in one batch, then publishes the new offset.
    /// Returns how many events it applied (0: none there yet).
    async fn step(&mut self, topic: &str, max: usize) -> Result<usize, Step> {
        let events = read_events::<P>(&*self.log, topic, self.partition, self.next, max, u64::MAX)
            .await
            .map_err(Step::from)?;
        let Some(next) = events.last().map(|e| e.offset + 1) else {
            return Ok(0);
        };
        let base = Stored {
            store: self.log.store(),
            view: &self.svc.storage,
            indexes: &self.svc.indexes,
        };
        let batch = self.apply(topic, &events, next, &base).map_err(Step::Fatal)?;
        // Not durable by itself (the rows are derived from the log; a crash may lose a
        // tail of them with their checkpoint): the embedded log writes it with its next
        // group commit.
        if let Err(e) = self.log.write_local(batch).await {
            return Err(Step::Fatal(format!("cannot commit: {e}")));
        }
        self.next = next;
        self.svc.partitions[self.partition as usize].applied.send_replace(next);
        Ok(events.len())
    }

    /// Waits for a commit notification that concerns this worker's partition (a lag
    /// counts: something may have been missed). Returns true when the source is gone.
    async fn wait_for_own_partition(&self, wake: &mut broadcast::Receiver<(Arc<str>, u64)>) -> bool {
        loop {
            match wake.recv().await {
                Ok((id, _)) if partition_for(id.as_bytes(), self.partitions) == self.partition => return false,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return false,
                Err(broadcast::error::RecvError::Closed) => return true,
            }
        }
    }

    fn fail(&self, reason: String) {
        tracing::error!(view = P::VIEW, partition = self.partition, %reason, "view partition stopped");
        *self.svc.partitions[self.partition as usize]
            .failure
            .lock()
            .expect("not poisoned") = Some(reason);
    }

    /// Applies `events` over `base` (what is committed) and returns the store batch:
    /// rows, index entries, checkpoint `next`.
    fn apply(
        &self,
        topic: &str,
        events: &[Decoded<SourceEvent<P>>],
        next: u64,
        base: &dyn Committed,
    ) -> Result<Batch, String> {
        let mut pending = Pending::default();
        self.fold(&mut pending, topic, events, base)?;
        let view = self.svc.storage.as_str();
        let mut batch = Batch::with_capacity(pending.rows.len() * 3 + 1);
        for (key, doc) in pending.rows {
            match doc {
                Some(doc) => batch.put_view_row(view, &key, &serde_json::to_vec(&doc).expect("JSON values serialize")),
                None => batch.delete_view_row(view, &key),
            }
        }
        for ((i, value, entry), row) in &pending.entries {
            let idx = &self.svc.indexes[*i];
            match row {
                Some(key) => batch.put_view_entry(view, idx.name, value, key, idx.unique),
                None => batch.delete_view_entry(view, idx.name, value, entry, idx.unique),
            }
        }
        batch.put_meta(&view_checkpoint_key(view, topic, self.partition), next);
        Ok(batch)
    }

    /// Applies `events` over `pending` (changes not committed yet) over `base` (what is
    /// committed).
    fn fold(
        &self,
        pending: &mut Pending,
        topic: &str,
        events: &[Decoded<SourceEvent<P>>],
        base: &dyn Committed,
    ) -> Result<(), String> {
        let needs_old = self.needs_old(pending);
        for Decoded {
            offset,
            aggregate_id,
            version,
            event_type,
            timestamp_ms,
            payload,
        } in events
        {
            let at = || format!("{topic}/{}@{offset}", self.partition);
            let lookups: &dyn eventfold_core::Lookups = match self.svc.tables.get() {
                Some(t) => t,
                None => &eventfold_core::NoLookups,
            };
            let event = Event {
                aggregate_type: <P::Source as Aggregate>::TYPE,
                aggregate_id,
                version: *version,
                event_type,
                timestamp_ms: *timestamp_ms,
                payload,
                lookups,
            };
            let rows = Rows {
                pending: RefCell::new(&mut pending.rows),
                loaded: &pending.loaded,
                keep_loaded: needs_old,
                base,
                error: RefCell::new(None),
            };
            let mut changes = ViewChanges::new(&rows);
            self.projection.apply(&event, &mut changes);
            let (changes, errors) = changes.into_parts();
            if let Some(e) = rows.error.into_inner() {
                return Err(format!("while applying {}: {e}", at()));
            }
            if let Some(e) = errors.first() {
                return Err(format!("projection failed on {}: {e}", at()));
            }
            for (key, doc) in changes {
                if self.svc.scope == Scope::Partitioned && self.svc.partition_of(&key) != self.partition {
                    return Err(format!(
                        "view `{}` is partitioned, but applying {} writes row `{key}`, which belongs to partition {}: rows of a partitioned view must be keyed like their source aggregate (e.g. by its id); make the view Scope::Replicated to key rows otherwise",
                        P::VIEW,
                        at(),
                        self.svc.partition_of(&key)
                    ));
                }
                self.change(pending, base, key, doc).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Whether a change needs the row's previous document: only to move index entries
    /// (all of them, or only those of unique indexes when the caller derives the others
    /// from the final rows).
    fn needs_old(&self, pending: &Pending) -> bool {
        self.svc
            .indexes
            .iter()
            .any(|idx| idx.unique || !pending.derive_plain_entries)
    }

    /// Records one row change and the index entries it moves.
    fn change(&self, pending: &mut Pending, base: &dyn Committed, key: String, doc: Option<Value>) -> Result<()> {
        if !self.needs_old(pending) {
            let loaded = pending.loaded.get_mut();
            if !loaded.is_empty() {
                loaded.remove(&key);
            }
            pending.rows.insert(key, doc);
            return Ok(());
        }
        // Taken out (put back below with the new document): no copy of the old row.
        let old = match pending.rows.remove(&key) {
            Some(v) => v,
            None => match pending.loaded.get_mut().remove(&key) {
                Some(v) => v,
                None => base.row(&key)?,
            },
        };
        let key_str = key.as_str();
        for (i, idx) in self.svc.indexes.iter().enumerate() {
            if pending.derive_plain_entries && !idx.unique {
                continue;
            }
            // A value of the wrong type is not indexed (the same rule for old and new rows,
            // so what was indexed is exactly what is removed).
            let value = |d: &Option<Value>, warn: bool| -> Option<Vec<u8>> {
                match d.as_ref().map(|d| idx.extract(d)) {
                    Some(Ok(v)) => v.map(|v| encode_value(&v)),
                    Some(Err(e)) => {
                        if warn {
                            tracing::warn!(view = P::VIEW, key = key_str, error = %e, "row value not indexed");
                        }
                        None
                    }
                    None => None,
                }
            };
            let (was, now) = (value(&old, false), value(&doc, true));
            if was == now {
                continue;
            }
            let entry = |v: &[u8]| (i, v.to_vec(), if idx.unique { String::new() } else { key.clone() });
            if let Some(v) = was {
                if idx.unique {
                    if owner(pending, base, i, &v)?.as_deref() == Some(key_str) {
                        pending.entries.insert(entry(&v), None);
                        pending.owners.insert((i, v), None);
                    }
                } else {
                    pending.entries.insert(entry(&v), None);
                }
            }
            if let Some(v) = now {
                if idx.unique {
                    match owner(pending, base, i, &v)? {
                        Some(other) if other != key => {
                            self.svc.unique_conflicts[i].fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                view = P::VIEW,
                                index = idx.name,
                                key = key_str,
                                holder = %other,
                                "unique index value already held by another row; entry not overwritten"
                            );
                            continue;
                        }
                        _ => {}
                    }
                    pending.owners.insert((i, v.clone()), Some(key.clone()));
                }
                pending.entries.insert(entry(&v), Some(key.clone()));
            }
        }
        pending.rows.insert(key, doc);
        Ok(())
    }
}

/// The row holding `value` in unique index `i`, counting this batch's changes.
fn owner(pending: &Pending, base: &dyn Committed, i: usize, value: &[u8]) -> Result<Option<String>> {
    match pending.owners.get(&(i, value.to_vec())) {
        Some(o) => Ok(o.clone()),
        None => base.owner(i, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_fallback_poll_slows_down_while_a_partition_idles() {
        let base = Duration::from_millis(500);
        let polls: Vec<u128> = (0..7).map(|idle| idle_poll(base, idle).as_millis()).collect();
        assert_eq!(polls, [500, 500, 1000, 2000, 4000, 4000, 4000]);
        assert_eq!(idle_poll(base, u32::MAX), Duration::from_millis(4000));
    }

    /// Committed rows from a map.
    struct Base(HashMap<String, Value>);

    impl Committed for Base {
        fn row(&self, key: &str) -> Result<Option<Value>> {
            Ok(self.0.get(key).cloned())
        }

        fn owner(&self, _: usize, _: &[u8]) -> Result<Option<String>> {
            Ok(None)
        }
    }

    fn rows<'a>(
        pending: &'a mut HashMap<String, Option<Value>>,
        loaded: &'a RefCell<HashMap<String, Option<Value>>>,
        keep_loaded: bool,
        base: &'a Base,
    ) -> Rows<'a> {
        Rows {
            pending: RefCell::new(pending),
            loaded,
            keep_loaded,
            base,
            error: RefCell::new(None),
        }
    }

    fn bump(row: &mut Value) {
        row["n"] = json!(row["n"].as_u64().unwrap_or(0) + 1);
    }

    #[test]
    fn an_update_takes_a_pending_row_and_leaves_a_pending_deletion() {
        let base = Base(HashMap::from_iter([("gone".to_owned(), json!({"n": 7}))]));
        let mut pending = HashMap::from_iter([("a".to_owned(), Some(json!({"n": 1}))), ("gone".to_owned(), None)]);
        let loaded = RefCell::new(HashMap::default());
        let r = rows(&mut pending, &loaded, false, &base);
        let mut changes = ViewChanges::new(&r);
        changes.update("a", bump);
        changes.update("gone", bump);
        let (changes, errors) = changes.into_parts();
        drop(r);
        assert!(errors.is_empty());
        assert_eq!(
            changes,
            vec![("a".to_owned(), Some(json!({"n": 2})))],
            "the deleted row stays deleted"
        );
        assert!(!pending.contains_key("a"), "taken: its new version replaces it");
        assert_eq!(pending.get("gone"), Some(&None), "a deletion is not taken away");
    }

    #[test]
    fn with_old_rows_needed_an_update_copies_and_keeps_what_it_read() {
        let base = Base(HashMap::from_iter([("b".to_owned(), json!({"n": 3}))]));
        let mut pending = HashMap::from_iter([("a".to_owned(), Some(json!({"n": 1})))]);
        let loaded = RefCell::new(HashMap::default());
        let r = rows(&mut pending, &loaded, true, &base);
        let mut changes = ViewChanges::new(&r);
        changes.update("a", bump);
        changes.update("b", bump);
        changes.update("b", bump);
        let (changes, _) = changes.into_parts();
        drop(r);
        assert_eq!(
            changes,
            vec![
                ("a".to_owned(), Some(json!({"n": 2}))),
                ("b".to_owned(), Some(json!({"n": 4}))),
                ("b".to_owned(), Some(json!({"n": 5}))),
            ],
            "a second update of the same event sees the first"
        );
        assert_eq!(
            pending.get("a"),
            Some(&Some(json!({"n": 1}))),
            "the old row stays for the index entries"
        );
        assert_eq!(
            loaded.borrow().get("b"),
            Some(&Some(json!({"n": 3}))),
            "the committed row is kept"
        );
    }
}
