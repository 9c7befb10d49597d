//! The embedded log: records in the local fjall store, group commit on one writer thread.
//!
//! Every commit unit is sent to the committer thread. It takes all units waiting (up to
//! a bound), assigns offsets, and writes them as **one** fjall batch with **one** fsync,
//! then answers every caller. One command alone is committed at once; under load many
//! commands share an fsync. Offsets advance in memory only after the batch is durable.
//! Local store writes outside units ([`Log::write_local`]: view rows) join the same
//! groups, so they never hold the journal between two group commits.

use crate::{CommitFuture, CommitUnit, Error, Log, Receipt, Result, offset_key};
use async_trait::async_trait;
use eventfold_core::{Record, RecordRef};
use eventfold_store::{Batch, EncodedRecord, Store};
use foldhash::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, oneshot};

/// Limits and switches of the embedded log.
#[derive(Debug, Clone)]
pub struct Options {
    /// Partitions per topic.
    pub partitions: u32,
    /// fsync every group commit (turn off only for throwaway benchmarks).
    pub fsync: bool,
    /// Largest commit unit accepted, in bytes.
    pub max_unit_bytes: usize,
    /// Most bytes merged into one group commit.
    pub max_group_bytes: usize,
    /// Nice value the committer thread asks for (Linux; 0 leaves it at the process's).
    /// Every commit passes through that one thread, so it should not wait for a core
    /// behind request handling (see [`crate::priority`]); raising it needs `CAP_SYS_NICE`
    /// or `RLIMIT_NICE`, and is skipped with a log line otherwise.
    pub committer_nice: i32,
}

/// The default [`Options::committer_nice`]: 0, which needs no privilege and served more
/// commands over HTTP (a raised committer preempted the request handling at every fsync
/// completion). In-process load, whose commits queue behind busy cores, may do better
/// at [`IN_PROCESS_COMMITTER_NICE`] (bench/FINDINGS.md).
pub const DEFAULT_COMMITTER_NICE: i32 = 0;

/// The committer nice value the in-process command benchmark uses by default.
pub const IN_PROCESS_COMMITTER_NICE: i32 = -10;

impl Default for Options {
    fn default() -> Self {
        Self {
            partitions: 8,
            fsync: true,
            max_unit_bytes: 16 << 20,
            max_group_bytes: 32 << 20,
            committer_nice: DEFAULT_COMMITTER_NICE,
        }
    }
}

/// Counters of the committer (see [`crate::Stats`]).
pub(crate) use crate::Counters as Stats;

const PARTITIONS_KEY: &str = "log/partitions";

/// The committer thread's name (`/proc/<pid>/task/*/comm` shows its first 15 bytes).
pub const COMMITTER_THREAD: &str = "eventfold-commit";

/// A commit unit with its records already encoded and checksummed by the caller, so the
/// single committer thread only assigns offsets, builds keys and writes.
struct Staged {
    appends: Vec<StagedAppend>,
    then: Option<crate::Then>,
    consumed: Vec<crate::Consumed>,
    local: Batch,
    bytes: usize,
    /// False for [`Log::write_local`]: a group of only such units is not fsynced.
    durable: bool,
}

/// An append whose record is already encoded.
struct StagedAppend {
    tp: TopicPartition,
    record: EncodedRecord,
    entity: Option<(Vec<u8>, u64)>,
}

/// A topic and one of its partitions.
type TopicPartition = (Arc<str>, u32);

impl Staged {
    fn new(unit: CommitUnit) -> Self {
        let appends: Vec<_> = unit
            .appends
            .into_iter()
            .map(|a| StagedAppend {
                tp: (a.topic, a.partition),
                record: EncodedRecord::new(&a.record),
                entity: a.entity,
            })
            .collect();
        let bytes = unit.local.bytes() + appends.iter().map(|a| a.record.len()).sum::<usize>();
        Self {
            appends,
            then: unit.then,
            consumed: unit.consumed,
            local: unit.local,
            bytes,
            durable: true,
        }
    }

    /// Local store changes alone, not durable by themselves ([`Log::write_local`]).
    fn local(local: Batch) -> Self {
        Self {
            appends: Vec::new(),
            then: None,
            consumed: Vec::new(),
            bytes: local.bytes(),
            local,
            durable: false,
        }
    }
}

type Job = (Staged, oneshot::Sender<Result<Receipt>>);

/// The embedded backend of [`Log`].
pub struct EmbeddedLog {
    store: Store,
    options: Options,
    tx: mpsc::UnboundedSender<Job>,
    stats: Arc<Stats>,
    priority: crate::priority::Applied,
}

