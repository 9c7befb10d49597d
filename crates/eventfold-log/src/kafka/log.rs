//! The Kafka log itself (see the module docs of [`crate::kafka`]).

use super::*;
use crate::{CommitFuture, CommitUnit, Coordinated, Error, Log, Result};
use async_trait::async_trait;
use clients::Clients;
use eventfold_core::{Record, RecordRef};
use eventfold_store::Store;
use provision::Provisioner;
use rdkafka::producer::FutureRecord;
use shared::Shared;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;
use tokio::sync::oneshot;

/// Units of one lane a writer keeps committing at once (`Log::units_in_flight`). A unit's
/// turn ends only when its group is written locally, after the next transaction began:
/// with 4, as on the embedded log, a writer under a steady load waited for a free turn and
/// its commands missed the next transaction (bench/FINDINGS.md, "Moved from code
/// comments").
pub const UNITS_IN_FLIGHT: usize = 32;

/// How long a local read waits for committed transactions to reach the local store.
const APPLIED_WAIT: Duration = Duration::from_secs(5);

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
    /// [`Coordinated::join`] and [`Coordinated::resume`] refuse. Blocks while it checks the
    /// broker.
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

    async fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.shared.check_partition(topic, partition)?;
        let (group, topic) = (group.to_owned(), topic.to_owned());
        self.blocking(move |s| s.committed_offset(&group, &topic, partition))
            .await
    }

    async fn send(&self, append: crate::Append) -> Result<u64> {
        self.refuse_writes("sends")?;
        self.shared.check_partition(&append.topic, append.partition)?;
        let topic = append.topic.clone();
        self.blocking(move |s| s.provisioner.ensure(&topic)).await?;
        let producer = self.shared.clients.sender()?;
        let r = &append.record;
        let headers = common::kafka_headers(r);
        let mut record = FutureRecord::<[u8], [u8]>::to(&append.topic)
            .partition(append.partition as i32)
            .key(&r.key[..])
            .headers(headers)
            .timestamp(r.timestamp_ms);
        // An empty value is a null payload: a tombstone, which compaction removes.
        if !r.value.is_empty() {
            record = record.payload(&r.value[..]);
        }
        match producer.send(record, self.shared.options.operation_timeout).await {
            Ok(delivery) => Ok(delivery.offset as u64),
            Err((e, _)) => Err(common::kafka_error(
                &format!("cannot send a record to {}/{}", append.topic, append.partition),
                e,
            )),
        }
    }

    fn coordination(&self) -> Option<&dyn Coordinated> {
        Some(self)
    }
}

#[async_trait]
impl Coordinated for KafkaLog {
    async fn applied(&self) {
        self.shared.applying.wait(APPLIED_WAIT).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use eventfold_store::{Batch, StoreOptions};
    use std::time::Instant;

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
