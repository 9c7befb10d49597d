//! The pure step of a process manager: a batch of inputs plus what was prefetched (the
//! states and timers of the keys they touch) becomes a [`Plan`]: the states, timers and
//! commands to write. No I/O, no clock, no tokio: the worker prefetches, calls
//! [`decide`], and commits the plan as one unit.

use eventfold_core::Lookups;
use eventfold_core::process::{Action, Actions, CommandOutcome, EventMeta, Input, ProcessContext, ProcessManager};
use eventfold_core::process::{Refusal, Trigger, command_id};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;

/// A command a process manager sent: what its outbox entry holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Command {
    /// The correlation key that sent it (its outcome goes back there).
    pub key: String,
    /// Another app's id when the target is that app's aggregate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub command_type: String,
    pub command_id: String,
    /// The command's JSON.
    pub body: String,
    /// The correlation id of the input that caused it.
    pub correlation_id: String,
    /// The id of the event that caused it (`None` for a timer or an outcome: the
    /// command's own id stands in).
    #[serde(default)]
    pub causation_id: Option<String>,
}

/// One input of a batch.
#[derive(Debug)]
pub(crate) enum Step<E> {
    /// An event of a subscribed aggregate type; `key` is filled by [`correlate`].
    Event {
        event: E,
        envelope: Envelope,
        key: Option<String>,
    },
    /// A due timer, read from the store (the plan removes it).
    Timer {
        key: String,
        timer: String,
        due_ms: i64,
        correlation_id: String,
    },
    /// The outcome of outbox entry `seq` (the plan removes the entry).
    Outcome {
        seq: u64,
        command: Command,
        result: Result<u64, Refusal>,
        now_ms: i64,
    },
}

/// Where an event came from: what its [`EventMeta`] lends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub version: u64,
    pub event_id: String,
    pub event_type: String,
    pub timestamp_ms: i64,
    pub correlation_id: String,
}

impl Envelope {
    fn meta(&self) -> EventMeta<'_> {
        EventMeta {
            aggregate_type: self.aggregate_type,
            aggregate_id: &self.aggregate_id,
            version: self.version,
            event_id: &self.event_id,
            event_type: &self.event_type,
            timestamp_ms: self.timestamp_ms,
            correlation_id: &self.correlation_id,
        }
    }
}

impl<E> Step<E> {
    fn key(&self) -> Option<&str> {
        match self {
            Step::Event { key, .. } => key.as_deref(),
            Step::Timer { key, .. } => Some(key),
            Step::Outcome { command, .. } => Some(&command.key),
        }
    }
}

/// Fills in each event's correlation key (`None`: not for this process manager).
pub(crate) fn correlate<P: ProcessManager>(steps: &mut [Step<P::Event>]) {
    for s in steps {
        if let Step::Event { event, envelope, key } = s {
            *key = P::correlate(event, &envelope.meta());
        }
    }
}

/// The keys a batch touches (to prefetch).
pub(crate) fn keys<E>(steps: &[Step<E>]) -> BTreeSet<String> {
    steps.iter().filter_map(|s| s.key().map(str::to_owned)).collect()
}

/// A pending timer: due time and the correlation id of what scheduled it.
pub(crate) type Timers = BTreeMap<String, (i64, String)>;

/// The stored states and timers of the keys of a batch.
pub(crate) struct Prefetched<P> {
    pub states: HashMap<String, P>,
    pub timers: HashMap<String, Timers>,
}

impl<P> Default for Prefetched<P> {
    fn default() -> Self {
        Self {
            states: HashMap::new(),
            timers: HashMap::new(),
        }
    }
}

/// What to write for a batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Each touched key's state JSON, or `None` to delete it (back to the default).
    pub states: BTreeMap<String, Option<Vec<u8>>>,
    /// Timers to add: (key, timer, due, correlation id).
    pub timer_puts: Vec<(String, String, i64, String)>,
    /// Timers to remove: (key, timer, due).
    pub timer_dels: Vec<(String, String, i64)>,
    /// Commands to send, in order.
    pub sends: Vec<Command>,
    /// Outbox entries answered by this batch.
    pub answered: Vec<u64>,
    /// Inputs reacted to (events for other process managers are not counted).
    pub reactions: u64,
}

