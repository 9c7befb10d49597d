//! eventfold-log: the `Log` seam between the runtime and where records live.
//!
//! A [`Log`] has topics split in partitions; records are appended in **commit units**
//! ([`CommitUnit`]): records for any topic-partitions, the consumed input offsets, and the
//! local store changes that go with them. A unit is atomic: all of it becomes durable and
//! visible, or none of it. The embedded backend ([`embedded::EmbeddedLog`]) makes a unit
//! one fsynced fjall batch; the Kafka backend makes it one Kafka transaction followed by
//! the local store write. What only a log shared by several instances can do (consumer
//! groups, fencing, resume, follow) is the separate [`Coordinated`] trait, reached through
//! [`Log::coordination`].
//!
//! [`conformance`] is the test suite every backend must pass.
//!
//! **API boundary:** only this crate talks to log backends (fjall's log table here,
//! rdkafka in Kafka mode); the runtime sees the trait.

#![warn(missing_docs)]

pub mod conformance;
pub mod embedded;
/// The Kafka backend: one Kafka transaction per group of commit units.
pub mod kafka;
pub use eventfold_store::priority;
pub mod testing;

use async_trait::async_trait;
use eventfold_core::{Record, RecordRef};
use eventfold_store::{Batch, Store};
use std::sync::Arc;

/// Errors of a log backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The local store failed or holds a corrupt record.
    #[error(transparent)]
    Store(#[from] eventfold_store::Error),
    /// The unit is larger than the backend accepts.
    #[error("commit unit of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The unit's size in bytes.
        bytes: usize,
        /// The backend's limit in bytes.
        limit: usize,
    },
    /// A partition outside `0..partitions`.
    #[error("partition {partition} of topic `{topic}` does not exist (the log has {partitions} partitions)")]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// The topic's partition count.
        partitions: u32,
    },
    /// The configuration does not fit the stored data.
    #[error("configuration error: {0}")]
    Config(String),
    /// The backend is shut down or its writer died.
    #[error("log is closed: {0}")]
    Closed(String),
    /// The Kafka broker or client failed (unreachable broker, failed transaction, ...).
    #[error("kafka: {0}")]
    Kafka(String),
}

/// Result alias of eventfold-log.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A record to append to `topic`/`partition`.
#[derive(Debug, Clone)]
pub struct Append {
    /// Topic name, e.g. `shop.order.events`.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: u32,
    /// The record.
    pub record: Record,
    /// When set, `(entity, version)` is indexed so that the entity's records can be read
    /// without a scan (see [`Store::entity_events`]).
    pub entity: Option<(Vec<u8>, u64)>,
}

/// Input consumed by a commit: the next offset to read of `topic`/`partition` for `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    /// Consumer group.
    pub group: String,
    /// Input topic.
    pub topic: Arc<str>,
    /// Input partition.
    pub partition: u32,
    /// Offset of the next record to consume.
    pub next_offset: u64,
}

/// One atomic unit: all of it is committed, or none of it.
#[derive(Debug, Default)]
pub struct CommitUnit {
    /// Records to append, in order.
    pub appends: Vec<Append>,
    /// Input offsets consumed by this unit.
    pub consumed: Vec<Consumed>,
    /// Local store changes (state rows, dedup records, checkpoints).
    pub local: Batch,
    /// Ordering lane, usually the caller's partition. Units are ordered per caller only
    /// as far as they share a lane: a backend may commit units of different lanes in
    /// parallel (the Kafka log does, `KafkaOptions::committers`). `None`: the partition
    /// of the first append or consumed offset, else lane 0.
    pub lane: Option<u32>,
    /// Records built from the offsets the log assigns to `appends`, committed atomically
    /// with them (an outcome that carries the position of its events).
    pub then: Option<Then>,
}

/// Builds more records of a unit from the offsets assigned to its appends (see
/// [`CommitUnit::then`]). Runs on the log's committer, once the offsets are known and
/// before the unit is durable; the records it returns are appended after the unit's own.
pub struct Then(Box<BuildFromOffsets>);

/// What a [`Then`] runs.
type BuildFromOffsets = dyn FnOnce(&[u64]) -> Vec<Append> + Send;

impl Then {
    /// Wraps `f`, which gets the offset of each of the unit's appends, in order.
    pub fn new(f: impl FnOnce(&[u64]) -> Vec<Append> + Send + 'static) -> Self {
        Self(Box::new(f))
    }

