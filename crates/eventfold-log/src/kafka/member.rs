//! Consumer-group membership ([`Coordinated::join`](crate::Coordinated::join)): a `read_committed` consumer
//! subscribed to the input topics with the cooperative-sticky assignor, polled by a thread
//! of its own. Its rebalance callbacks report assignments and revocations; a revocation
//! blocks the callback (so the group waits) until the runtime has finished the in-flight
//! work on the partitions. The same consumer provides the group metadata transactions
//! commit offsets with, so the broker refuses offsets from a member the group has moved
//! on from (KIP-447).

use super::common::{consumer_config, kafka_error, to_record};
use super::options::KafkaOptions;
use crate::{Error, GroupEvent, MemberControl, Result, RevokeAck};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;
use tokio::sync::mpsc as tmpsc;

/// Most records handed over in one batch.
const BATCH_MAX: usize = 512;

type Tp = (Arc<str>, u32);

/// Called when the member is fenced for good.
pub(super) type OnFatal = Arc<dyn Fn(String) + Send + Sync>;

/// What the consumer thread and the rebalance callbacks share.
pub(super) struct MemberState {
    on_fatal: OnFatal,
    group: String,
    topics: Vec<Arc<str>>,
    events: tmpsc::Sender<GroupEvent>,
    /// Epoch of every assigned partition.
    epochs: Mutex<HashMap<Tp, u64>>,
    next_epoch: AtomicU64,
    rebalances: AtomicU64,
    /// How long a revocation waits for the runtime.
    revoke_timeout: Duration,
    /// Set by the error callback when the group fenced this member's instance id.
    fenced: std::sync::atomic::AtomicBool,
}

impl MemberState {
    fn topic(&self, name: &str) -> Option<Arc<str>> {
        self.topics.iter().find(|t| &***t == name).cloned()
    }

    fn list(&self, tpl: &TopicPartitionList) -> Vec<Tp> {
        tpl.elements()
            .iter()
            .filter_map(|e| Some((self.topic(e.topic())?, e.partition() as u32)))
            .collect()
    }

    fn epoch(&self, tp: &Tp) -> u64 {
        self.epochs.lock().expect("epochs lock").get(tp).copied().unwrap_or(0)
    }

    fn bump(&self, tp: Tp) -> u64 {
        let e = self.next_epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.epochs.lock().expect("epochs lock").insert(tp, e);
        e
    }
}

/// The consumer's context: rebalance callbacks run on the consumer thread, inside `poll`.
pub(super) struct MemberContext(Arc<MemberState>);

impl rdkafka::client::ClientContext for MemberContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::error!(group = %self.0.group, %error, reason, "librdkafka consumer group error");
        // A fatal consumer error: typically another process joined with this instance's
        // group.instance.id (a second copy of this instance). Nothing may be written any more.
        // librdkafka also reports it when its own session timed out (e.g. the broker was
        // away longer than the session timeout) and it rejoined under a new member id: the
        // consumer is dead either way, and the poll loop builds a new one (a second copy
        // of this instance would fence it again, which stops the log; see `poll_loop`).
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::FencedInstanceId)
        ) {
            self.0.fenced.store(true, Ordering::Release);
        }
    }
}

impl ConsumerContext for MemberContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let s = &self.0;
        s.rebalances.fetch_add(1, Ordering::Relaxed);
        let partitions = s.list(tpl);
        if partitions.is_empty() {
            return;
        }
        let lost = consumer.assignment_lost();
        {
            let mut epochs = s.epochs.lock().expect("epochs lock");
            for tp in &partitions {
                epochs.remove(tp);
            }
        }
        tracing::info!(group = %s.group, partitions = partitions.len(), lost, "partitions revoked; finishing their in-flight work");
        let (tx, rx) = mpsc::sync_channel(1);
        let event = GroupEvent::Revoked {
            partitions,
            lost,
            done: RevokeAck::new(tx),
        };
        if s.events.blocking_send(event).is_ok() && rx.recv_timeout(s.revoke_timeout).is_err() {
            tracing::warn!(group = %s.group, timeout = ?s.revoke_timeout, "revoked partitions not released in time; leaving them to the group");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let s = &self.0;
        match rebalance {
            Rebalance::Assign(tpl) => {
                s.rebalances.fetch_add(1, Ordering::Relaxed);
                let assigned: Vec<(Arc<str>, u32, u64)> = s
                    .list(tpl)
                    .into_iter()
                    .map(|tp| {
                        let e = s.bump(tp.clone());
                        (tp.0, tp.1, e)
                    })
                    .collect();
                // Sent even when empty: the member has joined (an instance with nothing
                // to own is ready).
                tracing::info!(group = %s.group, partitions = assigned.len(), "partitions assigned");
                let _ = s.events.blocking_send(GroupEvent::Assigned(assigned));
            }
            Rebalance::Error(e) => {
                tracing::error!(group = %s.group, error = %e, "rebalance failed");
                let _ = s.events.blocking_send(GroupEvent::Error(kafka_error(
                    "consumer group rebalance failed",
                    e.clone(),
                )));
            }
            Rebalance::Revoke(_) => {}
        }
    }
}

