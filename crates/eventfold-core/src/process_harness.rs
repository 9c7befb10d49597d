//! A given/when/then harness for process managers, part of the public API:
//!
//! ```
//! use eventfold_core::testing::{Counter, CounterCommand, CounterEvent};
//! use eventfold_core::{Actions, EventMeta, Expect, Input, ProcessContext, ProcessManager, ProcessTest, Subscription};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! /// Mirrors what is added to counter `c` on counter `mirror-c`, and gives up on a
//! /// counter quiet for a minute.
//! #[derive(Default, Clone, Serialize, Deserialize)]
//! struct Mirror {
//!     refused: u32,
//! }
//!
//! impl ProcessManager for Mirror {
//!     const NAME: &'static str = "mirror";
//!     type Event = CounterEvent;
//!     type Config = ();
//!     fn subscriptions(_: &()) -> Vec<Subscription<CounterEvent>> {
//!         vec![Subscription::to::<Counter>(|e| e)]
//!     }
//!     fn correlate(_: &CounterEvent, meta: &EventMeta<'_>) -> Option<String> {
//!         // Not the mirrors' own events: they would be mirrored forever.
//!         (!meta.aggregate_id.starts_with("mirror-")).then(|| meta.aggregate_id.to_owned())
//!     }
//!     fn react(&mut self, input: Input<'_, CounterEvent>, ctx: &ProcessContext<'_, ()>, actions: &mut Actions) {
//!         match input {
//!             Input::Event { event: CounterEvent::Added { n }, .. } => {
//!                 actions.send::<Counter>(format!("mirror-{}", ctx.key), CounterCommand::Add { n });
//!                 actions.schedule_in(ctx, "quiet", Duration::from_secs(60));
//!             }
//!             Input::Outcome(o) if o.result.is_err() => self.refused += 1,
//!             Input::Outcome(_) => {}
//!             Input::Timer { .. } => actions.finish(),
//!         }
//!     }
//! }
//!
//! ProcessTest::<Mirror>::new()
//!     .at(1_000)
//!     .when::<Counter>("c", CounterEvent::Added { n: 7 })
//!     .then([
//!         Expect::send::<Counter>("mirror-c", CounterCommand::Add { n: 7 }),
//!         Expect::schedule("quiet", 61_000),
//!     ])
//!     .when::<Counter>("mirror-c", CounterEvent::Added { n: 7 })
//!     .then_ignored()
//!     .when_refused("counter", "mirror-c", "limit_exceeded")
//!     .then_nothing()
//!     .then_state("c", |s| assert_eq!(s.refused, 1))
//!     .when_timer("c", "quiet")
//!     .then([Expect::finish()]);
//! ```
//!
//! Events go through the process manager's own [`Subscription`](crate::Subscription)
//! decoding (as JSON), timers are kept per key as the runtime keeps them, and a failed
//! expectation prints the actions as JSON.

use crate::aggregate::Aggregate;
use crate::lookup::LookupRows;
use crate::process::{Action, Actions, CommandOutcome, EventMeta, Input, ProcessContext, ProcessManager, Refusal};
use std::collections::BTreeMap;

/// An expected action (compared as JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect(Action);

impl Expect {
    /// A command sent to aggregate `id` of type `A`.
    pub fn send<A: Aggregate>(id: &str, command: A::Command) -> Self {
        let mut a = Actions::new();
        a.send::<A>(id, command);
        Self(a.into_vec().remove(0))
    }
    /// A command sent to aggregate `id` of type `A` of another app, `app`.
    pub fn send_to<A: Aggregate>(app: &str, id: &str, command: A::Command) -> Self {
        let mut a = Actions::new();
        a.send_to::<A>(app, id, command);
        Self(a.into_vec().remove(0))
    }
    /// A timer scheduled at `due_ms`.
    pub fn schedule(timer: &str, due_ms: i64) -> Self {
        Self(Action::Schedule {
            timer: timer.into(),
            due_ms,
        })
    }
    /// A timer cancelled.
    pub fn cancel(timer: &str) -> Self {
        Self(Action::Cancel { timer: timer.into() })
    }
    /// The flow finished.
    pub fn finish() -> Self {
        Self(Action::Finish)
    }
}

