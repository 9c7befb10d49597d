//! A decided batch's commit and its answers: the plan applied to the processor (cache,
//! command ids in flight, consumed offset) and handed to the log as one commit unit;
//! once the unit finished, its callers answered in batch order, or, when it failed, the
//! partition recovering (Kafka) or stopping (embedded) as the durability says.

use super::decide::{self, Pending, Plan};
use super::phase::Event;
use super::{CommitResult, InFlight, Processor, Slot};
use crate::error::{Error, Result};
use crate::metrics::CommandOutcome;
use eventfold_core::{Aggregate, Outcome, Position};
use eventfold_log::{CommitUnit, Consumed, Receipt};
use std::collections::HashSet;
use std::time::{Duration, Instant};

impl<A: Aggregate> Processor<A> {
    /// Applies a decided batch to the processor (cache, command ids in flight, consumed
    /// offset) and starts its commit; enqueued now, in batch order: the log commits this
    /// partition's units in order.
    pub(super) fn commit_plan(&mut self, plan: Plan<A>, slots: Vec<Slot>, now: i64) {
        let p = self.cfg.partition;
        let mut unit = CommitUnit {
            appends: plan.appends,
            local: plan.local,
            lane: Some(p),
            ..CommitUnit::default()
        };
        debug_assert!(
            (plan.states.iter()).all(|(id, c)| {
                let base = self.cache.get(id).map(|cached| cached.version);
                c.version >= c.loaded_version && base.is_none_or(|v| v == c.loaded_version)
            }),
            "I2 versions: a batch builds on the newest version, its own or one still committing"
        );
        self.cache.extend(plan.states);
        self.shared.set_cached(self.cache.len());
        let seq = self.inflight_base + self.inflight.len() as u64;
        let commands: Vec<String> = (plan.commands.into_iter())
            .map(|(id, slot)| {
                let earlier = self.inflight_ids.insert(id.clone(), (seq, slot));
                debug_assert!(
                    earlier.is_none(),
                    "I3 dedup: a keyed command id is written once while in flight"
                );
                id
            })
            .collect();
        unit.consumed.extend(self.consume(plan.consumed, plan.written));
        debug_assert!(
            plan.consumed.is_none_or(|n| n <= self.consumed_hwm),
            "I1 exactly-once: the consumed offset committed with or before a unit covers its records"
        );
        if !plan.positioned.is_empty() {
            let then = decide::results_then(plan.positioned, &self.cfg.topics, p, self.events_end, now);
            unit.then = Some(then);
        }
        let commit = (plan.written > 0 || plan.consumed.is_some()).then(|| self.log.commit(unit));
        self.inflight.push_back(InFlight {
            commit,
            slots,
            commands,
            touched: plan.touched,
            written: plan.written,
            started: Instant::now(),
        });
        // Evicted here, where the cache grows, so that it never holds more than its limit
        // but for the aggregates of units still committing (this one's included).
        if self.cache.len() > self.cfg.cache_limit {
            self.evict();
        }
    }

    /// Moves the consumed offset to `consumed` if that is further; the offset a unit
    /// writing `written` slots commits, if any (see [`Durability::commits_consumed`]).
    ///
    /// [`Durability::commits_consumed`]: super::durability::Durability::commits_consumed
    fn consume(&mut self, consumed: Option<u64>, written: usize) -> Option<Consumed> {
        let before = self.consumed_hwm;
        let advanced = consumed.filter(|n| *n > before);
        if let Some(next_offset) = advanced {
            self.set_consumed(next_offset);
        }
        debug_assert!(
            self.consumed_hwm >= before,
            "ordering: consumed offsets never move back"
        );
        (self.durability.commits_consumed(advanced.is_some(), written)).then(|| Consumed {
            group: self.cfg.group.clone(),
            topic: self.cfg.topics.commands.clone(),
            partition: self.cfg.partition,
            next_offset: self.consumed_hwm,
        })
    }

    pub(super) fn clear_cache(&mut self) {
        self.cache.clear();
        self.shared.set_cached(0);
    }

    /// Empties the aggregate cache but for the aggregates that units still in flight
    /// changed: the store holds every other cached state (its last unit finished), so
    /// reloading one cannot go back to a version that is still committing. Under a
    /// steady load some unit is always in flight, so waiting until none is (as this did
    /// before) let the cache grow past its limit for as long as the load lasted.
    /// Everything else goes at once, not the oldest first: a new batch's aggregates come
    /// back from the store on their next command, and clearing costs no bookkeeping per
    /// hit.
    fn evict(&mut self) {
        if self.inflight.is_empty() {
            self.cache.clear();
        } else {
            let busy: HashSet<&str> = self
                .inflight
                .iter()
                .flat_map(|f| f.touched.iter().map(|(id, _)| &**id))
                .collect();
            self.cache.retain(|id, _| busy.contains(id.as_str()));
        }
        self.shared.set_cached(self.cache.len());
    }

