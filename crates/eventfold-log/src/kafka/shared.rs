//! What the Kafka log, its committer lanes and its readers share: options, clients,
//! the offsets this log committed, the groups between their commit and their local write,
//! and the reason the log stopped.

use super::clients::Clients;
use super::options::KafkaOptions;
use super::provision::Provisioner;
use crate::{Error, Receipt, Result};
use eventfold_core::Record;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Counters of the committer (see [`crate::Stats`]).
pub(in crate::kafka) use crate::Counters as Stats;

/// A topic and one of its partitions.
pub(super) type TopicPartition = (Arc<str>, u32);

/// What the committer and the readers share.
pub(super) struct Shared {
    pub(super) options: KafkaOptions,
    pub(super) provisioner: Provisioner,
    pub(super) clients: Clients,
    /// Per partition, the offset after the last record this log committed: the LSO must
    /// reach it before `end_offset` answers (read-your-commits, see the module docs).
    pub(super) committed_ends: Mutex<HashMap<TopicPartition, u64>>,
    /// Why the log stopped (fenced, or the local store failed after a commit): set by any
    /// committer lane, it stops them all (a fenced instance is a zombie as a whole).
    pub(super) poisoned: Mutex<Option<String>>,
    /// Commit groups between their transaction's commit and their local store write.
    pub(super) applying: Arc<Applying>,
    /// The log's counters (the committers count commits, readers their broker requests).
    pub(super) stats: Arc<Stats>,
    /// Partitions only this log writes now, its store holding their earlier records
    /// ([`Coordinated::set_sole_writer`](crate::Coordinated::set_sole_writer)).
    pub(super) sole: Mutex<std::collections::HashSet<TopicPartition>>,
}

/// The commit groups whose transaction others may already see (another instance answers
/// a command's outcome from the results topic once the transaction commits) while the
/// committer has not yet written it to the local store: [`Coordinated::applied`](crate::Coordinated::applied) waits for the
/// ones that began before it was called.
#[derive(Default)]
pub(super) struct Applying {
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
pub(super) struct ApplyTicket {
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
    pub(super) fn begin(self: &Arc<Self>) -> ApplyTicket {
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
    pub(super) fn ended_below(&self, limit: u64) -> bool {
        let state = self.state.lock().expect("applying lock");
        state.pending.first().is_none_or(|first| *first >= limit)
    }

    /// Waits until every group that began before this call has ended, at most `bound`.
    pub(super) async fn wait(&self, bound: Duration) {
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

impl Shared {
    pub(super) fn check_partition(&self, topic: &str, partition: u32) -> Result<()> {
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
    pub(super) fn committed_end(&self, topic: &str, partition: u32) -> u64 {
        self.committed_ends
            .lock()
            .expect("committed ends lock")
            .get(&(Arc::from(topic), partition))
            .copied()
            .unwrap_or(0)
    }

    /// Whether a read from `from` of `topic`/`partition`, beyond what the local cache holds,
    /// has nothing to find: only this log writes the partition ([`Coordinated::set_sole_writer`](crate::Coordinated::set_sole_writer)),
    /// its own commits there end at or before `from` (the cache holds them) and the log is
    /// not stopped. Offsets past the cache are then only transaction markers.
    pub(super) fn nothing_beyond(&self, topic: &str, partition: u32, from: u64) -> bool {
        let sole = self
            .sole
            .lock()
            .expect("sole writer lock")
            .contains(&(Arc::from(topic), partition));
        sole && self.committed_end(topic, partition) <= from && self.poisoned.lock().expect("poisoned lock").is_none()
    }

    /// The last stable offset of `topic`/`partition`, once it covers our own commits.
    pub(super) fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
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
    /// the partition at this instant is decided (see [`Coordinated::settle`](crate::Coordinated::settle)).
    pub(super) fn settle(&self, topic: &str, partition: u32) -> Result<bool> {
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

    pub(super) fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        let ours = self.committed_end(topic, partition);
        let end = || self.end_offset(topic, partition);
        match self.clients.read((topic, partition), from, max, ours, end)? {
            Some(records) => {
                self.stats.broker_reads.fetch_add(1, Ordering::Relaxed);
                Ok(records)
            }
            None => Ok(Vec::new()),
        }
    }

    pub(super) fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.check_partition(topic, partition)?;
        self.clients.committed_offset(group, topic, partition)
    }
}

/// Where the committer answers a unit.
pub(super) type Reply = oneshot::Sender<Result<Receipt>>;