fn to_json(actions: &[Action]) -> String {
    serde_json::to_string_pretty(actions).expect("actions serialize")
}

/// A command a reaction sent that has no outcome yet.
#[derive(Debug)]
struct Sent {
    key: String,
    app: Option<String>,
    aggregate_type: String,
    aggregate_id: String,
    command_type: String,
    command_id: String,
}

/// Test driver for a process manager (all keys).
pub struct ProcessTest<P: ProcessManager> {
    config: P::Config,
    timestamp_ms: i64,
    states: BTreeMap<String, P>,
    /// Pending timers per key: id -> due.
    timers: BTreeMap<String, BTreeMap<String, i64>>,
    /// Commands sent and not answered yet.
    sent: Vec<Sent>,
    /// The actions of the last `when`, and the key they were for.
    last: Option<(Option<String>, Vec<Action>)>,
    events: u64,
    lookups: LookupRows,
}

impl<P: ProcessManager> Default for ProcessTest<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: ProcessManager> ProcessTest<P> {
    /// No state, default config, time 0.
    pub fn new() -> Self {
        Self {
            config: P::Config::default(),
            timestamp_ms: 0,
            states: BTreeMap::new(),
            timers: BTreeMap::new(),
            sent: Vec::new(),
            last: None,
            events: 0,
            lookups: LookupRows::default(),
        }
    }

    /// Puts row `key` of lookup table `table` (`None`: removes it), for the reactions'
    /// [`ProcessContext::lookup`].
    pub fn with_lookup(mut self, table: &str, key: &str, row: Option<serde_json::Value>) -> Self {
        self.lookups.put(table, key, row);
        self
    }

    /// Uses `config` for the reactions.
    pub fn with_config(mut self, config: P::Config) -> Self {
        self.config = config;
        self
    }

    /// The timestamp of the next events (milliseconds).
    pub fn at(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = timestamp_ms;
        self
    }

    /// Feeds past events of aggregate `id` of type `A`; their actions are applied (timers
    /// kept, commands remembered for `when_accepted`/`when_refused`) and not checked.
    #[track_caller]
    pub fn given<A: Aggregate>(mut self, id: &str, events: impl IntoIterator<Item = A::Event>) -> Self {
        for e in events {
            self.feed::<A>(id, &e);
        }
        self.last = None;
        self
    }

    /// Feeds one event of aggregate `id` of type `A`; check its actions with `then`.
    #[track_caller]
    pub fn when<A: Aggregate>(mut self, id: &str, event: A::Event) -> Self {
        self.feed::<A>(id, &event);
        self
    }

    /// Fires the pending timer `timer` of `key` (fails when it is not pending).
    #[track_caller]
    pub fn when_timer(mut self, key: &str, timer: &str) -> Self {
        let due = match self.timers.get_mut(key).and_then(|t| t.remove(timer)) {
            Some(due) => due,
            None => panic!(
                "timer `{timer}` of key `{key}` is not pending (pending: {:?})",
                self.timers.get(key)
            ),
        };
        let ts = due;
        self.react(key.to_owned(), Input::Timer { id: timer, due_ms: due }, ts);
        self
    }

    /// The oldest unanswered command sent to `type`/`id` was accepted (the target now at
    /// `version`).
    #[track_caller]
    pub fn when_accepted(self, aggregate_type: &str, id: &str, version: u64) -> Self {
        self.answer(aggregate_type, id, Ok(version))
    }

    /// The oldest unanswered command sent to `type`/`id` was refused with `code`.
    #[track_caller]
    pub fn when_refused(self, aggregate_type: &str, id: &str, code: &str) -> Self {
        let refusal = Refusal {
            code: code.into(),
            message: format!("refused: {code}"),
        };
        self.answer(aggregate_type, id, Err(refusal))
    }

    #[track_caller]
    fn answer(mut self, aggregate_type: &str, id: &str, result: Result<u64, Refusal>) -> Self {
        let Some(i) = self
            .sent
            .iter()
            .position(|s| s.aggregate_type == aggregate_type && s.aggregate_id == id)
        else {
            panic!("no command to {aggregate_type}/{id} is waiting for an outcome");
        };
        let sent = self.sent.remove(i);
        let input = Input::Outcome(CommandOutcome {
            app: sent.app.as_deref(),
            aggregate_type: &sent.aggregate_type,
            aggregate_id: &sent.aggregate_id,
            command_type: &sent.command_type,
            command_id: &sent.command_id,
            result: result.as_ref().map(|v| *v),
        });
        let ts = self.timestamp_ms;
        self.react(sent.key.clone(), input, ts);
        self
    }

