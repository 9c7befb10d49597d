//! The consumers of the Kafka log: committed reads, last stable offsets, group offsets and
//! the group metadata that transactions commit offsets with. All calls block.

use super::common::{consumer_config, kafka_error, producer_config, to_record, user_sets};
use super::options::KafkaOptions;
use super::readers::Quiet;
use crate::{Error, Result};
use eventfold_core::Record;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(super) struct Clients {
    options: KafkaOptions,
    /// Watermark queries and the reachability check.
    meta: BaseConsumer<Quiet>,
    /// High watermark queries (`read_uncommitted`: the end of the log, open transactions
    /// included).
    meta_uncommitted: BaseConsumer<Quiet>,
    readers: super::readers::Readers,
    groups: Mutex<HashMap<String, Arc<BaseConsumer<Quiet>>>>,
    /// Groups this log joined (`Coordinated::join`): their member's metadata goes into transactions.
    joined: Mutex<HashMap<String, Arc<super::member::Control>>>,
    sender: Mutex<Option<Arc<FutureProducer>>>,
}

impl Clients {
    pub(super) fn new(options: &KafkaOptions) -> Result<Self> {
        let meta = consumer_config(options, None)
            .create_with_context(Quiet::default())
            .map_err(|e| kafka_error("cannot create a Kafka consumer", e))?;
        let meta_uncommitted = consumer_config(options, None)
            .set("isolation.level", "read_uncommitted")
            .create_with_context(Quiet::default())
            .map_err(|e| kafka_error("cannot create a Kafka consumer", e))?;
        Ok(Self {
            options: options.clone(),
            meta,
            meta_uncommitted,
            readers: Default::default(),
            groups: Mutex::new(HashMap::new()),
            joined: Mutex::new(HashMap::new()),
            sender: Mutex::new(None),
        })
    }

    fn reader_group(&self) -> String {
        format!("{}-reader", self.options.transactional_id)
    }

    fn timeout(&self) -> Duration {
        self.options.operation_timeout
    }

    /// Fails with a clear message if no broker answers within `timeout`.
    pub(super) fn check_reachable(&self, timeout: Duration) -> Result<()> {
        // A client of its own with librdkafka's error lines on (rdkafka takes the level
        // from the `log` crate, off here), served by polling: a failed SASL handshake or TLS
        // verification then names itself instead of a bare transport failure.
        let probe: BaseConsumer<Quiet> = consumer_config(&self.options, None)
            .set_log_level(rdkafka::config::RDKafkaLogLevel::Error)
            .create_with_context(Quiet::default())
            .map_err(|e| kafka_error("cannot create a Kafka consumer", e))?;
        probe.fetch_metadata(None, timeout).map(drop).map_err(|e| {
            while probe.poll(Duration::ZERO).is_some() {}
            let last = probe.context().last_error();
            Error::Kafka(format!(
                "cannot reach a Kafka broker at `{}` within {timeout:?}: {e}{}",
                self.options.bootstrap_servers,
                last.map(|l| format!(" (librdkafka: {l})")).unwrap_or_default()
            ))
        })
    }

