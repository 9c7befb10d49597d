//! Kafka mode: a process manager's rows as records of its changelog topic
//! `<app>.<name>.state` (compacted, partition 0), written in the same transaction as what
//! they record, and replayed into the local store (a cache) by the instance that takes the
//! process manager over.
//!
//! Record keys: `s 0 <key>` (state JSON), `t 0 <key> 0 <timer>` (`due(i64 LE)
//! correlation id`), `o 0 <seq(u64 BE)>` (outbox entry), `c 0 <topic> 0 <partition>`
//! (position, u64 LE), `n` (timers pending, u64 LE). An empty value removes the row (a
//! tombstone: compaction removes the key). Every
//! record holds a row's whole value, so a replay that applies a record twice leaves the
//! same rows.

use eventfold_core::Record;
use eventfold_store::{Batch, Store, TimerRow};
use std::collections::HashMap;
use std::sync::Arc;

/// The changelog topic of process manager `name` in app `app`.
pub(crate) fn topic(app: &str, name: &str) -> Arc<str> {
    Arc::from(format!("{app}.{name}.state"))
}

/// The consumer group whose member owns process manager `name`: its assignment of the
/// changelog's partition 0 says which instance runs it, and every commit carries the
/// group's generation (a member the group moved on from cannot commit).
pub(crate) fn group(app: &str, name: &str) -> String {
    format!("{app}.{name}")
}

/// The meta entry of how far the local store has the changelog.
pub(crate) fn applied_key(name: &str) -> String {
    format!("pm/{name}/changelog")
}

fn record(key: Vec<u8>, value: Vec<u8>, now_ms: i64) -> Record {
    Record {
        key,
        value,
        headers: Vec::new(),
        timestamp_ms: now_ms,
    }
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&0u8)
}

/// Records of the changelog, built beside a batch of the same changes.
#[derive(Default)]
pub(crate) struct Records {
    pub records: Vec<Record>,
    now_ms: i64,
}

impl Records {
    pub fn new(now_ms: i64) -> Self {
        Self {
            records: Vec::new(),
            now_ms,
        }
    }
    pub fn state(&mut self, key: &str, json: Option<&[u8]>) {
        let k = join(&[b"s", key.as_bytes()]);
        self.records
            .push(record(k, json.unwrap_or_default().to_vec(), self.now_ms));
    }
    pub fn timer(&mut self, key: &str, timer: &str, due: Option<(i64, &str)>) {
        let k = join(&[b"t", key.as_bytes(), timer.as_bytes()]);
        let v = due.map_or_else(Vec::new, |(due, corr)| {
            [&due.to_le_bytes()[..], corr.as_bytes()].concat()
        });
        self.records.push(record(k, v, self.now_ms));
    }
    pub fn outbox(&mut self, seq: u64, data: Option<&[u8]>) {
        let k = join(&[b"o", &seq.to_be_bytes()]);
        self.records
            .push(record(k, data.unwrap_or_default().to_vec(), self.now_ms));
    }
    pub fn position(&mut self, topic: &str, partition: u32, next: u64) {
        let k = join(&[b"c", topic.as_bytes(), partition.to_string().as_bytes()]);
        self.records.push(record(k, next.to_le_bytes().to_vec(), self.now_ms));
    }
    pub fn timers_pending(&mut self, n: u64) {
        self.records
            .push(record(b"n".to_vec(), n.to_le_bytes().to_vec(), self.now_ms));
    }
}

fn u64_of(v: &[u8]) -> Result<u64, String> {
    v.try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| format!("expected 8 bytes, got {}", v.len()))
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|_| "not UTF-8".to_owned())
}

