//! View tables: rows, secondary index entries and their order-preserving value encoding.
//!
//! Row: `view 0 key` -> framed JSON. Index entry of a unique index: `view 0 index 0
//! enc(value)` -> framed row key; of another index: `view 0 index 0 enc(value) key` ->
//! `crc32 | 3`, the CRC covering the format byte 3 and the row key the entry's key ends
//! with (5 bytes instead of a copy of the row key; entries of older stores, framed row keys,
//! are still read). `enc` is prefix-free and preserves order, so equality is a prefix scan
//! and ranges are key ranges:
//!
//! - numbers: tag `0x20`, the value as an IEEE double made sortable (sign flipped; all bits
//!   flipped for negatives), then the exact integer as a sortable `i128` (zero for
//!   non-integral floats), so integers beyond 2^53 still order and compare exactly;
//! - strings: tag `0x30`, the UTF-8 bytes with `0x00` escaped as `0x00 0xFF`, then the
//!   terminator `0x00 0x01`, which sorts before any continuation (so `"a" < "a\0" < "ab"`)
//!   and makes encodings prefix-free (no value's encoding starts another's).
//!
//! The escaping works byte by byte, so the encoding of a string `s + t` starts with
//! [`encode_prefix`]`(s)` (the tag and escaped bytes of `s`, without the terminator), and
//! only such strings' encodings do: a string prefix query is a key range too.

use crate::codec::{frame_crc, framed, slice_of, unframe};
use crate::store::{Batch, KeyOp, Store, Table, concat, corrupt, ingest_ordered, key2, sort_ops};
use crate::{Error, Result};
use eventfold_core::IndexValue;
use fjall::Readable;
use fjall::Slice;
use std::ops::Bound;

const TAG_NUMBER: u8 = 0x20;
const TAG_STRING: u8 = 0x30;
/// Bytes of an encoded number: tag, sortable double, sortable `i128`.
const NUMBER_LEN: usize = 25;

/// Frame format of a plain index entry's value: no payload, the CRC covering this byte and
/// the row key at the end of the entry's key.
const FORMAT_ROW_KEY_IN_KEY: u8 = 3;

/// The value of a plain index entry for `row_key` (5 bytes: held inline, no allocation).
fn row_key_check(row_key: &[u8]) -> Slice {
    slice_of(&[
        &frame_crc(FORMAT_ROW_KEY_IN_KEY, row_key).to_le_bytes(),
        &[FORMAT_ROW_KEY_IN_KEY],
    ])
}

/// Bytes of the encoded value `v` starts with, if it starts with a whole one.
fn encoded_len(v: &[u8]) -> Option<usize> {
    match *v.first()? {
        TAG_NUMBER => (v.len() >= NUMBER_LEN).then_some(NUMBER_LEN),
        TAG_STRING => {
            let mut at = 1;
            loop {
                match v.get(at..at + 2)? {
                    [0x00, 0x01] => return Some(at + 2),
                    [0x00, 0xFF] => at += 2,
                    [0x00, _] => return None,
                    _ => at += 1,
                }
            }
        }
        _ => None,
    }
}

/// The row key a plain index entry's key `view 0 index 0 enc(value) key` ends with.
fn row_key_of_entry(k: &[u8]) -> Option<&[u8]> {
    let view_end = k.iter().position(|&b| b == 0)?;
    let index_end = view_end + 1 + k[view_end + 1..].iter().position(|&b| b == 0)?;
    let value = &k[index_end + 1..];
    Some(&value[encoded_len(value)?..])
}

/// Encodes an index value so that byte order equals value order (see the module docs).
pub fn encode_value(v: &IndexValue) -> Vec<u8> {
    match v {
        IndexValue::Int(i) => number(*i as f64, *i),
        IndexValue::Float(f) => number(*f, 0),
        IndexValue::String(s) => {
            let mut out = encode_prefix(s);
            out.extend_from_slice(&[0x00, 0x01]);
            out
        }
    }
}

/// Encodes a string prefix: the encoding of every string value that starts with `prefix`
/// (and of no other value) starts with these bytes (see the module docs).
pub fn encode_prefix(prefix: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 3);
    out.push(TAG_STRING);
    for &b in prefix.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out
}

fn number(f: f64, exact: i128) -> Vec<u8> {
    let f = if f == 0.0 { 0.0 } else { f }; // -0.0 == 0.0
    let bits = f.to_bits();
    let sortable = if bits >> 63 == 1 { !bits } else { bits ^ (1 << 63) };
    let mut out = Vec::with_capacity(NUMBER_LEN);
    out.push(TAG_NUMBER);
    out.extend_from_slice(&sortable.to_be_bytes());
    out.extend_from_slice(&((exact as u128) ^ (1 << 127)).to_be_bytes());
    out
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xFF; prefix.len() + 1] // all 0xFF: nothing sorts after in practice
}

fn check_name(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 256 || s.as_bytes().contains(&0) {
        return Err(Error::InvalidKey(format!(
            "{what} {s:?} must be 1..=256 bytes without NUL"
        )));
    }
    Ok(())
}

fn row_key(view: &str, key: &str) -> Slice {
    slice_of(&[view.as_bytes(), &[0], key.as_bytes()])
}

fn index_prefix(view: &str, index: &str) -> Vec<u8> {
    concat(&[view.as_bytes(), &[0], index.as_bytes(), &[0]])
}

fn entry_key(view: &str, index: &str, value: &[u8], key: &str, unique: bool) -> Slice {
    let key = if unique { &[][..] } else { key.as_bytes() };
    slice_of(&[view.as_bytes(), &[0], index.as_bytes(), &[0], value, key])
}

/// The value of an index entry pointing at row `key`.
fn entry_value(key: &str, unique: bool) -> Slice {
    if unique {
        framed(key.as_bytes())
    } else {
        row_key_check(key.as_bytes())
    }
}