    /// The last stable offset: the watermark query of a `read_committed` client sends
    /// `ListOffsets` with that isolation level. Retried (bounded) while the partition's
    /// leader is not known yet, as right after the topic was created.
    pub(super) fn last_stable_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        let deadline = Instant::now() + self.timeout();
        let high = loop {
            match self.meta.fetch_watermarks(topic, partition as i32, self.timeout()) {
                Ok((_, high)) => break high,
                Err(e) if is_transient(&e) && Instant::now() < deadline => {
                    // librdkafka answers from its metadata cache, which can keep a partition
                    // "unknown" for minutes after a broker restart (a refresh of the same
                    // client did not help): ask a client with fresh metadata.
                    let fresh: Option<BaseConsumer<Quiet>> = consumer_config(&self.options, Some(&self.reader_group()))
                        .create_with_context(Quiet::default())
                        .ok();
                    let wait = deadline
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_secs(2));
                    if let Some(Ok((_, high))) = fresh.map(|c| c.fetch_watermarks(topic, partition as i32, wait)) {
                        break high;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(kafka_error(
                        &format!("cannot query the end offset of {topic}/{partition}"),
                        e,
                    ));
                }
            }
        };
        u64::try_from(high).map_err(|_| Error::Kafka(format!("negative end offset {high} for {topic}/{partition}")))
    }

    /// The high watermark: the end of the log, records of open transactions included.
    pub(super) fn high_watermark(&self, topic: &str, partition: u32) -> Result<u64> {
        let (_, high) = self
            .meta_uncommitted
            .fetch_watermarks(topic, partition as i32, self.timeout())
            .map_err(|e| kafka_error(&format!("cannot query the high watermark of {topic}/{partition}"), e))?;
        u64::try_from(high).map_err(|_| Error::Kafka(format!("negative high watermark {high} for {topic}/{partition}")))
    }

    /// Reads committed records of `topic`/`partition` from `from` (at most `max`) up to
    /// an end: `end()` (a last stable offset), or the one a reader parked at `from` took if
    /// that still covers `ours` (this log's own commits there). `None`: nothing to read.
    pub(super) fn read(
        &self,
        (topic, partition): (&str, u32),
        from: u64,
        max: usize,
        ours: u64,
        end: impl FnOnce() -> Result<u64>,
    ) -> Result<Option<Vec<(u64, Record)>>> {
        let parked = self.readers.take_parked(topic, partition, from);
        let end = match &parked {
            Some(p) if p.end > from && p.end >= ours => p.end,
            _ => match end() {
                Ok(end) => end,
                Err(e) => {
                    if let Some(p) = parked {
                        self.readers.release(p.reader);
                    }
                    return Err(e);
                }
            },
        };
        if max == 0 || from >= end {
            if let Some(p) = parked {
                self.readers.park(topic, partition, p.reader, from, end);
            }
            return Ok(None);
        }
        let (reader, assigned) = match parked {
            Some(p) => (p.reader, true),
            // librdkafka refuses `assign` without a group id; this group never joins
            // nor commits.
            None => match self.readers.take_idle() {
                Some(r) => (r, false),
                None => (
                    consumer_config(&self.options, Some(&self.reader_group()))
                        .create_with_context(Quiet::default())
                        .map_err(|e| kafka_error("cannot create a Kafka consumer", e))?,
                    false,
                ),
            },
        };
        let range = (from, end, max);
        let got = read_range(&reader, topic, partition, range, assigned, self.timeout());
        // A reader that failed is dropped rather than reused in an unknown state.
        if let Ok(out) = &got {
            match out.last() {
                Some((last, _)) if out.len() >= max && last + 1 < end => {
                    self.readers.park(topic, partition, reader, last + 1, end)
                }
                _ => self.readers.release(reader),
            }
        }
        got.map(Some)
    }

    /// A `read_committed` consumer assigned to `starts`, polled by a thread of its own
    /// that hands each partition's records to the returned follower as they arrive
    /// (bounded channel: a slow follower slows the fetching, nothing is dropped).
    pub(super) fn follow(&self, topic: &str, starts: &[(u32, u64)]) -> Result<crate::Follower> {
        let what = || format!("cannot follow {topic}");
        let mut config = consumer_config(&self.options, Some(&self.reader_group()));
        config.set("enable.partition.eof", "false");
        // A follower waits for new records: the broker may park its fetch, which it
        // answers as soon as records (or, read_committed, a transaction's commit) arrive.
        // With the range readers' 20 ms every idle follower cost the broker a fetch per
        // 20 ms.
        if !user_sets(&self.options, "fetch.wait.max.ms") {
            config.set("fetch.wait.max.ms", FOLLOW_FETCH_WAIT_MS);
        }
        let consumer: BaseConsumer<Quiet> = config
            .create_with_context(Quiet::default())
            .map_err(|e| kafka_error(&what(), e))?;
        let mut tpl = TopicPartitionList::new();
        for (p, from) in starts {
            tpl.add_partition_offset(topic, *p as i32, Offset::Offset(*from as i64))
                .map_err(|e| kafka_error(&what(), e))?;
        }
        consumer.assign(&tpl).map_err(|e| kafka_error(&what(), e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let topic = topic.to_owned();
        std::thread::Builder::new()
            .name(format!("eventfold-follow-{topic}"))
            .spawn(move || follow_loop(&consumer, &topic, &tx))
            .map_err(|e| Error::Closed(format!("cannot start a thread to follow {}: {e}", what())))?;
        Ok(crate::Follower::new(rx))
    }

    /// The consumer standing for `group`: never subscribed, it only fetches the group's
    /// committed offsets and provides its metadata to transactions.
    fn group(&self, group: &str) -> Result<Arc<BaseConsumer<Quiet>>> {
        let mut groups = self.groups.lock().expect("groups lock");
        if let Some(c) = groups.get(group) {
            return Ok(c.clone());
        }
        let c: BaseConsumer<Quiet> = consumer_config(&self.options, Some(group))
            .create_with_context(Quiet::default())
            .map_err(|e| kafka_error(&format!("cannot create a consumer for group `{group}`"), e))?;
        let c = Arc::new(c);
        groups.insert(group.to_owned(), c.clone());
        Ok(c)
    }

    /// The metadata `send_offsets_to_transaction` needs for `group`: the member's current
    /// generation when this log joined the group (a member the group moved on from gets
    /// its offsets refused), else generation -1 (the log commits offsets on behalf of a
    /// processor that owns its partitions by other means).
    pub(super) fn group_metadata(&self, group: &str) -> Result<ConsumerGroupMetadata> {
        let joined = self.joined.lock().expect("joined lock").get(group).cloned();
        let metadata = match joined {
            Some(member) => member.consumer().group_metadata(),
            None => self.group(group)?.group_metadata(),
        };
        metadata.ok_or_else(|| Error::Kafka(format!("no consumer group metadata for group `{group}`")))
    }

    /// Whether this log is a member of a consumer group (see `Committer::poison`).
    pub(super) fn has_joined(&self) -> bool {
        !self.joined.lock().expect("joined lock").is_empty()
    }

    /// Joins `group` as a member reading `topics` (see `member.rs`); `on_fatal` runs if
    /// the member is fenced for good (another process joined with its instance id).
    pub(super) fn join(
        &self,
        group: &str,
        topics: &[Arc<str>],
        on_fatal: super::member::OnFatal,
    ) -> Result<crate::Membership> {
        let (membership, control) = super::member::join(&self.options, group, topics, on_fatal)?;
        self.joined
            .lock()
            .expect("joined lock")
            .insert(group.to_owned(), control);
        Ok(membership)
    }

    /// The idempotent, non-transactional producer of `Log::send`, built on first use.
    pub(super) fn sender(&self) -> Result<Arc<FutureProducer>> {
        let mut sender = self.sender.lock().expect("sender lock");
        if let Some(p) = &*sender {
            return Ok(p.clone());
        }
        let p: FutureProducer = producer_config(&self.options)
            .set("enable.idempotence", "true")
            .set(
                "message.timeout.ms",
                self.options.operation_timeout.as_millis().to_string(),
            )
            .create()
            .map_err(|e| kafka_error("cannot create the Kafka producer", e))?;
        let p = Arc::new(p);
        *sender = Some(p.clone());
        Ok(p)
    }

    /// The committed offset of `group` on `topic`/`partition`. The consumer is
    /// `read_committed`, so librdkafka asks for stable offsets: offsets of a transaction
    /// still being completed are waited for, not skipped.
    pub(super) fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        let consumer = self.group(group)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition as i32);
        let what = || format!("cannot fetch the committed offset of group `{group}` on {topic}/{partition}");
        let got = consumer
            .committed_offsets(tpl, self.timeout())
            .map_err(|e| kafka_error(&what(), e))?;
        let elem = got
            .find_partition(topic, partition as i32)
            .ok_or_else(|| Error::Kafka(format!("{}: missing from the answer", what())))?;
        elem.error().map_err(|e| kafka_error(&what(), e))?;
        match elem.offset() {
            Offset::Offset(n) if n >= 0 => Ok(Some(n as u64)),
            Offset::Invalid => Ok(None),
            other => Err(Error::Kafka(format!("{}: unexpected offset {other:?}", what()))),
        }
    }
}

