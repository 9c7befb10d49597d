//! Lookup tables (Kafka Streams' GlobalKTable): replicated views, which every instance
//! holds whole, read by name and key. A view's joins read them when its rows are read
//! (see [`eventfold_core::Join`]).
//!
//! Owns nothing: it resolves a table name to the view serving it now (through
//! `LookupTable`, which the view implements, so this module does not depend on it).
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
    /// Row `key` as stored (its JSON text).
    fn raw(&self, key: &str) -> Result<Option<Vec<u8>>>;
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

/// Column values read while one page of rows is filled (a page of one customer's orders
/// reads its customer once): (table, column, key) -> the column's JSON text, `null` when
/// the table has no such row or the row no such column.
#[derive(Default)]
pub(crate) struct JoinCache {
    values: std::collections::HashMap<(&'static str, &'static str, String), String>,
}

/// Why a row could not be joined.
pub(crate) enum JoinError {
    /// The stored row is not a JSON object.
    Row(String),
    /// A table could not be read.
    Table(crate::error::Error),
}

/// `row` (a stored row, a JSON object) with the fields of `joins` filled from `tables`
/// (`null` without tables). Only the key fields are decoded: the row's other fields are
/// copied as they are and the joined ones appended, unless the row holds a field of that
/// name already (then the whole row is decoded and the field replaced).
pub(crate) fn fill(
    row: &[u8],
    joins: &[eventfold_core::Join],
    tables: Option<&Tables>,
    cache: &mut JoinCache,
) -> std::result::Result<Vec<u8>, JoinError> {
    use serde_json::value::RawValue;
    let fields: std::collections::HashMap<&str, &RawValue> =
        serde_json::from_slice(row).map_err(|e| JoinError::Row(format!("row is not a JSON object: {e}")))?;
    let mut values = Vec::with_capacity(joins.len());
    for join in joins {
        let key: Option<String> = fields
            .get(join.key_field)
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok());
        let value = match (key, tables) {
            (Some(key), Some(tables)) => {
                let slot = (join.table, join.column, key);
                match cache.values.get(&slot) {
                    Some(v) => v.clone(),
                    None => {
                        let v = column(tables, join.table, &slot.2, join.column)?;
                        cache.values.insert(slot, v.clone());
                        v
                    }
                }
            }
            _ => "null".to_owned(),
        };
        values.push(value);
    }
    if joins.iter().any(|j| fields.contains_key(j.field)) {
        // Rare: the projection wrote a field a join fills; decode it all and replace.
        let mut doc: serde_json::Map<String, Value> =
            serde_json::from_slice(row).map_err(|e| JoinError::Row(format!("row is not a JSON object: {e}")))?;
        for (join, v) in joins.iter().zip(values) {
            doc.insert(join.field.to_owned(), serde_json::from_str(&v).unwrap_or(Value::Null));
        }
        return Ok(serde_json::to_vec(&doc).expect("a JSON map serializes"));
    }
    let text = std::str::from_utf8(row).map_err(|_| JoinError::Row("row is not UTF-8".into()))?;
    let body = text
        .trim_end()
        .strip_suffix('}')
        .ok_or_else(|| JoinError::Row("row is not a JSON object".into()))?;
    let mut out = String::with_capacity(row.len() + 64);
    out.push_str(body);
    let mut empty = fields.is_empty();
    for (join, v) in joins.iter().zip(values) {
        if !empty {
            out.push(',');
        }
        empty = false;
        out.push_str(&serde_json::to_string(join.field).expect("a string serializes"));
        out.push(':');
        out.push_str(&v);
    }
    out.push('}');
    Ok(out.into_bytes())
}

/// The JSON text of `column` of row `key` of table `table` (`null` when absent).
fn column(tables: &Tables, table: &str, key: &str, column: &str) -> std::result::Result<String, JoinError> {
    let Some(t) = tables.table(table) else {
        return Ok("null".to_owned());
    };
    let Some(row) = t.raw(key).map_err(JoinError::Table)? else {
        return Ok("null".to_owned());
    };
    let fields: std::collections::HashMap<&str, &serde_json::value::RawValue> = serde_json::from_slice(&row)
        .map_err(|e| JoinError::Row(format!("row `{key}` of `{table}` is not a JSON object: {e}")))?;
    Ok(fields
        .get(column)
        .map_or_else(|| "null".to_owned(), |v| v.get().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventfold_core::Join;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A table of customers that counts its reads.
    struct Customers(AtomicUsize);

    impl LookupTable for Customers {
        fn row(&self, _: &str) -> Result<Option<Value>> {
            unreachable!("joins read raw rows")
        }
        fn raw(&self, key: &str) -> Result<Option<Vec<u8>>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok((key == "c1").then(|| br#"{"name":"A","email":"a@x.test"}"#.to_vec()))
        }
        fn wait<'a>(&'a self, _: &'a Position, _: Duration) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
            Box::pin(async { Ok(()) })
        }
    }

    fn joined(row: &str, tables: Option<&Tables>, cache: &mut JoinCache) -> Value {
        let joins = [Join::lookup("customer_email", "customer_id", "customers", "email")];
        match fill(row.as_bytes(), &joins, tables, cache) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(_) => panic!("{row} does not join"),
        }
    }

    #[test]
    fn joins_append_the_column_or_null_and_read_each_key_once_per_page() {
        let table = Arc::new(Customers(AtomicUsize::new(0)));
        let tables = Tables::default();
        let t = table.clone();
        tables.resolve_with(move |name| (name == "customers").then(|| t.clone() as Arc<dyn LookupTable>));
        let mut cache = JoinCache::default();
        let known = joined(r#"{"customer_id":"c1","total":3} "#, Some(&tables), &mut cache);
        assert_eq!(
            known,
            serde_json::json!({"customer_id": "c1", "total": 3, "customer_email": "a@x.test"})
        );
        joined(r#"{"customer_id":"c1"}"#, Some(&tables), &mut cache);
        assert_eq!(table.0.load(Ordering::Relaxed), 1, "one read of c1 for the page");
        let unknown = joined(r#"{"customer_id":"c2"}"#, Some(&tables), &mut cache);
        assert_eq!(unknown["customer_email"], Value::Null);
        let no_key = joined(r#"{"total":1}"#, Some(&tables), &mut cache);
        assert_eq!(no_key, serde_json::json!({"total": 1, "customer_email": null}));
        assert_eq!(
            joined("{}", Some(&tables), &mut cache),
            serde_json::json!({"customer_email": null})
        );
        assert_eq!(
            joined(r#"{"customer_id":"c1"}"#, None, &mut cache)["customer_email"],
            Value::Null
        );
        // A field of the join's name in the row is replaced, not repeated.
        let stale = joined(
            r#"{"customer_id":"c1","customer_email":"old"}"#,
            Some(&tables),
            &mut cache,
        );
        assert_eq!(
            stale,
            serde_json::json!({"customer_id": "c1", "customer_email": "a@x.test"})
        );
        let joins = [Join::lookup("customer_email", "customer_id", "customers", "email")];
        assert!(
            fill(b"[1]", &joins, Some(&tables), &mut cache).is_err(),
            "not an object"
        );
    }
}
