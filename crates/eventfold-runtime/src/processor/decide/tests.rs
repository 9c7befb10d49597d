//! Unit tests of the decision: batches decided from prefetched reads, without tokio
//! and without a `Log`.

use super::*;
use eventfold_core::testing::{Counter, CounterCommand};
use std::cell::RefCell;

/// What an [`Env`] borrows.
#[derive(Default)]
struct World {
    inflight: HashMap<String, (u64, usize)>,
    tables: crate::lookup::Tables,
    /// Stored outcomes and states the readers find.
    outcomes: HashMap<String, Outcome>,
    states: HashMap<String, (u64, Counter)>,
    /// An aggregate whose state cannot be read.
    broken: Option<String>,
    /// What was read, in order.
    reads: RefCell<Vec<String>>,
}

static TOPICS: std::sync::LazyLock<Topics> = std::sync::LazyLock::new(|| Topics::new("app", "counter"));

static LOCAL: Durability = Durability::Local;

/// Kafka mode's durability (its group member is never used by a decision).
static REPLICATED: std::sync::LazyLock<Durability> = std::sync::LazyLock::new(|| Durability::Replicated {
    member: std::sync::Arc::default(),
});

fn env<'a>(w: &'a World, topics: &'a Topics, changelog: bool, min_epoch: u64) -> Env<'a, Counter> {
    Env {
        partition: 0,
        topics,
        config: &(),
        lookups: &w.tables,
        now: 1_000,
        durability: if changelog { &REPLICATED } else { &LOCAL },
        state_every: 1,
        min_epoch,
        inflight: &w.inflight,
    }
}

fn add(aggregate: &str, command_id: &str, n: u64) -> Command<CounterCommand> {
    Command {
        meta: Meta {
            aggregate_id: aggregate.into(),
            command_id: command_id.into(),
            correlation_id: "corr".into(),
            causation_id: None,
            expected_version: None,
            consumed: None,
            keyed: true,
            epoch: 0,
            reply_partition: None,
        },
        body: Ok(CounterCommand::Add { n }),
    }
}

/// A record of the commands topic: consumed up to `next`, answered on results
/// partition 3.
fn from_topic(mut c: Command<CounterCommand>, next: u64) -> Command<CounterCommand> {
    c.meta.consumed = Some(next);
    c.meta.reply_partition = Some(3);
    c
}

/// Prefetches from `w` and decides.
fn run(w: &World, env: &Env<'_, Counter>, commands: Vec<Command<CounterCommand>>) -> Plan<Counter> {
    let outcome = |id: &str| {
        w.reads.borrow_mut().push(format!("outcome {id}"));
        Ok(w.outcomes.get(id).cloned())
    };
    let state = |id: &str| {
        w.reads.borrow_mut().push(format!("state {id}"));
        if w.broken.as_deref() == Some(id) {
            return Err(format!("cannot read {id}"));
        }
        Ok(w.states.get(id).cloned().unwrap_or_default())
    };
    let pre = prefetch(&commands, env, outcome, state);
    decide(commands, pre, env)
}

fn reads(w: &World) -> Vec<String> {
    w.reads.borrow().clone()
}

fn topics_of(plan: &Plan<Counter>) -> Vec<&str> {
    plan.appends.iter().map(|a| &*a.topic).collect()
}

fn accepted(p: &Pending) -> &Accepted {
    match p {
        Pending::Written {
            outcome: Outcome::Accepted(a),
            ..
        } => a,
        _ => panic!("not accepted"),
    }
}

fn rejected(p: &Pending) -> &str {
    match p {
        Pending::Written {
            outcome: Outcome::Rejected { error, .. },
            appends,
        } => {
            assert!(appends.is_empty());
            error
        }
        _ => panic!("not a written rejection"),
    }
}

