//! The Kafka backend of [`Log`]: one Kafka transaction per group of commit units.
//!
//! **Commit.** [`KafkaLog::commit`](crate::kafka::KafkaLog::commit) enqueues the unit synchronously on a channel read by
//! one dedicated committer thread (see `committer.rs`). The thread owns a transactional
//! `ThreadedProducer` (its own thread serves delivery reports); it takes every waiting
//! unit (bounded by count and bytes) and commits them in **one** transaction (group
//! commit): `begin_transaction`, every append produced to its explicit partition with key,
//! value, headers and timestamp, `send_offsets_to_transaction` once per consumer group
//! for the units' consumed offsets, then it waits for the delivery report of every
//! record (each carries the record's offset, so every append's offset is known before
//! the commit), then `commit_transaction`. Only after the transaction committed does it
//! write the local store in one batch (not fsynced: the store is a cache of the topics, and each batch carries its own checkpoints): every unit's `local` changes, the
//! consumed offsets, and as a local cache the appended records **of entities** (events)
//! with their entity index entries (so [`Store::entity_events`] works in Kafka mode too);
//! of the other appends (state, results) only how far each partition's copy goes
//! ([`Batch::put_log_end`](eventfold_store::Batch::put_log_end)): their content lives in
//! the local tables the unit's `local` changes write. Then it answers the
//! callers, in enqueue order. A group of units with only local changes needs no
//! transaction and only writes the store (still in order).
//!
//! Consumed offsets are committed for a group the log does not join (its metadata has
//! generation -1): zombie fencing comes from the transactional id, not from the group
//! generation (KIP-447). `Consumed::next_offset` should come from the consumer's
//! position, not "last offset + 1": input topics written transactionally hold markers.
//!
//! **Failure.** A unit that cannot be committed alone (partition out of range, too large,
//! invalid topic, topic with another partition count) fails alone. A failed transaction
//! fails every unit of its group. Either way the failed units' topic-partitions (written
//! and consumed) are **fenced**: every later unit touching one of them fails too, until
//! the log is reopened, because writers pipeline units built on uncommitted ones (the
//! same rule as the embedded log; other partitions keep working; a unit with only local
//! changes names no partition and is not fenced). An abortable error
//! aborts the transaction. A fatal error, or a commit or abort that fails or times out,
//! drops the producer; the next group builds a new one whose `init_transactions` bumps
//! the epoch, so a late EndTxn of the old one can never decide a later transaction
//! (librdkafka lacks KIP-890). Being fenced by another producer with our transactional id
//! is final: the log refuses everything (fail-stop). Dropping the log commits what is
//! queued, then stops the committer.
//!
//! **Reads** of offsets below the last record the local cache stores are answered from it:
//! a kept topic's cache holds every committed record from offset 0 up to there, because it
//! is filled only by this log's own commits and by restores that replay the partition in
//! order from where the cache stops (offsets it lacks are transaction markers). So a view
//! catching up after a restore reads the copy the restore just made. A read just past the
//! copy that this log's own commits cover waits (bounded) for the apply thread to store
//! them, rather than fetching them from the broker. On a partition the runtime owns and
//! restored ([`Log::set_sole_writer`]) nothing else is written, so a read past the copy
//! and past this log's commits answers "nothing yet" without a request: a view that
//! polls the end of its source would otherwise send a `ListOffsets` and often a fetch
//! (the offset after the copy is usually the last transaction's marker). Other reads use
//! `read_committed` consumers assigned to one partition (no group subscription), with
//! bounded waits. [`Log::end_offset`] is the partition's last stable
//! offset (LSO): librdkafka's watermark query sends `ListOffsets` with the client's
//! isolation level, so a `read_committed` client gets the LSO, not the high watermark
//! (the two are equal when no transaction is open on the partition). Offsets have gaps:
//! each transaction leaves a marker after its records on every partition it wrote.
//! The broker writes transaction markers *after* it answers `EndTxn`, so right after one
//! of our commits the LSO may still lag behind it for a moment; this log remembers the end
//! of what it committed per partition and waits (bounded) until the LSO covers it, so a
//! caller reads its own commits (past the bound, seen after broker restarts, it answers with
//! the LSO and logs a warning rather than stopping the partition).
//!
//! **Blocking.** Every blocking rdkafka call runs on the committer thread or in
//! `spawn_blocking`, never on a tokio worker. [`KafkaLog::open`](crate::kafka::KafkaLog::open) itself blocks (it
//! connects and initializes transactions): call it outside async code or in
//! `spawn_blocking`.

