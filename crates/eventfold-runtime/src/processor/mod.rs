//! The partition processor: restore barrier, then batched command processing with one
//! commit unit per batch. One task per (aggregate type, partition); it is the only writer
//! of that partition's events, state and dedup records.
//!
//! This module holds the processor's state and its run loop; the rest is split by
//! responsibility, each an `impl` block of [`Processor`] or a module the processor uses:
//!
//! - `phase`: the partition's lifecycle (one enum, one transition function), pure.
//! - `durability`: what differs between the embedded log and Kafka, chosen at build time.
//! - `batch`: a batch's reads (prefetch), its decision (`decide`, pure) and its routing.
//! - `commit`: a decided batch's commit unit, and the answers once it finished.
//! - `restore`: the restore barrier; `replay`: the changelogs' replay into the store.
//! - `ownership`: assignment, revocation and recovery (Kafka).
//! - `shared`: what the processor publishes to the service.

mod batch;
mod commit;
mod decide;
mod durability;
mod ownership;
mod phase;
mod replay;
mod restore;
mod shared;

pub(crate) use shared::PartitionShared;

use crate::clock::Clock;
use crate::command::{Job, PartitionState, Topics};
use crate::error::Error;
use crate::metrics::AggregateMetrics;
use decide::{Cached, Pending};
use durability::{Durability, Member};
use eventfold_core::{Aggregate, Outcome};
use eventfold_log::{CommitFuture, Log, Receipt};
use foldhash::HashMap;
use phase::{Event, Phase};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot};

/// Ownership changes a processor gets from the consumer group (Kafka mode).
pub(crate) enum Control {
    /// The partition is this instance's now: restore, then take commands-topic records
    /// of epoch `epoch` on.
    Assign { epoch: u64 },
    /// The partition goes to another instance: finish what is in flight (commit or fail),
    /// forget the working state, answer `done`.
    Revoke { done: oneshot::Sender<()> },
}

/// Knobs the processor needs.
#[derive(Clone)]
pub(crate) struct ProcessorConfig<A: Aggregate> {
    pub partition: u32,
    pub topics: Topics,
    pub config: A::Config,
    pub max_batch: usize,
    pub dedup_window_ms: i64,
    pub dedup_sweep_every: Duration,
    pub cache_limit: usize,
    pub max_inflight: usize,
    /// Consumer group of the commands topic (Kafka mode).
    pub group: String,
    /// A changelog span at least this long is restored by bulk ingestion.
    pub bulk_min_records: u64,
    /// The lookup tables `handle` reads.
    pub tables: crate::lookup::Tables,
    /// The store keeps an aggregate's state every this many versions (see `snapshot`).
    pub state_every: u64,
}

/// What answers a command of a batch, and the callers waiting for it.
struct Slot {
    pending: Pending,
    replies: Vec<Reply>,
}

/// Where a command's caller waits for its outcome.
type Reply = oneshot::Sender<crate::error::Result<Outcome>>;

/// A batch whose commit is under way. Batches are answered strictly in order.
struct InFlight {
    commit: Option<CommitFuture>,
    slots: Vec<Slot>,
    /// Command ids written by this batch (deduplicated in memory until it commits).
    commands: Vec<String>,
    /// Aggregates touched, with their new versions (notified after the commit).
    touched: Vec<(Arc<str>, u64)>,
    written: usize,
    started: Instant,
}

type CommitResult = std::result::Result<Option<Receipt>, String>;

/// The result of the oldest batch's commit, once it finished (at once if it wrote nothing).
async fn front(queue: &mut VecDeque<InFlight>) -> CommitResult {
    match queue.front_mut().and_then(|f| f.commit.as_mut()) {
        None => Ok(None),
        Some(commit) => match commit.await {
            Ok(receipt) => Ok(Some(receipt)),
            Err(e) => Err(e.to_string()),
        },
    }
}

pub(crate) struct Processor<A: Aggregate> {
    cfg: ProcessorConfig<A>,
    log: Arc<dyn Log>,
    clock: Arc<dyn Clock>,
    shared: Arc<PartitionShared>,
    metrics: Arc<AggregateMetrics>,
    notify: broadcast::Sender<(Arc<str>, u64)>,
    /// Latest state per aggregate, including batches still committing: the next batch
    /// builds on them. If a commit fails the partition stops, so nothing is built on a
    /// state that did not become durable.
    cache: HashMap<String, Cached<A>>,
    inflight: VecDeque<InFlight>,
    /// Command id of a keyed command -> (index into `inflight` counted from `inflight_base`, slot).
    inflight_ids: HashMap<String, (u64, usize)>,
    inflight_base: u64,
    events_end: u64,
    /// What the backend makes of a commit and a restore, chosen once, when built.
    durability: Durability,
    /// Where the partition is in its lifecycle; changed only by [`Processor::transition`].
    phase: Phase,
    /// Held by a restore's bulk write to the store until it lands, which may be after the
    /// restore was dropped (a revocation): the next restore waits for it before it reads
    /// where the store stopped.
    ingesting: Arc<tokio::sync::Mutex<()>>,
    /// Records of the commands topic fetched before this epoch were handed over before
    /// the last assignment or recovery: dropped (the group member reads them again).
    min_epoch: u64,
    /// The highest consumed offset committed or in flight: a record read again after a
    /// recovery never moves the committed offset back.
    consumed_hwm: u64,
}