/// A seek asked of the consumer thread.
struct Seek {
    tp: Tp,
    offset: u64,
    reply: mpsc::SyncSender<Result<u64>>,
}

/// The [`MemberControl`] of a Kafka membership.
pub(super) struct Control {
    state: Arc<MemberState>,
    seeks: Mutex<mpsc::Sender<Seek>>,
    /// The member's consumer (replaced when the group fenced it, see `poll_loop`).
    consumer: Mutex<Arc<BaseConsumer<MemberContext>>>,
    timeout: Duration,
}

impl MemberControl for Control {
    fn seek(&self, topic: &str, partition: u32, offset: u64) -> Result<u64> {
        let topic = self
            .state
            .topic(topic)
            .ok_or_else(|| Error::Config(format!("`{topic}` is not a topic of group `{}`", self.state.group)))?;
        let (reply, rx) = mpsc::sync_channel(1);
        self.seeks
            .lock()
            .expect("seeks lock")
            .send(Seek {
                tp: (topic, partition),
                offset,
                reply,
            })
            .map_err(|_| Error::Closed("the group member stopped".into()))?;
        rx.recv_timeout(self.timeout + Duration::from_secs(1))
            .map_err(|_| Error::Kafka("the group member did not seek in time".into()))?
    }

    fn rebalances(&self) -> u64 {
        self.state.rebalances.load(Ordering::Relaxed)
    }

    fn assignment(&self) -> Vec<(Arc<str>, u32)> {
        let mut v: Vec<Tp> = self.state.epochs.lock().expect("epochs lock").keys().cloned().collect();
        v.sort();
        v
    }

    fn pause(&self, topic: &str, partition: u32) {
        self.flow(topic, partition, true);
    }

    fn resume(&self, topic: &str, partition: u32) {
        self.flow(topic, partition, false);
    }
}

impl Control {
    /// Pauses or resumes fetching one partition (librdkafka's pause is thread-safe). A
    /// partition not assigned (any more) is left alone: an assignment starts unpaused.
    fn flow(&self, topic: &str, partition: u32, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition as i32);
        let consumer = self.consumer();
        let done = if pause {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if let Err(e) = done {
            tracing::debug!(group = %self.state.group, topic, partition, pause, error = %e, "cannot pause or resume a partition");
        } else {
            tracing::debug!(group = %self.state.group, topic, partition, pause, "partition fetching paused or resumed");
        }
    }
}

impl Control {
    /// The consumer whose metadata transactions commit offsets of this group with.
    pub(super) fn consumer(&self) -> Arc<BaseConsumer<MemberContext>> {
        self.consumer.lock().expect("consumer lock").clone()
    }
}

