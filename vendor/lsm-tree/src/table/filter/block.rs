// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::table::{filter::standard_bloom::StandardBloomFilterReader, Block};

#[derive(Clone)]
pub struct FilterBlock(Block);

impl FilterBlock {
    #[must_use]
    pub fn new(block: Block) -> Self {
        Self(block)
    }

    /// eventfold patch: starts loading the cache line that [`Self::maybe_contains_hash`]
    /// will read for `hash` (blocked filters only; a filter that does not parse is left to
    /// that call to report).
    pub fn prefetch_hash(&self, hash: u64) {
        if self.is_blocked() {
            if let Ok(reader) = super::blocked::Reader::new(&self.0.data) {
                reader.prefetch_hash(hash);
            }
        }
    }

    /// eventfold patch: the filter type byte picks the reader (blocked filters since
    /// eventfold's lsm-tree change 7; tables written before keep standard ones).
    fn is_blocked(&self) -> bool {
        let filter_type = self.0.data.get(crate::file::MAGIC_BYTES.len()).copied();
        filter_type == Some(u8::from(super::FilterType::Blocked))
    }

    pub fn maybe_contains_hash(&self, hash: u64) -> crate::Result<bool> {
        if self.is_blocked() {
            return Ok(super::blocked::Reader::new(&self.0.data)?.contains_hash(hash));
        }
        Ok(StandardBloomFilterReader::new(&self.0.data)?.contains_hash(hash))
    }

    /// Returns the block size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.0.size()
    }
}