#[test]
fn an_accepted_command_appends_its_events_and_advances_the_state() {
    let mut w = World::default();
    w.states.insert("a".into(), (2, Counter { total: 10 }));
    let plan = run(&w, &env(&w, &TOPICS, false, 0), vec![add("a", "c1", 5)]);
    assert_eq!(reads(&w), ["outcome c1", "state a"]);
    assert_eq!(plan.decisions, [Decision::Answered(0)]);
    let a = accepted(&plan.slots[0]);
    assert_eq!((a.version, a.events.len()), (3, 1));
    assert_eq!(a.events[0].causation_id, "c1");
    assert_eq!(topics_of(&plan), ["app.counter.events"]);
    let record = &plan.appends[0];
    assert_eq!(record.entity, Some((b"a".to_vec(), 3)));
    assert_eq!(record.record.header(headers::COMMAND_ID), Some(&b"c1"[..]));
    let state = &plan.states["a"];
    assert_eq!((state.version, state.loaded_version, state.state.total), (3, 2, 15));
    assert_eq!(plan.touched, [(Arc::from("a"), 3)]);
    assert_eq!((plan.written, plan.commands["c1"]), (1, 0));
    assert!(!plan.local.is_empty(), "dedup record and state");
    assert!(plan.fatal.is_none() && plan.positioned.is_empty() && plan.consumed.is_none());
}

#[test]
fn a_rejection_appends_nothing_and_leaves_the_state() {
    let w = World::default();
    let plan = run(&w, &env(&w, &TOPICS, false, 0), vec![add("a", "c1", 101)]);
    assert_eq!(rejected(&plan.slots[0]), "limit_exceeded");
    assert!(plan.appends.is_empty() && plan.touched.is_empty());
    assert_eq!(plan.written, 1, "its outcome is recorded for the dedup table");
    assert!(!plan.local.is_empty());
}

#[test]
fn a_version_mismatch_is_a_conflict_that_writes_nothing() {
    let mut w = World::default();
    w.states.insert("a".into(), (4, Counter { total: 1 }));
    let mut c = add("a", "c1", 1);
    c.meta.expected_version = Some(3);
    let plan = run(&w, &env(&w, &TOPICS, false, 0), vec![c]);
    match &plan.slots[0] {
        Pending::Ready(Err(Error::VersionMismatch { expected: 3, actual: 4 }), CommandOutcome::Conflict) => {}
        _ => panic!("not a conflict"),
    }
    assert!(plan.appends.is_empty() && plan.local.is_empty() && plan.touched.is_empty());
    assert!(plan.commands.is_empty(), "a conflict is not deduplicated");
    assert_eq!(plan.written, 0);
}

#[test]
fn a_copy_in_the_same_batch_joins_the_first_and_reads_nothing() {
    let w = World::default();
    let commands = vec![add("a", "c1", 1), add("a", "c2", 2), add("a", "c1", 1)];
    let plan = run(&w, &env(&w, &TOPICS, false, 0), commands);
    assert_eq!(reads(&w), ["outcome c1", "state a", "outcome c2"]);
    let expected = [Decision::Answered(0), Decision::Answered(1), Decision::Joined(0)];
    assert_eq!(plan.decisions, expected);
    assert_eq!((plan.appends.len(), plan.states["a"].version, plan.written), (2, 2, 2));
    assert_eq!(plan.touched, [(Arc::from("a"), 2)]);
}

#[test]
fn a_stored_outcome_is_replayed_without_new_events() {
    let mut w = World::default();
    let stored = Outcome::Rejected {
        error: "limit_exceeded".into(),
        message: "no".into(),
    };
    w.outcomes.insert("c1".into(), stored.clone());
    let plan = run(&w, &env(&w, &TOPICS, false, 0), vec![add("a", "c1", 1)]);
    assert_eq!(reads(&w), ["outcome c1"], "no state is read for it");
    match &plan.slots[0] {
        Pending::Ready(Ok(o), CommandOutcome::Duplicate) => assert_eq!(o, &stored),
        _ => panic!("not replayed"),
    }
    assert!(plan.appends.is_empty() && plan.local.is_empty() && plan.states.is_empty());
    assert_eq!(plan.written, 0);
}

#[test]
fn a_copy_of_a_command_in_flight_joins_it() {
    let mut w = World::default();
    w.inflight.insert("c1".into(), (7, 2));
    let plan = run(&w, &env(&w, &TOPICS, false, 0), vec![add("a", "c1", 1)]);
    assert!(reads(&w).is_empty());
    assert_eq!(plan.decisions, [Decision::InFlight(7, 2)]);
    assert!(plan.slots.is_empty() && plan.appends.is_empty() && plan.local.is_empty());
}

