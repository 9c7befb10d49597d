//! The command path's shared vocabulary: a command as it arrives ([`CommandRequest`]),
//! decoded for its partition's processor (`Job`), the topics of an aggregate type
//! ([`Topics`]), a partition's lifecycle ([`PartitionState`]), the outcome code of a
//! version mismatch on the results topic, and a stored event in the API's shape. The
//! service (which submits), the processor (which decides and commits), `remote` (which
//! forwards to a partition's owner) and `source` (commands-topic records) all speak it,
//! and it imports none of them, so they need not import each other.

use crate::error::{Error, Result};
use eventfold_core::envelope::headers;
use eventfold_core::{Aggregate, EventView, Outcome, time::rfc3339_ms};
use eventfold_store::EntityEvent;
use serde::Serialize;
use serde_json::value::RawValue;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A command as it arrives (from HTTP or elsewhere), not yet decoded.
#[derive(Debug, Clone, Default)]
pub struct CommandRequest {
    /// Target aggregate id.
    pub aggregate_id: String,
    /// The command JSON.
    pub body: Vec<u8>,
    /// `Idempotency-Key`: becomes the command id. Absent: a fresh UUID v7.
    pub idempotency_key: Option<String>,
    /// `If-Match`: the version the aggregate must be at.
    pub expected_version: Option<u64>,
    /// Correlation id to carry on the events.
    pub correlation_id: Option<String>,
    /// What caused the command (`ef-causation-id` on its events; absent: the command id).
    /// A process manager sets the id of the event it reacted to.
    pub causation_id: Option<String>,
}

/// A decoded command waiting for its partition.
pub(crate) struct Job<A: Aggregate> {
    pub aggregate_id: String,
    pub command_id: String,
    pub correlation_id: String,
    /// What caused the command (its events' `ef-causation-id`); `None`: the command id.
    pub causation_id: Option<String>,
    /// The decoded command, or why a record of the commands topic did not decode.
    pub command: std::result::Result<A::Command, eventfold_core::Error>,
    pub expected_version: Option<u64>,
    /// For a record of the commands topic: the offset to consume next once it commits.
    pub consumed: Option<u64>,
    /// Whether the caller chose the command id (an Idempotency-Key): only then can it
    /// come again, so only then is it deduplicated.
    pub keyed: bool,
    /// For a record of the commands topic: the partition's epoch in the consumer group
    /// when it was fetched ([`eventfold_log::GroupEvent`]); records of an older epoch than
    /// the partition's assignment or last recovery are dropped (they are read again).
    pub epoch: u64,
    /// For a record of the commands topic: the results partition its sender listens to
    /// (`ef-reply-partition`); the outcome goes there instead of the command's partition.
    pub reply_partition: Option<u32>,
    pub reply: oneshot::Sender<Result<Outcome>>,
}

/// The error code of the outcome a commands-topic record gets on the results topic when
/// its `ef-expected-version` does not match (the record's `ef-version` header holds the
/// aggregate's version).
pub(crate) const VERSION_MISMATCH: &str = "version_mismatch";

/// Topic names of one aggregate type.
#[derive(Debug, Clone)]
pub struct Topics {
    /// `<app>.<type>.commands`
    pub commands: Arc<str>,
    /// `<app>.<type>.events`
    pub events: Arc<str>,
    /// `<app>.<type>.state`
    pub state: Arc<str>,
    /// `<app>.<type>.results`
    pub results: Arc<str>,
}

impl Topics {
    /// The topics of `aggregate` in app `app`.
    pub fn new(app: &str, aggregate: &str) -> Self {
        let t = |s: &str| Arc::from(format!("{app}.{aggregate}.{s}"));
        Self {
            commands: t("commands"),
            events: t("events"),
            state: t("state"),
            results: t("results"),
        }
    }
}

/// Lifecycle of a partition processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionState {
    /// Restoring: not taking commands yet.
    Restoring,
    /// Taking commands.
    Ready,
    /// Stopped after a fatal error.
    Failed,
    /// Owned by another instance (Kafka mode).
    Remote,
}

/// Converts a stored event record to the API shape; a record that does not decode is
/// reported as corrupt, naming where it is.
pub(crate) fn event_view(topic: &str, e: &EntityEvent) -> Result<EventView> {
    let corrupt = |reason: &str| Error::Corrupt {
        table: "log",
        key: format!("{topic}/{}@{}", e.partition, e.offset),
        reason: reason.to_owned(),
    };
    let r = &e.record;
    let payload = std::str::from_utf8(&r.value)
        .ok()
        .and_then(|s| RawValue::from_string(s.to_owned()).ok())
        .ok_or_else(|| corrupt("event value is not JSON"))?;
    Ok(EventView {
        version: e.version,
        event_type: r
            .header_str(headers::TYPE)
            .ok_or_else(|| corrupt("missing ef-type header"))?
            .to_owned(),
        id: r.header_str(headers::ID).unwrap_or_default().to_owned(),
        command_id: r.header_str(headers::COMMAND_ID).unwrap_or_default().to_owned(),
        correlation_id: r.header_str(headers::CORRELATION_ID).unwrap_or_default().to_owned(),
        causation_id: r.header_str(headers::CAUSATION_ID).unwrap_or_default().to_owned(),
        timestamp: rfc3339_ms(r.timestamp_ms),
        payload,
    })
}
