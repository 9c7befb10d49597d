//! The conformance suite of the [`Log`] trait. Every backend runs all of it:
//!
//! ```
//! use async_trait::async_trait;
//! use eventfold_log::Log;
//! use eventfold_log::conformance::{Factory, run_all};
//! use eventfold_log::embedded::{EmbeddedLog, Options};
//! use eventfold_store::{Store, StoreOptions};
//! use std::sync::{Arc, Mutex};
//!
//! /// The embedded log over one directory. A store is locked by one handle at a time, so
//! /// the open log is handed out again rather than opened twice.
//! struct Embedded {
//!     dir: tempfile::TempDir,
//!     open: Mutex<Option<Arc<dyn Log>>>,
//! }
//!
//! #[async_trait]
//! impl Factory for Embedded {
//!     async fn open(&self) -> Arc<dyn Log> {
//!         let mut open = self.open.lock().unwrap();
//!         open.get_or_insert_with(|| {
//!             let store = Store::open(self.dir.path(), &StoreOptions::default()).unwrap();
//!             Arc::new(EmbeddedLog::open(store, Options { partitions: 2, ..Options::default() }).unwrap())
//!         })
//!         .clone()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() {
//! let factory = Embedded { dir: tempfile::tempdir().unwrap(), open: Mutex::new(None) };
//! run_all(&factory, "conf").await;
//! # }
//! ```
//!
//! `factory.open()` must return a log over the **same** underlying storage each time it
//! is called (same directory, same broker and app id), so durability across reopen is
//! checked. Each check uses its own topics under `prefix`, so one storage can serve all
//! (use a fresh prefix per run against a long-lived broker).
//!
//! Offsets are only required to **increase** in commit order: Kafka places transaction
//! markers between records, so offsets of committed records have gaps there. Records are
//! identified by content, never by assuming offset `n` holds the `n`-th record.

use crate::{Append, CommitUnit, Consumed, Log};
use async_trait::async_trait;
use eventfold_core::Record;
use eventfold_store::Batch;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Opens a backend over shared storage.
#[async_trait]
pub trait Factory: Send + Sync {
    /// A log over the same storage as every other call (a previous one may still be open
    /// or may have been dropped).
    async fn open(&self) -> Arc<dyn Log>;
}

/// A record stamped `ts` ms after the suite started. Stamps must be recent: on a topic with
/// time retention (a Kafka broker's default is 7 days), a 1970 batch gets a segment of its
/// own (the commit marker after it rolls one) that the broker deletes within minutes.
fn rec(key: &str, value: &str, ts: i64) -> Record {
    static STARTED_MS: OnceLock<i64> = OnceLock::new();
    let started = *STARTED_MS.get_or_init(|| {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        since_epoch.as_millis() as i64
    });
    Record {
        key: key.into(),
        value: value.into(),
        headers: vec![],
        timestamp_ms: started + ts,
    }
    .with_header("ef-type", "Test")
    .with_header("ef-aggregate-id", key)
}

fn append(topic: &Arc<str>, partition: u32, r: Record) -> Append {
    Append {
        topic: topic.clone(),
        partition,
        record: r,
        entity: None,
    }
}

/// Runs every check; panics with the name of the first that fails.
pub async fn run_all(factory: &dyn Factory, prefix: &str) {
    empty_partition_reads_nothing(factory, prefix).await;
    appends_get_increasing_offsets_per_partition(factory, prefix).await;
    records_round_trip_with_headers_and_timestamps(factory, prefix).await;
    read_respects_from_and_max(factory, prefix).await;
    read_with_lends_what_read_returns(factory, prefix).await;
    chunked_reads_see_every_record_once(factory, prefix).await;
    consumed_offsets_are_committed_with_the_unit(factory, prefix).await;
    records_built_from_offsets_commit_with_the_unit(factory, prefix).await;
    local_changes_are_committed_with_the_unit(factory, prefix).await;
    local_writes_are_visible_once_written(factory, prefix).await;
    concurrent_commits_lose_and_duplicate_nothing(factory, prefix).await;
    units_started_in_order_commit_in_order(factory, prefix).await;
    everything_survives_reopen(factory, prefix).await;
    partitions_out_of_range_are_errors(factory, prefix).await;
}

