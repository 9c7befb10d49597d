//! Request/reply through Kafka: a command for a partition another instance owns is
//! produced to `<app>.<type>.commands` with `ef-reply-partition` naming the results
//! partition this instance listens to; the owner commits it like any commands-topic
//! record and writes its outcome there. One follower per results topic hands each outcome
//! to the caller waiting for its command id. No outcome in time: 504, and a retry with
//! the same Idempotency-Key returns the original outcome (the owner deduplicates).

use crate::clock::Clock;
use crate::command::{CommandRequest, Topics, VERSION_MISMATCH};
use crate::error::{Error, Result};
use eventfold_core::envelope::headers;
use eventfold_core::{Outcome, Position, Record, partition::partition_for};
use eventfold_log::{Append, Log};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

type Waiters = HashMap<String, Vec<oneshot::Sender<Record>>>;

/// Sends commands to their owners and collects the outcomes (see the module docs).
pub(crate) struct Requester {
    log: Arc<dyn Log>,
    clock: Arc<dyn Clock>,
    /// The results partition this instance listens to.
    reply_partition: u32,
    waiters: Mutex<Waiters>,
    /// How many results topics are followed (callers wait for all before producing, so no
    /// outcome can land before the follower's start).
    following: watch::Receiver<usize>,
    topics: usize,
    /// The results topics not followed yet: followers start with the first command sent
    /// to another instance (an instance that owns everything never needs them).
    unfollowed: Mutex<Vec<Arc<str>>>,
    started: Arc<watch::Sender<usize>>,
}

impl Requester {
    /// A requester that will follow partition `murmur2(instance_id)` of every results
    /// topic (from the first command it sends on).
    pub(crate) fn start(
        log: Arc<dyn Log>,
        clock: Arc<dyn Clock>,
        instance_id: &str,
        results: Vec<Arc<str>>,
    ) -> Arc<Self> {
        let reply_partition = partition_for(instance_id.as_bytes(), log.partitions());
        let (started, following) = watch::channel(0usize);
        Arc::new(Self {
            log,
            clock,
            reply_partition,
            waiters: Mutex::new(HashMap::new()),
            following,
            topics: results.len(),
            unfollowed: Mutex::new(results),
            started: Arc::new(started),
        })
    }

    /// Starts the results followers, once.
    fn follow_results(self: &Arc<Self>) {
        let topics = std::mem::take(&mut *self.unfollowed.lock().expect("unfollowed lock"));
        for topic in topics {
            tokio::spawn(follow(
                Arc::downgrade(self),
                self.log.clone(),
                topic,
                self.reply_partition,
                self.started.clone(),
            ));
        }
    }

