//! The restore barrier: a partition takes no command before its local store holds what
//! the log committed (Kafka: the changelogs replayed, see `replay`), its newest event was
//! read back, and its dedup horizon moved. Also the dedup window's sweep.

use super::Processor;
use super::phase::{Event, Phase};
use super::replay::Replay;
use crate::error::Result;
use eventfold_core::Aggregate;
use std::time::Instant;

impl<A: Aggregate> Processor<A> {
    /// The barrier: the partition takes commands only once this returns Ok (restoring
    /// after an assignment or at start, or recovering).
    pub(super) async fn restore(&mut self) -> Result<()> {
        debug_assert!(
            matches!(self.phase, Phase::Restoring | Phase::Recovering { .. }),
            "restore barrier: only a partition that takes no command restores, not {:?}",
            self.phase
        );
        let started = Instant::now();
        self.shared.set_progress(0.0);
        let p = self.cfg.partition;
        let replay = Replay {
            log: &self.log,
            topics: &self.cfg.topics,
            partition: p,
            bulk_min_records: self.cfg.bulk_min_records,
            ingesting: &self.ingesting,
            shared: &self.shared,
        };
        self.durability.restore::<A>(replay).await?;
        self.events_end = self.log.end_offset(&self.cfg.topics.events, p).await?;
        // Verify the newest event is readable: a torn or corrupt tail stops here, loudly.
        if self.events_end > 0 {
            self.log
                .read(&self.cfg.topics.events, p, self.events_end - 1, 1)
                .await?;
        }
        self.shared.set_progress(0.5);
        self.expire_dedup();
        self.shared.set_progress(1.0);
        self.transition(Event::Restored);
        tracing::debug!(
            aggregate = A::TYPE,
            partition = p,
            events = self.events_end,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "partition restored"
        );
        Ok(())
    }

    /// Moves the store's dedup horizon to the start of the window: compactions of the
    /// `dedup` table drop the records before it (no deletes: an expiry index and its
    /// sweep cost an entry per command and two tombstones per expired one). Once per
    /// window, whichever partition claims it compacts the whole table, so expired records
    /// go even where too few writes come to compact them.
    pub(super) fn expire_dedup(&self) {
        let now = self.clock.now_ms();
        let store = self.log.store();
        store.expire_dedup_before(now - self.cfg.dedup_window_ms);
        if store.claim_dedup_compaction(now, self.cfg.dedup_window_ms) {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                match store.compact_dedup() {
                    Ok(()) => tracing::info!(
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "dedup table compacted: records past the window removed"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "dedup table compaction failed; expired records stay until a later one")
                    }
                }
            });
        }
    }
}