mod clients;
mod committer;
mod member;
mod provision;

pub use provision::{single_replica_risk, topic_config};

use crate::{CommitFuture, CommitUnit, Error, Log, Receipt, Result};
use async_trait::async_trait;
use clients::Clients;
use eventfold_core::{Record, RecordRef};
use eventfold_store::Store;
use provision::Provisioner;
use rdkafka::producer::FutureRecord;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

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
    /// `session.timeout.ms` of group members ([`Log::join`]): how long the group waits
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
    /// A unit goes to lane `partition % committers` (its [`CommitUnit::lane`], else its
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
    /// milliseconds of latency for a broker with that much less to do. Measured on two
    /// cores shared with the broker (bench/FINDINGS.md), 20 ms with a 1 ms quiet time
    /// at 5,000 commands/s over HTTP took the broker's CPU per command from about 142 to
    /// 122 µs and the p99 from about 52 to 46 ms, and raised the p50 at 1,000/s from
    /// about 10 to 13 ms; without the quiet time, 64 clients each waiting for its answer
    /// got a quarter fewer commands through, with it 5-9% more.
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
    /// local writes waited 100-240 ms then (measured at 5,000 commands/s), and every
    /// command queued behind them. Syncing regularly leaves that rotation little to write.
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
    /// store write (0: none): widens the window [`Log::applied`] closes.
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

    fn validate(&self) -> Result<()> {
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

/// Counters of the committer (see [`crate::Stats`]).
pub(crate) use crate::Counters as Stats;

/// A topic and one of its partitions.
type TopicPartition = (Arc<str>, u32);

/// What the committer and the readers share.
struct Shared {
    options: KafkaOptions,
    provisioner: Provisioner,
    clients: Clients,
    /// Per partition, the offset after the last record this log committed: the LSO must
    /// reach it before `end_offset` answers (read-your-commits, see the module docs).
    committed_ends: Mutex<HashMap<TopicPartition, u64>>,
    /// Why the log stopped (fenced, or the local store failed after a commit): set by any
    /// committer lane, it stops them all (a fenced instance is a zombie as a whole).
    poisoned: Mutex<Option<String>>,
    /// Commit groups between their transaction's commit and their local store write.
    applying: Arc<Applying>,
    /// The log's counters (the committers count commits, readers their broker requests).
    stats: Arc<Stats>,
    /// Partitions only this log writes now, its store holding their earlier records
    /// ([`Log::set_sole_writer`]).
    sole: Mutex<std::collections::HashSet<TopicPartition>>,
}

/// The commit groups whose transaction others may already see (another instance answers
/// a command's outcome from the results topic once the transaction commits) while the
/// committer has not yet written it to the local store: [`Log::applied`] waits for the
/// ones that began before it was called.
#[derive(Default)]
struct Applying {
    state: Mutex<ApplyingState>,
    done: tokio::sync::Notify,
}

#[derive(Default)]
struct ApplyingState {
    /// The ticket the next group gets.
    next: u64,
    /// Tickets of the groups not yet written locally (or failed).
    pending: std::collections::BTreeSet<u64>,
}

/// A group's ticket: ends (and wakes the waiters) when dropped, whatever the outcome.
pub(in crate::kafka) struct ApplyTicket {
    applying: Arc<Applying>,
    ticket: u64,
}

impl Drop for ApplyTicket {
    fn drop(&mut self) {
        self.applying
            .state
            .lock()
            .expect("applying lock")
            .pending
            .remove(&self.ticket);
        self.applying.done.notify_waiters();
    }
}

impl Applying {
    /// Called before a group's transaction is committed; dropped after its local write.
    fn begin(self: &Arc<Self>) -> ApplyTicket {
        let mut state = self.state.lock().expect("applying lock");
        let ticket = state.next;
        state.next += 1;
        state.pending.insert(ticket);
        ApplyTicket {
            applying: self.clone(),
            ticket,
        }
    }

    /// Whether every group with a ticket below `limit` has ended.
    fn ended_below(&self, limit: u64) -> bool {
        let state = self.state.lock().expect("applying lock");
        state.pending.first().is_none_or(|first| *first >= limit)
    }

    /// Waits until every group that began before this call has ended, at most `bound`.
    async fn wait(&self, bound: Duration) {
        let limit = self.state.lock().expect("applying lock").next;
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.ended_below(limit) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(
                    waited_ms = bound.as_millis() as u64,
                    "a committed transaction is not in the local store yet; reading without it"
                );
                return;
            }
        }
    }
}

