// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::key::InternalKey;
use crate::{
    value::{InternalValue, SeqNo, UserValue},
    ValueType,
};
use std::collections::{BTreeMap, VecDeque};
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

pub use crate::tree::inner::MemtableId;

/// Bytes of a key that a [`MemKey`] holds in itself (`HEAD_WORDS` words), in the memtable's node.
const HEAD_WORDS: usize = 6;
const HEAD_BYTES: usize = HEAD_WORDS * 8;

/// eventfold patch: a memtable key with its first [`HEAD_BYTES`] bytes held in the node.
///
/// `UserKey` keeps 20 bytes inline, and a longer key only its first 4 bytes beside a
/// pointer to the rest. The keys of one table often share a longer prefix (a topic or
/// type name, then an id with a common prefix), so every comparison of a skiplist search
/// followed that pointer to another allocation, usually a cache miss: `memcmp` and
/// `ByteView::cmp` were 17% of the CPU samples of eventfold's in-process command bench,
/// two thirds of its committer thread's time in the search. Here a comparison reads the
/// head words in the node; only keys longer than the head whose heads are equal compare
/// the whole keys. The order is exactly [`InternalKey`]'s (user key ascending, then seqno
/// descending); reads search with `MemKey`s too.
#[doc(hidden)]
#[derive(Clone)]
pub struct MemKey {
    /// The key's first bytes, zero-padded, as big-endian words: comparing the words in
    /// order compares the bytes in order.
    head: [u64; HEAD_WORDS],
    #[doc(hidden)]
    pub key: InternalKey,
}

impl MemKey {
    fn new(key: InternalKey) -> Self {
        let mut bytes = [0u8; HEAD_BYTES];
        let n = key.user_key.len().min(HEAD_BYTES);
        bytes[..n].copy_from_slice(&key.user_key[..n]);
        let mut head = [0u64; HEAD_WORDS];
        for (w, chunk) in head.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_be_bytes(chunk.try_into().unwrap_or_default());
        }
        Self { head, key }
    }
}

impl PartialEq for MemKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for MemKey {}

impl PartialOrd for MemKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for MemKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Heads that differ order the keys: at the first differing byte either both keys
        // have a byte there, or the shorter key (padded with 0) is a prefix of the other.
        match self.head.cmp(&other.head) {
            std::cmp::Ordering::Equal => {}
            unequal => return unequal,
        }
        let (a, b) = (self.key.user_key.len(), other.key.user_key.len());
        if a <= HEAD_BYTES || b <= HEAD_BYTES {
            // Equal heads and one key within its head: that key is a prefix of the other
            // (or both are equal), so the lengths order them; no heap read.
            a.cmp(&b).then_with(|| other.key.seqno.cmp(&self.key.seqno))
        } else {
            self.key.cmp(&other.key)
        }
    }
}

/// The memtable serves as an intermediary, ephemeral, sorted storage for new items
///
/// When the Memtable exceeds some size, it should be flushed to a table.
pub struct Memtable {
    #[doc(hidden)]
    pub id: MemtableId,

    /// The actual content.
    ///
    /// eventfold patch: a B-tree under a read-write lock instead of a lock-free skiplist,
    /// keyed by [`MemKey`], which holds the first bytes of the key in the node. A skiplist
    /// search visits about 2 log2(n) nodes, each in its own allocation: with a 64 MiB
    /// memtable (hundreds of thousands of keys) nearly every visit was a cache miss, and
    /// the searches of inserts and point reads were 23% of the CPU samples of eventfold's
    /// in-process command bench. A B-tree search reads about log6(n) nodes whose keys sit
    /// side by side. Writers hold the lock for one insert, readers for one point read or
    /// one chunk of an iteration ([`ChunkedRange`]), so neither waits long for the other.
    items: RwLock<BTreeMap<MemKey, UserValue>>,

    /// Approximate active memtable size.
    ///
    /// If this grows too large, a flush is triggered.
    pub(crate) approximate_size: AtomicU64,

