//! A given/when/then harness for aggregates, part of the public API so users test their
//! domain rules without any runtime:
//!
//! ```
//! use eventfold_core::AggregateTest;
//! // A counter that refuses to go above 100 (see its code in `testing`).
//! use eventfold_core::testing::{Counter, CounterCommand, CounterEvent};
//!
//! AggregateTest::<Counter>::new()
//!     .given([CounterEvent::Added { n: 60 }])
//!     .when(CounterCommand::Add { n: 40 })
//!     .then([CounterEvent::Added { n: 40 }])
//!     .then_state(|c| assert_eq!(c.total, 100));
//!
//! AggregateTest::<Counter>::new()
//!     .given([CounterEvent::Added { n: 60 }])
//!     .when(CounterCommand::Add { n: 41 })
//!     .then_rejected("limit_exceeded");
//! ```

use crate::aggregate::{Aggregate, Context, Reject};
use crate::lookup::LookupRows;
use serde::Serialize;

/// Test driver for one aggregate instance.
pub struct AggregateTest<A: Aggregate> {
    id: String,
    state: A,
    version: u64,
    config: A::Config,
    timestamp_ms: i64,
    lookups: LookupRows,
}

impl<A: Aggregate> Default for AggregateTest<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Aggregate> AggregateTest<A> {
    /// A fresh aggregate with id `test-1`, default config and timestamp 0.
    pub fn new() -> Self {
        Self {
            id: "test-1".into(),
            state: A::default(),
            version: 0,
            config: A::Config::default(),
            timestamp_ms: 0,
            lookups: LookupRows::default(),
        }
    }

    /// Puts row `key` of lookup table `table` (`None`: removes it), for `handle`'s
    /// [`Context::lookup`].
    pub fn with_lookup(mut self, table: &str, key: &str, row: Option<serde_json::Value>) -> Self {
        self.lookups.put(table, key, row);
        self
    }

    /// Uses `config` for `handle`.
    pub fn with_config(mut self, config: A::Config) -> Self {
        self.config = config;
        self
    }

    /// Uses `timestamp_ms` as the command timestamp.
    pub fn at(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = timestamp_ms;
        self
    }

    /// Applies past events.
    pub fn given(mut self, events: impl IntoIterator<Item = A::Event>) -> Self {
        for e in events {
            self.state.apply(&e);
            self.version += 1;
        }
        self
    }

    /// Runs `handle` and, on success, applies the events.
    pub fn when(self, command: A::Command) -> Then<A> {
        let ctx = Context {
            aggregate_id: &self.id,
            version: self.version,
            timestamp_ms: self.timestamp_ms,
            config: &self.config,
            lookups: &self.lookups,
        };
        let result = self.state.handle(command, &ctx);
        let mut state = self.state;
        if let Ok(events) = &result {
            for e in events {
                state.apply(e);
            }
        }
        Then { result, state }
    }
}

/// The result of [`AggregateTest::when`], to assert on.
pub struct Then<A: Aggregate> {
    result: Result<Vec<A::Event>, A::Rejection>,
    state: A,
}

fn json<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("serializable")
}

/// `v` as one line of JSON: what a failed harness assertion prints (Debug of a JSON
/// value would print `Object {..}`).
pub(crate) fn json_text<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("<not serializable: {e}>"))
}

/// Panics with both sides as JSON unless `got == expected`.
#[track_caller]
pub(crate) fn assert_json_eq<T: Serialize + PartialEq + ?Sized>(got: &T, expected: &T, what: std::fmt::Arguments<'_>) {
    if got != expected {
        panic!(
            "{what}\n     got: {}\nexpected: {}",
            json_text(got),
            json_text(expected)
        );
    }
}

impl<A: Aggregate> Then<A> {
    /// Asserts the command was accepted with exactly `expected` events (compared as JSON).
    #[track_caller]
    pub fn then(self, expected: impl IntoIterator<Item = A::Event>) -> Self {
        let expected: Vec<A::Event> = expected.into_iter().collect();
        match &self.result {
            // Compared as JSON values, printed as the events serialize (fields in order).
            Ok(events) if events.iter().map(json).ne(expected.iter().map(json)) => panic!(
                "events differ\n     got: {}\nexpected: {}",
                json_text(events),
                json_text(&expected)
            ),
            Ok(_) => {}
            Err(r) => panic!(
                "expected events {}, got rejection {}: {r}",
                json_text(&expected),
                r.code()
            ),
        }
        self
    }

    /// Asserts the command was rejected with `code`.
    #[track_caller]
    pub fn then_rejected(self, code: &str) -> Self {
        match &self.result {
            Ok(events) => panic!("expected rejection {code}, got events {}", json_text(events)),
            Err(r) => assert_eq!(r.code(), code, "rejection code differs (message: {r})"),
        }
        self
    }

    /// Runs `check` on the state after the events were applied.
    #[track_caller]
    pub fn then_state(self, check: impl FnOnce(&A)) -> Self {
        check(&self.state);
        self
    }

    /// The raw result, for custom assertions.
    pub fn result(&self) -> &Result<Vec<A::Event>, A::Rejection> {
        &self.result
    }
}
