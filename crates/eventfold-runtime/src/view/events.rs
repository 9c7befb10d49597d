//! A view's source events: read from the log and decoded, for the live workers and the
//! rebuilds alike.

use eventfold_core::envelope::headers;
use eventfold_core::{Aggregate, Projection, RecordRef};
use eventfold_log::Log;
use std::sync::Arc;

/// The event type of a projection's source aggregate.
pub(super) type SourceEvent<P> = <<P as Projection>::Source as Aggregate>::Event;

/// A source event as a projection sees it: its envelope and its payload, decoded (a
/// rebuild decodes on its reader's thread).
pub(super) struct Decoded<E> {
    pub(super) offset: u64,
    pub(super) aggregate_id: String,
    pub(super) version: u64,
    pub(super) event_type: Arc<str>,
    pub(super) timestamp_ms: i64,
    pub(super) payload: E,
}

/// Why [`read_events`] stopped.
pub(super) enum ReadFailure {
    /// The log could not be read (worth retrying).
    Read(String),
    /// A record is not an event of the source (the view partition stops there).
    Decode(String),
}

/// Reads up to `max` events of `topic`/`partition` from `from` on, those below `end`,
/// and decodes them; the first that does not decode fails them all. Reads through
/// [`Log::read_with`]: nothing of a record is copied but its aggregate id and payload.
pub(super) async fn read_events<P: Projection>(
    log: &dyn Log,
    topic: &str,
    partition: u32,
    from: u64,
    max: usize,
    end: u64,
) -> Result<Vec<Decoded<SourceEvent<P>>>, ReadFailure> {
    let mut events = Vec::with_capacity(max.min(16_384));
    let mut failed = None;
    // Event type names: a few, shared by every event of their type.
    let mut types: Vec<Arc<str>> = Vec::new();
    log.read_with(topic, partition, from, max, &mut |offset, record| {
        if offset >= end {
            return false;
        }
        match decode::<P>(topic, partition, offset, record, &mut types) {
            Ok(event) => {
                events.push(event);
                true
            }
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })
    .await
    .map_err(|e| ReadFailure::Read(format!("cannot read {topic}/{partition}: {e}")))?;
    match failed {
        Some(e) => Err(ReadFailure::Decode(e)),
        None => Ok(events),
    }
}

/// Decodes the event at `offset` of `topic`/`partition`.
fn decode<P: Projection>(
    topic: &str,
    partition: u32,
    offset: u64,
    record: RecordRef<'_>,
    types: &mut Vec<Arc<str>>,
) -> Result<Decoded<SourceEvent<P>>, String> {
    let payload = serde_json::from_slice(record.value)
        .map_err(|e| format!("event {topic}/{partition}@{offset} does not decode: {e}"))?;
    let aggregate_id = record
        .header_str(headers::AGGREGATE_ID)
        .or_else(|| std::str::from_utf8(record.key).ok())
        .ok_or_else(|| format!("event {topic}/{partition}@{offset} has no aggregate id"))?
        .to_owned();
    let version = record
        .header_str(headers::VERSION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let name = record.header_str(headers::TYPE).unwrap_or("unknown");
    let event_type = match types.iter().find(|t| &***t == name) {
        Some(t) => t.clone(),
        None => {
            let t: Arc<str> = Arc::from(name);
            types.push(t.clone());
            t
        }
    };
    Ok(Decoded {
        offset,
        aggregate_id,
        version,
        event_type,
        timestamp_ms: record.timestamp_ms,
        payload,
    })
}
