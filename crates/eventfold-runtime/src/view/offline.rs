//! Offline view rebuilds: a view applied again from offset 0 of its source, while nothing
//! else writes it.
//!
//! The rebuild runs the live workers' [`Worker::fold`] (so it builds exactly the rows,
//! index entries, unique-index owners and checkpoints a live view builds from the same
//! events), but writes nothing per batch: only because nothing else writes the view,
//!
//! - **reading is pipelined:** a reader task reads the source in chunks of
//!   [`ViewOptions::rebuild_batch_events`] and decodes the payloads while the previous
//!   chunk is applied;
//! - **the view is built in memory** (an [`Overlay`]: rows, unique-index entries and
//!   owners) up to [`ViewOptions::rebuild_cache_bytes`]; entries of non-unique indexes
//!   are not tracked change by change but derived from the final rows. Rows changed
//!   recently stay parsed (up to [`ViewOptions::rebuild_hot_bytes`]): the next event of
//!   the same entity changes them without parsing them again, and each is serialized to
//!   JSON once, when the least recently changed are demoted or the overlay is written;
//! - **it is written once, sorted,** as new table files ([`Store::ingest`]: no journal, no
//!   memtable), when the memory is full and at the end. After such a spill the rebuild
//!   goes on like a live worker over what it wrote: rows it does not hold are read from
//!   the store, and index entries move change by change (tombstones included).
//!
//! The checkpoints and the removal of the rebuild marker are committed last, in one batch.

use super::{
    Committed, Decoded, Pending, ReadFailure, SourceEvent, UniqueValue, Worker, parse_row, read_events,
    rebuild_marker_key, service,
};
use crate::error::{Error, Result};
use crate::service::Topics;
use crate::view::{ViewOptions, ViewService, storage_name};
use eventfold_core::{Aggregate, Projection, Scope};
use eventfold_log::Log;
use eventfold_store::{Batch, Store, ViewWrite, encode_value, view_checkpoint_key};
use foldhash::HashMap;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// What a rebuild did.
#[derive(Debug, Clone, Default)]
pub struct RebuildStats {
    /// About how many rows and index entries the view held before, replaced or deleted
    /// by the rebuild (counted from the metadata of the table files dropped whole, which
    /// also count overwritten versions and tombstones, plus the keys deleted one by one).
    pub cleared: u64,
    /// Source events applied.
    pub events: u64,
    /// Rows the view holds afterwards.
    pub rows: u64,
    /// Rows left out of a unique index because another row held the value.
    pub unique_conflicts: u64,
    /// Time the rebuild took (writing included).
    pub elapsed: Duration,
}

