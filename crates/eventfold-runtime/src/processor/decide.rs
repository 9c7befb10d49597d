//! The pure step of a partition processor: a batch of commands plus what was prefetched
//! (the stored outcomes of its keyed command ids, the states of its aggregates) becomes a
//! [`Plan`]: per command what answers it, the records to append, the local store changes,
//! the outcomes the results topic gets once the events' offsets are known, the offset
//! consumed. No I/O, no clock, no tokio: the processor prefetches ([`prefetch`], with
//! its readers), calls [`decide`], and commits the plan as one unit.

use super::durability::{At, Durability};
use crate::changelog;
use crate::command::{Topics, VERSION_MISMATCH};
use crate::error::{Error, Result};
use crate::metrics::CommandOutcome;
use crate::snapshot;
use eventfold_core::envelope::{Accepted, headers};
use eventfold_core::time::rfc3339_ms;
use eventfold_core::{Aggregate, Context, EventView, Lookups, Outcome, Position, Record, Reject, codec};
use eventfold_log::{Append, Then};
use eventfold_store::Batch;
use foldhash::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

/// A command of the batch, without the channel its caller waits on: what the decision
/// reads of a `Job`.
pub(crate) struct Command<C> {
    pub meta: Meta,
    /// The decoded command, or why a record of the commands topic did not decode.
    pub body: std::result::Result<C, eventfold_core::Error>,
}

/// A command's ids and delivery details.
pub(crate) struct Meta {
    pub aggregate_id: String,
    pub command_id: String,
    pub correlation_id: String,
    /// What caused the command (its events' `ef-causation-id`); `None`: the command id.
    pub causation_id: Option<String>,
    /// `If-Match`: the version the aggregate must be at.
    pub expected_version: Option<u64>,
    /// For a record of the commands topic: the offset to consume next once it commits.
    pub consumed: Option<u64>,
    /// Whether the caller chose the command id: only then is it deduplicated.
    pub keyed: bool,
    /// For a record of the commands topic: the partition's epoch when it was fetched.
    pub epoch: u64,
    /// For a record of the commands topic: the results partition its sender listens to.
    pub reply_partition: Option<u32>,
}

/// An aggregate's working copy.
pub(crate) struct Cached<A> {
    pub version: u64,
    pub state: A,
    /// The version when this batch loaded it: unchanged aggregates are not written (a
    /// rejected command on a new aggregate leaves nothing behind).
    pub loaded_version: u64,
}

/// What a command in the batch will be answered with.
pub(crate) enum Pending {
    /// Known without this batch's commit (dedup hit, conflict, ...).
    Ready(Result<Outcome>, CommandOutcome),
    /// Written in this batch; the position is filled in from the receipt.
    Written { outcome: Outcome, appends: Range<usize> },
}

/// What was read for a batch before deciding it.
pub(crate) struct Prefetched<A> {
    /// Keyed command id -> its outcome stored within the dedup window (`None`: none), or
    /// why it could not be read.
    pub outcomes: HashMap<String, std::result::Result<Option<Outcome>, String>>,
    /// Aggregate id -> its version and state (from the cache or the store), or why it
    /// could not be read.
    pub states: HashMap<String, std::result::Result<(u64, A), String>>,
}

impl<A> Default for Prefetched<A> {
    fn default() -> Self {
        Self {
            outcomes: HashMap::default(),
            states: HashMap::default(),
        }
    }
}

/// What the decision depends on besides the commands and what was read.
pub(crate) struct Env<'a, A: Aggregate> {
    pub partition: u32,
    pub topics: &'a Topics,
    pub config: &'a A::Config,
    pub lookups: &'a dyn Lookups,
    pub now: i64,
    /// What the backend writes besides the events, dedup records and states.
    pub durability: &'a Durability,
    /// The store keeps a state every this many versions (see `snapshot`).
    pub state_every: u64,
    /// Commands-topic records fetched before this epoch are dropped.
    pub min_epoch: u64,
    /// Keyed command ids still committing -> (batch sequence number, slot).
    pub inflight: &'a HashMap<String, (u64, usize)>,
}

impl<A: Aggregate> Env<'_, A> {
    /// Where and when the decision's records are written.
    fn at(&self) -> At<'_> {
        At {
            topics: self.topics,
            partition: self.partition,
            now: self.now,
        }
    }

    /// A commands-topic record fetched before the last assignment or recovery: the
    /// source reads it again.
    fn stale(&self, m: &Meta) -> bool {
        m.consumed.is_some() && m.epoch < self.min_epoch
    }
}

