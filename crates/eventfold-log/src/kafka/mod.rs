//! The Kafka backend of [`Log`]: one Kafka transaction per group of commit units.
//!
//! **Commit.** [`KafkaLog::commit`](crate::kafka::KafkaLog::commit) enqueues the unit synchronously on a channel read by
//! one dedicated committer thread (see `committer.rs`). The thread owns a transactional
//! `ThreadedProducer` (its own thread serves delivery reports); it takes every waiting
//! unit (bounded by count and bytes) and commits them in **one** transaction (group
//! commit): `begin_transaction`, every append produced to its explicit partition with key,
//! value, headers and timestamp, `send_offsets_to_transaction` once per consumer group
//! for the units' consumed offsets, then it waits for the delivery report of every
//! record (each carries the record's offset, so every append's offset is known before
//! the commit), then `commit_transaction`. Only after the transaction committed does it
//! write the local store in one batch (not fsynced: the store is a cache of the topics, and each batch carries its own checkpoints): every unit's `local` changes, the
//! consumed offsets, and as a local cache the appended records **of entities** (events)
//! with their entity index entries (so [`Store::entity_events`] works in Kafka mode too);
//! of the other appends (state, results) only how far each partition's copy goes
//! ([`Batch::put_log_end`](eventfold_store::Batch::put_log_end)): their content lives in
//! the local tables the unit's `local` changes write. Then it answers the
//! callers, in enqueue order. A group of units with only local changes needs no
//! transaction and only writes the store (still in order).
//!
//! Consumed offsets are committed for a group the log does not join (its metadata has
//! generation -1): zombie fencing comes from the transactional id, not from the group
//! generation (KIP-447). `Consumed::next_offset` should come from the consumer's
//! position, not "last offset + 1": input topics written transactionally hold markers.
//!
//! **Failure.** A unit that cannot be committed alone (partition out of range, too large,
//! invalid topic, topic with another partition count) fails alone. A failed transaction
//! fails every unit of its group. Either way the failed units' topic-partitions (written
//! and consumed) are **fenced**: every later unit touching one of them fails too, until
//! the log is reopened, because writers pipeline units built on uncommitted ones (the
//! same rule as the embedded log; other partitions keep working; a unit with only local
//! changes names no partition and is not fenced). An abortable error
//! aborts the transaction. A fatal error, or a commit or abort that fails or times out,
//! drops the producer; the next group builds a new one whose `init_transactions` bumps
//! the epoch, so a late EndTxn of the old one can never decide a later transaction
//! (librdkafka lacks KIP-890). Being fenced by another producer with our transactional id
//! is final: the log refuses everything (fail-stop). Dropping the log commits what is
//! queued, then stops the committer.
//!
//! **Reads** of offsets below the last record the local cache stores are answered from it:
//! a kept topic's cache holds every committed record from offset 0 up to there, because it
//! is filled only by this log's own commits and by restores that replay the partition in
//! order from where the cache stops (offsets it lacks are transaction markers). So a view
//! catching up after a restore reads the copy the restore just made. A read just past the
//! copy that this log's own commits cover waits (bounded) for the apply thread to store
//! them, rather than fetching them from the broker. On a partition the runtime owns and
//! restored ([`Coordinated::set_sole_writer`](crate::Coordinated::set_sole_writer))
//! nothing else is written, so a read past the copy
//! and past this log's commits answers "nothing yet" without a request: a view that
//! polls the end of its source would otherwise send a `ListOffsets` and often a fetch
//! (the offset after the copy is usually the last transaction's marker). Other reads use
//! `read_committed` consumers assigned to one partition (no group subscription), with
//! bounded waits. [`Log::end_offset`] is the partition's last stable
//! offset (LSO): librdkafka's watermark query sends `ListOffsets` with the client's
//! isolation level, so a `read_committed` client gets the LSO, not the high watermark
//! (the two are equal when no transaction is open on the partition). Offsets have gaps:
//! each transaction leaves a marker after its records on every partition it wrote.
//! The broker writes transaction markers *after* it answers `EndTxn`, so right after one
//! of our commits the LSO may still lag behind it for a moment; this log remembers the end
//! of what it committed per partition and waits (bounded) until the LSO covers it, so a
//! caller reads its own commits (past the bound, seen after broker restarts, it answers with
//! the LSO and logs a warning rather than stopping the partition).
//!
//! **Blocking.** Every blocking rdkafka call runs on the committer thread or in
//! `spawn_blocking`, never on a tokio worker. [`KafkaLog::open`](crate::kafka::KafkaLog::open) itself blocks (it
//! connects and initializes transactions): call it outside async code or in
//! `spawn_blocking`.

#[cfg(feature = "kafka")]
mod clients;
#[cfg(feature = "kafka")]
mod committer;
#[cfg(feature = "kafka")]
mod common;
#[cfg(feature = "kafka")]
mod log;
#[cfg(feature = "kafka")]
mod member;
mod options;
#[cfg(feature = "kafka")]
mod provision;
#[cfg(feature = "kafka")]
mod readers;
#[cfg(feature = "kafka")]
mod shared;

#[cfg(feature = "kafka")]
pub use log::*;
pub use options::{Faults, KafkaOptions, MAX_TRANSACTION_INTERVAL, TopicDefaults};
#[cfg(feature = "kafka")]
pub use provision::{single_replica_risk, topic_config};
