//! The fjall-backed store: tables, typed reads and atomic batches.

use crate::codec::{Reader, framed, framed_record, slice_of, unframe};
use crate::{Error, Result};
use eventfold_core::{Record, RecordRef};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Slice};
use lsm_tree::compaction::filter;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicI64, Ordering};

/// The tables of the store. Names are stable: they are the fjall keyspace names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Embedded log records: `topic 0 partition(u32 BE) offset(u64 BE)` -> framed record.
    Log,
    /// Per-entity event index: `topic 0 entity 0 version(u64 BE)` -> `(partition, offset)`.
    Entity,
    /// Aggregate state: `type 0 id` -> `(version, state JSON)`. Not necessarily the newest:
    /// the runtime may store a state every few versions and fold the events after it.
    State,
    /// Dedup outcomes: `type 0 partition(u32 BE) command id` -> `(timestamp, outcome JSON)`.
    /// Records past the dedup window are dropped by the table's compaction filter (see
    /// [`Store::expire_dedup_before`]), not by deletes.
    Dedup,
    /// Checkpoints and consumer offsets: name -> u64.
    Meta,
    /// View rows: `view 0 key` -> framed JSON document.
    ViewRow,
    /// View index entries: `view 0 index 0 value` (unique) or `view 0 index 0 value key`,
    /// the value order-preserving (see [`crate::view::encode_value`]) -> framed row key.
    ViewIndex,
    /// Process managers' states, timers and outboxes (see [`crate::process`]).
    Process,
}

/// How many L0 tables (one per memtable flush) of the `log`, `entity` and `state` tables
/// trigger a compaction into L1 (fjall's default: 4). Their keys arrive spread over the
/// whole key space (partitions interleave, ids are new), so every flushed table overlaps
/// all of L1 and each compaction rewrites it: with 4, a sustained in-process load spent
/// its cores rewriting (bench/FINDINGS.md, "Moved from code comments"). 8 keeps
/// clear of fjall's write stall (20 L0 tables) and halt (30) while one compaction runs.
/// fjall keeps a table's compaction settings from its creation: older stores keep 4.
/// The `log` table's flushes now write a table per partition (see `LOG_SEQUENCE_PREFIX`),
/// which move down without waiting for the trigger; it holds for those that overlap.
pub const L0_COMPACTION_TRIGGER: u8 = 8;

impl Table {
    /// The options a new keyspace of this table is created with.
    fn create_options(self) -> KeyspaceCreateOptions {
        let options = KeyspaceCreateOptions::default();
        match self {
            Table::Log | Table::Entity | Table::State => options.compaction_strategy(Arc::new(
                fjall::compaction::Leveled::default().with_l0_threshold(L0_COMPACTION_TRIGGER),
            )),
            _ => options,
        }
    }

    /// All tables.
    pub const ALL: [Table; 8] = [
        Table::Log,
        Table::Entity,
        Table::State,
        Table::Dedup,
        Table::Meta,
        Table::ViewRow,
        Table::ViewIndex,
        Table::Process,
    ];

    /// The keyspace name.
    pub fn name(self) -> &'static str {
        match self {
            Table::Log => "log",
            Table::Entity => "entity",
            Table::State => "state",
            Table::Dedup => "dedup",
            Table::Meta => "meta",
            Table::ViewRow => "view_row",
            Table::ViewIndex => "view_index",
            Table::Process => "process",
        }
    }
}

/// The keyspace of the dedup expiry index that stores before compaction-filter expiry
/// kept; [`Store::open`] deletes it.
const OLD_DEDUP_EXPIRY: &str = "dedup_expiry";

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Block cache size in bytes.
    pub cache_bytes: u64,
    /// Most bytes of journal kept (at least 64 MiB): past it, the tables whose memtables
    /// hold the oldest journal's writes are flushed. Unflushed writes sit in memtables,
    /// so this bounds their memory too. Default 512 MiB (fjall's).
    pub journal_bytes: u64,
    /// A temporary database (deleted when dropped); for tests and benchmarks.
    pub temporary: bool,
    /// Nice value of the store's background threads (flushes, compactions; Linux): a
    /// lower priority than the request-handling threads', so that they take a core only
    /// when requests leave one (see [`crate::priority`]). 0 leaves them at the process's. Process-wide: the
    /// first store opened with a nonzero value sets it.
    pub background_nice: i32,
    /// Zero-fill the next journal file on a background thread before it is needed (the
    /// vendored fjall's spare journals, `vendor/README.md` change 5), so that a sync of
    /// the journal need not also write its block map. Worth it where commits sync (the
    /// embedded log's group commits); a store that is a cache nothing syncs commit by
    /// commit (the Kafka log's) can leave it off and not write every journal twice.
    /// Default `true`.
    pub spare_journals: bool,
}

/// The smallest [`StoreOptions::journal_bytes`] (fjall's).
pub const MIN_JOURNAL_BYTES: u64 = 64 << 20;

/// The default [`StoreOptions::background_nice`].
pub const DEFAULT_BACKGROUND_NICE: i32 = 10;

/// The nice value of fjall's background threads, once a store set it (0: not yet).
static BACKGROUND_NICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Runs first on each of fjall's background threads.
fn background_thread_started() {
    crate::priority::apply(BACKGROUND_NICE.load(Ordering::Relaxed));
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_bytes: 256 << 20,
            journal_bytes: 512 << 20,
            temporary: false,
            background_nice: DEFAULT_BACKGROUND_NICE,
            spare_journals: true,
        }
    }
}

/// Aggregate state as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRow {
    /// Number of events folded into `json`.
    pub version: u64,
    /// The serialized state.
    pub json: Vec<u8>,
}

/// A stored command outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupRow {
    /// When the command was processed (ms since epoch).
    pub timestamp_ms: i64,
    /// The outcome JSON.
    pub outcome: Vec<u8>,
}

/// One event found through the per-entity index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityEvent {
    /// Version of the entity after the event.
    pub version: u64,
    /// Log partition.
    pub partition: u32,
    /// Log offset.
    pub offset: u64,
    /// The record.
    pub record: Record,
}

/// The local store. Cheap to clone; all clones share one database.
#[derive(Clone)]
pub struct Store {
    db: Database,
    tables: [Keyspace; 8],
    expiry: Arc<DedupExpiry>,
    /// The topic of every log key tag in use (meta `log_topic/<tag>`), loaded at open.
    topics: Arc<RwLock<HashMap<TopicTag, Arc<str>>>>,
    /// Held while new topics are registered (readers of `topics` do not wait for that).
    registering: Arc<std::sync::Mutex<()>>,
}

/// When dedup records expire; shared by a store's clones and its `dedup` table's
/// compaction filter.
#[derive(Debug)]
struct DedupExpiry {
    /// Records written before this instant (ms) are past their window (`i64::MIN`: none).
    horizon: AtomicI64,
    /// When the whole table was last compacted, in the clock of
    /// [`Store::claim_dedup_compaction`]'s caller (`i64::MIN`: not yet in this process).
    compacted_at: AtomicI64,
}

/// Makes the `dedup` table's compaction filters: each drops the records written before
/// the horizon at the moment its compaction starts.
struct DedupFilterFactory(Arc<DedupExpiry>);

impl filter::Factory for DedupFilterFactory {
    fn name(&self) -> &str {
        "eventfold-dedup-expiry"
    }

    fn make_filter(&self, _: &filter::Context) -> Box<dyn filter::CompactionFilter> {
        Box::new(DedupFilter {
            horizon: self.0.horizon.load(Ordering::Relaxed),
        })
    }
}

struct DedupFilter {
    horizon: i64,
}

