//! Ownership of a partition through the consumer group (Kafka mode): taking it when
//! assigned (settle, then restore), giving it up when revoked, and recovering from a
//! failed commit without a restart. Restores and recoveries retry while the broker is
//! away and give way to a control that arrives meanwhile.

use super::phase::{Event, Phase};
use super::{Control, Processor};
use crate::error::{Error, Result};
use eventfold_core::Aggregate;
use std::time::Duration;
use tokio::sync::mpsc;

/// The control channel of a partition owned through a consumer group.
type Controls = Option<mpsc::UnboundedReceiver<Control>>;

/// The pause before retry `attempt` of a restore (grows to 5 s).
fn retry_pause(attempt: u32) -> Duration {
    Duration::from_millis(500).saturating_mul(attempt.min(10))
}

/// Sleeps `d` unless a control arrives first, which is returned.
async fn pause(d: Duration, control: &mut Controls) -> Option<Control> {
    let Some(ctl) = control.as_mut() else {
        tokio::time::sleep(d).await;
        return None;
    };
    tokio::select! {
        () = tokio::time::sleep(d) => None,
        c = ctl.recv() => {
            if c.is_none() {
                *control = None;
            }
            c
        }
    }
}

/// Runs `work` unless a control arrives first: then `work` is dropped (restores and
/// recoveries are idempotent: they start over from the store's checkpoints) and the
/// control is returned, so that a revocation never waits for a restore that retries while
/// the broker is away, or for a long one.
async fn unless_control<T>(work: impl std::future::Future<Output = T>, control: &mut Controls) -> Result<T, Control> {
    tokio::pin!(work);
    let closed = match control.as_mut() {
        None => true,
        Some(ctl) => tokio::select! {
            biased;
            c = ctl.recv() => match c {
                Some(c) => return Err(c),
                None => true,
            },
            r = &mut work => return Ok(r),
        },
    };
    if closed {
        *control = None;
    }
    Ok(work.await)
}

impl<A: Aggregate> Processor<A> {
    /// Takes the partition: waits for the group's stable committed offset (a previous
    /// owner's transaction still completing holds it), then restores up to the end of
    /// what is committed, so nothing that previous owner committed is missed. A control
    /// that arrives meanwhile (the group revoked the partition again), while it works or
    /// while it waits to retry, ends it and is returned.
    pub(super) async fn assign(&mut self, epoch: u64, control: &mut Controls) -> Option<Control> {
        let p = self.cfg.partition;
        self.transition(Event::Assigned);
        self.min_epoch = epoch;
        self.set_consumed(0);
        self.clear_cache();
        self.shared.set_failure(None);
        self.shared.set_progress(0.0);
        tracing::info!(
            aggregate = A::TYPE,
            partition = p,
            epoch,
            "partition assigned; restoring"
        );
        let mut attempt = 0u32;
        loop {
            // Nothing of an earlier ownership is in flight (a revocation waits for it), so
            // a fence a failed commit left on the lane can go, and a failed producer is
            // rebuilt.
            if let Err(e) = self.durability.resume(&*self.log, p).await
                && !matches!(e, eventfold_log::Error::Config(_))
            {
                if let eventfold_log::Error::Closed(_) = e {
                    self.stop(format!("cannot take the partition: {e}"));
                    return None;
                }
                attempt += 1;
                tracing::warn!(aggregate = A::TYPE, partition = p, attempt, error = %e, "cannot resume the partition's lane; retrying");
                if let Some(c) = pause(retry_pause(attempt), control).await {
                    return Some(c);
                }
                continue;
            }
            let result = match unless_control(self.take_over(), control).await {
                Ok(r) => r,
                Err(c) => return Some(c),
            };
            match result {
                Ok(()) => return None,
                Err(e @ (Error::Store(_) | Error::Corrupt { .. })) => {
                    self.stop(format!("restore failed: {e}"));
                    return None;
                }
                Err(e) => {
                    attempt += 1;
                    tracing::warn!(aggregate = A::TYPE, partition = p, attempt, error = %e, "restore after assignment failed; retrying");
                    if let Some(c) = pause(retry_pause(attempt), control).await {
                        return Some(c);
                    }
                }
            }
        }
    }

    /// An attempt at taking the partition: the group's committed offset, then (settled)
    /// the restore.
    async fn take_over(&mut self) -> Result<()> {
        let (p, group, topics) = (self.cfg.partition, &self.cfg.group, &self.cfg.topics);
        let committed = self.log.committed_offset(group, &topics.commands, p).await?;
        self.set_consumed(committed.unwrap_or(0));
        // The group's offsets are stable once the previous owner's transaction is decided,
        // but Kafka marks its partitions one by one: wait until the events and state
        // partitions are settled too, so that the restore reads that transaction's records.
        let topics = &self.cfg.topics;
        self.durability.settle(&*self.log, topics, p).await?;
        self.restore().await
    }

    /// Sets the consumed offset (see `consumed_hwm`), published for `/v1/cluster` when a
    /// consumer group feeds the partition.
    pub(super) fn set_consumed(&mut self, next: u64) {
        self.consumed_hwm = next;
        let shown = self.durability.shows_consumed(self.phase.owned()).then_some(next);
        self.shared.set_consumed(shown);
    }

    /// Gives the partition up once nothing is in flight.
    pub(super) fn release(&mut self) {
        debug_assert!(
            self.inflight.is_empty(),
            "ordering: a partition is given up with nothing in flight"
        );
        tracing::info!(
            aggregate = A::TYPE,
            partition = self.cfg.partition,
            "partition released"
        );
        self.transition(Event::Drained);
        self.clear_cache();
        self.set_consumed(0);
        self.shared.set_failure(None);
        self.shared.set_progress(0.0);
    }

    /// After a failed commit, once nothing is in flight: lifts the log's fence, restores
    /// the partition from the committed state (retrying while the broker is away) and has
    /// the commands-topic source read again what was not committed.
    ///
    /// A control that arrives meanwhile (the group revoked the partition), during an
    /// attempt or between attempts, ends it and is returned.
    pub(super) async fn recover(&mut self, control: &mut Controls) -> Option<Control> {
        let p = self.cfg.partition;
        let reason = match &self.phase {
            Phase::Recovering { reason } => reason.clone(),
            _ => String::new(),
        };
        let mut attempt = 0u32;
        loop {
            self.clear_cache();
            let attempt_run = async {
                match self.durability.resume(&*self.log, p).await {
                    Ok(()) => self.restore().await,
                    Err(e) => Err(e.into()),
                }
            };
            let result = match unless_control(attempt_run, control).await {
                Ok(r) => r,
                Err(c) => return Some(c),
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    if let Error::Log(eventfold_log::Error::Closed(_) | eventfold_log::Error::Config(_)) = &e {
                        self.stop(format!("cannot recover from a failed commit: {e}"));
                        return None;
                    }
                    attempt += 1;
                    tracing::warn!(aggregate = A::TYPE, partition = p, attempt, error = %e, "recovery failed; retrying");
                    if let Some(c) = pause(retry_pause(attempt), control).await {
                        return Some(c);
                    }
                }
            }
        }
        // The records read again start at the committed offset.
        self.set_consumed(0);
        let (log, group, topic) = (&*self.log, &self.cfg.group, &self.cfg.topics.commands);
        if let Some((epoch, from)) = self.durability.rewind::<A>(log, group, topic, p).await {
            self.min_epoch = epoch;
            self.set_consumed(from);
        }
        tracing::info!(aggregate = A::TYPE, partition = p, after = %reason, "partition recovered");
        None
    }
}
