//! The committer thread: group commit of units in one Kafka transaction; then its apply
//! thread writes the group to the local store and answers, in commit order, while the
//! committer goes on with the next transaction (see the module docs of `kafka` for the
//! failure rules). A transaction takes every unit queued when it starts; while units keep
//! queueing, the next one starts no sooner than `KafkaOptions::min_transaction_interval`
//! after it, collecting the units that arrive meanwhile, unless none arrives for
//! `KafkaOptions::transaction_quiet`.

use super::common::{kafka_error, producer_config, user_sets};
use super::shared::{ApplyTicket, Reply, Shared, Stats, TopicPartition};
use crate::{Append, CommitUnit, Consumed, Error, Receipt, Result, offset_key};
use eventfold_store::{Batch, EncodedRecord, Store};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A unit waiting for the committer, with its entity records (events) already encoded for
/// the local cache (encoding runs on the caller's thread).
pub(in crate::kafka) struct Job {
    appends: Vec<Append>,
    /// Builds more records from the appends' offsets (`CommitUnit::then`).
    then: Option<crate::Then>,
    /// Per append: its encoding when it is kept locally (it has an entity).
    encoded: Vec<Option<EncodedRecord>>,
    consumed: Vec<Consumed>,
    local: Batch,
    bytes: usize,
    largest_record: usize,
    reply: Reply,
    /// The unit's lane (`CommitUnit::lane`): the partition whose writer built it.
    lane: Option<u32>,
    /// Not a unit: lift the fence of this partition (see `Coordinated::resume`).
    resume: Option<u32>,
    /// When the unit was handed to the committer (`KafkaOptions::transaction_quiet`).
    queued: Instant,
}

/// The local encoding of an append the cache keeps (one with an entity).
fn encode_kept(a: &Append) -> Option<EncodedRecord> {
    a.entity.as_ref().map(|_| EncodedRecord::new(&a.record))
}

impl Job {
    pub(in crate::kafka) fn new(unit: CommitUnit, reply: Reply) -> Self {
        let encoded: Vec<Option<EncodedRecord>> = unit.appends.iter().map(encode_kept).collect();
        let record_bytes = |a: &Append| {
            let r = &a.record;
            r.key.len() + r.value.len() + r.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        };
        Self {
            largest_record: unit.appends.iter().map(record_bytes).max().unwrap_or(0),
            bytes: unit.local.bytes() + unit.appends.iter().map(record_bytes).sum::<usize>(),
            appends: unit.appends,
            then: unit.then,
            encoded,
            consumed: unit.consumed,
            local: unit.local,
            reply,
            lane: unit.lane,
            resume: None,
            queued: Instant::now(),
        }
    }

    /// The request to lift `partition`'s fence, queued behind the lane's earlier units.
    pub(in crate::kafka) fn resume(partition: u32, reply: Reply) -> Self {
        let mut job = Self::new(CommitUnit::default(), reply);
        job.resume = Some(partition);
        job
    }

    /// The topic-partitions the unit writes or consumes.
    fn partitions(&self) -> impl Iterator<Item = TopicPartition> + '_ {
        let written = self.appends.iter().map(|a| (a.topic.clone(), a.partition));
        written.chain(self.consumed.iter().map(|c| (c.topic.clone(), c.partition)))
    }

    /// What a failure of this unit fences, and what a fence refuses it for. A unit of lane
    /// `p` builds on the earlier units of `p`'s writer only: it is fenced by its lane
    /// (the marker `("", p)`) and the topic-partitions `p` it writes or consumes, not by
    /// the other partitions it writes to (an outcome for the results partition its sender
    /// listens on), which only `resume` of their own lane would lift: a partition whose
    /// units answer commands of another instance recovered again and again, its units
    /// refused after every `resume`. A unit without a lane: every topic-partition.
    fn fence_keys(&self) -> Vec<TopicPartition> {
        match self.lane {
            Some(p) => std::iter::once((Arc::from(""), p))
                .chain(self.partitions().filter(|(_, partition)| *partition == p))
                .collect(),
            None => self.partitions().collect(),
        }
    }

    fn needs_transaction(&self) -> bool {
        !self.appends.is_empty() || !self.consumed.is_empty() || self.then.is_some()
    }
}

/// Tags a produced record with its transaction and its index in the group, so that a
/// late delivery report of an earlier (aborted) transaction is never mistaken. Packed in
/// the record's opaque word (the transaction's low 32 bits, then the index), so that
/// producing a record allocates no tag: four records a command, tens of thousands a
/// second. A report would be mistaken only if it arrived 2^32 transactions late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tag {
    seq: u32,
    index: u32,
}

const _: () = assert!(usize::BITS >= 64, "a delivery tag needs a 64-bit opaque word");

