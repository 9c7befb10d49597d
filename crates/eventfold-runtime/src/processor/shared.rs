//! What a partition's processor publishes to the service and the group dispatcher:
//! its state, restore progress, failure, consumed offset and cache size, read lock-free
//! on the request path.

use crate::command::PartitionState;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

/// Partition status shared with the service (lock-free reads on the request path).
#[derive(Debug, Default)]
pub(crate) struct PartitionShared {
    state: AtomicU8,
    /// The next commands-topic offset to consume (committed or in flight), plus one; 0:
    /// unknown (not owned, or no consumer group).
    consumed: AtomicU64,
    progress_permille: AtomicU32,
    failure: Mutex<Option<String>>,
    /// Aggregates the processor keeps in memory (`RuntimeOptions::cache_limit`).
    cached: AtomicU64,
}

impl PartitionShared {
    pub fn state(&self) -> PartitionState {
        match self.state.load(Ordering::Acquire) {
            0 => PartitionState::Restoring,
            1 => PartitionState::Ready,
            3 => PartitionState::Remote,
            _ => PartitionState::Failed,
        }
    }
    pub(super) fn set_state(&self, s: PartitionState) {
        let v = match s {
            PartitionState::Restoring => 0,
            PartitionState::Ready => 1,
            PartitionState::Failed => 2,
            PartitionState::Remote => 3,
        };
        self.state.store(v, Ordering::Release);
    }
    pub fn progress(&self) -> f64 {
        f64::from(self.progress_permille.load(Ordering::Relaxed)) / 1000.0
    }
    pub(super) fn set_progress(&self, fraction: f64) {
        self.progress_permille
            .store((fraction.clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
    }
    /// Aggregates the processor keeps in memory.
    pub fn cached(&self) -> u64 {
        self.cached.load(Ordering::Relaxed)
    }
    pub(super) fn set_cached(&self, n: usize) {
        self.cached.store(n as u64, Ordering::Relaxed);
    }
    /// The next commands-topic offset this partition consumes, when it is known here.
    pub fn consumed(&self) -> Option<u64> {
        self.consumed.load(Ordering::Relaxed).checked_sub(1)
    }
    /// Publishes the next commands-topic offset to consume (`None`: unknown here).
    pub(super) fn set_consumed(&self, next: Option<u64>) {
        self.consumed.store(next.map_or(0, |n| n + 1), Ordering::Relaxed);
    }

    /// Marks the partition restoring (its assignment is on the way to the processor).
    pub fn restoring(&self) {
        self.set_progress(0.0);
        self.set_state(PartitionState::Restoring);
    }
    pub fn failure(&self) -> String {
        self.failure.lock().expect("not poisoned").clone().unwrap_or_default()
    }
    pub(super) fn set_failure(&self, reason: Option<String>) {
        *self.failure.lock().expect("not poisoned") = reason;
    }
}
