//! Reads through the memtable. The vendored lsm-tree keeps a memtable in a B-tree whose
//! iterators copy out a chunk of entries per read lock (16 at first, doubling up to 256)
//! and resume after the last key taken at each end, and answers a point read of a key its Bloom filter has not seen
//! without searching (vendor/README.md). These tests read far more than a chunk,
//! forwards, backwards and bounded on both sides, and point reads between writes, in the
//! memtable and again after a flush or a reopen, and compare every answer with a model: a
//! chunk boundary that drops an entry, two ends that cross, or a filter that misses a key
//! fails them.

use eventfold_core::IndexValue;
use eventfold_core::envelope::Record;
use eventfold_store::{Batch, Scan, Store, StoreOptions, encode_value};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

fn record(partition: u32, offset: u64) -> Record {
    Record {
        key: format!("k-{partition}-{offset}").into_bytes(),
        value: format!("{{\"p\":{partition},\"o\":{offset}}}").into_bytes(),
        headers: Vec::new(),
        timestamp_ms: offset as i64,
    }
}

#[test]
fn log_reads_and_ends_span_many_chunks_in_the_memtable_and_after_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    // Partitions interleaved in every batch, as the committer writes them.
    let counts = [1_000u64, 129, 128, 127, 1, 0, 700];
    let mut next = [0u64; 7];
    loop {
        let mut batch = Batch::new();
        let mut any = false;
        for (p, count) in counts.iter().enumerate() {
            for _ in 0..37 {
                if next[p] < *count {
                    batch.put_log("t", p as u32, next[p], &record(p as u32, next[p]));
                    next[p] += 1;
                    any = true;
                }
            }
        }
        if !any {
            break;
        }
        store.commit(batch, false).unwrap();
    }
    let check = |when: &str| {
        for (p, count) in counts.iter().enumerate() {
            let p32 = p as u32;
            // The end is read backwards through the partition's key prefix.
            assert_eq!(
                store.stored_log_end("t", p32).unwrap(),
                *count,
                "{when}: end of partition {p}"
            );
            for from in [0, 1, 127, 128, 129, 500, 999, 1_000, 1_001] {
                for max in [1, 128, 129, 300, usize::MAX] {
                    let got = store.read_log("t", p32, from, max).unwrap();
                    let want: Vec<u64> = (from..*count).take(max).collect();
                    let offsets: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
                    assert_eq!(offsets, want, "{when}: partition {p} from {from} max {max}");
                    for (o, r) in &got {
                        assert_eq!(r.value, record(p32, *o).value, "{when}: record {p}/{o}");
                    }
                }
            }
        }
    };
    check("in the memtable");
    store.flush().unwrap();
    check("after a flush");
}

#[test]
fn index_scans_of_thousands_of_entries_match_a_model_in_both_directions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xc4a2);
    let mut model: BTreeMap<String, i64> = BTreeMap::new();
    for chunk in 0..6 {
        let mut batch = Batch::new();
        for i in 0..500 {
            let key = format!("r{chunk}-{i:04}");
            let v = rng.random_range(-1_000..1_000_i64);
            batch.put_view_row("v", &key, format!("{{\"n\":{v}}}").as_bytes());
            batch.put_view_entry("v", "n", &encode_value(&IndexValue::Int(v.into())), &key, false);
            model.insert(key, v);
        }
        store.commit(batch, false).unwrap();
    }
    let enc = |v: i64| encode_value(&IndexValue::Int(v.into()));
    let check = |when: &str, rng: &mut rand::rngs::StdRng| {
        for round in 0..30 {
            // Whole index in the first rounds, then random bounds.
            let (lo, hi) = if round < 2 {
                (-2_000, 2_000)
            } else {
                let a = rng.random_range(-1_100..1_100_i64);
                let b = rng.random_range(-1_100..1_100_i64);
                (a.min(b), a.max(b))
            };
            let descending = round % 2 == 1;
            let mut want: Vec<(i64, String)> = model
                .iter()
                .filter(|(_, v)| **v >= lo && **v < hi)
                .map(|(k, v)| (*v, k.clone()))
                .collect();
            want.sort();
            if descending {
                want.reverse();
            }
            let page = store
                .scan_view(
                    "v",
                    Some("n"),
                    &Scan {
                        gte: Some(enc(lo)),
                        lt: Some(enc(hi)),
                        descending,
                        limit: 10_000,
                        max_scanned: 10_000,
                        ..Default::default()
                    },
                    &mut |_, _| true,
                )
                .unwrap();
            let got: Vec<String> = page.rows.into_iter().map(|h| h.key).collect();
            let want: Vec<String> = want.into_iter().map(|(_, k)| k).collect();
            assert_eq!(got.len(), want.len(), "{when}: [{lo},{hi}) descending {descending}");
            assert_eq!(got, want, "{when}: [{lo},{hi}) descending {descending}");
        }
    };
    check("in the memtable", &mut rng);
    store.flush().unwrap();
    check("after a flush", &mut rng);
}

#[test]
fn point_reads_between_writes_find_every_key_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xf11e);
    let mut model: HashMap<String, u64> = HashMap::new();
    let check = |store: &Store, model: &HashMap<String, u64>, when: &str| {
        for (id, version) in model {
            let row = store.get_state("order", id).unwrap();
            assert_eq!(row.map(|r| r.version), Some(*version), "{when}: state of {id}");
        }
        for i in 0..500 {
            let id = format!("absent-{i}");
            assert!(store.get_state("order", &id).unwrap().is_none(), "{when}: {id}");
        }
    };
    // The first point read builds the memtable's filter from the keys in it; later writes
    // add to the filter as they go in.
    for round in 0..40u64 {
        let mut batch = Batch::new();
        for i in 0..150 {
            // New ids mostly, and some written before (a newer version of the same key).
            let id = if round > 0 && rng.random_bool(0.2) {
                format!("o-{}-{}", rng.random_range(0..round), rng.random_range(0..150))
            } else {
                format!("o-{round}-{i}")
            };
            let version = model.get(&id).copied().unwrap_or(0) + 1;
            batch.put_state("order", &id, version, b"{}");
            model.insert(id, version);
        }
        store.commit(batch, false).unwrap();
        if round % 4 == 3 {
            check(&store, &model, &format!("after round {round}"));
        }
    }
    // Reopened: the journal is replayed into a new memtable, whose filter is built at the
    // first read.
    drop(store);
    store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    check(&store, &model, "after a reopen");
    store.flush().unwrap();
    check(&store, &model, "after a flush");
}
