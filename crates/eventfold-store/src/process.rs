//! Process managers' rows in [`Table::Process`]: states, timers and outboxes.
//!
//! Keys (every name and key component without NUL):
//! - state: `s 0 pm 0 key` -> framed state JSON;
//! - timer, by due time: `d 0 pm 0 due(i64, order-preserving BE) key 0 timer` -> framed
//!   correlation id; a scan from the start of `d 0 pm 0` up to now finds the due timers
//!   without touching the others;
//! - timer, by key: `k 0 pm 0 key 0 timer` -> framed `due(i64 LE) correlation id`, to
//!   replace, cancel and list a key's timers;
//! - outbox: `o 0 pm 0 seq(u64 BE)` -> framed command (the runtime's encoding).
//!
//! The worker of a process manager is the only writer of its rows; it writes them, its
//! consumed positions (meta) and what it consumed in one [`Batch`].

use crate::codec::{Reader, framed, unframe};
use crate::store::{Batch, Store, Table, concat, corrupt};
use crate::{Error, Result};
use std::ops::Bound;

/// A pending timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerRow {
    /// The correlation key it belongs to.
    pub key: String,
    /// Its id, unique per key.
    pub timer: String,
    /// Due time, milliseconds since the Unix epoch.
    pub due_ms: i64,
    /// The correlation id of the input that scheduled it.
    pub correlation_id: String,
}

/// An outbox entry: a command written, not yet answered by its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// Sequence number, unique per process manager.
    pub seq: u64,
    /// The encoded command.
    pub data: Vec<u8>,
}

fn check(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.as_bytes().contains(&0) || s.len() > 1024 {
        return Err(Error::InvalidKey(format!(
            "{what} {s:?} must be 1..=1024 bytes without NUL"
        )));
    }
    Ok(())
}

fn ordered(due_ms: i64) -> [u8; 8] {
    ((due_ms as u64) ^ (1 << 63)).to_be_bytes()
}

fn due_of(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

fn prefix(kind: u8, pm: &str) -> Vec<u8> {
    concat(&[&[kind, 0], pm.as_bytes(), &[0]])
}

fn state_key(pm: &str, key: &str) -> Vec<u8> {
    concat(&[&prefix(b's', pm), key.as_bytes()])
}

fn due_key(pm: &str, due_ms: i64, key: &str, timer: &str) -> Vec<u8> {
    concat(&[
        &prefix(b'd', pm),
        &ordered(due_ms),
        key.as_bytes(),
        &[0],
        timer.as_bytes(),
    ])
}

fn by_key_prefix(pm: &str, key: &str) -> Vec<u8> {
    concat(&[&prefix(b'k', pm), key.as_bytes(), &[0]])
}

fn outbox_key(pm: &str, seq: u64) -> Vec<u8> {
    concat(&[&prefix(b'o', pm), &seq.to_be_bytes()])
}

/// The first key after every key that starts with `p`.
fn after_prefix(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xFF; p.len() + 1]
}

impl Batch {
    /// Sets the state of `key` of process manager `pm`.
    pub fn put_process_state(&mut self, pm: &str, key: &str, json: &[u8]) {
        self.put(Table::Process, state_key(pm, key), framed(json));
    }

    /// Removes the state of `key` of process manager `pm`.
    pub fn delete_process_state(&mut self, pm: &str, key: &str) {
        self.delete(Table::Process, state_key(pm, key));
    }

    /// Adds a timer (the caller removes one it replaces with [`Batch::delete_timer`]).
    pub fn put_timer(&mut self, pm: &str, t: &TimerRow) {
        self.put(
            Table::Process,
            due_key(pm, t.due_ms, &t.key, &t.timer),
            framed(t.correlation_id.as_bytes()),
        );
        let v = concat(&[&t.due_ms.to_le_bytes(), t.correlation_id.as_bytes()]);
        self.put(
            Table::Process,
            concat(&[&by_key_prefix(pm, &t.key), t.timer.as_bytes()]),
            framed(&v),
        );
    }

    /// Removes timer `timer` of `key`, due at `due_ms`.
    pub fn delete_timer(&mut self, pm: &str, key: &str, timer: &str, due_ms: i64) {
        self.delete(Table::Process, due_key(pm, due_ms, key, timer));
        self.delete(Table::Process, concat(&[&by_key_prefix(pm, key), timer.as_bytes()]));
    }

    /// Adds outbox entry `seq`.
    pub fn put_outbox(&mut self, pm: &str, seq: u64, data: &[u8]) {
        self.put(Table::Process, outbox_key(pm, seq), framed(data));
    }

    /// Removes outbox entry `seq`.
    pub fn delete_outbox(&mut self, pm: &str, seq: u64) {
        self.delete(Table::Process, outbox_key(pm, seq));
    }
}