/// A stored entry as [`Store::dump_view`] lists it: table name, raw key, raw value.
pub type RawEntry = (&'static str, Vec<u8>, Vec<u8>);

/// The name of the meta entry holding a view's next source offset.
pub fn view_checkpoint_key(view: &str, topic: &str, partition: u32) -> String {
    format!("view/{view}/{topic}/{partition}")
}

impl Batch {
    /// Sets row `key` of `view` to the JSON document `json`.
    pub fn put_view_row(&mut self, view: &str, key: &str, json: &[u8]) {
        self.put(Table::ViewRow, row_key(view, key), framed(json));
    }

    /// Deletes row `key` of `view`.
    pub fn delete_view_row(&mut self, view: &str, key: &str) {
        self.delete(Table::ViewRow, row_key(view, key));
    }

    /// Adds the entry `value` (from [`encode_value`]) -> `key` to `index` of `view`.
    pub fn put_view_entry(&mut self, view: &str, index: &str, value: &[u8], key: &str, unique: bool) {
        self.put(
            Table::ViewIndex,
            entry_key(view, index, value, key, unique),
            entry_value(key, unique),
        );
    }

    /// Removes the entry `value` -> `key` from `index` of `view`.
    pub fn delete_view_entry(&mut self, view: &str, index: &str, value: &[u8], key: &str, unique: bool) {
        self.delete(Table::ViewIndex, entry_key(view, index, value, key, unique));
    }
}

/// Rows and index entries of one view for [`Store::ingest_view`], keyed and framed as
/// they are added (like a [`Batch`]). Entries are kept by index: each index's entries
/// are a key range of their own, sorted on their own (in parallel, and each sort is
/// smaller than one over all of them).
#[derive(Debug)]
pub struct ViewWrite {
    view: String,
    rows: Vec<KeyOp>,
    /// (index name, its entries), in the order the indexes were first written.
    entries: Vec<(String, Vec<KeyOp>)>,
    /// Room reserved for each index's entries.
    per_index: usize,
}

impl ViewWrite {
    /// Nothing yet for `view`, with room for `rows` rows and `per_index` entries of each
    /// index.
    pub fn with_capacity(view: &str, rows: usize, per_index: usize) -> Self {
        Self {
            view: view.to_owned(),
            rows: Vec::with_capacity(rows),
            entries: Vec::new(),
            per_index,
        }
    }

    /// Moves the writes of `other` (for the same view) into this one.
    pub fn append(&mut self, other: ViewWrite) {
        assert_eq!(self.view, other.view, "writes of one view");
        if self.rows.is_empty() {
            self.rows = other.rows;
        } else {
            self.rows.extend(other.rows);
        }
        for (index, ops) in other.entries {
            let mine = self.index(&index);
            if mine.is_empty() {
                *mine = ops;
            } else {
                mine.extend(ops);
            }
        }
    }

    /// The entries of `index`.
    fn index(&mut self, index: &str) -> &mut Vec<KeyOp> {
        let at = match self.entries.iter().position(|(name, _)| name == index) {
            Some(at) => at,
            None => {
                self.entries
                    .push((index.to_owned(), Vec::with_capacity(self.per_index)));
                self.entries.len() - 1
            }
        };
        &mut self.entries[at].1
    }

    /// Sets row `key` to the JSON document `json`.
    pub fn put_row(&mut self, key: &str, json: &[u8]) {
        self.rows.push((row_key(&self.view, key), Some(framed(json))));
    }

    /// Deletes row `key`.
    pub fn delete_row(&mut self, key: &str) {
        self.rows.push((row_key(&self.view, key), None));
    }

    /// Adds the entry `value` -> `key` to `index` (as [`Batch::put_view_entry`]).
    pub fn put_entry(&mut self, index: &str, value: &[u8], key: &str, unique: bool) {
        let k = entry_key(&self.view, index, value, key, unique);
        self.index(index).push((k, Some(entry_value(key, unique))));
    }

    /// Removes the entry `value` -> `key` from `index`.
    pub fn delete_entry(&mut self, index: &str, value: &[u8], key: &str, unique: bool) {
        let k = entry_key(&self.view, index, value, key, unique);
        self.index(index).push((k, None));
    }
}

/// Sorts `rows` and each index's entries (see [`sort_unique`]) on up to as many threads
/// as the machine has cores, the largest first; returns the entries of all indexes in
/// key order.
fn sort_view(view: &str, rows: &mut [KeyOp], entries: Vec<(String, Vec<KeyOp>)>) -> Result<Vec<KeyOp>> {
    let mut groups: Vec<(Vec<u8>, Vec<KeyOp>)> = entries
        .into_iter()
        .map(|(index, ops)| (index_prefix(view, &index), ops))
        .collect();
    // Each index's entries are one key range, starting with its prefix.
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let mut jobs: Vec<&mut [KeyOp]> = std::iter::once(rows)
        .chain(groups.iter_mut().map(|(_, ops)| &mut ops[..]))
        .filter(|ops| ops.len() > 1)
        .collect();
    jobs.sort_by_key(|ops| ops.len()); // popped from the end: the largest first
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let jobs = std::sync::Mutex::new(jobs);
    std::thread::scope(|scope| {
        let sorters: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let Some(job) = jobs.lock().expect("not poisoned").pop() else {
                            return Ok(());
                        };
                        sort_unique(job)?;
                    }
                })
            })
            .collect();
        sorters
            .into_iter()
            .try_for_each(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    let mut all = Vec::with_capacity(groups.iter().map(|(_, ops)| ops.len()).sum());
    for (_, ops) in groups {
        all.extend(ops);
    }
    Ok(all)
}

