// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

//! eventfold patch: a blocked Bloom filter, every bit of a key in one 64-byte block.
//!
//! The standard filter spreads a key's bits over the whole filter, so a lookup that
//! misses reads about two random cache lines per table and one that hits `k` of them. A
//! point read that misses probes the filter of every L0 table and of one table per level
//! below (eventfold looks up the state of every new aggregate): those probes were 6.1% of
//! the CPU samples of eventfold's in-process command bench sustained for 40 seconds. Here
//! a key reads one cache line per table, for a slightly higher false positive rate at the
//! same size (100,000 keys at 10 bits per key: 0.97% against 0.84%).
//!
//! Layout: `MAGIC_BYTES`, filter type (`FilterType::Blocked`), hash type (0), the number of
//! blocks and the number of bits per key (`k`) as little-endian u64s, then the blocks. The
//! block of a key hash is `hash * blocks >> 64`; its bits are `k` 9-bit fields of a 64-bit
//! remix of the hash (so `k` is at most 7). Readers tell the filter types apart by the type
//! byte, so tables written before this change keep their standard filters.
//!
//! On disk: a table writer with a full filter writes the standard filter in the `filter`
//! section, as upstream does, and this one in the [`SECTION`] section after it. This
//! crate's reader prefers the blocked one (`ParsedRegions::parse_from_toc`); upstream's
//! reader looks sections up by name and never reads it, so the table stays readable by
//! lsm-tree 3.1.10 (eventfold's `vendor/compat` test checks it). Tables written by an
//! earlier build of this change hold a blocked filter in the `filter` section: this crate
//! still reads them, upstream refuses them until a compaction has rewritten them.

use super::FilterType;
use crate::file::MAGIC_BYTES;

/// The table file section that holds the blocked filter, beside upstream's `filter`.
pub const SECTION: &[u8] = b"eventfold_blocked_filter";

/// Bytes per block: one cache line.
const BLOCK_BYTES: usize = 64;

/// Bits per block.
const BLOCK_BITS: u64 = (BLOCK_BYTES * 8) as u64;

/// The most bits per key: 9-bit fields of a 64-bit word.
const MAX_K: usize = 7;

/// Header bytes: magic, filter type, hash type, block count, k.
const HEADER_BYTES: usize = MAGIC_BYTES.len() + 2 + 8 + 8;

/// The block of `hash` among `blocks` (a multiply-shift, no division).
#[expect(
    clippy::cast_possible_truncation,
    reason = "the product shifted by 64 is below `blocks`, a usize"
)]
fn block_of(hash: u64, blocks: usize) -> usize {
    ((u128::from(hash) * blocks as u128) >> 64) as usize
}

