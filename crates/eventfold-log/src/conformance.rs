//! The conformance suite of the [`Log`] trait. Every backend runs all of it:
//!
//! ```ignore
//! eventfold_log::conformance::run_all(&factory, "prefix").await;
//! ```
//!
//! `factory.open()` must return a log over the **same** underlying storage each time it
//! is called (same directory, same broker and app id), so durability across reopen is
//! checked. Each check uses its own topics under `prefix`, so one storage can serve all.

use crate::{Append, CommitUnit, Consumed, Log};
use async_trait::async_trait;
use eventfold_core::Record;
use eventfold_store::Batch;
use std::collections::HashMap;
use std::sync::Arc;

/// Opens a backend over shared storage.
#[async_trait]
pub trait Factory: Send + Sync {
    /// A log over the same storage as every other call (a previous one may still be open
    /// or may have been dropped).
    async fn open(&self) -> Arc<dyn Log>;
}

fn rec(key: &str, value: &str, ts: i64) -> Record {
    Record {
        key: key.into(),
        value: value.into(),
        headers: vec![],
        timestamp_ms: ts,
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
    appends_get_contiguous_offsets_per_partition(factory, prefix).await;
    records_round_trip_with_headers_and_timestamps(factory, prefix).await;
    read_respects_from_and_max(factory, prefix).await;
    consumed_offsets_are_committed_with_the_unit(factory, prefix).await;
    local_changes_are_committed_with_the_unit(factory, prefix).await;
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

/// Offsets start at 0 and are contiguous per partition, independent across partitions.
pub async fn appends_get_contiguous_offsets_per_partition(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "contig");
    let p1 = log.partitions().min(2) - 1;
    let unit = CommitUnit {
        appends: vec![
            append(&t, 0, rec("a", "1", 1)),
            append(&t, 0, rec("a", "2", 1)),
            append(&t, p1, rec("b", "3", 1)),
        ],
        ..Default::default()
    };
    let r = log.commit(unit).await.unwrap();
    let want = if p1 == 0 { vec![0, 1, 2] } else { vec![0, 1, 0] };
    assert_eq!(r.offsets, want, "offsets of the first unit");
    let r = log
        .commit(CommitUnit {
            appends: vec![append(&t, 0, rec("a", "4", 1))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        r.offsets,
        vec![if p1 == 0 { 3 } else { 2 }],
        "offset after the first unit"
    );
    assert_eq!(log.end_offset(&t, 0).await.unwrap(), r.offsets[0] + 1);
}

/// Key, value, headers (in order) and timestamp come back as written.
pub async fn records_round_trip_with_headers_and_timestamps(factory: &dyn Factory, prefix: &str) {
    let log = factory.open().await;
    let t = topic(prefix, "roundtrip");
    let r = rec("agg-1", r#"{"type":"X","n":1}"#, 1_700_000_000_123).with_header("ef-version", "1");
    log.commit(CommitUnit {
        appends: vec![append(&t, 0, r.clone())],
        ..Default::default()
    })
    .await
    .unwrap();
    let got = log.read(&t, 0, 0, 10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 0);
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
    log.commit(CommitUnit {
        appends,
        ..Default::default()
    })
    .await
    .unwrap();
    let got = log.read(&t, 0, 3, 4).await.unwrap();
    let offs: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
    assert_eq!(offs, vec![3, 4, 5, 6]);
    assert_eq!(got[0].1.value, b"3");
    assert!(log.read(&t, 0, 10, 4).await.unwrap().is_empty(), "read at the end");
    assert!(log.read(&t, 0, 99, 4).await.unwrap().is_empty(), "read past the end");
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

/// Many concurrent committers: every record lands once, offsets are a permutation of
/// 0..n per partition, and each committer's records keep their order.
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
    for task in tasks {
        for (p, o, v) in task.await.unwrap() {
            assert!(written.insert((p, o), v).is_none(), "offset {p}/{o} handed out twice");
        }
    }
    let mut total = 0;
    for p in 0..parts {
        let recs = log.read(&t, p, 0, 10_000).await.unwrap();
        for (i, (o, r)) in recs.iter().enumerate() {
            assert_eq!(*o, i as u64, "offsets of partition {p} are contiguous");
            assert_eq!(
                written.get(&(p, *o)).map(String::as_bytes),
                Some(r.value.as_slice()),
                "record at {p}/{o}"
            );
        }
        total += recs.len();
    }
    assert_eq!(total, 16 * 25, "every committed record is readable");
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
    assert_eq!(
        offsets,
        (0..200).collect::<Vec<u64>>(),
        "offsets follow the order units were started in"
    );
    let row = log.store().get_state(&ty, "agg").unwrap().unwrap();
    assert_eq!(row.version, 200, "the last started unit's state is the one stored");
}

/// Records, offsets and local changes survive dropping and reopening the log.
pub async fn everything_survives_reopen(factory: &dyn Factory, prefix: &str) {
    let t = topic(prefix, "durable");
    let group = format!("{prefix}-durable");
    {
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
        };
        log.commit(unit).await.unwrap();
    }
    let log = factory.open().await;
    assert_eq!(log.end_offset(&t, 0).await.unwrap(), 1);
    assert_eq!(log.read(&t, 0, 0, 10).await.unwrap()[0].1.value, b"persisted");
    assert_eq!(log.committed_offset(&group, &t, 0).await.unwrap(), Some(1));
    assert_eq!(log.store().get_meta(&format!("{prefix}-ckpt")).unwrap(), Some(9));
    let r = log
        .commit(CommitUnit {
            appends: vec![append(&t, 0, rec("k", "next", 1))],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(r.offsets, vec![1], "offsets continue after reopen");
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