/// Joins `group` for `topics` and starts the consumer thread.
pub(super) fn join(
    options: &KafkaOptions,
    group: &str,
    topics: &[Arc<str>],
    on_fatal: OnFatal,
) -> Result<(crate::Membership, Arc<Control>)> {
    let what = || format!("cannot join consumer group `{group}`");
    let (events, rx) = tmpsc::channel(64);
    let state = Arc::new(MemberState {
        on_fatal,
        group: group.to_owned(),
        topics: topics.to_vec(),
        events,
        epochs: Mutex::new(HashMap::new()),
        next_epoch: AtomicU64::new(0),
        rebalances: AtomicU64::new(0),
        revoke_timeout: options.operation_timeout,
        fenced: std::sync::atomic::AtomicBool::new(false),
    });
    let session_ms = options.session_timeout.as_millis().to_string();
    let heartbeat_ms = (options.session_timeout.as_millis() / 5).max(100).to_string();
    let mut config = consumer_config(options, Some(group));
    config
        .set("enable.partition.eof", "false")
        .set("partition.assignment.strategy", "cooperative-sticky")
        // Static membership (KIP-345): a restarted instance takes its previous member's
        // place, and its partitions back, without a rebalance if it returns within the
        // session timeout; its previous incarnation is fenced (FENCED_INSTANCE_ID).
        .set("group.instance.id", &options.transactional_id)
        .set("session.timeout.ms", &session_ms)
        .set("heartbeat.interval.ms", &heartbeat_ms)
        // A fetch waits in the broker until 64 KiB of commands are there or 20 ms have
        // passed: the latency of a command produced to an idle partition. Returning as
        // soon as one command is there made fetches of one or two commands at a steady
        // load, each a request for the broker and a wake-up for the member (figures:
        // bench/FINDINGS.md, "Moved from code comments").
        .set("fetch.wait.max.ms", "20")
        .set("fetch.min.bytes", "65536");
    for (k, v) in &options.client_config {
        config.set(k, v);
    }
    let consumer = subscribed(&config, &state).map_err(|e| kafka_error(&what(), e))?;
    let (seek_tx, seek_rx) = mpsc::channel();
    let control = Arc::new(Control {
        state: state.clone(),
        seeks: Mutex::new(seek_tx),
        consumer: Mutex::new(consumer),
        timeout: options.operation_timeout,
    });
    let thread_control = control.clone();
    let timeout = options.operation_timeout;
    std::thread::Builder::new()
        .name(format!("eventfold-group-{group}"))
        .spawn(move || run_member(&config, &thread_control, &state, &seek_rx, timeout))
        .map_err(|e| Error::Closed(format!("{}: cannot start its thread: {e}", what())))?;
    Ok((crate::Membership::new(rx, control.clone()), control))
}

/// A consumer of the member's configuration, subscribed to its topics.
fn subscribed(
    config: &rdkafka::ClientConfig,
    state: &Arc<MemberState>,
) -> std::result::Result<Arc<BaseConsumer<MemberContext>>, KafkaError> {
    let consumer: BaseConsumer<MemberContext> = config.create_with_context(MemberContext(state.clone()))?;
    let names: Vec<&str> = state.topics.iter().map(|t| &**t).collect();
    consumer.subscribe(&names)?;
    Ok(Arc::new(consumer))
}

/// Fences of this member's instance id within [`FENCE_WINDOW`] after which it stops: a
/// second process with the same instance id, not a session of its own that timed out.
const FENCES_TOLERATED: usize = 3;
/// See [`FENCES_TOLERATED`].
const FENCE_WINDOW: Duration = Duration::from_secs(300);

