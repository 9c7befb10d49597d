//! The options of the Kafka log: what `KafkaLog::open` is given, checked by `validate`.

use crate::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Configs of the topics this log creates.
#[derive(Debug, Clone)]
pub struct TopicDefaults {
    /// Replication factor of new topics (1 for a single test broker; 3 in production).
    pub replication_factor: i32,
    /// `retention.ms` of `*.commands` topics.
    pub commands_retention_ms: i64,
    /// `retention.ms` of `*.results` topics.
    pub results_retention_ms: i64,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        Self {
            replication_factor: 1,
            commands_retention_ms: 7 * 24 * 3600 * 1000,
            results_retention_ms: 24 * 3600 * 1000,
        }
    }
}

/// Options of the Kafka log.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// `bootstrap.servers`, e.g. `127.0.0.1:9092`.
    pub bootstrap_servers: String,
    /// The partition count of every topic of the app.
    pub partitions: u32,
    /// `transactional.id` of the producer: unique per instance, stable across its
    /// restarts (a restarted instance fences its previous incarnation).
    pub transactional_id: String,
    /// `transaction.timeout.ms`: the broker aborts a transaction left open this long.
    pub transaction_timeout: Duration,
    /// Bound on every blocking broker call (init, offsets, commit, abort, metadata,
    /// offset queries) and on each read.
    pub operation_timeout: Duration,
    /// `session.timeout.ms` of group members ([`Coordinated::join`](crate::Coordinated::join)): how long the group waits
    /// for a silent member before it moves the member's partitions to others.
    pub session_timeout: Duration,
    /// Configs of created topics.
    pub topics: TopicDefaults,
    /// Largest commit unit accepted, in bytes (records and local changes).
    pub max_unit_bytes: usize,
    /// Largest record accepted (key, value and headers), in bytes; keep it below the
    /// broker's `message.max.bytes`.
    pub max_record_bytes: usize,
    /// Most bytes merged into one transaction.
    pub max_group_bytes: usize,
    /// Most units merged into one transaction.
    pub max_group_units: usize,
    /// Transactional producers committing in parallel, each on its own thread with
    /// `transactional.id` `<transactional_id>-<k>` (just `<transactional_id>` when 1).
    /// A unit goes to lane `partition % committers` (its [`CommitUnit::lane`](crate::CommitUnit::lane), else its
    /// first partition), so one partition's units keep their order. Kafka completes a
    /// transaction's markers before the same producer may start the next one; several
    /// lanes overlap those waits (so do a lane's `producers_per_committer`). Default 1:
    /// every transaction then carries more units, and Kafka's cost is per produce request
    /// (one per topic-partition per transaction), so one lane costs the broker less CPU.
    /// Keep it constant for an instance: a lane that disappears leaves its last open
    /// transaction to the broker's transaction timeout.
    pub committers: usize,
    /// Transactional producers per committer lane, taken in turn, one per transaction
    /// (`transactional.id` of the lane, then `<lane id>.1`, `<lane id>.2`, ...). A
    /// producer may begin its next transaction only after the broker has written the
    /// markers of its previous one (librdkafka lacks KIP-890), which takes about as long
    /// as a transaction; while one producer's markers are written, the next producer's
    /// transaction runs. Transactions of a lane stay strictly one after the other. Keep it
    /// constant for an instance, like `committers`.
    pub producers_per_committer: usize,
    /// Shortest time from the start of one transaction of a lane to the start of the next
    /// while units queue up (default 20 ms; zero: each starts as soon as the previous one
    /// is done). A lane that finds no unit waiting when a transaction ends starts the next
    /// one as soon as a unit arrives, so a lone command never waits for it; only
    /// back-to-back transactions are spaced, each taking the units that arrived meanwhile,
    /// and `transaction_quiet` cuts the wait short once units stop arriving. The broker's
    /// cost is mostly per transaction (a produce request and a KIP-890 verification per
    /// topic-partition, then the offsets and markers): spacing them trades a few
    /// milliseconds of latency for a broker with that much less to do (bench/FINDINGS.md,
    /// "Moved from code comments").
    pub min_transaction_interval: Duration,
    /// While a lane waits out `min_transaction_interval`, it starts the transaction early
    /// once no unit has arrived for this long (default 1 ms; `None`: it waits the whole
    /// interval). Commands of clients that each wait for their answer arrive in a burst
    /// after each transaction, then stop: the lane need not wait for more. Commands
    /// arriving on their own clock (many independent callers) keep coming, and the
    /// interval spaces the transactions.
    pub transaction_quiet: Option<Duration>,
    /// How often the local store's journal is written to disk (`fdatasync`), without
    /// holding it (default 250 ms; `None`: never). The store is a cache here, so no commit
    /// syncs it, but fjall syncs the old journal whenever a memtable rotates, holding the
    /// journal meanwhile: with all the data since the last rotation to write, the next
    /// local writes waited, and every command queued behind them (bench/FINDINGS.md,
    /// "Moved from code comments"). Syncing regularly leaves that rotation little to write.
    pub cache_sync_interval: Option<Duration>,
    /// Extra librdkafka properties for every client (e.g. security settings). eventfold's
    /// producers compress with LZ4 unless these set `compression.type` (e.g. `none`).
    pub client_config: Vec<(String, String)>,
    /// Fault injection for tests.
    #[doc(hidden)]
    pub faults: Faults,
}