    /// Highest encountered sequence number.
    ///
    /// This is used so that `get_highest_seqno` has O(1) complexity.
    pub(crate) highest_seqno: AtomicU64,

    pub(crate) requested_rotation: AtomicBool,

    /// eventfold patch: a Bloom filter of the user keys, built at the first point read
    /// (see [`KeyFilter`]); none in memtables that only ever see range reads.
    filter: OnceLock<KeyFilter>,
}

impl Memtable {
    /// Returns the memtable ID.
    pub fn id(&self) -> MemtableId {
        self.id
    }

    /// Returns `true` if the memtable was already flagged for rotation.
    pub fn is_flagged_for_rotation(&self) -> bool {
        self.requested_rotation
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Flags the memtable as requested for rotation.
    pub fn flag_rotated(&self) {
        self.requested_rotation
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    #[doc(hidden)]
    #[must_use]
    pub fn new(id: MemtableId) -> Self {
        Self {
            id,
            items: RwLock::default(),
            approximate_size: AtomicU64::default(),
            highest_seqno: AtomicU64::default(),
            requested_rotation: AtomicBool::default(),
            filter: OnceLock::new(),
        }
    }

    /// Creates an iterator over all items.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = InternalValue> + '_ {
        ChunkedRange::new(&self.items, Bound::Unbounded, Bound::Unbounded)
    }

    /// Creates an iterator over a range of items.
    pub(crate) fn range<'a, R: RangeBounds<InternalKey> + 'a>(
        &'a self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = InternalValue> + 'a {
        // eventfold patch: searched by `MemKey`s, which compare without reading the
        // nodes' heap keys.
        let bound = |b: Bound<&InternalKey>| b.map(|k| MemKey::new(k.clone()));
        ChunkedRange::new(
            &self.items,
            bound(range.start_bound()),
            bound(range.end_bound()),
        )
    }

    /// Returns the item by key if it exists.
    ///
    /// The item with the highest seqno will be returned, if `seqno` is None.
    #[doc(hidden)]
    pub fn get(&self, key: &[u8], seqno: SeqNo) -> Option<InternalValue> {
        if seqno == 0 {
            return None;
        }

        // NOTE: This range start deserves some explanation...
        // InternalKeys are multi-sorted by 2 categories: user_key and Reverse(seqno). (tombstone doesn't really matter)
        // We search for the lowest entry that is greater or equal the user's prefix key
        // and has the seqno (or lower) we want (because the seqno is stored in reverse order)
        //
        // Example: We search for "abc"
        //
        // key -> seqno
        //
        // a   -> 7
        // abc -> 5 <<< This is the lowest key (highest seqno) that matches the key with seqno=None
        // abc -> 4
        // abc -> 3 <<< If searching for abc and seqno=4, we would get this
        // abcdef -> 6
        // abcdef -> 5
        //
        // eventfold patch: a key the filter has not seen is not here; the filter answers
        // with one cache line where the B-tree search reads a node per level.
        if !self.filter().may_contain(key) {
            return None;
        }

        let lower_bound = MemKey::new(InternalKey::new(key, seqno - 1, ValueType::Value));

        let items = read(&self.items);
        let (found, value) = items.range(lower_bound..).next()?;
        (&*found.key.user_key == key).then(|| InternalValue {
            key: found.key.clone(),
            value: value.clone(),
        })
    }

    /// Gets approximate size of memtable in bytes.
    pub fn size(&self) -> u64 {
        self.approximate_size
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts the number of items in the memtable.
    pub fn len(&self) -> usize {
        read(&self.items).len()
    }

    /// Returns `true` if the memtable is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        read(&self.items).is_empty()
    }

    /// Inserts an item into the memtable
    #[doc(hidden)]
    pub fn insert(&self, item: InternalValue) -> (u64, u64) {
        #[expect(
            clippy::expect_used,
            reason = "keys are limited to 16-bit length + values are limited to 32-bit length"
        )]
        let item_size =
            (item.key.user_key.len() + item.value.len() + std::mem::size_of::<InternalValue>())
                .try_into()
                .expect("should fit into u64");

        let size_before = self
            .approximate_size
            .fetch_add(item_size, std::sync::atomic::Ordering::AcqRel);

        let value_type = item.key.value_type;
        let key = InternalKey::new(item.key.user_key, item.key.seqno, value_type);
        let mut items = write(&self.items);
        // eventfold patch: under the write lock, which the filter's construction takes
        // too: a key is either in the B-tree when the filter is built from it, or added to
        // the filter here.
        if let Some(filter) = self.filter.get() {
            filter.insert(&key.user_key);
        }
        // eventfold patch: a key written twice with one seqno (twice in one batch) keeps
        // the last write, its value type included. `BTreeMap::insert` would keep the first
        // key and only replace the value: a tombstone's empty value under a `Value` key.
        // The skiplist replaced the whole entry.
        match items.entry(MemKey::new(key)) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(item.value);
            }
            std::collections::btree_map::Entry::Occupied(slot) => {
                let (mut key, _) = slot.remove_entry();
                key.key.value_type = value_type;
                items.insert(key, item.value);
            }
        }
        drop(items);

        self.highest_seqno
            .fetch_max(item.key.seqno, std::sync::atomic::Ordering::AcqRel);

        (item_size, size_before + item_size)
    }

    /// eventfold patch: the key filter, built from the keys in the memtable at the first
    /// call (under the write lock, so that no insert slips between the keys it reads and
    /// the filter taking over).
    fn filter(&self) -> &KeyFilter {
        if let Some(filter) = self.filter.get() {
            return filter;
        }
        let items = write(&self.items);
        let filter = self.filter.get_or_init(|| {
            let filter = KeyFilter::new();
            for key in items.keys() {
                filter.insert(&key.key.user_key);
            }
            filter
        });
        drop(items);
        filter
    }

    /// Returns the highest sequence number in the memtable.
    pub fn get_highest_seqno(&self) -> Option<SeqNo> {
        if self.is_empty() {
            None
        } else {
            Some(
                self.highest_seqno
                    .load(std::sync::atomic::Ordering::Acquire),
            )
        }
    }
}