fn topic(prefix: &str, name: &str) -> Arc<str> {
    Arc::from(format!("{prefix}.{name}"))
}

/// A partition nobody wrote to has end offset 0 and reads empty.
pub async fn empty_partition_reads_nothing(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "empty");
    for p in 0..log.partitions() {
        assert_eq!(
            log.end_offset(&t, p).await.unwrap(),
            0,
            "end offset of an empty partition"
        );
        assert!(
            log.read(&t, p, 0, 10).await.unwrap().is_empty(),
            "read of an empty partition"
        );
    }
}

fn values(records: &[(u64, Record)]) -> Vec<String> {
    records
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(&r.value).into_owned())
        .collect()
}

fn assert_increasing(offsets: &[u64], what: &str) {
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "{what}: offsets increase ({offsets:?})"
    );
}

/// Offsets increase per partition in commit order, independently across partitions, and
/// reads return exactly the committed records in that order.
pub async fn appends_get_increasing_offsets_per_partition(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "order");
    let p1 = log.partitions().min(2) - 1;
    let unit = CommitUnit {
        appends: vec![
            append(&t, 0, rec("a", "1", 1)),
            append(&t, 0, rec("a", "2", 1)),
            append(&t, p1, rec("b", "3", 1)),
        ],
        ..Default::default()
    };
    let first = log.commit(unit).await.unwrap();
    assert_eq!(first.offsets.len(), 3, "one offset per append");
    assert!(first.offsets[0] < first.offsets[1], "offsets within a unit increase");
    let second = log
        .commit(CommitUnit {
            appends: vec![append(&t, 0, rec("a", "4", 1))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(second.offsets[0] > first.offsets[1], "a later unit gets higher offsets");
    let end = log.end_offset(&t, 0).await.unwrap();
    assert!(end > second.offsets[0], "end offset is past the last record");
    let got = log.read(&t, 0, 0, 100).await.unwrap();
    let offs: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
    assert_increasing(&offs, "read of partition 0");
    let want: Vec<&str> = if p1 == 0 {
        vec!["1", "2", "3", "4"]
    } else {
        vec!["1", "2", "4"]
    };
    assert_eq!(values(&got), want, "partition 0 holds exactly its records, in order");
    assert_eq!(offs[0], first.offsets[0], "the receipt names the record's offset");
}

/// Key, value, headers (in order) and timestamp come back as written.
pub async fn records_round_trip_with_headers_and_timestamps(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "roundtrip");
    let r = rec("agg-1", r#"{"type":"X","n":1}"#, 123).with_header("ef-version", "1");
    let receipt = log
        .commit(CommitUnit {
            appends: vec![append(&t, 0, r.clone())],
            ..Default::default()
        })
        .await
        .unwrap();
    let got = log.read(&t, 0, 0, 10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, receipt.offsets[0]);
    assert_eq!(got[0].1.key, r.key);
    assert_eq!(got[0].1.value, r.value);
    assert_eq!(got[0].1.timestamp_ms, r.timestamp_ms);
    for (k, v) in &r.headers {
        assert_eq!(got[0].1.header(k), Some(v.as_slice()), "header {k}");
    }
}

/// `read(from, max)` starts at `from` and returns at most `max` records.
pub async fn read_respects_from_and_max(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "window");
    let appends = (0..10).map(|i| append(&t, 0, rec("k", &i.to_string(), 1))).collect();
    let r = log
        .commit(CommitUnit {
            appends,
            ..Default::default()
        })
        .await
        .unwrap();
    let got = log.read(&t, 0, r.offsets[3], 4).await.unwrap();
    assert_eq!(values(&got), vec!["3", "4", "5", "6"]);
    assert_eq!(
        got.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        r.offsets[3..7].to_vec()
    );
    let end = log.end_offset(&t, 0).await.unwrap();
    assert!(log.read(&t, 0, end, 4).await.unwrap().is_empty(), "read at the end");
    assert!(
        log.read(&t, 0, end + 50, 4).await.unwrap().is_empty(),
        "read past the end"
    );
}

/// `read_with` hands over the records `read` returns, in order, with the same keys,
/// values, timestamps and headers, and stops as soon as the visitor says so.
pub async fn read_with_lends_what_read_returns(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "lend");
    let appends = (0..6)
        .map(|i| {
            let r = rec(&format!("agg-{i}"), &format!(r#"{{"n":{i}}}"#), i)
                .with_header("ef-version", i.to_string())
                .with_header("x-custom", vec![0xFF, i as u8]);
            append(&t, 0, r)
        })
        .collect();
    let receipt = log
        .commit(CommitUnit {
            appends,
            ..Default::default()
        })
        .await
        .unwrap();
    let owned = log.read(&t, 0, receipt.offsets[1], 4).await.unwrap();
    assert_eq!(owned.len(), 4);
    let mut lent = Vec::new();
    log.read_with(&t, 0, receipt.offsets[1], 4, &mut |offset, r| {
        assert_eq!(r.header_str("ef-version"), Some((lent.len() + 1).to_string().as_str()));
        assert_eq!(r.header("x-custom"), Some(&[0xFF, lent.len() as u8 + 1][..]));
        assert_eq!(r.header("absent"), None);
        lent.push((offset, r.to_record()));
        true
    })
    .await
    .unwrap();
    assert_eq!(lent, owned, "read_with lends what read returns");
    let mut seen = 0;
    log.read_with(&t, 0, 0, 10, &mut |_, _| {
        seen += 1;
        seen < 2
    })
    .await
    .unwrap();
    assert_eq!(seen, 2, "read_with stops when the visitor returns false");
}

/// Reading a partition chunk by chunk (`from` = the offset after the last record read)
/// returns every record exactly once and in order: one partition after the other, two at
/// once, again from an earlier offset, and after more appends (Kafka readers keep their
/// assignment between reads that continue one another).
pub async fn chunked_reads_see_every_record_once(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "chunks");
    let commit = |from: usize, to: usize| {
        let appends = (from..to)
            .flat_map(|i| {
                [
                    append(&t, 0, rec("a", &format!("a{i}"), 1)),
                    append(&t, 1, rec("b", &format!("b{i}"), 1)),
                ]
            })
            .collect();
        log.commit(CommitUnit {
            appends,
            ..Default::default()
        })
    };
    for (from, to) in [(0, 40), (40, 90), (90, 100)] {
        commit(from, to).await.unwrap(); // several transactions: markers between records
    }
    let chunked = |p: u32, from: u64, chunk: usize| {
        let (log, t) = (log.clone(), t.clone());
        async move {
            let (mut got, mut next) = (Vec::new(), from);
            loop {
                let records = log.read(&t, p, next, chunk).await.unwrap();
                let Some((o, _)) = records.last() else {
                    return got;
                };
                next = o + 1;
                got.extend(values(&records));
            }
        }
    };
    let expect = |p: &str, from: usize, to: usize| (from..to).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    assert_eq!(chunked(0, 0, 7).await, expect("a", 0, 100));
    assert_eq!(chunked(1, 0, 9).await, expect("b", 0, 100));
    // The same record twice: the second read starts before where the first reader went.
    let first = log.read(&t, 0, 0, 1).await.unwrap();
    let again = log.read(&t, 0, 0, 1).await.unwrap();
    assert_eq!((values(&first), values(&again)), (expect("a", 0, 1), expect("a", 0, 1)));
    // From the middle: a rewind for the reader that went on to the end.
    let a50 = log.read(&t, 0, 0, 51).await.unwrap()[50].0;
    assert_eq!(chunked(0, a50, 13).await, expect("a", 50, 100));
    let (a, b) = tokio::join!(chunked(0, 0, 11), chunked(1, 0, 6));
    assert_eq!((a, b), (expect("a", 0, 100), expect("b", 0, 100)), "two at once");
    // A reader at the end sees what is appended after.
    let ends = [
        log.end_offset(&t, 0).await.unwrap(),
        log.end_offset(&t, 1).await.unwrap(),
    ];
    assert!(log.read(&t, 0, ends[0], 5).await.unwrap().is_empty());
    commit(100, 110).await.unwrap();
    assert_eq!(chunked(0, ends[0], 4).await, expect("a", 100, 110));
    assert_eq!(chunked(1, ends[1], 4).await, expect("b", 100, 110));
}

/// Consumed offsets commit with the unit.
pub async fn consumed_offsets_are_committed_with_the_unit(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let input = topic(prefix, "input");
    let out = topic(prefix, "output");
    let group = format!("{prefix}-group");
    assert_eq!(log.committed_offset(&group, &input, 0).await.unwrap(), None);
    let unit = CommitUnit {
        appends: vec![append(&out, 0, rec("k", "v", 1))],
        consumed: vec![Consumed {
            group: group.clone(),
            topic: input.clone(),
            partition: 0,
            next_offset: 17,
        }],
        ..Default::default()
    };
    log.commit(unit).await.unwrap();
    assert_eq!(log.committed_offset(&group, &input, 0).await.unwrap(), Some(17));
}

/// `CommitUnit::then` gets the offsets assigned to the unit's appends; the records it
/// builds commit with the unit, after its own, and their offsets end the receipt.
pub async fn records_built_from_offsets_commit_with_the_unit(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let data = topic(prefix, "then-data");
    let notes = topic(prefix, "then-notes");
    for round in 0..2 {
        let notes_for = notes.clone();
        let unit = CommitUnit {
            appends: vec![
                append(&data, 1, rec("a", &format!("a{round}"), 1)),
                append(&data, 1, rec("b", &format!("b{round}"), 1)),
            ],
            then: Some(crate::Then::new(move |offsets: &[u64]| {
                let text = offsets.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
                vec![append(&notes_for, 0, rec("n", &text, 1))]
            })),
            ..Default::default()
        };
        let receipt = log.commit(unit).await.expect("a unit with a then commits");
        assert_eq!(
            receipt.offsets.len(),
            3,
            "the receipt holds the built record's offset too"
        );
        let data_read = log.read(&data, 1, receipt.offsets[0], 10).await.unwrap();
        let got: Vec<u64> = data_read.iter().map(|(o, _)| *o).collect();
        assert_eq!(got, receipt.offsets[..2], "the unit's own records at their offsets");
        let notes_read = log.read(&notes, 0, receipt.offsets[2], 1).await.unwrap();
        assert_eq!(notes_read.len(), 1, "the built record is committed");
        assert_eq!(notes_read[0].0, receipt.offsets[2]);
        assert_eq!(
            String::from_utf8(notes_read[0].1.value.clone()).unwrap(),
            format!("{},{}", receipt.offsets[0], receipt.offsets[1]),
            "the built record saw the offsets of the unit's appends"
        );
    }
}

/// `CommitUnit::local` is in the store once the commit returns.
pub async fn local_changes_are_committed_with_the_unit(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "local");
    let ty = format!("{prefix}-agg");
    let mut local = Batch::new();
    local.put_state(&ty, "a-1", 1, br#"{"n":1}"#);
    let mut a = append(&t, 0, rec("a-1", "e1", 1));
    a.entity = Some((b"a-1".to_vec(), 1));
    log.commit(CommitUnit {
        appends: vec![a],
        local,
        ..Default::default()
    })
    .await
    .unwrap();
    let row = log
        .store()
        .get_state(&ty, "a-1")
        .unwrap()
        .expect("state row committed with the unit");
    assert_eq!((row.version, row.json.as_slice()), (1, br#"{"n":1}"#.as_slice()));
    let ev = log.store().entity_events(&t, b"a-1", 1, 10).unwrap();
    assert_eq!(ev.len(), 1, "entity index committed with the unit");
    assert_eq!(ev[0].record.value, b"e1");
}

/// [`Log::write_local`]: its changes are readable once it resolves, a later write of the
/// same key wins over an earlier committed unit's, and writes mixed with concurrent units
/// lose nothing of either.
pub async fn local_writes_are_visible_once_written(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "localw");
    let ty = format!("{prefix}-localw");
    let mut local = Batch::new();
    local.put_state(&ty, "k", 1, br#"{"by":"unit"}"#);
    log.commit(CommitUnit {
        appends: vec![append(&t, 0, rec("k", "e", 1))],
        local,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut b = Batch::new();
    b.put_state(&ty, "k", 2, br#"{"by":"write_local"}"#);
    b.put_meta(&format!("{prefix}/localw/checkpoint"), 7);
    log.write_local(b).await.unwrap();
    let row = log.store().get_state(&ty, "k").unwrap().expect("written");
    assert_eq!(
        (row.version, row.json.as_slice()),
        (2, br#"{"by":"write_local"}"#.as_slice())
    );
    assert_eq!(
        log.store().get_meta(&format!("{prefix}/localw/checkpoint")).unwrap(),
        Some(7)
    );

    let mut units = Vec::new();
    let mut writes = Vec::new();
    for i in 0..50u64 {
        let mut local = Batch::new();
        local.put_state(&ty, &format!("u{i}"), 1, b"{}");
        units.push(log.commit(CommitUnit {
            appends: vec![append(&t, (i % 2) as u32, rec("u", &i.to_string(), 1))],
            local,
            ..Default::default()
        }));
        let mut b = Batch::new();
        b.put_state(&ty, &format!("w{i}"), 1, b"{}");
        writes.push(log.write_local(b));
    }
    for (u, w) in units.into_iter().zip(writes) {
        u.await.unwrap();
        w.await.unwrap();
    }
    for i in 0..50u64 {
        assert!(
            log.store().get_state(&ty, &format!("u{i}")).unwrap().is_some(),
            "unit {i}'s change"
        );
        assert!(
            log.store().get_state(&ty, &format!("w{i}")).unwrap().is_some(),
            "write {i}"
        );
    }
    let total = log.read(&t, 0, 0, 1000).await.unwrap().len() + log.read(&t, 1, 0, 1000).await.unwrap().len();
    assert_eq!(total, 51, "every unit's record once");
}

/// Many concurrent committers: every record lands once, offsets are distinct per
/// partition, and each committer's records keep their order.
pub async fn concurrent_commits_lose_and_duplicate_nothing(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "concurrent");
    let parts = log.partitions().min(4);
    let mut tasks = Vec::new();
    for w in 0..16u32 {
        let log = log.clone();
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..25u32 {
                let p = (w + i) % parts;
                let unit = CommitUnit {
                    appends: vec![append(&t, p, rec(&format!("w{w}"), &format!("{w}:{i}"), 1))],
                    ..Default::default()
                };
                let r = log.commit(unit).await.unwrap();
                mine.push((p, r.offsets[0], format!("{w}:{i}")));
            }
            mine
        }));
    }
    let mut written: HashMap<(u32, u64), String> = HashMap::new();
    let mut per_writer: HashMap<String, Vec<(u32, u64)>> = HashMap::new();
    for task in tasks {
        for (p, o, v) in task.await.unwrap() {
            per_writer
                .entry(v.split(':').next().unwrap().to_owned())
                .or_default()
                .push((p, o));
            assert!(written.insert((p, o), v).is_none(), "offset {p}/{o} handed out twice");
        }
    }
    let mut total = 0;
    for p in 0..parts {
        let recs = log.read(&t, p, 0, 10_000).await.unwrap();
        assert_increasing(
            &recs.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            "concurrent partition",
        );
        for (o, r) in &recs {
            assert_eq!(
                written.get(&(p, *o)).map(String::as_bytes),
                Some(r.value.as_slice()),
                "record at {p}/{o}"
            );
        }
        total += recs.len();
    }
    assert_eq!(total, 16 * 25, "every committed record is readable, once");
}

/// Units started one after the other (without awaiting) commit in that order: offsets
/// follow start order, and a later unit's local changes win over an earlier one's.
pub async fn units_started_in_order_commit_in_order(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "ordered");
    let ty = format!("{prefix}-ordered");
    let mut pending = Vec::new();
    for i in 0..200u64 {
        let mut local = Batch::new();
        local.put_state(&ty, "agg", i + 1, format!("{{\"v\":{i}}}").as_bytes());
        let unit = CommitUnit {
            appends: vec![append(&t, 0, rec("agg", &i.to_string(), 1))],
            local,
            ..Default::default()
        };
        pending.push(log.commit(unit));
    }
    // Awaited in reverse: the order is fixed when `commit` is called, not when awaited.
    let mut offsets = Vec::new();
    for p in pending.into_iter().rev() {
        offsets.push(p.await.unwrap().offsets[0]);
    }
    offsets.reverse();
    assert_increasing(&offsets, "units started in order");
    let got = log.read(&t, 0, 0, 1000).await.unwrap();
    assert_eq!(
        values(&got),
        (0..200).map(|i| i.to_string()).collect::<Vec<_>>(),
        "records in start order"
    );
    let row = log.store().get_state(&ty, "agg").unwrap().unwrap();
    assert_eq!(row.version, 200, "the last started unit's state is the one stored");
}

/// Records, offsets and local changes survive dropping and reopening the log.
pub async fn everything_survives_reopen(factory: &dyn Factory, prefix: &str) {
    let t = topic(prefix, "durable");
    let group = format!("{prefix}-durable");
    let first = {
        let log = factory.open().await;
        let mut local = Batch::new();
        local.put_meta(&format!("{prefix}-ckpt"), 9);
        let unit = CommitUnit {
            appends: vec![append(&t, 0, rec("k", "persisted", 1))],
            consumed: vec![Consumed {
                group: group.clone(),
                topic: t.clone(),
                partition: 0,
                next_offset: 1,
            }],
            local,
            lane: None,
            then: None,
        };
        log.commit(unit).await.unwrap().offsets[0]
    };
    let log = factory.open().await;
    assert!(log.end_offset(&t, 0).await.unwrap() > first);
    assert_eq!(values(&log.read(&t, 0, 0, 10).await.unwrap()), vec!["persisted"]);
    assert_eq!(log.committed_offset(&group, &t, 0).await.unwrap(), Some(1));
    assert_eq!(log.store().get_meta(&format!("{prefix}-ckpt")).unwrap(), Some(9));
    let r = log
        .commit(CommitUnit {
            appends: vec![append(&t, 0, rec("k", "next", 1))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(r.offsets[0] > first, "offsets continue after reopen");
}

/// Partitions outside `0..partitions()` are errors, not panics or silent writes.
pub async fn partitions_out_of_range_are_errors(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "range");
    let n = log.partitions();
    assert!(log.read(&t, n, 0, 1).await.is_err(), "read of partition {n}");
    assert!(log.end_offset(&t, n).await.is_err(), "end offset of partition {n}");
    let bad = CommitUnit {
        appends: vec![append(&t, n, rec("k", "v", 1))],
        ..Default::default()
    };
    assert!(log.commit(bad).await.is_err(), "append to partition {n}");
    assert_eq!(log.end_offset(&t, 0).await.unwrap(), 0, "a failed unit writes nothing");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With 1970 stamps a broker's retention task deleted the first transaction of a topic
    /// mid-suite: chunked reads from 0 then started at its log start (CI, "two at once").
    #[test]
    fn the_suites_records_are_stamped_now() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        for ts in [1, 123, 5] {
            let stamped = rec("k", "v", ts).timestamp_ms;
            assert!(
                (stamped - now).abs() < 60 * 60 * 1000,
                "{stamped} is not within an hour of {now}"
            );
        }
    }
}
