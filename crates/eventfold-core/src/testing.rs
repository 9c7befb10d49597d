//! A tiny aggregate for eventfold's own tests and for trying things out: a counter with
//! an upper limit. Not meant for production use.

use crate::aggregate::{Aggregate, Context, Reject};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A counter that refuses to go above 100.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// Sum of everything added.
    pub total: u64,
}

/// Commands of [`Counter`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum CounterCommand {
    /// Adds `n` (rejected above a total of 100).
    Add {
        /// The amount to add.
        n: u64,
    },
    /// Blocks its partition for `ms` and writes nothing: lets tests fill queues and
    /// exceed timeouts. (The one impure command, on purpose.)
    Slow {
        /// Milliseconds to block.
        ms: u64,
    },
}

/// Events of [`Counter`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum CounterEvent {
    /// `n` was added.
    Added {
        /// The amount added.
        n: u64,
    },
}

/// The counter would exceed its limit.
#[derive(Debug)]
pub struct LimitExceeded(pub u64);

impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "adding would take the counter to {}, above the limit of 100", self.0)
    }
}

impl Reject for LimitExceeded {
    fn code(&self) -> &'static str {
        "limit_exceeded"
    }
}

impl Aggregate for Counter {
    const TYPE: &'static str = "counter";
    type Command = CounterCommand;
    type Event = CounterEvent;
    type Rejection = LimitExceeded;
    type Config = ();

    fn handle(&self, command: CounterCommand, _: &Context<'_, ()>) -> Result<Vec<CounterEvent>, LimitExceeded> {
        match command {
            CounterCommand::Add { n } if self.total + n > 100 => Err(LimitExceeded(self.total + n)),
            CounterCommand::Add { n } => Ok(vec![CounterEvent::Added { n }]),
            CounterCommand::Slow { ms } => {
                std::thread::sleep(Duration::from_millis(ms));
                Ok(vec![])
            }
        }
    }

    fn apply(&mut self, event: &CounterEvent) {
        match event {
            CounterEvent::Added { n } => self.total += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AggregateTest;

    #[test]
    fn counter_adds_up_to_its_limit() {
        AggregateTest::<Counter>::new()
            .given([CounterEvent::Added { n: 60 }])
            .when(CounterCommand::Add { n: 40 })
            .then([CounterEvent::Added { n: 40 }])
            .then_state(|c| assert_eq!(c.total, 100));
        AggregateTest::<Counter>::new()
            .given([CounterEvent::Added { n: 60 }])
            .when(CounterCommand::Add { n: 41 })
            .then_rejected("limit_exceeded");
    }

    /// The panic message of `f`.
    fn failure(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let err = std::panic::catch_unwind(f).expect_err("the assertion fails");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn failed_harness_assertions_print_events_as_json() {
        let msg = failure(|| {
            AggregateTest::<Counter>::new()
                .when(CounterCommand::Add { n: 1 })
                .then([CounterEvent::Added { n: 2 }]);
        });
        assert!(msg.contains(r#"got: [{"type":"Added","n":1}]"#), "{msg}");
        assert!(msg.contains(r#"expected: [{"type":"Added","n":2}]"#), "{msg}");
        let msg = failure(|| {
            AggregateTest::<Counter>::new()
                .when(CounterCommand::Add { n: 1 })
                .then_rejected("limit_exceeded");
        });
        assert!(msg.contains(r#"got events [{"type":"Added","n":1}]"#), "{msg}");
    }
}