    /// Produces the command to partition `p` of `topics.commands` and waits (up to
    /// `timeout`) for its outcome.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        topics: &Topics,
        p: u32,
        command_type: &str,
        req: CommandRequest,
        timeout: Duration,
    ) -> Result<Outcome> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.follow_results();
        let mut following = self.following.clone();
        let all = self.topics;
        if tokio::time::timeout_at(deadline, following.wait_for(|n| *n >= all))
            .await
            .is_err()
        {
            return Err(Error::Timeout(timeout));
        }
        let command_id = req
            .idempotency_key
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let expected = req.expected_version;
        let record = self.command_record(command_type, &command_id, req);
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .expect("waiters lock")
            .entry(command_id.clone())
            .or_default()
            .push(tx);
        let sent = self
            .log
            .send(Append {
                topic: topics.commands.clone(),
                partition: p,
                record,
                entity: None,
            })
            .await;
        if let Err(e) = sent {
            self.forget(&command_id);
            return Err(Error::Unavailable(e.to_string()));
        }
        let result = match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err(Error::ShuttingDown),
            Err(_) => {
                self.forget(&command_id);
                return Err(Error::Timeout(timeout));
            }
        };
        self.read_outcome(topics, p, &command_id, expected, result).await
    }

    /// The command as a commands-topic record, its reply addressed to this instance.
    fn command_record(&self, command_type: &str, command_id: &str, req: CommandRequest) -> Record {
        let mut record = Record {
            key: req.aggregate_id.into_bytes(),
            value: req.body,
            headers: Vec::with_capacity(7),
            timestamp_ms: self.clock.now_ms(),
        }
        .with_header(headers::TYPE, command_type)
        .with_header(headers::ID, uuid::Uuid::now_v7().to_string())
        .with_header(headers::COMMAND_ID, command_id)
        .with_header(
            headers::CORRELATION_ID,
            req.correlation_id.as_deref().unwrap_or(command_id),
        )
        .with_header(headers::REPLY_PARTITION, self.reply_partition.to_string())
        .with_header(headers::CONTENT_TYPE, "application/json");
        if let Some(c) = &req.causation_id {
            record = record.with_header(headers::CAUSATION_ID, c.as_str());
        }
        if let Some(v) = req.expected_version {
            record = record.with_header(headers::EXPECTED_VERSION, v.to_string());
        }
        record
    }

    /// The owner's outcome record as the caller's result.
    async fn read_outcome(
        &self,
        topics: &Topics,
        p: u32,
        command_id: &str,
        expected: Option<u64>,
        result: Record,
    ) -> Result<Outcome> {
        let outcome: Outcome = serde_json::from_slice(&result.value).map_err(|e| {
            Error::Log(eventfold_log::Error::Kafka(format!(
                "the outcome of command {command_id:?} on {} does not decode: {e}",
                topics.results
            )))
        })?;
        match outcome {
            Outcome::Rejected { error, .. } if error == VERSION_MISMATCH => Err(Error::VersionMismatch {
                expected: expected.unwrap_or_default(),
                actual: result
                    .header_str(headers::VERSION)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_default(),
            }),
            Outcome::Accepted(mut a) => {
                if a.position.is_empty() {
                    // Written before its offsets were known: the end of the events partition
                    // now covers them (their transaction committed before the outcome showed).
                    let end = self.log.end_offset(&topics.events, p).await?;
                    a.position = Position::token_at(&topics.events, p, end);
                }
                Ok(Outcome::Accepted(a))
            }
            other => Ok(other),
        }
    }

    fn forget(&self, command_id: &str) {
        let mut w = self.waiters.lock().expect("waiters lock");
        if let Some(list) = w.get_mut(command_id) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                w.remove(command_id);
            }
        }
    }

    fn deliver(&self, record: Record) {
        let id = match record.header_str(headers::COMMAND_ID) {
            Some(id) => id.to_owned(),
            None => String::from_utf8_lossy(&record.key).into_owned(),
        };
        let waiting = self.waiters.lock().expect("waiters lock").remove(&id);
        for tx in waiting.into_iter().flatten() {
            let _ = tx.send(record.clone());
        }
    }
}

/// Follows `topic`/`partition` from its end now, until the requester is dropped.
async fn follow(
    me: std::sync::Weak<Requester>,
    log: Arc<dyn Log>,
    topic: Arc<str>,
    partition: u32,
    started: Arc<watch::Sender<usize>>,
) {
    let mut follower = loop {
        let attempt = match log.end_offset(&topic, partition).await {
            Ok(end) => log
                .require_coordination()
                .and_then(|c| c.follow(&topic, &[(partition, end)])),
            Err(e) => Err(e),
        };
        match attempt {
            Ok(f) => break f,
            Err(e) => {
                tracing::warn!(%topic, partition, error = %e, "cannot follow the results topic; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    started.send_modify(|n| *n += 1);
    tracing::info!(%topic, partition, "following outcomes of commands sent to other instances");
    while let Some(batch) = follower.next().await {
        let Some(me) = me.upgrade() else {
            return;
        };
        match batch {
            Ok((_, records)) => records.into_iter().for_each(|(_, r)| me.deliver(r)),
            Err(e) => tracing::warn!(%topic, error = %e, "following the results topic failed; it retries"),
        }
    }
}