/// Upper bound of [`KafkaOptions::min_transaction_interval`]: a longer pause only
/// delays commands while the broker waits idle.
pub const MAX_TRANSACTION_INTERVAL: Duration = Duration::from_secs(1);

/// Units of one lane a writer keeps committing at once (`Log::units_in_flight`). A unit's
/// turn ends only when its group is written locally, after the next transaction began:
/// with 4, as on the embedded log, a writer under a steady load waited for a free turn and
/// its commands missed the next transaction. At 5,000 commands/s over HTTP (8
/// partitions, alternated runs) commands took 27.1 and 31.1 ms on average with 4 against
/// 18.4 and 22.4 with 16 and 17.1 with 32, while their units' commits took 17-22 ms
/// either way; through the commands topic, where units are large anyway, the rate did not
/// change.
pub const UNITS_IN_FLIGHT: usize = 32;

/// How long a local read waits for committed transactions to reach the local store.
const APPLIED_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    fn check_partition(&self, topic: &str, partition: u32) -> Result<()> {
        if partition >= self.options.partitions {
            return Err(Error::NoSuchPartition {
                topic: topic.to_owned(),
                partition,
                partitions: self.options.partitions,
            });
        }
        Ok(())
    }

    /// The offset after the last record this log committed to `topic`/`partition` (0 if none).
    fn committed_end(&self, topic: &str, partition: u32) -> u64 {
        self.committed_ends
            .lock()
            .expect("committed ends lock")
            .get(&(Arc::from(topic), partition))
            .copied()
            .unwrap_or(0)
    }

    /// Whether a read from `from` of `topic`/`partition`, beyond what the local cache holds,
    /// has nothing to find: only this log writes the partition ([`Log::set_sole_writer`]),
    /// its own commits there end at or before `from` (the cache holds them) and the log is
    /// not stopped. Offsets past the cache are then only transaction markers.
    fn nothing_beyond(&self, topic: &str, partition: u32, from: u64) -> bool {
        let sole = self
            .sole
            .lock()
            .expect("sole writer lock")
            .contains(&(Arc::from(topic), partition));
        sole && self.committed_end(topic, partition) <= from && self.poisoned.lock().expect("poisoned lock").is_none()
    }

    /// The last stable offset of `topic`/`partition`, once it covers our own commits.
    fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.check_partition(topic, partition)?;
        self.provisioner.ensure(topic)?;
        let ours = self.committed_end(topic, partition);
        let deadline = Instant::now() + self.options.operation_timeout;
        loop {
            self.stats.end_offset_queries.fetch_add(1, Ordering::Relaxed);
            let lso = self.clients.last_stable_offset(topic, partition)?;
            if lso >= ours {
                return Ok(lso);
            }
            if Instant::now() >= deadline {
                // Seen after broker restarts: a transaction whose markers the broker has not
                // written yet holds the LSO back for a minute or more. What this log
                // committed is in the local store already; readers of the topic see it once
                // the broker catches up. Waiting longer would only stop the partition.
                tracing::warn!(
                    %topic,
                    partition,
                    lso,
                    committed_end = ours,
                    waited = ?self.options.operation_timeout,
                    "the last stable offset stays behind this log's own commits (an open transaction holds it back); going on with it"
                );
                return Ok(lso);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the LSO reaches the high watermark taken now: every transaction open on
    /// the partition at this instant is decided (see [`Log::settle`]).
    fn settle(&self, topic: &str, partition: u32) -> Result<bool> {
        self.check_partition(topic, partition)?;
        self.provisioner.ensure(topic)?;
        self.stats.end_offset_queries.fetch_add(1, Ordering::Relaxed);
        let high = self.clients.high_watermark(topic, partition)?;
        let deadline = Instant::now() + self.options.operation_timeout;
        loop {
            self.stats.end_offset_queries.fetch_add(1, Ordering::Relaxed);
            let lso = self.clients.last_stable_offset(topic, partition)?;
            if lso >= high {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                tracing::warn!(%topic, partition, lso, high, "open transactions did not settle in time; going on");
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        let end = self.end_offset(topic, partition)?;
        if max == 0 || from >= end {
            return Ok(Vec::new());
        }
        self.stats.broker_reads.fetch_add(1, Ordering::Relaxed);
        self.clients.read(topic, partition, from, end, max)
    }

    fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.check_partition(topic, partition)?;
        self.clients.committed_offset(group, topic, partition)
    }
}

/// The Kafka backend of [`Log`] (see the module docs).
pub struct KafkaLog {
    shared: Arc<Shared>,
    store: Store,
    /// One queue per committer lane; empty once closed.
    tx: Vec<mpsc::Sender<committer::Job>>,
    committers: Vec<std::thread::JoinHandle<()>>,
    /// Syncs the local store's journal now and then ([`KafkaOptions::cache_sync_interval`]).
    cache_sync: Option<CacheSync>,
    /// Opened with [`KafkaLog::open_reader`].
    read_only: bool,
}

impl KafkaLog {
    /// Connects to the broker, initializes the transactional producer and starts the
    /// committer thread. Blocks (up to the operation timeout): in async code, call it in
    /// `spawn_blocking`.
    pub fn open(options: KafkaOptions, store: Store) -> Result<Self> {
        options.validate()?;
        claim_store(&store, options.partitions)?;
        let clients = Clients::new(&options)?;
        clients.check_reachable(options.operation_timeout)?;
        let provisioner = Provisioner::new(&options, true)?;
        if let Some(w) = provision::single_replica_risk(options.topics.replication_factor) {
            tracing::warn!("{w}");
        }
        let shared = Arc::new(Shared {
            options,
            provisioner,
            clients,
            committed_ends: Mutex::new(HashMap::new()),
            poisoned: Mutex::new(None),
            applying: Arc::default(),
            stats: Arc::default(),
            sole: Mutex::default(),
        });
        let lanes = shared.options.committers;
        let mut txs = Vec::with_capacity(lanes);
        let mut handles = Vec::with_capacity(lanes);
        let mut readies = Vec::with_capacity(lanes);
        for k in 0..lanes {
            let id = if lanes == 1 {
                shared.options.transactional_id.clone()
            } else {
                format!("{}-{k}", shared.options.transactional_id)
            };
            let (tx, rx) = mpsc::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            let ids = (0..shared.options.producers_per_committer)
                .map(|j| if j == 0 { id.clone() } else { format!("{id}.{j}") })
                .collect();
            let committer = committer::Committer::new(ids, shared.clone(), store.clone(), shared.stats.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("eventfold-kafka-commit-{k}"))
                .spawn(move || committer.run(rx, ready_tx))
                .map_err(|e| Error::Closed(format!("cannot start the committer thread: {e}")));
            match spawned {
                Ok(handle) => {
                    txs.push(tx);
                    handles.push(handle);
                    readies.push(ready_rx);
                }
                Err(e) => {
                    drop(txs);
                    handles.into_iter().for_each(|h| drop(h.join()));
                    return Err(e);
                }
            }
        }
        // Each committer initializes its producer first, so a broker that refuses
        // transactions fails `open` rather than the first commit.
        let mut failure = None;
        for ready_rx in readies {
            let ready = ready_rx
                .recv()
                .unwrap_or_else(|_| Err(Error::Closed("a committer thread died while starting".into())));
            if let Err(e) = ready {
                failure.get_or_insert(e);
            }
        }
        if let Some(e) = failure {
            drop(txs);
            handles.into_iter().for_each(|h| drop(h.join()));
            return Err(e);
        }
        let cache_sync = match shared.options.cache_sync_interval {
            Some(every) => Some(CacheSync::start(store.clone(), every)?),
            None => None,
        };
        Ok(Self {
            shared,
            store,
            tx: txs,
            committers: handles,
            cache_sync,
            read_only: false,
        })
    }

    /// Why a restart of the cluster's brokers could lose acknowledged transactions with
    /// this configuration, if it could (also logged as a warning at open): topics with one
    /// replica (see [`single_replica_risk`]). `None` for a reader.
    pub fn broker_warning(&self) -> Option<String> {
        if self.read_only {
            return None;
        }
        single_replica_risk(self.shared.options.topics.replication_factor)
    }

    /// Opens the log for reading only (e.g. an offline view rebuild from the topics):
    /// `read_committed` reads, end offsets and the local `store`, but no producer, no
    /// transaction, no group membership and no topic creation, so a running instance
    /// with the same transactional id is not fenced. [`Log::commit`], [`Log::send`],
    /// [`Log::join`] and [`Log::resume`] refuse. Blocks while it checks the broker.
    pub fn open_reader(options: KafkaOptions, store: Store) -> Result<Self> {
        options.validate()?;
        claim_store(&store, options.partitions)?;
        let clients = Clients::new(&options)?;
        clients.check_reachable(options.operation_timeout)?;
        let provisioner = Provisioner::new(&options, false)?;
        Ok(Self {
            shared: Arc::new(Shared {
                options,
                provisioner,
                clients,
                committed_ends: Mutex::new(HashMap::new()),
                poisoned: Mutex::new(None),
                applying: Arc::default(),
                stats: Arc::default(),
                sole: Mutex::default(),
            }),
            store,
            tx: Vec::new(),
            committers: Vec::new(),
            cache_sync: None,
            read_only: true,
        })
    }

    fn refuse_writes(&self, what: &str) -> Result<()> {
        match self.read_only {
            true => Err(Error::Closed(format!("the Kafka log was opened read-only: no {what}"))),
            false => Ok(()),
        }
    }

    /// Where a read of `topic`/`partition` from `from` is answered. When the local cache
    /// does not hold `from` yet but this log's own commits go past it, it first waits
    /// (bounded, [`APPLIED_WAIT`]) until the apply thread has written those commits there:
    /// a view woken by a commit reads right after the transaction, usually before its
    /// records reach the cache, and would otherwise fetch them from the broker (a
    /// `ListOffsets` and a fetch by a reader assigned for the purpose) instead of reading
    /// them locally a moment later.
    async fn source(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Source> {
        if cached(&self.store, topic, partition, from, max)? {
            return Ok(Source::Cache);
        }
        if max > 0 && self.shared.committed_end(topic, partition) > from {
            self.shared.applying.wait(APPLIED_WAIT).await;
            if cached(&self.store, topic, partition, from, max)? {
                return Ok(Source::Cache);
            }
        }
        Ok(match self.shared.nothing_beyond(topic, partition, from) {
            true => Source::Nothing,
            false => Source::Broker,
        })
    }

    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Shared) -> Result<T> + Send + 'static) -> Result<T> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| Error::Closed(format!("a Kafka call panicked or was cancelled: {e}")))?
    }
}

impl Drop for KafkaLog {
    /// Closes the queue and waits for the committer to finish the group it is committing
    /// (bounded by the operation timeouts), so the store is released when this returns.
    fn drop(&mut self) {
        self.tx.clear();
        for handle in self.committers.drain(..) {
            let _ = handle.join();
        }
        if let Some(sync) = self.cache_sync.take() {
            sync.stop();
        }
    }
}

/// The thread behind [`KafkaOptions::cache_sync_interval`]; dropping `stop` stops it.
struct CacheSync {
    stop: mpsc::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

impl CacheSync {
    fn start(store: Store, every: Duration) -> Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("eventfold-cache-sync".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    if let Err(e) = store.sync_journal_unlocked() {
                        // Only the cache's journal: Kafka holds the truth, and fjall's own
                        // rotation fsync still runs; it is just slower then.
                        tracing::warn!(error = %e, "syncing the local cache's journal failed");
                    }
                }
            })
            .map_err(|e| Error::Closed(format!("cannot start the cache sync thread: {e}")))?;
        Ok(Self { stop, handle })
    }

    /// Stops the thread and waits for it (at most one sync), so the store is released.
    fn stop(self) {
        drop(self.stop);
        let _ = self.handle.join();
    }
}

