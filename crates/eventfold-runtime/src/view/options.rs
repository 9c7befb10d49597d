//! [`ViewOptions`]: how the view processors apply and the queries scan.

use std::time::Duration;

/// Options of the view processors and queries (defaults in parentheses).
#[derive(Debug, Clone)]
pub struct ViewOptions {
    /// Most source events applied per store batch (512).
    pub max_batch_events: usize,
    /// How often a partition re-reads its source without a notification (500 ms).
    pub poll_interval: Duration,
    /// After a notification, how long a partition waits for more events before it reads
    /// (10 ms): fewer, larger store batches under load, at most this much extra lag for
    /// queries without `min_position`. A query with a `min_position` the partition has not
    /// applied yet cuts the wait short, so read-your-writes does not pay it. A partition
    /// reads again at once only after a batch of at least a quarter of `max_batch_events`
    /// (a backlog); after a smaller one it waits for the next notification and this linger
    /// too (each batch costs a read, a store batch and a checkpoint write, whatever its
    /// size).
    pub linger: Duration,
    /// Most index entries a query examines before it returns a short page with a cursor
    /// (10,000); bounds the work of post-filters.
    pub max_scanned: usize,
    /// [`rebuild`](super::rebuild): most source events read and applied as one chunk
    /// (16,384).
    pub rebuild_batch_events: usize,
    /// [`rebuild`](super::rebuild): bytes of the view (rows as JSON, index entries,
    /// unique-index owners) built in memory before it is written to the store (256 MiB,
    /// shared by the threads). A view that fits is written once, sorted; past it the
    /// memory is written early and the rebuild goes on over the store, slower.
    pub rebuild_cache_bytes: usize,
    /// [`rebuild`](super::rebuild): memory for rows kept parsed after they change (512
    /// MiB, shared by the threads, on top of `rebuild_cache_bytes`): the next event of the
    /// same entity changes such a row without parsing its JSON again. Past it the rows
    /// changed least recently are serialized. 0 keeps every row as JSON.
    pub rebuild_hot_bytes: usize,
    /// [`rebuild`](super::rebuild): threads applying events, each for its own partitions
    /// (the machine's available parallelism). Only partitioned views use more than one:
    /// the rows of a replicated view may come from any partition. Also how many
    /// partitions of a live view catch up in bulk at once.
    pub rebuild_threads: usize,
    /// A partition of a live partitioned view with no checkpoint (a new instance, a new
    /// projection version) and at least this many source events to apply catches up in
    /// bulk, like a rebuild (50,000): in memory (its share of `rebuild_cache_bytes`),
    /// written once by ingestion, its checkpoint last; its rows appear when it is done.
    pub bulk_catch_up_min_events: u64,
}

impl Default for ViewOptions {
    fn default() -> Self {
        Self {
            max_batch_events: 512,
            poll_interval: Duration::from_millis(500),
            linger: Duration::from_millis(10),
            max_scanned: 10_000,
            rebuild_batch_events: 16_384,
            rebuild_cache_bytes: 256 << 20,
            rebuild_hot_bytes: 512 << 20,
            rebuild_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            bulk_catch_up_min_events: 50_000,
        }
    }
}
