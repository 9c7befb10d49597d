//! [`Overlay`]: a view built in memory by a bulk fold (an offline rebuild, or a live
//! partition catching up in bulk), bounded by bytes, and written to the store by
//! ingestion when it is full and at the end.

use super::fold::{Committed, Pending, UniqueValue};
use super::service::ViewService;
use super::storage::{load_row, parse_row};
use crate::error::Result;
use eventfold_store::{Store, ViewWrite, encode_value};
use foldhash::HashMap;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

/// The view as the rebuild built it and has not written yet, bounded by bytes: rows
/// (recently changed ones parsed, the others as JSON with the encoded values of their
/// non-unique index fields), index entries, and unique-index owners. While nothing was
/// written (`whole`), a key it does not hold does not exist (the view was cleared),
/// deletes need no tombstone, and the entries of non-unique indexes are derived from the
/// rows when written. After a spill, missing rows and owners are read from the store and
/// every entry change is kept.
pub(super) struct Overlay {
    pub(super) store: Store,
    svc: Arc<ViewService>,
    /// In a cell: [`Committed::row_to_change`] takes parsed rows out.
    pub(super) rows: RefCell<HashMap<String, Slot>>,
    /// The keys each batch left parsed, oldest batch first: the least recently changed
    /// rows are demoted first. A key changed again later is skipped here (its slot
    /// carries the newer batch).
    touched: VecDeque<(u64, Vec<String>)>,
    /// Batches taken in so far.
    batch: u64,
    /// About how much memory the parsed rows hold, and the most they may.
    hot_bytes: Cell<usize>,
    max_hot_bytes: usize,
    /// Parsed rows taken in, and the memory of those measured ([`heap_bytes`] runs on
    /// one row in [`SAMPLE`]: walking every row was a visible cost of a rebuild); the others are
    /// assumed average.
    pub(super) hot_rows: u64,
    pub(super) sampled: (u64, usize),
    /// Parsed rows turned into JSON to stay within `max_hot_bytes`.
    pub(super) demoted: u64,
    /// As [`Pending::entries`].
    entries: HashMap<(usize, Vec<u8>, String), Option<String>>,
    owners: HashMap<UniqueValue, Option<String>>,
    pub(super) whole: bool,
    /// About how much memory the rows as JSON, the entries and the owners hold (past
    /// `max_bytes`, the caller spills).
    pub(super) bytes: usize,
    pub(super) max_bytes: usize,
}

/// A row of the overlay.
pub(super) enum Slot {
    /// Parsed, as the batch `batch` left it; `bytes` is about the memory it holds.
    Hot { doc: Value, batch: u64, bytes: usize },
    /// As JSON (`None`: deleted).
    Cold(Option<Row>),
}

impl Slot {
    pub(super) fn exists(&self) -> bool {
        matches!(self, Slot::Hot { .. } | Slot::Cold(Some(_)))
    }
}

/// A row's JSON and its non-unique index values (index position, encoded value).
pub(super) struct Row {
    json: Box<[u8]>,
    plain: Vec<(usize, Box<[u8]>)>,
}

/// Hash map and allocation overhead per entry, roughly.
const ENTRY: usize = 64;

/// One parsed row in this many is measured (see [`Overlay::sampled`]).
const SAMPLE: u64 = 64;

/// About the memory a row as JSON (`None`: deleted) holds in the overlay under a key of
/// `key_len` bytes.
fn cold_bytes(key_len: usize, row: &Option<Row>) -> usize {
    ENTRY
        + key_len
        + row.as_ref().map_or(0, |r| {
            r.json.len() + r.plain.iter().map(|(_, v)| ENTRY / 2 + v.len()).sum::<usize>()
        })
}

/// `doc` as stored: JSON, and (while the overlay is `whole`) its non-unique index values.
fn row_of(svc: &ViewService, whole: bool, key: &str, doc: &Value) -> Row {
    let mut plain = Vec::new();
    if whole {
        each_plain_value(svc, key, doc, |i, v| plain.push((i, v.into_boxed_slice())));
    }
    Row {
        json: serde_json::to_vec(doc)
            .expect("JSON values serialize")
            .into_boxed_slice(),
        plain,
    }
}

