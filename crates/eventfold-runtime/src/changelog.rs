//! Changelog records: when the local store is only a cache of the log (Kafka mode), every
//! commit also appends the new aggregate states and the command outcomes to the state
//! topic (compacted; key = aggregate id, or `cmd/<command id>` for an outcome) and the
//! outcome to the results topic; a partition that restores on an empty or stale store
//! replays its events and state partitions into the store before it takes commands.
//!
//! An accepted command's outcome record in the state topic refers to its events (they are
//! in the same transaction, and the events topic keeps everything) instead of copying the
//! outcome's JSON, which holds every event's payload: a restore reads the events first, so
//! the reference resolves in the store as the live path's own dedup records do.

use eventfold_core::Record;
use eventfold_core::envelope::headers;
use eventfold_log::Append;
use eventfold_store::Batch;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;

/// Key prefix of outcome records in the state topic.
pub const OUTCOME_PREFIX: &str = "cmd/";

/// First byte of a dedup record that refers to its accepted command's events instead of
/// holding the outcome's JSON (which starts with `{`): `0x01 | version u64 LE | events u32
/// LE | aggregate id`, the events being the aggregate's last `events` up to `version`.
/// Written by the live path on both logs (the store keeps every event) and by restores of
/// the state topic's references. About 60 bytes instead of the 400 of a shop order's
/// outcome, and no JSON to build.
pub(crate) const EVENTS_BY_REFERENCE: u8 = 0x01;

/// The dedup record of an accepted command: [`EVENTS_BY_REFERENCE`].
pub(crate) fn events_reference(aggregate_id: &str, version: u64, count: u32) -> Vec<u8> {
    let mut reference = Vec::with_capacity(13 + aggregate_id.len());
    reference.push(EVENTS_BY_REFERENCE);
    reference.extend_from_slice(&version.to_le_bytes());
    reference.extend_from_slice(&count.to_le_bytes());
    reference.extend_from_slice(aggregate_id.as_bytes());
    reference
}

/// `(version, events, aggregate id)` of an [`events_reference`], from its bytes after the
/// [`EVENTS_BY_REFERENCE`] byte; why not, if they are not one.
pub(crate) fn decode_events_reference(reference: &[u8]) -> Result<(u64, u32, &str), String> {
    if reference.len() < 12 {
        return Err(format!("reference of {} bytes is shorter than 12", reference.len()));
    }
    let (version, rest) = reference.split_at(8);
    let version = u64::from_le_bytes(version.try_into().expect("8 bytes"));
    let count = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
    let aggregate_id = std::str::from_utf8(&rest[4..]).map_err(|_| "aggregate id is not UTF-8".to_owned())?;
    if u64::from(count) > version {
        return Err(format!("{count} events cannot end at version {version}"));
    }
    Ok((version, count, aggregate_id))
}

fn record(key: &[u8], value: Vec<u8>, ty: &str, now: i64) -> Record {
    Record {
        key: key.to_vec(),
        value,
        headers: Vec::with_capacity(4),
        timestamp_ms: now,
    }
    .with_header(headers::TYPE, ty)
    .with_header(headers::CONTENT_TYPE, "application/json")
}

/// `{"version": v, "state": <state>}` keyed by aggregate id.
pub fn state_record(topic: &Arc<str>, partition: u32, id: &str, version: u64, state_json: &[u8], now: i64) -> Append {
    let mut value = Vec::with_capacity(state_json.len() + 32);
    value.extend_from_slice(format!("{{\"version\":{version},\"state\":").as_bytes());
    value.extend_from_slice(state_json);
    value.push(b'}');
    let record = record(id.as_bytes(), value, "State", now)
        .with_header(headers::AGGREGATE_ID, id)
        .with_header(headers::VERSION, version.to_string());
    Append {
        topic: topic.clone(),
        partition,
        record,
        entity: None,
    }
}

