//! A partition's lifecycle as one state machine: the [`Phase`] a processor is in and the
//! one transition function, [`Phase::on`], that every change of ownership, restore,
//! failure and recovery goes through. Pure: the processor does the work of a phase
//! (restoring, recovering, draining the commits in flight) and reports its end here as
//! an [`Event`]; what `/readyz` and the service see is [`Phase::shown`].
//!
//! ```text
//!            Assigned                Restored
//!  Remote ───────────▶ Restoring ─────────────▶ Ready ◀──────────┐
//!    ▲                  ▲  │ Stopped             │ CommitFailed   │ Restored
//!    │ Drained          │  ▼                     ▼ (replicated)   │
//!  Revoking ◀─ Revoked ─┤ Failed ◀── Stopped ── Recovering ───────┘
//!                       └── Assigned (from every phase but Revoking)
//! ```
//!
//! `Revoked` is taken from every phase but `Revoking`; a revoking partition drains its
//! commits in flight, showing what it showed when the revocation came, then `Drained`
//! gives it up.

use crate::command::PartitionState;

/// Where a partition's processor is in its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Another instance owns the partition (Kafka): jobs go back to their caller, who
    /// sends them to the owner.
    Remote,
    /// This instance owns the partition and is restoring it (the restore barrier): no job
    /// is taken.
    Restoring,
    /// Taking commands.
    Ready,
    /// A commit failed and the log holds the committed state (Kafka): the commits in
    /// flight fail too, then the partition restores from the committed state. No job is
    /// taken; shown as restoring.
    Recovering {
        /// Why: the failed commit.
        reason: String,
    },
    /// The consumer group revoked the partition: the commits in flight finish (or fail),
    /// then it is given up. No job and no control is taken meanwhile.
    Revoking {
        /// What the partition shows until it is given up: what it showed when the
        /// revocation came, or restoring once a commit failed since.
        shown: PartitionState,
    },
    /// Stopped by a fatal error (a corrupt record, a failed commit on the embedded log):
    /// every job is refused until a new assignment (Kafka).
    Failed,
}

/// What happened to the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// The consumer group assigned the partition to this instance (Kafka).
    Assigned,
    /// The restore barrier is passed: the local store holds what the log committed.
    Restored,
    /// A commit failed and the committed state can be restored from the log (Kafka).
    CommitFailed { reason: String },
    /// The consumer group revoked the partition.
    Revoked,
    /// Nothing is in flight any more (after `Revoked`): the partition is given up.
    Drained,
    /// A fatal error: the partition stops.
    Stopped,
}

/// A transition the lifecycle does not have: `event` cannot happen in `phase`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("partition lifecycle: {event:?} refused in phase {phase:?}")]
pub(crate) struct Refused {
    pub phase: Phase,
    pub event: Event,
}

impl Phase {
    /// The phase after `event`, or why there is none. The only place the lifecycle
    /// changes.
    pub fn on(&self, event: Event) -> Result<Phase, Refused> {
        use Event as E;
        use Phase as P;
        let next = match (self, &event) {
            // Revoking takes no control (the run loop stops reading them): a new
            // assignment or revocation waits until the partition was given up.
            (P::Revoking { .. }, E::Assigned | E::Revoked) => None,
            (_, E::Assigned) => Some(P::Restoring),
            // Restoring after an assignment (or at start), or as the recovery's second step.
            (P::Restoring | P::Recovering { .. }, E::Restored) => Some(P::Ready),
            // The first failed commit names the recovery; the units built on it fail too.
            (P::Ready | P::Failed, E::CommitFailed { reason }) => Some(P::Recovering { reason: reason.clone() }),
            (P::Recovering { reason }, E::CommitFailed { .. }) => Some(P::Recovering { reason: reason.clone() }),
            (P::Revoking { .. }, E::CommitFailed { .. }) => Some(P::Revoking {
                shown: PartitionState::Restoring,
            }),
            (_, E::Revoked) => Some(P::Revoking { shown: self.shown() }),
            (P::Revoking { .. }, E::Drained) => Some(P::Remote),
            (P::Restoring | P::Ready | P::Recovering { .. } | P::Failed, E::Stopped) => Some(P::Failed),
            _ => None,
        };
        next.ok_or_else(|| Refused {
            phase: self.clone(),
            event,
        })
    }

    /// What the service, `/readyz` and `/v1/cluster` see of this phase.
    pub fn shown(&self) -> PartitionState {
        match self {
            Phase::Remote => PartitionState::Remote,
            Phase::Restoring | Phase::Recovering { .. } => PartitionState::Restoring,
            Phase::Ready => PartitionState::Ready,
            Phase::Revoking { shown } => *shown,
            Phase::Failed => PartitionState::Failed,
        }
    }

    /// Whether this instance owns the partition (revoking: until it is given up).
    pub fn owned(&self) -> bool {
        !matches!(self, Phase::Remote)
    }

    /// Whether the processor takes jobs off its queue: to process them (ready), or to
    /// refuse them (remote, failed).
    pub fn takes_jobs(&self) -> bool {
        matches!(self, Phase::Remote | Phase::Ready | Phase::Failed)
    }

    /// Whether the processor takes ownership changes from the consumer group.
    pub fn takes_control(&self) -> bool {
        !matches!(self, Phase::Revoking { .. })
    }
}

#[cfg(test)]
mod tests;