impl<A: Aggregate> Processor<A> {
    /// A processor of `log`'s backend (see [`Durability::of`]); `member` is the consumer
    /// group member that feeds the commands topic (Kafka mode), once there is one.
    pub fn new(
        cfg: ProcessorConfig<A>,
        log: Arc<dyn Log>,
        clock: Arc<dyn Clock>,
        shared: Arc<PartitionShared>,
        metrics: Arc<AggregateMetrics>,
        notify: broadcast::Sender<(Arc<str>, u64)>,
        member: Member,
    ) -> Self {
        let durability = Durability::of(&*log, member);
        Self {
            cfg,
            log,
            clock,
            shared,
            metrics,
            notify,
            cache: HashMap::default(),
            inflight: VecDeque::new(),
            inflight_ids: HashMap::default(),
            inflight_base: 0,
            events_end: 0,
            phase: durability.first_phase(),
            durability,
            ingesting: Arc::new(tokio::sync::Mutex::new(())),
            min_epoch: 0,
            consumed_hwm: 0,
        }
    }

    /// Moves the lifecycle on by `event` ([`Phase::on`]) and publishes a new phase. A
    /// refused transition is a bug: asserted in debug builds, logged, and the phase stays.
    fn transition(&mut self, event: Event) {
        match self.phase.on(event) {
            Ok(next) if next == self.phase => {}
            Ok(next) => {
                self.phase = next;
                self.publish();
            }
            Err(refused) => {
                debug_assert!(false, "{refused}");
                tracing::error!(aggregate = A::TYPE, partition = self.cfg.partition, %refused, "lifecycle bug");
            }
        }
    }

    /// Publishes what the phase shows, and tells the log whether this instance alone
    /// writes the partition's events now (when ready).
    fn publish(&self) {
        let shown = self.phase.shown();
        let (log, topics, p) = (&*self.log, &self.cfg.topics, self.cfg.partition);
        (self.durability).set_sole_writer(log, topics, p, shown == PartitionState::Ready);
        self.shared.set_state(shown);
    }

    /// Stops the partition: every job is refused with `reason` until it is assigned again.
    fn stop(&mut self, reason: String) {
        tracing::error!(aggregate = A::TYPE, partition = self.cfg.partition, %reason, "partition stopped");
        self.shared.set_failure(Some(reason));
        self.transition(Event::Stopped);
    }

    fn failed_error(&self) -> Error {
        Error::PartitionFailed {
            aggregate: A::TYPE.into(),
            partition: self.cfg.partition,
            reason: self.shared.failure(),
        }
    }

    /// Runs until the queue closes: restore, then batches, with up to `max_inflight`
    /// commits under way so that processing overlaps with fsync. With a `control`
    /// channel (Kafka mode) the partition starts remote and follows the consumer group's
    /// assignments and revocations.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Job<A>>, mut control: Option<mpsc::UnboundedReceiver<Control>>) {
        debug_assert_eq!(
            control.is_some(),
            self.durability.replicated(),
            "a consumer group owns the partitions of a replicated log, and only those"
        );
        self.publish();
        if self.phase == Phase::Restoring
            && let Err(e) = self.restore().await
        {
            self.stop(format!("restore failed: {e}"));
        }
        let mut sweep = tokio::time::interval(self.cfg.dedup_sweep_every);
        sweep.tick().await;
        let mut jobs = Vec::with_capacity(self.cfg.max_batch);
        let mut open = true;
        // Who waits for a revocation (while revoking).
        let mut revoked: Option<oneshot::Sender<()>> = None;
        // A control that arrived while the processor was busy restoring.
        let mut pending: Option<Control> = None;
        while open || !self.inflight.is_empty() {
            match pending.take() {
                Some(Control::Assign { epoch }) => {
                    pending = self.assign(epoch, &mut control).await;
                    continue;
                }
                Some(Control::Revoke { done }) => {
                    self.transition(Event::Revoked);
                    revoked = Some(done);
                }
                None => {}
            }
            debug_assert_eq!(
                revoked.is_some(),
                matches!(self.phase, Phase::Revoking { .. }),
                "ordering: a revocation is answered once, after the commits in flight"
            );
            if self.inflight.is_empty()
                && let Some(done) = revoked.take()
            {
                self.release();
                let _ = done.send(());
            }
            if matches!(self.phase, Phase::Recovering { .. }) && self.inflight.is_empty() {
                pending = self.recover(&mut control).await;
                if pending.is_some() {
                    continue;
                }
            }
            let can_take = open && self.phase.takes_jobs() && self.inflight.len() < self.cfg.max_inflight;
            tokio::select! {
                biased;
                c = async { control.as_mut().expect("checked").recv().await }, if control.is_some() && self.phase.takes_control() => {
                    match c {
                        Some(c) => pending = Some(c),
                        None => control = None,
                    }
                }
                result = front(&mut self.inflight), if !self.inflight.is_empty() => {
                    let done = self.inflight.pop_front().expect("front exists");
                    self.inflight_base += 1;
                    self.finish(done, result);
                }
                n = rx.recv_many(&mut jobs, self.cfg.max_batch), if can_take => {
                    if n == 0 {
                        open = false;
                    } else {
                        self.take(&mut jobs);
                    }
                }
                _ = sweep.tick(), if open => {
                    if self.phase.shown() == PartitionState::Ready {
                        self.expire_dedup();
                    }
                }
            }
        }
    }
}