/// Where a read is answered ([`KafkaLog::source`]).
enum Source {
    /// The local cache holds the records from there on.
    Cache,
    /// Nothing is there yet: only this log writes the partition and the cache holds
    /// all it committed ([`Shared::nothing_beyond`]).
    Nothing,
    /// The broker: the partition's end, then a fetch if there is anything to read.
    Broker,
}

/// Whether a read of `topic`/`partition` from `from` is served by the local cache: it holds
/// every committed record of a kept topic below the end of what it stores (see the module
/// docs), so those are read there, not from the broker.
fn cached(store: &Store, topic: &str, partition: u32, from: u64, max: usize) -> Result<bool> {
    Ok(max > 0 && from < store.stored_log_end(topic, partition)?)
}

#[async_trait]
impl Log for KafkaLog {
    fn backend(&self) -> &'static str {
        "kafka"
    }

    fn store_is_cache(&self) -> bool {
        true
    }

    fn units_in_flight(&self) -> usize {
        UNITS_IN_FLIGHT
    }

    fn partitions(&self) -> u32 {
        self.shared.options.partitions
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn stats(&self) -> crate::Stats {
        self.shared.stats.snapshot()
    }

    fn commit(&self, unit: CommitUnit) -> CommitFuture {
        if let Err(e) = self.refuse_writes("commits") {
            return Box::pin(async move { Err(e) });
        }
        let (reply, rx) = oneshot::channel();
        // Enqueued here, synchronously: the lane's committer takes units in this order.
        let lane = unit
            .lane
            .or_else(|| unit.appends.first().map(|a| a.partition))
            .or_else(|| unit.consumed.first().map(|c| c.partition))
            .unwrap_or(0) as usize;
        let sent = match self.tx.get(lane % self.tx.len().max(1)) {
            Some(tx) => tx
                .send(committer::Job::new(unit, reply))
                .map_err(|_| Error::Closed("the Kafka committer thread stopped".into())),
            None => Err(Error::Closed("the Kafka log is closed".into())),
        };
        Box::pin(async move {
            sent?;
            rx.await
                .map_err(|_| Error::Closed("the Kafka committer thread stopped".into()))?
        })
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        self.shared.check_partition(topic, partition)?;
        let topic = topic.to_owned();
        match self.source(&topic, partition, from, max).await? {
            Source::Cache => {
                let store = self.store.clone();
                self.blocking(move |_| Ok(store.read_log(&topic, partition, from, max)?))
                    .await
            }
            Source::Nothing => Ok(Vec::new()),
            Source::Broker => self.blocking(move |s| s.read(&topic, partition, from, max)).await,
        }
    }

    async fn read_with(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        f: &mut (dyn for<'r> FnMut(u64, RecordRef<'r>) -> bool + Send),
    ) -> Result<()> {
        self.shared.check_partition(topic, partition)?;
        match self.source(topic, partition, from, max).await? {
            Source::Cache => Ok(self.store.read_log_with(topic, partition, from, max, f)?),
            Source::Nothing => Ok(()),
            Source::Broker => {
                let topic = topic.to_owned();
                let got = self.blocking(move |s| s.read(&topic, partition, from, max)).await?;
                crate::lend(got, f);
                Ok(())
            }
        }
    }

    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.shared.check_partition(topic, partition)?;
        let topic = topic.to_owned();
        self.blocking(move |s| s.end_offset(&topic, partition)).await
    }

    async fn settle(&self, topic: &str, partition: u32) -> Result<bool> {
        self.shared.check_partition(topic, partition)?;
        let topic = topic.to_owned();
        self.blocking(move |s| s.settle(&topic, partition)).await
    }

    fn set_sole_writer(&self, topic: &str, partition: u32, sole: bool) {
        let mut set = self.shared.sole.lock().expect("sole writer lock");
        match sole {
            true => set.insert((Arc::from(topic), partition)),
            false => set.remove(&(Arc::from(topic), partition)),
        };
    }

    async fn applied(&self) {
        self.shared.applying.wait(APPLIED_WAIT).await;
    }

    async fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.shared.check_partition(topic, partition)?;
        let (group, topic) = (group.to_owned(), topic.to_owned());
        self.blocking(move |s| s.committed_offset(&group, &topic, partition))
            .await
    }

    async fn resume(&self, lane: u32) -> Result<()> {
        self.refuse_writes("producers")?;
        let (reply, rx) = oneshot::channel();
        let tx = self
            .tx
            .get(lane as usize % self.tx.len().max(1))
            .ok_or_else(|| Error::Closed("the Kafka log is closed".into()))?;
        tx.send(committer::Job::resume(lane, reply))
            .map_err(|_| Error::Closed("the Kafka committer thread stopped".into()))?;
        rx.await
            .map_err(|_| Error::Closed("the Kafka committer thread stopped".into()))?
            .map(drop)
    }

    fn follow(&self, topic: &str, starts: &[(u32, u64)]) -> Result<crate::Follower> {
        for (p, _) in starts {
            self.shared.check_partition(topic, *p)?;
        }
        self.shared.provisioner.ensure(topic)?;
        self.shared.clients.follow(topic, starts)
    }

    fn provision(&self, topics: &[Arc<str>]) -> Result<()> {
        // Every topic is checked, and every refusal reported at once: a misconfigured app
        // is fixed in one go.
        let mut refused = Vec::new();
        for t in topics {
            match self.shared.provisioner.ensure(t) {
                Ok(()) => {}
                Err(Error::Config(why)) => refused.push(why),
                Err(e) => return Err(e),
            }
        }
        if refused.is_empty() {
            return Ok(());
        }
        Err(Error::Config(refused.join("\n")))
    }

    fn join(&self, group: &str, topics: &[Arc<str>]) -> Result<crate::Membership> {
        self.refuse_writes("consumer group membership")?;
        for t in topics {
            self.shared.provisioner.ensure(t)?;
        }
        let shared = Arc::downgrade(&self.shared);
        let on_fatal: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |why: String| {
            if let Some(s) = shared.upgrade() {
                tracing::error!(%why, "Kafka log stops");
                s.poisoned.lock().expect("poisoned lock").get_or_insert(why);
            }
        });
        self.shared.clients.join(group, topics, on_fatal)
    }

    async fn send(&self, append: crate::Append) -> Result<u64> {
        self.refuse_writes("sends")?;
        self.shared.check_partition(&append.topic, append.partition)?;
        let topic = append.topic.clone();
        self.blocking(move |s| s.provisioner.ensure(&topic)).await?;
        let producer = self.shared.clients.sender()?;
        let r = &append.record;
        let headers = clients::kafka_headers(r);
        let record = FutureRecord::to(&append.topic)
            .partition(append.partition as i32)
            .key(&r.key)
            .payload(&r.value)
            .headers(headers)
            .timestamp(r.timestamp_ms);
        match producer.send(record, self.shared.options.operation_timeout).await {
            Ok(delivery) => Ok(delivery.offset as u64),
            Err((e, _)) => Err(clients::kafka_error(
                &format!("cannot send a record to {}/{}", append.topic, append.partition),
                e,
            )),
        }
    }
}