/// The consumer thread: polls (see [`poll_loop`]); when the group fenced the member's
/// instance id, tells the runtime its partitions are lost and joins again with a new
/// consumer (librdkafka's consumer is dead after that error). Fenced again and again
/// ([`FENCES_TOLERATED`] times within [`FENCE_WINDOW`]), it stops the log: another process
/// holds this instance id.
fn run_member(
    config: &rdkafka::ClientConfig,
    control: &Control,
    s: &Arc<MemberState>,
    seeks: &mpsc::Receiver<Seek>,
    timeout: Duration,
) {
    let mut fences: Vec<std::time::Instant> = Vec::new();
    loop {
        let consumer = control.consumer();
        poll_loop(&consumer, s, seeks, timeout);
        if !s.fenced.swap(false, Ordering::AcqRel) || s.events.is_closed() {
            return leave(&consumer, s);
        }
        let now = std::time::Instant::now();
        fences.retain(|t| now.duration_since(*t) < FENCE_WINDOW);
        fences.push(now);
        if fences.len() >= FENCES_TOLERATED {
            (s.on_fatal)(format!(
                "the consumer group fenced this instance's group.instance.id {} times within {FENCE_WINDOW:?}: another process runs with the same instance id; stop it, then restart this one",
                fences.len()
            ));
            return;
        }
        tracing::warn!(group = %s.group, "the consumer group fenced this member (its session had timed out); joining again");
        // Everything the dead consumer had is lost.
        let lost: Vec<Tp> = {
            let mut epochs = s.epochs.lock().expect("epochs lock");
            epochs.drain().map(|(tp, _)| tp).collect()
        };
        if !lost.is_empty() {
            let (tx, rx) = mpsc::sync_channel(1);
            let event = GroupEvent::Revoked {
                partitions: lost,
                lost: true,
                done: RevokeAck::new(tx),
            };
            if s.events.blocking_send(event).is_err() {
                return;
            }
            let _ = rx.recv_timeout(s.revoke_timeout);
        }
        drop(consumer);
        let fresh = loop {
            match subscribed(config, s) {
                Ok(c) => break c,
                Err(e) => {
                    tracing::error!(group = %s.group, error = %e, "cannot create a consumer to join again; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        };
        *control.consumer.lock().expect("consumer lock") = fresh;
    }
}

/// Polls until the membership is dropped: records of one partition are grouped into
/// batches stamped with the partition's epoch; seeks run here, between polls, so that a
/// record is stamped with the epoch of the position it was fetched from.
fn poll_loop(consumer: &BaseConsumer<MemberContext>, s: &MemberState, seeks: &mpsc::Receiver<Seek>, timeout: Duration) {
    type Batch = (Tp, u64, Vec<(u64, eventfold_core::Record)>);
    let mut batch: Option<Batch> = None;
    let flush = |batch: &mut Option<Batch>| match batch.take() {
        Some(((topic, partition), epoch, records)) => s
            .events
            .blocking_send(GroupEvent::Records {
                topic,
                partition,
                epoch,
                records,
            })
            .is_ok(),
        None => true,
    };
    while !s.events.is_closed() && !s.fenced.load(Ordering::Acquire) {
        while let Ok(seek) = seeks.try_recv() {
            if !flush(&mut batch) {
                break;
            }
            let (topic, p) = (&seek.tp.0, seek.tp.1);
            let answer = if s.epochs.lock().expect("epochs lock").contains_key(&seek.tp) {
                consumer
                    .seek(topic, p as i32, Offset::Offset(seek.offset as i64), timeout)
                    .map(|()| s.bump(seek.tp.clone()))
                    .map_err(|e| kafka_error(&format!("cannot seek {topic}/{p} to {}", seek.offset), e))
            } else {
                Err(Error::Config(format!("{topic}/{p} is not assigned to this member")))
            };
            let _ = seek.reply.send(answer);
        }
        let wait = if batch.is_some() {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(wait) {
            Some(Ok(m)) => {
                let Some(topic) = s.topic(m.topic()) else {
                    continue;
                };
                let tp = (topic, m.partition() as u32);
                let epoch = s.epoch(&tp);
                let full = batch
                    .as_ref()
                    .is_some_and(|(btp, be, rs)| *btp != tp || *be != epoch || rs.len() >= BATCH_MAX);
                if full && !flush(&mut batch) {
                    break;
                }
                batch
                    .get_or_insert_with(|| (tp, epoch, Vec::new()))
                    .2
                    .push((m.offset() as u64, to_record(&m)));
            }
            Some(Err(e)) => {
                if !flush(&mut batch) {
                    break;
                }
                if e.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
                    tracing::warn!(group = %s.group, error = %e, "consumer group poll failed; it retries");
                    if s.events
                        .blocking_send(GroupEvent::Error(kafka_error("consuming the group's topics", e)))
                        .is_err()
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            None => {
                if !flush(&mut batch) {
                    break;
                }
            }
        }
    }
    flush(&mut batch);
}

/// Leaves the group: the revocation this triggers finds the events channel closed and does
/// not wait for anyone.
fn leave(consumer: &BaseConsumer<MemberContext>, s: &MemberState) {
    tracing::info!(group = %s.group, "leaving the consumer group");
    consumer.unsubscribe();
    // Serve the revocation callback the unsubscribe triggers, so the group rebalances now
    // rather than after the session timeout.
    for _ in 0..10 {
        if consumer.assignment().is_ok_and(|a| a.count() == 0) {
            break;
        }
        let _ = consumer.poll(Duration::from_millis(100));
    }
}