impl Tag {
    fn new(seq: u64, index: usize) -> Self {
        Self {
            seq: seq as u32,
            index: u32::try_from(index).expect("fewer than 2^32 records in a transaction"),
        }
    }

    fn pack(self) -> usize {
        ((self.seq as usize) << 32) | self.index as usize
    }

    fn unpack(word: usize) -> Self {
        Self {
            seq: (word >> 32) as u32,
            index: word as u32,
        }
    }
}

/// Delivery reports of the current transaction: the offset of each record, or why it
/// failed.
#[derive(Default)]
struct Reports {
    seq: u64,
    slots: Vec<Option<Result<u64, String>>>,
    received: usize,
}

/// The producer's context: collects delivery reports (on the producer's polling
/// thread) and forwards librdkafka's logs.
#[derive(Default)]
struct TxContext {
    reports: Mutex<Reports>,
    arrived: Condvar,
}

impl TxContext {
    fn reset(&self, seq: u64, records: usize) {
        let mut r = self.reports.lock().expect("reports lock");
        *r = Reports {
            seq,
            slots: vec![None; records],
            received: 0,
        };
    }

    /// Every record's offset once all reports of transaction `seq` arrived (the first
    /// failure if one failed); waits up to `wait` for them.
    fn offsets(&self, seq: u64, wait: Duration) -> Option<Result<Vec<u64>, String>> {
        let r = self.reports.lock().expect("reports lock");
        let (r, _) = self
            .arrived
            .wait_timeout_while(r, wait, |r| r.seq == seq && r.received < r.slots.len())
            .expect("reports lock");
        if r.seq != seq || r.received < r.slots.len() {
            return None;
        }
        Some(
            r.slots
                .iter()
                .map(|s| s.clone().expect("every slot is filled"))
                .collect(),
        )
    }
}

impl ClientContext for TxContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", fac, "{message}");
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

impl ProducerContext for TxContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: usize) {
        let tag = Tag::unpack(tag);
        let index = tag.index as usize;
        let mut r = self.reports.lock().expect("reports lock");
        if tag.seq != r.seq as u32 || r.slots.get(index).is_none_or(Option::is_some) {
            return;
        }
        r.slots[index] = Some(match result {
            Ok(m) if m.offset() >= 0 => Ok(m.offset() as u64),
            Ok(m) => Err(format!("delivered without an offset ({})", m.offset())),
            Err((e, _)) => Err(e.to_string()),
        });
        r.received += 1;
        if r.received == r.slots.len() {
            self.arrived.notify_all();
        }
    }
}

/// A `ThreadedProducer`: its thread serves delivery reports while this thread blocks in
/// `commit_transaction` or `abort_transaction` (which wait for every outstanding report
/// to be served; a `BaseProducer` polled only by this thread would deadlock there).
type TxProducer = ThreadedProducer<TxContext>;

fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
        )
    )
}

/// How a transaction failed, for the callers.
struct Failed(String);

pub(in crate::kafka) struct Committer {
    /// The `transactional.id` of each of this lane's producers (see
    /// `KafkaOptions::committers` and `KafkaOptions::producers_per_committer`).
    transactional_ids: Vec<String>,
    shared: Arc<Shared>,
    store: Store,
    stats: Arc<Stats>,
    /// The lane's producers, taken in turn, one per transaction: a producer may begin
    /// its next transaction only once the broker has written the markers of its previous
    /// one (librdkafka lacks KIP-890), which took as long as a whole transaction on a
    /// busy broker; the next producer need not wait for them. `None`: to be built (at
    /// start, and after a failure dropped it).
    producers: Vec<Option<TxProducer>>,
    /// The producer of the next transaction.
    turn: usize,
    /// Sequence number of the current transaction (delivery report tags).
    seq: u64,
    /// What failed units fence (`Job::fence_keys`), and why they failed.
    fenced: HashMap<TopicPartition, String>,
    /// Taken just before a transaction's commit, dropped once its group is in the local
    /// store (or failed): others may see the transaction before the apply thread writes it to
    /// the local store, and local reads wait for it (`Coordinated::applied`). `finish` hands it to
    /// the apply thread with the group.
    applying: std::cell::Cell<Option<ApplyTicket>>,
    /// Hands committed groups to the apply thread (see `Applier`).
    apply: Option<mpsc::SyncSender<Committed>>,
}

/// Committed groups waiting for the apply thread at most: past them the committer waits,
/// so a slow local store slows the transactions rather than queueing without bound.
const APPLY_QUEUE: usize = 2;

/// Stops every lane of this log (see `Shared::poisoned`); the first reason stays.
fn stop_all(shared: &Shared, why: String) {
    shared.poisoned.lock().expect("poisoned lock").get_or_insert(why);
}