/// eventfold patch: the read lock of a memtable's items; a panic elsewhere cannot leave the
/// B-tree half-changed (`BTreeMap::insert` either inserts or unwinds before touching it),
/// so a poisoned lock is used as is (by [`write`] too).
fn read(
    items: &RwLock<BTreeMap<MemKey, UserValue>>,
) -> std::sync::RwLockReadGuard<'_, BTreeMap<MemKey, UserValue>> {
    items
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// eventfold patch: the write lock of a memtable's items (see [`read`]).
fn write(
    items: &RwLock<BTreeMap<MemKey, UserValue>>,
) -> std::sync::RwLockWriteGuard<'_, BTreeMap<MemKey, UserValue>> {
    items
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Entries an iterator copies out at its first read lock at an end: a short scan (a
/// query's page, the last key of a prefix) copies little.
const FIRST_CHUNK: usize = 16;
/// The most it copies per read lock; each chunk at an end is twice the one before.
const MAX_CHUNK: usize = 256;

/// eventfold patch: an iterator over a range of a memtable that holds the read lock only
/// while it copies the next chunk of entries at one end (16 first, doubling up to 256),
/// never between calls. Each end resumes after the last key it took, and the two ends
/// never take a key twice: a chunk is taken from the range between the keys already taken
/// at either end. As with the skiplist's iterators, entries inserted concurrently may or
/// may not be seen; readers filter by seqno anyway.
struct ChunkedRange<'a> {
    items: &'a RwLock<BTreeMap<MemKey, UserValue>>,
    /// What has not been copied out yet lies between these bounds.
    lo: Bound<MemKey>,
    hi: Bound<MemKey>,
    /// Copied out at the front, ascending.
    front: VecDeque<InternalValue>,
    /// Copied out at the back, ascending (the next item from the back is the last).
    back: VecDeque<InternalValue>,
    /// The size of the next chunk at the front and at the back.
    front_chunk: usize,
    back_chunk: usize,
    /// No entry is left between `lo` and `hi`.
    drained: bool,
}

