//! eventfold-store: the local store on fjall.
//!
//! One fjall database holds every table eventfold keeps on a machine: the embedded log,
//! aggregate state, dedup records with their expiry index, the per-entity event index and
//! checkpoints. A [`Batch`] collects changes to any of them and [`Store::commit`] writes
//! it as **one atomic fjall batch**, optionally fsynced.
//!
//! *Invariant:* every stored value is framed with a CRC32 written before the write and
//! checked after every read; a mismatch is [`Error::Corrupt`], naming table and key.

#![warn(missing_docs)]

mod codec;
pub mod priority;
pub mod process;
mod store;
pub mod view;

pub use codec::{decode_record, encode_record};
pub use process::{OutboxRow, TimerRow};
pub use store::{Batch, DedupRow, EncodedRecord, EntityEvent, StateRow, Store, StoreOptions, Table};
pub use store::{DEFAULT_BACKGROUND_NICE, L0_COMPACTION_TRIGGER};
pub use view::{Hit, Page, RawEntry, Scan, ViewWrite, encode_prefix, encode_value, view_checkpoint_key};

/// Errors of the local store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The underlying database failed (I/O, poisoned journal, ...).
    #[error("storage error: {0}")]
    Storage(#[from] fjall::Error),
    /// A stored value failed its checksum or could not be decoded.
    #[error("corrupt record in table `{table}` at key {key}: {reason}")]
    Corrupt {
        /// The table's name.
        table: &'static str,
        /// The key, other bytes than printable ASCII written `\xNN`; a log record's as
        /// `topic/partition@offset`.
        key: String,
        /// What failed (checksum, framing or decoding).
        reason: String,
    },
    /// A key component is outside what the store accepts.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// Another process has the store open (one process at a time).
    #[error(
        "the store in {} is in use by another process (a service already running with this data directory? stop it, or give this one another --data-dir)",
        path.display()
    )]
    Locked {
        /// The store's directory.
        path: std::path::PathBuf,
    },
}

/// Result alias of eventfold-store.
pub type Result<T, E = Error> = std::result::Result<T, E>;