/// Most records handed over in one batch of a follower.
const FOLLOW_BATCH_MAX: usize = 512;

/// `fetch.wait.max.ms` of a follower: how long the broker may park its fetch while there
/// is nothing new (it answers as soon as there is).
const FOLLOW_FETCH_WAIT_MS: &str = "500";

/// Polls `consumer` until the follower is dropped, grouping consecutive records of one
/// partition into batches.
fn follow_loop(
    consumer: &BaseConsumer<Quiet>,
    topic: &str,
    tx: &tokio::sync::mpsc::Sender<Result<crate::FollowedBatch>>,
) {
    let mut batch: Option<crate::FollowedBatch> = None;
    let flush = |batch: &mut Option<crate::FollowedBatch>| match batch.take() {
        Some(b) => tx.blocking_send(Ok(b)).is_ok(),
        None => true,
    };
    while !tx.is_closed() {
        // Wait for the first record; then drain what is already fetched without waiting.
        let timeout = if batch.is_some() {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(timeout) {
            Some(Ok(m)) => {
                let p = m.partition() as u32;
                if m.topic() != topic {
                    continue;
                }
                let full = batch
                    .as_ref()
                    .is_some_and(|(bp, rs)| *bp != p || rs.len() >= FOLLOW_BATCH_MAX);
                if full && !flush(&mut batch) {
                    return;
                }
                batch
                    .get_or_insert_with(|| (p, Vec::new()))
                    .1
                    .push((m.offset() as u64, to_record(&m)));
            }
            Some(Err(e)) => {
                if !flush(&mut batch)
                    || tx
                        .blocking_send(Err(kafka_error(&format!("following {topic}"), e)))
                        .is_err()
                {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None => {
                if !flush(&mut batch) {
                    return;
                }
            }
        }
    }
}

/// Assigns `reader` to the partition at `from` (unless it is `assigned` there already,
/// parked) and polls until `max` records, the end (`end`, a last stable offset taken
/// before), or the partition EOF; bounded by `timeout`.
fn read_range(
    reader: &BaseConsumer<Quiet>,
    topic: &str,
    partition: u32,
    (from, end, max): (u64, u64, usize),
    assigned: bool,
    timeout: Duration,
) -> Result<Vec<(u64, Record)>> {
    let p = partition as i32;
    let what = || format!("cannot read {topic}/{partition} from {from}");
    if !assigned {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(from as i64))
            .map_err(|e| kafka_error(&what(), e))?;
        reader.assign(&tpl).map_err(|e| kafka_error(&what(), e))?;
    }
    let deadline = Instant::now() + timeout;
    let mut out: Vec<(u64, Record)> = Vec::with_capacity(max.min(1024));
    let mut next = from;
    let mut saw_eof = false;
    let mut quiet_at_end = 0;
    while out.len() < max && next < end {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Kafka(format!(
                "{}: reached offset {next} of {end} within {timeout:?}",
                what()
            )));
        }
        let slice = if saw_eof {
            Duration::from_millis(20)
        } else {
            Duration::from_millis(100)
        };
        match reader.poll((deadline - now).min(slice)) {
            Some(Ok(m)) => {
                quiet_at_end = 0;
                // Only this assignment's records, each once, in order.
                let off = m.offset();
                if m.topic() != topic || m.partition() != p || off < next as i64 {
                    continue;
                }
                next = off as u64 + 1;
                if next <= end {
                    out.push((off as u64, to_record(&m)));
                }
            }
            // The end of what is committed: control records (transaction markers) may
            // sit between the last record and `end`. A partition end is only a hint: a pooled reader may still hold one of its
            // previous assignment (it names only the partition number), and the fetch
            // position runs ahead of what poll delivered. Keep polling briefly: an empty
            // poll means the local queue is drained, and then the position decides.
            Some(Err(KafkaError::PartitionEOF(eof))) if eof == p => saw_eof = true,
            Some(Err(e)) => return Err(kafka_error(&what(), e)),
            None => {
                // Past the last record only markers may remain; the consumer position
                // moves past them once fetched. The position is updated when a fetch
                // arrives, the messages are queued for poll just after: only two empty
                // polls in a row at that position mean nothing is left to deliver.
                if position(reader, topic, p).is_some_and(|pos| pos >= end) {
                    quiet_at_end += 1;
                    if quiet_at_end >= 2 {
                        break;
                    }
                    saw_eof = true; // short slices from here on
                }
            }
        }
    }
    Ok(out)
}

/// Errors of a partition whose leadership or metadata is settling.
fn is_transient(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    )
}

fn position(reader: &BaseConsumer<Quiet>, topic: &str, partition: i32) -> Option<u64> {
    let tpl = reader.position().ok()?;
    match tpl.find_partition(topic, partition)?.offset() {
        Offset::Offset(n) if n >= 0 => Some(n as u64),
        _ => None,
    }
}
