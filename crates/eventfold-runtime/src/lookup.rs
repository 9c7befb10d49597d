//! Lookup tables (Kafka Streams' GlobalKTable): replicated views, which every instance
//! holds whole, read by name and key. A view's joins read them when its rows are read
//! (see [`eventfold_core::Join`]).
//!
//! Owns nothing: it resolves a table name to the view serving it now (through
//! [`LookupTable`], which the view implements, so this module does not depend on it).
//! Set once every view of the runtime exists (joins may name views registered after them).

use crate::error::Result;
use eventfold_core::Position;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What a join needs of a table.
pub(crate) trait LookupTable: Send + Sync {
    /// Row `key` as JSON.
    fn row(&self, key: &str) -> Result<Option<Value>>;
    /// Waits until the table has applied `min` (its own source's marks), at most `timeout`.
    fn wait<'a>(
        &'a self,
        min: &'a Position,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;
}

type Resolve = dyn Fn(&str) -> Option<Arc<dyn LookupTable>> + Send + Sync;

/// The runtime's lookup tables. Made before the processors start (their contexts read
/// it) and given its resolver once the views exist; until then every table is empty.
#[derive(Clone, Default)]
pub struct Tables {
    resolve: Arc<OnceLock<Box<Resolve>>>,
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables").finish_non_exhaustive()
    }
}

impl Tables {
    /// Resolves tables with `resolve` (table name -> the view serving it now), once.
    pub(crate) fn resolve_with(&self, resolve: impl Fn(&str) -> Option<Arc<dyn LookupTable>> + Send + Sync + 'static) {
        let _ = self.resolve.set(Box::new(resolve));
    }

    /// Table `name`.
    pub(crate) fn table(&self, name: &str) -> Option<Arc<dyn LookupTable>> {
        (self.resolve.get()?)(name)
    }

    /// Row `key` of table `name` as JSON; `None` when either is missing.
    pub fn row(&self, name: &str, key: &str) -> Result<Option<Value>> {
        match self.table(name) {
            Some(t) => t.row(key),
            None => Ok(None),
        }
    }
}

impl eventfold_core::Lookups for Tables {
    fn get(&self, table: &str, key: &str) -> Option<Value> {
        self.row(table, key).unwrap_or_else(|e| {
            // The caller is pure code without an error path: the row counts as absent, and
            // the failure is logged (the view itself reports a corrupt store).
            tracing::warn!(table, key, error = %e, "lookup table read failed");
            None
        })
    }
}