    /// The records for `offsets`.
    pub fn run(self, offsets: &[u64]) -> Vec<Append> {
        (self.0)(offsets)
    }
}

impl std::fmt::Debug for Then {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Then(..)")
    }
}

/// What a commit assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The offset of each append, in the unit's order, then of each record
    /// [`CommitUnit::then`] added.
    pub offsets: Vec<u64>,
}

/// Counters of a log backend, for metrics (all monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Group commits written (embedded: one fsync each) or transactions committed (Kafka).
    pub group_commits: u64,
    /// Commit units written.
    pub units: u64,
    /// Records appended.
    pub records: u64,
    /// Microseconds spent writing and syncing.
    pub write_micros: u64,
    /// Microseconds the committer was busy (staging, writing, answering).
    pub busy_micros: u64,
    /// Where the Kafka log's commits spend their time (all zero for the embedded log).
    pub stages: StageMicros,
    /// Kafka: reads the local cache could not answer, whose records came from the broker.
    pub broker_reads: u64,
    /// Kafka: the partition ends asked of the broker (`ListOffsets`), by `end_offset`,
    /// `settle` and reads the local cache could not answer.
    pub end_offset_queries: u64,
}

/// Microseconds the Kafka log's committed transactions spent in each step, summed (see
/// [`StageMicros::named`]); together they make up most of [`Stats::write_micros`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageMicros {
    /// `begin_transaction` and handing the records to the client.
    pub produce: u64,
    /// `send_offsets_to_transaction` (AddOffsetsToTxn, TxnOffsetCommit): consumed offsets
    /// and the group generation check that fences zombies.
    pub send_offsets: u64,
    /// Waiting for every record's delivery report (the produce requests, each verified by
    /// the broker against the transaction), the second wave of records built from their
    /// offsets included.
    pub delivery: u64,
    /// `commit_transaction` (EndTxn).
    pub commit: u64,
    /// Writing each group to the local store (the cache) after its transaction, and the
    /// groups of local changes only (views' rows), which need no transaction.
    pub local_write: u64,
}

impl StageMicros {
    /// Every step with its metric label, in transaction order.
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("produce", self.produce),
            ("send_offsets", self.send_offsets),
            ("delivery", self.delivery),
            ("commit", self.commit),
            ("local_write", self.local_write),
        ]
    }
}

/// The atomic counters behind [`Stats`], shared by the backends' committers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) group_commits: std::sync::atomic::AtomicU64,
    pub(crate) units: std::sync::atomic::AtomicU64,
    pub(crate) records: std::sync::atomic::AtomicU64,
    pub(crate) write_micros: std::sync::atomic::AtomicU64,
    pub(crate) busy_micros: std::sync::atomic::AtomicU64,
    pub(crate) stages: StageCounters,
    pub(crate) broker_reads: std::sync::atomic::AtomicU64,
    pub(crate) end_offset_queries: std::sync::atomic::AtomicU64,
}

/// The atomic counters behind [`StageMicros`].
#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    pub(crate) produce: std::sync::atomic::AtomicU64,
    pub(crate) send_offsets: std::sync::atomic::AtomicU64,
    pub(crate) delivery: std::sync::atomic::AtomicU64,
    pub(crate) commit: std::sync::atomic::AtomicU64,
    pub(crate) local_write: std::sync::atomic::AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        Stats {
            group_commits: get(&self.group_commits),
            units: get(&self.units),
            records: get(&self.records),
            write_micros: get(&self.write_micros),
            busy_micros: get(&self.busy_micros),
            stages: StageMicros {
                produce: get(&self.stages.produce),
                send_offsets: get(&self.stages.send_offsets),
                delivery: get(&self.stages.delivery),
                commit: get(&self.stages.commit),
                local_write: get(&self.stages.local_write),
            },
            broker_reads: get(&self.broker_reads),
            end_offset_queries: get(&self.end_offset_queries),
        }
    }
}

/// The pending result of [`Log::commit`].
pub type CommitFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Receipt>> + Send + 'static>>;