/// Rebuilds the view of projection `P` from its source events in `log`, from offset 0 of
/// every partition up to the end offsets taken at the start, in batches of
/// `options.rebuild_batch_events`, and replaces the view's rows, index entries and
/// checkpoints with the result (see the module docs). `progress(applied, total)` is
/// called after each batch.
///
/// Nothing else may write the view meanwhile: run it while the service is stopped (the
/// store's lock makes a second process fail to open it). A durable marker is written
/// first and removed last, so an interrupted rebuild is noticed: the service refuses to
/// serve that view until a rebuild completes.
pub async fn rebuild<P: Projection>(
    log: Arc<dyn Log>,
    app_id: &str,
    options: &ViewOptions,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<RebuildStats> {
    let started = std::time::Instant::now();
    let source = Topics::new(app_id, <P::Source as Aggregate>::TYPE);
    let store = log.store().clone();
    let storage = storage_name(P::VIEW, P::VERSION);
    // The ends first: a source that cannot be read (a missing topic, a broker away)
    // fails the rebuild before it touches the view.
    let mut ends = Vec::new();
    for p in 0..log.partitions() {
        ends.push(log.end_offset(&source.events, p).await?);
    }
    let marker = rebuild_marker_key(&storage);
    let mut b = Batch::new();
    b.put_meta(&marker, 1);
    store.commit(b, true)?;
    let (svc, projection, _) = service::<P>(&log, source.clone(), None, options);
    let total: u64 = ends.iter().sum();
    progress(0, total);
    let failed = |partition: u32, reason: String| Error::ViewFailed {
        view: P::VIEW.to_owned(),
        partition,
        reason,
    };

    // Partitions are folded by `threads` blocking threads (partition p by thread p mod
    // threads), each fed by its own reader task.
    let partitions = log.partitions();
    let threads = match P::SCOPE {
        Scope::Partitioned => options.rebuild_threads.clamp(1, partitions.max(1) as usize),
        Scope::Replicated => 1,
    };
    let applied = Arc::new(AtomicU64::new(0));
    let replaced = Arc::new(Mutex::new(false));
    let mut folds = Vec::new();
    let mut readers = Vec::new();
    for t in 0..threads {
        let (tx, rx) = mpsc::channel(2);
        let mine: Vec<(u32, u64)> = (0..partitions)
            .filter(|p| *p as usize % threads == t)
            .map(|p| (p, ends[p as usize]))
            .collect();
        readers.push(tokio::spawn(read::<P>(
            log.clone(),
            source.events.clone(),
            mine,
            options.rebuild_batch_events.max(1),
            tx,
        )));
        let folder = Folder {
            workers: (0..partitions)
                .map(|p| Worker {
                    projection: projection.clone(),
                    svc: svc.clone(),
                    log: log.clone(),
                    partition: p,
                    partitions,
                    next: 0,
                })
                .collect(),
            overlay: Overlay::new(store.clone(), svc.clone(), threads),
            topic: source.events.clone(),
            applied: applied.clone(),
            replaced: replaced.clone(),
        };
        folds.push(tokio::task::spawn_blocking(move || folder.run(rx)));
    }
    while !folds.iter().all(|f| f.is_finished()) {
        progress(applied.load(Ordering::Relaxed), total);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut write = ViewWrite::with_capacity(&storage, 0, 0);
    let (mut rows, mut cleared) = (Some(0), 0);
    let mut checkpoints = vec![None; partitions as usize];
    for fold in folds {
        let folded = fold
            .await
            .map_err(|e| failed(0, format!("the rebuild thread failed: {e}")))?
            .map_err(|(p, e)| failed(p, e))?;
        write.append(folded.write);
        rows = rows.zip(folded.rows).map(|(a, b)| a + b);
        cleared += folded.cleared;
        for (p, next) in folded.checkpoints.into_iter().enumerate() {
            checkpoints[p] = checkpoints[p].or(next);
        }
    }
    for reader in readers {
        reader
            .await
            .map_err(|e| failed(0, format!("the reader task failed: {e}")))?;
    }
    let replace = !*replaced.lock().expect("not poisoned");
    let folded_in = started.elapsed();
    cleared += ingest(&store, (write, replace)).await.map_err(|e| failed(0, e))?;
    tracing::debug!(
        view = P::VIEW,
        fold_s = folded_in.as_secs_f64(),
        write_s = (started.elapsed() - folded_in).as_secs_f64(),
        "rebuild: events folded, view written"
    );
    let applied = applied.load(Ordering::Relaxed);
    progress(applied, total);
    // Ingested data is durable: the checkpoints and the marker's removal go together.
    let mut b = Batch::new();
    for (p, next) in checkpoints.into_iter().enumerate() {
        let key = view_checkpoint_key(&storage, &source.events, p as u32);
        match next {
            Some(next) => b.put_meta(&key, next),
            None => b.delete_meta(&key),
        }
    }
    b.delete_meta(&marker);
    store.commit(b, true)?;
    let rows = match rows {
        Some(n) => n,
        None => store.count_view_rows(&storage)?,
    };
    Ok(RebuildStats {
        cleared,
        events: applied,
        rows,
        unique_conflicts: svc.unique_conflicts.iter().map(|n| n.load(Ordering::Relaxed)).sum(),
        elapsed: started.elapsed(),
    })
}

/// One rebuild thread: folds the chunks of its partitions into its overlay.
struct Folder<P: Projection> {
    /// One per partition of the source (only this thread's are used).
    workers: Vec<Worker<P>>,
    overlay: Overlay,
    topic: Arc<str>,
    /// Events applied, by all threads.
    applied: Arc<AtomicU64>,
    /// Whether a spill has replaced the view's old data (the first one does); held while
    /// a thread spills, so that first spill ends before any other starts.
    replaced: Arc<Mutex<bool>>,
}

/// What a rebuild thread leaves to write.
struct Folded {
    /// Its overlay, spilled: written by the caller with every thread's.
    write: ViewWrite,
    /// Rows it holds, when it never spilled early (else the store must count them).
    rows: Option<u64>,
    /// Keys of the old view replaced by its early spills.
    cleared: u64,
    /// Next offset of each of its partitions (`None`: not its own, or empty).
    checkpoints: Vec<Option<u64>>,
}

impl<P: Projection> Folder<P> {
    fn run(mut self, mut rx: mpsc::Receiver<ReadResult<SourceEvent<P>>>) -> Result<Folded, (u32, String)> {
        let mut checkpoints = vec![None; self.workers.len()];
        let mut cleared = 0;
        while let Some(chunk) = rx.blocking_recv() {
            let Chunk {
                partition,
                events,
                next,
            } = chunk?;
            let mut pending = Pending {
                derive_plain_entries: self.overlay.whole,
                ..Default::default()
            };
            self.workers[partition as usize]
                .fold(&mut pending, &self.topic, &events, &self.overlay)
                .map_err(|e| (partition, e))?;
            self.overlay.take(pending);
            checkpoints[partition as usize] = Some(next);
            self.applied.fetch_add(events.len() as u64, Ordering::Relaxed);
            if self.overlay.bytes > self.overlay.max_bytes {
                tracing::debug!(
                    bytes = self.overlay.bytes,
                    "rebuild memory full: writing it to the store"
                );
                let mut replaced = self.replaced.lock().expect("not poisoned");
                let write = self.overlay.spill();
                cleared += self
                    .overlay
                    .store
                    .ingest_view(write, !*replaced)
                    .map_err(|e| (partition, format!("cannot write to the store: {e}")))?;
                *replaced = true;
            }
        }
        tracing::debug!(
            parsed_rows = self.overlay.hot_rows,
            parsed_row_bytes = self.overlay.sampled.1 / self.overlay.sampled.0.max(1) as usize,
            demoted = self.overlay.demoted,
            "rebuild thread: events folded"
        );
        let rows = self
            .overlay
            .whole
            .then(|| self.overlay.rows.get_mut().values().filter(|r| r.exists()).count() as u64);
        Ok(Folded {
            write: self.overlay.spill(),
            rows,
            cleared,
            checkpoints,
        })
    }
}

/// Writes a spill with [`Store::ingest_view`] on a blocking thread; returns how many
/// keys of the view were stored before, when the spill replaces them.
async fn ingest(store: &Store, (write, replace): (ViewWrite, bool)) -> Result<u64, String> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || store.ingest_view(write, replace)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(format!("cannot write to the store: {e}")),
        Err(e) => Err(format!("write task failed: {e}")),
    }
}

