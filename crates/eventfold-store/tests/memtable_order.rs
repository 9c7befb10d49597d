//! The memtable's key order (vendor/lsm-tree's `MemKey`: the first 48 bytes of a key held
//! in the memtable's B-tree node, compared before the whole key) must be exactly the byte
//! order of the keys. Keys here are chosen to break a wrong comparison: lengths on both
//! sides of the 48-byte head and of the 20 bytes the byte type keeps inline, runs of 0x00
//! (a key and the same key followed by zeros have equal padded heads), 0xff, shared
//! prefixes longer than the head, overwrites (newer entries of one key must come first)
//! and deletes. The index keys of a unique view index are `view 0 index 0 value` with the
//! value's bytes as given, so the test controls every byte.

use eventfold_store::{Batch, Store, StoreOptions};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const VIEW: &str = "v";
const INDEX: &str = "i";
/// `v 0 i 0`, before every value.
const PREFIX: usize = 4;

/// A value whose key crosses the interesting lengths; `base` is shared by a third of them.
fn value(rng: &mut rand::rngs::StdRng, base: &[u8]) -> Vec<u8> {
    const ALPHABET: [u8; 4] = [0x00, 0x01, b'a', 0xff];
    let mut v = if rng.random_bool(0.33) {
        base[..rng.random_range(0..=base.len())].to_vec()
    } else {
        Vec::new()
    };
    let extra = rng.random_range(0..=60 - PREFIX);
    for _ in 0..extra {
        v.push(ALPHABET[rng.random_range(0..ALPHABET.len())]);
    }
    v
}

/// The index entries as stored, `(value, row key)`, in the order a scan returns them.
fn stored(store: &Store) -> Vec<(Vec<u8>, String)> {
    store
        .dump_view(VIEW)
        .unwrap()
        .into_iter()
        .filter(|(table, _, _)| *table == "view_index")
        .map(|(_, key, _)| {
            let value = key[PREFIX..].to_vec();
            let row = store
                .get_view_unique(VIEW, INDEX, &value)
                .unwrap()
                .expect("a listed entry reads back");
            (value, row)
        })
        .collect()
}

fn check(store: &Store, model: &BTreeMap<Vec<u8>, String>, probes: &[Vec<u8>], when: &str) {
    let expected: Vec<(Vec<u8>, String)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let got = stored(store);
    assert_eq!(got.len(), expected.len(), "{when}: number of entries");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "{when}: entry {i} of the scan");
    }
    for p in probes {
        assert_eq!(
            store.get_view_unique(VIEW, INDEX, p).unwrap().as_ref(),
            model.get(p),
            "{when}: point read of {p:?}"
        );
    }
}

#[test]
fn memtable_keys_scan_and_read_back_in_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    // Longer than the 48-byte head: keys sharing it differ only after it.
    let base: Vec<u8> = (0..56u8).map(|i| if i % 7 == 0 { 0 } else { b'a' + i % 26 }).collect();
    let mut model: BTreeMap<Vec<u8>, String> = BTreeMap::new();
    let mut written: Vec<Vec<u8>> = Vec::new();
    let mut n = 0u64;
    for _ in 0..60 {
        let mut batch = Batch::new();
        for _ in 0..100 {
            n += 1;
            // Overwrite or delete an earlier value a quarter of the time each.
            let pick = rng.random_range(0..4);
            let v = if pick < 2 || written.is_empty() {
                value(&mut rng, &base)
            } else {
                written[rng.random_range(0..written.len())].clone()
            };
            if pick == 3 && !written.is_empty() {
                batch.delete_view_entry(VIEW, INDEX, &v, "", true);
                model.remove(&v);
            } else {
                let row = format!("r{n}");
                batch.put_view_entry(VIEW, INDEX, &v, &row, true);
                model.insert(v.clone(), row);
            }
            written.push(v);
        }
        store.commit(batch, false).unwrap();
    }
    // Every value written, the same values with a zero byte more or one byte less, and
    // values never written.
    let mut probes = written.clone();
    probes.extend(written.iter().map(|v| [v.as_slice(), &[0]].concat()));
    probes.extend(
        written
            .iter()
            .filter(|v| !v.is_empty())
            .map(|v| v[..v.len() - 1].to_vec()),
    );
    probes.extend((0..500).map(|_| value(&mut rng, &base)));
    assert!(model.len() > 1_000, "enough live entries: {}", model.len());
    check(&store, &model, &probes, "in the memtable");
    store.flush().unwrap();
    check(&store, &model, &probes, "after a flush");
}
