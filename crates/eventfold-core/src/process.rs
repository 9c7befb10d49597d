//! The process manager trait: services that react to events.
//!
//! A process manager (a saga) is pure like an [`Aggregate`]: it reads events of one or
//! more aggregate types ([`ProcessManager::subscriptions`]), maps each to a correlation
//! key ([`ProcessManager::correlate`]), keeps a state per key (the implementing type), and
//! reacts to its inputs with [`Actions`]: send a command to an aggregate, schedule or
//! cancel a timer, finish. Its inputs are the events, its timers when they fire, and the
//! outcomes of the commands it sent ([`Input`]), so that a refusal is handled in domain
//! code like any other fact.
//!
//! The runtime commits the new states, the emitted commands (an outbox), the timers and
//! the consumed positions as one unit, and gives every emitted command a deterministic
//! id ([`command_id`]), so that a redelivered input can never run a command twice
//! downstream. [`ProcessTest`](crate::ProcessTest) tests one without any runtime.

use crate::aggregate::Aggregate;
use crate::lookup::Lookups;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Where an event a process manager reads came from.
#[derive(Debug, Clone, Copy)]
pub struct EventMeta<'a> {
    /// The aggregate type that wrote it (e.g. `order`).
    pub aggregate_type: &'a str,
    /// The aggregate id.
    pub aggregate_id: &'a str,
    /// The event's version in its aggregate (1-based).
    pub version: u64,
    /// The event's id (`ef-id`, a UUID v7).
    pub event_id: &'a str,
    /// The event's type name (`ef-type`).
    pub event_type: &'a str,
    /// When it was written (milliseconds since the Unix epoch).
    pub timestamp_ms: i64,
    /// The correlation id it carries (`ef-correlation-id`).
    pub correlation_id: &'a str,
}

/// Why a command a process manager sent was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The stable code: the aggregate's rejection code (e.g. `order_not_placed`), or
    /// `version_mismatch`, or `invalid_command` when the target could not take the command
    /// at all (an invalid id or a body its type does not decode).
    pub code: String,
    /// The human sentence.
    pub message: String,
}

/// The outcome of a command a process manager sent.
#[derive(Debug, Clone, Copy)]
pub struct CommandOutcome<'a> {
    /// The target's app when it is another app's aggregate (see [`Actions::send_to`]).
    pub app: Option<&'a str>,
    /// The target's aggregate type.
    pub aggregate_type: &'a str,
    /// The target aggregate.
    pub aggregate_id: &'a str,
    /// The command's type name (its `"type"` field).
    pub command_type: &'a str,
    /// The command's id (see [`command_id`]).
    pub command_id: &'a str,
    /// Accepted (the aggregate's version after it), or refused.
    pub result: Result<u64, &'a Refusal>,
}

/// What a process manager reacts to.
#[derive(Debug)]
pub enum Input<'a, E> {
    /// An event of a subscribed aggregate type, decoded.
    Event {
        /// The event.
        event: E,
        /// Its envelope.
        meta: EventMeta<'a>,
    },
    /// A timer of this key came due.
    Timer {
        /// The timer's id (as scheduled).
        id: &'a str,
        /// When it was due (milliseconds since the Unix epoch).
        due_ms: i64,
    },
    /// A command this key sent was accepted or refused.
    Outcome(CommandOutcome<'a>),
}

/// What a reaction may look at besides the state: never the wall clock or I/O.
#[derive(Debug, Clone, Copy)]
pub struct ProcessContext<'a, C> {
    /// The correlation key of this state.
    pub key: &'a str,
    /// The input's time: an event's timestamp, a timer's due time, an outcome's arrival.
    /// Timers scheduled relative to it are deterministic on replay.
    pub now_ms: i64,
    /// Static configuration of the process manager.
    pub config: &'a C,
    /// The lookup tables (see [`ProcessContext::lookup`]).
    pub lookups: &'a dyn Lookups,
}

impl<C> ProcessContext<'_, C> {
    /// Row `key` of lookup table `table` (a replicated view every instance holds), as it
    /// is when the input is handled.
    pub fn lookup(&self, table: &str, key: &str) -> Option<serde_json::Value> {
        self.lookups.get(table, key)
    }
}

/// One reaction of a process manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Send `command` to aggregate `aggregate_type`/`aggregate_id` (of app `app` when it
    /// names another app).
    Send {
        /// Another app's id (Kafka mode: the command goes to `<app>.<type>.commands`);
        /// `None`: this service's own aggregate.
        #[serde(skip_serializing_if = "Option::is_none")]
        app: Option<String>,
        /// Target aggregate type.
        aggregate_type: String,
        /// Target aggregate id.
        aggregate_id: String,
        /// The command's type name.
        command_type: String,
        /// The command as JSON.
        command: serde_json::Value,
    },
    /// Schedule timer `timer` of this key at `due_ms` (replacing one of the same id).
    Schedule {
        /// Timer id, unique per key.
        timer: String,
        /// Due time in milliseconds since the Unix epoch.
        due_ms: i64,
    },
    /// Cancel timer `timer` of this key (nothing if it is not pending).
    Cancel {
        /// Timer id.
        timer: String,
    },
    /// The flow of this key is over: its state goes back to the default (and is not
    /// stored) and its pending timers are cancelled.
    Finish,
}

