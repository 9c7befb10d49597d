//! Errors of the command path. Each variant maps to one HTTP status in eventfold-http.

use std::time::Duration;

/// Why a command or read could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No aggregate type of that name is registered (404).
    #[error("unknown aggregate type `{0}`")]
    UnknownAggregate(String),
    /// The body is not a valid command (400).
    #[error(transparent)]
    BadCommand(#[from] eventfold_core::Error),
    /// The aggregate id or a header is invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// `If-Match` named another version than the current one (412).
    #[error("version mismatch: expected version {expected}, but aggregate is at version {actual}")]
    VersionMismatch {
        /// The version `If-Match` named.
        expected: u64,
        /// The aggregate's current version.
        actual: u64,
    },
    /// The partition is restoring and its wait queue is full (503).
    #[error("partition {partition} of `{aggregate}` is restoring ({progress_pct:.0}% done); retry shortly")]
    Restoring {
        /// The aggregate type.
        aggregate: String,
        /// The partition.
        partition: u32,
        /// How far the restore is, 0 to 100.
        progress_pct: f64,
        /// The `Retry-After` to answer with.
        retry_after: Duration,
    },
    /// The partition's queue is full (503).
    #[error("partition {partition} of `{aggregate}` is overloaded ({queued} commands queued); retry shortly")]
    Overloaded {
        /// The aggregate type.
        aggregate: String,
        /// The partition.
        partition: u32,
        /// Commands in the partition's queue.
        queued: usize,
        /// The `Retry-After` to answer with.
        retry_after: Duration,
    },
    /// The partition stopped after a fatal error, e.g. a corrupt stored record (500).
    #[error("partition {partition} of `{aggregate}` has stopped: {reason}")]
    PartitionFailed {
        /// The aggregate type.
        aggregate: String,
        /// The partition.
        partition: u32,
        /// The fatal error, as text.
        reason: String,
    },
    /// No outcome in time; retrying with the same idempotency key is safe (504).
    #[error("no outcome within {0:?}; retry with the same Idempotency-Key to get the outcome")]
    Timeout(Duration),
    /// A stored record is corrupt (500): it failed the store's checksum, or what it holds
    /// (an event, a state, a view row) does not decode. The partition or view that meets
    /// it stops.
    #[error("corrupt record in table `{table}` at key {key}: {reason}")]
    Corrupt {
        /// The store table, e.g. `log`, `state`, `process`.
        table: &'static str,
        /// The record's key; a log record's as `topic/partition@offset`.
        key: String,
        /// What failed (checksum, framing or decoding).
        reason: String,
    },
    /// Storage failed (500); a corrupt record is [`Error::Corrupt`] instead.
    #[error(transparent)]
    Store(eventfold_store::Error),
    /// The log failed to commit (500); nothing of the batch was written.
    #[error(transparent)]
    Log(#[from] eventfold_log::Error),
    /// Another instance owns the partition and it could not be reached (503).
    #[error("partition {partition} of `{aggregate}` is owned by another instance; retry shortly")]
    NotOwner {
        /// The aggregate type.
        aggregate: String,
        /// The partition.
        partition: u32,
    },
    /// The log cannot take the command now, e.g. the Kafka broker does not answer (503).
    #[error("cannot hand the command to its partition's owner: {0}; retry shortly")]
    Unavailable(String),
    /// The runtime is shutting down (503).
    #[error("the service is shutting down")]
    ShuttingDown,
    /// No view of that name is registered (404).
    #[error("unknown view `{0}`")]
    UnknownView(String),
    /// No process manager of that name is registered (404).
    #[error("unknown process manager `{0}`")]
    UnknownProcessManager(String),
    /// The view did not apply the requested position in time (504); `position` is how far
    /// it got.
    #[error("view `{view}` did not reach the requested position within {waited:?}{}", if failures.is_empty() { String::new() } else { format!(" (stopped: {})", failures.join("; ")) })]
    ViewBehind {
        /// The view's name.
        view: String,
        /// How long the read waited.
        waited: Duration,
        /// The position token the view had reached.
        position: String,
        /// The view partitions that stopped, `partition <p>: <reason>` each.
        failures: Vec<String>,
    },
    /// A view partition could not apply its source (500); the view stops there.
    #[error("view `{view}` partition {partition} stopped: {reason}")]
    ViewFailed {
        /// The view's name.
        view: String,
        /// The source partition.
        partition: u32,
        /// The error, as text.
        reason: String,
    },
}

impl From<eventfold_store::Error> for Error {
    /// The store's corrupt records become [`Error::Corrupt`], so that callers above the
    /// runtime tell them apart without knowing the store's error type.
    fn from(e: eventfold_store::Error) -> Self {
        match e {
            eventfold_store::Error::Corrupt { table, key, reason } => Error::Corrupt { table, key, reason },
            e => Error::Store(e),
        }
    }
}

/// Result alias of eventfold-runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;