/// Applies changelog `records` (in offset order) to the local rows of process manager
/// `name`: the batch to write. Timer rows are keyed by due time too, so a replaced or
/// removed timer's old row is looked up (in the store, or earlier in this batch).
pub(crate) fn replay(
    store: &Store,
    name: &str,
    records: &[(u64, Record)],
    checkpoint: impl Fn(&str, u32) -> String,
    timers_key: &str,
) -> Result<Batch, String> {
    let mut batch = Batch::new();
    // (key, timer) -> its due time as of the records applied so far in this batch.
    let mut dues: HashMap<(String, String), Option<i64>> = HashMap::new();
    for (offset, r) in records {
        let bad = |why: String| format!("changelog record at offset {offset} of `{name}`: {why}");
        let mut parts = r.key.splitn(3, |b| *b == 0);
        let kind = parts.next().unwrap_or_default();
        let v = &r.value;
        match kind {
            b"s" => {
                let key = utf8(parts.next().ok_or_else(|| bad("no key".into()))?).map_err(bad)?;
                if v.is_empty() {
                    batch.delete_process_state(name, key);
                } else {
                    batch.put_process_state(name, key, v);
                }
            }
            b"t" => {
                let key = utf8(parts.next().ok_or_else(|| bad("no key".into()))?).map_err(bad)?;
                let timer = utf8(parts.next().ok_or_else(|| bad("no timer id".into()))?).map_err(bad)?;
                replay_timer(store, name, (key, timer), v, &mut dues, &mut batch).map_err(bad)?;
            }
            b"o" => {
                // The sequence is binary (it may hold NUL bytes): everything after `o 0`.
                let seq = r.key.get(2..).ok_or_else(|| bad("no sequence".into()))?;
                let seq = u64::from_be_bytes(seq.try_into().map_err(|_| bad("bad sequence".into()))?);
                if v.is_empty() {
                    batch.delete_outbox(name, seq);
                } else {
                    batch.put_outbox(name, seq, v);
                }
            }
            b"c" => {
                let topic = utf8(parts.next().ok_or_else(|| bad("no topic".into()))?).map_err(bad)?;
                let p = utf8(parts.next().ok_or_else(|| bad("no partition".into()))?).map_err(bad)?;
                let p: u32 = p.parse().map_err(|_| bad("bad partition".into()))?;
                batch.put_meta(&checkpoint(topic, p), u64_of(v).map_err(bad)?);
            }
            b"n" => batch.put_meta(timers_key, u64_of(v).map_err(bad)?),
            other => return Err(bad(format!("unknown record kind {:?}", String::from_utf8_lossy(other)))),
        }
    }
    Ok(batch)
}

/// A timer's changelog record: the batch drops the timer's row as of the records applied
/// so far (its due time is part of the key) and writes the new one, unless `v` is empty (a
/// removal). `dues` carries each timer's due time through the batch.
fn replay_timer(
    store: &Store,
    name: &str,
    (key, timer): (&str, &str),
    v: &[u8],
    dues: &mut HashMap<(String, String), Option<i64>>,
    batch: &mut Batch,
) -> Result<(), String> {
    let slot = (key.to_owned(), timer.to_owned());
    let old = match dues.get(&slot) {
        Some(d) => *d,
        None => store
            .timers_of(name, key)
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|t| t.timer == timer)
            .map(|t| t.due_ms),
    };
    if let Some(due) = old {
        batch.delete_timer(name, key, timer, due);
    }
    if v.is_empty() {
        dues.insert(slot, None);
        return Ok(());
    }
    let (due, corr) = v.split_at_checked(8).ok_or("timer value too short")?;
    let due_ms = u64_of(due)? as i64;
    batch.put_timer(
        name,
        &TimerRow {
            key: key.to_owned(),
            timer: timer.to_owned(),
            due_ms,
            correlation_id: utf8(corr)?.to_owned(),
        },
    );
    dues.insert(slot, Some(due_ms));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventfold_store::StoreOptions;

    #[test]
    fn a_replay_rebuilds_the_rows_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let mut r = Records::new(0);
        r.state("k", Some(br#"{"a":1}"#));
        r.timer("k", "t", Some((100, "c1")));
        r.timer("k", "t", Some((200, "c1")));
        r.timer("k", "u", Some((300, "c2")));
        r.timer("k", "u", None);
        r.outbox(7, Some(b"cmd"));
        r.outbox(8, Some(b"cmd8"));
        r.outbox(7, None);
        r.outbox(256, Some(b"has a NUL byte in its key"));
        r.position("app.order.events", 3, 42);
        r.timers_pending(1);
        let records: Vec<(u64, Record)> = r.records.into_iter().enumerate().map(|(i, r)| (i as u64, r)).collect();
        let ck = |t: &str, p: u32| format!("pm/x/{t}/{p}");
        for _ in 0..2 {
            let batch = replay(&store, "x", &records, ck, "pm/x/timers").unwrap();
            store.commit(batch, false).unwrap();
            assert_eq!(store.get_process_state("x", "k").unwrap().unwrap(), br#"{"a":1}"#);
            let timers = store.timers_of("x", "k").unwrap();
            assert_eq!(timers.len(), 1);
            assert_eq!((timers[0].timer.as_str(), timers[0].due_ms), ("t", 200));
            assert_eq!(
                store.due_timers("x", i64::MAX, 10).unwrap().len(),
                1,
                "no stale due row"
            );
            let outbox: Vec<u64> = store.outbox("x").unwrap().iter().map(|o| o.seq).collect();
            assert_eq!(outbox, vec![8, 256]);
            assert_eq!(store.get_meta("pm/x/app.order.events/3").unwrap(), Some(42));
            assert_eq!(store.get_meta("pm/x/timers").unwrap(), Some(1));
        }
        let bad = vec![(9, record(b"z".to_vec(), Vec::new(), 0))];
        assert!(
            replay(&store, "x", &bad, ck, "pm/x/timers")
                .unwrap_err()
                .contains("offset 9")
        );
    }
}