/// What answers a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Handed over before a recovery: dropped unanswered (the source reads it again).
    Skipped,
    /// A copy of a command still committing in batch `.0` (sequence number), slot `.1`.
    InFlight(u64, usize),
    /// A copy of a command of this batch, answered by slot `.0`.
    Joined(usize),
    /// Answered by its own slot `.0`.
    Answered(usize),
}

/// An accepted outcome for the results topic, positioned once its events have offsets.
pub(crate) struct Positioned {
    pub command_id: String,
    pub outcome: Outcome,
    pub appends: Range<usize>,
    pub results_partition: u32,
}

/// A decided batch.
pub(crate) struct Plan<A> {
    /// One per command, in order, up to the one that stopped the batch (`fatal`).
    pub decisions: Vec<Decision>,
    pub slots: Vec<Pending>,
    /// Why the command after the last decision stopped the batch: nothing is committed.
    pub fatal: Option<String>,
    pub appends: Vec<Append>,
    pub local: Batch,
    pub positioned: Vec<Positioned>,
    /// The commands-topic offset consumed by this batch (its highest).
    pub consumed: Option<u64>,
    /// Keyed command ids written by this batch -> their slots.
    pub commands: HashMap<String, usize>,
    /// The aggregates this batch read, at their new versions (for the cache).
    pub states: HashMap<String, Cached<A>>,
    /// Aggregates changed, with their new versions.
    pub touched: Vec<(Arc<str>, u64)>,
    /// Slots written by this batch.
    pub written: usize,
}

/// Reads what deciding `commands` needs, in the order the decision needs it, each key
/// once: a keyed command's stored outcome, then (if it has none and decoded) its
/// aggregate's state. The first error of a command that the decision certainly reads
/// for stops it; a later copy of a command id may be answered as its first copy, so an
/// error of its reads is kept for [`decide`] to stop at if it needs them.
pub(crate) fn prefetch<A: Aggregate, C>(
    commands: &[Command<C>],
    env: &Env<'_, A>,
    mut outcome: impl FnMut(&str) -> std::result::Result<Option<Outcome>, String>,
    mut state: impl FnMut(&str) -> std::result::Result<(u64, A), String>,
) -> Prefetched<A> {
    let mut pre = Prefetched::default();
    let mut seen: HashSet<&str> = HashSet::default();
    for Command { meta: c, body } in commands {
        if env.stale(c) || (c.keyed && env.inflight.contains_key(&c.command_id)) {
            continue;
        }
        let first = !c.keyed || seen.insert(&c.command_id);
        if c.keyed {
            if !pre.outcomes.contains_key(&c.command_id) {
                let read = outcome(&c.command_id);
                let failed = read.is_err();
                pre.outcomes.insert(c.command_id.clone(), read);
                if failed && first {
                    break;
                }
            }
            if !matches!(pre.outcomes.get(&c.command_id), Some(Ok(None))) {
                continue;
            }
        }
        if body.is_ok() && !pre.states.contains_key(&c.aggregate_id) {
            let read = state(&c.aggregate_id);
            let failed = read.is_err();
            pre.states.insert(c.aggregate_id.clone(), read);
            if failed && first {
                break;
            }
        }
    }
    pre
}

/// Decides a batch: see the module's documentation.
pub(crate) fn decide<A: Aggregate>(
    commands: Vec<Command<A::Command>>,
    mut pre: Prefetched<A>,
    env: &Env<'_, A>,
) -> Plan<A> {
    let mut plan = Plan {
        decisions: Vec::with_capacity(commands.len()),
        slots: Vec::with_capacity(commands.len()),
        fatal: None,
        appends: Vec::new(),
        local: Batch::new(),
        positioned: Vec::new(),
        consumed: None,
        commands: HashMap::default(),
        states: HashMap::default(),
        touched: Vec::new(),
        written: 0,
    };
    for Command { meta: c, body } in commands {
        if env.stale(&c) {
            plan.decisions.push(Decision::Skipped);
            continue;
        }
        // Every record taken from the commands topic is consumed by this batch, whatever
        // its outcome (duplicates and conflicts included).
        if let Some(next) = c.consumed {
            plan.consumed = Some(plan.consumed.map_or(next, |n| n.max(next)));
        }
        // The same command id again while its first copy is still committing, or twice
        // in this batch: every caller gets the one outcome. (An unkeyed command's id is a
        // fresh UUID: it has no copies, and is not tracked.)
        if c.keyed {
            if let Some(&(seq, i)) = env.inflight.get(&c.command_id) {
                plan.decisions.push(Decision::InFlight(seq, i));
                continue;
            }
            if let Some(&i) = plan.commands.get(&c.command_id) {
                plan.decisions.push(Decision::Joined(i));
                continue;
            }
        }
        if let Err(reason) = plan.one(c, body, &mut pre, env) {
            plan.fatal = Some(reason);
            return plan;
        }
    }
    plan.write_states(env);
    plan
}

