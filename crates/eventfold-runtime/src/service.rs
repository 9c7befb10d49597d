//! The type-erased face of one aggregate type: submit commands, read state and events.

use crate::command::{CommandRequest, Job, PartitionState, Topics, event_view};
use crate::error::{Error, Result};
use crate::metrics::{AggregateMetrics, CommandOutcome};
use crate::options::RuntimeOptions;
use crate::processor::PartitionShared;
use crate::snapshot;
use async_trait::async_trait;
use eventfold_core::{Aggregate, EventView, Outcome, codec, partition::partition_for};
use eventfold_log::Log;
use serde::Serialize;
use serde_json::value::RawValue;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot};

/// The state of one aggregate: `{id, version, state}`.
#[derive(Debug, Serialize)]
pub struct StateView {
    /// Aggregate id.
    pub id: String,
    /// Number of events folded.
    pub version: u64,
    /// The state document.
    pub state: Box<RawValue>,
}

/// What `/readyz` and `/v1/cluster` show of a partition.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// Aggregate type.
    pub aggregate: String,
    /// Partition number.
    pub partition: u32,
    /// Lifecycle state.
    pub state: PartitionState,
    /// Restore progress, 0.0 to 1.0.
    pub restore_progress: f64,
    /// Commands waiting in the queue.
    pub queued: usize,
    /// Kafka mode, a partition owned here: the next offset of the commands topic it
    /// consumes (committed or committing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumed_offset: Option<u64>,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Aggregates its processor keeps in memory (at most about its share of
    /// `RuntimeOptions::cache_limit`, which bounds the type's partitions together); in
    /// `/metrics` only.
    #[serde(skip)]
    pub cached_aggregates: u64,
}

/// One aggregate type as the HTTP layer sees it.
#[async_trait]
pub trait AggregateService: Send + Sync + 'static {
    /// The aggregate type name.
    fn name(&self) -> &str;
    /// Submits a command and waits for its durable outcome.
    async fn submit(&self, request: CommandRequest) -> Result<Outcome>;
    /// The committed state of `id`.
    async fn state(&self, id: &str) -> Result<Option<StateView>>;
    /// Whether another instance owns `id`'s partition (Kafka mode): its state and events
    /// are read there.
    fn owner_is_remote(&self, id: &str) -> bool {
        self.partition_is_remote(partition_for(id.as_bytes(), self.partition_count()))
    }
    /// Whether another instance owns partition `p` (Kafka mode).
    fn partition_is_remote(&self, p: u32) -> bool;
    /// How many partitions the aggregate type has.
    fn partition_count(&self) -> u32;
    /// Up to `max` events of `id` from `from_version` on.
    async fn events(&self, id: &str, from_version: u64, max: usize) -> Result<Vec<EventView>>;
    /// Notifications `(aggregate id, new version)` after each commit.
    fn subscribe(&self) -> broadcast::Receiver<(Arc<str>, u64)>;
    /// Status of every partition.
    fn partitions(&self) -> Vec<PartitionReport>;
    /// Metrics of this aggregate type.
    fn metrics(&self) -> &AggregateMetrics;
    /// Topic names.
    fn topics(&self) -> &Topics;
}

/// Checks an aggregate id: 1 to 256 bytes of printable text without `/`.
pub fn check_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 256 || id.chars().any(|c| c.is_control() || c == '/') {
        return Err(Error::BadRequest(format!(
            "invalid aggregate id {id:?}: expected 1 to 256 bytes of printable characters without '/'"
        )));
    }
    Ok(())
}

/// Waits until every write acknowledged anywhere before now is in the local store too
/// ([`Coordinated::applied`](eventfold_log::Coordinated::applied)): a log without
/// coordination writes its store as it commits.
async fn applied(log: &dyn Log) {
    if let Some(c) = log.coordination() {
        c.applied().await;
    }
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > 256 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::BadRequest(
            "invalid Idempotency-Key: expected 1 to 256 printable ASCII characters without spaces".into(),
        ));
    }
    Ok(())
}

impl<A: Aggregate> TypedService<A> {
    /// Sends the command to partition `p`'s owner through the commands topic and waits for
    /// its outcome on the results topic.
    async fn submit_remote(&self, p: u32, command_type: &str, req: CommandRequest) -> Result<Outcome> {
        let Some(remote) = &self.remote else {
            return Err(Error::NotOwner {
                aggregate: A::TYPE.into(),
                partition: p,
            });
        };
        let result = remote
            .submit(&self.topics, p, command_type, req, self.options.command_timeout)
            .await;
        self.metrics.count(
            match &result {
                Ok(Outcome::Accepted(_)) => CommandOutcome::Accepted,
                Ok(Outcome::Rejected { .. }) => CommandOutcome::Rejected,
                Err(Error::VersionMismatch { .. }) => CommandOutcome::Conflict,
                Err(_) => CommandOutcome::Error,
            },
            1,
        );
        result
    }