/// `{"timestamp_ms": t, "outcome": <outcome>}` keyed by `cmd/<command id>`.
pub fn outcome_record(topic: &Arc<str>, partition: u32, command_id: &str, outcome_json: &[u8], now: i64) -> Append {
    let mut value = Vec::with_capacity(outcome_json.len() + 40);
    value.extend_from_slice(format!("{{\"timestamp_ms\":{now},\"outcome\":").as_bytes());
    value.extend_from_slice(outcome_json);
    value.push(b'}');
    keyed_outcome(topic, partition, command_id, value, now)
}

/// An accepted command's outcome by reference, keyed by `cmd/<command id>`:
/// `{"timestamp_ms": t, "events": {"aggregate_id": id, "version": v, "count": n}}`, the
/// events being the aggregate's last `n` up to version `v` (each carries the command id).
pub fn accepted_record(
    topic: &Arc<str>,
    partition: u32,
    command_id: &str,
    aggregate_id: &str,
    version: u64,
    count: u32,
    now: i64,
) -> Append {
    let value = serde_json::to_vec(&OutcomeValue {
        timestamp_ms: now,
        outcome: None,
        events: Some(EventsRef {
            aggregate_id: aggregate_id.into(),
            version,
            count,
        }),
    })
    .expect("serializable");
    keyed_outcome(topic, partition, command_id, value, now)
}

/// An outcome record's `value`, keyed by `cmd/<command id>`.
fn keyed_outcome(topic: &Arc<str>, partition: u32, command_id: &str, value: Vec<u8>, now: i64) -> Append {
    let key = format!("{OUTCOME_PREFIX}{command_id}");
    let record = record(key.as_bytes(), value, "Outcome", now).with_header(headers::COMMAND_ID, command_id);
    Append {
        topic: topic.clone(),
        partition,
        record,
        entity: None,
    }
}

/// The outcome itself, keyed by command id, for callers waiting on the results topic.
pub fn result_record(topic: &Arc<str>, partition: u32, command_id: &str, outcome_json: &[u8], now: i64) -> Append {
    let record = record(command_id.as_bytes(), outcome_json.to_vec(), "Outcome", now)
        .with_header(headers::COMMAND_ID, command_id);
    Append {
        topic: topic.clone(),
        partition,
        record,
        entity: None,
    }
}

#[derive(Deserialize)]
struct StateValue<'a> {
    version: u64,
    #[serde(borrow)]
    state: &'a RawValue,
}

/// The value of an outcome record: the outcome's JSON (rejections and older records), or
/// the accepted command's events by reference.
#[derive(Serialize, Deserialize)]
struct OutcomeValue<'a> {
    timestamp_ms: i64,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    outcome: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    events: Option<EventsRef<'a>>,
}

#[derive(Serialize, Deserialize)]
struct EventsRef<'a> {
    #[serde(borrow)]
    aggregate_id: std::borrow::Cow<'a, str>,
    version: u64,
    count: u32,
}

/// Applies one state-topic record to the store batch.
pub fn apply_state_record(batch: &mut Batch, agg_type: &str, partition: u32, r: &Record) -> Result<(), String> {
    let key = std::str::from_utf8(&r.key).map_err(|_| "key is not UTF-8".to_owned())?;
    if let Some(command_id) = key.strip_prefix(OUTCOME_PREFIX) {
        let v: OutcomeValue<'_> =
            serde_json::from_slice(&r.value).map_err(|e| format!("outcome record does not decode: {e}"))?;
        let outcome = match (v.outcome, v.events) {
            (Some(json), None) => json.get().as_bytes().to_vec(),
            (None, Some(e)) if e.count as u64 <= e.version => events_reference(&e.aggregate_id, e.version, e.count),
            (None, Some(e)) => {
                return Err(format!(
                    "outcome record refers to {} events ending at version {}",
                    e.count, e.version
                ));
            }
            _ => return Err("outcome record has neither or both of `outcome` and `events`".to_owned()),
        };
        batch.put_dedup(agg_type, partition, command_id, v.timestamp_ms, &outcome);
    } else {
        let v: StateValue<'_> =
            serde_json::from_slice(&r.value).map_err(|e| format!("state record does not decode: {e}"))?;
        batch.put_state(agg_type, key, v.version, v.state.get().as_bytes());
    }
    Ok(())
}