/// The partition count the local store was created with (shared with the embedded log).
const PARTITIONS_KEY: &str = "log/partitions";
/// Set in a store used by the Kafka log: its log table caches Kafka's offsets.
const KAFKA_KEY: &str = "log/kafka";

/// Refuses a store created with another partition count, or by the embedded log (its log
/// table holds the embedded log's own offsets, which Kafka's would collide with); marks a
/// new store as the Kafka log's.
fn claim_store(store: &Store, partitions: u32) -> Result<()> {
    let count = store.get_meta(PARTITIONS_KEY)?;
    let kafka = store.get_meta(KAFKA_KEY)?;
    match (count, kafka) {
        (Some(n), _) if n != u64::from(partitions) => Err(Error::Config(format!(
            "the data directory was created with {n} partitions, not {partitions}; start with --partitions {n} or use another data directory"
        ))),
        (Some(_), None) => Err(Error::Config(
            "the data directory belongs to the embedded log; Kafka mode needs its own data directory".into(),
        )),
        (Some(_), Some(_)) => Ok(()),
        (None, _) => {
            let mut b = eventfold_store::Batch::new();
            b.put_meta(PARTITIONS_KEY, u64::from(partitions));
            b.put_meta(KAFKA_KEY, 1);
            Ok(store.commit(b, true)?)
        }
    }
}