/// A partitioned, append-only log with atomic commit units: what every backend does.
///
/// **Two traits.** [`Log`] is what a single writer needs and every backend implements:
/// commit units, local writes, reads, ends, consumed offsets, sends, counters. What only
/// a log shared by several instances has (consumer groups that hand partitions from one
/// instance to another, fencing and resuming after a failed commit, waiting for commits
/// others already see, pushed reads, topic provisioning) is [`Coordinated`], which a
/// caller asks for explicitly with [`Log::coordination`]: the Kafka log has it, the
/// embedded log (one process owns every partition) does not. A wrapper forwards it in one
/// line: `fn coordination(&self) -> Option<&dyn Coordinated> { self.inner.coordination() }`.
#[async_trait]
pub trait Log: Send + Sync + 'static {
    /// Backend name for logs and metrics (`embedded`, `kafka`).
    fn backend(&self) -> &'static str;
    /// The partition count of every topic of the app.
    fn partitions(&self) -> u32;
    /// The local store this log commits `CommitUnit::local` into.
    fn store(&self) -> &Store;
    /// Starts committing `unit` atomically and durably; the future resolves once it is
    /// durable (or failed).
    ///
    /// **Ordering:** the unit is enqueued before this returns, and units started by one
    /// caller in one lane ([`CommitUnit::lane`]) commit in the order they were started: a
    /// later unit never becomes durable without every earlier one (after a failure, later
    /// units fail too). Writers rely on
    /// this to pipeline: they build unit k+1 on the state of unit k before k is durable.
    fn commit(&self, unit: CommitUnit) -> CommitFuture;
    /// Writes `batch` to the local store outside any unit and resolves once readers of the
    /// store see it. Not durable by itself: a later durable commit (or a flush) makes it so,
    /// and after a crash it may be lost, never torn. For data derived from the log that can
    /// be derived again, such as view rows with their checkpoint.
    ///
    /// The default writes it on a blocking thread. The embedded log merges it into the next
    /// group commit instead: a separate write would wait for the journal the group commit
    /// holds through its fsync, and hold it in turn while its own changes go into the
    /// memtables, delaying the next group commit. Merged, it shares that commit's journal
    /// write, and a group of such writes alone is not fsynced.
    async fn write_local(&self, batch: Batch) -> Result<()> {
        let store = self.store().clone();
        match tokio::task::spawn_blocking(move || store.commit(batch, false)).await {
            Ok(result) => Ok(result?),
            Err(e) => Err(Error::Closed(format!("local store write task failed: {e}"))),
        }
    }
    /// Reads up to `max` committed records from `from` on.
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>>;
    /// Reads like [`Log::read`], handing each record to `f` as a [`RecordRef`] until `f`
    /// returns `false`, instead of collecting owned records. A backend that keeps records
    /// encoded (the embedded log) lends views into its bytes: no copy and no allocation
    /// per record. The default reads owned records and lends those.
    async fn read_with(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        f: &mut (dyn for<'r> FnMut(u64, RecordRef<'r>) -> bool + Send),
    ) -> Result<()> {
        lend(self.read(topic, partition, from, max).await?, f);
        Ok(())
    }
    /// The offset after the last committed record.
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64>;
    /// Counters for metrics.
    fn stats(&self) -> Stats {
        Stats::default()
    }
    /// How many units of one lane a writer should keep committing at once (4): enough to
    /// overlap its processing with the commits under way, few enough that units grow
    /// under load. The Kafka log says more (see `kafka::UNITS_IN_FLIGHT`).
    fn units_in_flight(&self) -> usize {
        4
    }
    /// The committed consume offset of `group` for `topic`/`partition`.
    async fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>>;
    /// Appends one record outside any commit unit and resolves with its offset once it is
    /// durable. For records that need no atomicity with anything else: a command sent to
    /// the partition's owner, an instance announcement. (Kafka: an idempotent,
    /// non-transactional producer; the record is visible to `read_committed` readers at
    /// once.) The default commits a unit holding just this record.
    async fn send(&self, append: Append) -> Result<u64> {
        let receipt = self.commit(CommitUnit {
            appends: vec![append],
            ..Default::default()
        });
        receipt
            .await?
            .offsets
            .first()
            .copied()
            .ok_or_else(|| Error::Closed("no offset assigned".into()))
    }
    /// The capabilities of a log shared by several instances (see [`Coordinated`]), or
    /// `None` when this process owns every partition and its store is the only copy (the
    /// embedded log). `Some` also says that the local store is only a cache of this log:
    /// another instance may take a partition over with an empty store, so writers append
    /// their state and command outcomes to changelog topics too and restore from them.
    fn coordination(&self) -> Option<&dyn Coordinated> {
        None
    }
}

