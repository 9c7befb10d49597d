//! A batch of jobs, up to its commit: the jobs taken (or refused) by phase, the reads a
//! decision needs (dedup records, states), the decision itself ([`decide::decide`],
//! pure) and the routing of each caller to the slot that answers it.

use super::commit::clone_err;
use super::decide::{self, Decision, Pending};
use super::phase::Phase;
use super::{Processor, Reply, Slot};
use crate::changelog::{self, EVENTS_BY_REFERENCE};
use crate::command::Job;
use crate::error::{Error, Result};
use crate::metrics::CommandOutcome;
use crate::snapshot;
use eventfold_core::envelope::{Accepted, headers};
use eventfold_core::{Aggregate, Outcome, Position};

/// A job's command, apart from its caller's reply channel.
fn split<A: Aggregate>(job: Job<A>) -> (decide::Command<A::Command>, Reply) {
    let Job {
        aggregate_id,
        command_id,
        correlation_id,
        causation_id,
        command,
        expected_version,
        consumed,
        keyed,
        epoch,
        reply_partition,
        reply,
    } = job;
    let meta = decide::Meta {
        aggregate_id,
        command_id,
        correlation_id,
        causation_id,
        expected_version,
        consumed,
        keyed,
        epoch,
        reply_partition,
    };
    (decide::Command { meta, body: command }, reply)
}

impl<A: Aggregate> Processor<A> {
    /// Processes the jobs received: refused if the partition is not this instance's or
    /// failed, else decided and committed as a batch.
    pub(super) fn take(&mut self, jobs: &mut Vec<Job<A>>) {
        match self.phase {
            Phase::Remote => {
                // Queued before a revocation, or sent while the service still took the
                // partition for ours: the caller sends it to the owner.
                for job in jobs.drain(..) {
                    if job.consumed.is_none() {
                        let _ = job.reply.send(Err(Error::NotOwner {
                            aggregate: A::TYPE.into(),
                            partition: self.cfg.partition,
                        }));
                    }
                }
            }
            Phase::Failed => {
                let err = self.failed_error();
                self.metrics.count(CommandOutcome::Error, jobs.len() as u64);
                for job in jobs.drain(..) {
                    let _ = job.reply.send(Err(clone_err(&err)));
                }
            }
            _ => {
                let batch = std::mem::replace(jobs, Vec::with_capacity(self.cfg.max_batch));
                if let Err(fatal) = self.build(batch) {
                    self.stop(fatal);
                }
            }
        }
    }

    /// Processes one batch and starts its commit: reads what deciding it needs, decides
    /// it ([`decide::decide`]), hands each caller to the slot that answers it, and commits
    /// the plan. `Err` is fatal for the partition.
    fn build(&mut self, jobs: Vec<Job<A>>) -> std::result::Result<(), String> {
        debug_assert_eq!(
            self.phase,
            Phase::Ready,
            "restore barrier: a batch is decided only once the partition is restored"
        );
        let now = self.clock.now_ms();
        let (commands, replies): (Vec<_>, Vec<_>) = jobs.into_iter().map(split).unzip();
        let mut plan = {
            let env = self.env(now);
            let pre = decide::prefetch(&commands, &env, |id| self.stored_outcome(id, now), |id| self.load(id));
            decide::decide(commands, pre, &env)
        };
        let mut replies = replies.into_iter();
        let slots = self.route(&plan.decisions, std::mem::take(&mut plan.slots), &mut replies);
        if let Some(reason) = plan.fatal.take() {
            self.fail_batch(slots, replies, &reason);
            return Err(reason);
        }
        self.commit_plan(plan, slots, now);
        Ok(())
    }

