//! How a view is stored: the names its rows, index entries, checkpoints and markers are
//! kept under, and reading a stored row back.

use crate::error::{Error, Result};
use eventfold_store::Store;
use serde_json::Value;

/// Keys per ingestion when a view's data is cleared ([`eventfold_store::Store::clear_view`]):
/// about 60 MiB of keys held at a time.
pub(super) const CLEAR_BATCH: usize = 1 << 20;

/// The name a view's rows, index entries and checkpoints are stored under: the view name
/// for version 1 (what views were stored under before versions existed), `<view>@v<n>`
/// for later versions, so two versions can live side by side.
pub fn storage_name(view: &str, version: u32) -> String {
    match version {
        1 => view.to_owned(),
        v => format!("{view}@v{v}"),
    }
}

/// The meta entry holding the version of `view` that answers queries.
pub fn serving_version_key(view: &str) -> String {
    format!("view_version/{view}")
}

/// The meta entry present while partition `partition` of the view stored as `storage`
/// catches up in bulk (or was interrupted doing so: its rows are then removed before it
/// starts again).
pub(super) fn bulk_marker_key(storage: &str, partition: u32) -> String {
    format!("view_bulk/{storage}/{partition}")
}

/// The meta entry present while a rebuild of the view stored as `storage` is under way
/// (or was interrupted): a view with this marker is not served (its partitions are
/// `failed`).
pub fn rebuild_marker_key(storage: &str) -> String {
    format!("rebuild/{storage}")
}

pub(super) fn corrupt(table: &'static str, key: String, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        table,
        key,
        reason: reason.into(),
    }
}

pub(super) fn load_row(store: &Store, view: &str, key: &str) -> Result<Option<Value>> {
    match store.get_view_row(view, key)? {
        Some(json) => parse_row(view, key, &json).map(Some),
        None => Ok(None),
    }
}

pub(super) fn parse_row(view: &str, key: &str, json: &[u8]) -> Result<Value> {
    serde_json::from_slice(json).map_err(|e| corrupt("view_row", format!("{view}/{key}"), e.to_string()))
}