impl Store {
    /// Writes the rows and entries of `write` by ingestion (see [`Store::ingest`]: durable,
    /// not atomic, each key at most once). With `replace`, `write` is the view's whole
    /// new content: every row and entry of the view stored before and not in `write` is
    /// deleted: the table files holding only this view's keys are dropped whole, and the
    /// old keys left elsewhere (memtables, files shared with other views) are merged in
    /// as tombstones in the same ingestion. Returns about how many keys of the view were
    /// stored before (0 without `replace`; counted from the dropped files' metadata, so
    /// overwritten versions and tombstones in them count too).
    pub fn ingest_view(&self, write: ViewWrite, replace: bool) -> Result<u64> {
        check_name("view", &write.view)?;
        let ViewWrite {
            view,
            mut rows,
            entries,
            ..
        } = write;
        let prefix = key2(view.as_bytes(), b"");
        let end = prefix_end(&prefix);
        let mut entries = sort_view(&view, &mut rows, entries)?;
        // The old view's table files go as a whole (a metadata change); only the keys left
        // in memtables and in files shared with other views are read and deleted below.
        let mut dropped = 0;
        if replace {
            for table in [Table::ViewRow, Table::ViewIndex] {
                dropped += self.table(table).drop_range(prefix.as_slice()..end.as_slice())? as u64;
            }
        }
        // Entries, the most keys, are written as two key ranges at once.
        let upper = entries.split_off(entries.len() / 2);
        let mid = upper.first().map_or_else(|| end.clone(), |(k, _)| k.to_vec());
        let parts = [
            (Table::ViewRow, prefix.clone(), end.clone(), rows),
            (Table::ViewIndex, prefix, mid.clone(), entries),
            (Table::ViewIndex, mid, end, upper),
        ];
        let snapshot = replace.then(|| self.snapshot());
        std::thread::scope(|scope| {
            let tasks: Vec<_> = parts
                .into_iter()
                .map(|(table, from, to, ops)| {
                    let snapshot = &snapshot;
                    scope.spawn(move || -> Result<u64> {
                        let keyspace = self.table(table);
                        let Some(snapshot) = snapshot else {
                            ingest_ordered(keyspace, ops.into_iter().map(Ok))?;
                            return Ok(0);
                        };
                        let mut old = snapshot.range(keyspace, from..to).map(|kv| kv.key());
                        let mut stored = 0;
                        let merged = MergeOld {
                            new: ops.into_iter().peekable(),
                            old: std::iter::from_fn(|| {
                                let k = old.next()?;
                                stored += 1;
                                Some(k.map_err(Error::from))
                            })
                            .peekable(),
                        };
                        ingest_ordered(keyspace, merged)?;
                        Ok(stored)
                    })
                })
                .collect();
            let mut stored = dropped;
            for task in tasks {
                stored += task.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            }
            Ok(stored)
        })
    }
}

/// Sorts `ops` by key; a key written twice is an error.
fn sort_unique(ops: &mut [KeyOp]) -> Result<()> {
    match sort_ops(ops) {
        Some(at) => Err(Error::InvalidKey(format!("key {:?} written twice", ops[at].0))),
        None => Ok(()),
    }
}

/// New writes (sorted) merged with old keys (sorted): every new write, and a tombstone
/// for each old key without one.
struct MergeOld<N: Iterator, O: Iterator> {
    new: std::iter::Peekable<N>,
    old: std::iter::Peekable<O>,
}

impl<N, O> Iterator for MergeOld<N, O>
where
    N: Iterator<Item = KeyOp>,
    O: Iterator<Item = Result<Slice>>,
{
    type Item = Result<KeyOp>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let old = match self.old.peek() {
                Some(Ok(k)) => Some(k),
                Some(Err(_)) => return self.old.next().map(|e| e.map(|k| (k, None))),
                None => None,
            };
            return match (self.new.peek(), old) {
                (None, None) => None,
                (Some(_), None) => self.new.next().map(Ok),
                (None, Some(_)) => self.old.next().map(|k| k.map(|k| (k, None))),
                (Some((n, _)), Some(o)) => match n[..].cmp(&o[..]) {
                    std::cmp::Ordering::Less => self.new.next().map(Ok),
                    std::cmp::Ordering::Greater => self.old.next().map(|k| k.map(|k| (k, None))),
                    std::cmp::Ordering::Equal => {
                        self.old.next(); // rewritten
                        continue;
                    }
                },
            };
        }
    }
}

/// An index (or row) scan: bounds on the encoded value, order, continuation and limits.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Only entries with exactly this encoded value.
    pub eq: Option<Vec<u8>>,
    /// Entries with a value at or above this encoded value.
    pub gte: Option<Vec<u8>>,
    /// Entries with a value below this encoded value.
    pub lt: Option<Vec<u8>>,
    /// Only entries whose encoded value starts with this (from [`encode_prefix`]).
    pub prefix: Option<Vec<u8>>,
    /// Continue strictly after this position (from [`Page::next`]).
    pub after: Option<Vec<u8>>,
    /// Highest values first.
    pub descending: bool,
    /// Most rows returned.
    pub limit: usize,
    /// Most entries examined (rows the filter refuses count too); bounds the work of a
    /// query with a post-filter.
    pub max_scanned: usize,
}

/// One row found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Row key.
    pub key: String,
    /// The row's JSON document.
    pub json: Vec<u8>,
    /// Its position in the scan (what [`Scan::after`] takes to continue after it).
    pub position: Vec<u8>,
}

/// A page of a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Rows in scan order.
    pub rows: Vec<Hit>,
    /// Where the next page starts (pass as [`Scan::after`]); `None` when nothing is left.
    pub next: Option<Vec<u8>>,
}

impl Store {
    /// Row `key` of `view` (its JSON document), checksum verified.
    pub fn get_view_row(&self, view: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let k = row_key(view, key);
        match self.table(Table::ViewRow).get(&k)? {
            Some(v) => unframe(&v)
                .map(|j| Some(j.to_vec()))
                .map_err(|e| corrupt(Table::ViewRow, &k, e)),
            None => Ok(None),
        }
    }

    /// Deletes every row, index entry and checkpoint of `view`, rows and entries as
    /// ingested tombstones, at most `max_batch` keys per ingestion (each makes table
    /// files, so make it large; it bounds the memory of the keys held); returns how many
    /// keys were deleted. Not atomic as a whole: callers mark the view as being rebuilt
    /// first.
    pub fn clear_view(&self, view: &str, max_batch: usize) -> Result<u64> {
        check_name("view", view)?;
        let max_batch = max_batch.max(1);
        let mut deleted = 0;
        // Checkpoints first, committed: should this stop half way, a view with no
        // checkpoint is rebuilt from the start rather than trusted.
        let checkpoints = format!("view/{view}/").into_bytes();
        let mut b = Batch::new();
        for kv in self
            .table(Table::Meta)
            .range(checkpoints.clone()..prefix_end(&checkpoints))
        {
            b.delete(Table::Meta, kv.key()?.to_vec());
        }
        deleted += b.len() as u64;
        self.commit(b, true)?;
        // Entries and rows become tombstones written straight into table files (see
        // [`Store::ingest`]): no journal, no memtable. One pass over a snapshot.
        let snapshot = self.snapshot();
        let mut b = Batch::with_capacity(max_batch.min(1 << 16));
        for table in [Table::ViewIndex, Table::ViewRow] {
            let prefix = key2(view.as_bytes(), b"");
            let end = prefix_end(&prefix);
            for kv in snapshot.range(self.table(table), prefix..end) {
                b.delete(table, kv.key()?.to_vec());
                deleted += 1;
                if b.len() >= max_batch {
                    self.ingest(std::mem::take(&mut b))?;
                }
            }
        }
        self.ingest(b)?;
        Ok(deleted)
    }