/// Runs `fut` to completion on the current thread. For rdkafka's admin futures, which
/// are completed by librdkafka's own threads and need no async runtime; used only on the
/// committer thread and in `spawn_blocking`.
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Where the committer answers a unit.
type Reply = oneshot::Sender<Result<Receipt>>;

#[cfg(test)]
mod tests {
    use super::*;
    use eventfold_store::{Batch, StoreOptions};

    #[test]
    fn a_zero_cache_sync_interval_is_refused() {
        let mut o = KafkaOptions::new("127.0.0.1:9092", 2, "t");
        assert!(o.validate().is_ok());
        o.cache_sync_interval = Some(Duration::ZERO);
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("cache sync interval"), "{e}");
        o.cache_sync_interval = None;
        assert!(o.validate().is_ok());
    }

    #[test]
    fn a_minimum_transaction_interval_above_one_second_is_refused() {
        let mut o = KafkaOptions::new("127.0.0.1:9092", 2, "t");
        o.min_transaction_interval = MAX_TRANSACTION_INTERVAL;
        assert!(o.validate().is_ok());
        o.min_transaction_interval += Duration::from_millis(1);
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("minimum transaction interval"), "{e}");
    }

    #[test]
    fn a_zero_or_too_long_transaction_quiet_time_is_refused() {
        let mut o = KafkaOptions::new("127.0.0.1:9092", 2, "t");
        for bad in [Duration::ZERO, MAX_TRANSACTION_INTERVAL + Duration::from_micros(1)] {
            o.transaction_quiet = Some(bad);
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains("transaction quiet time"), "{bad:?}: {e}");
        }
        for good in [None, Some(Duration::from_micros(1)), Some(MAX_TRANSACTION_INTERVAL)] {
            o.transaction_quiet = good;
            assert!(o.validate().is_ok(), "{good:?}");
        }
    }

    #[test]
    fn the_cache_sync_thread_syncs_and_releases_the_store_when_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let sync = CacheSync::start(store.clone(), Duration::from_millis(5)).unwrap();
        for i in 0..20u64 {
            let mut b = Batch::new();
            b.put_meta(&format!("k{i}"), i);
            store.commit(b, false).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let started = Instant::now();
        sync.stop();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "stop waits for at most one sync"
        );
        // The thread held the last other handle: once it is gone, the directory reopens.
        drop(store);
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(store.get_meta("k19").unwrap(), Some(19));
    }
}
