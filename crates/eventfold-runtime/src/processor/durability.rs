//! What differs between the backends, chosen once when the processor is built
//! ([`Durability::of`]) rather than asked again on the command path.
//!
//! - [`Durability::Local`], the embedded log: the store is the log. A unit's local
//!   changes are all there is to write; the process owns every partition from the start;
//!   a failed commit stops the partition (the log is fail-stop).
//! - [`Durability::Replicated`], Kafka: the store is a cache of the topics. A unit also
//!   writes changelog records (states, outcomes) to the state topic and outcomes for
//!   senders on the results topic, and commits its consumed offset, whose commit checks
//!   the consumer group's generation (the epoch of ownership); a partition is restored by
//!   replaying its changelogs after the group assigned it, and recovers from a failed
//!   commit by restoring from the committed state.
//!
//! Every call the processor makes to the log's Kafka-only capabilities (`store_is_cache`,
//! `set_sole_writer`, `settle`, `resume`) and to the group member is in this module.

use super::phase::{Event, Phase};
use super::replay::Replay;
use crate::changelog;
use crate::command::Topics;
use crate::error::Result;
use eventfold_core::Aggregate;
use eventfold_log::{Append, Log, MemberControl};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The consumer group member that feeds the commands topics, once the instance joined.
pub(crate) type Member = Arc<OnceLock<Arc<dyn MemberControl>>>;

/// How a partition's commits are made durable and its store restored: see the module's
/// documentation.
pub(crate) enum Durability {
    /// The embedded log.
    Local,
    /// Kafka.
    Replicated {
        /// The group member: a recovery seeks it back to the committed offset.
        member: Member,
    },
}

/// Where and when the records of a decision are written.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub topics: &'a Topics,
    pub partition: u32,
    pub now: i64,
}

impl Durability {
    /// The strategy of `log`'s backend.
    pub fn of(log: &dyn Log, member: Member) -> Self {
        if log.coordination().is_some() {
            Durability::Replicated { member }
        } else {
            Durability::Local
        }
    }

    /// Whether partitions are owned through a consumer group (and restored from it).
    pub fn replicated(&self) -> bool {
        matches!(self, Durability::Replicated { .. })
    }

    /// The phase a processor starts in: the embedded log's process owns every partition
    /// and restores it at once; on Kafka the group assigns it.
    pub fn first_phase(&self) -> Phase {
        match self {
            Durability::Local => Phase::Restoring,
            Durability::Replicated { .. } => Phase::Remote,
        }
    }

    /// What a failed commit is to the lifecycle: Kafka holds the committed state, so the
    /// partition recovers from it; the embedded log stopped (fail-stop), so it stops.
    pub fn commit_failed(&self, reason: String) -> Event {
        match self {
            Durability::Local => Event::Stopped,
            Durability::Replicated { .. } => Event::CommitFailed { reason },
        }
    }

    // The decision's records (pure).

    /// The results partition a command's outcome goes to besides its caller: that of a
    /// commands-topic record's sender (`from_topic`; its own, else this partition), on
    /// Kafka. `None`: the caller is answered in this process only.
    pub fn results_partition(&self, from_topic: bool, reply_partition: Option<u32>, partition: u32) -> Option<u32> {
        (self.replicated() && from_topic).then(|| reply_partition.unwrap_or(partition))
    }

    /// The state-topic record of a keyed command's accepted outcome (by reference to its
    /// events), which restores the dedup table of the next owner.
    pub fn accepted_record(
        &self,
        at: At<'_>,
        command_id: &str,
        aggregate_id: &str,
        version: u64,
        count: u32,
    ) -> Option<Append> {
        self.replicated().then(|| {
            let topic = &at.topics.state;
            changelog::accepted_record(topic, at.partition, command_id, aggregate_id, version, count, at.now)
        })
    }

    /// The state-topic record of a keyed command's other outcome (`json`).
    pub fn outcome_record(&self, at: At<'_>, command_id: &str, json: &[u8]) -> Option<Append> {
        self.replicated()
            .then(|| changelog::outcome_record(&at.topics.state, at.partition, command_id, json, at.now))
    }

    /// Whether every new state of an aggregate is written (Kafka: the state topic
    /// restores the store of an instance that takes the partition over), not only those
    /// the store keeps (see `snapshot`).
    pub fn keeps_every_state(&self) -> bool {
        self.replicated()
    }

    /// The state-topic record of aggregate `id`'s state `json` at `version`.
    pub fn state_record(&self, at: At<'_>, id: &str, version: u64, json: &[u8]) -> Option<Append> {
        self.replicated()
            .then(|| changelog::state_record(&at.topics.state, at.partition, id, version, json, at.now))
    }

    // Consumed offsets.

    /// Whether a unit that writes `written` slots commits the partition's consumed
    /// offset, `advanced` or not. With a consumer group, every unit that writes does
    /// (unchanged if it consumed nothing): the broker checks the group generation then, so
    /// an instance the group has moved on from (a zombie, e.g. one that was paused) cannot
    /// write to a partition that another instance owns now.
    pub fn commits_consumed(&self, advanced: bool, written: usize) -> bool {
        advanced || (self.replicated() && written > 0)
    }

    /// Whether the consumed offset is known here (for `/v1/cluster`): when a consumer
    /// group feeds the partition and this instance `owned` it.
    pub fn shows_consumed(&self, owned: bool) -> bool {
        self.replicated() && owned
    }

    // The log's capabilities that differ.

    /// Tells the log whether this instance alone writes the partition's events now: when
    /// ready, it owns the partition and restored it ([`Coordinated::set_sole_writer`](eventfold_log::Coordinated::set_sole_writer), which spares
    /// the views' reads at the end a request to the broker in Kafka mode).
    pub fn set_sole_writer(&self, log: &dyn Log, topics: &Topics, partition: u32, sole: bool) {
        if let (true, Some(c)) = (self.replicated(), log.coordination()) {
            c.set_sole_writer(&topics.events, partition, sole);
        }
    }