impl<'a> ChunkedRange<'a> {
    fn new(
        items: &'a RwLock<BTreeMap<MemKey, UserValue>>,
        lo: Bound<MemKey>,
        hi: Bound<MemKey>,
    ) -> Self {
        // A range whose start lies after its end is empty (`BTreeMap::range` would panic).
        let drained = match (&lo, &hi) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
            | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
            _ => false,
        };
        Self {
            items,
            lo,
            hi,
            front: VecDeque::new(),
            back: VecDeque::new(),
            front_chunk: FIRST_CHUNK,
            back_chunk: FIRST_CHUNK,
            drained,
        }
    }

    /// Copies the next chunk at the front (`from_back` false) or the back.
    fn refill(&mut self, from_back: bool) {
        if self.drained {
            return;
        }
        let items = read(self.items);
        let range = items.range((self.lo.clone(), self.hi.clone()));
        let copy = |(k, v): (&MemKey, &UserValue)| InternalValue {
            key: k.key.clone(),
            value: v.clone(),
        };
        let (taken, chunk) = if from_back {
            (&mut self.back, &mut self.back_chunk)
        } else {
            (&mut self.front, &mut self.front_chunk)
        };
        let want = *chunk;
        *chunk = (want * 2).min(MAX_CHUNK);
        let before = taken.len();
        if from_back {
            for kv in range.rev().take(want) {
                taken.push_front(copy(kv));
            }
        } else {
            for kv in range.take(want) {
                taken.push_back(copy(kv));
            }
        }
        if taken.len() - before < want {
            // Fewer than asked for: the range is copied out entirely.
            self.drained = true;
            return;
        }
        // The key taken last at this end bounds what is left.
        if from_back {
            let last = taken.front().map(|v| MemKey::new(v.key.clone()));
            self.hi = last.map_or(Bound::Unbounded, Bound::Excluded);
        } else {
            let last = taken.back().map(|v| MemKey::new(v.key.clone()));
            self.lo = last.map_or(Bound::Unbounded, Bound::Excluded);
        }
    }
}

impl Iterator for ChunkedRange<'_> {
    type Item = InternalValue;

    fn next(&mut self) -> Option<InternalValue> {
        if self.front.is_empty() {
            self.refill(false);
        }
        self.front.pop_front().or_else(|| self.back.pop_front())
    }
}

impl DoubleEndedIterator for ChunkedRange<'_> {
    fn next_back(&mut self) -> Option<InternalValue> {
        if self.back.is_empty() {
            self.refill(true);
        }
        self.back.pop_back().or_else(|| self.front.pop_back())
    }
}

/// eventfold patch: a blocked Bloom filter of a memtable's user keys, so that a point read
/// of a key the memtable does not hold (the state of a new aggregate, the dedup record of
/// a new command) costs one cache line instead of a B-tree search: those searches were
/// about 6% of the CPU samples of eventfold's in-process command bench. A key sets
/// [`FILTER_PROBES`] bits in one 64-byte block. It is built at a memtable's first point
/// read, so memtables only read by ranges (the log, the per-entity index) never pay for
/// it. 512 KiB: a 64 MiB memtable of the `state` table holds about 200,000 keys, about
/// 20 bits per key (a false positive costs only the B-tree search it would have done).
struct KeyFilter {
    words: Box<[AtomicU64]>,
}

/// Bits a key sets (and a read tests) in its block.
const FILTER_PROBES: u32 = 5;
/// 64-byte blocks of the filter (a power of two).
const FILTER_BLOCKS: usize = 8_192;

