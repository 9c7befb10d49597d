//! Changelog records: when the local store is only a cache of the log (Kafka mode), every
//! commit also appends the new aggregate states and the command outcomes to the state
//! topic (compacted; key = aggregate id, or `cmd/<command id>` for an outcome) and the
//! outcome to the results topic; a partition that restores on an empty or stale store
//! replays its events and state partitions into the store before it takes commands.

use eventfold_core::Record;
use eventfold_core::envelope::headers;
use eventfold_log::Append;
use eventfold_store::Batch;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;

/// Key prefix of outcome records in the state topic.
pub const OUTCOME_PREFIX: &str = "cmd/";

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

#[derive(Deserialize)]
struct OutcomeValue<'a> {
    timestamp_ms: i64,
    #[serde(borrow)]
    outcome: &'a RawValue,
}

/// Applies one state-topic record to the store batch.
pub fn apply_state_record(batch: &mut Batch, agg_type: &str, partition: u32, r: &Record) -> Result<(), String> {
    let key = std::str::from_utf8(&r.key).map_err(|_| "key is not UTF-8".to_owned())?;
    if let Some(command_id) = key.strip_prefix(OUTCOME_PREFIX) {
        let v: OutcomeValue<'_> =
            serde_json::from_slice(&r.value).map_err(|e| format!("outcome record does not decode: {e}"))?;
        batch.put_dedup(
            agg_type,
            partition,
            command_id,
            v.timestamp_ms,
            v.outcome.get().as_bytes(),
        );
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
}