    /// Deletes the rows of `view` whose key `doomed` picks, with their index entries (found
    /// through the row key they name), as ingested tombstones; returns how many keys were
    /// deleted. One pass over the whole view: for repairs, not for the hot path.
    pub fn clear_view_rows(&self, view: &str, doomed: &(dyn Fn(&str) -> bool + Sync)) -> Result<u64> {
        check_name("view", view)?;
        let snapshot = self.snapshot();
        let prefix = key2(view.as_bytes(), b"");
        let end = prefix_end(&prefix);
        let mut b = Batch::new();
        for kv in snapshot.range(self.table(Table::ViewRow), prefix.clone()..end.clone()) {
            let k = kv.key()?;
            if doomed(&String::from_utf8_lossy(&k[prefix.len()..])) {
                b.delete(Table::ViewRow, k.to_vec());
            }
        }
        for kv in snapshot.range(self.table(Table::ViewIndex), prefix..end) {
            let (k, v) = kv.into_inner()?;
            if doomed(&decode_key(&k, &v)?) {
                b.delete(Table::ViewIndex, k.to_vec());
            }
        }
        let deleted = b.len() as u64;
        self.ingest(b)?;
        Ok(deleted)
    }

    /// Every stored entry of `view` as `(table, key, value)`, raw (values framed):
    /// checkpoints, then index entries, then rows, each in key order. For tests and
    /// tools comparing two copies of a view byte for byte.
    pub fn dump_view(&self, view: &str) -> Result<Vec<RawEntry>> {
        check_name("view", view)?;
        let snapshot = self.snapshot();
        let mut out = Vec::new();
        for (table, prefix) in [
            (Table::Meta, format!("view/{view}/").into_bytes()),
            (Table::ViewIndex, key2(view.as_bytes(), b"")),
            (Table::ViewRow, key2(view.as_bytes(), b"")),
        ] {
            let end = prefix_end(&prefix);
            for kv in snapshot.range(self.table(table), prefix..end) {
                let (k, v) = kv.into_inner()?;
                out.push((table.name(), k.to_vec(), v.to_vec()));
            }
        }
        Ok(out)
    }

    /// How many rows `view` holds (a full scan of its rows' keys).
    pub fn count_view_rows(&self, view: &str) -> Result<u64> {
        check_name("view", view)?;
        let mut n = 0;
        for kv in self.table(Table::ViewRow).prefix(key2(view.as_bytes(), b"")) {
            kv.key()?;
            n += 1;
        }
        Ok(n)
    }