impl KeyFilter {
    fn new() -> Self {
        Self {
            words: (0..FILTER_BLOCKS * 8).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The key's block (its first word's index) and the bits it sets there: each probe
    /// takes 9 bits of the hash (a bit of 512), the block its top 13 bits.
    fn probes(key: &[u8]) -> (usize, u64) {
        let hash = crate::hash::hash64(key);
        #[expect(clippy::cast_possible_truncation, reason = "13 bits")]
        let block = (hash >> (64 - 13)) as usize & (FILTER_BLOCKS - 1);
        (block * 8, hash)
    }

    fn bit(hash: u64, probe: u32) -> (usize, u64) {
        #[expect(clippy::cast_possible_truncation, reason = "9 bits")]
        let bit = (hash >> (probe * 9)) as usize & 511;
        (bit / 64, 1 << (bit % 64))
    }

    fn insert(&self, key: &[u8]) {
        let (block, hash) = Self::probes(key);
        for probe in 0..FILTER_PROBES {
            let (word, mask) = Self::bit(hash, probe);
            // Relaxed: a reader sees an insert through the seqno it reads at, which is
            // published after the insert (and its filter bits).
            self.words[block + word].fetch_or(mask, Ordering::Relaxed);
        }
    }

    fn may_contain(&self, key: &[u8]) -> bool {
        let (block, hash) = Self::probes(key);
        (0..FILTER_PROBES).all(|probe| {
            let (word, mask) = Self::bit(hash, probe);
            self.words[block + word].load(Ordering::Relaxed) & mask != 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ValueType;
    use test_log::test;

    #[test]
    #[expect(clippy::unwrap_used)]
    fn memtable_mvcc_point_read() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            *b"hello-key-999991",
            *b"hello-value-999991",
            0,
            ValueType::Value,
        ));

        let item = memtable.get(b"hello-key-99999", SeqNo::MAX);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", SeqNo::MAX);
        assert_eq!(*b"hello-value-999991", &*item.unwrap().value);

        memtable.insert(InternalValue::from_components(
            *b"hello-key-999991",
            *b"hello-value-999991-2",
            1,
            ValueType::Value,
        ));

        let item = memtable.get(b"hello-key-99999", SeqNo::MAX);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", SeqNo::MAX);
        assert_eq!((*b"hello-value-999991-2"), &*item.unwrap().value);

        let item = memtable.get(b"hello-key-99999", 1);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", 1);
        assert_eq!((*b"hello-value-999991"), &*item.unwrap().value);

        let item = memtable.get(b"hello-key-99999", 2);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", 2);
        assert_eq!((*b"hello-value-999991-2"), &*item.unwrap().value);
    }

    #[test]
    fn memtable_get() {
        let memtable = Memtable::new(0);

        let value =
            InternalValue::from_components(b"abc".to_vec(), b"abc".to_vec(), 0, ValueType::Value);

        memtable.insert(value.clone());

        assert_eq!(Some(value), memtable.get(b"abc", SeqNo::MAX));
    }

    #[test]
    fn memtable_get_highest_seqno() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            0,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            1,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            2,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            3,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            4,
            ValueType::Value,
        ));

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                4,
                ValueType::Value,
            )),
            memtable.get(b"abc", SeqNo::MAX)
        );
    }

    #[test]
    fn memtable_get_prefix() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            b"abc0".to_vec(),
            b"abc".to_vec(),
            0,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            255,
            ValueType::Value,
        ));

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                255,
                ValueType::Value,
            )),
            memtable.get(b"abc", SeqNo::MAX)
        );

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc0".to_vec(),
                b"abc".to_vec(),
                0,
                ValueType::Value,
            )),
            memtable.get(b"abc0", SeqNo::MAX)
        );
    }

    #[test]
    fn memtable_get_old_version() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            0,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            99,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            255,
            ValueType::Value,
        ));

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                255,
                ValueType::Value,
            )),
            memtable.get(b"abc", SeqNo::MAX)
        );

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                99,
                ValueType::Value,
            )),
            memtable.get(b"abc", 100)
        );

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                0,
                ValueType::Value,
            )),
            memtable.get(b"abc", 50)
        );
    }
}