/// Runs the reactions of `steps` over `pre`. `Err` (a reaction that panicked, a command
/// for an aggregate type that `known` refuses, an invalid timer id) stops the process
/// manager with nothing of the batch written.
pub(crate) fn decide<P: ProcessManager>(
    steps: Vec<Step<P::Event>>,
    mut pre: Prefetched<P>,
    config: &P::Config,
    lookups: &dyn Lookups,
    known: &dyn Fn(Option<&str>, &str) -> bool,
) -> Result<Plan, String> {
    let original = pre.timers.clone();
    let mut plan = Plan::default();
    let mut touched = BTreeSet::new();
    for step in steps {
        let Some(key) = step.key().map(str::to_owned) else {
            continue;
        };
        let mut state = pre.states.remove(&key).unwrap_or_default();
        let timers = pre.timers.entry(key.clone()).or_default();
        if let Step::Timer { timer, .. } = &step {
            timers.remove(timer); // fired: gone whatever the reaction does
        }
        if let Step::Outcome { seq, .. } = &step {
            plan.answered.push(*seq);
        }
        let mut actions = Actions::new();
        let reaction = react_to::<P>(step, &key, (config, lookups), &mut state, &mut actions);
        if let Err(msg) = reaction.panicked {
            return Err(format!(
                "process manager `{}` panicked reacting to {}: {msg}",
                P::NAME,
                reaction.what
            ));
        }
        plan.reactions += 1;
        if apply::<P>(actions, &key, &reaction, timers, &mut plan, known)? {
            state = P::default();
        }
        pre.states.insert(key.clone(), state);
        touched.insert(key);
    }
    settle(&mut plan, touched, &pre, original)?;
    Ok(plan)
}

/// What one reaction was to, and whether it panicked.
struct Reaction {
    trigger: TriggerId,
    correlation: String,
    /// The input, for messages.
    what: String,
    panicked: Result<(), String>,
}

/// Runs the reaction of `state` (of `key`) to one input.
fn react_to<P: ProcessManager>(
    step: Step<P::Event>,
    key: &str,
    (config, lookups): (&P::Config, &dyn Lookups),
    state: &mut P,
    actions: &mut Actions,
) -> Reaction {
    let ctx = |now_ms| ProcessContext {
        key,
        now_ms,
        config,
        lookups,
    };
    match step {
        Step::Event { event, envelope, .. } => {
            let input = Input::Event {
                event,
                meta: envelope.meta(),
            };
            let panicked = react(state, input, &ctx(envelope.timestamp_ms), actions);
            Reaction {
                what: format!(
                    "event {} of {} `{}`",
                    envelope.event_id, envelope.aggregate_type, envelope.aggregate_id
                ),
                trigger: TriggerId::Event(envelope.event_id),
                correlation: envelope.correlation_id,
                panicked,
            }
        }
        Step::Timer {
            timer,
            due_ms,
            correlation_id,
            ..
        } => {
            let panicked = react(state, Input::Timer { id: &timer, due_ms }, &ctx(due_ms), actions);
            Reaction {
                what: format!("timer `{timer}` of key `{key}`"),
                trigger: TriggerId::Timer(timer, due_ms),
                correlation: correlation_id,
                panicked,
            }
        }
        Step::Outcome {
            command,
            result,
            now_ms,
            ..
        } => {
            let input = Input::Outcome(CommandOutcome {
                app: command.app.as_deref(),
                aggregate_type: &command.aggregate_type,
                aggregate_id: &command.aggregate_id,
                command_type: &command.command_type,
                command_id: &command.command_id,
                result: result.as_ref().map(|v| *v),
            });
            let panicked = react(state, input, &ctx(now_ms), actions);
            Reaction {
                what: format!("the outcome of command {}", command.command_id),
                trigger: TriggerId::Outcome(command.command_id),
                correlation: command.correlation_id,
                panicked,
            }
        }
    }
}