impl<A: Aggregate> Plan<A> {
    /// Decides command `c`, which gets a slot of its own; `Err` stops the batch.
    fn one(
        &mut self,
        c: Meta,
        body: std::result::Result<A::Command, eventfold_core::Error>,
        pre: &mut Prefetched<A>,
        env: &Env<'_, A>,
    ) -> std::result::Result<(), String> {
        // Kafka mode, a record of the commands topic: its outcome goes to this results
        // partition (its sender listens there). A local caller is answered directly.
        let reply_to = (env.durability).results_partition(c.consumed.is_some(), c.reply_partition, env.partition);
        if c.keyed
            && let Some(outcome) = stored(pre, &c.command_id)?
        {
            if let Some(results_partition) = reply_to {
                // A sender waiting on the results topic gets the original outcome.
                let json = codec::to_json(&outcome);
                let (topic, now) = (&env.topics.results, env.now);
                self.appends.push(changelog::result_record(
                    topic,
                    results_partition,
                    &c.command_id,
                    &json,
                    now,
                ));
            }
            self.answer(Pending::Ready(Ok(outcome), CommandOutcome::Duplicate));
            return Ok(());
        }
        let pending = match body {
            // Undecodable input from the commands topic: refused, recorded, consumed.
            Err(invalid) => Pending::Written {
                outcome: invalid_outcome(&invalid),
                appends: 0..0,
            },
            Ok(command) => match self.handle(&c, command, reply_to, pre, env)? {
                Some(pending) => pending,
                None => return Ok(()),
            },
        };
        self.record(&c, &pending, reply_to, env);
        if c.keyed {
            self.commands.insert(c.command_id, self.slots.len());
        }
        self.written += 1;
        self.answer(pending);
        Ok(())
    }

    /// Gives the command being decided the next slot.
    fn answer(&mut self, pending: Pending) {
        self.decisions.push(Decision::Answered(self.slots.len()));
        self.slots.push(pending);
    }

    /// Runs a decoded command against its aggregate's working copy: what it writes, or
    /// `None` once it is answered with a version mismatch (nothing written).
    fn handle(
        &mut self,
        c: &Meta,
        command: A::Command,
        reply_to: Option<u32>,
        pre: &mut Prefetched<A>,
        env: &Env<'_, A>,
    ) -> std::result::Result<Option<Pending>, String> {
        let entry = load(&mut self.states, pre, &c.aggregate_id)?;
        if let Some(expected) = c.expected_version
            && expected != entry.version
        {
            let actual = entry.version;
            self.conflict(c, expected, actual, reply_to, env);
            return Ok(None);
        }
        let ctx = Context {
            aggregate_id: &c.aggregate_id,
            version: entry.version,
            timestamp_ms: env.now,
            config: env.config,
            lookups: env.lookups,
        };
        let events = match entry.state.handle(command, &ctx) {
            Ok(events) => events,
            Err(rejection) => {
                return Ok(Some(Pending::Written {
                    outcome: Outcome::Rejected {
                        error: rejection.code().to_owned(),
                        message: rejection.to_string(),
                    },
                    appends: 0..0,
                }));
            }
        };
        let start = self.appends.len();
        let mut views = Vec::with_capacity(events.len());
        let ids = Ids {
            aggregate: &c.aggregate_id,
            command: &c.command_id,
            correlation: &c.correlation_id,
            causation: c.causation_id.as_deref().unwrap_or(&c.command_id),
        };
        for event in &events {
            entry.state.apply(event);
            entry.version += 1;
            let (view, append) =
                event_record::<A>(&env.topics.events, env.partition, &ids, entry.version, event, env.now);
            views.push(view);
            self.appends.push(append);
        }
        let accepted = Accepted {
            aggregate_id: c.aggregate_id.clone(),
            version: entry.version,
            events: views,
            position: String::new(),
        };
        Ok(Some(Pending::Written {
            outcome: Outcome::Accepted(accepted),
            appends: start..self.appends.len(),
        }))
    }

