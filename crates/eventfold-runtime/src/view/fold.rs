//! Applying source events to a view: the projection runs over the rows as this batch
//! left them ([`Rows`]: pending changes over what is committed), and each row change
//! moves its index entries and unique-index owners ([`Pending`]). The live workers, the
//! bulk catch-up and the offline rebuild all fold through [`Worker::fold`].

use super::events::{Decoded, SourceEvent};
use super::service::ViewService;
use crate::error::Result;
use eventfold_core::projection::{Event, RowReader};
use eventfold_core::{Aggregate, Projection, Scope, ViewChanges};
use eventfold_log::Log;
use eventfold_store::encode_value;
use foldhash::HashMap;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What a batch finds committed before it: rows and unique-index owners.
pub(super) trait Committed {
    /// Row `key` of the view.
    fn row(&self, key: &str) -> Result<Option<Value>>;
    /// Row `key` of the view, about to change: its new version is passed to
    /// [`Worker::change`] in this batch (an overlay may hand over its copy).
    fn row_to_change(&self, key: &str) -> Result<Option<Value>> {
        self.row(key)
    }
    /// The row holding `value` in unique index `index` (by position).
    fn owner(&self, index: usize, value: &[u8]) -> Result<Option<String>>;
}

/// Rows as the projection reads them: this batch's pending changes over what is
/// committed. Rows read from `base` are kept in `loaded`, so the change that follows a
/// read (an `update`) does not read and parse the row a second time.
struct Rows<'a> {
    pending: RefCell<&'a mut HashMap<String, Option<Value>>>,
    loaded: &'a RefCell<HashMap<String, Option<Value>>>,
    /// Whether [`Worker::change`] needs the committed row to move index entries; without
    /// it, a row read from `base` is handed out without keeping a copy in `loaded`, and a
    /// row about to change is taken, not cloned (see [`RowReader::row_to_change`]).
    keep_loaded: bool,
    base: &'a dyn Committed,
    error: RefCell<Option<String>>,
}

impl Rows<'_> {
    fn read(&self, key: &str, to_change: bool) -> Option<Value> {
        let take = to_change && !self.keep_loaded;
        {
            let mut pending = self.pending.borrow_mut();
            match pending.get(key) {
                // Its new version replaces it in `pending` before the batch goes on (a
                // deletion stays: nothing replaces it).
                Some(Some(_)) if take => return pending.remove(key).flatten(),
                Some(v) => return v.clone(),
                None => {}
            }
        }
        if let Some(v) = self.loaded.borrow().get(key) {
            return v.clone();
        }
        let read = if take {
            self.base.row_to_change(key)
        } else {
            self.base.row(key)
        };
        match read {
            Ok(v) if self.keep_loaded => {
                self.loaded.borrow_mut().insert(key.to_owned(), v.clone());
                v
            }
            Ok(v) => v,
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e.to_string());
                None
            }
        }
    }
}

impl RowReader for Rows<'_> {
    fn row(&self, key: &str) -> Option<Value> {
        self.read(key, false)
    }

    fn row_to_change(&self, key: &str) -> Option<Value> {
        self.read(key, true)
    }
}

/// A value of a unique index: (index position, encoded value).
pub(super) type UniqueValue = (usize, Vec<u8>);

/// Changes of one batch, each key once (a store batch must not touch a key twice).
#[derive(Default)]
pub(super) struct Pending {
    pub(super) rows: HashMap<String, Option<Value>>,
    /// Committed rows read during this batch and not changed yet (see [`Rows`]).
    pub(super) loaded: RefCell<HashMap<String, Option<Value>>>,
    /// (index position, encoded value, row key or "" in a unique index) -> the row key
    /// to put, or `None` to delete.
    pub(super) entries: BTreeMap<(usize, Vec<u8>, String), Option<String>>,
    /// A unique index value -> the row holding it.
    pub(super) owners: HashMap<UniqueValue, Option<String>>,
    /// Leave the entries of non-unique indexes out of `entries`: the caller derives them
    /// from the final rows (a rebuild into an empty view).
    pub(super) derive_plain_entries: bool,
}