/// A group whose transaction committed (or that needed none), for the apply thread.
struct Committed {
    ready: Vec<Job>,
    offsets: Vec<u64>,
    transacted: bool,
    write_started: Instant,
    /// Dropped once the group is in the local store (see `Committer::applying`).
    ticket: Option<ApplyTicket>,
}

/// The apply thread of a lane: writes each committed group to the local store, counts it
/// and answers its callers, strictly in commit order. Callers are answered only after
/// the local write, so a read after an answer sees the unit's effects.
struct Applier {
    shared: Arc<Shared>,
    store: Store,
    stats: Arc<Stats>,
    /// Why a local write failed: every later group is refused.
    failed: Option<String>,
}

impl Committer {
    pub(in crate::kafka) fn new(
        transactional_ids: Vec<String>,
        shared: Arc<Shared>,
        store: Store,
        stats: Arc<Stats>,
    ) -> Self {
        assert!(!transactional_ids.is_empty(), "a lane has at least one producer");
        Self {
            producers: transactional_ids.iter().map(|_| None).collect(),
            transactional_ids,
            shared,
            store,
            stats,
            turn: 0,
            seq: 0,
            fenced: HashMap::new(),
            applying: std::cell::Cell::new(None),
            apply: None,
        }
    }

    pub(in crate::kafka) fn run(mut self, rx: mpsc::Receiver<Job>, ready: mpsc::Sender<Result<()>>) {
        // Every producer of the lane at once: `init_transactions` aborts what an earlier
        // incarnation left open under its id, which would otherwise hold the partitions'
        // last stable offsets back until the broker's transaction timeout.
        let init = self.init_all();
        let failed = init.is_err();
        let _ = ready.send(init);
        if failed {
            return;
        }
        // The local writes and answers of committed groups run on a thread of their own,
        // in commit order, while this one goes on with the next transaction.
        let (apply_tx, apply_rx) = mpsc::sync_channel::<Committed>(APPLY_QUEUE);
        let applier = Applier {
            shared: self.shared.clone(),
            store: self.store.clone(),
            stats: self.stats.clone(),
            failed: None,
        };
        let applier = match std::thread::Builder::new()
            .name("eventfold-kafka-apply".into())
            .spawn(move || applier.run(apply_rx))
        {
            Ok(handle) => handle,
            Err(e) => {
                self.stop_all(format!("cannot start the Kafka apply thread: {e}"));
                return;
            }
        };
        self.apply = Some(apply_tx);
        let (max_units, max_bytes) = (self.shared.options.max_group_units, self.shared.options.max_group_bytes);
        let interval = self.shared.options.min_transaction_interval;
        let quiet = self.shared.options.transaction_quiet;
        // A unit that was already waiting when the last group was done: the lane is
        // busy, and the next transaction keeps `min_transaction_interval` from the last,
        // unless no unit arrives for `transaction_quiet` meanwhile.
        let mut waiting: Option<Job> = None;
        let mut last_start = Instant::now();
        loop {
            let (first, busy) = match waiting.take() {
                Some(job) => (job, true),
                None => match rx.recv() {
                    Ok(job) => (job, false),
                    Err(_) => break,
                },
            };
            let not_before = busy.then(|| last_start + interval);
            let mut last_arrival = first.queued;
            let mut bytes = first.bytes;
            let mut jobs = vec![first];
            while jobs.len() < max_units && bytes < max_bytes {
                // Until `not_before` (or a quiet spell), wait for more units; after it,
                // take only queued ones.
                let until = not_before.map(|t| quiet.map_or(t, |q| t.min(last_arrival + q)));
                let left = until.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()));
                let next = if left.is_zero() {
                    rx.try_recv().ok()
                } else {
                    rx.recv_timeout(left).ok()
                };
                let Some(job) = next else { break };
                last_arrival = last_arrival.max(job.queued);
                bytes += job.bytes;
                jobs.push(job);
            }
            let started = Instant::now();
            last_start = started;
            self.commit_group(jobs);
            // Written here or failed: local reads waiting for it go on.
            drop(self.applying.take());
            self.stats
                .busy_micros
                .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            waiting = rx.try_recv().ok();
        }
        // Every committed group is written and answered before the thread ends.
        drop(self.apply.take());
        let _ = applier.join();
    }

    /// Builds and initializes every producer of the lane that is missing.
    fn init_all(&mut self) -> Result<()> {
        (0..self.producers.len()).try_for_each(|k| self.producer_at(k).map(drop))
    }

    /// The producer whose turn it is (it exists once `producer` succeeded).
    fn current(&self) -> &TxProducer {
        self.producers[self.turn].as_ref().expect("built by transact")
    }

    /// The transactional producer whose turn it is, built and initialized if there is
    /// none (at start and after a failure that dropped it).
    fn producer(&mut self) -> Result<&TxProducer> {
        self.producer_at(self.turn)
    }

    /// Producer `k` of the lane, built and initialized if there is none.
    fn producer_at(&mut self, k: usize) -> Result<&TxProducer> {
        if self.producers[k].is_none() {
            let o = &self.shared.options;
            let timeout_ms = o.transaction_timeout.as_millis().to_string();
            let mut config = producer_config(o);
            config
                .set("transactional.id", &self.transactional_ids[k])
                .set("transaction.timeout.ms", &timeout_ms)
                .set("message.timeout.ms", &timeout_ms);
            // Right after a commit the coordinator is still writing the previous
            // transaction's markers and answers the next AddOffsetsToTxn / AddPartitionsToTxn
            // with CONCURRENT_TRANSACTIONS (223 times in 476 transactions at 64 concurrent
            // HTTP clients, `debug=eos`); librdkafka then waits retry.backoff.ms (100 ms by
            // default), growing to retry.backoff.max.ms. The markers take a few ms, so retry
            // after 1 ms (bench/FINDINGS.md, "Moved from code comments"). (The Java
            // producer special-cases this with a 20 ms backoff.)
            for (key, value) in [("retry.backoff.ms", "1"), ("retry.backoff.max.ms", "20")] {
                if !user_sets(o, key) {
                    config.set(key, value);
                }
            }
            let producer: TxProducer = config
                .create_with_context(TxContext::default())
                .map_err(|e| kafka_error("cannot create the transactional Kafka producer", e))?;
            // Fences any earlier producer with our transactional id and aborts what it
            // left open: a late EndTxn of a dropped producer cannot decide anything now.
            producer.init_transactions(o.operation_timeout).map_err(|e| {
                kafka_error(
                    &format!(
                        "cannot initialize transactions for transactional id `{}`",
                        self.transactional_ids[k]
                    ),
                    e,
                )
            })?;
            self.producers[k] = Some(producer);
        }
        Ok(self.producers[k].as_ref().expect("just built"))
    }

    fn commit_group(&mut self, jobs: Vec<Job>) {
        let poisoned = self.shared.poisoned.lock().expect("poisoned lock").clone();
        if let Some(why) = &poisoned {
            for job in jobs {
                let _ = job.reply.send(Err(Error::Closed(format!(
                    "the Kafka log stopped ({why}); restart to recover"
                ))));
            }
            return;
        }
        let mut ready = Vec::with_capacity(jobs.len());
        for job in jobs {
            if let Some(p) = job.resume {
                // Initialized producers first: `init_transactions` aborts what a failed
                // producer of its id left open, which would hold the partitions' last
                // stable offsets back (and the restore that follows) until it timed out.
                let answer = match self.init_all() {
                    Ok(_) => {
                        // Every earlier unit of the lane was checked (and refused) above:
                        // the writer drained them, later units build on committed state.
                        self.fenced.retain(|(_, partition), _| *partition != p);
                        Ok(Receipt { offsets: Vec::new() })
                    }
                    Err(e) => Err(e),
                };
                let _ = job.reply.send(answer);
                continue;
            }
            match self.check(&job) {
                Ok(()) => ready.push(job),
                Err(e) => {
                    self.fence(&job, &e.to_string());
                    let _ = job.reply.send(Err(e));
                }
            }
        }
        if ready.is_empty() {
            return;
        }
        let write_started = Instant::now();
        let transacted = ready.iter().any(Job::needs_transaction);
        let offsets = if transacted {
            match self.transact(&mut ready) {
                Ok(offsets) => offsets,
                Err(Failed(why)) => {
                    tracing::error!(error = %why, units = ready.len(), "Kafka transaction failed; its partitions are fenced");
                    for job in ready {
                        self.fence(&job, &why);
                        let _ = job.reply.send(Err(Error::Kafka(format!("transaction failed: {why}"))));
                    }
                    return;
                }
            }
        } else {
            // Only local changes: no transaction, but still in order with the others.
            Vec::new()
        };
        self.finish(ready, offsets, transacted, write_started);
    }

    /// After the transaction committed: remember the ends for read-your-commits, and hand
    /// the group to the apply thread (local store, counts, answers).
    fn finish(&mut self, ready: Vec<Job>, offsets: Vec<u64>, transacted: bool, write_started: Instant) {
        {
            let mut ends = self.shared.committed_ends.lock().expect("committed ends lock");
            for (a, off) in ready.iter().flat_map(|j| &j.appends).zip(&offsets) {
                let e = ends.entry((a.topic.clone(), a.partition)).or_insert(0);
                *e = (*e).max(off + 1);
            }
        }
        let group = Committed {
            ready,
            offsets,
            transacted,
            write_started,
            ticket: self.applying.take(),
        };
        let apply = self
            .apply
            .as_ref()
            .expect("the apply thread runs while the committer does");
        if let Err(mpsc::SendError(group)) = apply.send(group) {
            let why = "the Kafka apply thread stopped".to_owned();
            for job in group.ready {
                let _ = job.reply.send(Err(Error::Closed(why.clone())));
            }
            self.stop_all(why);
        }
    }

    fn stop_all(&self, why: String) {
        stop_all(&self.shared, why);
    }

    fn fence(&mut self, job: &Job, why: &str) {
        for tp in job.fence_keys() {
            self.fenced.entry(tp).or_insert_with(|| why.to_owned());
        }
    }

    /// What can be checked before the transaction, so that a bad unit fails alone.
    fn check(&self, job: &Job) -> Result<()> {
        if let Some(why) = job.fence_keys().iter().find_map(|tp| self.fenced.get(tp)) {
            return Err(Error::Closed(format!(
                "an earlier unit for this partition failed ({why}); restart to recover"
            )));
        }
        let o = &self.shared.options;
        if job.bytes > o.max_unit_bytes {
            return Err(Error::TooLarge {
                bytes: job.bytes,
                limit: o.max_unit_bytes,
            });
        }
        if job.largest_record > o.max_record_bytes {
            return Err(Error::TooLarge {
                bytes: job.largest_record,
                limit: o.max_record_bytes,
            });
        }
        for c in &job.consumed {
            if c.group.is_empty() {
                return Err(Error::Config(format!(
                    "empty consumer group for {}/{}",
                    c.topic, c.partition
                )));
            }
            if c.next_offset > i64::MAX as u64 {
                return Err(Error::Config(format!("offset {} out of range", c.next_offset)));
            }
        }
        let mut topics: Vec<&Arc<str>> = job.appends.iter().map(|a| &a.topic).collect();
        topics.extend(job.consumed.iter().map(|c| &c.topic));
        topics.sort();
        topics.dedup();
        for (topic, partition) in job.partitions() {
            self.shared.check_partition(&topic, partition)?;
        }
        for topic in topics {
            Store::check_key("topic", topic)?;
            self.shared.provisioner.ensure(topic)?;
        }
        Ok(())
    }

    /// One transaction for all of `ready`; the offset of every append, in order (each
    /// job's own, then the ones its `then` added to it).
    fn transact(&mut self, ready: &mut [Job]) -> Result<Vec<u64>, Failed> {
        self.producer().map_err(|e| Failed(e.to_string()))?;
        // Two sequence numbers: the records built from offsets are a second wave.
        self.seq += 2;
        let seq = self.seq - 1;
        let result = self.transact_steps(ready, seq).map_err(|e| self.recover(e));
        // The next transaction, committed or not, goes to the next producer. Transactions
        // stay in order: this one was decided (or aborted) before the next one begins.
        self.turn = (self.turn + 1) % self.producers.len();
        result
    }

    /// Runs every job's `then` on its offsets, checks and produces what they built (a
    /// second wave of the transaction, tagged `seq`), waits for its delivery reports, adds
    /// the records to their jobs, and returns every offset in job order.
    fn second_wave(&self, ready: &mut [Job], first: &[u64], seq: u64) -> Result<Vec<u64>, TxError> {
        let mut built: Vec<Vec<Append>> = Vec::with_capacity(ready.len());
        let mut at = 0;
        for job in ready.iter_mut() {
            let mine = &first[at..at + job.appends.len()];
            at += job.appends.len();
            let more = job.then.take().map(|t| t.run(mine)).unwrap_or_default();
            for a in &more {
                let checked = self
                    .shared
                    .check_partition(&a.topic, a.partition)
                    .and_then(|()| Store::check_key("topic", &a.topic).map_err(Error::from))
                    .and_then(|()| self.shared.provisioner.ensure(&a.topic));
                checked.map_err(|e| TxError::Other("then", e.to_string()))?;
            }
            built.push(more);
        }
        let count: usize = built.iter().map(Vec::len).sum();
        let second = if count == 0 {
            Vec::new()
        } else {
            let producer = self.current();
            producer.context().reset(seq, count);
            self.produce(built.iter().flatten(), seq)
                .map_err(|e| TxError::Kafka("produce", e))?;
            self.delivered(seq)?
        };
        let mut offsets = Vec::with_capacity(first.len() + count);
        let (mut at, mut at2) = (0, 0);
        for (job, more) in ready.iter_mut().zip(built) {
            offsets.extend_from_slice(&first[at..at + job.appends.len()]);
            at += job.appends.len();
            offsets.extend_from_slice(&second[at2..at2 + more.len()]);
            at2 += more.len();
            job.encoded.extend(more.iter().map(encode_kept));
            job.appends.extend(more);
        }
        Ok(offsets)
    }

    fn transact_steps(&self, ready: &mut [Job], seq: u64) -> Result<Vec<u64>, TxError> {
        let timeout = self.shared.options.operation_timeout;
        let producer = self.current();
        let records: usize = ready.iter().map(|j| j.appends.len()).sum();
        producer.context().reset(seq, records);
        let t0 = Instant::now();
        producer
            .begin_transaction()
            .map_err(|e| TxError::Kafka("begin_transaction", e))?;
        self.produce_all(ready, seq).map_err(|e| TxError::Kafka("produce", e))?;
        let t1 = Instant::now();
        self.send_offsets(ready)?;
        let t2 = Instant::now();
        // Every record delivered, with its offset, before the commit: then a commit
        // that succeeds can be answered at once with every offset. (Not `flush`: the
        // BaseProducer's flush polls in whole 100 ms slices.)
        let first = self.delivered(seq)?;
        let offsets = self.second_wave(ready, &first, seq + 1)?;
        // rust-rdkafka's commit_transaction flushes first, and its flush sleeps a whole
        // 100 ms poll whenever the producer's queue is not empty at that instant (the
        // ThreadedProducer's own thread serves it concurrently): that was a 100 ms stall in
        // about one commit of ten. Every record is delivered by now, so wait briefly for
        // the queue to be served; then the flush returns at once.
        let served_by = Instant::now() + Duration::from_millis(100);
        while producer.in_flight_count() > 0 && Instant::now() < served_by {
            std::thread::sleep(Duration::from_micros(200));
        }
        let t3 = Instant::now();
        // From here others may see the transaction (an unknown outcome included).
        self.applying.set(Some(self.shared.applying.begin()));
        let faults = &self.shared.options.faults.commit_timeouts;
        if faults
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            // An injected timeout: the commit is started with no time to finish, and
            // fails as a real timeout does, whatever librdkafka answered (with a zero
            // timeout it still reports success now and then, which made the fault, and
            // the tests relying on it, flaky). The outcome is unknown either way.
            let answered = producer.commit_transaction(Duration::ZERO);
            return Err(TxError::Other(
                "commit_transaction",
                format!("injected timeout (librdkafka answered {answered:?})"),
            ));
        }
        producer
            .commit_transaction(timeout)
            .map_err(|e| TxError::Kafka("commit_transaction", e))?;
        let t4 = Instant::now();
        let stages = &self.stats.stages;
        for (counter, from, to) in [
            (&stages.produce, t0, t1),
            (&stages.send_offsets, t1, t2),
            (&stages.delivery, t2, t3),
            (&stages.commit, t3, t4),
        ] {
            counter.fetch_add((to - from).as_micros() as u64, Ordering::Relaxed);
        }
        tracing::debug!(
            units = ready.len(),
            records,
            produce_us = (t1 - t0).as_micros() as u64,
            send_offsets_us = (t2 - t1).as_micros() as u64,
            delivery_us = (t3 - t2).as_micros() as u64,
            commit_us = (t4 - t3).as_micros() as u64,
            "transaction committed"
        );
        Ok(offsets)
    }

    fn produce_all(&self, ready: &[Job], seq: u64) -> Result<(), KafkaError> {
        self.produce(ready.iter().flat_map(|j| &j.appends), seq)
    }

    /// Produces `appends` to their explicit partitions, tagged `seq` and their index.
    fn produce<'a>(&self, appends: impl Iterator<Item = &'a Append>, seq: u64) -> Result<(), KafkaError> {
        let producer = self.current();
        let deadline = Instant::now() + self.shared.options.operation_timeout;
        for (index, a) in appends.enumerate() {
            let r = &a.record;
            let headers = super::common::kafka_headers(r);
            let mut record = BaseRecord::<[u8], [u8], _>::with_opaque_to(&a.topic, Tag::new(seq, index).pack())
                .partition(a.partition as i32)
                .key(&r.key[..])
                .headers(headers);
            // An empty value is a null payload: a tombstone, which compaction removes.
            if !r.value.is_empty() {
                record = record.payload(&r.value[..]);
            }
            // librdkafka reads 0 as "now"; a record keeps its own time otherwise.
            if r.timestamp_ms > 0 {
                record = record.timestamp(r.timestamp_ms);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if Instant::now() < deadline =>
                    {
                        record = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err((e, _)) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// `send_offsets_to_transaction` once per consumer group; per input partition the
    /// offset of the last unit wins (units are in commit order).
    fn send_offsets(&self, ready: &[Job]) -> Result<(), TxError> {
        let mut groups: Vec<(&str, Vec<&Consumed>)> = Vec::new();
        for c in ready.iter().flat_map(|j| &j.consumed) {
            match groups.iter_mut().find(|(g, _)| *g == c.group) {
                Some((_, cs)) => cs.push(c),
                None => groups.push((&c.group, vec![c])),
            }
        }
        let producer = self.current();
        let stage = "send_offsets_to_transaction";
        for (group, consumed) in groups {
            let mut last: HashMap<(&str, u32), u64> = HashMap::new();
            for c in consumed {
                last.insert((&c.topic, c.partition), c.next_offset);
            }
            let mut tpl = TopicPartitionList::with_capacity(last.len());
            for ((topic, partition), next) in last {
                tpl.add_partition_offset(topic, partition as i32, Offset::Offset(next as i64))
                    .map_err(|e| TxError::Kafka(stage, e))?;
            }
            let cgm = self
                .shared
                .clients
                .group_metadata(group)
                .map_err(|e| TxError::Other("group metadata", e.to_string()))?;
            producer
                .send_offsets_to_transaction(&tpl, &cgm, self.shared.options.operation_timeout)
                .map_err(|e| TxError::Kafka(stage, e))?;
        }
        Ok(())
    }

    /// Waits (bounded) for the delivery report of every record of transaction `seq`.
    ///
    /// Once a transaction hits an abortable error librdkafka holds its remaining records
    /// until the abort, so their reports never come: while waiting, probe the
    /// transaction's state with `begin_transaction`, which inside a healthy transaction
    /// only answers "invalid state" and otherwise returns the transaction's error.
    fn delivered(&self, seq: u64) -> Result<Vec<u64>, TxError> {
        let producer = self.current();
        let deadline = Instant::now() + self.shared.options.operation_timeout;
        loop {
            if let Some(offsets) = producer.context().offsets(seq, Duration::from_millis(20)) {
                return offsets.map_err(|why| TxError::Other("delivery", why));
            }
            match producer.begin_transaction() {
                Err(KafkaError::Transaction(t)) if t.code() == RDKafkaErrorCode::State => {}
                Err(e) => return Err(TxError::Kafka("produce", e)),
                Ok(()) => {
                    return Err(TxError::Other(
                        "delivery",
                        "the producer left its transaction while records were outstanding".into(),
                    ));
                }
            }
            if Instant::now() >= deadline {
                return Err(TxError::Other(
                    "delivery",
                    format!(
                        "delivery reports still missing after {:?}",
                        self.shared.options.operation_timeout
                    ),
                ));
            }
        }
    }

    /// Ends a failed transaction: abort it if the error allows, otherwise drop the
    /// producer so the next group builds a new one (a new `init_transactions` bumps the
    /// epoch, fencing the old one's late requests). Fenced by another producer with our
    /// transactional id: stop for good.
    fn recover(&mut self, e: TxError) -> Failed {
        let (stage, abortable, fatal) = match &e {
            TxError::Kafka(stage, k) if is_fenced(k) => return self.poison(stage, k),
            TxError::Kafka(stage, KafkaError::Transaction(t)) => (*stage, t.txn_requires_abort(), t.is_fatal()),
            // Errors outside librdkafka's transaction state machine happen before the
            // commit: nothing was committed, abort.
            TxError::Kafka(stage, _) | TxError::Other(stage, _) => (*stage, *stage != "commit_transaction", false),
        };
        let what = match &e {
            TxError::Kafka(_, k) => k.to_string(),
            TxError::Other(_, why) => why.clone(),
        };
        if abortable && !fatal {
            let producer = self.current();
            return match producer.abort_transaction(self.shared.options.operation_timeout) {
                Ok(()) => Failed(format!("{stage} failed ({what}); the transaction was aborted")),
                Err(abort) if is_fenced(&abort) => self.poison("abort_transaction", &abort),
                Err(abort) => {
                    self.producers[self.turn] = None;
                    Failed(format!(
                        "{stage} failed ({what}) and so did the abort ({abort}); the producer is rebuilt, the transaction was not committed"
                    ))
                }
            };
        }
        self.producers[self.turn] = None;
        Failed(format!(
            "{stage} failed ({what}); the outcome of the transaction is unknown (a timed-out commit may still land); the producer is rebuilt"
        ))
    }

    /// The producer was fenced. Without a consumer group the log has no other guard
    /// against a second writer: it stops. A member of a consumer group rebuilds the
    /// producer instead, as Kafka Streams does: the fence came from the broker aborting a
    /// transaction left open too long (this instance was paused or cut off), and the group
    /// decides which partitions are still ours (a second process with our instance id is
    /// fenced by the group too, which stops the log; see `member.rs`).
    fn poison(&mut self, stage: &str, e: &KafkaError) -> Failed {
        self.producers[self.turn] = None;
        if self.shared.clients.has_joined() {
            return Failed(format!(
                "{stage}: the producer was fenced ({e}): the broker aborted its transaction (open longer than transaction.timeout.ms, e.g. while this instance was paused); the producer is rebuilt"
            ));
        }
        let why = format!(
            "{stage}: the producer was fenced ({e}): another instance uses transactional id `{}`",
            self.transactional_ids[self.turn]
        );
        self.stop_all(why.clone());
        Failed(why)
    }
}

/// A failed step of a transaction.
enum TxError {
    Kafka(&'static str, KafkaError),
    Other(&'static str, String),
}

impl Applier {
    fn run(mut self, rx: mpsc::Receiver<Committed>) {
        while let Ok(group) = rx.recv() {
            self.apply(group);
        }
    }

    /// Writes one committed group to the local store, counts it and answers its callers;
    /// once a local write failed it only refuses. The group's ticket is dropped when it
    /// returns.
    fn apply(&mut self, group: Committed) {
        let Committed {
            ready,
            offsets,
            transacted,
            write_started,
            ticket: _ticket,
        } = group;
        if let Some(why) = &self.failed {
            // Committed after a group the local store could not take: writing it would
            // leave a hole in the cache. Kafka holds it; a restart restores it.
            for job in ready {
                let _ = job.reply.send(Err(Error::Closed(why.clone())));
            }
            return;
        }
        let ops: usize = ready
            .iter()
            .map(|j| j.local.len() + 2 * j.appends.len() + j.consumed.len())
            .sum();
        let mut batch = Batch::with_capacity(ops);
        let mut receipts = Vec::with_capacity(ready.len());
        let mut replies = Vec::with_capacity(ready.len());
        let mut next = offsets.iter().copied();
        let (mut units, mut records) = (0u64, 0u64);
        // Records of entities (events) are kept for per-entity reads; of the others only
        // how far the copy goes (see the module docs).
        let mut ends: HashMap<(Arc<str>, u32), u64> = HashMap::new();
        for job in ready {
            let mine: Vec<u64> = next.by_ref().take(job.appends.len()).collect();
            for ((a, record), off) in job.appends.iter().zip(job.encoded).zip(&mine) {
                match (&a.entity, record) {
                    (Some((entity, version)), Some(record)) => {
                        batch.put_log_encoded(&a.topic, a.partition, *off, record);
                        batch.put_entity(&a.topic, entity, *version, a.partition, *off);
                    }
                    _ => {
                        let e = ends.entry((a.topic.clone(), a.partition)).or_insert(0);
                        *e = (*e).max(off + 1);
                    }
                }
            }
            for c in &job.consumed {
                batch.put_meta(&offset_key(&c.group, &c.topic, c.partition), c.next_offset);
            }
            batch.append(job.local);
            units += 1;
            records += mine.len() as u64;
            receipts.push(Receipt { offsets: mine });
            replies.push(job.reply);
        }
        for ((topic, partition), end) in ends {
            batch.put_log_end(&topic, partition, end);
        }
        // No fsync: Kafka holds the committed truth and the batch carries its own
        // checkpoints, so a batch lost to a machine crash only makes the next restore
        // replay a little more from the topics (the store is a cache, DESIGN §3).
        let delay = self.shared.options.faults.local_write_delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        let store_started = Instant::now();
        let failures = &self.shared.options.faults.local_write_failures;
        let stored = if failures
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            Err("injected failure".to_owned())
        } else {
            self.store.commit(batch, false).map_err(|e| e.to_string())
        };
        let store_us = store_started.elapsed().as_micros() as u64;
        self.stats.stages.local_write.fetch_add(store_us, Ordering::Relaxed);
        let group_us = write_started.elapsed().as_micros() as u64;
        tracing::debug!(units, store_us, group_us, "group stored");
        self.stats.write_micros.fetch_add(group_us, Ordering::Relaxed);
        if let Err(e) = stored {
            // Kafka holds the units but the local cache does not: nothing may be built on
            // this store any more until a restart restores it from Kafka.
            let why = format!("the transaction committed but the local store write failed: {e}");
            tracing::error!(error = %why, "Kafka log stops");
            for reply in replies {
                let _ = reply.send(Err(Error::Closed(why.clone())));
            }
            self.failed = Some(why.clone());
            stop_all(&self.shared, why);
            return;
        }
        if transacted {
            self.stats.group_commits.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.units.fetch_add(units, Ordering::Relaxed);
        self.stats.records.fetch_add(records, Ordering::Relaxed);
        for (reply, receipt) in replies.into_iter().zip(receipts) {
            let _ = reply.send(Ok(receipt));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tag;

    #[test]
    fn a_delivery_tag_survives_its_opaque_word() {
        for (seq, index) in [
            (0u64, 0usize),
            (1, 167),
            (u64::from(u32::MAX) + 5, 1 << 20),
            (7, u32::MAX as usize),
        ] {
            let tag = Tag::unpack(Tag::new(seq, index).pack());
            assert_eq!((tag.seq, tag.index as usize), (seq as u32, index));
        }
        // Transactions 2^32 apart share a tag; neighbours never do.
        assert_ne!(Tag::new(1, 3).pack(), Tag::new(2, 3).pack());
        assert_ne!(Tag::new(1, 3).pack(), Tag::new(1, 4).pack());
    }
}