/// Source events of one partition, decoded, and the checkpoint after them.
struct Chunk<E> {
    partition: u32,
    events: Vec<Decoded<E>>,
    next: u64,
}

/// A chunk read, or why reading stopped (with the partition).
type ReadResult<E> = Result<Chunk<E>, (u32, String)>;

/// Reads each partition of `topic` in `ends` from 0 up to its end, `max` records at a
/// time, decodes them and sends them on; an error ends the reading (sent as the last
/// item, with the partition it concerns).
async fn read<P: Projection>(
    log: Arc<dyn Log>,
    topic: Arc<str>,
    ends: Vec<(u32, u64)>,
    max: usize,
    tx: mpsc::Sender<ReadResult<SourceEvent<P>>>,
) {
    for (p, end) in ends {
        let mut next = 0;
        while next < end {
            let want = max.min((end - next).try_into().unwrap_or(usize::MAX));
            let chunk = match read_events::<P>(&*log, &topic, p, next, want, end).await {
                Ok(events) => {
                    // Records appended since the start (in Kafka, by other instances) wait
                    // for the live workers: the rebuild stops at the ends it took.
                    let Some(last) = events.last().map(|e| e.offset) else {
                        // Only offsets without records are left (Kafka's transaction markers).
                        break;
                    };
                    next = last + 1;
                    Ok(Chunk {
                        partition: p,
                        events,
                        next,
                    })
                }
                Err(ReadFailure::Read(e) | ReadFailure::Decode(e)) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.send(chunk.map_err(|e| (p, e))).await.is_err() || failed {
                return;
            }
        }
    }
}

/// The view as the rebuild built it and has not written yet, bounded by bytes: rows
/// (recently changed ones parsed, the others as JSON with the encoded values of their
/// non-unique index fields), index entries, and unique-index owners. While nothing was
/// written (`whole`), a key it does not hold does not exist (the view was cleared),
/// deletes need no tombstone, and the entries of non-unique indexes are derived from the
/// rows when written. After a spill, missing rows and owners are read from the store and
/// every entry change is kept.
pub(super) struct Overlay {
    store: Store,
    svc: Arc<ViewService>,
    /// In a cell: [`Committed::row_to_change`] takes parsed rows out.
    rows: RefCell<HashMap<String, Slot>>,
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
    /// one row in [`SAMPLE`]: walking every row cost 5% of a rebuild); the others are
    /// assumed average.
    hot_rows: u64,
    sampled: (u64, usize),
    /// Parsed rows turned into JSON to stay within `max_hot_bytes`.
    demoted: u64,
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
enum Slot {
    /// Parsed, as the batch `batch` left it; `bytes` is about the memory it holds.
    Hot { doc: Value, batch: u64, bytes: usize },
    /// As JSON (`None`: deleted).
    Cold(Option<Row>),
}

impl Slot {
    fn exists(&self) -> bool {
        matches!(self, Slot::Hot { .. } | Slot::Cold(Some(_)))
    }
}

/// A row's JSON and its non-unique index values (index position, encoded value).
struct Row {
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
/// the wrong type is not indexed, as in [`Worker::change`].
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
            None => super::load_row(&self.store, &self.svc.storage, key),
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