    /// The restore's first step: Kafka replays the changelogs into the local store; the
    /// embedded store is the log already.
    pub async fn restore<A: Aggregate>(&self, replay: Replay<'_>) -> Result<()> {
        match self {
            Durability::Local => Ok(()),
            Durability::Replicated { .. } => replay.run::<A>().await,
        }
    }

    /// Waits (bounded) until the transactions open on the events and state partitions
    /// are decided (see [`Coordinated::settle`](eventfold_log::Coordinated::settle)): a previous owner's last commit is then inside
    /// the spans a restore reads.
    pub async fn settle(&self, log: &dyn Log, topics: &Topics, partition: u32) -> Result<()> {
        if self.replicated() {
            for topic in [&topics.events, &topics.state] {
                log.require_coordination()?.settle(topic, partition).await?;
            }
        }
        Ok(())
    }

    /// Lifts the fence a failed commit left on `lane`, rebuilding a failed producer
    /// ([`Coordinated::resume`](eventfold_log::Coordinated::resume)); the embedded log has none to lift (it does not resume).
    pub async fn resume(&self, log: &dyn Log, lane: u32) -> eventfold_log::Result<()> {
        match self {
            Durability::Local => Err(eventfold_log::Error::Config(format!(
                "the {} log does not resume lane {lane} after a failure; restart the process",
                log.backend()
            ))),
            Durability::Replicated { .. } => log.require_coordination()?.resume(lane).await,
        }
    }

    /// Has the group member fetch the commands topic `topic` again from `group`'s
    /// committed offset, retrying while it cannot: `(epoch, offset)` it fetches from,
    /// records of an older epoch being dropped. `None`: no member, or the partition is no
    /// longer assigned (its revocation is on the way).
    pub async fn rewind<A: Aggregate>(
        &self,
        log: &dyn Log,
        group: &str,
        topic: &Arc<str>,
        p: u32,
    ) -> Option<(u64, u64)> {
        let Durability::Replicated { member } = self else {
            return None;
        };
        let member = member.get().cloned()?;
        loop {
            let from = match log.committed_offset(group, topic, p).await {
                Ok(o) => o.unwrap_or(0),
                Err(e) => {
                    tracing::warn!(aggregate = A::TYPE, partition = p, error = %e, "cannot read the committed offset; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let (m, t) = (member.clone(), topic.clone());
            match tokio::task::spawn_blocking(move || m.seek(&t, p, from)).await {
                Ok(Ok(epoch)) => {
                    tracing::info!(
                        aggregate = A::TYPE,
                        partition = p,
                        from,
                        "commands read again from the committed offset"
                    );
                    return Some((epoch, from));
                }
                Ok(Err(eventfold_log::Error::Config(reason))) => {
                    tracing::info!(aggregate = A::TYPE, partition = p, %reason, "no rewind");
                    return None;
                }
                Ok(Err(e)) => {
                    tracing::warn!(aggregate = A::TYPE, partition = p, error = %e, "cannot rewind the commands topic; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    tracing::error!(aggregate = A::TYPE, partition = p, error = %e, "rewind task failed");
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicated() -> Durability {
        Durability::Replicated {
            member: Arc::new(OnceLock::new()),
        }
    }

    #[test]
    fn the_lifecycle_starts_and_fails_by_backend() {
        assert_eq!(Durability::Local.first_phase(), Phase::Restoring);
        assert_eq!(replicated().first_phase(), Phase::Remote);
        assert_eq!(Durability::Local.commit_failed("x".into()), Event::Stopped);
        assert_eq!(
            replicated().commit_failed("x".into()),
            Event::CommitFailed { reason: "x".into() }
        );
    }

    #[test]
    fn only_kafka_writes_changelog_records() {
        let topics = Topics::new("app", "counter");
        let at = At {
            topics: &topics,
            partition: 2,
            now: 7,
        };
        let local = Durability::Local;
        assert!(local.accepted_record(at, "c", "a", 1, 1).is_none());
        assert!(local.outcome_record(at, "c", b"{}").is_none());
        assert!(local.state_record(at, "a", 1, b"{}").is_none());
        assert!(!local.keeps_every_state());
        let kafka = replicated();
        for append in [
            kafka.accepted_record(at, "c", "a", 1, 1),
            kafka.outcome_record(at, "c", b"{}"),
            kafka.state_record(at, "a", 1, b"{}"),
        ] {
            let append = append.expect("a changelog record");
            assert_eq!((&*append.topic, append.partition), (&*topics.state, 2));
        }
        assert!(kafka.keeps_every_state());
    }

    #[test]
    fn only_a_commands_topic_record_on_kafka_is_answered_on_the_results_topic() {
        assert_eq!(Durability::Local.results_partition(true, Some(3), 1), None);
        assert_eq!(replicated().results_partition(false, Some(3), 1), None);
        assert_eq!(replicated().results_partition(true, Some(3), 1), Some(3));
        assert_eq!(replicated().results_partition(true, None, 1), Some(1));
    }

    #[test]
    fn with_a_consumer_group_every_written_unit_commits_the_consumed_offset() {
        for (durability, written_alone) in [(Durability::Local, false), (replicated(), true)] {
            assert!(durability.commits_consumed(true, 0));
            assert!(!durability.commits_consumed(false, 0));
            assert_eq!(durability.commits_consumed(false, 1), written_alone);
            assert_eq!(durability.shows_consumed(true), written_alone);
            assert!(!durability.shows_consumed(false));
        }
    }
}
