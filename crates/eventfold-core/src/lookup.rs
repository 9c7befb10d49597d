//! Lookup tables as pure code sees them: read-only rows of replicated views, by table and
//! key (Kafka Streams' GlobalKTable). An aggregate's `handle`, a process manager's `react`
//! and a projection's `apply` read them through their context's `lookup`.
//!
//! A lookup reads the table as it is when the code runs: `handle` records what it saw in
//! the events it emits, so replaying them never reads again; a projection that reads one
//! in `apply` gets the table of the moment, which a rebuild does not reproduce (a
//! [`Join`](crate::Join) reads at query time instead and always agrees).

use serde_json::Value;
use std::collections::BTreeMap;

/// Read access to lookup tables.
pub trait Lookups: Send + Sync + std::fmt::Debug {
    /// Row `key` of table `table` as JSON; `None` when either is missing.
    fn get(&self, table: &str, key: &str) -> Option<Value>;
}

/// No lookup tables.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLookups;

impl Lookups for NoLookups {
    fn get(&self, _: &str, _: &str) -> Option<Value> {
        None
    }
}

/// Lookup tables held in memory: what the test harnesses read.
#[derive(Debug, Clone, Default)]
pub struct LookupRows {
    tables: BTreeMap<String, BTreeMap<String, Value>>,
}

impl LookupRows {
    /// Puts row `key` of `table` (`None`: removes it).
    pub fn put(&mut self, table: &str, key: &str, row: Option<Value>) {
        let t = self.tables.entry(table.to_owned()).or_default();
        match row {
            Some(r) => t.insert(key.to_owned(), r),
            None => t.remove(key),
        };
    }
}

impl Lookups for LookupRows {
    fn get(&self, table: &str, key: &str) -> Option<Value> {
        self.tables.get(table).and_then(|t| t.get(key)).cloned()
    }
}