impl Store {
    /// The state JSON of `key` of process manager `pm`.
    pub fn get_process_state(&self, pm: &str, key: &str) -> Result<Option<Vec<u8>>> {
        check("process manager", pm)?;
        check("correlation key", key)?;
        let k = state_key(pm, key);
        match self.table(Table::Process).get(&k)? {
            None => Ok(None),
            Some(v) => Ok(Some(unframe(&v).map_err(|e| corrupt(Table::Process, &k, e))?.to_vec())),
        }
    }

    /// The pending timers of `key`, by timer id.
    pub fn timers_of(&self, pm: &str, key: &str) -> Result<Vec<TimerRow>> {
        check("process manager", pm)?;
        check("correlation key", key)?;
        let p = by_key_prefix(pm, key);
        let mut out = Vec::new();
        for kv in self.table(Table::Process).prefix(&p) {
            let (k, v) = kv.into_inner()?;
            let decode = || -> Result<TimerRow, String> {
                let timer = String::from_utf8(k[p.len()..].to_vec()).map_err(|_| "timer id is not UTF-8")?;
                let mut r = Reader::new(unframe(&v)?);
                let due_ms = r.i64()?;
                let correlation_id = String::from_utf8(r.rest().to_vec()).map_err(|_| "correlation id is not UTF-8")?;
                Ok(TimerRow {
                    key: key.to_owned(),
                    timer,
                    due_ms,
                    correlation_id,
                })
            };
            out.push(decode().map_err(|e| corrupt(Table::Process, &k, e))?);
        }
        Ok(out)
    }

    /// Up to `max` timers of `pm` due at or before `now_ms`, earliest first, then by key
    /// and id. Reads only those: the others sort after them.
    pub fn due_timers(&self, pm: &str, now_ms: i64, max: usize) -> Result<Vec<TimerRow>> {
        self.due_timers_from(pm, None, now_ms, max)
    }

    /// As [`Store::due_timers`], of the timers at or after position `from` (due time,
    /// key, timer id) only. A caller that fires timers in this order passes the position
    /// it got to: the scan then seeks past the deletions of the timers fired before,
    /// instead of stepping over them (in an LSM tree a deleted key is read until a
    /// compaction drops it, and many timers may share one due millisecond).
    pub fn due_timers_from(
        &self,
        pm: &str,
        from: Option<(i64, &str, &str)>,
        now_ms: i64,
        max: usize,
    ) -> Result<Vec<TimerRow>> {
        check("process manager", pm)?;
        let p = prefix(b'd', pm);
        let start = match from {
            Some((due, key, timer)) => due_key(pm, due, key, timer),
            None => p.clone(),
        };
        let end = match now_ms.checked_add(1) {
            Some(next) => concat(&[&p, &ordered(next)]),
            None => after_prefix(&p),
        };
        let mut out = Vec::new();
        if start >= end {
            return Ok(Vec::new());
        }
        let range = (Bound::Included(start), Bound::Excluded(end));
        for kv in self.table(Table::Process).range(range).take(max) {
            let (k, v) = kv.into_inner()?;
            out.push(decode_due(&p, &k, &v).map_err(|e| corrupt(Table::Process, &k, e))?);
        }
        Ok(out)
    }

    /// The earliest due time among `pm`'s pending timers at or after position `from` (see
    /// [`Store::due_timers_from`]).
    pub fn next_timer_due(&self, pm: &str, from: Option<(i64, &str, &str)>) -> Result<Option<i64>> {
        check("process manager", pm)?;
        let p = prefix(b'd', pm);
        let start = match from {
            Some((due, key, timer)) => due_key(pm, due, key, timer),
            None => p.clone(),
        };
        let range = (Bound::Included(start), Bound::Excluded(after_prefix(&p)));
        match self.table(Table::Process).range(range).next() {
            None => Ok(None),
            Some(kv) => {
                let (k, v) = kv.into_inner()?;
                Ok(Some(
                    decode_due(&p, &k, &v)
                        .map_err(|e| corrupt(Table::Process, &k, e))?
                        .due_ms,
                ))
            }
        }
    }

    /// How many timers `pm` has pending (a key-only scan: for start-up and tests).
    pub fn count_timers(&self, pm: &str) -> Result<u64> {
        check("process manager", pm)?;
        let mut n = 0;
        for kv in self.table(Table::Process).prefix(prefix(b'd', pm)) {
            kv.key()?;
            n += 1;
        }
        Ok(n)
    }