    /// Answers a batch whose commit failed: in Kafka mode the partition recovers from the
    /// committed state; embedded, it stops.
    fn commit_failed(&mut self, slots: Vec<Slot>, e: &str) {
        let p = self.cfg.partition;
        self.clear_cache();
        let reason = format!("commit failed: {e}");
        let err = match self.durability.commit_failed(reason.clone()) {
            // Kafka holds the committed state: restore from it and go on (once the units
            // built on this one have failed too).
            event @ Event::CommitFailed { .. } => {
                let before = self.phase.clone();
                self.transition(event);
                if self.phase != before {
                    tracing::warn!(aggregate = A::TYPE, partition = p, %reason, "partition recovers from a failed commit");
                    self.shared.set_progress(0.0);
                }
                Error::Restoring {
                    aggregate: A::TYPE.into(),
                    partition: p,
                    progress_pct: 0.0,
                    retry_after: Duration::from_secs(1),
                }
            }
            _ => {
                self.stop(reason.clone());
                Error::PartitionFailed {
                    aggregate: A::TYPE.into(),
                    partition: p,
                    reason,
                }
            }
        };
        for slot in slots {
            let outcome = match slot.pending {
                Pending::Ready(_, o) => o,
                Pending::Written { .. } => CommandOutcome::Error,
            };
            self.metrics.count(outcome, slot.replies.len() as u64);
            for r in slot.replies {
                let _ = r.send(Err(clone_err(&err)));
            }
        }
    }

    /// Answers a batch once its commit finished.
    pub(super) fn finish(&mut self, done: InFlight, result: CommitResult) {
        for id in &done.commands {
            self.inflight_ids.remove(id);
        }
        // The aggregates of this unit can go now that the store holds them.
        if self.cache.len() > self.cfg.cache_limit {
            self.evict();
        }
        let receipt = match result {
            Ok(r) => r,
            Err(e) => return self.commit_failed(done.slots, &e),
        };
        if let Some(r) = &receipt {
            self.metrics
                .commit_latency
                .observe(done.started.elapsed().as_secs_f64());
            self.metrics.batch_size.observe(done.written as f64);
            if let Some(last) = r.offsets.last() {
                self.events_end = *last + 1;
            }
            for t in done.touched {
                let _ = self.notify.send(t);
            }
        }
        for slot in done.slots {
            self.answer(slot, receipt.as_ref());
        }
    }

    /// Answers the callers of a slot of a batch that committed (`receipt`: its offsets,
    /// if it wrote).
    fn answer(&self, slot: Slot, receipt: Option<&Receipt>) {
        debug_assert!(
            receipt.is_some() || matches!(slot.pending, Pending::Ready(..)),
            "I4 durable before ack: an outcome this batch wrote is answered only once its unit committed"
        );
        let (result, counted) = match slot.pending {
            Pending::Ready(r, o) => (r, o),
            Pending::Written { mut outcome, appends } => {
                let counted = match &mut outcome {
                    Outcome::Accepted(a) => {
                        let end = match (receipt, appends.is_empty()) {
                            (Some(r), false) => r.offsets[appends.end - 1] + 1,
                            _ => self.events_end,
                        };
                        a.position = Position::token_at(&self.cfg.topics.events, self.cfg.partition, end);
                        CommandOutcome::Accepted
                    }
                    Outcome::Rejected { .. } => CommandOutcome::Rejected,
                };
                (Ok(outcome), counted)
            }
        };
        self.metrics.count(counted, slot.replies.len() as u64);
        let mut replies = slot.replies;
        let first = replies.remove(0);
        for extra in replies {
            let _ = extra.send(clone_result(&result));
        }
        let _ = first.send(result);
    }
}

/// A copy of `e` for each further caller of one command.
pub(super) fn clone_err(e: &Error) -> Error {
    match e {
        Error::PartitionFailed {
            aggregate,
            partition,
            reason,
        } => Error::PartitionFailed {
            aggregate: aggregate.clone(),
            partition: *partition,
            reason: reason.clone(),
        },
        Error::VersionMismatch { expected, actual } => Error::VersionMismatch {
            expected: *expected,
            actual: *actual,
        },
        Error::Restoring {
            aggregate,
            partition,
            progress_pct,
            retry_after,
        } => Error::Restoring {
            aggregate: aggregate.clone(),
            partition: *partition,
            progress_pct: *progress_pct,
            retry_after: *retry_after,
        },
        other => Error::Log(eventfold_log::Error::Closed(other.to_string())),
    }
}

fn clone_result(r: &Result<Outcome>) -> Result<Outcome> {
    match r {
        Ok(o) => Ok(o.clone()),
        Err(e) => Err(clone_err(e)),
    }
}