    /// Answers `c` with a version mismatch (`If-Match`); a sender on the results topic
    /// gets it there, with the aggregate's version.
    fn conflict(&mut self, c: &Meta, expected: u64, actual: u64, reply_to: Option<u32>, env: &Env<'_, A>) {
        let err = Error::VersionMismatch { expected, actual };
        if let Some(results_partition) = reply_to {
            let json = codec::to_json(&Outcome::Rejected {
                error: VERSION_MISMATCH.into(),
                message: err.to_string(),
            });
            let (topic, now) = (&env.topics.results, env.now);
            let mut result = changelog::result_record(topic, results_partition, &c.command_id, &json, now);
            result.record = result.record.with_header(headers::VERSION, actual.to_string());
            self.appends.push(result);
        }
        self.answer(Pending::Ready(Err(err), CommandOutcome::Conflict));
    }

    /// The records of a written outcome: its dedup record (keyed commands), and in Kafka
    /// mode its changelog record and its result for a sender on the results topic.
    fn record(&mut self, c: &Meta, pending: &Pending, reply_to: Option<u32>, env: &Env<'_, A>) {
        let Pending::Written { outcome, appends } = pending else {
            return;
        };
        // Serialized only for what stores or sends it: an unkeyed command answered in
        // this process (the embedded log) needs none.
        let json = std::cell::OnceCell::new();
        let json = || json.get_or_init(|| codec::to_json(outcome));
        let (p, now, topics) = (env.partition, env.now, env.topics);
        if c.keyed {
            match outcome {
                // The events are kept in this store, written in the same local batch (on
                // Kafka too: the committer stores a unit's events and its local changes
                // together), and in the changelog's transaction: refer to them.
                Outcome::Accepted(a) => {
                    let count = u32::try_from(a.events.len()).expect("under 2^32 events per command");
                    let reference = changelog::events_reference(&a.aggregate_id, a.version, count);
                    self.local.put_dedup(A::TYPE, p, &c.command_id, now, &reference);
                    let at = env.at();
                    let record = (env.durability).accepted_record(at, &c.command_id, &a.aggregate_id, a.version, count);
                    self.appends.extend(record);
                }
                _ => {
                    self.local.put_dedup(A::TYPE, p, &c.command_id, now, json());
                    self.appends
                        .extend(env.durability.outcome_record(env.at(), &c.command_id, json()));
                }
            }
        }
        // Only Kafka answers senders on the results topic (see `Durability::results_partition`).
        match (reply_to, outcome) {
            // A caller of this instance waits for it: nothing for the results topic.
            (None, _) => {}
            // Its position is known only once the log assigned the events' offsets:
            // written by the unit's `then` (see [`results_then`]).
            (Some(results_partition), Outcome::Accepted(_)) => self.positioned.push(Positioned {
                command_id: c.command_id.clone(),
                outcome: outcome.clone(),
                appends: appends.clone(),
                results_partition,
            }),
            (Some(results_partition), _) => {
                self.appends.push(changelog::result_record(
                    &topics.results,
                    results_partition,
                    &c.command_id,
                    json(),
                    now,
                ));
            }
        }
    }

    /// The states of the aggregates this batch changed: the store keeps one every
    /// `state_every` versions and folds the events after it (see `snapshot`); Kafka
    /// mode's state topic gets every state, since it restores the store of an instance
    /// that takes the partition over.
    fn write_states(&mut self, env: &Env<'_, A>) {
        self.touched.reserve(self.states.len());
        for (id, c) in self.states.iter().filter(|(_, c)| c.version != c.loaded_version) {
            let stored = snapshot::writes_state(env.state_every, c.loaded_version, c.version);
            if stored || env.durability.keeps_every_state() {
                let json = codec::to_json(&c.state);
                self.appends
                    .extend(env.durability.state_record(env.at(), id, c.version, &json));
                if stored {
                    self.local.put_state(A::TYPE, id, c.version, &json);
                }
            }
            self.touched.push((Arc::from(id.as_str()), c.version));
        }
    }
}

