//! [`ViewService`], the handle of one view: its partitions' progress and readiness,
//! reports and metrics, and its construction from the stored checkpoints.

use super::options::ViewOptions;
use super::storage::storage_name;
use crate::command::Topics;
use crate::lookup::Tables;
use crate::service::AggregateService;
use eventfold_core::partition::partition_for;
use eventfold_core::projection::Join;
use eventfold_core::{Aggregate, Index, Position, Projection, Scope};
use eventfold_log::Log;
use eventfold_store::{Store, view_checkpoint_key};
use serde::Serialize;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::watch;

pub(super) struct PartitionProgress {
    pub(super) applied: watch::Sender<u64>,
    pub(super) failure: Mutex<Option<String>>,
    /// Set once the worker has applied the source up to its end offset at start.
    pub(super) caught_up: AtomicBool,
    /// That end offset (`u64::MAX` until the worker has read it).
    pub(super) target: AtomicU64,
    /// A query waits for an offset not applied yet (`min_position`): the worker cuts its
    /// linger short (a permit stored while it is not lingering cuts the next one).
    pub(super) hurry: tokio::sync::Notify,
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
    pub(super) name: &'static str,
    /// The projection's version, and the name its rows, entries and checkpoints are
    /// stored under ([`storage_name`]).
    pub(super) version: u32,
    pub(super) storage: String,
    /// Set when a newer version took over: the workers stop.
    pub(super) retired: AtomicBool,
    pub(super) workers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub(super) source: Topics,
    /// The source aggregate type.
    pub(super) source_type: &'static str,
    pub(super) scope: Scope,
    /// The source's service, which knows the partitions this instance owns (live
    /// partitioned views only; `None`: every partition is applied and served here).
    pub(super) owner: Option<Arc<dyn AggregateService>>,
    pub(super) indexes: Vec<Index>,
    pub(super) store: Store,
    pub(super) options: ViewOptions,
    pub(super) partitions: Vec<PartitionProgress>,
    pub(super) unique_conflicts: Vec<AtomicU64>,
    /// Partitions catching up in bulk at once (`rebuild_threads`).
    pub(super) bulk: Arc<tokio::sync::Semaphore>,
    /// Fields filled from lookup tables when rows are read.
    pub(super) joins: Vec<Join>,
    /// The lookup tables the joins read (set by the runtime once every view exists; an
    /// offline rebuild has none and serves nothing).
    pub(super) tables: OnceLock<Tables>,
}

impl std::fmt::Debug for ViewService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewService")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
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

    /// Gives the view its lookup tables (once).
    pub(crate) fn set_tables(&self, tables: Tables) {
        let _ = self.tables.set(tables);
    }

    /// The joins of its rows.
    pub fn joins(&self) -> &[Join] {
        &self.joins
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
pub(super) fn service<P: Projection>(
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
