//! The partition processor: restore barrier, then batched command processing with one
//! commit unit per batch. One task per (aggregate type, partition); it is the only writer
//! of that partition's events, state and dedup records.

mod decide;

use crate::changelog::{self, EVENTS_BY_REFERENCE};
use crate::clock::Clock;
use crate::command::{Job, PartitionState, Topics};
use crate::error::{Error, Result};
use crate::metrics::{AggregateMetrics, CommandOutcome};
use crate::snapshot;
use decide::{Cached, Decision, Pending, Plan};
use eventfold_core::envelope::{Accepted, headers};
use eventfold_core::{Aggregate, Outcome, Position};
use eventfold_log::{CommitFuture, CommitUnit, Consumed, Log, MemberControl, Receipt};
use eventfold_store::Batch;
use foldhash::HashMap;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot};

/// Bytes of store writes a bulk restore gathers before it writes them.
const INGEST_BYTES: usize = 64 << 20;

/// Writes `data`, then `marks`, by ingestion on a blocking thread, holding `lock` until
/// both landed (even if the restore that asked is dropped meanwhile).
async fn ingest_restored(
    lock: Arc<tokio::sync::Mutex<()>>,
    store: eventfold_store::Store,
    data: Batch,
    marks: Batch,
) -> Result<()> {
    let guard = lock.lock_owned().await;
    let written = tokio::task::spawn_blocking(move || {
        let _guard = guard;
        store.ingest(data)?;
        store.ingest(marks)
    })
    .await;
    match written {
        Ok(r) => Ok(r?),
        Err(e) => Err(Error::Unavailable(format!("the restore's write task failed: {e}"))),
    }
}

/// Adds the store writes of changelog `records` of `topic`/`partition` to `data`: an
/// events record is kept (per-entity reads) and marked in `marks`; a state record only
/// changes the local tables (the copy's end is recorded by the caller).
fn apply_changelog<A: Aggregate>(
    data: &mut Batch,
    marks: &mut Batch,
    topic: &str,
    partition: u32,
    events: bool,
    records: &[(u64, eventfold_core::Record)],
) -> Result<()> {
    for (offset, r) in records {
        let applied = if events {
            marks.put_log(topic, partition, *offset, r);
            changelog::apply_event_record(data, topic, partition, *offset, r)
        } else {
            changelog::apply_state_record(data, A::TYPE, partition, r)
        };
        applied.map_err(|reason| Error::Corrupt {
            table: "log",
            key: format!("{topic}/{partition}@{offset}"),
            reason,
        })?;
    }
    Ok(())
}

/// The pause before retry `attempt` of a restore (grows to 5 s).
fn retry_pause(attempt: u32) -> Duration {
    Duration::from_millis(500).saturating_mul(attempt.min(10))
}

/// Sleeps `d` unless a control arrives first, which is returned.
async fn pause(d: Duration, control: &mut Option<mpsc::UnboundedReceiver<Control>>) -> Option<Control> {
    let Some(ctl) = control.as_mut() else {
        tokio::time::sleep(d).await;
        return None;
    };
    tokio::select! {
        () = tokio::time::sleep(d) => None,
        c = ctl.recv() => {
            if c.is_none() {
                *control = None;
            }
            c
        }
    }
}

/// Runs `work` unless a control arrives first: then `work` is dropped (restores and
/// recoveries are idempotent: they start over from the store's checkpoints) and the
/// control is returned, so that a revocation never waits for a restore that retries while
/// the broker is away, or for a long one.
async fn unless_control<T>(
    work: impl std::future::Future<Output = T>,
    control: &mut Option<mpsc::UnboundedReceiver<Control>>,
) -> Result<T, Control> {
    tokio::pin!(work);
    let closed = match control.as_mut() {
        None => true,
        Some(ctl) => tokio::select! {
            biased;
            c = ctl.recv() => match c {
                Some(c) => return Err(c),
                None => true,
            },
            r = &mut work => return Ok(r),
        },
    };
    if closed {
        *control = None;
    }
    Ok(work.await)
}

/// Ownership changes a processor gets from the consumer group (Kafka mode).
pub(crate) enum Control {
    /// The partition is this instance's now: restore, then take commands-topic records
    /// of epoch `epoch` on.
    Assign { epoch: u64 },
    /// The partition goes to another instance: finish what is in flight (commit or fail),
    /// forget the working state, answer `done`.
    Revoke { done: oneshot::Sender<()> },
}

/// Partition status shared with the service (lock-free reads on the request path).
#[derive(Debug, Default)]
pub(crate) struct PartitionShared {
    state: AtomicU8,
    /// The next commands-topic offset to consume (committed or in flight), plus one; 0:
    /// unknown (not owned, or no consumer group).
    consumed: AtomicU64,
    progress_permille: AtomicU32,
    failure: Mutex<Option<String>>,
    /// Aggregates the processor keeps in memory (`RuntimeOptions::cache_limit`).
    cached: AtomicU64,
}