impl filter::CompactionFilter for DedupFilter {
    fn filter_item(
        &mut self,
        item: filter::ItemAccessor<'_>,
        _: &filter::Context,
    ) -> lsm_tree::Result<filter::Verdict> {
        if self.horizon == i64::MIN {
            return Ok(filter::Verdict::Keep);
        }
        // A value that does not decode stays: reading it reports the corruption.
        Ok(match dedup_timestamp(&item.value()?) {
            Some(ts) if ts < self.horizon => filter::Verdict::Remove,
            _ => filter::Verdict::Keep,
        })
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn check_component(what: &str, s: &[u8]) -> Result<()> {
    if s.is_empty() || s.contains(&0) || s.len() > 1024 {
        return Err(Error::InvalidKey(format!("{what} must be 1..=1024 bytes without NUL")));
    }
    Ok(())
}

pub(crate) fn key2(a: &[u8], b: &[u8]) -> Vec<u8> {
    concat(&[a, &[0], b])
}

/// `parts` one after the other, in one allocation of the exact size (keys are built for
/// every write: growing a vector part by part reallocated it up to three times).
pub(crate) fn concat(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

// Keys: each layout is built here once, for writes and reads alike, straight into
// fjall's byte type (see `slice_of`); prefixes for scans are plain vectors.

/// The first bytes of every log key: `0xFF` (no UTF-8 topic name starts with it, so keys
/// of the older layout, `topic 0 partition offset`, are told apart) and 7 bytes of a hash
/// of the topic. A log key is then 20 bytes, which fjall keeps inline in its memtable
/// nodes: comparing two keys while inserting reads no other memory (the topic name
/// first made every key longer than that, and every comparison chased a pointer).
/// Two topics with the same tag are refused ([`Store`]'s topic registry).
pub(crate) type TopicTag = [u8; 8];

pub(crate) fn topic_tag(topic: &str) -> TopicTag {
    // FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in topic.as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let h = h.to_be_bytes();
    [0xFF, h[0], h[1], h[2], h[3], h[4], h[5], h[6]]
}

/// The bytes of a log key that name its sequence, the topic's tag and the partition:
/// within one, offsets only grow.
const LOG_SEQUENCE_PREFIX: usize = std::mem::size_of::<TopicTag>() + 4;

fn tagged_log_key(tag: &TopicTag, partition: u32, offset: u64) -> Slice {
    slice_of(&[tag, &partition.to_be_bytes(), &offset.to_be_bytes()])
}

/// The meta key naming the topic of a tag.
fn topic_meta_key(tag: &TopicTag) -> String {
    let hex: String = tag[1..].iter().map(|b| format!("{b:02x}")).collect();
    format!("log_topic/{hex}")
}

fn entity_key(topic: &str, entity: &[u8], version: u64) -> Slice {
    slice_of(&[topic.as_bytes(), &[0], entity, &[0], &version.to_be_bytes()])
}

fn state_key(agg_type: &str, id: &str) -> Slice {
    slice_of(&[agg_type.as_bytes(), &[0], id.as_bytes()])
}

fn dedup_key(agg_type: &str, partition: u32, command_id: &str) -> Slice {
    slice_of(&[
        agg_type.as_bytes(),
        &[0],
        &partition.to_be_bytes(),
        command_id.as_bytes(),
    ])
}

fn log_prefix(tag: &TopicTag, partition: u32) -> Vec<u8> {
    concat(&[tag, &partition.to_be_bytes()])
}

fn log_end_key(topic: &str, partition: u32) -> String {
    format!("log_end/{topic}/{partition}")
}

/// The timestamp a stored dedup value was recorded at (`None`: it does not decode).
fn dedup_timestamp(value: &[u8]) -> Option<i64> {
    Reader::new(unframe(value).ok()?).i64().ok()
}

fn printable(key: &[u8]) -> String {
    key.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// The topics of `topics` that `registry` does not know yet, each tag once; an error if a
/// tag is taken by another topic, in the registry or within `topics`.
fn unregistered<'t>(
    registry: &HashMap<TopicTag, Arc<str>>,
    topics: &'t [(TopicTag, Box<str>)],
) -> Result<Vec<(TopicTag, &'t str)>> {
    let mut new: Vec<(TopicTag, &str)> = Vec::new();
    for (tag, topic) in topics {
        let holder = registry
            .get(tag)
            .map(|t| &**t)
            .or_else(|| new.iter().find(|(t, _)| t == tag).map(|(_, n)| *n));
        match holder {
            Some(t) if t == &**topic => {}
            Some(t) => return Err(tag_collision(topic, t)),
            None => new.push((*tag, topic)),
        }
    }
    Ok(new)
}

fn tag_collision(topic: &str, holder: &str) -> Error {
    Error::InvalidKey(format!(
        "topic `{topic}` has the same log key tag as topic `{holder}` in this store; their records would mix: rename one of them"
    ))
}

pub(crate) fn corrupt(table: Table, key: &[u8], reason: String) -> Error {
    Error::Corrupt {
        table: table.name(),
        key: printable(key),
        reason,
    }
}

/// A log record framed and checksummed, ready to store.
#[derive(Debug, Clone)]
pub struct EncodedRecord(Slice);

impl EncodedRecord {
    /// Encodes and frames `record`.
    pub fn new(record: &Record) -> Self {
        Self(framed_record(record))
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty (never, for a framed record).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Changes to any tables, written atomically by [`Store::commit`]. Values are encoded
/// and checksummed when added, so encoding runs on the caller's thread.
#[derive(Debug, Default)]
pub struct Batch {
    ops: Vec<(Table, Slice, Option<Slice>)>,
    bytes: usize,
    /// The topics this batch writes log records of, each once, with their tags: the store
    /// checks them against its topic registry before it writes.
    log_topics: Vec<(TopicTag, Box<str>)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `ops` operations.
    pub fn with_capacity(ops: usize) -> Self {
        Self {
            ops: Vec::with_capacity(ops),
            bytes: 0,
            log_topics: Vec::new(),
        }
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Approximate size in bytes of keys and values.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Moves all operations of `other` into this batch, after the existing ones.
    pub fn append(&mut self, other: Batch) {
        self.bytes += other.bytes;
        self.ops.extend(other.ops);
        for (tag, topic) in other.log_topics {
            self.note_topic(tag, &topic);
        }
    }

    fn note_topic(&mut self, tag: TopicTag, topic: &str) {
        if !self.log_topics.iter().any(|(t, n)| *t == tag && **n == *topic) {
            self.log_topics.push((tag, topic.into()));
        }
    }

    pub(crate) fn put(&mut self, table: Table, key: impl Into<Slice>, value: impl Into<Slice>) {
        let (key, value) = (key.into(), value.into());
        self.bytes += key.len() + value.len();
        self.ops.push((table, key, Some(value)));
    }

    pub(crate) fn delete(&mut self, table: Table, key: impl Into<Slice>) {
        let key = key.into();
        self.bytes += key.len();
        self.ops.push((table, key, None));
    }

    /// Appends a log record at `offset`.
    pub fn put_log(&mut self, topic: &str, partition: u32, offset: u64, record: &Record) {
        self.put_log_encoded(topic, partition, offset, EncodedRecord::new(record));
    }

    /// Appends a record encoded beforehand (so a single writer thread only builds keys).
    pub fn put_log_encoded(&mut self, topic: &str, partition: u32, offset: u64, record: EncodedRecord) {
        let tag = topic_tag(topic);
        self.note_topic(tag, topic);
        self.put(Table::Log, tagged_log_key(&tag, partition, offset), record.0);
    }

    /// Records that `topic`/`partition` has been seen up to `next` (exclusive) without its
    /// records being kept here ([`Store::log_end`] counts it): a backend that keeps only
    /// some topics' records locally still knows where each topic's copy stopped.
    pub fn put_log_end(&mut self, topic: &str, partition: u32, next: u64) {
        self.put_meta(&log_end_key(topic, partition), next);
    }

    /// Indexes version `version` of `entity` in `topic` at `(partition, offset)`.
    pub fn put_entity(&mut self, topic: &str, entity: &[u8], version: u64, partition: u32, offset: u64) {
        let v = concat(&[&partition.to_le_bytes(), &offset.to_le_bytes()]);
        self.put(Table::Entity, entity_key(topic, entity, version), framed(&v));
    }

    /// Sets the state of aggregate `id` of `agg_type`.
    pub fn put_state(&mut self, agg_type: &str, id: &str, version: u64, json: &[u8]) {
        let mut v = Vec::with_capacity(8 + json.len());
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(json);
        self.put(Table::State, state_key(agg_type, id), framed(&v));
    }

    /// Records the outcome of `command_id`, recorded at `timestamp_ms`: it expires once the
    /// store's dedup horizon passes that instant ([`Store::expire_dedup_before`]).
    pub fn put_dedup(&mut self, agg_type: &str, partition: u32, command_id: &str, timestamp_ms: i64, outcome: &[u8]) {
        let v = concat(&[&timestamp_ms.to_le_bytes(), outcome]);
        self.put(Table::Dedup, dedup_key(agg_type, partition, command_id), framed(&v));
    }

    /// Sets the checkpoint or offset `name` to `value`.
    pub fn put_meta(&mut self, name: &str, value: u64) {
        self.put(Table::Meta, name.as_bytes(), framed(&value.to_le_bytes()));
    }

    /// Removes the checkpoint or offset `name`.
    pub fn delete_meta(&mut self, name: &str) {
        self.delete(Table::Meta, name.as_bytes());
    }
}

/// A write of one key: its value, or `None` to delete it.
pub(crate) type KeyOp = (Slice, Option<Slice>);

/// Sorts `ops` by key, stably (of equal keys, the earlier write stays first), and returns
/// the position (after sorting) of the first key written more than once, if any.
///
/// Keys to ingest are many (millions in a view rebuild), mostly longer than fjall keeps
/// inline, and share long prefixes: a table's or an index's, and often an indexed value
/// (a status, an amount). Compared directly, each comparison cost a cache miss and a
/// `memcmp` over those shared bytes. So the prefix all keys share is measured once, and
/// the keys are sorted by 16-byte digits after it (a radix sort whose digits are sorted
/// by comparison): each key's next digit is held inline with its position, and only the
/// keys equal in a digit are sorted again by the next one. The keys are then moved into
/// place.
pub(crate) fn sort_ops(ops: &mut [KeyOp]) -> Option<usize> {
    if ops.len() < 2 {
        return None;
    }
    let first = &ops[0].0;
    let mut shared = first.len();
    for (k, _) in &ops[1..] {
        shared = shared.min(k.len());
        if first[..shared] != k[..shared] {
            shared = first.iter().zip(k.iter()).take_while(|(a, b)| a == b).count();
        }
    }
    let mut order: Vec<Digit> = ops.iter().enumerate().map(|(i, (k, _))| digit(k, shared, i)).collect();
    let mut twice = None;
    sort_digits(ops, &mut order, shared, 0, &mut twice);
    // Position i takes the key at `from[i]`: follow each cycle of the permutation,
    // marking the positions done.
    let mut from: Vec<usize> = order.into_iter().map(|(_, _, p)| (p & POSITION) as usize).collect();
    for i in 0..from.len() {
        let mut j = i;
        while from[j] != usize::MAX {
            let k = from[j];
            from[j] = usize::MAX;
            if k == i {
                break;
            }
            ops.swap(j, k);
            j = k;
        }
    }
    twice
}

/// A key's digit for [`sort_ops`]: bytes `at..at + 16` as two big-endian numbers
/// (zero-padded), then how many bytes the key has from `at` (capped at 17: more than the
/// digit) in the top byte and its position in the rest. A key ending inside the digit
/// thus sorts before a longer one equal to it up to there, and keys equal in the whole
/// digit and longer than it are told apart by the next digit.
type Digit = (u64, u64, u64);

const POSITION: u64 = (1 << 56) - 1;

fn digit(k: &[u8], at: usize, position: usize) -> Digit {
    let word = |from: usize| {
        let mut b = [0u8; 8];
        if from < k.len() {
            let part = &k[from..k.len().min(from + 8)];
            b[..part.len()].copy_from_slice(part);
        }
        u64::from_be_bytes(b)
    };
    let left = k.len().saturating_sub(at).min(17) as u64;
    (word(at), word(at + 8), left << 56 | position as u64)
}

/// Sorts `order` (digits at `at` of keys equal before `at`, the first at sorted position
/// `base`), then each run equal in the digit by the next one; notes the first run of
/// equal keys in `twice`.
fn sort_digits(ops: &[KeyOp], order: &mut [Digit], at: usize, base: usize, twice: &mut Option<usize>) {
    order.sort_unstable();
    let same = |a: &Digit, b: &Digit| a.0 == b.0 && a.1 == b.1 && a.2 >> 56 == b.2 >> 56;
    let mut i = 0;
    while i < order.len() {
        let j = i + order[i..].iter().take_while(|d| same(d, &order[i])).count();
        if j - i > 1 {
            if order[i].2 >> 56 == 17 {
                for d in &mut order[i..j] {
                    let p = (d.2 & POSITION) as usize;
                    *d = digit(&ops[p].0, at + 16, p);
                }
                sort_digits(ops, &mut order[i..j], at + 16, base + i, twice);
            } else if twice.is_none() {
                *twice = Some(base + i);
            }
        }
        i = j;
    }
}

/// Sorts `ops` by key (a stable sort: of equal keys the last write wins) and ingests them
/// into `keyspace`.
fn ingest_sorted(keyspace: &Keyspace, mut ops: Vec<KeyOp>) -> Result<()> {
    sort_ops(&mut ops);
    let mut ops = ops.into_iter().peekable();
    ingest_ordered(
        keyspace,
        std::iter::from_fn(|| {
            loop {
                let op = ops.next()?;
                // Overwritten by a later write of the same key?
                if ops.peek().is_none_or(|(next, _)| *next != op.0) {
                    return Some(Ok(op));
                }
            }
        }),
    )
}

/// Ingests `ops`, in strictly ascending key order, into `keyspace` (values, or tombstones
/// for `None`).
pub(crate) fn ingest_ordered(keyspace: &Keyspace, ops: impl Iterator<Item = Result<KeyOp>>) -> Result<()> {
    let mut ingestion = keyspace.start_ingestion()?;
    for op in ops {
        match op? {
            (key, Some(value)) => ingestion.write(key, value)?,
            (key, None) => ingestion.write_tombstone(key)?,
        }
    }
    ingestion.finish()?;
    Ok(())
}

impl Store {
    /// Opens (or creates) the store at `path`; fjall replays its journal on open.
    pub fn open(path: &Path, options: &StoreOptions) -> Result<Self> {
        let expiry = Arc::new(DedupExpiry {
            horizon: AtomicI64::new(i64::MIN),
            compacted_at: AtomicI64::new(i64::MIN),
        });
        let factory: Arc<dyn filter::Factory> = Arc::new(DedupFilterFactory(expiry.clone()));
        if options.background_nice != 0
            && BACKGROUND_NICE
                .compare_exchange(0, options.background_nice, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            fjall::set_background_thread_start(background_thread_started);
        }
        let db = Database::builder(path)
            .cache_size(options.cache_bytes)
            .max_journaling_size(options.journal_bytes.max(MIN_JOURNAL_BYTES))
            .manual_journal_persist(true)
            .spare_journals(options.spare_journals)
            .temporary(options.temporary)
            .with_compaction_filter_factories(Arc::new(move |keyspace| {
                (keyspace == Table::Dedup.name()).then(|| factory.clone())
            }))
            .open()
            .map_err(|e| match e {
                fjall::Error::Locked => Error::Locked { path: path.to_owned() },
                e => e.into(),
            })?;
        // Stores written before dedup records expired by compaction kept an expiry index
        // (one entry per record, deleted by a sweep): nothing reads it any more.
        if db.keyspace_exists(OLD_DEDUP_EXPIRY) {
            let old = db.keyspace(OLD_DEDUP_EXPIRY, KeyspaceCreateOptions::default)?;
            db.delete_keyspace(old)?;
            tracing::info!("removed the dedup expiry index of an older store layout");
        }
        let open = |t: Table| db.keyspace(t.name(), || t.create_options());
        let tables = [
            open(Table::Log)?,
            open(Table::Entity)?,
            open(Table::State)?,
            open(Table::Dedup)?,
            open(Table::Meta)?,
            open(Table::ViewRow)?,
            open(Table::ViewIndex)?,
            open(Table::Process)?,
        ];
        let store = Self {
            db,
            tables,
            expiry,
            topics: Arc::default(),
            registering: Arc::default(),
        };
        // Each partition of a topic is a sequence of keys written in order: flushes and
        // compactions write a table per partition, which the leveled strategy then moves
        // down instead of rewriting (lsm-tree change 10 in vendor/README.md). Not kept by
        // fjall: set at every open, before the migration below writes.
        {
            use lsm_tree::AbstractTree;
            let log = &store.table(Table::Log).tree;
            log.tree_config().split_tables_at_prefix(LOG_SEQUENCE_PREFIX);
        }
        store.load_topics()?;
        store.migrate_log_keys()?;
        Ok(store)
    }

    fn load_topics(&self) -> Result<()> {
        let mut topics = self.topics.write().expect("topic registry lock");
        for kv in self.table(Table::Meta).prefix("log_topic/") {
            let (k, v) = kv.into_inner()?;
            let topic = unframe(&v)
                .and_then(|t| std::str::from_utf8(t).map_err(|e| e.to_string()))
                .map_err(|e| corrupt(Table::Meta, &k, e))?;
            topics.insert(topic_tag(topic), Arc::from(topic));
        }
        Ok(())
    }

    /// Checks the topics `batch` writes log records of against the registry, and
    /// registers (durably, before the batch is written) the ones seen for the first time.
    /// A topic whose tag another topic already has is refused: their records would mix.
    fn register_topics(&self, topics: &[(TopicTag, Box<str>)]) -> Result<()> {
        if unregistered(&self.topics.read().expect("topic registry lock"), topics)?.is_empty() {
            return Ok(());
        }
        let _registering = self.registering.lock().expect("topic registration lock");
        let new = unregistered(&self.topics.read().expect("topic registry lock"), topics)?;
        if new.is_empty() {
            return Ok(());
        }
        let mut b =
            fjall::OwnedWriteBatch::with_capacity(self.db.clone(), new.len()).durability(Some(PersistMode::SyncData));
        for (tag, topic) in &new {
            b.insert(self.table(Table::Meta), topic_meta_key(tag), framed(topic.as_bytes()));
        }
        b.commit()?;
        let mut reg = self.topics.write().expect("topic registry lock");
        for (tag, topic) in new {
            reg.insert(tag, Arc::from(topic));
        }
        Ok(())
    }

    /// The tag of `topic`'s log keys; an error if another topic holds it.
    fn tag_of(&self, topic: &str) -> Result<TopicTag> {
        let tag = topic_tag(topic);
        match self.topics.read().expect("topic registry lock").get(&tag) {
            Some(t) if **t != *topic => Err(tag_collision(topic, t)),
            _ => Ok(tag),
        }
    }

    /// Stores written before log keys were tagged keep `topic 0 partition offset`: their
    /// records move to tagged keys at open, 50,000 per atomic batch, so that a crash
    /// leaves a store that the next open goes on moving (old keys sort before `0xFF`).
    fn migrate_log_keys(&self) -> Result<()> {
        let log = self.table(Table::Log);
        let mut moved = 0u64;
        loop {
            let mut b = Batch::new();
            for kv in log.range::<&[u8], _>(..&[0xFFu8][..]).take(50_000) {
                let (k, v) = kv.into_inner()?;
                let n = k.len();
                let topic = (n >= 13 && k[n - 13] == 0)
                    .then(|| std::str::from_utf8(&k[..n - 13]).ok())
                    .flatten()
                    .ok_or_else(|| corrupt(Table::Log, &k, "not a log key of any layout".into()))?;
                let partition = u32::from_be_bytes(k[n - 12..n - 8].try_into().expect("4 bytes"));
                let tag = topic_tag(topic);
                b.note_topic(tag, topic);
                b.put(Table::Log, tagged_log_key(&tag, partition, offset_of(&k)), v);
                b.delete(Table::Log, k);
            }
            if b.is_empty() {
                break;
            }
            moved += b.len() as u64 / 2;
            self.commit(b, true)?;
            tracing::info!(moved, "moving log records to the tagged key layout");
        }
        if moved > 0 {
            tracing::info!(moved, "moved log records to the tagged key layout");
        }
        Ok(())
    }

    /// Dedup records written before `horizon_ms` are past their window: every compaction
    /// of the `dedup` table from now on drops them (the horizon never moves back). Until
    /// one does, they stay readable: [`Store::get_dedup`] returns them with their
    /// timestamp, and callers compare it with their window.
    pub fn expire_dedup_before(&self, horizon_ms: i64) {
        self.expiry.horizon.fetch_max(horizon_ms, Ordering::Relaxed);
    }

    /// Whether a whole-table dedup compaction ([`Store::compact_dedup`]) is due at
    /// `now_ms`: true at most once per `every_ms` across all callers (the caller that gets
    /// true runs it). The first call of a process only starts the count, so a restart
    /// does not rewrite the table at once.
    pub fn claim_dedup_compaction(&self, now_ms: i64, every_ms: i64) -> bool {
        let at = &self.expiry.compacted_at;
        let last = at.load(Ordering::Relaxed);
        if last == i64::MIN {
            let _ = at.compare_exchange(i64::MIN, now_ms, Ordering::Relaxed, Ordering::Relaxed);
            return false;
        }
        now_ms.saturating_sub(last) >= every_ms
            && at
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Writes the `dedup` table's memtable out and compacts the whole table, so that every
    /// record before the horizon is gone when it returns. Blocking, and a rewrite of the
    /// table: normal compactions drop expired records as they go, this bounds how long an
    /// expired record can stay where writes are too few to compact it.
    pub fn compact_dedup(&self) -> Result<()> {
        let dedup = self.table(Table::Dedup);
        dedup.rotate_memtable_and_wait()?;
        dedup.major_compact()?;
        Ok(())
    }

    pub(crate) fn table(&self, t: Table) -> &Keyspace {
        &self.tables[Table::ALL.iter().position(|x| *x == t).expect("every table is opened")]
    }

    /// Writes the journal's data so far to disk (`fdatasync`) without holding the journal
    /// while it syncs: writers go on meanwhile. For a store that is only a cache (no write
    /// is fsynced), calling this regularly keeps the data a memtable rotation has to sync
    /// (fjall fsyncs the old journal under its lock then) to what was written since.
    pub fn sync_journal_unlocked(&self) -> Result<()> {
        Ok(self.db.sync_journal_unlocked()?)
    }

    /// Writes `batch` atomically; with `durable`, fsyncs the journal before returning.
    pub fn commit(&self, batch: Batch, durable: bool) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if !batch.log_topics.is_empty() {
            self.register_topics(&batch.log_topics)?;
        }
        let mut b =
            fjall::OwnedWriteBatch::with_capacity(self.db.clone(), batch.ops.len()).durability(Some(if durable {
                PersistMode::SyncData
            } else {
                PersistMode::Buffer
            }));
        for (t, k, v) in batch.ops {
            match v {
                Some(v) => b.insert(self.table(t), k, v),
                None => b.remove(self.table(t), k),
            }
        }
        b.commit()?;
        Ok(())
    }

    /// Writes `batch` as new sorted table files of the store (fjall's bulk ingestion),
    /// bypassing the journal and the memtables: far cheaper than [`Store::commit`] for
    /// large batches, and durable when it returns (the files and the new table set are
    /// fsynced). Deletes become tombstones; a key written twice keeps its last write.
    ///
    /// It is **not atomic**: the part of each table lands on its own (the tables are
    /// written in parallel threads), so a crash can leave some. Use it only for writes
    /// whose interruption the caller notices and repeats, like a view rebuild under its
    /// marker. Concurrent commits to other keys are safe.
    pub fn ingest(&self, batch: Batch) -> Result<()> {
        if !batch.log_topics.is_empty() {
            self.register_topics(&batch.log_topics)?;
        }
        let mut by_table: Vec<Vec<KeyOp>> = (0..Table::ALL.len()).map(|_| Vec::new()).collect();
        for (t, k, v) in batch.ops {
            by_table[Table::ALL.iter().position(|x| *x == t).expect("every table is listed")].push((k, v));
        }
        std::thread::scope(|scope| {
            let tasks: Vec<_> = by_table
                .into_iter()
                .zip(&self.tables)
                .filter(|(ops, _)| !ops.is_empty())
                .map(|(ops, keyspace)| scope.spawn(move || ingest_sorted(keyspace, ops)))
                .collect();
            tasks
                .into_iter()
                .try_for_each(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })
    }

    /// Validates a key component (topic, type, id) before it is used in a key.
    pub fn check_key(what: &str, s: &str) -> Result<()> {
        check_component(what, s.as_bytes())
    }

    /// The state of aggregate `id`, checksum verified.
    pub fn get_state(&self, agg_type: &str, id: &str) -> Result<Option<StateRow>> {
        let k = state_key(agg_type, id);
        let Some(v) = self.table(Table::State).get(&k)? else {
            return Ok(None);
        };
        let decode = || -> Result<StateRow, String> {
            let mut r = Reader::new(unframe(&v)?);
            let version = r.u64()?;
            Ok(StateRow {
                version,
                json: r.rest().to_vec(),
            })
        };
        decode().map(Some).map_err(|e| corrupt(Table::State, &k, e))
    }

    /// The stored outcome of `command_id`, checksum verified.
    pub fn get_dedup(&self, agg_type: &str, partition: u32, command_id: &str) -> Result<Option<DedupRow>> {
        let k = dedup_key(agg_type, partition, command_id);
        let Some(v) = self.table(Table::Dedup).get(&k)? else {
            return Ok(None);
        };
        let decode = || -> Result<DedupRow, String> {
            let mut r = Reader::new(unframe(&v)?);
            let timestamp_ms = r.i64()?;
            Ok(DedupRow {
                timestamp_ms,
                outcome: r.rest().to_vec(),
            })
        };
        decode().map(Some).map_err(|e| corrupt(Table::Dedup, &k, e))
    }

    /// Reads up to `max` log records of `topic`/`partition` from `from` on.
    pub fn read_log(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        let mut out = Vec::with_capacity(max.min(1024));
        self.read_log_with(topic, partition, from, max, &mut |offset, r| {
            out.push((offset, r.to_record()));
            true
        })?;
        Ok(out)
    }

    /// As [`Store::read_log`], handing each record to `f` as views into the stored bytes
    /// (no copy, nothing allocated per record) until `f` returns `false`.
    pub fn read_log_with(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        f: &mut dyn for<'r> FnMut(u64, RecordRef<'r>) -> bool,
    ) -> Result<()> {
        let tag = self.tag_of(topic)?;
        let start = tagged_log_key(&tag, partition, from);
        let end = tagged_log_key(&tag, partition, u64::MAX);
        let mut at = Vec::new();
        for kv in self.table(Table::Log).range(start..end).take(max) {
            let (k, v) = kv.into_inner()?;
            let record = crate::codec::decode_framed_record_ref(&v, &mut at)
                .map_err(|e| corrupt_log(topic, partition, offset_of(&k), e))?;
            if !f(offset_of(&k), record) {
                break;
            }
        }
        Ok(())
    }

    /// One log record, if present.
    pub fn get_log(&self, topic: &str, partition: u32, offset: u64) -> Result<Option<Record>> {
        let k = tagged_log_key(&self.tag_of(topic)?, partition, offset);
        match self.table(Table::Log).get(&k)? {
            Some(v) => decode_framed_record(topic, partition, offset, &v).map(Some),
            None => Ok(None),
        }
    }

    /// How far `topic`/`partition` has been copied here: the offset after its last
    /// stored record, or the end recorded with [`Batch::put_log_end`] if that is further
    /// (0 when neither).
    pub fn log_end(&self, topic: &str, partition: u32) -> Result<u64> {
        let recorded = self.get_meta(&log_end_key(topic, partition))?.unwrap_or(0);
        Ok(self.stored_log_end(topic, partition)?.max(recorded))
    }

    /// The offset after the last record of `topic`/`partition` stored here (0 when none).
    pub fn stored_log_end(&self, topic: &str, partition: u32) -> Result<u64> {
        let prefix = log_prefix(&self.tag_of(topic)?, partition);
        match self.table(Table::Log).prefix(&prefix).next_back() {
            Some(kv) => Ok(offset_of(&kv.key()?) + 1),
            None => Ok(0),
        }
    }

    /// Whether the per-entity index holds version `version` of `entity` in `topic`. A point
    /// read, which the Bloom filters answer for most keys that are not there: cheaper than
    /// the range read of [`Store::entity_events`] when there is usually nothing to find
    /// (an aggregate's events after its stored state).
    pub fn has_entity_version(&self, topic: &str, entity: &[u8], version: u64) -> Result<bool> {
        Ok(self
            .table(Table::Entity)
            .contains_key(entity_key(topic, entity, version))?)
    }

    /// Events of `entity` in `topic` from version `from_version` on (at most `max`),
    /// through the per-entity index: costs that entity's events, not a scan.
    pub fn entity_events(&self, topic: &str, entity: &[u8], from_version: u64, max: usize) -> Result<Vec<EntityEvent>> {
        let start = entity_key(topic, entity, from_version);
        let end = entity_key(topic, entity, u64::MAX);
        let version_at = start.len() - 8;
        let mut out = Vec::new();
        for kv in self.table(Table::Entity).range(start..end).take(max) {
            let (k, v) = kv.into_inner()?;
            let version = u64::from_be_bytes(
                k[version_at..]
                    .try_into()
                    .map_err(|_| corrupt(Table::Entity, &k, "key does not end in a version".into()))?,
            );
            let (partition, offset) = (|| -> Result<(u32, u64), String> {
                let mut r = Reader::new(unframe(&v)?);
                let p = r.u32()?;
                let o = r.u64()?;
                r.finish()?;
                Ok((p, o))
            })()
            .map_err(|e| corrupt(Table::Entity, &k, e))?;
            let record = self.get_log(topic, partition, offset)?.ok_or_else(|| {
                corrupt(
                    Table::Entity,
                    &k,
                    format!("points at missing log record {topic}/{partition}@{offset}"),
                )
            })?;
            out.push(EntityEvent {
                version,
                partition,
                offset,
                record,
            });
        }
        Ok(out)
    }

    /// The checkpoint or offset `name`.
    pub fn get_meta(&self, name: &str) -> Result<Option<u64>> {
        let Some(v) = self.table(Table::Meta).get(name.as_bytes())? else {
            return Ok(None);
        };
        let decode = || -> Result<u64, String> {
            let mut r = Reader::new(unframe(&v)?);
            let x = r.u64()?;
            r.finish()?;
            Ok(x)
        };
        decode().map(Some).map_err(|e| corrupt(Table::Meta, name.as_bytes(), e))
    }

    /// Makes every write so far durable (fsync of the journal).
    pub fn sync(&self) -> Result<()> {
        self.db.persist(PersistMode::SyncData)?;
        Ok(())
    }

    /// Writes every table's memtable to table files and waits until they are written, so
    /// that the next [`Store::open`] has next to nothing to replay. fjall keeps a journal
    /// until every table holding writes in it has flushed them, which a table with few
    /// writes (`meta`, say) may not do for a long time: without this, every open replays
    /// up to 512 MiB of journals. For a graceful stop; writes meanwhile are safe (they land
    /// in the next memtable and journal).
    pub fn flush(&self) -> Result<()> {
        for keyspace in &self.tables {
            keyspace.rotate_memtable_and_wait()?;
        }
        Ok(())
    }

    /// A consistent read view across all tables.
    pub(crate) fn snapshot(&self) -> fjall::Snapshot {
        self.db.snapshot()
    }

    /// **Testing and repair tools only.** Overwrites the raw stored value of the state row of
    /// `agg_type`/`id` with `value`, bypassing framing, to simulate on-disk corruption.
    #[doc(hidden)]
    pub fn overwrite_state_raw(&self, agg_type: &str, id: &str, value: &[u8]) -> Result<()> {
        self.table(Table::State)
            .insert(state_key(agg_type, id), value.to_vec())?;
        self.db.persist(PersistMode::SyncAll)?;
        Ok(())
    }
}

fn offset_of(log_key: &[u8]) -> u64 {
    let n = log_key.len();
    u64::from_be_bytes(log_key[n - 8..].try_into().expect("log keys end in an offset"))
}

fn decode_framed_record(topic: &str, partition: u32, offset: u64, v: &[u8]) -> Result<Record> {
    crate::codec::decode_framed_record(v).map_err(|e| corrupt_log(topic, partition, offset, e))
}

/// A corrupt log record, named by topic, partition and offset (its key holds a tag of the
/// topic, not its name).
fn corrupt_log(topic: &str, partition: u32, offset: u64, reason: String) -> Error {
    Error::Corrupt {
        table: Table::Log.name(),
        key: format!("{topic}/{partition}@{offset}"),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sort_ops` orders like a plain stable sort of the bytes and finds repeated keys:
    /// keys sharing long prefixes, ending inside or at the compared words, with zero
    /// bytes (a key ending early must sort before one going on with zeros), and repeats.
    #[test]
    fn sort_ops_orders_like_a_stable_byte_sort() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..300 {
            let prefix: Vec<u8> = (0..rng.random_range(0..30)).map(|_| b'p').collect();
            // Keys are made of a few pieces, so many share long parts past 16 bytes.
            let max = if round % 3 == 0 { 3 } else { 12 };
            let pieces: Vec<Vec<u8>> = (0..4)
                .map(|_| {
                    let len = rng.random_range(0..max);
                    (0..len).map(|_| [0u8, 1, b'a', 0xFF][rng.random_range(0..4)]).collect()
                })
                .collect();
            let n = rng.random_range(0..200);
            let mut ops: Vec<KeyOp> = (0..n)
                .map(|i| {
                    let mut k = prefix.clone();
                    for _ in 0..rng.random_range(0..6) {
                        k.extend(&pieces[rng.random_range(0..pieces.len())]);
                    }
                    (Slice::from(k), Some(Slice::from((i as u32).to_be_bytes().to_vec())))
                })
                .collect();
            let mut expected = ops.clone();
            expected.sort_by(|a, b| a.0[..].cmp(&b.0[..]));
            let twice = sort_ops(&mut ops);
            assert_eq!(ops, expected, "round {round}");
            let first_repeat = expected.windows(2).position(|w| w[0].0 == w[1].0);
            assert_eq!(twice, first_repeat, "round {round}");
        }
    }

    fn temp() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        (dir, s)
    }

    fn rec(v: &str) -> Record {
        Record {
            key: b"k".to_vec(),
            value: v.as_bytes().to_vec(),
            headers: vec![],
            timestamp_ms: 5,
        }
    }

    #[test]
    fn batch_writes_all_tables_atomically_and_reads_back() {
        let (dir, s) = temp();
        let mut b = Batch::new();
        b.put_log("t", 1, 0, &rec("a"));
        b.put_log("t", 1, 1, &rec("b"));
        b.put_log("t", 2, 0, &rec("other partition"));
        b.put_entity("t", b"k", 1, 1, 0);
        b.put_entity("t", b"k", 2, 1, 1);
        b.put_state("order", "k", 2, b"{}");
        b.put_dedup("order", 1, "c1", 100, b"{\"x\":1}");
        b.put_meta("ckpt", 42);
        s.commit(b, true).unwrap();
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(s.log_end("t", 1).unwrap(), 2);
        assert_eq!(s.log_end("t", 3).unwrap(), 0);
        // An end recorded without records counts when it is further.
        let mut b = Batch::new();
        b.put_log_end("t", 1, 7);
        b.put_log_end("t", 3, 4);
        s.commit(b, false).unwrap();
        assert_eq!((s.log_end("t", 1).unwrap(), s.stored_log_end("t", 1).unwrap()), (7, 2));
        assert_eq!((s.log_end("t", 3).unwrap(), s.stored_log_end("t", 3).unwrap()), (4, 0));
        assert_eq!(s.read_log("t", 1, 1, 10).unwrap(), vec![(1, rec("b"))]);
        let ev = s.entity_events("t", b"k", 2, 10).unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].version, ev[0].record.value.as_slice()), (2, b"b".as_slice()));
        assert_eq!(
            s.get_state("order", "k").unwrap(),
            Some(StateRow {
                version: 2,
                json: b"{}".to_vec()
            })
        );
        assert_eq!(s.get_dedup("order", 1, "c1").unwrap().unwrap().timestamp_ms, 100);
        assert_eq!(s.get_meta("ckpt").unwrap(), Some(42));
    }

    #[test]
    fn the_journal_syncs_without_its_lock_and_keeps_every_write() {
        let (dir, s) = temp();
        let mut b = Batch::new();
        b.put_log("t", 0, 0, &rec("a"));
        s.commit(b, false).unwrap();
        s.sync_journal_unlocked().unwrap();
        // Writes go on while another thread syncs.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..20 {
                    s.sync_journal_unlocked().unwrap();
                }
            });
            for o in 1..50 {
                let mut b = Batch::new();
                b.put_log("t", 0, o, &rec("b"));
                s.commit(b, false).unwrap();
            }
        });
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(s.log_end("t", 0).unwrap(), 50);
    }

    #[test]
    fn log_records_of_the_untagged_layout_move_to_tagged_keys_at_open() {
        // A store written before log keys were tagged: `topic 0 partition offset`.
        let dir = tempfile::tempdir().unwrap();
        let old_key =
            |topic: &str, p: u32, o: u64| concat(&[topic.as_bytes(), &[0], &p.to_be_bytes(), &o.to_be_bytes()]);
        {
            let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
            let mut b = Batch::new();
            for o in 0..60_003u64 {
                let (topic, p) = if o % 3 == 0 { ("shop.order.events", 2) } else { ("x", 0) };
                b.put(
                    Table::Log,
                    old_key(topic, p, o),
                    EncodedRecord::new(&rec(&o.to_string())).0,
                );
            }
            s.commit(b, true).unwrap();
        }
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let old_left = s.table(Table::Log).range::<&[u8], _>(..&[0xFFu8][..]).count();
        assert_eq!(old_left, 0, "every record moved");
        assert_eq!(s.log_end("shop.order.events", 2).unwrap(), 60_001);
        assert_eq!(s.log_end("x", 0).unwrap(), 60_003);
        let events = s.read_log("shop.order.events", 2, 0, 100_000).unwrap();
        assert_eq!(events.len(), 20_001);
        assert!(events.iter().all(|(o, r)| o % 3 == 0 && *r == rec(&o.to_string())));
        assert_eq!(s.get_log("x", 0, 60_001).unwrap(), Some(rec("60001")));
        // Written after the move, read with the rest.
        let mut b = Batch::new();
        b.put_log("x", 0, 60_003, &rec("new"));
        s.commit(b, true).unwrap();
        assert_eq!(s.read_log("x", 0, 60_001, 10).unwrap().len(), 3);
    }

    #[test]
    fn a_topic_whose_tag_another_topic_holds_is_refused() {
        let (dir, s) = temp();
        let mut b = Batch::new();
        b.put_log("shop.order.events", 0, 0, &rec("a"));
        s.commit(b, true).unwrap();
        drop(s);
        // No two real names are known to collide: the registry is told that the tag of
        // `shop.order.events` belongs to another topic.
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        s.topics
            .write()
            .unwrap()
            .insert(topic_tag("shop.order.events"), Arc::from("someone.else"));
        let mut b = Batch::new();
        b.put_log("shop.order.events", 0, 1, &rec("b"));
        let err = s.commit(b, true).unwrap_err().to_string();
        assert!(
            err.contains("same log key tag") && err.contains("someone.else"),
            "{err}"
        );
        let err = s.read_log("shop.order.events", 0, 0, 10).unwrap_err().to_string();
        assert!(err.contains("same log key tag"), "{err}");
        // Two topics of one tag in one batch are refused too, before anything is written.
        let mut b = Batch::new();
        b.note_topic(topic_tag("t1"), "t1");
        b.note_topic(topic_tag("t1"), "t2");
        b.put_meta("m", 1);
        assert!(s.commit(b, true).is_err());
        assert_eq!(s.get_meta("m").unwrap(), None);
        // The registry is durable: a reopened store knows the topic.
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(
            s.topics
                .read()
                .unwrap()
                .get(&topic_tag("shop.order.events"))
                .map(|t| t.to_string()),
            Some("shop.order.events".to_owned())
        );
    }

    #[test]
    fn journals_after_the_first_are_zero_filled_ahead_and_recover_like_sparse_ones() {
        // The vendored fjall zero-fills the next journal once a quarter of the active one
        // is written (vendor/README.md): the rotation takes it, fully allocated, and a
        // store reopened on it reads back every write, as it does on a sparse journal.
        use std::os::unix::fs::MetadataExt;
        let (dir, s) = temp();
        let files = |suffix: &str| journal_files(dir.path(), suffix);
        let write = |from: u64, to: u64| write_big_records(&s, from, to);
        write(0, 300); // about 20 MB: past a quarter of the journal
        let first = files(".jnl");
        assert_eq!(first.len(), 1, "one journal before any rotation: {first:?}");
        let next = journal_id(&first[0]) + 1;
        let waited = std::time::Instant::now();
        while !files(".jnl.spare").iter().any(|p| journal_id(p) == next) {
            assert!(waited.elapsed().as_secs() < 60, "no spare of journal {next}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // fjall rotates a journal past 64 MB, when a flush starts.
        write(300, 1100);
        s.flush().unwrap();
        let active = files(".jnl").into_iter().find(|p| journal_id(p) == next);
        let active = active.expect("a flush past 64 MB of journal rotated it");
        let meta = std::fs::metadata(&active).unwrap();
        assert!(
            meta.blocks() * 512 >= 64 << 20,
            "journal {next} is the zero-filled spare: {} of {} bytes allocated",
            meta.blocks() * 512,
            meta.len()
        );
        assert!(
            files(".jnl.spare").iter().all(|p| journal_id(p) != next),
            "the spare was taken"
        );
        write(1100, 1150);
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(s.log_end("t", 0).unwrap(), 1150);
        for o in [0, 1099, 1100, 1149] {
            assert_eq!(s.get_log("t", 0, o).unwrap(), Some(big_record(o)), "record {o}");
        }
    }

    #[test]
    fn a_store_without_spare_journals_prepares_none_and_recovers_its_sparse_ones() {
        // `spare_journals: false` (the Kafka log's cache): no journal is zero-filled
        // ahead; the rotation creates a sparse file, as fjall itself does.
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            spare_journals: false,
            ..StoreOptions::default()
        };
        let s = Store::open(dir.path(), &options).unwrap();
        write_big_records(&s, 0, 1100); // about 72 MB: past a whole journal
        s.flush().unwrap();
        // A spare would be written while the first journal filled, long before now.
        assert_eq!(
            journal_files(dir.path(), ".jnl.spare"),
            Vec::<std::path::PathBuf>::new()
        );
        let journals = journal_files(dir.path(), ".jnl");
        let active = journals.last().expect("a journal");
        assert!(
            journal_id(active) > 0,
            "the flush past 64 MB rotated the journal: {journals:?}"
        );
        let allocated = std::fs::metadata(active).unwrap().blocks() * 512;
        assert!(
            allocated < 64 << 20,
            "the new journal is sparse: {allocated} bytes allocated"
        );
        write_big_records(&s, 1100, 1150);
        drop(s);
        let s = Store::open(dir.path(), &options).unwrap();
        assert_eq!(s.log_end("t", 0).unwrap(), 1150);
        for o in [0, 1099, 1100, 1149] {
            assert_eq!(s.get_log("t", 0, o).unwrap(), Some(big_record(o)), "record {o}");
        }
    }

    fn journal_id(path: &Path) -> u64 {
        let name = path.file_name().unwrap().to_str().unwrap();
        name.split('.').next().unwrap().parse().unwrap()
    }

    /// The journal files in `dir` whose names end with `suffix`, in id order.
    fn journal_files(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_str().unwrap().ends_with(suffix))
            .collect();
        v.sort_by_key(|p| journal_id(p));
        v
    }

    /// A 64 KiB record of random bytes (the journal compresses large values).
    fn big_record(o: u64) -> Record {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(o);
        Record {
            value: (0..64 << 10).map(|_| rng.random::<u8>()).collect(),
            ..rec("")
        }
    }

    /// Commits [`big_record`]s `from..to` to `t`/0, one batch each, without fsync.
    fn write_big_records(s: &Store, from: u64, to: u64) {
        for o in from..to {
            let mut b = Batch::new();
            b.put_log("t", 0, o, &big_record(o));
            s.commit(b, false).unwrap();
        }
    }

    #[test]
    fn flushes_and_compactions_keep_every_write_made_while_they_install_their_tables() {
        // The vendored lsm-tree writes a flush's or a compaction's version files without
        // its version lock and then installs the version over the memtables as they are
        // by then (vendor/README.md): writes, and rotations by a second flusher, that
        // land in between must all stay readable.
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let (dir, s) = temp();
        let (done, written, rounds) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
        let check = |s: &Store, o: u64| {
            assert_eq!(
                s.get_log("t", 0, o).unwrap(),
                Some(rec(&o.to_string())),
                "log record {o}"
            );
            assert!(
                s.get_dedup("order", 0, &format!("c{o}")).unwrap().is_some(),
                "dedup record {o}"
            );
        };
        /// Stops the other threads when the writer ends, a failed check included.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    while !done.load(Ordering::Relaxed) {
                        s.flush().unwrap();
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            scope.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    s.compact_dedup().unwrap();
                }
            });
            let writer = scope.spawn(|| {
                let _done = Done(&done);
                let mut o = 0;
                while o < 2_000 || rounds.load(Ordering::Relaxed) < 30 {
                    let mut b = Batch::new();
                    b.put_log("t", 0, o, &rec(&o.to_string()));
                    b.put_dedup("order", 0, &format!("c{o}"), 100, b"{}");
                    s.commit(b, false).unwrap();
                    check(&s, o);
                    if o > 0 {
                        check(&s, o / 2);
                    }
                    o += 1;
                    written.store(o, Ordering::Relaxed);
                }
            });
            writer.join().expect("every write stays readable");
        });
        let n = written.load(Ordering::Relaxed);
        assert!(n >= 2_000, "only {n} writes during the flushes");
        assert!(s.tables.iter().map(|k| k.table_count()).sum::<usize>() > 0);
        (0..n).for_each(|o| check(&s, o));
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        (0..n).for_each(|o| check(&s, o));
        assert_eq!(s.log_end("t", 0).unwrap(), n);
    }

    #[test]
    fn flush_writes_every_memtable_to_table_files() {
        let (dir, s) = temp();
        let mut b = Batch::new();
        b.put_log("t", 1, 0, &rec("a"));
        b.put_entity("t", b"k", 1, 1, 0);
        b.put_state("order", "k", 1, b"{}");
        b.put_dedup("order", 1, "c1", 100, b"{}");
        b.put_meta("ckpt", 1);
        b.put_view_row("v", "k", b"{}");
        b.put_view_entry("v", "i", b"x", "k", false);
        b.put_process_state("pm", "k", b"{}");
        s.commit(b, true).unwrap();
        let files = |s: &Store| -> Vec<usize> { s.tables.iter().map(|k| k.table_count()).collect() };
        assert_eq!(files(&s).iter().sum::<usize>(), 0, "the writes are in memtables only");
        s.flush().unwrap();
        for (t, n) in Table::ALL.iter().zip(files(&s)) {
            assert!(n > 0, "table {t:?} has no file after the flush");
        }
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(s.get_meta("ckpt").unwrap(), Some(1));
        assert_eq!(s.get_view_row("v", "k").unwrap().unwrap(), b"{}");
        assert_eq!(s.read_log("t", 1, 0, 10).unwrap(), vec![(0, rec("a"))]);
    }

    #[test]
    fn entity_and_state_tables_compact_only_past_their_l0_trigger_and_log_tables_move_down() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let flushes = |s: &Store, n: u64, from: u64| {
            for i in from..from + n {
                // Every flushed entity and state table spans the key range (two
                // entities, two ids far apart), so it overlaps the others: no trivial
                // move to L1. The log's flush writes a table per partition, which
                // overlaps nothing: it moves down.
                let mut b = Batch::new();
                for p in [0, 1] {
                    b.put_log("t", p, i, &rec(&i.to_string()));
                }
                for e in [&b"a"[..], b"z"] {
                    b.put_entity("t", e, i + 1, 0, i);
                }
                for id in [format!("a{i}"), format!("z{i}")] {
                    b.put_state("order", &id, 1, b"{}");
                }
                s.commit(b, false).unwrap();
                s.flush().unwrap(); // one L0 table per table per flush
            }
        };
        let l0 = |s: &Store| [Table::Entity, Table::State].map(|t| s.table(t).l0_table_count());
        let log = s.table(Table::Log);
        // Below the trigger too, the log's tables leave L0 (upstream, its one table per
        // flush would stay there until the trigger), and the small tables of each
        // partition that pile up are merged in place, four or more at a time: at most
        // three are left per partition.
        let log_moved = || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while log.l0_table_count() > 0 || log.table_count() > 2 * 3 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "log tables: {} in L0, {} in all",
                    log.l0_table_count(),
                    log.table_count()
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        let trigger = u64::from(L0_COMPACTION_TRIGGER);
        // Below the trigger they stay in L0 (the first flush into an empty tree may move
        // straight to L1); fjall's default trigger, 4, would have compacted them by now.
        flushes(&s, trigger - 1, 0);
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(
            l0(&s).iter().all(|n| *n > 4),
            "L0 tables below the trigger: {:?}",
            l0(&s)
        );
        log_moved();
        // Past it, they are compacted.
        flushes(&s, 2, trigger - 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while l0(&s).iter().any(|n| *n >= trigger as usize) {
            assert!(std::time::Instant::now() < deadline, "no compaction: {:?}", l0(&s));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        log_moved();
        for i in 0..trigger + 1 {
            assert_eq!(s.read_log("t", 1, i, 1).unwrap().len(), 1);
            assert!(s.get_state("order", &format!("z{i}")).unwrap().is_some());
        }
    }

    #[test]
    fn compaction_drops_dedup_records_before_the_horizon_only() {
        let (_dir, s) = temp();
        let mut b = Batch::new();
        b.put_dedup("order", 0, "late", 300, b"{}");
        b.put_dedup("order", 0, "early", -5, b"{}");
        b.put_dedup("order", 1, "other", 199, b"{}");
        // Written early, then again late: the newer record decides.
        b.put_dedup("order", 0, "again", 10, b"{\"old\":1}");
        s.commit(b, false).unwrap();
        let mut b = Batch::new();
        b.put_dedup("order", 0, "again", 250, b"{\"new\":1}");
        // Not a dedup value at all: kept, and reading it reports the corruption.
        b.put(Table::Dedup, dedup_key("order", 0, "torn"), framed(b"xy"));
        s.commit(b, false).unwrap();
        // No horizon yet: a compaction keeps everything.
        s.compact_dedup().unwrap();
        assert!(s.get_dedup("order", 0, "early").unwrap().is_some());
        s.expire_dedup_before(200);
        s.expire_dedup_before(100); // never moves back
        s.compact_dedup().unwrap();
        assert!(s.get_dedup("order", 0, "early").unwrap().is_none(), "expired");
        assert!(s.get_dedup("order", 1, "other").unwrap().is_none(), "expired");
        assert_eq!(s.get_dedup("order", 0, "late").unwrap().unwrap().timestamp_ms, 300);
        let again = s.get_dedup("order", 0, "again").unwrap().unwrap();
        assert_eq!((again.timestamp_ms, &again.outcome[..]), (250, &b"{\"new\":1}"[..]));
        assert!(matches!(s.get_dedup("order", 0, "torn"), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn dedup_compaction_is_claimed_once_per_period_after_the_first_call() {
        let (_dir, s) = temp();
        assert!(!s.claim_dedup_compaction(1_000, 60), "the first call starts the count");
        assert!(!s.claim_dedup_compaction(1_059, 60));
        assert!(s.claim_dedup_compaction(1_060, 60));
        assert!(!s.claim_dedup_compaction(1_060, 60), "claimed once");
        assert!(!s.clone().claim_dedup_compaction(1_100, 60), "clones share the count");
        assert!(s.clone().claim_dedup_compaction(1_120, 60));
    }

    #[test]
    fn opening_an_older_store_removes_its_dedup_expiry_index() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::builder(dir.path()).open().unwrap();
            let old = db.keyspace(OLD_DEDUP_EXPIRY, KeyspaceCreateOptions::default).unwrap();
            old.insert("order\0x", "").unwrap();
            db.persist(PersistMode::SyncAll).unwrap();
        }
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert!(!s.db.keyspace_exists(OLD_DEDUP_EXPIRY));
        drop(s);
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert!(!s.db.keyspace_exists(OLD_DEDUP_EXPIRY));
    }

    #[test]
    fn read_log_with_lends_the_stored_records_of_either_format_and_reports_corruption() {
        let (_dir, s) = temp();
        let mut b = Batch::new();
        let records: Vec<Record> = (0..3)
            .map(|i| {
                Record {
                    key: format!("k{i}").into_bytes(),
                    value: format!(r#"{{"n":{i}}}"#).into_bytes(),
                    headers: vec![],
                    timestamp_ms: i,
                }
                .with_header("ef-version", i.to_string())
                .with_header("x-other", vec![0xFE, i as u8])
            })
            .collect();
        for (i, r) in records.iter().enumerate() {
            if i == 1 {
                // As releases before format v2 stored it: both formats are read.
                let v1 = EncodedRecord(framed(&crate::codec::encode_record(r)));
                assert_eq!(v1.0[4], crate::codec::FORMAT_V1);
                b.put_log_encoded("t", 0, 1, v1);
            } else {
                b.put_log("t", 0, i as u64, r);
            }
        }
        // A frame whose checksum holds but whose payload is not a record.
        b.put(
            Table::Log,
            tagged_log_key(&topic_tag("t"), 0, 3),
            framed(b"not a record"),
        );
        s.commit(b, false).unwrap();
        let mut lent = Vec::new();
        let err = s
            .read_log_with("t", 0, 0, 10, &mut |o, r| {
                lent.push((o, r.to_record()));
                true
            })
            .unwrap_err()
            .to_string();
        assert_eq!(
            lent,
            records
                .into_iter()
                .enumerate()
                .map(|(i, r)| (i as u64, r))
                .collect::<Vec<_>>()
        );
        assert!(err.contains("table `log`"), "{err}");
        let mut first = Vec::new();
        s.read_log_with("t", 0, 1, 10, &mut |o, _| {
            first.push(o);
            false
        })
        .unwrap();
        assert_eq!(first, vec![1], "stops when the visitor returns false");
    }

    #[test]
    fn corruption_is_reported_with_table_and_key() {
        let (_dir, s) = temp();
        s.overwrite_state_raw("order", "o-9", b"garbage!").unwrap();
        let err = s.get_state("order", "o-9").unwrap_err().to_string();
        assert!(
            err.contains("table `state`") && err.contains("o-9") && err.contains("checksum"),
            "{err}"
        );
    }
}