/// Calls `f` with each non-unique index of `doc` (position, encoded value); a value of
/// the wrong type is not indexed, as in [`Worker::change`](super::fold::Worker::change).
fn each_plain_value(svc: &ViewService, key: &str, doc: &Value, mut f: impl FnMut(usize, Vec<u8>)) {
    for (i, idx) in svc.indexes.iter().enumerate().filter(|(_, idx)| !idx.unique) {
        match idx.extract(doc) {
            Ok(Some(v)) => f(i, encode_value(&v)),
            Ok(None) => {}
            Err(e) => tracing::warn!(view = svc.storage.as_str(), key, error = %e, "row value not indexed"),
        }
    }
}

/// About how much heap memory `v` holds (allocator rounding and map nodes included
/// roughly): what a parsed row costs in the overlay.
fn heap_bytes(v: &Value) -> usize {
    /// A `serde_json::Value`.
    const VALUE: usize = 32;
    match v {
        Value::String(s) => s.capacity().next_multiple_of(16),
        Value::Array(items) => items.capacity() * VALUE + items.iter().map(heap_bytes).sum::<usize>(),
        // A B-tree node holds up to 11 fields (about 630 bytes); nodes are rarely full.
        Value::Object(fields) => {
            fields.len().div_ceil(8) * 640
                + fields
                    .iter()
                    .map(|(k, v)| k.capacity().next_multiple_of(16) + heap_bytes(v))
                    .sum::<usize>()
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

impl Overlay {
    /// An empty overlay for one of `threads` rebuild threads: its share of
    /// `rebuild_cache_bytes` for JSON rows, entries and owners (then the caller spills) and
    /// of `rebuild_hot_bytes` for parsed rows (then the least recently changed turn into
    /// JSON).
    pub(super) fn new(store: Store, svc: Arc<ViewService>, threads: usize) -> Self {
        let threads = threads.max(1);
        let max_bytes = svc.options.rebuild_cache_bytes / threads;
        let max_hot_bytes = svc.options.rebuild_hot_bytes / threads;
        Self {
            store,
            svc,
            rows: RefCell::new(HashMap::default()),
            touched: VecDeque::new(),
            batch: 0,
            hot_bytes: Cell::new(0),
            max_hot_bytes,
            hot_rows: 0,
            sampled: (0, 0),
            demoted: 0,
            entries: HashMap::default(),
            owners: HashMap::default(),
            whole: true,
            bytes: 0,
            max_bytes,
        }
    }

    /// Takes in the changes of a batch.
    pub(super) fn take(&mut self, pending: Pending) {
        self.batch += 1;
        let mut touched = Vec::new();
        let mut hot_bytes = self.hot_bytes.get();
        for (key, doc) in pending.rows {
            let slot = match doc {
                Some(doc) if self.max_hot_bytes > 0 => {
                    if self.hot_rows.is_multiple_of(SAMPLE) {
                        self.sampled.0 += 1;
                        self.sampled.1 += heap_bytes(&doc);
                    }
                    self.hot_rows += 1;
                    let bytes = ENTRY + key.len() + self.sampled.1 / self.sampled.0 as usize;
                    hot_bytes += bytes;
                    touched.push(key.clone());
                    Slot::Hot {
                        doc,
                        batch: self.batch,
                        bytes,
                    }
                }
                doc => {
                    let row = doc.map(|doc| row_of(&self.svc, self.whole, &key, &doc));
                    self.bytes += cold_bytes(key.len(), &row);
                    Slot::Cold(row)
                }
            };
            let key_len = key.len();
            match self.rows.get_mut().insert(key, slot) {
                Some(Slot::Hot { bytes, .. }) => hot_bytes -= bytes,
                Some(Slot::Cold(row)) => self.bytes -= cold_bytes(key_len, &row),
                None => {}
            }
        }
        self.hot_bytes.set(hot_bytes);
        if !touched.is_empty() {
            self.touched.push_back((self.batch, touched));
        }
        while self.hot_bytes.get() > self.max_hot_bytes {
            let Some((batch, keys)) = self.touched.pop_front() else {
                break;
            };
            self.demote(batch, keys);
        }
        let len = |k: &Option<String>| k.as_ref().map_or(0, String::len);
        for (entry, row) in pending.entries {
            let size = ENTRY + entry.1.len() + entry.2.len();
            self.bytes += size + len(&row);
            if let Some(old) = self.entries.insert(entry, row) {
                self.bytes -= size + len(&old);
            }
        }
        for (owner, key) in pending.owners {
            let size = ENTRY + owner.1.len();
            self.bytes += size + len(&key);
            if let Some(old) = self.owners.insert(owner, key) {
                self.bytes -= size + len(&old);
            }
        }
    }

    /// Turns the rows batch `batch` left parsed, and no later batch changed, into JSON.
    fn demote(&mut self, batch: u64, keys: Vec<String>) {
        let rows = self.rows.get_mut();
        for key in keys {
            let Some(slot) = rows.get_mut(&key) else {
                continue;
            };
            let Slot::Hot { doc, batch: b, bytes } = slot else {
                continue;
            };
            if *b != batch {
                continue;
            }
            let row = Some(row_of(&self.svc, self.whole, &key, doc));
            self.hot_bytes.set(self.hot_bytes.get() - *bytes);
            self.bytes += cold_bytes(key.len(), &row);
            self.demoted += 1;
            *slot = Slot::Cold(row);
        }
    }

    /// Everything held, to write; the overlay is left empty and no longer whole.
    pub(super) fn spill(&mut self) -> ViewWrite {
        let whole = self.whole;
        let rows = std::mem::take(self.rows.get_mut());
        // A row has at most one entry in each index.
        let mut write = ViewWrite::with_capacity(&self.svc.storage, rows.len(), rows.len() + self.entries.len());
        let mut json = Vec::new();
        for (key, slot) in rows {
            match slot {
                // Written straight from the parsed row: no `Row` in between.
                Slot::Hot { doc, .. } => {
                    json.clear();
                    serde_json::to_writer(&mut json, &doc).expect("JSON values serialize");
                    write.put_row(&key, &json);
                    if whole {
                        each_plain_value(&self.svc, &key, &doc, |i, value| {
                            write.put_entry(self.svc.indexes[i].name, &value, &key, false)
                        });
                    }
                }
                Slot::Cold(Some(Row { json, plain })) => {
                    for (i, value) in plain {
                        write.put_entry(self.svc.indexes[i].name, &value, &key, false);
                    }
                    write.put_row(&key, &json);
                }
                Slot::Cold(None) if whole => {}
                Slot::Cold(None) => write.delete_row(&key),
            }
        }
        for ((i, value, entry), row) in self.entries.drain() {
            let idx = &self.svc.indexes[i];
            match row {
                Some(key) => write.put_entry(idx.name, &value, &key, idx.unique),
                None if whole => {}
                None => write.delete_entry(idx.name, &value, &entry, idx.unique),
            }
        }
        self.owners.clear();
        self.touched.clear();
        self.bytes = 0;
        self.hot_bytes.set(0);
        self.whole = false;
        write
    }
}

impl Committed for Overlay {
    fn row(&self, key: &str) -> Result<Option<Value>> {
        match self.rows.borrow().get(key) {
            Some(Slot::Hot { doc, .. }) => Ok(Some(doc.clone())),
            Some(Slot::Cold(Some(row))) => parse_row(&self.svc.storage, key, &row.json).map(Some),
            Some(Slot::Cold(None)) => Ok(None),
            None if self.whole => Ok(None),
            None => load_row(&self.store, &self.svc.storage, key),
        }
    }

    fn row_to_change(&self, key: &str) -> Result<Option<Value>> {
        let mut rows = self.rows.borrow_mut();
        if let Some(Slot::Hot { .. }) = rows.get(key) {
            // Its new version comes back through `take` in this batch.
            let Some(Slot::Hot { doc, bytes, .. }) = rows.remove(key) else {
                unreachable!("matched above");
            };
            self.hot_bytes.set(self.hot_bytes.get() - bytes);
            return Ok(Some(doc));
        }
        drop(rows);
        self.row(key)
    }

    fn owner(&self, index: usize, value: &[u8]) -> Result<Option<String>> {
        match self.owners.get(&(index, value.to_vec())) {
            Some(o) => Ok(o.clone()),
            None if self.whole => Ok(None),
            None => Ok(self
                .store
                .get_view_unique(&self.svc.storage, self.svc.indexes[index].name, value)?),
        }
    }
}
