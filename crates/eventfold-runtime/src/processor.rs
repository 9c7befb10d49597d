//! The partition processor: restore barrier, then batched command processing with one
//! commit unit per batch. One task per (aggregate type, partition); it is the only writer
//! of that partition's events, state and dedup records.

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::metrics::{AggregateMetrics, CommandOutcome};
use crate::service::{PartitionState, Topics};
use eventfold_core::envelope::{Accepted, headers};
use eventfold_core::{Aggregate, Context, EventView, Outcome, Position, Record, Reject, codec, time::rfc3339_ms};
use eventfold_log::{Append, CommitUnit, Log};
use eventfold_store::Batch;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot};

/// A decoded command waiting for its partition.
pub(crate) struct Job<A: Aggregate> {
    pub aggregate_id: String,
    pub command_id: String,
    pub correlation_id: String,
    pub command: A::Command,
    pub expected_version: Option<u64>,
    pub reply: oneshot::Sender<Result<Outcome>>,
}

/// Partition status shared with the service (lock-free reads on the request path).
#[derive(Debug, Default)]
pub(crate) struct PartitionShared {
    state: AtomicU8,
    progress_permille: AtomicU32,
    failure: Mutex<Option<String>>,
}

impl PartitionShared {
    pub fn state(&self) -> PartitionState {
        match self.state.load(Ordering::Acquire) {
            0 => PartitionState::Restoring,
            1 => PartitionState::Ready,
            _ => PartitionState::Failed,
        }
    }
    fn set_state(&self, s: PartitionState) {
        let v = match s {
            PartitionState::Restoring => 0,
            PartitionState::Ready => 1,
            PartitionState::Failed => 2,
        };
        self.state.store(v, Ordering::Release);
    }
    pub fn progress(&self) -> f64 {
        f64::from(self.progress_permille.load(Ordering::Relaxed)) / 1000.0
    }
    fn set_progress(&self, fraction: f64) {
        self.progress_permille.store((fraction.clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
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
}

struct Cached<A> {
    version: u64,
    state: A,
}

/// What a command in the batch will be answered with.
enum Pending {
    /// Known without the commit (dedup hit, conflict, ...).
    Ready(Result<Outcome>, CommandOutcome),
    /// Written in this batch; the position is filled in from the receipt.
    Written { outcome: Outcome, appends: std::ops::Range<usize> },
}

struct Slot {
    pending: Pending,
    replies: Vec<oneshot::Sender<Result<Outcome>>>,
}

pub(crate) struct Processor<A: Aggregate> {
    cfg: ProcessorConfig<A>,
    log: Arc<dyn Log>,
    clock: Arc<dyn Clock>,
    shared: Arc<PartitionShared>,
    metrics: Arc<AggregateMetrics>,
    notify: broadcast::Sender<(Arc<str>, u64)>,
    cache: HashMap<String, Cached<A>>,
    events_end: u64,
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
        Self { cfg, log, clock, shared, metrics, notify, cache: HashMap::new(), events_end: 0 }
    }

    fn fail(&self, reason: String) {
        tracing::error!(aggregate = A::TYPE, partition = self.cfg.partition, %reason, "partition stopped");
        *self.shared.failure.lock().expect("not poisoned") = Some(reason);
        self.shared.set_state(PartitionState::Failed);
    }

    fn failed_error(&self) -> Error {
        Error::PartitionFailed { aggregate: A::TYPE.into(), partition: self.cfg.partition, reason: self.shared.failure() }
    }

    /// Runs until the queue closes: restore, then batches.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Job<A>>) {
        if let Err(e) = self.restore().await {
            self.fail(format!("restore failed: {e}"));
        }
        let mut sweep = tokio::time::interval(self.cfg.dedup_sweep_every);
        sweep.tick().await;
        let mut jobs = Vec::with_capacity(self.cfg.max_batch);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut jobs, self.cfg.max_batch) => {
                    if n == 0 {
                        break;
                    }
                    if self.shared.state() == PartitionState::Failed {
                        let err = self.failed_error();
                        self.metrics.count(CommandOutcome::Error, jobs.len() as u64);
                        for job in jobs.drain(..) {
                            let _ = job.reply.send(Err(clone_err(&err)));
                        }
                        continue;
                    }
                    if let Err(fatal) = self.process(std::mem::take(&mut jobs)).await {
                        self.fail(fatal);
                    }
                }
                _ = sweep.tick() => {
                    if self.shared.state() == PartitionState::Ready
                        && let Err(e) = self.sweep_dedup().await
                    {
                        tracing::warn!(aggregate = A::TYPE, partition = self.cfg.partition, error = %e, "dedup sweep failed");
                    }
                }
            }
        }
    }

    /// The barrier: the partition takes commands only once this returns Ok.
    async fn restore(&mut self) -> Result<()> {
        let started = Instant::now();
        self.shared.set_state(PartitionState::Restoring);
        self.shared.set_progress(0.0);
        let p = self.cfg.partition;
        self.events_end = self.log.end_offset(&self.cfg.topics.events, p).await?;
        // Verify the newest event is readable: a torn or corrupt tail stops here, loudly.
        if self.events_end > 0 {
            self.log.read(&self.cfg.topics.events, p, self.events_end - 1, 1).await?;
        }
        self.shared.set_progress(0.5);
        self.sweep_dedup().await?;
        self.shared.set_progress(1.0);
        self.shared.set_state(PartitionState::Ready);
        tracing::debug!(aggregate = A::TYPE, partition = p, events = self.events_end, elapsed_ms = started.elapsed().as_millis() as u64, "partition restored");
        Ok(())
    }

    /// Deletes dedup records older than the window, in bounded chunks.
    async fn sweep_dedup(&mut self) -> Result<()> {
        let before = self.clock.now_ms() - self.cfg.dedup_window_ms;
        loop {
            let expired = self.log.store().expired_dedup(A::TYPE, self.cfg.partition, before, 10_000)?;
            if expired.is_empty() {
                return Ok(());
            }
            let mut local = Batch::new();
            for (ts, id) in &expired {
                local.delete_dedup(A::TYPE, self.cfg.partition, id, *ts);
            }
            self.log.commit(CommitUnit { local, ..Default::default() }).await?;
            tracing::debug!(aggregate = A::TYPE, partition = self.cfg.partition, removed = expired.len(), "expired dedup records removed");
        }
    }

    /// The position of the end of `id`'s version `version` (for replayed outcomes).
    fn position_of(&self, id: &str, version: u64) -> Result<String> {
        let topic = &self.cfg.topics.events;
        let off = if version == 0 {
            self.events_end
        } else {
            match self.log.store().entity_events(topic, id.as_bytes(), version, 1)?.first() {
                Some(e) => e.offset + 1,
                None => self.events_end,
            }
        };
        Ok(Position::at(topic, self.cfg.partition, off).encode())
    }

    /// Processes one batch. `Err` is fatal for the partition (corrupt store).
    async fn process(&mut self, jobs: Vec<Job<A>>) -> std::result::Result<(), String> {
        let now = self.clock.now_ms();
        let p = self.cfg.partition;
        let topics = self.cfg.topics.clone();
        let mut working: HashMap<String, Cached<A>> = HashMap::new();
        let mut slots: Vec<Slot> = Vec::with_capacity(jobs.len());
        let mut by_command: HashMap<String, usize> = HashMap::with_capacity(jobs.len());
        let mut unit = CommitUnit::default();
        let mut fatal = None;

        for job in jobs {
            if fatal.is_some() {
                slots.push(Slot { pending: Pending::Ready(Err(Error::ShuttingDown), CommandOutcome::Error), replies: vec![job.reply] });
                continue;
            }
            // The same command id twice in one batch: both callers get the one outcome.
            if let Some(&i) = by_command.get(&job.command_id) {
                slots[i].replies.push(job.reply);
                self.metrics.count(CommandOutcome::Duplicate, 1);
                continue;
            }
            match self.log.store().get_dedup(A::TYPE, p, &job.command_id) {
                Ok(Some(row)) if row.timestamp_ms >= now - self.cfg.dedup_window_ms => {
                    let pending = match serde_json::from_slice::<Outcome>(&row.outcome) {
                        Ok(mut outcome) => {
                            if let Outcome::Accepted(a) = &mut outcome {
                                match self.position_of(&a.aggregate_id, a.version) {
                                    Ok(pos) => a.position = pos,
                                    Err(e) => {
                                        fatal = Some(e.to_string());
                                    }
                                }
                            }
                            Pending::Ready(Ok(outcome), CommandOutcome::Duplicate)
                        }
                        Err(e) => {
                            fatal = Some(format!(
                                "corrupt record in table `dedup` for command {:?}: outcome does not decode: {e}",
                                job.command_id
                            ));
                            Pending::Ready(Err(Error::ShuttingDown), CommandOutcome::Error)
                        }
                    };
                    slots.push(Slot { pending, replies: vec![job.reply] });
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    fatal = Some(e.to_string());
                    slots.push(Slot { pending: Pending::Ready(Err(Error::ShuttingDown), CommandOutcome::Error), replies: vec![job.reply] });
                    continue;
                }
            }
            let entry = match self.load(&mut working, &job.aggregate_id) {
                Ok(e) => e,
                Err(e) => {
                    fatal = Some(e);
                    slots.push(Slot { pending: Pending::Ready(Err(Error::ShuttingDown), CommandOutcome::Error), replies: vec![job.reply] });
                    continue;
                }
            };
            if let Some(expected) = job.expected_version
                && expected != entry.version
            {
                let err = Error::VersionMismatch { expected, actual: entry.version };
                slots.push(Slot { pending: Pending::Ready(Err(err), CommandOutcome::Conflict), replies: vec![job.reply] });
                continue;
            }
            let ctx = Context { aggregate_id: &job.aggregate_id, version: entry.version, timestamp_ms: now, config: &self.cfg.config };
            let pending = match entry.state.handle(job.command, &ctx) {
                Ok(events) => {
                    let start = unit.appends.len();
                    let mut views = Vec::with_capacity(events.len());
                    for event in &events {
                        entry.state.apply(event);
                        entry.version += 1;
                        let (event_type, json) = codec::encode_event(event);
                        let event_id = uuid::Uuid::now_v7().to_string();
                        let version = entry.version.to_string();
                        let record = Record { key: job.aggregate_id.as_bytes().to_vec(), value: json, headers: Vec::with_capacity(8), timestamp_ms: now }
                            .with_header(headers::TYPE, event_type.as_bytes())
                            .with_header(headers::ID, event_id.as_bytes())
                            .with_header(headers::AGGREGATE_ID, job.aggregate_id.as_bytes())
                            .with_header(headers::VERSION, version.as_bytes())
                            .with_header(headers::COMMAND_ID, job.command_id.as_bytes())
                            .with_header(headers::CORRELATION_ID, job.correlation_id.as_bytes())
                            .with_header(headers::CAUSATION_ID, job.command_id.as_bytes())
                            .with_header(headers::CONTENT_TYPE, "application/json");
                        views.push(EventView {
                            version: entry.version,
                            event_type,
                            id: event_id,
                            command_id: job.command_id.clone(),
                            timestamp: rfc3339_ms(now),
                            payload: RawValue::from_string(String::from_utf8(record.value.clone()).expect("serde_json writes UTF-8"))
                                .expect("serde_json writes JSON"),
                        });
                        unit.appends.push(Append {
                            topic: topics.events.clone(),
                            partition: p,
                            record,
                            entity: Some((job.aggregate_id.as_bytes().to_vec(), entry.version)),
                        });
                    }
                    let outcome = Outcome::Accepted(Accepted {
                        aggregate_id: job.aggregate_id.clone(),
                        version: entry.version,
                        events: views,
                        position: String::new(),
                    });
                    Pending::Written { outcome, appends: start..unit.appends.len() }
                }
                Err(rejection) => Pending::Written {
                    outcome: Outcome::Rejected { error: rejection.code().to_owned(), message: rejection.to_string() },
                    appends: 0..0,
                },
            };
            if let Pending::Written { outcome, .. } = &pending {
                unit.local.put_dedup(A::TYPE, p, &job.command_id, now, &codec::to_json(outcome));
            }
            by_command.insert(job.command_id, slots.len());
            slots.push(Slot { pending, replies: vec![job.reply] });
        }

        let commands = slots.iter().filter(|s| matches!(s.pending, Pending::Written { .. })).count();
        let mut commit_error = None;
        let mut receipt = None;
        if commands > 0 && fatal.is_none() {
            for (id, c) in &working {
                unit.local.put_state(A::TYPE, id, c.version, &codec::to_json(&c.state));
            }
            let started = Instant::now();
            match self.log.commit(unit).await {
                Ok(r) => {
                    self.metrics.commit_latency.observe(started.elapsed().as_secs_f64());
                    self.metrics.batch_size.observe(commands as f64);
                    receipt = Some(r);
                }
                Err(e) => {
                    tracing::error!(aggregate = A::TYPE, partition = p, error = %e, "commit failed; the batch is dropped and callers get an error");
                    commit_error = Some(e.to_string());
                }
            }
        }

        if let Some(r) = &receipt {
            if let Some(last) = r.offsets.last() {
                debug_assert!(*last + 1 > self.events_end || self.events_end == 0);
                self.events_end = *last + 1;
            }
            // Only committed state enters the cache.
            if self.cache.len() + working.len() > self.cfg.cache_limit {
                self.cache.clear();
            }
            for (id, c) in working {
                let _ = self.notify.send((Arc::from(id.as_str()), c.version));
                self.cache.insert(id, c);
            }
        }

        for slot in slots {
            let (result, counted) = match slot.pending {
                Pending::Ready(r, o) => (r, o),
                Pending::Written { mut outcome, appends } => match (&receipt, &commit_error) {
                    (Some(r), _) => {
                        let counted = match &mut outcome {
                            Outcome::Accepted(a) => {
                                let end = if appends.is_empty() { self.events_end } else { r.offsets[appends.end - 1] + 1 };
                                a.position = Position::at(&topics.events, p, end).encode();
                                CommandOutcome::Accepted
                            }
                            Outcome::Rejected { .. } => CommandOutcome::Rejected,
                        };
                        (Ok(outcome), counted)
                    }
                    (None, Some(e)) => (
                        Err(Error::Log(eventfold_log::Error::Closed(format!("commit failed, nothing was written: {e}")))),
                        CommandOutcome::Error,
                    ),
                    (None, None) => (Err(Error::PartitionFailed {
                        aggregate: A::TYPE.into(),
                        partition: p,
                        reason: fatal.clone().unwrap_or_default(),
                    }), CommandOutcome::Error),
                },
            };
            let result = match (result, &fatal) {
                (Err(Error::ShuttingDown), Some(reason)) => {
                    Err(Error::PartitionFailed { aggregate: A::TYPE.into(), partition: p, reason: reason.clone() })
                }
                (r, _) => r,
            };
            self.metrics.count(counted, slot.replies.len() as u64);
            let mut replies = slot.replies;
            let first = replies.remove(0);
            for extra in replies {
                let _ = extra.send(clone_result(&result));
            }
            let _ = first.send(result);
        }
        match fatal {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    /// The working copy of `id`: from this batch, the cache or the store.
    fn load<'w>(&self, working: &'w mut HashMap<String, Cached<A>>, id: &str) -> std::result::Result<&'w mut Cached<A>, String> {
        if !working.contains_key(id) {
            let c = match self.cache.get(id) {
                Some(c) => Cached { version: c.version, state: c.state.clone() },
                None => match self.log.store().get_state(A::TYPE, id) {
                    Ok(Some(row)) => {
                        let state = serde_json::from_slice::<A>(&row.json).map_err(|e| {
                            format!("corrupt record in table `state` at key {}/{id}: state does not decode: {e}", A::TYPE)
                        })?;
                        Cached { version: row.version, state }
                    }
                    Ok(None) => Cached { version: 0, state: A::default() },
                    Err(e) => return Err(e.to_string()),
                },
            };
            working.insert(id.to_owned(), c);
        }
        Ok(working.get_mut(id).expect("inserted above"))
    }
}

fn clone_err(e: &Error) -> Error {
    match e {
        Error::PartitionFailed { aggregate, partition, reason } => {
            Error::PartitionFailed { aggregate: aggregate.clone(), partition: *partition, reason: reason.clone() }
        }
        Error::VersionMismatch { expected, actual } => Error::VersionMismatch { expected: *expected, actual: *actual },
        other => Error::Log(eventfold_log::Error::Closed(other.to_string())),
    }
}

fn clone_result(r: &Result<Outcome>) -> Result<Outcome> {
    match r {
        Ok(o) => Ok(o.clone()),
        Err(e) => Err(clone_err(e)),
    }
}
