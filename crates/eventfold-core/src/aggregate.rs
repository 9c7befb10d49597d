//! The aggregate trait: pure command handling and event application.

use crate::lookup::Lookups;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A rejection of a command by the domain (HTTP 422). `code` is a stable machine-readable
/// identifier, `Display` the human sentence.
pub trait Reject: std::fmt::Display + Send + 'static {
    /// Stable error code, e.g. `order_not_placed`.
    fn code(&self) -> &'static str;
}

/// What a command handler may look at besides the state: never the wall clock or I/O.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a, C> {
    /// The id of the aggregate the command is addressed to.
    pub aggregate_id: &'a str,
    /// The aggregate's version before this command (0 = no events yet).
    pub version: u64,
    /// The command record's timestamp (milliseconds since the Unix epoch).
    pub timestamp_ms: i64,
    /// Static configuration of the aggregate type (e.g. limits).
    pub config: &'a C,
    /// The lookup tables (see [`Context::lookup`]).
    pub lookups: &'a dyn Lookups,
}

impl<C> Context<'_, C> {
    /// Row `key` of lookup table `table` (a replicated view every instance holds), as it
    /// is now; `None` when it has no such row. What `handle` decides from it belongs in
    /// the events it emits: replaying them never reads the table again.
    pub fn lookup(&self, table: &str, key: &str) -> Option<serde_json::Value> {
        self.lookups.get(table, key)
    }
}

/// An event-sourced aggregate. `handle` decides, `apply` folds; both are pure and
/// deterministic so that replaying the events always rebuilds the same state.
///
/// Commands and events are serde types; eventfold expects internally tagged enums
/// (`#[serde(tag = "type")]`) so that every JSON document names its type first.
pub trait Aggregate: Default + Clone + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The aggregate type name used in topics and URLs, e.g. `order`.
    const TYPE: &'static str;
    /// The commands this aggregate accepts.
    type Command: DeserializeOwned + Serialize + Send + 'static;
    /// The events it emits.
    type Event: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// Why it refuses a command.
    type Rejection: Reject;
    /// Static configuration handed to `handle` (use `()` when there is none).
    type Config: Clone + Default + Send + Sync + 'static;

    /// Decides which events a command produces, or rejects it.
    fn handle(
        &self,
        command: Self::Command,
        ctx: &Context<'_, Self::Config>,
    ) -> Result<Vec<Self::Event>, Self::Rejection>;

    /// Folds one event into the state. Must not fail: events are facts.
    fn apply(&mut self, event: &Self::Event);
}