/// Fault injection (tests only): real failures provoked on purpose.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// While positive, each transaction's `commit_transaction` gets a zero timeout and
    /// fails as a timed-out commit (the outcome left unknown, even when librdkafka managed
    /// to answer in time), and the count drops by one.
    pub commit_timeouts: Arc<AtomicU64>,
    /// Milliseconds the apply thread waits between a transaction's commit and its local
    /// store write (0: none): widens the window [`Coordinated::applied`](crate::Coordinated::applied) closes.
    pub local_write_delay_ms: Arc<AtomicU64>,
    /// While positive, each local store write of a committed group fails (after the
    /// delay above), and the count drops by one.
    pub local_write_failures: Arc<AtomicU64>,
}

impl KafkaOptions {
    /// Options with defaults for everything but the broker, partition count and id.
    pub fn new(bootstrap_servers: impl Into<String>, partitions: u32, transactional_id: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            partitions,
            transactional_id: transactional_id.into(),
            // Kafka Streams' choice for exactly-once: a transaction left open by an
            // instance that died holds its partitions' last stable offset (what the new
            // owner restores up to, and views read) for at most this long.
            transaction_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(30),
            session_timeout: Duration::from_secs(10),
            topics: TopicDefaults::default(),
            max_unit_bytes: 16 << 20,
            max_record_bytes: 1_000_000,
            max_group_bytes: 32 << 20,
            max_group_units: 4096,
            committers: 1,
            producers_per_committer: 2,
            min_transaction_interval: Duration::from_millis(20),
            transaction_quiet: Some(Duration::from_millis(1)),
            cache_sync_interval: Some(Duration::from_millis(250)),
            client_config: Vec::new(),
            faults: Faults::default(),
        }
    }

    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(super) fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Config(format!("kafka options: {what}")));
        if self.bootstrap_servers.trim().is_empty() {
            return bad("bootstrap servers are empty");
        }
        if self.partitions == 0 || self.partitions > i32::MAX as u32 {
            return bad("partitions must be in 1..=2^31-1");
        }
        if self.transactional_id.is_empty() {
            return bad("the transactional id is empty");
        }
        if self.cache_sync_interval.is_some_and(|d| d.is_zero()) {
            return bad("the cache sync interval must be positive (None: never)");
        }
        if self.topics.replication_factor < 1 {
            return bad("the replication factor must be at least 1");
        }
        if self.operation_timeout.is_zero() || self.transaction_timeout < Duration::from_secs(1) {
            return bad("timeouts must be positive (transaction timeout at least 1 s)");
        }
        if self.max_group_units == 0 || self.max_record_bytes == 0 {
            return bad("group and record limits must be positive");
        }
        if !(1..=64).contains(&self.committers) {
            return bad("committers must be in 1..=64");
        }
        if !(1..=8).contains(&self.producers_per_committer) {
            return bad("producers per committer must be in 1..=8");
        }
        if self.min_transaction_interval > MAX_TRANSACTION_INTERVAL {
            return bad("the minimum transaction interval must be at most 1 s");
        }
        if self
            .transaction_quiet
            .is_some_and(|q| q.is_zero() || q > MAX_TRANSACTION_INTERVAL)
        {
            return bad("the transaction quiet time must be positive and at most 1 s (None: off)");
        }
        Ok(())
    }
}

/// Upper bound of [`KafkaOptions::min_transaction_interval`]: a longer pause only
/// delays commands while the broker waits idle.
pub const MAX_TRANSACTION_INTERVAL: Duration = Duration::from_secs(1);