impl dyn Log {
    /// [`Log::coordination`], or `Config` naming the backend for a caller that cannot do
    /// without it (a consumer group, a follower, a resume after a failed commit).
    pub fn require_coordination(&self) -> Result<&dyn Coordinated> {
        self.coordination().ok_or_else(|| {
            Error::Config(format!(
                "the {} log is not shared (no consumer groups, followers or fencing): this process owns every partition",
                self.backend()
            ))
        })
    }
}

/// What a log shared by several instances adds to [`Log`] (Kafka): ownership of
/// partitions through consumer groups, with zombie fencing; resuming after a failed
/// commit; waiting until what others see is applied locally or until open transactions
/// are decided; telling the log who alone writes a partition; pushed reads; provisioning
/// topics. Reached through [`Log::coordination`]; a log without it is owned by one
/// process, which owns every partition and whose store is the only copy.
#[async_trait]
pub trait Coordinated: Send + Sync {
    /// Waits (a bounded time: 5 s in the Kafka log) until every commit that others may
    /// already see is in the local store too, so that a read of the store made next
    /// sees every write acknowledged anywhere before this call. Kafka: a transaction is
    /// visible (another instance may answer its outcome from the results topic) before
    /// the committer writes it to the local store.
    async fn applied(&self);
    /// Waits (bounded by the backend's operation timeout) until every transaction that had
    /// written to `topic`/`partition` when this was called is decided, so that the end
    /// offset taken next covers all of them: a partition's new owner calls it before it
    /// restores, lest a previous owner's last commit, not yet marked, be left out. Returns
    /// whether it settled in time.
    async fn settle(&self, topic: &str, partition: u32) -> Result<bool>;
    /// The caller says whether only this log's commits write `topic`/`partition` from now
    /// on, its earlier records being all in the local store (`true`: the caller owns the
    /// partition and restored it), or no longer (`false`, the default state). The log
    /// then answers a read from the end of its local copy (nothing more to read once its
    /// own commits are stored) instead of asking the broker for the partition's end: a view
    /// that reads at the end of the events it follows would otherwise send a request at
    /// every poll. Saying `true` wrongly makes such reads miss other writers' records.
    fn set_sole_writer(&self, topic: &str, partition: u32, sole: bool);
    /// After a failed commit: once every unit the caller started in `lane` has resolved
    /// (the later ones fail too, they were built on the failed one), lifts the fence that
    /// refuses the lane's partition, so the caller can restore from the committed state and
    /// go on. (A log without coordination stops for good after a failure: the embedded log
    /// is fail-stop, a failed fsync leaves the disk in doubt.)
    async fn resume(&self, lane: u32) -> Result<()>;
    /// Follows `topic` from each `(partition, offset)` of `starts`: committed records are
    /// delivered in offset order per partition as soon as they are committed, until the
    /// [`Follower`] is dropped. Logs without coordination have no push path: poll
    /// [`Log::read`].
    fn follow(&self, topic: &str, starts: &[(u32, u64)]) -> Result<Follower>;
    /// Checks, before a service starts, that `topics` can hold what it keeps in them:
    /// creates the missing ones and refuses (with `Config`, naming
    /// the topic and the setting) those with another partition count or a cleanup or
    /// retention policy that would lose data. Blocking (call it off the async threads).
    /// Logs without coordination have no topics to provision.
    fn provision(&self, topics: &[Arc<str>]) -> Result<()>;
    /// Joins consumer group `group` as a member reading `topics` (all with the app's
    /// partition count): the group assigns each partition to one member at a time, and
    /// the [`Membership`] reports assignments, revocations and the assigned partitions'
    /// committed records. The log also commits [`Consumed`] offsets of `group` with this
    /// membership's generation, so a member the group has moved on from cannot commit
    /// (zombie fencing). Without coordination the caller owns every partition.
    fn join(&self, group: &str, topics: &[Arc<str>]) -> Result<Membership>;
}

/// Records of one partition of a followed topic, with their offsets.
pub type FollowedBatch = (u32, Vec<(u64, Record)>);

/// A live stream of committed records (see [`Coordinated::follow`]).
pub struct Follower {
    rx: tokio::sync::mpsc::Receiver<Result<FollowedBatch>>,
}

impl Follower {
    /// A follower fed by `rx`; the feeder stops when the follower is dropped.
    pub fn new(rx: tokio::sync::mpsc::Receiver<Result<FollowedBatch>>) -> Self {
        Self { rx }
    }

    /// The next batch of one partition (waits for one); `None` once the feeder stopped.
    /// An error is reported once; the feeder keeps following after it.
    pub async fn next(&mut self) -> Option<Result<FollowedBatch>> {
        self.rx.recv().await
    }
}