/// Adds a reaction's actions to the plan and `key`'s timers; true when it finished the
/// flow (the state goes back to the default).
fn apply<P: ProcessManager>(
    actions: Actions,
    key: &str,
    reaction: &Reaction,
    timers: &mut Timers,
    plan: &mut Plan,
    known: &dyn Fn(Option<&str>, &str) -> bool,
) -> Result<bool, String> {
    let mut finished = false;
    let mut step_no = 0;
    for action in actions.into_vec() {
        match action {
            Action::Send {
                app,
                aggregate_type,
                aggregate_id,
                command_type,
                command,
            } => {
                if !known(app.as_deref(), &aggregate_type) {
                    let target = match &app {
                        Some(app) => format!(
                            "app `{app}`'s aggregate type `{aggregate_type}`, which cannot be reached (another app's aggregates are reached through Kafka only)"
                        ),
                        None => format!("aggregate type `{aggregate_type}`, which is not registered"),
                    };
                    return Err(format!(
                        "process manager `{}` sent {command_type} to {target} (reacting to {})",
                        P::NAME,
                        reaction.what
                    ));
                }
                let command_id = command_id(P::NAME, reaction.trigger.as_trigger(key), step_no);
                step_no += 1;
                plan.sends.push(Command {
                    key: key.to_owned(),
                    app,
                    aggregate_type,
                    aggregate_id,
                    command_type,
                    command_id,
                    body: command.to_string(),
                    correlation_id: reaction.correlation.clone(),
                    causation_id: match &reaction.trigger {
                        TriggerId::Event(id) => Some(id.clone()),
                        TriggerId::Timer(..) | TriggerId::Outcome(_) => None,
                    },
                });
            }
            Action::Schedule { timer, due_ms } => {
                check_timer::<P>(key, &timer)?;
                timers.insert(timer, (due_ms, reaction.correlation.clone()));
            }
            Action::Cancel { timer } => {
                timers.remove(&timer);
            }
            Action::Finish => {
                timers.clear();
                finished = true;
            }
        }
    }
    Ok(finished)
}

/// The touched keys' final states (the default one deleted) and timer changes against
/// what was stored (`original`).
fn settle<P: ProcessManager>(
    plan: &mut Plan,
    touched: BTreeSet<String>,
    pre: &Prefetched<P>,
    original: HashMap<String, Timers>,
) -> Result<(), String> {
    let default_json =
        serde_json::to_vec(&P::default()).map_err(|e| format!("cannot encode the default state: {e}"))?;
    for key in touched {
        let state = pre.states.get(&key).expect("every touched key has a state");
        let json = serde_json::to_vec(state).map_err(|e| format!("cannot encode the state of key `{key}`: {e}"))?;
        plan.states.insert(key.clone(), (json != default_json).then_some(json));
        let before = original.get(&key).cloned().unwrap_or_default();
        let after = pre.timers.get(&key).cloned().unwrap_or_default();
        for (timer, (due, _)) in &before {
            if after.get(timer).map(|(d, _)| d) != Some(due) {
                plan.timer_dels.push((key.clone(), timer.clone(), *due));
            }
        }
        for (timer, (due, correlation)) in after {
            if before.get(&timer).map(|(d, _)| *d) != Some(due) {
                plan.timer_puts.push((key.clone(), timer, due, correlation));
            }
        }
    }
    Ok(())
}

/// A timer id and key must be storable: 1 to 256 bytes without NUL.
fn check_timer<P: ProcessManager>(key: &str, timer: &str) -> Result<(), String> {
    let ok = |s: &str| !s.is_empty() && s.len() <= 256 && !s.contains('\0');
    if ok(key) && ok(timer) {
        Ok(())
    } else {
        Err(format!(
            "process manager `{}` scheduled timer {timer:?} of key {key:?}: ids and keys must be 1 to 256 bytes without NUL",
            P::NAME
        ))
    }
}