/// Applies one events-topic record to the store batch: the per-entity index.
pub fn apply_event_record(
    batch: &mut Batch,
    topic: &str,
    partition: u32,
    offset: u64,
    r: &Record,
) -> Result<(), String> {
    let version = r
        .header_str(headers::VERSION)
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| "event has no valid ef-version header".to_owned())?;
    batch.put_entity(topic, &r.key, version, partition, offset);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_outcome_records_round_trip_into_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = eventfold_store::Store::open(dir.path(), &Default::default()).unwrap();
        let t: Arc<str> = Arc::from("a.order.state");
        let s = state_record(&t, 2, "o-1", 3, br#"{"status":"placed"}"#, 5);
        let o = outcome_record(&t, 2, "k-1", br#"{"rejected":{"error":"x","message":"y"}}"#, 7);
        let mut b = Batch::new();
        apply_state_record(&mut b, "order", 2, &s.record).unwrap();
        apply_state_record(&mut b, "order", 2, &o.record).unwrap();
        store.commit(b, false).unwrap();
        let row = store.get_state("order", "o-1").unwrap().unwrap();
        assert_eq!(
            (row.version, row.json.as_slice()),
            (3, br#"{"status":"placed"}"#.as_slice())
        );
        let d = store.get_dedup("order", 2, "k-1").unwrap().unwrap();
        assert_eq!(
            (d.timestamp_ms, d.outcome.as_slice()),
            (7, br#"{"rejected":{"error":"x","message":"y"}}"#.as_slice())
        );
        let mut bad = s.record.clone();
        bad.value = b"{".to_vec();
        assert!(
            apply_state_record(&mut Batch::new(), "order", 2, &bad)
                .unwrap_err()
                .contains("does not decode")
        );
    }

    #[test]
    fn accepted_outcomes_travel_as_references_to_their_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = eventfold_store::Store::open(dir.path(), &Default::default()).unwrap();
        let t: Arc<str> = Arc::from("a.order.state");
        let a = accepted_record(&t, 1, "k-2", "o-\"7\"", 4, 2, 9);
        assert_eq!(a.record.key, b"cmd/k-2");
        let value: serde_json::Value = serde_json::from_slice(&a.record.value).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"timestamp_ms": 9, "events": {"aggregate_id": "o-\"7\"", "version": 4, "count": 2}})
        );
        let mut b = Batch::new();
        apply_state_record(&mut b, "order", 1, &a.record).unwrap();
        store.commit(b, false).unwrap();
        let d = store.get_dedup("order", 1, "k-2").unwrap().unwrap();
        assert_eq!((d.timestamp_ms, d.outcome), (9, events_reference("o-\"7\"", 4, 2)));
        assert_eq!(events_reference("o-1", 1, 1).len(), 1 + 8 + 4 + 3);
        assert_eq!(
            decode_events_reference(&events_reference("o-\"7\"", 4, 2)[1..]),
            Ok((4, 2, "o-\"7\""))
        );
        assert!(decode_events_reference(&events_reference("o", 1, 2)[1..]).is_err());
        assert!(decode_events_reference(&[0; 11]).is_err());

        for (bad, why) in [
            (r#"{"timestamp_ms":1}"#, "neither or both"),
            (
                r#"{"timestamp_ms":1,"outcome":{},"events":{"aggregate_id":"o","version":1,"count":1}}"#,
                "neither or both",
            ),
            (
                r#"{"timestamp_ms":1,"events":{"aggregate_id":"o","version":1,"count":2}}"#,
                "2 events ending at version 1",
            ),
            (
                r#"{"timestamp_ms":1,"events":{"aggregate_id":"o","version":1}}"#,
                "does not decode",
            ),
        ] {
            let mut r = a.record.clone();
            r.value = bad.as_bytes().to_vec();
            let err = apply_state_record(&mut Batch::new(), "order", 1, &r).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