#[test]
fn an_undecodable_record_is_refused_recorded_and_consumed() {
    let w = World::default();
    let mut c = from_topic(add("a", "c1", 1), 5);
    c.body = Err(eventfold_core::Error::Malformed {
        what: "command",
        reason: "not JSON".into(),
    });
    let plan = run(&w, &env(&w, &TOPICS, false, 0), vec![c]);
    assert_eq!(reads(&w), ["outcome c1"]);
    assert_eq!(rejected(&plan.slots[0]), "malformed_command");
    assert_eq!((plan.consumed, plan.written), (Some(5), 1));
    assert!(plan.appends.is_empty() && !plan.local.is_empty());
}

#[test]
fn records_of_an_older_epoch_are_skipped_unread_and_unconsumed() {
    let w = World::default();
    let mut old = from_topic(add("a", "c1", 1), 5);
    old.meta.epoch = 1;
    let mut new = from_topic(add("b", "c2", 1), 6);
    new.meta.epoch = 2;
    let plan = run(&w, &env(&w, &TOPICS, false, 2), vec![old, new]);
    assert_eq!(reads(&w), ["outcome c2", "state b"]);
    assert_eq!(plan.decisions, [Decision::Skipped, Decision::Answered(0)]);
    assert_eq!(plan.consumed, Some(6));
    assert!(!plan.states.contains_key("a"));
}

#[test]
fn kafka_mode_writes_the_changelog_and_the_results() {
    let w = World::default();
    let commands = vec![
        from_topic(add("a", "c1", 1), 10),
        from_topic(add("a", "c2", 200), 11),
        add("a", "c3", 2),
    ];
    let plan = run(&w, &env(&w, &TOPICS, true, 0), commands);
    let expected = [
        "app.counter.events",  // c1's event
        "app.counter.state",   // c1's outcome, by reference to its events
        "app.counter.state",   // c2's rejection
        "app.counter.results", // c2's result, for its sender
        "app.counter.events",  // c3's event (a local caller: no result record)
        "app.counter.state",   // c3's outcome
        "app.counter.state",   // a's state
    ];
    assert_eq!(topics_of(&plan), expected);
    assert_eq!(plan.appends[3].partition, 3, "the sender's results partition");
    assert_eq!(plan.appends[6].record.header(headers::VERSION), Some(&b"2"[..]));
    // c1's result waits for its events' offsets.
    assert_eq!(plan.positioned.len(), 1);
    let r = &plan.positioned[0];
    assert_eq!(
        (r.command_id.as_str(), r.appends.clone(), r.results_partition),
        ("c1", 0..1, 3)
    );
    let then = results_then(plan.positioned, &TOPICS, 0, 0, 1_000);
    let results = then.run(&[41, 42, 43, 44, 45, 46, 47]);
    assert_eq!(results.len(), 1);
    assert_eq!((&*results[0].topic, results[0].partition), ("app.counter.results", 3));
    let json = String::from_utf8(results[0].record.value.clone()).unwrap();
    assert!(json.contains("\"version\":1"), "{json}");
}

#[test]
fn kafka_mode_answers_a_conflict_and_a_replay_on_the_results_topic() {
    let mut w = World::default();
    w.outcomes.insert(
        "c1".into(),
        Outcome::Rejected {
            error: "limit_exceeded".into(),
            message: "no".into(),
        },
    );
    let mut conflict = from_topic(add("a", "c2", 1), 8);
    conflict.meta.expected_version = Some(9);
    let plan = run(
        &w,
        &env(&w, &TOPICS, true, 0),
        vec![from_topic(add("a", "c1", 1), 7), conflict],
    );
    assert_eq!(topics_of(&plan), ["app.counter.results", "app.counter.results"]);
    assert_eq!(plan.appends[1].record.header(headers::VERSION), Some(&b"0"[..]));
    assert_eq!((plan.consumed, plan.written), (Some(8), 0));
}

#[test]
fn a_read_error_stops_the_batch_at_the_command_that_needs_it() {
    let w = World {
        broken: Some("b".into()),
        ..World::default()
    };
    let commands = vec![add("a", "c1", 1), add("b", "c2", 1), add("c", "c3", 1)];
    let plan = run(&w, &env(&w, &TOPICS, false, 0), commands);
    assert_eq!(
        reads(&w),
        ["outcome c1", "state a", "outcome c2", "state b"],
        "nothing read after it"
    );
    assert_eq!(plan.decisions, [Decision::Answered(0)]);
    assert_eq!(plan.fatal.as_deref(), Some("cannot read b"));
}