/// Runs one reaction; a panic in it comes back as its message.
fn react<P: ProcessManager>(
    state: &mut P,
    input: Input<'_, P::Event>,
    ctx: &ProcessContext<'_, P::Config>,
    actions: &mut Actions,
) -> Result<(), String> {
    std::panic::catch_unwind(AssertUnwindSafe(move || state.react(input, ctx, actions))).map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into())
    })
}

enum TriggerId {
    Event(String),
    Timer(String, i64),
    Outcome(String),
}

impl TriggerId {
    fn as_trigger<'a>(&'a self, key: &'a str) -> Trigger<'a> {
        match self {
            TriggerId::Event(id) => Trigger::Event(id),
            TriggerId::Timer(id, due_ms) => Trigger::Timer {
                key,
                id,
                due_ms: *due_ms,
            },
            TriggerId::Outcome(id) => Trigger::Outcome(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventfold_core::process::{Actions, Input, ProcessContext, Subscription};
    use serde::{Deserialize, Serialize};

    /// Counts events per key; at 2 sends `Ping` to `target-<key>` and arms timer `t`
    /// (1 s later); the timer sends `Late`; event value 99 panics; value 7 sends to an
    /// unregistered type; value 0 finishes.
    #[derive(Debug, Default, Clone, Serialize, Deserialize)]
    struct Counter {
        n: u32,
        refusals: u32,
    }

    impl ProcessManager for Counter {
        const NAME: &'static str = "counter";
        type Event = u32;
        type Config = ();
        fn subscriptions(_: &()) -> Vec<Subscription<u32>> {
            Vec::new()
        }
        fn correlate(event: &u32, meta: &EventMeta<'_>) -> Option<String> {
            (*event != 5).then(|| meta.aggregate_id.to_owned())
        }
        fn react(&mut self, input: Input<'_, u32>, ctx: &ProcessContext<'_, ()>, out: &mut Actions) {
            let send = |out: &mut Actions, t: &str, body: &str| {
                out.send_json(t, format!("target-{}", ctx.key), serde_json::json!({ "type": body }));
            };
            match input {
                Input::Event { event: 99, .. } => panic!("boom"),
                Input::Event { event: 7, .. } => send(out, "nowhere", "Ping"),
                Input::Event { event: 0, .. } => out.finish(),
                Input::Event { .. } => {
                    self.n += 1;
                    if self.n == 2 {
                        send(out, "target", "Ping");
                        out.schedule_in(ctx, "t", std::time::Duration::from_secs(1));
                    }
                }
                Input::Timer { .. } => send(out, "target", "Late"),
                Input::Outcome(o) => self.refusals += u32::from(o.result.is_err()),
            }
        }
    }

    fn event(id: &str, value: u32, n: u32) -> Step<u32> {
        Step::Event {
            event: value,
            envelope: Envelope {
                aggregate_type: "source",
                aggregate_id: id.into(),
                version: u64::from(n),
                event_id: format!("ev-{id}-{n}"),
                event_type: "Happened".into(),
                timestamp_ms: 1_000 * i64::from(n),
                correlation_id: format!("corr-{id}"),
            },
            key: None,
        }
    }

    fn run(mut steps: Vec<Step<u32>>, pre: Prefetched<Counter>) -> Result<Plan, String> {
        correlate::<Counter>(&mut steps);
        decide::<Counter>(steps, pre, &(), &eventfold_core::NoLookups, &|app, t| {
            app.is_none() && t == "target"
        })
    }

    #[test]
    fn events_fold_per_key_and_send_with_deterministic_ids() {
        let steps = vec![event("a", 1, 1), event("b", 1, 2), event("a", 1, 3), event("x", 5, 4)];
        let plan = run(steps, Prefetched::default()).unwrap();
        assert_eq!(plan.reactions, 3, "the event correlated to no key is skipped");
        assert_eq!(plan.states["a"].as_deref(), Some(&br#"{"n":2,"refusals":0}"#[..]));
        assert_eq!(plan.states["b"].as_deref(), Some(&br#"{"n":1,"refusals":0}"#[..]));
        assert_eq!(plan.sends.len(), 1);
        let s = &plan.sends[0];
        assert_eq!((s.key.as_str(), s.aggregate_id.as_str()), ("a", "target-a"));
        assert_eq!(s.command_id, "counter:ev-a-3:0");
        assert_eq!(s.correlation_id, "corr-a");
        assert_eq!(s.causation_id.as_deref(), Some("ev-a-3"));
        assert_eq!(plan.timer_puts, vec![("a".into(), "t".into(), 4_000, "corr-a".into())]);
        assert!(plan.timer_dels.is_empty());
        // The same inputs again: the same plan (ids included).
        let again = run(
            vec![event("a", 1, 1), event("b", 1, 2), event("a", 1, 3), event("x", 5, 4)],
            Prefetched::default(),
        )
        .unwrap();
        assert_eq!(again, plan);
    }

    #[test]
    fn prefetched_state_is_the_base_and_a_default_state_is_deleted() {
        let mut pre = Prefetched::default();
        pre.states.insert("a".into(), Counter { n: 1, refusals: 0 });
        pre.timers
            .insert("a".into(), BTreeMap::from([("old".to_owned(), (50, "c0".to_owned()))]));
        let plan = run(vec![event("a", 1, 1)], pre).unwrap();
        assert_eq!(plan.sends.len(), 1, "the stored n=1 plus one makes two");
        let mut pre = Prefetched::default();
        pre.states.insert("a".into(), Counter { n: 3, refusals: 0 });
        pre.timers
            .insert("a".into(), BTreeMap::from([("old".to_owned(), (50, "c0".to_owned()))]));
        let plan = run(vec![event("a", 0, 1)], pre).unwrap();
        assert_eq!(plan.states["a"], None, "finished: back to the default, deleted");
        assert_eq!(plan.timer_dels, vec![("a".into(), "old".into(), 50)]);
    }

    #[test]
    fn timers_and_outcomes_are_inputs_that_consume_themselves() {
        let mut pre = Prefetched::default();
        pre.timers.insert(
            "a".into(),
            BTreeMap::from([("t".to_owned(), (4_000, "corr-a".to_owned()))]),
        );
        let timer = Step::Timer {
            key: "a".into(),
            timer: "t".into(),
            due_ms: 4_000,
            correlation_id: "corr-a".into(),
        };
        let command = Command {
            key: "a".into(),
            app: None,
            aggregate_type: "target".into(),
            aggregate_id: "target-a".into(),
            command_type: "Ping".into(),
            command_id: "counter:ev-a-3:0".into(),
            body: "{}".into(),
            correlation_id: "corr-a".into(),
            causation_id: None,
        };
        let outcome = Step::Outcome {
            seq: 9,
            command,
            result: Err(Refusal {
                code: "nope".into(),
                message: "no".into(),
            }),
            now_ms: 5_000,
        };
        let plan = run(vec![timer, outcome], pre).unwrap();
        assert_eq!(
            plan.timer_dels,
            vec![("a".into(), "t".into(), 4_000)],
            "the fired timer goes"
        );
        assert_eq!(plan.answered, vec![9]);
        assert_eq!(plan.sends.len(), 1);
        assert_eq!(plan.sends[0].command_type, "Late");
        assert!(
            plan.sends[0].command_id.starts_with("counter:t"),
            "{}",
            plan.sends[0].command_id
        );
        assert_eq!(plan.states["a"].as_deref(), Some(&br#"{"n":0,"refusals":1}"#[..]));
    }

    #[test]
    fn a_panic_or_an_unknown_target_fails_the_batch_with_the_input_named() {
        let e = run(vec![event("a", 1, 1), event("a", 99, 2)], Prefetched::default()).unwrap_err();
        assert!(
            e.contains("panicked") && e.contains("ev-a-2") && e.contains("boom"),
            "{e}"
        );
        let e = run(vec![event("a", 7, 1)], Prefetched::default()).unwrap_err();
        assert!(e.contains("`nowhere`") && e.contains("not registered"), "{e}");
    }
}