/// The actions a reaction collects, in order.
#[derive(Debug, Default)]
pub struct Actions {
    items: Vec<Action>,
}

impl Actions {
    /// No actions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `command` to aggregate `id` of type `A`.
    pub fn send<A: Aggregate>(&mut self, id: impl Into<String>, command: A::Command) {
        let command = serde_json::to_value(&command).expect("commands serialize to JSON");
        self.send_json(A::TYPE, id, command);
    }

    /// Sends a command given as JSON (its `"type"` field names it) to aggregate `id` of
    /// type `aggregate_type`: for targets whose Rust types this service does not have.
    pub fn send_json(&mut self, aggregate_type: impl Into<String>, id: impl Into<String>, command: serde_json::Value) {
        self.push_send(None, aggregate_type.into(), id.into(), command);
    }

    /// Sends `command` to aggregate `id` of type `A` in another app, `app` (Kafka mode:
    /// produced to `<app>.<type>.commands`, its outcome read from `<app>.<type>.results`;
    /// the two apps must use the same partition count). Its outcome comes back as an
    /// [`Input::Outcome`] like a local one's.
    pub fn send_to<A: Aggregate>(&mut self, app: impl Into<String>, id: impl Into<String>, command: A::Command) {
        let command = serde_json::to_value(&command).expect("commands serialize to JSON");
        self.push_send(Some(app.into()), A::TYPE.into(), id.into(), command);
    }

    /// [`Actions::send_to`] with the command given as JSON.
    pub fn send_json_to(
        &mut self,
        app: impl Into<String>,
        aggregate_type: impl Into<String>,
        id: impl Into<String>,
        command: serde_json::Value,
    ) {
        self.push_send(Some(app.into()), aggregate_type.into(), id.into(), command);
    }

    fn push_send(&mut self, app: Option<String>, aggregate_type: String, id: String, command: serde_json::Value) {
        let command_type = command
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or_default()
            .to_owned();
        self.items.push(Action::Send {
            app,
            aggregate_type,
            aggregate_id: id,
            command_type,
            command,
        });
    }

    /// Schedules timer `timer` at `due_ms`, replacing a pending one of the same id.
    pub fn schedule_at(&mut self, timer: impl Into<String>, due_ms: i64) {
        self.items.push(Action::Schedule {
            timer: timer.into(),
            due_ms,
        });
    }

    /// Schedules timer `timer` `after` the input's time (`ctx.now_ms`).
    pub fn schedule_in<C>(&mut self, ctx: &ProcessContext<'_, C>, timer: impl Into<String>, after: Duration) {
        let after = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
        self.schedule_at(timer, ctx.now_ms.saturating_add(after));
    }

    /// Cancels timer `timer` if it is pending.
    pub fn cancel(&mut self, timer: impl Into<String>) {
        self.items.push(Action::Cancel { timer: timer.into() });
    }

    /// Ends this key's flow (see [`Action::Finish`]).
    pub fn finish(&mut self) {
        self.items.push(Action::Finish);
    }

    /// The actions, in order.
    pub fn as_slice(&self) -> &[Action] {
        &self.items
    }

    /// Takes the actions out.
    pub fn into_vec(self) -> Vec<Action> {
        self.items
    }
}

type Decode<E> = dyn Fn(&[u8]) -> Result<E, String> + Send + Sync;

/// An aggregate type's events that a process manager reads, and how they become its
/// input type.
pub struct Subscription<E> {
    app: Option<String>,
    aggregate_type: &'static str,
    decode: Box<Decode<E>>,
}

impl<E> std::fmt::Debug for Subscription<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("app", &self.app)
            .field("aggregate_type", &self.aggregate_type)
            .finish()
    }
}

impl<E: 'static> Subscription<E> {
    /// Every event of aggregate type `A`, wrapped by `wrap` into the input type.
    pub fn to<A: Aggregate>(wrap: fn(A::Event) -> E) -> Self {
        Self {
            app: None,
            aggregate_type: A::TYPE,
            decode: Box::new(move |bytes| {
                serde_json::from_slice::<A::Event>(bytes)
                    .map(wrap)
                    .map_err(|e| format!("not an event of `{}`: {e}", A::TYPE))
            }),
        }
    }

    /// Every event of aggregate type `A` of another app, `app` (Kafka mode: read from
    /// `<app>.<type>.events`, which must have this service's partition count).
    pub fn from_app<A: Aggregate>(app: impl Into<String>, wrap: fn(A::Event) -> E) -> Self {
        Self {
            app: Some(app.into()),
            ..Self::to::<A>(wrap)
        }
    }

    /// The other app whose events it reads; `None`: this service's own.
    pub fn app(&self) -> Option<&str> {
        self.app.as_deref()
    }

    /// The aggregate type read.
    pub fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }

    /// Decodes an event's JSON payload.
    pub fn decode(&self, payload: &[u8]) -> Result<E, String> {
        (self.decode)(payload)
    }
}