    /// A decoded command of `submit`, on its way to its partition's queue or, for a
    /// partition owned elsewhere, to the commands topic.
    async fn run(&self, command_type: String, command: A::Command, req: CommandRequest) -> Result<Outcome> {
        let p = partition_for(req.aggregate_id.as_bytes(), self.partitions.len() as u32);
        let (shared, tx) = &self.partitions[p as usize];
        let queued = tx.max_capacity() - tx.capacity();
        match shared.state() {
            PartitionState::Remote => return self.submit_remote(p, &command_type, req).await,
            PartitionState::Failed => {
                self.metrics.count(CommandOutcome::Error, 1);
                return Err(Error::PartitionFailed {
                    aggregate: A::TYPE.into(),
                    partition: p,
                    reason: shared.failure(),
                });
            }
            PartitionState::Restoring if queued >= self.options.restore_queue_limit => {
                self.metrics.count(CommandOutcome::Error, 1);
                return Err(Error::Restoring {
                    aggregate: A::TYPE.into(),
                    partition: p,
                    progress_pct: shared.progress() * 100.0,
                    retry_after: self.options.retry_after,
                });
            }
            _ => {}
        }
        let keyed = req.idempotency_key.is_some();
        // Kept in case the partition moves to another instance before the command runs.
        let resend = self.remote.is_some().then(|| req.clone());
        let command_id = req.idempotency_key.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let (reply, rx) = oneshot::channel();
        let job = Job {
            aggregate_id: req.aggregate_id,
            correlation_id: req.correlation_id.unwrap_or_else(|| command_id.clone()),
            causation_id: req.causation_id,
            command_id,
            command: Ok(command),
            expected_version: req.expected_version,
            consumed: None,
            keyed,
            epoch: 0,
            reply_partition: None,
            reply,
        };
        if let Err(e) = tx.try_send(job) {
            self.metrics.count(CommandOutcome::Error, 1);
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => Error::Overloaded {
                    aggregate: A::TYPE.into(),
                    partition: p,
                    queued,
                    retry_after: self.options.retry_after,
                },
                mpsc::error::TrySendError::Closed(_) => Error::ShuttingDown,
            });
        }
        match tokio::time::timeout(self.options.command_timeout, rx).await {
            Ok(Ok(Err(Error::NotOwner { .. }))) if resend.is_some() => {
                let req = resend.expect("checked");
                self.submit_remote(p, &command_type, req).await
            }
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::ShuttingDown),
            Err(_) => Err(Error::Timeout(self.options.command_timeout)),
        }
    }
}

/// The typed implementation behind [`AggregateService`].
pub(crate) struct TypedService<A: Aggregate> {
    pub(crate) topics: Topics,
    pub(crate) log: Arc<dyn Log>,
    pub(crate) options: RuntimeOptions,
    pub(crate) partitions: Vec<(Arc<PartitionShared>, mpsc::Sender<Job<A>>)>,
    pub(crate) metrics: Arc<AggregateMetrics>,
    pub(crate) notify: broadcast::Sender<(Arc<str>, u64)>,
    /// Sends commands for partitions owned elsewhere through the commands topic (Kafka).
    pub(crate) remote: Option<Arc<crate::remote::Requester>>,
}

#[async_trait]
impl<A: Aggregate> AggregateService for TypedService<A> {
    fn name(&self) -> &str {
        A::TYPE
    }

    async fn submit(&self, req: CommandRequest) -> Result<Outcome> {
        check_id(&req.aggregate_id)?;
        if let Some(k) = &req.idempotency_key {
            check_key(k)?;
        }
        let (command_type, command) = codec::decode_command::<A::Command>(A::TYPE, &req.body)?;
        let started = std::time::Instant::now();
        let result = self.run(command_type, command, req).await;
        self.metrics.command_latency.observe(started.elapsed().as_secs_f64());
        result
    }

    fn partition_is_remote(&self, p: u32) -> bool {
        self.partitions
            .get(p as usize)
            .is_some_and(|(shared, _)| shared.state() == PartitionState::Remote)
    }

    fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    async fn state(&self, id: &str) -> Result<Option<StateView>> {
        check_id(id)?;
        // Every write acknowledged anywhere before this read is in the store (Kafka).
        applied(&*self.log).await;
        let Some((version, state)) = snapshot::load::<A>(self.log.store(), &self.topics.events, id)? else {
            return Ok(None);
        };
        Ok(Some(StateView {
            id: id.to_owned(),
            version,
            state: serde_json::value::to_raw_value(&state).expect("state types must serialize to JSON"),
        }))
    }

    async fn events(&self, id: &str, from_version: u64, max: usize) -> Result<Vec<EventView>> {
        check_id(id)?;
        applied(&*self.log).await;
        let rows = self
            .log
            .store()
            .entity_events(&self.topics.events, id.as_bytes(), from_version.max(1), max)?;
        rows.iter().map(|e| event_view(&self.topics.events, e)).collect()
    }

    fn subscribe(&self) -> broadcast::Receiver<(Arc<str>, u64)> {
        self.notify.subscribe()
    }

    fn partitions(&self) -> Vec<PartitionReport> {
        self.partitions
            .iter()
            .enumerate()
            .map(|(p, (shared, tx))| {
                let state = shared.state();
                PartitionReport {
                    aggregate: A::TYPE.to_owned(),
                    partition: p as u32,
                    state,
                    restore_progress: shared.progress(),
                    queued: tx.max_capacity() - tx.capacity(),
                    consumed_offset: shared.consumed().filter(|_| state != PartitionState::Remote),
                    error: (state == PartitionState::Failed).then(|| shared.failure()),
                    cached_aggregates: shared.cached(),
                }
            })
            .collect()
    }

    fn metrics(&self) -> &AggregateMetrics {
        &self.metrics
    }

    fn topics(&self) -> &Topics {
        &self.topics
    }
}