impl PartitionShared {
    pub fn state(&self) -> PartitionState {
        match self.state.load(Ordering::Acquire) {
            0 => PartitionState::Restoring,
            1 => PartitionState::Ready,
            3 => PartitionState::Remote,
            _ => PartitionState::Failed,
        }
    }
    fn set_state(&self, s: PartitionState) {
        let v = match s {
            PartitionState::Restoring => 0,
            PartitionState::Ready => 1,
            PartitionState::Failed => 2,
            PartitionState::Remote => 3,
        };
        self.state.store(v, Ordering::Release);
    }
    pub fn progress(&self) -> f64 {
        f64::from(self.progress_permille.load(Ordering::Relaxed)) / 1000.0
    }
    fn set_progress(&self, fraction: f64) {
        self.progress_permille
            .store((fraction.clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
    }
    /// Aggregates the processor keeps in memory.
    pub fn cached(&self) -> u64 {
        self.cached.load(Ordering::Relaxed)
    }
    /// The next commands-topic offset this partition consumes, when it is known here.
    pub fn consumed(&self) -> Option<u64> {
        self.consumed.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Marks the partition restoring (its assignment is on the way to the processor).
    pub fn restoring(&self) {
        self.set_progress(0.0);
        self.set_state(PartitionState::Restoring);
    }
    pub fn failure(&self) -> String {
        self.failure.lock().expect("not poisoned").clone().unwrap_or_default()
    }
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
type Reply = oneshot::Sender<Result<Outcome>>;

/// A job's command, apart from its caller's reply channel.
fn split<A: Aggregate>(job: Job<A>) -> (decide::Command<A::Command>, Reply) {
    let Job {
        aggregate_id,
        command_id,
        correlation_id,
        causation_id,
        command,
        expected_version,
        consumed,
        keyed,
        epoch,
        reply_partition,
        reply,
    } = job;
    let meta = decide::Meta {
        aggregate_id,
        command_id,
        correlation_id,
        causation_id,
        expected_version,
        consumed,
        keyed,
        epoch,
        reply_partition,
    };
    (decide::Command { meta, body: command }, reply)
}

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
    /// The store is a cache of the log: write changelog records, restore from them.
    changelog: bool,
    /// Held by a restore's bulk write to the store until it lands, which may be after the
    /// restore was dropped (a revocation): the next restore waits for it before it reads
    /// where the store stopped.
    ingesting: Arc<tokio::sync::Mutex<()>>,
    /// Why the partition is recovering from a failed commit (Kafka: the transaction was
    /// aborted or its outcome is unknown; the committed state is intact in the topics).
    recovering: Option<String>,
    /// The consumer group member that feeds the commands topic (Kafka mode): a recovery
    /// seeks it back to the committed offset.
    pub(crate) member: Option<Arc<std::sync::OnceLock<Arc<dyn MemberControl>>>>,
    /// Whether this instance owns the partition (always, without a consumer group).
    owned: bool,
    /// Ownership comes from a consumer group: every written unit carries the consumed
    /// offset, whose commit checks the group generation.
    fenced_by_group: bool,
    /// Records of the commands topic fetched before this epoch were handed over before
    /// the last assignment or recovery: dropped (the group member reads them again).
    min_epoch: u64,
    /// The highest consumed offset committed or in flight: a record read again after a
    /// recovery never moves the committed offset back.
    consumed_hwm: u64,
}

impl<A: Aggregate> Processor<A> {
    pub fn new(
        cfg: ProcessorConfig<A>,
        log: Arc<dyn Log>,
        clock: Arc<dyn Clock>,
        shared: Arc<PartitionShared>,
        metrics: Arc<AggregateMetrics>,
        notify: broadcast::Sender<(Arc<str>, u64)>,
    ) -> Self {
        let changelog = log.coordination().is_some();
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
            changelog,
            ingesting: Arc::new(tokio::sync::Mutex::new(())),
            recovering: None,
            member: None,
            owned: true,
            fenced_by_group: false,
            min_epoch: 0,
            consumed_hwm: 0,
        }
    }

    /// Sets the partition's state, and tells the log whether this instance alone writes
    /// the partition's events now: when ready, it owns the partition and restored it
    /// (`Coordinated::set_sole_writer`, which spares the views' reads at the end a request to
    /// the broker in Kafka mode).
    fn set_state(&self, state: PartitionState) {
        let ready = state == PartitionState::Ready;
        if let Some(c) = self.log.coordination() {
            c.set_sole_writer(&self.cfg.topics.events, self.cfg.partition, ready);
        }
        self.shared.set_state(state);
    }

    fn fail(&self, reason: String) {
        tracing::error!(aggregate = A::TYPE, partition = self.cfg.partition, %reason, "partition stopped");
        *self.shared.failure.lock().expect("not poisoned") = Some(reason);
        self.set_state(PartitionState::Failed);
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
    /// channel (Kafka mode) the partition starts unowned and follows the consumer group's
    /// assignments and revocations.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Job<A>>, mut control: Option<mpsc::UnboundedReceiver<Control>>) {
        if control.is_some() {
            self.owned = false;
            self.fenced_by_group = true;
            self.set_state(PartitionState::Remote);
        } else if let Err(e) = self.restore().await {
            self.fail(format!("restore failed: {e}"));
        }
        let mut sweep = tokio::time::interval(self.cfg.dedup_sweep_every);
        sweep.tick().await;
        let mut jobs = Vec::with_capacity(self.cfg.max_batch);
        let mut open = true;
        let mut revoking: Option<oneshot::Sender<()>> = None;
        // A control that arrived while the processor was busy restoring.
        let mut pending: Option<Control> = None;
        while open || !self.inflight.is_empty() {
            match pending.take() {
                Some(Control::Assign { epoch }) => {
                    pending = self.assign(epoch, &mut control).await;
                    continue;
                }
                Some(Control::Revoke { done }) => revoking = Some(done),
                None => {}
            }
            if self.inflight.is_empty()
                && let Some(done) = revoking.take()
            {
                self.release();
                let _ = done.send(());
            }
            if self.owned && self.recovering.is_some() && self.inflight.is_empty() {
                pending = self.recover(&mut control).await;
                if pending.is_some() {
                    continue;
                }
            }
            let can_take =
                open && self.recovering.is_none() && revoking.is_none() && self.inflight.len() < self.cfg.max_inflight;
            tokio::select! {
                biased;
                c = async { control.as_mut().expect("checked").recv().await }, if control.is_some() && revoking.is_none() => {
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
                    if self.shared.state() == PartitionState::Ready {
                        self.expire_dedup();
                    }
                }
            }
        }
    }

    /// Processes the jobs received: refused if the partition is not this instance's or
    /// failed, else decided and committed as a batch.
    fn take(&mut self, jobs: &mut Vec<Job<A>>) {
        if !self.owned {
            // Queued before a revocation, or sent while the service still took the
            // partition for ours: the caller sends it to the owner.
            for job in jobs.drain(..) {
                if job.consumed.is_none() {
                    let _ = job.reply.send(Err(Error::NotOwner {
                        aggregate: A::TYPE.into(),
                        partition: self.cfg.partition,
                    }));
                }
            }
            return;
        }
        if self.shared.state() == PartitionState::Failed {
            let err = self.failed_error();
            self.metrics.count(CommandOutcome::Error, jobs.len() as u64);
            for job in jobs.drain(..) {
                let _ = job.reply.send(Err(clone_err(&err)));
            }
            return;
        }
        let batch = std::mem::replace(jobs, Vec::with_capacity(self.cfg.max_batch));
        if let Err(fatal) = self.build(batch) {
            self.fail(fatal);
        }
    }

    /// After a failed commit, once nothing is in flight: lifts the log's fence, restores
    /// the partition from the committed state (retrying while the broker is away) and has
    /// the commands-topic source read again what was not committed.
    ///
    /// A control that arrives meanwhile (the group revoked the partition), during an
    /// attempt or between attempts, ends it and is returned.
    async fn recover(&mut self, control: &mut Option<mpsc::UnboundedReceiver<Control>>) -> Option<Control> {
        let p = self.cfg.partition;
        let mut attempt = 0u32;
        loop {
            self.clear_cache();
            let attempt_run = async {
                match async { self.log.require_coordination()?.resume(p).await }.await {
                    Ok(()) => self.restore().await,
                    Err(e) => Err(e.into()),
                }
            };
            let result = match unless_control(attempt_run, control).await {
                Ok(r) => r,
                Err(c) => {
                    self.recovering = None;
                    return Some(c);
                }
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    if let Error::Log(eventfold_log::Error::Closed(_) | eventfold_log::Error::Config(_)) = &e {
                        self.recovering = None;
                        self.fail(format!("cannot recover from a failed commit: {e}"));
                        return None;
                    }
                    attempt += 1;
                    tracing::warn!(aggregate = A::TYPE, partition = p, attempt, error = %e, "recovery failed; retrying");
                    self.set_state(PartitionState::Restoring);
                    if let Some(c) = pause(retry_pause(attempt), control).await {
                        self.recovering = None;
                        return Some(c);
                    }
                }
            }
        }
        // The records read again start at the committed offset.
        self.set_consumed(0);
        self.rewind().await;
        let reason = self.recovering.take().unwrap_or_default();
        tracing::info!(aggregate = A::TYPE, partition = p, after = %reason, "partition recovered");
        None
    }

    /// Has the group member fetch the commands topic again from the committed offset;
    /// records fetched before are dropped (older epoch). A partition that is no longer
    /// assigned is left alone (its revocation is on the way).
    async fn rewind(&mut self) {
        let Some(member) = self.member.as_ref().and_then(|cell| cell.get()).cloned() else {
            return;
        };
        let (p, topic) = (self.cfg.partition, self.cfg.topics.commands.clone());
        loop {
            let from = match self.log.committed_offset(&self.cfg.group, &topic, p).await {
                Ok(o) => o.unwrap_or(0),
                Err(e) => {
                    tracing::warn!(aggregate = A::TYPE, partition = p, error = %e, "cannot read the committed offset; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let (m, t) = (member.clone(), topic.clone());
            match tokio::task::spawn_blocking(move || m.seek(&t, p, from)).await {
                Ok(Ok(epoch)) => {
                    self.min_epoch = epoch;
                    self.set_consumed(from);
                    return tracing::info!(
                        aggregate = A::TYPE,
                        partition = p,
                        from,
                        "commands read again from the committed offset"
                    );
                }
                Ok(Err(eventfold_log::Error::Config(reason))) => {
                    return tracing::info!(aggregate = A::TYPE, partition = p, %reason, "no rewind");
                }
                Ok(Err(e)) => {
                    tracing::warn!(aggregate = A::TYPE, partition = p, error = %e, "cannot rewind the commands topic; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return tracing::error!(aggregate = A::TYPE, partition = p, error = %e, "rewind task failed"),
            }
        }
    }

    /// Takes the partition: waits for the group's stable committed offset (a previous
    /// owner's transaction still completing holds it), then restores up to the end of
    /// what is committed, so nothing that previous owner committed is missed. A control
    /// that arrives meanwhile (the group revoked the partition again), while it works or
    /// while it waits to retry, ends it and is returned.
    async fn assign(&mut self, epoch: u64, control: &mut Option<mpsc::UnboundedReceiver<Control>>) -> Option<Control> {
        let p = self.cfg.partition;
        self.owned = true;
        self.min_epoch = epoch;
        self.set_consumed(0);
        self.clear_cache();
        self.recovering = None;
        *self.shared.failure.lock().expect("not poisoned") = None;
        self.set_state(PartitionState::Restoring);
        self.shared.set_progress(0.0);
        tracing::info!(
            aggregate = A::TYPE,
            partition = p,
            epoch,
            "partition assigned; restoring"
        );
        let mut attempt = 0u32;
        loop {
            // Nothing of an earlier ownership is in flight (a revocation waits for it), so
            // a fence a failed commit left on the lane can go, and a failed producer is
            // rebuilt.
            if let Err(e) = async { self.log.require_coordination()?.resume(p).await }.await
                && !matches!(e, eventfold_log::Error::Config(_))
            {
                if let eventfold_log::Error::Closed(_) = e {
                    self.fail(format!("cannot take the partition: {e}"));
                    return None;
                }
                attempt += 1;
                tracing::warn!(aggregate = A::TYPE, partition = p, attempt, error = %e, "cannot resume the partition's lane; retrying");
                if let Some(c) = pause(retry_pause(attempt), control).await {
                    return Some(c);
                }
                continue;
            }
            let take = async {
                let stable = self
                    .log
                    .committed_offset(&self.cfg.group, &self.cfg.topics.commands, p)
                    .await;
                match stable {
                    Ok(committed) => {
                        self.set_consumed(committed.unwrap_or(0));
                        // The group's offsets are stable once the previous owner's
                        // transaction is decided, but Kafka marks its partitions one by
                        // one: wait until the events and state partitions are settled too,
                        // so that the restore below reads that transaction's records.
                        match self.settle().await {
                            Ok(()) => self.restore().await,
                            Err(e) => Err(e),
                        }
                    }
                    Err(e) => Err(e.into()),
                }
            };
            let result = match unless_control(take, control).await {
                Ok(r) => r,
                Err(c) => return Some(c),
            };
            match result {
                Ok(()) => return None,
                Err(e @ (Error::Store(_) | Error::Corrupt { .. })) => {
                    self.fail(format!("restore failed: {e}"));
                    return None;
                }
                Err(e) => {
                    attempt += 1;
                    tracing::warn!(aggregate = A::TYPE, partition = p, attempt, error = %e, "restore after assignment failed; retrying");
                    self.set_state(PartitionState::Restoring);
                    if let Some(c) = pause(retry_pause(attempt), control).await {
                        return Some(c);
                    }
                }
            }
        }
    }

    /// Sets the consumed offset (see `consumed_hwm`), published for `/v1/cluster` when a
    /// consumer group feeds the partition.
    fn set_consumed(&mut self, next: u64) {
        self.consumed_hwm = next;
        let shown = if self.fenced_by_group && self.owned {
            next + 1
        } else {
            0
        };
        self.shared.consumed.store(shown, Ordering::Relaxed);
    }

    /// Waits (bounded) until the transactions open on the events and state partitions
    /// are decided (see `Coordinated::settle`).
    async fn settle(&mut self) -> Result<()> {
        let (log, p) = (self.log.clone(), self.cfg.partition);
        for topic in [self.cfg.topics.events.clone(), self.cfg.topics.state.clone()] {
            log.require_coordination()?.settle(&topic, p).await?;
        }
        Ok(())
    }

    /// Gives the partition up once nothing is in flight.
    fn release(&mut self) {
        tracing::info!(
            aggregate = A::TYPE,
            partition = self.cfg.partition,
            "partition released"
        );
        self.owned = false;
        self.clear_cache();
        self.recovering = None;
        self.set_consumed(0);
        *self.shared.failure.lock().expect("not poisoned") = None;
        self.set_state(PartitionState::Remote);
        self.shared.set_progress(0.0);
    }

    /// The barrier: the partition takes commands only once this returns Ok.
    async fn restore(&mut self) -> Result<()> {
        let started = Instant::now();
        self.set_state(PartitionState::Restoring);
        self.shared.set_progress(0.0);
        let p = self.cfg.partition;
        if self.changelog {
            self.replay_changelogs().await?;
        }
        self.events_end = self.log.end_offset(&self.cfg.topics.events, p).await?;
        // Verify the newest event is readable: a torn or corrupt tail stops here, loudly.
        if self.events_end > 0 {
            self.log
                .read(&self.cfg.topics.events, p, self.events_end - 1, 1)
                .await?;
        }
        self.shared.set_progress(0.5);
        self.expire_dedup();
        self.shared.set_progress(1.0);
        self.set_state(PartitionState::Ready);
        tracing::debug!(
            aggregate = A::TYPE,
            partition = p,
            events = self.events_end,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "partition restored"
        );
        Ok(())
    }

    /// Brings the local store up to the log: the events partition (per-entity index and
    /// record cache) and the state partition (states and outcomes), from where the store
    /// stopped to the end taken now. Progress goes from 0 to 0.5 in `/readyz`.
    ///
    /// A long span (`bulk_min_records`: a new instance, or one long away) is written by
    /// bulk ingestion, in parts of [`INGEST_BYTES`]: new table files instead of the
    /// journal and memtables, several times cheaper. Each part lands in two steps, the
    /// records that say how far the store got (the events cache; the state topic's end)
    /// after the rest, so a crash in between replays that part again (every write is a
    /// put of the same value).
    async fn replay_changelogs(&mut self) -> Result<()> {
        let p = self.cfg.partition;
        // A bulk write of an earlier, dropped restore lands before the store is read.
        drop(self.ingesting.lock().await);
        let topics = [self.cfg.topics.events.clone(), self.cfg.topics.state.clone()];
        // Touching the results topic provisions it, so that clients can subscribe to their
        // outcomes before the first command is committed.
        self.log.end_offset(&self.cfg.topics.results, p).await?;
        // The state topic's end is taken first: a transaction committed in between then
        // has its events inside the events' span too, so every outcome record restored
        // below refers to events that are restored before it.
        let mut spans = Vec::new();
        for t in topics.iter().rev() {
            let from = self.log.store().log_end(t, p)?;
            let end = self.log.end_offset(t, p).await?;
            spans.insert(0, (t.clone(), from, end));
        }
        let total: u64 = spans.iter().map(|(_, f, e)| e.saturating_sub(*f)).sum::<u64>().max(1);
        let mut done = 0u64;
        let mut replayed = 0usize;
        let started = Instant::now();
        for (i, (topic, mut from, end)) in spans.into_iter().enumerate() {
            let events = i == 0;
            let bulk = end.saturating_sub(from) >= self.cfg.bulk_min_records;
            // Store writes of the records read so far, and the marks of how far they go.
            let (mut data, mut marks) = (Batch::new(), Batch::new());
            while from < end {
                let records = self.log.read(&topic, p, from, 10_000).await?;
                let Some(last) = records.last().map(|(o, _)| *o) else {
                    break;
                };
                apply_changelog::<A>(&mut data, &mut marks, &topic, p, events, &records)?;
                done += last + 1 - from;
                replayed += records.len();
                from = last + 1;
                if !bulk || data.bytes() + marks.bytes() >= INGEST_BYTES || from >= end {
                    if !events {
                        marks.put_log_end(&topic, p, from);
                    }
                    let (data, marks) = (std::mem::take(&mut data), std::mem::take(&mut marks));
                    if bulk {
                        ingest_restored(self.ingesting.clone(), self.log.store().clone(), data, marks).await?;
                    } else {
                        let mut local = data;
                        local.append(marks);
                        self.log
                            .commit(CommitUnit {
                                local,
                                lane: Some(p),
                                ..Default::default()
                            })
                            .await?;
                    }
                }
                self.shared.set_progress(0.5 * done as f64 / total as f64);
            }
            if !data.is_empty() || !marks.is_empty() {
                // Only offsets without records were left (Kafka's transaction markers).
                if !events {
                    marks.put_log_end(&topic, p, from);
                }
                ingest_restored(self.ingesting.clone(), self.log.store().clone(), data, marks).await?;
            }
        }
        if replayed > 0 {
            tracing::info!(
                aggregate = A::TYPE,
                partition = p,
                records = replayed,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "local store restored from the changelog"
            );
        }
        Ok(())
    }

    /// Moves the store's dedup horizon to the start of the window: compactions of the
    /// `dedup` table drop the records before it (no deletes: an expiry index and its
    /// sweep cost an entry per command and two tombstones per expired one). Once per
    /// window, whichever partition claims it compacts the whole table, so expired records
    /// go even where too few writes come to compact them.
    fn expire_dedup(&self) {
        let now = self.clock.now_ms();
        let store = self.log.store();
        store.expire_dedup_before(now - self.cfg.dedup_window_ms);
        if store.claim_dedup_compaction(now, self.cfg.dedup_window_ms) {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                match store.compact_dedup() {
                    Ok(()) => tracing::info!(
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "dedup table compacted: records past the window removed"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "dedup table compaction failed; expired records stay until a later one")
                    }
                }
            });
        }
    }

    /// The position of the end of `id`'s version `version` (for replayed outcomes).
    fn position_of(&self, id: &str, version: u64) -> Result<String> {
        let topic = &self.cfg.topics.events;
        let off = if version == 0 {
            self.events_end
        } else {
            match self
                .log
                .store()
                .entity_events(topic, id.as_bytes(), version, 1)?
                .first()
            {
                Some(e) => e.offset + 1,
                None => self.events_end,
            }
        };
        Ok(Position::token_at(topic, self.cfg.partition, off))
    }

    /// The accepted outcome a dedup record of [`EVENTS_BY_REFERENCE`] stands for: its
    /// events read back from the store, checked to be `command_id`'s.
    fn referenced_outcome(&self, command_id: &str, reference: &[u8]) -> std::result::Result<Outcome, String> {
        let corrupt = |reason: String| format!("corrupt record in table `dedup` for command {command_id:?}: {reason}");
        let (version, count, aggregate_id) = changelog::decode_events_reference(reference).map_err(corrupt)?;
        let (count, aggregate_id) = (u64::from(count), aggregate_id.to_owned());
        let topic = &self.cfg.topics.events;
        let stored = if count == 0 {
            Vec::new()
        } else {
            self.log
                .store()
                .entity_events(topic, aggregate_id.as_bytes(), version - count + 1, count as usize)
                .map_err(|e| e.to_string())?
        };
        let mut events = Vec::with_capacity(stored.len());
        for (e, expected) in stored.iter().zip(version - count + 1..) {
            if e.version != expected || e.record.header(headers::COMMAND_ID) != Some(command_id.as_bytes()) {
                break;
            }
            events.push(crate::command::event_view(topic, e).map_err(|e| e.to_string())?);
        }
        if events.len() as u64 != count {
            return Err(corrupt(format!(
                "it refers to versions {}..={version} of {aggregate_id:?}, but the store holds {} of them written by this command",
                version - count + 1,
                events.len()
            )));
        }
        Ok(Outcome::Accepted(Accepted {
            aggregate_id,
            version,
            events,
            position: String::new(),
        }))
    }

    /// A stored outcome for `command_id`, if one is within the dedup window.
    fn stored_outcome(&self, command_id: &str, now: i64) -> std::result::Result<Option<Outcome>, String> {
        let Some(row) = self
            .log
            .store()
            .get_dedup(A::TYPE, self.cfg.partition, command_id)
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        if row.timestamp_ms < now - self.cfg.dedup_window_ms {
            return Ok(None);
        }
        let mut outcome = match row.outcome.split_first() {
            Some((&EVENTS_BY_REFERENCE, reference)) => self.referenced_outcome(command_id, reference)?,
            _ => serde_json::from_slice::<Outcome>(&row.outcome).map_err(|e| {
                format!("corrupt record in table `dedup` for command {command_id:?}: outcome does not decode: {e}")
            })?,
        };
        if let Outcome::Accepted(a) = &mut outcome {
            a.position = self
                .position_of(&a.aggregate_id, a.version)
                .map_err(|e| e.to_string())?;
        }
        Ok(Some(outcome))
    }

    /// Processes one batch and starts its commit: reads what deciding it needs, decides
    /// it ([`decide::decide`]), hands each caller to the slot that answers it, and commits
    /// the plan. `Err` is fatal for the partition.
    fn build(&mut self, jobs: Vec<Job<A>>) -> std::result::Result<(), String> {
        let now = self.clock.now_ms();
        let (commands, replies): (Vec<_>, Vec<_>) = jobs.into_iter().map(split).unzip();
        let mut plan = {
            let env = self.env(now);
            let pre = decide::prefetch(&commands, &env, |id| self.stored_outcome(id, now), |id| self.load(id));
            decide::decide(commands, pre, &env)
        };
        let mut replies = replies.into_iter();
        let slots = self.route(&plan.decisions, std::mem::take(&mut plan.slots), &mut replies);
        if let Some(reason) = plan.fatal.take() {
            self.fail_batch(slots, replies, &reason);
            return Err(reason);
        }
        self.commit_plan(plan, slots, now);
        Ok(())
    }

    /// What deciding a batch at `now` depends on besides its commands and reads.
    fn env(&self, now: i64) -> decide::Env<'_, A> {
        decide::Env {
            partition: self.cfg.partition,
            topics: &self.cfg.topics,
            config: &self.cfg.config,
            lookups: &self.cfg.tables,
            now,
            changelog: self.changelog,
            state_every: self.cfg.state_every,
            min_epoch: self.min_epoch,
            inflight: &self.inflight_ids,
        }
    }

    /// Aggregate `id`'s version and state: the cache's, else the store's.
    fn load(&self, id: &str) -> std::result::Result<(u64, A), String> {
        if let Some(c) = self.cache.get(id) {
            return Ok((c.version, c.state.clone()));
        }
        let loaded = snapshot::load::<A>(self.log.store(), &self.cfg.topics.events, id).map_err(|e| e.to_string())?;
        Ok(loaded.unwrap_or_default())
    }

    /// Hands each decided command's reply to the slot that answers it (of this batch, or
    /// of a batch still committing); a skipped command's is dropped. The replies of the
    /// commands not decided (a fatal error stopped the batch) stay in `replies`.
    fn route(
        &mut self,
        decisions: &[Decision],
        pending: Vec<Pending>,
        replies: &mut impl Iterator<Item = Reply>,
    ) -> Vec<Slot> {
        let mut slots: Vec<Slot> = pending
            .into_iter()
            .map(|pending| Slot {
                pending,
                replies: Vec::with_capacity(1),
            })
            .collect();
        let mut duplicates = 0;
        for (decision, reply) in decisions.iter().zip(replies.by_ref()) {
            match *decision {
                Decision::Skipped => {}
                Decision::InFlight(seq, i) => {
                    let batch = (seq - self.inflight_base) as usize;
                    self.inflight[batch].slots[i].replies.push(reply);
                    duplicates += 1;
                }
                Decision::Joined(i) => {
                    slots[i].replies.push(reply);
                    duplicates += 1;
                }
                Decision::Answered(i) => slots[i].replies.push(reply),
            }
        }
        if duplicates > 0 {
            self.metrics.count(CommandOutcome::Duplicate, duplicates);
        }
        slots
    }

    /// Nothing of a batch stopped by `reason` is committed: every caller of it (those of
    /// its slots, then the rest) learns why.
    fn fail_batch(&self, slots: Vec<Slot>, rest: impl Iterator<Item = Reply>, reason: &str) {
        let err = Error::PartitionFailed {
            aggregate: A::TYPE.into(),
            partition: self.cfg.partition,
            reason: reason.to_owned(),
        };
        let mut n = 0;
        for r in slots.into_iter().flat_map(|s| s.replies).chain(rest) {
            let _ = r.send(Err(clone_err(&err)));
            n += 1;
        }
        self.metrics.count(CommandOutcome::Error, n);
    }

    /// Applies a decided batch to the processor (cache, command ids in flight, consumed
    /// offset) and starts its commit; enqueued now, in batch order: the log commits this
    /// partition's units in order.
    fn commit_plan(&mut self, plan: Plan<A>, slots: Vec<Slot>, now: i64) {
        let p = self.cfg.partition;
        let mut unit = CommitUnit {
            appends: plan.appends,
            local: plan.local,
            lane: Some(p),
            ..CommitUnit::default()
        };
        self.cache.extend(plan.states);
        self.shared.cached.store(self.cache.len() as u64, Ordering::Relaxed);
        let seq = self.inflight_base + self.inflight.len() as u64;
        let commands: Vec<String> = (plan.commands.into_iter())
            .map(|(id, slot)| {
                self.inflight_ids.insert(id.clone(), (seq, slot));
                id
            })
            .collect();
        unit.consumed.extend(self.consume(plan.consumed, plan.written));
        if !plan.positioned.is_empty() {
            let then = decide::results_then(plan.positioned, &self.cfg.topics, p, self.events_end, now);
            unit.then = Some(then);
        }
        let commit = (plan.written > 0 || plan.consumed.is_some()).then(|| self.log.commit(unit));
        self.inflight.push_back(InFlight {
            commit,
            slots,
            commands,
            touched: plan.touched,
            written: plan.written,
            started: Instant::now(),
        });
    }

    /// Moves the consumed offset to `consumed` if that is further; the offset a unit
    /// writing `written` slots commits, if any.
    fn consume(&mut self, consumed: Option<u64>, written: usize) -> Option<Consumed> {
        let advanced = consumed.filter(|n| *n > self.consumed_hwm);
        if let Some(next_offset) = advanced {
            self.set_consumed(next_offset);
        }
        // With a consumer group, every unit that writes commits the partition's consumed
        // offset (unchanged if it consumed nothing): the broker checks the group generation
        // then, so an instance the group has moved on from (a zombie, e.g. one that was
        // paused) cannot write to a partition that another instance owns now.
        (advanced.is_some() || (self.fenced_by_group && written > 0)).then(|| Consumed {
            group: self.cfg.group.clone(),
            topic: self.cfg.topics.commands.clone(),
            partition: self.cfg.partition,
            next_offset: self.consumed_hwm,
        })
    }

    fn clear_cache(&mut self) {
        self.cache.clear();
        self.shared.cached.store(0, Ordering::Relaxed);
    }

    /// Empties the aggregate cache but for the aggregates that units still in flight
    /// changed: the store holds every other cached state (its last unit finished), so
    /// reloading one cannot go back to a version that is still committing. Under a
    /// steady load some unit is always in flight, so waiting until none is (as this did
    /// before) let the cache grow past its limit for as long as the load lasted.
    fn evict(&mut self) {
        if self.inflight.is_empty() {
            self.cache.clear();
        } else {
            let busy: HashSet<&str> = self
                .inflight
                .iter()
                .flat_map(|f| f.touched.iter().map(|(id, _)| &**id))
                .collect();
            self.cache.retain(|id, _| busy.contains(id.as_str()));
        }
        self.shared.cached.store(self.cache.len() as u64, Ordering::Relaxed);
    }

    /// Answers a batch whose commit failed: in Kafka mode the partition recovers from the
    /// committed state; embedded, it stops.
    fn commit_failed(&mut self, slots: Vec<Slot>, e: &str) {
        let p = self.cfg.partition;
        self.clear_cache();
        let reason = format!("commit failed: {e}");
        let err = if self.changelog {
            // Kafka holds the committed state: restore from it and go on (below,
            // once the units built on this one have failed too).
            if self.recovering.is_none() {
                tracing::warn!(aggregate = A::TYPE, partition = p, %reason, "partition recovers from a failed commit");
                self.set_state(PartitionState::Restoring);
                self.shared.set_progress(0.0);
                self.recovering = Some(reason);
            }
            Error::Restoring {
                aggregate: A::TYPE.into(),
                partition: p,
                progress_pct: 0.0,
                retry_after: Duration::from_secs(1),
            }
        } else {
            self.fail(reason.clone());
            Error::PartitionFailed {
                aggregate: A::TYPE.into(),
                partition: p,
                reason,
            }
        };
        for slot in slots {
            let outcome = match slot.pending {
                Pending::Ready(_, o) => o,
                Pending::Written { .. } => CommandOutcome::Error,
            };
            self.metrics.count(outcome, slot.replies.len() as u64);
            for r in slot.replies {
                let _ = r.send(Err(clone_err(&err)));
            }
        }
    }

    /// Answers a batch once its commit finished.
    fn finish(&mut self, done: InFlight, result: CommitResult) {
        let p = self.cfg.partition;
        for id in &done.commands {
            self.inflight_ids.remove(id);
        }
        if self.cache.len() > self.cfg.cache_limit {
            self.evict();
        }
        let receipt = match result {
            Ok(r) => r,
            Err(e) => return self.commit_failed(done.slots, &e),
        };
        if let Some(r) = &receipt {
            self.metrics
                .commit_latency
                .observe(done.started.elapsed().as_secs_f64());
            self.metrics.batch_size.observe(done.written as f64);
            if let Some(last) = r.offsets.last() {
                self.events_end = *last + 1;
            }
            for t in done.touched {
                let _ = self.notify.send(t);
            }
        }
        for slot in done.slots {
            let (result, counted) = match slot.pending {
                Pending::Ready(r, o) => (r, o),
                Pending::Written { mut outcome, appends } => {
                    let counted = match &mut outcome {
                        Outcome::Accepted(a) => {
                            let end = match (&receipt, appends.is_empty()) {
                                (Some(r), false) => r.offsets[appends.end - 1] + 1,
                                _ => self.events_end,
                            };
                            a.position = Position::token_at(&self.cfg.topics.events, p, end);
                            CommandOutcome::Accepted
                        }
                        Outcome::Rejected { .. } => CommandOutcome::Rejected,
                    };
                    (Ok(outcome), counted)
                }
            };
            self.metrics.count(counted, slot.replies.len() as u64);
            let mut replies = slot.replies;
            let first = replies.remove(0);
            for extra in replies {
                let _ = extra.send(clone_result(&result));
            }
            let _ = first.send(result);
        }
    }
}

fn clone_err(e: &Error) -> Error {
    match e {
        Error::PartitionFailed {
            aggregate,
            partition,
            reason,
        } => Error::PartitionFailed {
            aggregate: aggregate.clone(),
            partition: *partition,
            reason: reason.clone(),
        },
        Error::VersionMismatch { expected, actual } => Error::VersionMismatch {
            expected: *expected,
            actual: *actual,
        },
        Error::Restoring {
            aggregate,
            partition,
            progress_pct,
            retry_after,
        } => Error::Restoring {
            aggregate: aggregate.clone(),
            partition: *partition,
            progress_pct: *progress_pct,
            retry_after: *retry_after,
        },
        other => Error::Log(eventfold_log::Error::Closed(other.to_string())),
    }
}

fn clone_result(r: &Result<Outcome>) -> Result<Outcome> {
    match r {
        Ok(o) => Ok(o.clone()),
        Err(e) => Err(clone_err(e)),
    }
}
