//! Options of the command path, shared by the runtime and the aggregate services.

use std::time::Duration;

/// Options of the command path (defaults in parentheses).
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Topic prefix and, in Kafka mode, the consumer group of the commands topics (`app`).
    pub app_id: String,
    /// This instance's id (`local`): picks the results partition it waits for outcomes of
    /// commands sent to other instances on (Kafka mode).
    pub instance_id: String,
    /// Most commands per commit unit (1024).
    pub max_batch: usize,
    /// Commands queued per partition before 503 (4096).
    pub queue_capacity: usize,
    /// Commands queued per *restoring* partition before 503 (1024).
    pub restore_queue_limit: usize,
    /// How long a caller waits for an outcome before 504 (10 s).
    pub command_timeout: Duration,
    /// `Retry-After` on 503 (1 s).
    pub retry_after: Duration,
    /// How long a command id is remembered (24 h).
    pub dedup_window: Duration,
    /// How often the dedup horizon moves on (60 s): from then on compactions of the
    /// dedup table drop the records past the window (and the whole table is compacted once
    /// per window). Expired records are ignored at once, whether dropped yet or not.
    pub dedup_sweep_every: Duration,
    /// Aggregates of one type kept in memory, over all its partitions (100,000): each
    /// partition keeps at most this divided by the partition count, beyond which it
    /// drops all but the aggregates of batches still committing. The memory it bounds is
    /// this times the size of a state (a few hundred bytes for the shop's orders).
    pub cache_limit: usize,
    /// Batches per partition whose commit may be under way at once (`None`: the log's
    /// `Log::units_in_flight`, 4 on the embedded log, 32 on Kafka): processing of the next
    /// batch overlaps with the commits of the previous ones.
    pub max_inflight_commits: Option<usize>,
    /// Kafka mode: a changelog span at least this long (records of one events or state
    /// partition not in the local store yet, e.g. on a new instance) is restored by bulk
    /// ingestion into the store instead of through its journal (50,000).
    pub restore_bulk_min_records: u64,
    /// The local store keeps an aggregate's state when a commit takes its version past a
    /// multiple of this (8); loads apply the events after the stored state (fewer than
    /// this many). 1 stores it at every commit. Kafka mode's state topic gets every state
    /// whatever this is. See `snapshot`.
    pub state_every: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            app_id: "app".into(),
            instance_id: "local".into(),
            max_batch: 1024,
            queue_capacity: 4096,
            restore_queue_limit: 1024,
            command_timeout: Duration::from_secs(10),
            retry_after: Duration::from_secs(1),
            dedup_window: Duration::from_secs(24 * 3600),
            dedup_sweep_every: Duration::from_secs(60),
            cache_limit: 100_000,
            max_inflight_commits: None,
            restore_bulk_min_records: 50_000,
            state_every: 8,
        }
    }
}