    /// Every outbox entry of `pm`, in sequence order.
    pub fn outbox(&self, pm: &str) -> Result<Vec<OutboxRow>> {
        check("process manager", pm)?;
        let p = prefix(b'o', pm);
        let mut out = Vec::new();
        for kv in self.table(Table::Process).prefix(&p) {
            let (k, v) = kv.into_inner()?;
            let decode = || -> Result<OutboxRow, String> {
                let seq: [u8; 8] = k[p.len()..]
                    .try_into()
                    .map_err(|_| "outbox key is not a sequence number")?;
                Ok(OutboxRow {
                    seq: u64::from_be_bytes(seq),
                    data: unframe(&v)?.to_vec(),
                })
            };
            out.push(decode().map_err(|e| corrupt(Table::Process, &k, e))?);
        }
        Ok(out)
    }
}

fn decode_due(p: &[u8], k: &[u8], v: &[u8]) -> Result<TimerRow, String> {
    let rest = &k[p.len()..];
    let (due, rest) = rest.split_at_checked(8).ok_or("timer key too short")?;
    let due_ms = due_of(due.try_into().expect("8 bytes"));
    let sep = rest.iter().position(|b| *b == 0).ok_or("timer key without its id")?;
    let key = String::from_utf8(rest[..sep].to_vec()).map_err(|_| "timer key is not UTF-8")?;
    let timer = String::from_utf8(rest[sep + 1..].to_vec()).map_err(|_| "timer id is not UTF-8")?;
    let correlation_id = String::from_utf8(unframe(v)?.to_vec()).map_err(|_| "correlation id is not UTF-8")?;
    Ok(TimerRow {
        key,
        timer,
        due_ms,
        correlation_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;

    fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        (dir, s)
    }

    fn timer(key: &str, id: &str, due_ms: i64) -> TimerRow {
        TimerRow {
            key: key.into(),
            timer: id.into(),
            due_ms,
            correlation_id: format!("c-{key}"),
        }
    }

    #[test]
    fn due_timers_come_in_due_order_and_only_those_due() {
        let (_d, s) = open();
        let mut b = Batch::new();
        for t in [
            timer("b", "x", 30),
            timer("a", "x", 10),
            timer("a", "y", -5),
            timer("c", "x", 31),
        ] {
            b.put_timer("pm", &t);
        }
        b.put_timer("other", &timer("a", "x", 0));
        s.commit(b, false).unwrap();
        let due: Vec<_> = s.due_timers("pm", 30, 100).unwrap();
        assert_eq!(due, vec![timer("a", "y", -5), timer("a", "x", 10), timer("b", "x", 30)]);
        assert_eq!(s.due_timers("pm", 30, 2).unwrap().len(), 2);
        assert_eq!(s.due_timers("pm", i64::MAX, 100).unwrap().len(), 4);
        assert_eq!(s.next_timer_due("pm", None).unwrap(), Some(-5));
        assert_eq!(s.next_timer_due("pm", Some((10, "a", "y"))).unwrap(), Some(30));
        assert_eq!(
            s.due_timers_from("pm", Some((10, "a", "x")), 30, 100).unwrap(),
            vec![timer("a", "x", 10), timer("b", "x", 30)]
        );
        assert_eq!(
            s.due_timers_from("pm", Some((10, "a", "xx")), 30, 100).unwrap(),
            vec![timer("b", "x", 30)]
        );
        assert!(s.due_timers_from("pm", Some((31, "", "")), 30, 100).unwrap().is_empty());
        assert_eq!(s.count_timers("pm").unwrap(), 4);
        assert_eq!(
            s.timers_of("pm", "a").unwrap(),
            vec![timer("a", "x", 10), timer("a", "y", -5)]
        );

        let mut b = Batch::new();
        b.delete_timer("pm", "a", "y", -5);
        s.commit(b, false).unwrap();
        assert_eq!(s.next_timer_due("pm", None).unwrap(), Some(10));
        assert_eq!(s.timers_of("pm", "a").unwrap(), vec![timer("a", "x", 10)]);
        assert_eq!(s.count_timers("other").unwrap(), 1);
    }

    #[test]
    fn states_and_outboxes_round_trip_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
            let mut b = Batch::new();
            b.put_process_state("pm", "k", br#"{"n":1}"#);
            b.put_outbox("pm", 2, b"two");
            b.put_outbox("pm", 1, b"one");
            b.put_outbox("pm", 256, b"many");
            s.commit(b, true).unwrap();
        }
        let s = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(s.get_process_state("pm", "k").unwrap().unwrap(), br#"{"n":1}"#);
        assert_eq!(s.get_process_state("pm", "j").unwrap(), None);
        let seqs: Vec<u64> = s.outbox("pm").unwrap().iter().map(|o| o.seq).collect();
        assert_eq!(seqs, vec![1, 2, 256]);
        let mut b = Batch::new();
        b.delete_outbox("pm", 2);
        b.delete_process_state("pm", "k");
        s.commit(b, false).unwrap();
        assert_eq!(s.outbox("pm").unwrap().len(), 2);
        assert_eq!(s.get_process_state("pm", "k").unwrap(), None);
        assert!(s.get_process_state("pm", "a\0b").is_err());
    }
}