impl EmbeddedLog {
    /// Opens the log on `store` and starts its committer thread.
    pub fn open(store: Store, options: Options) -> Result<Self> {
        assert!(options.partitions > 0, "partitions must be positive");
        // Records are routed by partition count; reopening with another count would
        // put an aggregate's new events on another partition than its old ones.
        match store.get_meta(PARTITIONS_KEY)? {
            Some(n) if n != u64::from(options.partitions) => {
                return Err(Error::Config(format!(
                    "the data directory was created with {n} partitions, not {}; start with --partitions {n} or use another data directory",
                    options.partitions
                )));
            }
            Some(_) => {}
            None => {
                let mut b = Batch::new();
                b.put_meta(PARTITIONS_KEY, u64::from(options.partitions));
                store.commit(b, true)?;
            }
        }
        let (tx, rx) = mpsc::unbounded_channel::<Job>();
        let stats = Arc::new(Stats::default());
        let committer = Committer {
            store: store.clone(),
            options: options.clone(),
            ends: HashMap::default(),
            stats: stats.clone(),
            poisoned: None,
            fenced: HashMap::default(),
        };
        let (started, priority) = std::sync::mpsc::sync_channel(1);
        let nice = options.committer_nice;
        std::thread::Builder::new()
            .name(COMMITTER_THREAD.into())
            .spawn(move || {
                let _ = started.send(crate::priority::apply(nice));
                committer.run(rx)
            })
            .map_err(|e| Error::Closed(format!("cannot start the committer thread: {e}")))?;
        let priority = priority
            .recv()
            .map_err(|_| Error::Closed("the committer thread stopped at start".into()))?;
        crate::priority::log(COMMITTER_THREAD, priority);
        Ok(Self {
            store,
            options,
            tx,
            stats,
            priority,
        })
    }

    /// What became of [`Options::committer_nice`].
    pub fn committer_priority(&self) -> crate::priority::Applied {
        self.priority
    }

    /// Hands `staged` to the committer; the future resolves with its receipt.
    fn enqueue(&self, staged: Staged) -> CommitFuture {
        let (tx, rx) = oneshot::channel();
        // Enqueued here, synchronously: the committer takes units in this order. The queue
        // is unbounded because its writers are: each partition has at most
        // `max_inflight_commits` units outstanding, each view partition one write.
        let sent = self.tx.send((staged, tx));
        Box::pin(async move {
            sent.map_err(|_| Error::Closed("committer thread stopped".into()))?;
            rx.await.map_err(|_| Error::Closed("committer thread stopped".into()))?
        })
    }

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
}

/// Fail-stop: writers pipeline units (the next one is built on the state of the previous
/// one before it is durable), so once a unit fails, nothing that may depend on it can be
/// allowed to land. A failed group poisons the whole log; a unit refused alone fences
/// the topic-partitions it writes.
struct Committer {
    store: Store,
    options: Options,
    ends: HashMap<TopicPartition, u64>,
    stats: Arc<Stats>,
    poisoned: Option<String>,
    fenced: HashMap<TopicPartition, String>,
}