/// The worker of one (view, source partition): it folds events here; live, it follows the
/// source ([`super::live`]); a rebuild runs one per partition, folding only.
pub(super) struct Worker<P: Projection> {
    pub(super) projection: Arc<P>,
    pub(super) svc: Arc<ViewService>,
    pub(super) log: Arc<dyn Log>,
    pub(super) partition: u32,
    /// The source's partition count (to route notifications by aggregate id).
    pub(super) partitions: u32,
    pub(super) next: u64,
}

impl<P: Projection> Worker<P> {
    /// Applies `events` over `pending` (changes not committed yet) over `base` (what is
    /// committed).
    pub(super) fn fold(
        &self,
        pending: &mut Pending,
        topic: &str,
        events: &[Decoded<SourceEvent<P>>],
        base: &dyn Committed,
    ) -> Result<(), String> {
        let needs_old = self.needs_old(pending);
        for Decoded {
            offset,
            aggregate_id,
            version,
            event_type,
            timestamp_ms,
            payload,
        } in events
        {
            let at = || format!("{topic}/{}@{offset}", self.partition);
            let lookups: &dyn eventfold_core::Lookups = match self.svc.tables.get() {
                Some(t) => t,
                None => &eventfold_core::NoLookups,
            };
            let event = Event {
                aggregate_type: <P::Source as Aggregate>::TYPE,
                aggregate_id,
                version: *version,
                event_type,
                timestamp_ms: *timestamp_ms,
                payload,
                lookups,
            };
            let rows = Rows {
                pending: RefCell::new(&mut pending.rows),
                loaded: &pending.loaded,
                keep_loaded: needs_old,
                base,
                error: RefCell::new(None),
            };
            let mut changes = ViewChanges::new(&rows);
            self.projection.apply(&event, &mut changes);
            let (changes, errors) = changes.into_parts();
            if let Some(e) = rows.error.into_inner() {
                return Err(format!("while applying {}: {e}", at()));
            }
            if let Some(e) = errors.first() {
                return Err(format!("projection failed on {}: {e}", at()));
            }
            for (key, doc) in changes {
                if self.svc.scope == Scope::Partitioned && self.svc.partition_of(&key) != self.partition {
                    return Err(format!(
                        "view `{}` is partitioned, but applying {} writes row `{key}`, which belongs to partition {}: rows of a partitioned view must be keyed like their source aggregate (e.g. by its id); make the view Scope::Replicated to key rows otherwise",
                        P::VIEW,
                        at(),
                        self.svc.partition_of(&key)
                    ));
                }
                self.change(pending, base, key, doc).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Whether a change needs the row's previous document: only to move index entries
    /// (all of them, or only those of unique indexes when the caller derives the others
    /// from the final rows).
    fn needs_old(&self, pending: &Pending) -> bool {
        self.svc
            .indexes
            .iter()
            .any(|idx| idx.unique || !pending.derive_plain_entries)
    }

    /// Records one row change and the index entries it moves.
    fn change(&self, pending: &mut Pending, base: &dyn Committed, key: String, doc: Option<Value>) -> Result<()> {
        if !self.needs_old(pending) {
            let loaded = pending.loaded.get_mut();
            if !loaded.is_empty() {
                loaded.remove(&key);
            }
            pending.rows.insert(key, doc);
            return Ok(());
        }
        // Taken out (put back below with the new document): no copy of the old row.
        let old = match pending.rows.remove(&key) {
            Some(v) => v,
            None => match pending.loaded.get_mut().remove(&key) {
                Some(v) => v,
                None => base.row(&key)?,
            },
        };
        let key_str = key.as_str();
        for (i, idx) in self.svc.indexes.iter().enumerate() {
            if pending.derive_plain_entries && !idx.unique {
                continue;
            }
            // A value of the wrong type is not indexed (the same rule for old and new rows,
            // so what was indexed is exactly what is removed).
            let value = |d: &Option<Value>, warn: bool| -> Option<Vec<u8>> {
                match d.as_ref().map(|d| idx.extract(d)) {
                    Some(Ok(v)) => v.map(|v| encode_value(&v)),
                    Some(Err(e)) => {
                        if warn {
                            tracing::warn!(view = P::VIEW, key = key_str, error = %e, "row value not indexed");
                        }
                        None
                    }
                    None => None,
                }
            };
            let (was, now) = (value(&old, false), value(&doc, true));
            if was == now {
                continue;
            }
            let entry = |v: &[u8]| (i, v.to_vec(), if idx.unique { String::new() } else { key.clone() });
            if let Some(v) = was {
                if idx.unique {
                    if owner(pending, base, i, &v)?.as_deref() == Some(key_str) {
                        pending.entries.insert(entry(&v), None);
                        pending.owners.insert((i, v), None);
                    }
                } else {
                    pending.entries.insert(entry(&v), None);
                }
            }
            if let Some(v) = now {
                if idx.unique {
                    match owner(pending, base, i, &v)? {
                        Some(other) if other != key => {
                            self.svc.unique_conflicts[i].fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                view = P::VIEW,
                                index = idx.name,
                                key = key_str,
                                holder = %other,
                                "unique index value already held by another row; entry not overwritten"
                            );
                            continue;
                        }
                        _ => {}
                    }
                    pending.owners.insert((i, v.clone()), Some(key.clone()));
                }
                pending.entries.insert(entry(&v), Some(key.clone()));
            }
        }
        pending.rows.insert(key, doc);
        Ok(())
    }
}

/// The row holding `value` in unique index `i`, counting this batch's changes.
fn owner(pending: &Pending, base: &dyn Committed, i: usize, value: &[u8]) -> Result<Option<String>> {
    match pending.owners.get(&(i, value.to_vec())) {
        Some(o) => Ok(o.clone()),
        None => base.owner(i, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Committed rows from a map.
    struct Base(HashMap<String, Value>);

    impl Committed for Base {
        fn row(&self, key: &str) -> Result<Option<Value>> {
            Ok(self.0.get(key).cloned())
        }

        fn owner(&self, _: usize, _: &[u8]) -> Result<Option<String>> {
            Ok(None)
        }
    }

    fn rows<'a>(
        pending: &'a mut HashMap<String, Option<Value>>,
        loaded: &'a RefCell<HashMap<String, Option<Value>>>,
        keep_loaded: bool,
        base: &'a Base,
    ) -> Rows<'a> {
        Rows {
            pending: RefCell::new(pending),
            loaded,
            keep_loaded,
            base,
            error: RefCell::new(None),
        }
    }

    fn bump(row: &mut Value) {
        row["n"] = json!(row["n"].as_u64().unwrap_or(0) + 1);
    }

    #[test]
    fn an_update_takes_a_pending_row_and_leaves_a_pending_deletion() {
        let base = Base(HashMap::from_iter([("gone".to_owned(), json!({"n": 7}))]));
        let mut pending = HashMap::from_iter([("a".to_owned(), Some(json!({"n": 1}))), ("gone".to_owned(), None)]);
        let loaded = RefCell::new(HashMap::default());
        let r = rows(&mut pending, &loaded, false, &base);
        let mut changes = ViewChanges::new(&r);
        changes.update("a", bump);
        changes.update("gone", bump);
        let (changes, errors) = changes.into_parts();
        drop(r);
        assert!(errors.is_empty());
        assert_eq!(
            changes,
            vec![("a".to_owned(), Some(json!({"n": 2})))],
            "the deleted row stays deleted"
        );
        assert!(!pending.contains_key("a"), "taken: its new version replaces it");
        assert_eq!(pending.get("gone"), Some(&None), "a deletion is not taken away");
    }

    #[test]
    fn with_old_rows_needed_an_update_copies_and_keeps_what_it_read() {
        let base = Base(HashMap::from_iter([("b".to_owned(), json!({"n": 3}))]));
        let mut pending = HashMap::from_iter([("a".to_owned(), Some(json!({"n": 1})))]);
        let loaded = RefCell::new(HashMap::default());
        let r = rows(&mut pending, &loaded, true, &base);
        let mut changes = ViewChanges::new(&r);
        changes.update("a", bump);
        changes.update("b", bump);
        changes.update("b", bump);
        let (changes, _) = changes.into_parts();
        drop(r);
        assert_eq!(
            changes,
            vec![
                ("a".to_owned(), Some(json!({"n": 2}))),
                ("b".to_owned(), Some(json!({"n": 4}))),
                ("b".to_owned(), Some(json!({"n": 5}))),
            ],
            "a second update of the same event sees the first"
        );
        assert_eq!(
            pending.get("a"),
            Some(&Some(json!({"n": 1}))),
            "the old row stays for the index entries"
        );
        assert_eq!(
            loaded.borrow().get("b"),
            Some(&Some(json!({"n": 3}))),
            "the committed row is kept"
        );
    }
}