/// The prefetched stored outcome of `command_id` (a copy for each copy of the command
/// that is answered with it), or the error reading it.
fn stored<A>(pre: &Prefetched<A>, command_id: &str) -> std::result::Result<Option<Outcome>, String> {
    match pre.outcomes.get(command_id) {
        Some(Ok(outcome)) => Ok(outcome.clone()),
        Some(Err(e)) => Err(e.clone()),
        None => Err(format!(
            "the stored outcome of command {command_id:?} was not read before deciding"
        )),
    }
}

/// The working copy of `id`: from this batch, else the prefetched one (moved in).
fn load<'w, A>(
    working: &'w mut HashMap<String, Cached<A>>,
    pre: &mut Prefetched<A>,
    id: &str,
) -> std::result::Result<&'w mut Cached<A>, String> {
    if !working.contains_key(id) {
        let (version, state) = match pre.states.remove(id) {
            Some(read) => read?,
            None => return Err(format!("the state of aggregate {id:?} was not read before deciding")),
        };
        let loaded_version = version;
        working.insert(
            id.to_owned(),
            Cached {
                version,
                state,
                loaded_version,
            },
        );
    }
    Ok(working.get_mut(id).expect("inserted above"))
}

/// The unit's `then`: the results-topic records of `positioned`, each with the position
/// after its events (the end of the events partition before the unit if it has none).
pub(crate) fn results_then(
    positioned: Vec<Positioned>,
    topics: &Topics,
    partition: u32,
    events_end: u64,
    now: i64,
) -> Then {
    let (events, results) = (topics.events.clone(), topics.results.clone());
    Then::new(move |offsets: &[u64]| {
        positioned
            .into_iter()
            .map(|mut r| {
                if let Outcome::Accepted(a) = &mut r.outcome {
                    let after = match r.appends.end.checked_sub(1).and_then(|i| offsets.get(i)) {
                        Some(last) => last + 1,
                        None => events_end,
                    };
                    a.position = Position::token_at(&events, partition, after);
                }
                let json = codec::to_json(&r.outcome);
                changelog::result_record(&results, r.results_partition, &r.command_id, &json, now)
            })
            .collect()
    })
}

/// The ids an event record carries.
struct Ids<'a> {
    aggregate: &'a str,
    command: &'a str,
    correlation: &'a str,
    causation: &'a str,
}

/// The event record (with every contract header) and its API view.
fn event_record<A: Aggregate>(
    topic: &Arc<str>,
    partition: u32,
    ids: &Ids<'_>,
    version: u64,
    event: &A::Event,
    now: i64,
) -> (EventView, Append) {
    // Serialized once, as the reply's document; the record's value copies its bytes.
    let (event_type, payload) = codec::encode_event_raw(event);
    let json = payload.get().as_bytes().to_vec();
    let event_id = uuid::Uuid::now_v7().to_string();
    let record = Record {
        key: ids.aggregate.as_bytes().to_vec(),
        value: json,
        headers: Vec::with_capacity(8),
        timestamp_ms: now,
    }
    .with_header(headers::TYPE, event_type.as_bytes())
    .with_header(headers::ID, event_id.as_bytes())
    .with_header(headers::AGGREGATE_ID, ids.aggregate.as_bytes())
    .with_header(headers::VERSION, version.to_string())
    .with_header(headers::COMMAND_ID, ids.command.as_bytes())
    .with_header(headers::CORRELATION_ID, ids.correlation.as_bytes())
    .with_header(headers::CAUSATION_ID, ids.causation.as_bytes())
    .with_header(headers::CONTENT_TYPE, "application/json");
    let view = EventView {
        version,
        event_type,
        id: event_id,
        command_id: ids.command.to_owned(),
        correlation_id: ids.correlation.to_owned(),
        causation_id: ids.causation.to_owned(),
        timestamp: rfc3339_ms(now),
        payload,
    };
    let append = Append {
        topic: topic.clone(),
        partition,
        record,
        entity: Some((ids.aggregate.as_bytes().to_vec(), version)),
    };
    (view, append)
}

/// The outcome of a commands-topic record that is not a valid command.
fn invalid_outcome(invalid: &eventfold_core::Error) -> Outcome {
    let error = match invalid {
        eventfold_core::Error::UnknownCommand { .. } => "unknown_command_type",
        _ => "malformed_command",
    };
    Outcome::Rejected {
        error: error.to_owned(),
        message: invalid.to_string(),
    }
}

#[cfg(test)]
mod tests;