    #[track_caller]
    fn feed<A: Aggregate>(&mut self, id: &str, event: &A::Event) {
        let subs = P::subscriptions(&self.config);
        let Some(sub) = subs.iter().find(|s| s.aggregate_type() == A::TYPE) else {
            panic!("process manager `{}` does not subscribe to `{}`", P::NAME, A::TYPE);
        };
        let json = serde_json::to_vec(event).expect("events serialize");
        let decoded = sub.decode(&json).unwrap_or_else(|e| panic!("{e}"));
        let event_type = serde_json::from_slice::<serde_json::Value>(&json)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
            .unwrap_or_default();
        self.events += 1;
        let event_id = format!("event-{}", self.events);
        let meta = EventMeta {
            aggregate_type: A::TYPE,
            aggregate_id: id,
            version: self.events,
            event_id: &event_id,
            event_type: &event_type,
            timestamp_ms: self.timestamp_ms,
            correlation_id: &event_id,
        };
        match P::correlate(&decoded, &meta) {
            Some(key) => self.react(key, Input::Event { event: decoded, meta }, meta.timestamp_ms),
            None => self.last = Some((None, Vec::new())),
        }
    }

    fn react(&mut self, key: String, input: Input<'_, P::Event>, now_ms: i64) {
        let mut state = self.states.remove(&key).unwrap_or_default();
        let mut actions = Actions::new();
        let ctx = ProcessContext {
            key: &key,
            now_ms,
            config: &self.config,
            lookups: &self.lookups,
        };
        state.react(input, &ctx, &mut actions);
        let actions = actions.into_vec();
        let timers = self.timers.entry(key.clone()).or_default();
        let mut finished = false;
        for a in &actions {
            match a {
                Action::Send {
                    app,
                    aggregate_type,
                    aggregate_id,
                    command_type,
                    ..
                } => self.sent.push(Sent {
                    key: key.clone(),
                    app: app.clone(),
                    aggregate_type: aggregate_type.clone(),
                    aggregate_id: aggregate_id.clone(),
                    command_type: command_type.clone(),
                    command_id: format!("command-{}", self.sent.len()),
                }),
                Action::Schedule { timer, due_ms } => {
                    timers.insert(timer.clone(), *due_ms);
                }
                Action::Cancel { timer } => {
                    timers.remove(timer);
                }
                Action::Finish => {
                    timers.clear();
                    finished = true;
                }
            }
        }
        if !finished {
            self.states.insert(key.clone(), state);
        }
        self.last = Some((Some(key), actions));
    }

    /// Asserts the last `when*` produced exactly `expected`, in order.
    #[track_caller]
    pub fn then(self, expected: impl IntoIterator<Item = Expect>) -> Self {
        let expected: Vec<Action> = expected.into_iter().map(|e| e.0).collect();
        let Some((key, got)) = &self.last else {
            panic!("`then` needs a `when` before it");
        };
        if *got != expected {
            panic!(
                "actions differ for key {key:?}\n   got: {}\nexpected: {}",
                to_json(got),
                to_json(&expected)
            );
        }
        self
    }

    /// Asserts the last `when*` produced no action.
    #[track_caller]
    pub fn then_nothing(self) -> Self {
        self.then([])
    }

    /// Asserts the last event was not for this process manager (`correlate` gave `None`).
    #[track_caller]
    pub fn then_ignored(self) -> Self {
        match &self.last {
            Some((None, _)) => self,
            Some((Some(key), _)) => panic!("expected the event to be ignored; it went to key {key:?}"),
            None => panic!("`then_ignored` needs a `when` before it"),
        }
    }

