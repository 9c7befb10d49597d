//! Lookup tables (Kafka Streams' GlobalKTable): replicated views, which every instance
//! holds whole, read by name and key. A view's joins read them when its rows are read
//! (see [`eventfold_core::Join`]).
//!
//! Owns nothing: it resolves a table name to the serving version of that view. Set once
//! every view of the runtime exists (joins may name views registered after them).

use crate::view::ViewService;
use serde_json::Value;
use std::sync::Arc;

type Resolve = dyn Fn(&str) -> Option<Arc<ViewService>> + Send + Sync;

/// The runtime's lookup tables.
#[derive(Clone)]
pub struct Tables {
    resolve: Arc<Resolve>,
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables").finish_non_exhaustive()
    }
}

impl Tables {
    /// Tables resolved by `resolve` (view name -> the view serving now).
    pub(crate) fn new(resolve: impl Fn(&str) -> Option<Arc<ViewService>> + Send + Sync + 'static) -> Self {
        Self {
            resolve: Arc::new(resolve),
        }
    }

    /// The view serving table `name`.
    pub(crate) fn view(&self, name: &str) -> Option<Arc<ViewService>> {
        (self.resolve)(name)
    }

    /// Row `key` of table `name` as JSON; `None` when either is missing.
    pub fn row(&self, name: &str, key: &str) -> crate::error::Result<Option<Value>> {
        let Some(view) = self.view(name) else {
            return Ok(None);
        };
        Ok(match view.get(key)? {
            Some(raw) => serde_json::from_str(raw.get()).ok(),
            None => None,
        })
    }
}