    /// What deciding a batch at `now` depends on besides its commands and reads.
    fn env(&self, now: i64) -> decide::Env<'_, A> {
        decide::Env {
            partition: self.cfg.partition,
            topics: &self.cfg.topics,
            config: &self.cfg.config,
            lookups: &self.cfg.tables,
            now,
            durability: &self.durability,
            state_every: self.cfg.state_every,
            min_epoch: self.min_epoch,
            inflight: &self.inflight_ids,
        }
    }

    /// Aggregate `id`'s version and state: the cache's, else the store's.
    fn load(&self, id: &str) -> std::result::Result<(u64, A), String> {
        if let Some(c) = self.cache.get(id) {
            return Ok((c.version, c.state.clone()));
        }
        let loaded = snapshot::load::<A>(self.log.store(), &self.cfg.topics.events, id).map_err(|e| e.to_string())?;
        Ok(loaded.unwrap_or_default())
    }

    /// Hands each decided command's reply to the slot that answers it (of this batch, or
    /// of a batch still committing); a skipped command's is dropped. The replies of the
    /// commands not decided (a fatal error stopped the batch) stay in `replies`.
    fn route(
        &mut self,
        decisions: &[Decision],
        pending: Vec<Pending>,
        replies: &mut impl Iterator<Item = Reply>,
    ) -> Vec<Slot> {
        let mut slots: Vec<Slot> = pending
            .into_iter()
            .map(|pending| Slot {
                pending,
                replies: Vec::with_capacity(1),
            })
            .collect();
        let mut duplicates = 0;
        for (decision, reply) in decisions.iter().zip(replies.by_ref()) {
            match *decision {
                Decision::Skipped => {}
                Decision::InFlight(seq, i) => {
                    debug_assert!(
                        seq >= self.inflight_base,
                        "I3 dedup: a command id in flight belongs to a batch still committing"
                    );
                    let batch = (seq - self.inflight_base) as usize;
                    self.inflight[batch].slots[i].replies.push(reply);
                    duplicates += 1;
                }
                Decision::Joined(i) => {
                    slots[i].replies.push(reply);
                    duplicates += 1;
                }
                Decision::Answered(i) => slots[i].replies.push(reply),
            }
        }
        if duplicates > 0 {
            self.metrics.count(CommandOutcome::Duplicate, duplicates);
        }
        slots
    }

    /// Nothing of a batch stopped by `reason` is committed: every caller of it (those of
    /// its slots, then the rest) learns why.
    fn fail_batch(&self, slots: Vec<Slot>, rest: impl Iterator<Item = Reply>, reason: &str) {
        let err = Error::PartitionFailed {
            aggregate: A::TYPE.into(),
            partition: self.cfg.partition,
            reason: reason.to_owned(),
        };
        let mut n = 0;
        for r in slots.into_iter().flat_map(|s| s.replies).chain(rest) {
            let _ = r.send(Err(clone_err(&err)));
            n += 1;
        }
        self.metrics.count(CommandOutcome::Error, n);
    }

    /// A stored outcome for `command_id`, if one is within the dedup window.
    fn stored_outcome(&self, command_id: &str, now: i64) -> std::result::Result<Option<Outcome>, String> {
        let Some(row) = self
            .log
            .store()
            .get_dedup(A::TYPE, self.cfg.partition, command_id)
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        if row.timestamp_ms < now - self.cfg.dedup_window_ms {
            return Ok(None);
        }
        let mut outcome = match row.outcome.split_first() {
            Some((&EVENTS_BY_REFERENCE, reference)) => self.referenced_outcome(command_id, reference)?,
            _ => serde_json::from_slice::<Outcome>(&row.outcome).map_err(|e| {
                format!("corrupt record in table `dedup` for command {command_id:?}: outcome does not decode: {e}")
            })?,
        };
        if let Outcome::Accepted(a) = &mut outcome {
            a.position = self
                .position_of(&a.aggregate_id, a.version)
                .map_err(|e| e.to_string())?;
        }
        Ok(Some(outcome))
    }

    /// The position of the end of `id`'s version `version` (for replayed outcomes).
    fn position_of(&self, id: &str, version: u64) -> Result<String> {
        let topic = &self.cfg.topics.events;
        let off = if version == 0 {
            self.events_end
        } else {
            match self
                .log
                .store()
                .entity_events(topic, id.as_bytes(), version, 1)?
                .first()
            {
                Some(e) => e.offset + 1,
                None => self.events_end,
            }
        };
        Ok(Position::token_at(topic, self.cfg.partition, off))
    }

    /// The accepted outcome a dedup record of [`EVENTS_BY_REFERENCE`] stands for: its
    /// events read back from the store, checked to be `command_id`'s.
    fn referenced_outcome(&self, command_id: &str, reference: &[u8]) -> std::result::Result<Outcome, String> {
        let corrupt = |reason: String| format!("corrupt record in table `dedup` for command {command_id:?}: {reason}");
        let (version, count, aggregate_id) = changelog::decode_events_reference(reference).map_err(corrupt)?;
        let (count, aggregate_id) = (u64::from(count), aggregate_id.to_owned());
        let topic = &self.cfg.topics.events;
        let stored = if count == 0 {
            Vec::new()
        } else {
            self.log
                .store()
                .entity_events(topic, aggregate_id.as_bytes(), version - count + 1, count as usize)
                .map_err(|e| e.to_string())?
        };
        let mut events = Vec::with_capacity(stored.len());
        for (e, expected) in stored.iter().zip(version - count + 1..) {
            if e.version != expected || e.record.header(headers::COMMAND_ID) != Some(command_id.as_bytes()) {
                break;
            }
            events.push(crate::command::event_view(topic, e).map_err(|e| e.to_string())?);
        }
        if events.len() as u64 != count {
            return Err(corrupt(format!(
                "it refers to versions {}..={version} of {aggregate_id:?}, but the store holds {} of them written by this command",
                version - count + 1,
                events.len()
            )));
        }
        Ok(Outcome::Accepted(Accepted {
            aggregate_id,
            version,
            events,
            position: String::new(),
        }))
    }
}