/// What a group member learns (see [`Coordinated::join`]), in the order it happened.
#[derive(Debug)]
pub enum GroupEvent {
    /// Partitions now assigned to this member; each with the epoch that the records
    /// delivered for it from now on carry (epochs only grow, across all partitions).
    Assigned(Vec<(Arc<str>, u32, u64)>),
    /// Partitions taken away from this member. The member waits (bounded by the group's
    /// rebalance timeout) until `done` is answered or dropped before it lets the group go
    /// on: finish or fail the in-flight work on them first. `lost`: the group already
    /// gave them to another member (this one was too slow), so its commits will fail.
    Revoked {
        /// The partitions.
        partitions: Vec<(Arc<str>, u32)>,
        /// Whether they were lost rather than handed over.
        lost: bool,
        /// Answer (or drop) once nothing is in flight on them.
        done: RevokeAck,
    },
    /// Committed records of an assigned partition, in offset order.
    Records {
        /// Topic.
        topic: Arc<str>,
        /// Partition.
        partition: u32,
        /// The partition's epoch when they were fetched (see [`MemberControl::seek`]).
        epoch: u64,
        /// Records with their offsets.
        records: Vec<(u64, Record)>,
    },
    /// A failure the member keeps going after (logged by the member too).
    Error(Error),
}

/// The answer to a [`GroupEvent::Revoked`]: send it (or drop it) when done.
#[derive(Debug)]
pub struct RevokeAck(Option<std::sync::mpsc::SyncSender<()>>);

impl RevokeAck {
    /// An acknowledgement that wakes `tx`.
    pub fn new(tx: std::sync::mpsc::SyncSender<()>) -> Self {
        Self(Some(tx))
    }
    /// Lets the group go on.
    pub fn done(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.try_send(());
        }
    }
}

impl Drop for RevokeAck {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.try_send(());
        }
    }
}

/// Operations on a running membership, callable from anywhere (see [`Coordinated::join`]).
pub trait MemberControl: Send + Sync + 'static {
    /// Moves the fetch position of an assigned partition to `offset` (e.g. back to the
    /// committed offset after a failed transaction) and returns the partition's new epoch:
    /// records delivered with an older epoch were fetched before the seek.
    fn seek(&self, topic: &str, partition: u32, offset: u64) -> Result<u64>;
    /// Rebalances this member has been through (assignments and revocations received).
    fn rebalances(&self) -> u64;
    /// The partitions assigned to this member now.
    fn assignment(&self) -> Vec<(Arc<str>, u32)>;
    /// Stops fetching records of an assigned partition until [`MemberControl::resume`]
    /// (backpressure while its consumer is behind; the member goes on taking part in
    /// rebalances and seeks). A partition assigned again starts fetching. Default: nothing.
    fn pause(&self, _topic: &str, _partition: u32) {}
    /// Fetches records of a paused partition again. Default: nothing.
    fn resume(&self, _topic: &str, _partition: u32) {}
}

/// A member of a consumer group (see [`Coordinated::join`]); leaves the group when dropped.
pub struct Membership {
    rx: tokio::sync::mpsc::Receiver<GroupEvent>,
    control: Arc<dyn MemberControl>,
}

impl Membership {
    /// A membership fed by `rx` and steered through `control`.
    pub fn new(rx: tokio::sync::mpsc::Receiver<GroupEvent>, control: Arc<dyn MemberControl>) -> Self {
        Self { rx, control }
    }
    /// The next event (waits for one); `None` once the member stopped.
    pub async fn next(&mut self) -> Option<GroupEvent> {
        self.rx.recv().await
    }
    /// A handle to seek and inspect, usable while `next` is awaited elsewhere.
    pub fn control(&self) -> Arc<dyn MemberControl> {
        self.control.clone()
    }
}

/// The name of the meta entry holding a consumer group's offset.
pub fn offset_key(group: &str, topic: &str, partition: u32) -> String {
    format!("offset/{group}/{topic}/{partition}")
}

/// Hands `records` to `f` as [`RecordRef`]s until it returns `false` (what
/// [`Log::read_with`] does with owned records).
pub fn lend(records: Vec<(u64, Record)>, f: &mut (dyn for<'r> FnMut(u64, RecordRef<'r>) -> bool + Send)) {
    for (offset, record) in records {
        if !f(offset, record.as_record_ref()) {
            break;
        }
    }
}