/// A process manager; the implementing type is its state for one correlation key.
///
/// `correlate` and `react` are pure and deterministic, so that a redelivered input has the
/// same effect: the runtime derives each emitted command's id from the input and the
/// command's place among the reaction's sends.
pub trait ProcessManager: Default + Clone + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The name used in URLs, metrics and command ids, e.g. `order_flow` (ASCII letters,
    /// digits, `_` and `-`).
    const NAME: &'static str;
    /// The input event type, usually an enum with one variant per subscribed aggregate type.
    type Event: Send + 'static;
    /// Static configuration (use `()` when there is none).
    type Config: Clone + Default + Send + Sync + 'static;

    /// The aggregate types whose events it reads (the configuration may name another app
    /// to read them from, see [`Subscription::from_app`]).
    fn subscriptions(config: &Self::Config) -> Vec<Subscription<Self::Event>>;

    /// The correlation key of an event, or `None` when the event is not for this process
    /// manager.
    fn correlate(event: &Self::Event, meta: &EventMeta<'_>) -> Option<String>;

    /// Reacts to one input of this key: changes the state, collects actions.
    fn react(&mut self, input: Input<'_, Self::Event>, ctx: &ProcessContext<'_, Self::Config>, actions: &mut Actions);
}

/// Whether `name` is a valid process manager name: 1 to 64 ASCII letters, digits, `_`, `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What caused an emitted command (see [`command_id`]).
#[derive(Debug, Clone, Copy)]
pub enum Trigger<'a> {
    /// An event, by its id.
    Event(&'a str),
    /// A timer of a key that came due at `due_ms`.
    Timer {
        /// The correlation key.
        key: &'a str,
        /// The timer id.
        id: &'a str,
        /// Its due time.
        due_ms: i64,
    },
    /// The outcome of a command, by that command's id.
    Outcome(&'a str),
}

/// The deterministic id of the `step`-th command (0-based) a reaction of process manager
/// `name` to `trigger` sends. A redelivered input gets the same ids, so the target's
/// idempotency dedup drops the copies. An id is at most 120 printable ASCII characters
/// (a valid `Idempotency-Key`): `<name>:<event id>:<step>` for events, a 128-bit digest
/// of the key and timer or of the outcome's command id otherwise.
pub fn command_id(name: &str, trigger: Trigger<'_>, step: usize) -> String {
    match trigger {
        Trigger::Event(id) if id.len() <= 48 && id.bytes().all(|b| b.is_ascii_graphic()) => {
            format!("{name}:{id}:{step}")
        }
        Trigger::Event(id) => format!("{name}:e{}:{step}", digest(&[b"e", id.as_bytes()])),
        Trigger::Timer { key, id, due_ms } => format!(
            "{name}:t{}:{step}",
            digest(&[b"t", key.as_bytes(), id.as_bytes(), &due_ms.to_be_bytes()])
        ),
        Trigger::Outcome(command) => format!("{name}:o{}:{step}", digest(&[b"o", command.as_bytes()])),
    }
}

/// A 128-bit FNV-1a digest of `parts` (each length-prefixed), in hex: stable across
/// releases and platforms, which command ids must be.
fn digest(parts: &[&[u8]]) -> String {
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u128::from(b);
            h = h.wrapping_mul(PRIME);
        }
    };
    for p in parts {
        feed(&(p.len() as u64).to_be_bytes());
        feed(p);
    }
    format!("{h:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_ids_are_deterministic_printable_and_distinct() {
        let e = command_id("flow", Trigger::Event("0190a0b0-c0d0-7000-8000-000000000001"), 0);
        assert_eq!(e, "flow:0190a0b0-c0d0-7000-8000-000000000001:0");
        assert_ne!(
            e,
            command_id("flow", Trigger::Event("0190a0b0-c0d0-7000-8000-000000000001"), 1)
        );
        let t = |key, due| {
            command_id(
                "flow",
                Trigger::Timer {
                    key,
                    id: "expiry",
                    due_ms: due,
                },
                0,
            )
        };
        assert_eq!(t("o-1", 5), t("o-1", 5));
        assert_ne!(t("o-1", 5), t("o-1", 6));
        assert_ne!(t("o-1", 5), t("o-2", 5));
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        let a = command_id(
            "f",
            Trigger::Timer {
                key: "ab",
                id: "c",
                due_ms: 0,
            },
            0,
        );
        let b = command_id(
            "f",
            Trigger::Timer {
                key: "a",
                id: "bc",
                due_ms: 0,
            },
            0,
        );
        assert_ne!(a, b);
        let long = "k".repeat(300);
        for id in [
            t(&long, 1),
            command_id("flow", Trigger::Outcome(&long), 3),
            command_id("flow", Trigger::Event(&long), 0),
        ] {
            assert!(id.len() <= 120 && id.bytes().all(|b| b.is_ascii_graphic()), "{id}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("order_flow-2"));
        for bad in ["", "a b", "a/b", "ä", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