/// The word whose 9-bit fields are the key's bits in its block: a 64-bit finalizer
/// (splitmix64's), so that they do not follow from the block (the hash's high bits).
fn bits_of(hash: u64) -> u64 {
    let mut x = hash;
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Builds a blocked filter from key hashes.
#[derive(Debug)]
pub struct Builder {
    blocks: Vec<[u64; 8]>,
    k: usize,
}

impl Builder {
    /// A filter for `n` keys with `bits_per_key` bits each (rounded up to whole blocks).
    #[must_use]
    pub fn with_bpk(n: usize, bits_per_key: f32) -> Self {
        let bits_per_key = bits_per_key.max(1.0);
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a filter's bit count fits a usize; the estimate need not be exact"
        )]
        let bits = (n.max(1) as f32 * bits_per_key).ceil() as usize;
        let blocks = bits.div_ceil(BLOCK_BYTES * 8).max(1);
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "k is between 1 and MAX_K"
        )]
        let k = ((bits_per_key * std::f32::consts::LN_2).round() as usize).clamp(1, MAX_K);
        Self {
            blocks: vec![[0; 8]; blocks],
            k,
        }
    }

    /// A filter for `n` keys with about `fpr` false positives: the bits a standard filter
    /// needs for it, a fifth more (a blocked filter's bits are less evenly used).
    #[must_use]
    pub fn with_fp_rate(n: usize, fpr: f32) -> Self {
        let n = n.max(1);
        let bits = super::standard_bloom::Builder::calculate_m(n, fpr.clamp(0.000_000_1, 0.5));
        #[expect(clippy::cast_precision_loss, reason = "bits per key need not be exact")]
        Self::with_bpk(n, bits as f32 / n as f32 * 1.2)
    }

    /// Adds a key by its hash (`standard_bloom::Builder::get_hash`).
    pub fn set_with_hash(&mut self, hash: u64) {
        let at = block_of(hash, self.blocks.len());
        let block = &mut self.blocks[at];
        let bits = bits_of(hash);
        for j in 0..self.k {
            let bit = (bits >> (9 * j)) % BLOCK_BITS;
            block[(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    /// The filter's bytes.
    #[must_use]
    pub fn build(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_BYTES + self.blocks.len() * BLOCK_BYTES);
        v.extend_from_slice(&MAGIC_BYTES);
        v.push(FilterType::Blocked.into());
        v.push(0);
        v.extend_from_slice(&(self.blocks.len() as u64).to_le_bytes());
        v.extend_from_slice(&(self.k as u64).to_le_bytes());
        for block in &self.blocks {
            for word in block {
                v.extend_from_slice(&word.to_le_bytes());
            }
        }
        v
    }
}

/// Reads a blocked filter in place.
#[derive(Debug)]
pub struct Reader<'a> {
    blocks: &'a [u8],
    k: usize,
}

impl<'a> Reader<'a> {
    /// Parses the header of a blocked filter.
    pub fn new(bytes: &'a [u8]) -> crate::Result<Self> {
        let header = bytes
            .get(..HEADER_BYTES)
            .ok_or(crate::Error::InvalidHeader("BlockedBloomFilter"))?;
        if header[..MAGIC_BYTES.len()] != MAGIC_BYTES {
            return Err(crate::Error::InvalidHeader("BlockedBloomFilter"));
        }
        let at = MAGIC_BYTES.len();
        if FilterType::try_from(header[at])? != FilterType::Blocked || header[at + 1] != 0 {
            return Err(crate::Error::InvalidHeader("BlockedBloomFilter"));
        }
        let word = |from: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&header[from..from + 8]);
            u64::from_le_bytes(w)
        };
        let (blocks, k) = (word(at + 2), word(at + 10));
        let blocks = usize::try_from(blocks)
            .map_err(|_| crate::Error::InvalidHeader("BlockedBloomFilter"))?;
        let body = &bytes[HEADER_BYTES..];
        if blocks == 0
            || !(1..=MAX_K as u64).contains(&k)
            || blocks.checked_mul(BLOCK_BYTES) != Some(body.len())
        {
            return Err(crate::Error::InvalidHeader("BlockedBloomFilter"));
        }
        #[expect(clippy::cast_possible_truncation, reason = "k is at most MAX_K")]
        Ok(Self {
            blocks: body,
            k: k as usize,
        })
    }

    /// The block that holds the bits of `hash`.
    fn block(&self, hash: u64) -> &'a [u8] {
        let block = block_of(hash, self.blocks.len() / BLOCK_BYTES) * BLOCK_BYTES;
        &self.blocks[block..block + BLOCK_BYTES]
    }

    /// Asks the CPU to load the block of `hash` into its cache, without waiting for it:
    /// a point read that misses probes the filters of several tables, and their blocks,
    /// each usually a cache miss, then load side by side instead of one after the other.
    pub fn prefetch_hash(&self, hash: u64) {
        crate::prefetch::read(self.block(hash).as_ptr());
    }

    /// `false` only if the key of `hash` was never added.
    #[must_use]
    pub fn contains_hash(&self, hash: u64) -> bool {
        let block = self.block(hash);
        let bits = bits_of(hash);
        (0..self.k).all(|j| {
            #[expect(clippy::cast_possible_truncation, reason = "below BLOCK_BITS")]
            let bit = ((bits >> (9 * j)) % BLOCK_BITS) as usize;
            block[bit / 8] & (1 << (bit % 8)) != 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::filter::standard_bloom::Builder as Standard;
    use crate::table::filter::{block::FilterBlock, BloomConstructionPolicy};
    use crate::table::Block;

    fn key(i: u64) -> Vec<u8> {
        format!("order\0o-{}-{i}", i % 1024).into_bytes()
    }

    #[test]
    fn every_added_key_is_found_and_few_others_are() -> crate::Result<()> {
        let n = 100_000u64;
        let mut b = Builder::with_bpk(n as usize, 10.0);
        for i in 0..n {
            b.set_with_hash(Standard::get_hash(&key(i)));
        }
        let bytes = b.build();
        let r = Reader::new(&bytes)?;
        assert!((0..n).all(|i| r.contains_hash(Standard::get_hash(&key(i)))));
        let false_positives = (n..2 * n)
            .filter(|i| r.contains_hash(Standard::get_hash(&key(*i))))
            .count();
        // 967 (0.97%) when written; a standard filter of the same size: 837.
        assert!(
            false_positives < 2_000,
            "{false_positives} false positives in {n}"
        );
        assert!(
            false_positives > 100,
            "{false_positives} false positives: bits unused?"
        );
        Ok(())
    }

    #[test]
    fn fp_rate_policy_sizes_the_filter() {
        let b = Builder::with_fp_rate(1_000, 0.01);
        // 9.6 bits per key for 1%, a fifth more: 11.5 bits, 23 blocks.
        assert_eq!((b.blocks.len(), b.k), (23, 7));
        let tiny = Builder::with_bpk(0, 10.0);
        assert_eq!(tiny.blocks.len(), 1);
    }

    #[test]
    fn corrupt_headers_are_refused() {
        let mut b = Builder::with_bpk(10, 10.0);
        b.set_with_hash(7);
        let bytes = b.build();
        assert!(Reader::new(&bytes).is_ok());
        assert!(Reader::new(&bytes[..bytes.len() - 1]).is_err());
        assert!(Reader::new(&bytes[..HEADER_BYTES - 1]).is_err());
        let mut bad_k = bytes.clone();
        bad_k[MAGIC_BYTES.len() + 10] = 9;
        assert!(Reader::new(&bad_k).is_err());
        let mut bad_magic = bytes;
        bad_magic[0] ^= 1;
        assert!(Reader::new(&bad_magic).is_err());
    }

    /// A table keeps upstream's standard filter in its `filter` section, which is what
    /// lsm-tree 3.1.10 reads, and the blocked one in [`SECTION`], which this crate reads.
    #[test]
    fn a_table_holds_the_standard_filter_for_upstream_and_the_blocked_one_for_reads(
    ) -> crate::Result<()> {
        use crate::table::{regions::ParsedRegions, Writer};
        use crate::{CompressionType, InternalValue, ValueType};

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("table");
        let keys: Vec<Vec<u8>> = (0..1_000u64)
            .map(|i| format!("state\0{i:06}").into_bytes())
            .collect();
        let mut writer = Writer::new(path.clone(), 0, 0)?;
        for k in &keys {
            writer.write(InternalValue::from_components(
                k.clone(),
                b"v".to_vec(),
                0,
                ValueType::Value,
            ))?;
        }
        assert!(writer.finish()?.is_some());

        let mut file = std::fs::File::open(&path)?;
        let toc = sfa::Reader::from_reader(&mut file)?;
        let toc = toc.toc();
        let section = |name: &[u8]| -> crate::Result<Vec<u8>> {
            let entry = toc.section(name).expect("section is written");
            let handle = crate::table::BlockHandle::new(
                crate::table::BlockOffset(entry.pos()),
                u32::try_from(entry.len()).expect("small section"),
            );
            Ok(Block::from_file(&file, handle, CompressionType::None)?.data.to_vec())
        };
        let standard = section(b"filter")?;
        let blocked = section(SECTION)?;
        let type_byte = MAGIC_BYTES.len();
        assert_eq!(standard[type_byte], u8::from(FilterType::StandardBloom));
        assert_eq!(blocked[type_byte], u8::from(FilterType::Blocked));

        // Upstream's reader, unchanged by the patches, finds every key in `filter`.
        let upstream = crate::table::filter::standard_bloom::StandardBloomFilterReader::new(
            &standard,
        )?;
        assert!(keys.iter().all(|k| upstream.contains_hash(Standard::get_hash(k))));
        let reader = Reader::new(&blocked)?;
        assert!(keys.iter().all(|k| reader.contains_hash(Standard::get_hash(k))));

        // This crate's reader takes the blocked one.
        let regions = ParsedRegions::parse_from_toc(toc)?;
        let chosen = regions.filter.expect("a filter");
        assert_eq!(*chosen.offset(), toc.section(SECTION).expect("written").pos());
        Ok(())
    }

    /// A filter block answers with the filter its type byte names: tables written before
    /// the blocked filter keep their standard ones.
    #[test]
    fn filter_blocks_of_both_types_answer() -> crate::Result<()> {
        let keys: Vec<Vec<u8>> = (0..1_000).map(key).collect();
        let mut standard = BloomConstructionPolicy::BitsPerKey(10.0).init(keys.len());
        let mut blocked = Builder::with_bpk(keys.len(), 10.0);
        for k in &keys {
            standard.set_with_hash(Standard::get_hash(k));
            blocked.set_with_hash(Standard::get_hash(k));
        }
        for bytes in [standard.build(), blocked.build()] {
            let block = FilterBlock::new(Block {
                header: crate::table::block::Header {
                    block_type: crate::table::block::BlockType::Filter,
                    checksum: crate::Checksum::from_raw(0),
                    data_length: bytes.len() as u32,
                    uncompressed_length: bytes.len() as u32,
                },
                data: bytes.into(),
            });
            for k in &keys {
                assert!(block.maybe_contains_hash(Standard::get_hash(k))?);
            }
            let absent = (1_000..2_000)
                .filter(|i| {
                    block
                        .maybe_contains_hash(Standard::get_hash(&key(*i)))
                        .unwrap_or(true)
                })
                .count();
            assert!(absent < 50, "{absent} of 1000 absent keys pass");
        }
        Ok(())
    }
}