    /// The row key holding `value` in the unique `index` of `view`.
    pub fn get_view_unique(&self, view: &str, index: &str, value: &[u8]) -> Result<Option<String>> {
        let k = entry_key(view, index, value, "", true);
        match self.table(Table::ViewIndex).get(&k)? {
            Some(v) => decode_key(&k, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Scans `index` of `view` (or, with `index = None`, the rows in key order, where the
    /// bounds are encoded strings of the key), returning up to `scan.limit` rows accepted
    /// by `filter`, read from one consistent snapshot.
    pub fn scan_view(
        &self,
        view: &str,
        index: Option<&str>,
        scan: &Scan,
        filter: &mut dyn FnMut(&str, &[u8]) -> bool,
    ) -> Result<Page> {
        check_name("view", view)?;
        let snapshot = self.snapshot();
        let (table, prefix) = match index {
            Some(i) => {
                check_name("index", i)?;
                (Table::ViewIndex, index_prefix(view, i))
            }
            None => (Table::ViewRow, key2(view.as_bytes(), b"")),
        };
        // Row keys are raw bytes after the prefix; index values are encoded.
        let raw = |v: &[u8]| -> Vec<u8> {
            match index {
                Some(_) => v.to_vec(),
                None => decode_string(v).unwrap_or_else(|| v.to_vec()),
            }
        };
        let raw_prefix = |v: &[u8]| -> Vec<u8> {
            match index {
                Some(_) => v.to_vec(),
                None => v.strip_prefix(&[TAG_STRING]).map_or_else(|| v.to_vec(), unescape),
            }
        };
        let with_prefix = |v: &[u8]| {
            let mut k = prefix.clone();
            k.extend_from_slice(v);
            k
        };
        let (mut start, mut end) = match &scan.eq {
            Some(eq) => {
                let k = with_prefix(&raw(eq));
                let e = prefix_end(&k);
                (k, e)
            }
            None => (prefix.clone(), prefix_end(&prefix)),
        };
        if let Some(p) = &scan.prefix {
            let k = with_prefix(&raw_prefix(p));
            end = end.min(prefix_end(&k));
            start = start.max(k);
        }
        if let Some(g) = &scan.gte {
            start = start.max(with_prefix(&raw(g)));
        }
        if let Some(l) = &scan.lt {
            end = end.min(with_prefix(&raw(l)));
        }
        let (mut lower, mut upper) = (Bound::Included(start), Bound::Excluded(end));
        if let Some(after) = &scan.after {
            let a = with_prefix(after);
            if scan.descending {
                if let Bound::Excluded(e) = &upper
                    && a < *e
                {
                    upper = Bound::Excluded(a);
                }
            } else if let Bound::Included(s) = &lower
                && a >= *s
            {
                lower = Bound::Excluded(a);
            }
        }
        let empty = match (&lower, &upper) {
            (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
            _ => false,
        };
        let mut page = Page::default();
        if empty || scan.limit == 0 {
            return Ok(page);
        }
        let keyspace = self.table(table);
        let iter = snapshot.range(keyspace, (lower, upper));
        let mut iter: Box<dyn Iterator<Item = _>> = if scan.descending {
            Box::new(iter.rev())
        } else {
            Box::new(iter)
        };
        let mut scanned = 0;
        while let Some(kv) = iter.next() {
            let (k, v) = kv.into_inner()?;
            scanned += 1;
            let (key, json) = match index {
                Some(_) => {
                    let key = decode_key(&k, &v)?;
                    let json = snapshot
                        .get(self.table(Table::ViewRow), row_key(view, &key))?
                        .ok_or_else(|| corrupt(Table::ViewIndex, &k, format!("points at missing row {key:?}")))?;
                    let json = unframe(&json)
                        .map_err(|e| corrupt(Table::ViewRow, &row_key(view, &key), e))?
                        .to_vec();
                    (key, json)
                }
                None => {
                    let key = String::from_utf8(k[prefix.len()..].to_vec())
                        .map_err(|_| corrupt(Table::ViewRow, &k, "row key is not UTF-8".into()))?;
                    (key, unframe(&v).map_err(|e| corrupt(Table::ViewRow, &k, e))?.to_vec())
                }
            };
            if filter(&key, &json) {
                page.rows.push(Hit {
                    key,
                    json,
                    position: k[prefix.len()..].to_vec(),
                });
            }
            if page.rows.len() >= scan.limit || scanned >= scan.max_scanned.max(1) {
                if iter.next().is_some() {
                    page.next = Some(k[prefix.len()..].to_vec());
                }
                break;
            }
        }
        Ok(page)
    }
}

/// The row key index entry `k` -> `v` points at.
fn decode_key(k: &[u8], v: &[u8]) -> Result<String> {
    let raw = match v {
        [crc @ .., FORMAT_ROW_KEY_IN_KEY] if crc.len() == 4 => {
            let key = row_key_of_entry(k).ok_or_else(|| {
                corrupt(
                    Table::ViewIndex,
                    k,
                    "key does not end in an encoded value and a row key".into(),
                )
            })?;
            let stored = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
            let actual = frame_crc(FORMAT_ROW_KEY_IN_KEY, key);
            if stored != actual {
                return Err(corrupt(
                    Table::ViewIndex,
                    k,
                    format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"),
                ));
            }
            key
        }
        _ => unframe(v).map_err(|e| corrupt(Table::ViewIndex, k, e))?,
    };
    String::from_utf8(raw.to_vec()).map_err(|_| corrupt(Table::ViewIndex, k, "row key is not UTF-8".into()))
}

/// The raw bytes of an encoded string value (row scans bound keys by their raw bytes).
fn decode_string(v: &[u8]) -> Option<Vec<u8>> {
    let body = v.strip_prefix(&[TAG_STRING])?.strip_suffix(&[0x00, 0x01])?;
    Some(unescape(body))
}

/// Undoes the `0x00 -> 0x00 0xFF` escaping of string bytes.
fn unescape(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        out.push(body[i]);
        i += if body[i] == 0 { 2 } else { 1 };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;
    use rand::Rng;

    fn temp() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        (dir, s)
    }

    fn cmp_values(a: &IndexValue, b: &IndexValue) -> std::cmp::Ordering {
        use IndexValue::*;
        let as_f = |v: &IndexValue| match v {
            Int(i) => *i as f64,
            Float(f) => *f,
            String(_) => unreachable!(),
        };
        match (a, b) {
            (Int(x), Int(y)) => x.cmp(y),
            (String(x), String(y)) => x.as_bytes().cmp(y.as_bytes()),
            _ => as_f(a).partial_cmp(&as_f(b)).unwrap(),
        }
    }

    fn random_number(rng: &mut impl Rng) -> IndexValue {
        match rng.random_range(0..6) {
            0 => IndexValue::Int(i128::from(rng.random::<i64>())),
            1 => IndexValue::Int(i128::from(rng.random::<u64>())),
            2 => IndexValue::Int(rng.random_range(-1000..1000)),
            // Neighbours above 2^53, where f64 cannot tell them apart.
            3 => IndexValue::Int((1_i128 << 60) + rng.random_range(-3..3)),
            4 => IndexValue::float(rng.random_range(-1e6..1e6)),
            _ => IndexValue::float(rng.random::<f64>() * 10f64.powi(rng.random_range(-300..300))),
        }
    }

    fn random_string(rng: &mut impl Rng) -> IndexValue {
        let alphabet = ["", "\0", "\u{1}", "a", "b", "\u{ff}", "é", "\u{10ffff}", "z"];
        let n = rng.random_range(0..5);
        IndexValue::String((0..n).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect())
    }

    /// Property: for random pairs, byte order of the encodings equals value order, and
    /// equal values (only) have equal encodings.
    #[test]
    fn encoding_preserves_order_of_numbers_and_strings() {
        let mut rng = rand::rng();
        for _ in 0..50_000 {
            let (a, b) = if rng.random() {
                (random_number(&mut rng), random_number(&mut rng))
            } else {
                (random_string(&mut rng), random_string(&mut rng))
            };
            let (ea, eb) = (encode_value(&a), encode_value(&b));
            assert_eq!(ea.cmp(&eb), cmp_values(&a, &b), "{a:?} vs {b:?}");
        }
        // Fixed edge cases, including integral floats equal to integers.
        assert_eq!(encode_value(&IndexValue::float(3.0)), encode_value(&IndexValue::Int(3)));
        assert_eq!(
            encode_value(&IndexValue::float(-0.0)),
            encode_value(&IndexValue::Int(0))
        );
        let sorted = [
            IndexValue::float(-1e300),
            IndexValue::Int(i128::from(i64::MIN)),
            IndexValue::float(-0.5),
            IndexValue::Int(0),
            IndexValue::float(0.25),
            IndexValue::Int(9_007_199_254_740_992),
            IndexValue::Int(9_007_199_254_740_993),
            IndexValue::Int(i128::from(u64::MAX)),
            IndexValue::float(1e300),
        ];
        for w in sorted.windows(2) {
            assert!(encode_value(&w[0]) < encode_value(&w[1]), "{:?} < {:?}", w[0], w[1]);
        }
        let strings = ["", "\0", "\0\0", "\0a", "\u{1}", "a", "a\0", "a\u{1}", "ab", "b"];
        for w in strings.windows(2) {
            let (a, b) = (IndexValue::String(w[0].into()), IndexValue::String(w[1].into()));
            assert!(encode_value(&a) < encode_value(&b), "{:?} < {:?}", w[0], w[1]);
        }
    }

    /// Property: encodings are prefix-free, so an equality scan of one value never sees
    /// entries of another (the row key follows the value in an entry key).
    #[test]
    fn encodings_are_prefix_free() {
        let mut rng = rand::rng();
        for _ in 0..20_000 {
            let (a, b) = (random_string(&mut rng), random_string(&mut rng));
            let (ea, eb) = (encode_value(&a), encode_value(&b));
            if a != b {
                assert!(!eb.starts_with(&ea), "{a:?} is a prefix of {b:?}");
            }
        }
    }

    #[test]
    fn encoded_lengths_are_found_before_any_suffix() {
        let mut rng = rand::rng();
        for i in 0..20_000 {
            let v = if i % 2 == 0 {
                random_string(&mut rng)
            } else {
                random_number(&mut rng)
            };
            let enc = encode_value(&v);
            for suffix in [&b""[..], b"o-1", b"\0\x01x", &[0xFF; 3]] {
                let bytes = [&enc[..], suffix].concat();
                assert_eq!(encoded_len(&bytes), Some(enc.len()), "{v:?} then {suffix:?}");
            }
            assert_eq!(encoded_len(&enc[..enc.len() - 1]), None, "{v:?} cut short");
        }
        assert_eq!(
            encoded_len(b"\x30a\x00\x02b\x00\x01"),
            None,
            "NUL neither escaped nor ending"
        );
        assert_eq!(encoded_len(b"\x40"), None, "unknown tag");
    }

    /// Plain index entries hold a 5-byte check of the row key their key ends with; entries
    /// of older stores hold the row key itself; both are read, and a damaged key suffix or
    /// check is reported as corrupt, not followed to another row.
    #[test]
    fn plain_entries_point_at_the_row_their_key_ends_with() {
        let (_dir, s) = temp();
        let mut b = Batch::new();
        let city = encode_value(&IndexValue::String("Zürich\0x".into()));
        for key in ["o-1", "o-2", "o-3"] {
            b.put_view_row("v", key, b"{}");
        }
        b.put_view_entry("v", "city", &city, "o-1", false);
        b.put_view_entry("v", "city", &city, "o-2", false);
        // As stores before the 5-byte check wrote it.
        b.put(
            Table::ViewIndex,
            entry_key("v", "city", &city, "o-3", false),
            framed(b"o-3"),
        );
        s.commit(b, false).unwrap();
        let scan = || Scan {
            eq: Some(city.clone()),
            limit: 10,
            max_scanned: 10,
            ..Scan::default()
        };
        assert_eq!(all(&s, "v", Some("city"), scan()), ["o-1", "o-2", "o-3"]);
        let entry = entry_key("v", "city", &city, "o-1", false);
        let value = s.table(Table::ViewIndex).get(&entry).unwrap().unwrap();
        assert_eq!(value.len(), 5);

        // The check of o-1's entry under the key of an entry for o-9: a damaged suffix.
        let mut b = Batch::new();
        b.put(Table::ViewIndex, entry_key("v", "city", &city, "o-9", false), value);
        s.commit(b, false).unwrap();
        let err = s
            .scan_view("v", Some("city"), &scan(), &mut |_, _| true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("table `view_index`") && err.contains("checksum mismatch"),
            "{err}"
        );
    }

    fn all(s: &Store, view: &str, index: Option<&str>, scan: Scan) -> Vec<String> {
        let mut out = Vec::new();
        let mut scan = scan;
        loop {
            let page = s.scan_view(view, index, &scan, &mut |_, _| true).unwrap();
            out.extend(page.rows.into_iter().map(|h| h.key));
            match page.next {
                Some(n) => scan.after = Some(n),
                None => return out,
            }
        }
    }

    /// A model check: random rows indexed by a random number; every range/order/page size
    /// gives exactly the model's answer, page by page without gap or repeat.
    #[test]
    fn index_scans_match_a_model() {
        let (_dir, s) = temp();
        let mut rng = rand::rng();
        let mut model = std::collections::BTreeMap::new();
        let mut b = Batch::new();
        for i in 0..300 {
            let key = format!("r{i:03}");
            let v = rng.random_range(-50..50_i64);
            b.put_view_row("v", &key, format!("{{\"n\":{v}}}").as_bytes());
            b.put_view_entry("v", "n", &encode_value(&IndexValue::Int(v.into())), &key, false);
            model.insert(key, v);
        }
        // Another view and index with overlapping names must not leak in.
        b.put_view_row("v2", "r000", b"{}");
        b.put_view_entry("v", "n2", &encode_value(&IndexValue::Int(0)), "r000", false);
        s.commit(b, false).unwrap();
        for _ in 0..40 {
            let lo = rng.random_range(-60..60_i64);
            let hi = rng.random_range(-60..60_i64);
            let eq = rng.random_bool(0.3).then(|| rng.random_range(-50..50_i64));
            let descending = rng.random();
            let mut expected: Vec<(i64, String)> = model
                .iter()
                .filter(|(_, v)| match eq {
                    Some(e) => **v == e,
                    None => **v >= lo && **v < hi,
                })
                .map(|(k, v)| (*v, k.clone()))
                .collect();
            expected.sort();
            if descending {
                expected.reverse();
            }
            let enc = |v: i64| encode_value(&IndexValue::Int(v.into()));
            let scan = Scan {
                eq: eq.map(enc),
                gte: eq.is_none().then(|| enc(lo)),
                lt: eq.is_none().then(|| enc(hi)),
                descending,
                limit: rng.random_range(1..40),
                max_scanned: 1000,
                ..Default::default()
            };
            let got = all(&s, "v", Some("n"), scan);
            let want: Vec<String> = expected.into_iter().map(|(_, k)| k).collect();
            assert_eq!(got, want, "eq={eq:?} [{lo},{hi}) desc={descending}");
        }
        let keys = all(
            &s,
            "v",
            None,
            Scan {
                limit: 7,
                max_scanned: 100,
                ..Default::default()
            },
        );
        assert_eq!(keys, model.keys().cloned().collect::<Vec<_>>());
    }

    fn random_text(rng: &mut impl Rng, max: usize) -> String {
        let alphabet = ["\0", "\u{1}", "a", "b", "\u{ff}", "é", "\u{10ffff}"];
        let n = rng.random_range(0..=max);
        (0..n).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect()
    }

    /// Property: a string value's encoding starts with a prefix's encoding exactly when the
    /// string starts with the prefix (so a prefix query is one key range), and no number
    /// encoding does.
    #[test]
    fn prefix_encoding_matches_starts_with() {
        let mut rng = rand::rng();
        for _ in 0..50_000 {
            let (s, p) = (random_text(&mut rng, 5), random_text(&mut rng, 3));
            let enc = encode_value(&IndexValue::String(s.clone()));
            assert_eq!(enc.starts_with(&encode_prefix(&p)), s.starts_with(&p), "{s:?} / {p:?}");
            assert!(!encode_value(&random_number(&mut rng)).starts_with(&encode_prefix(&p)));
        }
    }

    /// A model check of prefix scans, alone and with range bounds, in both orders and page
    /// by page, on an index (values) and on the rows (keys).
    #[test]
    fn prefix_scans_match_a_model() {
        let (_dir, s) = temp();
        let mut rng = rand::rng();
        let mut model = std::collections::BTreeMap::new();
        let mut b = Batch::new();
        for i in 0..300 {
            let key = format!("{}#{i}", random_text(&mut rng, 3));
            let v = random_text(&mut rng, 4);
            b.put_view_row("v", &key, b"{}");
            b.put_view_entry("v", "s", &encode_value(&IndexValue::String(v.clone())), &key, false);
            model.insert(key, v);
        }
        // A neighbouring index whose values would match must not leak in.
        b.put_view_entry("v", "s2", &encode_value(&IndexValue::String("a".into())), "x", false);
        s.commit(b, false).unwrap();
        let enc = |v: &str| encode_value(&IndexValue::String(v.into()));
        for _ in 0..200 {
            let prefix = random_text(&mut rng, 2);
            let gte = rng.random_bool(0.3).then(|| random_text(&mut rng, 3));
            let lt = rng.random_bool(0.3).then(|| random_text(&mut rng, 3));
            let descending = rng.random();
            let in_range = |v: &String| {
                v.starts_with(&prefix)
                    && gte.as_ref().is_none_or(|g| v.as_bytes() >= g.as_bytes())
                    && lt.as_ref().is_none_or(|l| v.as_bytes() < l.as_bytes())
            };
            let scan = Scan {
                prefix: Some(encode_prefix(&prefix)),
                gte: gte.as_deref().map(enc),
                lt: lt.as_deref().map(enc),
                descending,
                limit: rng.random_range(1..20),
                max_scanned: 1000,
                ..Default::default()
            };
            // Index: by (value bytes, key).
            let mut want: Vec<(Vec<u8>, String)> = model
                .iter()
                .filter(|(_, v)| in_range(v))
                .map(|(k, v)| (v.as_bytes().to_vec(), k.clone()))
                .collect();
            want.sort();
            if descending {
                want.reverse();
            }
            let want: Vec<String> = want.into_iter().map(|(_, k)| k).collect();
            let got = all(&s, "v", Some("s"), scan.clone());
            assert_eq!(got, want, "prefix {prefix:?} gte {gte:?} lt {lt:?} desc {descending}");
            // Rows: by key.
            let mut want: Vec<String> = model.keys().filter(|k| in_range(k)).cloned().collect();
            if descending {
                want.reverse();
            }
            assert_eq!(all(&s, "v", None, scan), want, "key prefix {prefix:?}");
        }
    }

    /// Clearing a view removes its rows, entries and checkpoints in small batches, and
    /// nothing of a view whose name it prefixes.
    #[test]
    fn ingest_view_replaces_exactly_that_view() {
        let (_dir, s) = temp();
        let (one, two) = (encode_value(&IndexValue::Int(1)), encode_value(&IndexValue::Int(2)));
        let mut b = Batch::new();
        for view in ["v", "v2"] {
            for i in 0..10 {
                let key = format!("k{i}");
                b.put_view_row(view, &key, b"{\"old\":1}");
                b.put_view_entry(view, "n", &one, &key, false);
            }
        }
        s.commit(b, false).unwrap();
        // Half the rows again (one with a new value), one new row; the rest must go.
        let mut w = ViewWrite::with_capacity("v", 6, 6);
        for i in (0..10).step_by(2).chain([42]) {
            let key = format!("k{i}");
            w.put_row(&key, b"{\"new\":1}");
            w.put_entry("n", if i == 4 { &two } else { &one }, &key, false);
        }
        assert_eq!(
            s.ingest_view(w, true).unwrap(),
            20,
            "the view held 10 rows and 10 entries"
        );
        let keys = |index: Option<&str>| -> Vec<String> {
            let scan = Scan {
                limit: 100,
                max_scanned: 100,
                ..Default::default()
            };
            all(&s, "v", index, scan)
        };
        assert_eq!(keys(None), ["k0", "k2", "k4", "k42", "k6", "k8"]);
        assert_eq!(
            keys(Some("n")),
            ["k0", "k2", "k42", "k6", "k8", "k4"],
            "k4 moved to value 2"
        );
        assert_eq!(s.get_view_row("v", "k2").unwrap().unwrap(), b"{\"new\":1}");
        assert_eq!(s.count_view_rows("v2").unwrap(), 10, "the other view is untouched");

        // Without replace: only what is written changes, deletes included.
        let mut w = ViewWrite::with_capacity("v", 2, 1);
        w.delete_row("k0");
        w.delete_entry("n", &one, "k0", false);
        w.put_row("k1", b"{}");
        assert_eq!(s.ingest_view(w, false).unwrap(), 0);
        assert_eq!(keys(None), ["k1", "k2", "k4", "k42", "k6", "k8"]);
        assert_eq!(keys(Some("n")), ["k2", "k42", "k6", "k8", "k4"]);

        let mut w = ViewWrite::with_capacity("v", 2, 0);
        w.put_row("k1", b"{}");
        w.delete_row("k1");
        assert!(s.ingest_view(w, false).is_err(), "a key written twice is refused");
    }

    #[test]
    fn ingest_view_replace_drops_whole_files_and_deletes_what_is_left() {
        let (dir, s) = temp();
        let one = encode_value(&IndexValue::Int(1));
        let put = |b: &mut Batch, view: &str, key: &str, json: &[u8]| {
            b.put_view_row(view, key, json);
            b.put_view_entry(view, "n", &one, key, false);
        };
        // A file shared with the views sorting just before and after `v`: its keys of `v`
        // stay in it and are deleted one by one. `k1` has its oldest version here.
        let mut b = Batch::new();
        for view in ["u", "v", "w"] {
            for i in 0..5 {
                put(&mut b, view, &format!("k{i}"), b"{\"shared\":1}");
            }
        }
        s.ingest(b).unwrap();
        // Files of `v` alone, dropped whole; they hold newer versions of `k0`..`k4`.
        let mut b = Batch::new();
        for i in 0..50 {
            put(&mut b, "v", &format!("k{i}"), b"{\"alone\":1}");
        }
        s.ingest(b).unwrap();
        // Newer still, in the memtable.
        let mut b = Batch::new();
        put(&mut b, "v", "k7", b"{\"memtable\":1}");
        put(&mut b, "v", "k99", b"{\"memtable\":1}");
        s.commit(b, false).unwrap();

        let mut w = ViewWrite::with_capacity("v", 2, 2);
        for key in ["k200", "k3"] {
            w.put_row(key, b"{\"new\":1}");
            w.put_entry("n", &one, key, false);
        }
        let cleared = s.ingest_view(w, true).unwrap();
        let check = |s: &Store| {
            let scan = Scan {
                limit: 1000,
                max_scanned: 1000,
                ..Default::default()
            };
            assert_eq!(
                all(s, "v", None, scan.clone()),
                ["k200", "k3"],
                "no old row is left or shows again"
            );
            assert_eq!(all(s, "v", Some("n"), scan.clone()), ["k200", "k3"]);
            assert_eq!(
                s.get_view_row("v", "k1").unwrap(),
                None,
                "the shared file's old k1 stays deleted"
            );
            assert_eq!(s.get_view_row("v", "k3").unwrap().unwrap(), b"{\"new\":1}");
            for view in ["u", "w"] {
                assert_eq!(all(s, view, None, scan.clone()).len(), 5, "view {view} is untouched");
                assert_eq!(
                    all(s, view, Some("n"), scan.clone()).len(),
                    5,
                    "entries of {view} are untouched"
                );
            }
        };
        check(&s);
        assert!(cleared >= 102, "51 rows and 51 entries were stored, {cleared} counted");
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        check(&s);
    }

    #[test]
    fn clear_view_rows_deletes_the_chosen_rows_and_their_entries() {
        let (_dir, s) = temp();
        let mut b = Batch::new();
        for view in ["v", "v2"] {
            for i in 0..10 {
                let key = format!("k{i}");
                b.put_view_row(view, &key, b"{}");
                b.put_view_entry(view, "n", &encode_value(&IndexValue::Int(i % 3)), &key, false);
                b.put_view_entry(view, "u", &encode_value(&IndexValue::Int(i)), &key, true);
            }
        }
        s.commit(b, false).unwrap();
        let even = |k: &str| k[1..].parse::<u32>().unwrap() % 2 == 0;
        assert_eq!(s.clear_view_rows("v", &even).unwrap(), 15, "5 rows, 10 entries");
        let scan = Scan {
            limit: 100,
            max_scanned: 100,
            ..Default::default()
        };
        assert_eq!(all(&s, "v", None, scan.clone()), ["k1", "k3", "k5", "k7", "k9"]);
        assert_eq!(all(&s, "v", Some("n"), scan.clone()), ["k3", "k9", "k1", "k7", "k5"]);
        assert_eq!(all(&s, "v", Some("u"), scan.clone()), ["k1", "k3", "k5", "k7", "k9"]);
        assert_eq!(all(&s, "v2", None, scan).len(), 10, "the other view is untouched");
    }

    #[test]
    fn ingest_keeps_the_last_write_of_a_key() {
        let (_dir, s) = temp();
        let mut b = Batch::new();
        b.put_meta("a", 1);
        b.put_meta("b", 1);
        s.commit(b, false).unwrap();
        let mut b = Batch::new();
        b.put_meta("c", 1);
        b.put_meta("a", 2);
        b.delete_meta("b");
        b.put_meta("c", 3);
        b.put_view_row("v", "k", b"{}");
        s.ingest(b).unwrap();
        assert_eq!(s.get_meta("a").unwrap(), Some(2));
        assert_eq!(s.get_meta("b").unwrap(), None);
        assert_eq!(s.get_meta("c").unwrap(), Some(3));
        assert_eq!(s.get_view_row("v", "k").unwrap().unwrap(), b"{}");
    }

    #[test]
    fn clear_view_removes_exactly_that_view() {
        let (_dir, s) = temp();
        let v = encode_value(&IndexValue::Int(1));
        let mut b = Batch::new();
        for view in ["v", "v2"] {
            for i in 0..25 {
                let key = format!("k{i}");
                b.put_view_row(view, &key, b"{}");
                b.put_view_entry(view, "n", &v, &key, false);
            }
            b.put_meta(&view_checkpoint_key(view, "t", 0), 25);
        }
        s.commit(b, false).unwrap();
        assert_eq!(s.clear_view("v", 7).unwrap(), 25 + 25 + 1);
        assert_eq!(s.count_view_rows("v").unwrap(), 0);
        assert_eq!(s.get_meta(&view_checkpoint_key("v", "t", 0)).unwrap(), None);
        let scan = Scan {
            limit: 100,
            max_scanned: 100,
            ..Default::default()
        };
        assert!(all(&s, "v", Some("n"), scan.clone()).is_empty());
        assert_eq!(s.count_view_rows("v2").unwrap(), 25);
        assert_eq!(all(&s, "v2", Some("n"), scan).len(), 25);
        assert_eq!(s.get_meta(&view_checkpoint_key("v2", "t", 0)).unwrap(), Some(25));
    }

    #[test]
    fn rows_and_unique_entries_round_trip_and_deletes_remove_them() {
        let (_dir, s) = temp();
        let email = encode_value(&IndexValue::String("a@x".into()));
        let mut b = Batch::new();
        b.put_view_row("customers", "c1", br#"{"email":"a@x"}"#);
        b.put_view_entry("customers", "email", &email, "c1", true);
        s.commit(b, false).unwrap();
        assert_eq!(
            s.get_view_row("customers", "c1").unwrap().as_deref(),
            Some(&br#"{"email":"a@x"}"#[..])
        );
        assert_eq!(
            s.get_view_unique("customers", "email", &email).unwrap().as_deref(),
            Some("c1")
        );
        let mut b = Batch::new();
        b.delete_view_row("customers", "c1");
        b.delete_view_entry("customers", "email", &email, "c1", true);
        s.commit(b, false).unwrap();
        assert_eq!(s.get_view_row("customers", "c1").unwrap(), None);
        assert_eq!(s.get_view_unique("customers", "email", &email).unwrap(), None);
    }
}