    /// Asserts the pending timers of `key` (id, due), in id order.
    #[track_caller]
    pub fn then_timers(self, key: &str, expected: &[(&str, i64)]) -> Self {
        let got: Vec<(String, i64)> = self
            .timers
            .get(key)
            .map(|t| t.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default();
        let expected: Vec<(String, i64)> = expected.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        assert_eq!(got, expected, "pending timers of key {key:?} differ");
        self
    }

    /// Runs `check` on the state of `key` (the default when it has none or finished).
    #[track_caller]
    pub fn then_state(self, key: &str, check: impl FnOnce(&P)) -> Self {
        let state = self.states.get(key).cloned().unwrap_or_default();
        check(&state);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Context, Reject};
    use crate::process::Subscription;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Default, Clone, Serialize, Deserialize)]
    struct Counter;
    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(tag = "type")]
    enum Cmd {
        Bump,
    }
    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(tag = "type")]
    enum Ev {
        Bumped,
        Ignored,
    }
    #[derive(Debug)]
    struct Never;
    impl std::fmt::Display for Never {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("never")
        }
    }
    impl Reject for Never {
        fn code(&self) -> &'static str {
            "never"
        }
    }
    impl Aggregate for Counter {
        const TYPE: &'static str = "counter";
        type Command = Cmd;
        type Event = Ev;
        type Rejection = Never;
        type Config = ();
        fn handle(&self, _: Cmd, _: &Context<'_, ()>) -> Result<Vec<Ev>, Never> {
            Ok(vec![Ev::Bumped])
        }
        fn apply(&mut self, _: &Ev) {}
    }

    /// Echoes each `Bumped` of `c` to `echo-c`, with a timer; refusals are counted.
    #[derive(Debug, Default, Clone, Serialize, Deserialize)]
    struct Echo {
        refused: u32,
    }
    impl ProcessManager for Echo {
        const NAME: &'static str = "echo";
        type Event = Ev;
        type Config = ();
        fn subscriptions(_: &()) -> Vec<Subscription<Ev>> {
            vec![Subscription::to::<Counter>(|e| e)]
        }
        fn correlate(event: &Ev, meta: &EventMeta<'_>) -> Option<String> {
            matches!(event, Ev::Bumped).then(|| meta.aggregate_id.to_owned())
        }
        fn react(&mut self, input: Input<'_, Ev>, ctx: &ProcessContext<'_, ()>, actions: &mut Actions) {
            match input {
                Input::Event { .. } => {
                    actions.send::<Counter>(format!("echo-{}", ctx.key), Cmd::Bump);
                    actions.schedule_in(ctx, "t", std::time::Duration::from_secs(1));
                }
                Input::Timer { .. } => actions.finish(),
                Input::Outcome(o) => {
                    if o.result.is_err() {
                        self.refused += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn a_flow_runs_through_events_timers_and_outcomes() {
        ProcessTest::<Echo>::new()
            .at(1_000)
            .when::<Counter>("c", Ev::Bumped)
            .then([
                Expect::send::<Counter>("echo-c", Cmd::Bump),
                Expect::schedule("t", 2_000),
            ])
            .then_timers("c", &[("t", 2_000)])
            .when::<Counter>("c", Ev::Ignored)
            .then_ignored()
            .when_refused("counter", "echo-c", "never")
            .then_nothing()
            .then_state("c", |s| assert_eq!(s.refused, 1))
            .when_timer("c", "t")
            .then([Expect::finish()])
            .then_timers("c", &[])
            .then_state("c", |s| assert_eq!(s.refused, 0));
    }

    #[test]
    fn a_wrong_expectation_fails_and_names_the_actions() {
        let r = std::panic::catch_unwind(|| {
            ProcessTest::<Echo>::new()
                .when::<Counter>("c", Ev::Bumped)
                .then([Expect::send::<Counter>("echo-x", Cmd::Bump)]);
        });
        let msg = r.expect_err("must fail");
        let msg = msg.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.contains("actions differ") && msg.contains("\"echo-c\""), "{msg}");
        let r = std::panic::catch_unwind(|| {
            ProcessTest::<Echo>::new().when_timer("c", "t");
        });
        assert!(r.is_err(), "firing a timer that is not pending must fail");
        let r = std::panic::catch_unwind(|| {
            ProcessTest::<Echo>::new()
                .when::<Counter>("c", Ev::Bumped)
                .then_nothing();
        });
        assert!(r.is_err(), "then_nothing must fail when something was done");
    }
}