impl Committer {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Job>) {
        while let Some(first) = rx.blocking_recv() {
            let mut jobs = vec![first];
            let mut bytes = jobs[0].0.bytes;
            while bytes < self.options.max_group_bytes {
                match rx.try_recv() {
                    Ok(job) => {
                        bytes += job.0.bytes;
                        jobs.push(job);
                    }
                    Err(_) => break,
                }
            }
            self.commit_group(jobs);
        }
    }

    fn end(&mut self, topic: &Arc<str>, partition: u32) -> Result<u64> {
        if let Some(e) = self.ends.get(&(topic.clone(), partition)) {
            return Ok(*e);
        }
        let e = self.store.log_end(topic, partition)?;
        self.ends.insert((topic.clone(), partition), e);
        Ok(e)
    }

    fn commit_group(&mut self, jobs: Vec<Job>) {
        let started = std::time::Instant::now();
        self.commit_group_inner(jobs);
        self.stats
            .busy_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    fn commit_group_inner(&mut self, jobs: Vec<Job>) {
        if let Some(why) = &self.poisoned {
            for (_, reply) in jobs {
                let _ = reply.send(Err(Error::Closed(format!(
                    "an earlier group commit failed ({why}); restart to recover"
                ))));
            }
            return;
        }
        let ops: usize = jobs
            .iter()
            .map(|(u, _)| u.local.len() + 2 * u.appends.len() + u.consumed.len())
            .sum();
        let mut batch = Batch::with_capacity(ops);
        let mut next: HashMap<TopicPartition, u64> = HashMap::default();
        let mut receipts = Vec::with_capacity(jobs.len());
        let mut replies = Vec::with_capacity(jobs.len());
        let (mut units, mut records) = (0u64, 0u64);
        let mut durable = false;
        for (unit, reply) in jobs {
            let unit_durable = unit.durable;
            match self.stage(unit, &mut batch, &mut next) {
                Ok(receipt) => {
                    durable |= unit_durable;
                    units += u64::from(unit_durable);
                    records += receipt.offsets.len() as u64;
                    receipts.push(Some(receipt));
                }
                Err((e, tps)) => {
                    let msg = e.to_string();
                    for tp in tps {
                        self.fenced.entry(tp).or_insert_with(|| msg.clone());
                    }
                    let _ = reply.send(Err(e));
                    continue;
                }
            }
            replies.push(reply);
        }
        let write_started = std::time::Instant::now();
        let result = self.store.commit(batch, self.options.fsync && durable);
        self.stats
            .write_micros
            .fetch_add(write_started.elapsed().as_micros() as u64, Ordering::Relaxed);
        match result {
            Ok(()) => {
                self.ends.extend(next);
                self.stats.group_commits.fetch_add(1, Ordering::Relaxed);
                self.stats.units.fetch_add(units, Ordering::Relaxed);
                self.stats.records.fetch_add(records, Ordering::Relaxed);
                for (reply, receipt) in replies.into_iter().zip(receipts) {
                    let _ = reply.send(Ok(receipt.expect("staged units have receipts")));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "group commit failed; no unit of it was written; the log refuses further commits");
                let msg = e.to_string();
                self.poisoned = Some(msg.clone());
                for reply in replies {
                    let _ = reply.send(Err(Error::Closed(format!("group commit failed: {msg}"))));
                }
            }
        }
    }

    /// Adds one unit to the group batch; a unit that cannot be staged fails alone and
    /// fences the topic-partitions it writes.
    fn stage(
        &mut self,
        unit: Staged,
        batch: &mut Batch,
        next: &mut HashMap<TopicPartition, u64>,
    ) -> std::result::Result<Receipt, (Error, Vec<TopicPartition>)> {
        let tps: Vec<TopicPartition> = unit.appends.iter().map(|a| a.tp.clone()).collect();
        if let Some(why) = tps.iter().find_map(|tp| self.fenced.get(tp)) {
            return Err((
                Error::Closed(format!("an earlier unit for this partition failed ({why})")),
                tps,
            ));
        }
        self.stage_unit(unit, batch, next).map_err(|e| (e, tps))
    }

    fn stage_unit(
        &mut self,
        unit: Staged,
        batch: &mut Batch,
        next: &mut HashMap<TopicPartition, u64>,
    ) -> Result<Receipt> {
        if unit.bytes > self.options.max_unit_bytes {
            return Err(Error::TooLarge {
                bytes: unit.bytes,
                limit: self.options.max_unit_bytes,
            });
        }
        for StagedAppend {
            tp: (topic, partition), ..
        } in &unit.appends
        {
            if *partition >= self.options.partitions {
                return Err(Error::NoSuchPartition {
                    topic: topic.to_string(),
                    partition: *partition,
                    partitions: self.options.partitions,
                });
            }
            Store::check_key("topic", topic)?;
        }
        let mut local_next: HashMap<TopicPartition, u64> = HashMap::default();
        let mut offsets = Vec::with_capacity(unit.appends.len());
        let mut then = unit.then;
        let mut queue: std::collections::VecDeque<StagedAppend> = unit.appends.into();
        loop {
            let Some(StagedAppend {
                tp: (topic, partition),
                record,
                entity,
            }) = queue.pop_front()
            else {
                // The records built from the offsets: staged after the unit's own.
                let Some(t) = then.take() else { break };
                for a in t.run(&offsets) {
                    if a.partition >= self.options.partitions {
                        return Err(Error::NoSuchPartition {
                            topic: a.topic.to_string(),
                            partition: a.partition,
                            partitions: self.options.partitions,
                        });
                    }
                    Store::check_key("topic", &a.topic)?;
                    queue.push_back(StagedAppend {
                        tp: (a.topic, a.partition),
                        record: EncodedRecord::new(&a.record),
                        entity: a.entity,
                    });
                }
                continue;
            };
            let k = (topic.clone(), partition);
            let off = match local_next.get(&k).or_else(|| next.get(&k)) {
                Some(o) => *o,
                None => self.end(&topic, partition)?,
            };
            batch.put_log_encoded(&topic, partition, off, record);
            if let Some((id, version)) = entity {
                batch.put_entity(&topic, &id, version, partition, off);
            }
            local_next.insert(k, off + 1);
            offsets.push(off);
        }
        for c in &unit.consumed {
            batch.put_meta(&offset_key(&c.group, &c.topic, c.partition), c.next_offset);
        }
        next.extend(local_next);
        batch.append(unit.local);
        Ok(Receipt { offsets })
    }
}

#[async_trait]
impl Log for EmbeddedLog {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn partitions(&self) -> u32 {
        self.options.partitions
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn stats(&self) -> crate::Stats {
        self.stats.snapshot()
    }

    fn commit(&self, unit: CommitUnit) -> CommitFuture {
        self.enqueue(Staged::new(unit))
    }

    async fn write_local(&self, batch: Batch) -> Result<()> {
        self.enqueue(Staged::local(batch)).await.map(|_| ())
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        self.check_partition(topic, partition)?;
        Ok(self.store.read_log(topic, partition, from, max)?)
    }

    async fn read_with(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        f: &mut (dyn for<'r> FnMut(u64, RecordRef<'r>) -> bool + Send),
    ) -> Result<()> {
        self.check_partition(topic, partition)?;
        Ok(self.store.read_log_with(topic, partition, from, max, f)?)
    }

    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.check_partition(topic, partition)?;
        Ok(self.store.log_end(topic, partition)?)
    }

    async fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.check_partition(topic, partition)?;
        Ok(self.store.get_meta(&offset_key(group, topic, partition))?)
    }
}
