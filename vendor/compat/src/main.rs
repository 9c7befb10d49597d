//! Reads a store that another build of fjall wrote: `write DIR` runs a fixed workload
//! into a new store, `read DIR` opens it and checks every key (scans and point reads,
//! present and absent keys) against a model of the same workload.
//!
//! `vendor/compat/run.sh` builds this twice, against crates.io's fjall 3.1.13 and
//! lsm-tree 3.1.10 and against eventfold's patched copies (feature `patched`), and reads
//! each build's store with the other: what the patches write, upstream reads, and the
//! other way round. The workload covers what the patches change on disk or around it:
//! table files with full filters (lsm-tree change 7), L0 tables of several flushes over
//! compacted levels, a log table split per key prefix (lsm-tree change 10), weak
//! tombstones (change 8), and unflushed writes left in a journal that the patched build
//! zero-filled ahead (fjall change 5), which the reader replays.

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const KEYSPACES: [&str; 3] = ["log", "state", "dedup"];
const LOG: usize = 0;
const STATE: usize = 1;
const DEDUP: usize = 2;
const PARTITIONS: u32 = 4;
/// Bytes of a log key that name its sequence, as eventfold's (topic tag and partition).
#[cfg_attr(not(feature = "patched"), allow(dead_code))]
const LOG_PREFIX: usize = 12;
/// Size of a journal file (fjall's `PRE_ALLOCATED_BYTES`).
const JOURNAL_FILE_BYTES: u64 = 64 * 1024 * 1024;

enum Op {
    Put(usize, Vec<u8>, Vec<u8>),
    Remove(usize, Vec<u8>),
    /// Only for keys written once, where it reads as a removal.
    RemoveWeak(usize, Vec<u8>),
    /// Patched build: wait until the journal's spare is ready (fjall change 5).
    AwaitSpare,
    Flush,
    Compact,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len.div_ceil(8))
        .flat_map(|i| mix(seed ^ ((i as u64) << 40)).to_le_bytes())
        .take(len)
        .collect()
}

fn log_key(partition: u32, seq: u64) -> Vec<u8> {
    let mut k = b"compat\0\0".to_vec();
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn state_key(i: u64) -> Vec<u8> {
    format!("state\0c-{:016x}", mix(i)).into_bytes()
}

fn dedup_key(i: u64) -> Vec<u8> {
    format!("dedup\0cmd-{i:08}").into_bytes()
}

/// The workload, in order. Round 0 writes more than fjall lets a journal grow to before a
/// flush rotates it (64 MB), waiting for the spare on the way, so that the rotation takes
/// the spare; rounds 1-2 flush and compact; round 3 stays in that journal, unflushed.
fn workload(mut apply: impl FnMut(Op) -> Result<()>) -> Result<()> {
    let mut seq = [0u64; PARTITIONS as usize];
    let mut log =
        |apply: &mut dyn FnMut(Op) -> Result<()>, per_partition: u64, spare_after: Option<u64>| -> Result<()> {
            for n in 0..per_partition {
                for p in 0..PARTITIONS {
                    let s = seq[p as usize];
                    seq[p as usize] += 1;
                    apply(Op::Put(LOG, log_key(p, s), value((u64::from(p) << 48) | s, 200)))?;
                }
                if Some(n) == spare_after {
                    apply(Op::AwaitSpare)?;
                }
            }
            Ok(())
        };

    // Round 0: about 70 MB of log records.
    for i in 0..20_000 {
        apply(Op::Put(STATE, state_key(i), value(i, 60)))?;
    }
    for i in 0..10_000 {
        apply(Op::Put(DEDUP, dedup_key(i), value((1 << 62) | i, 16)))?;
    }
    log(&mut apply, 75_000, Some(25_000))?;
    apply(Op::Flush)?;

    // Round 1: overwrites, removals, weak removals of keys written once; then compactions.
    for i in (0..20_000).step_by(3) {
        apply(Op::Put(STATE, state_key(i), value(i + 1_000_000, 60)))?;
    }
    for i in (0..20_000).step_by(7) {
        apply(Op::Remove(STATE, state_key(i)))?;
    }
    for i in 20_000..25_000 {
        apply(Op::Put(STATE, state_key(i), value(i, 60)))?;
    }
    for i in (0..10_000).step_by(5) {
        apply(Op::RemoveWeak(DEDUP, dedup_key(i)))?;
    }
    log(&mut apply, 2_000, None)?;
    apply(Op::Flush)?;
    apply(Op::Compact)?;

    // Round 2: L0 tables over the compacted ones.
    for i in 25_000..30_000 {
        apply(Op::Put(STATE, state_key(i), value(i, 60)))?;
    }
    for i in (1..20_000).step_by(11) {
        apply(Op::Remove(STATE, state_key(i)))?;
    }
    log(&mut apply, 2_000, None)?;
    apply(Op::Flush)?;

    // Round 3: left in the journal, more than a quarter of it, so that the next journal's
    // spare is left beside it (recovery must pass over it).
    for i in (2..30_000).step_by(13) {
        apply(Op::Put(STATE, state_key(i), value(i + 2_000_000, 60)))?;
    }
    for i in (3..30_000).step_by(17) {
        apply(Op::Remove(STATE, state_key(i)))?;
    }
    for i in 10_000..11_000 {
        apply(Op::Put(DEDUP, dedup_key(i), value((1 << 62) | i, 16)))?;
    }
    log(&mut apply, 20_000, Some(16_000))?;
    Ok(())
}

/// What the workload leaves, per keyspace.
fn model() -> Result<Vec<BTreeMap<Vec<u8>, Vec<u8>>>> {
    let mut m = vec![BTreeMap::new(); KEYSPACES.len()];
    workload(|op| {
        match op {
            Op::Put(ks, k, v) => {
                m[ks].insert(k, v);
            }
            Op::Remove(ks, k) | Op::RemoveWeak(ks, k) => {
                m[ks].remove(&k);
            }
            Op::AwaitSpare | Op::Flush | Op::Compact => {}
        }
        Ok(())
    })?;
    Ok(m)
}

fn create_options(ks: usize) -> KeyspaceCreateOptions {
    let options = KeyspaceCreateOptions::default();
    if ks == DEDUP {
        return options;
    }
    // As eventfold's store creates its log, entity and state tables.
    options.compaction_strategy(std::sync::Arc::new(
        fjall::compaction::Leveled::default().with_l0_threshold(8),
    ))
}

fn journals(dir: &Path) -> Result<Vec<(u64, std::path::PathBuf, bool)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_owned();
        if let Some(id) = name.strip_suffix(".jnl").and_then(|id| id.parse().ok()) {
            found.push((id, path, false));
        } else if let Some(id) = name.strip_suffix(".jnl.spare").and_then(|id| id.parse().ok()) {
            found.push((id, path, true));
        }
    }
    found.sort();
    Ok(found)
}

fn write(dir: &Path) -> Result<()> {
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        return Err(format!("{} is not empty", dir.display()).into());
    }
    let db = Database::builder(dir).manual_journal_persist(true).open()?;
    let ks: Vec<Keyspace> = (0..KEYSPACES.len())
        .map(|i| db.keyspace(KEYSPACES[i], || create_options(i)))
        .collect::<std::result::Result<_, _>>()?;
    #[cfg(feature = "patched")]
    {
        use lsm_tree::AbstractTree;
        ks[LOG].tree.tree_config().split_tables_at_prefix(LOG_PREFIX);
    }
    let mut spares_awaited = 0;
    workload(|op| {
        match op {
            Op::Put(i, k, v) => ks[i].insert(k, v)?,
            Op::Remove(i, k) => ks[i].remove(k)?,
            Op::RemoveWeak(i, k) => ks[i].remove_weak(k)?,
            Op::AwaitSpare => {
                if cfg!(feature = "patched") {
                    let since = Instant::now();
                    while !journals(dir)?.iter().any(|j| j.2) {
                        if since.elapsed() > Duration::from_secs(120) {
                            return Err("no spare journal after 120 s".into());
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    spares_awaited += 1;
                }
            }
            Op::Flush => {
                for k in &ks {
                    k.rotate_memtable_and_wait()?;
                }
            }
            Op::Compact => {
                for k in &ks {
                    k.major_compact()?;
                }
            }
        }
        Ok(())
    })?;
    db.persist(PersistMode::SyncAll)?;

    let journals = journals(dir)?;
    let active = journals.iter().rfind(|j| !j.2).ok_or("no journal")?;
    let spare = journals.iter().find(|j| j.2).map(|j| j.0);
    let allocated = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&active.1)?.blocks() * 512
    };
    println!(
        "wrote {}: tables {:?}, active journal {} ({} of {} bytes allocated), spare journal {:?}",
        dir.display(),
        ks.iter().map(Keyspace::table_count).collect::<Vec<_>>(),
        active.0,
        allocated,
        JOURNAL_FILE_BYTES,
        spare
    );
    if cfg!(feature = "patched") {
        // The rotation took the spare: the unflushed writes sit in a zero-filled journal,
        // and the next one's spare lies beside it.
        if spares_awaited != 2 || active.0 == 0 || allocated < JOURNAL_FILE_BYTES {
            return Err("the active journal is not a zero-filled spare".into());
        }
        if spare != Some(active.0 + 1) {
            return Err(format!("no spare of journal {} left beside it", active.0 + 1).into());
        }
    }
    Ok(())
}

fn read(dir: &Path) -> Result<()> {
    let expected = model()?;
    let db = Database::builder(dir).open()?;
    let mut report = Vec::new();
    for (i, name) in KEYSPACES.iter().enumerate() {
        if !db.keyspace_exists(name) {
            return Err(format!("keyspace {name} is missing").into());
        }
        let ks = db.keyspace(name, KeyspaceCreateOptions::default)?;
        let want = &expected[i];

        let mut scanned = 0usize;
        let mut want_iter = want.iter();
        for kv in ks.iter() {
            let (k, v) = kv.into_inner()?;
            match want_iter.next() {
                Some((wk, wv)) if wk[..] == k[..] && wv[..] == v[..] => scanned += 1,
                Some((wk, _)) => {
                    return Err(format!("{name}: scan read {k:?} where {wk:?} (or its value) was written").into());
                }
                None => return Err(format!("{name}: scan read {k:?} after the last key written").into()),
            }
        }
        if let Some((wk, _)) = want_iter.next() {
            return Err(format!("{name}: scan ended before {wk:?}").into());
        }

        for (k, v) in want {
            match ks.get(k)? {
                Some(got) if got[..] == v[..] => {}
                other => return Err(format!("{name}: get({k:?}) read {other:?}").into()),
            }
        }
        let absent: Vec<Vec<u8>> = match i {
            LOG => (0..PARTITIONS)
                .flat_map(|p| (1_000_000..1_002_000).map(move |s| log_key(p, s)))
                .collect(),
            STATE => (1_000_000..1_010_000)
                .map(state_key)
                .chain((0..20_000).step_by(7).map(state_key))
                .collect(),
            _ => (20_000..30_000)
                .map(dedup_key)
                .chain((0..10_000).step_by(5).map(dedup_key))
                .collect(),
        };
        for k in &absent {
            if want.contains_key(k) {
                continue;
            }
            if let Some(got) = ks.get(k)? {
                return Err(format!("{name}: get({k:?}) of a key not there read {got:?}").into());
            }
        }
        report.push(format!(
            "{name}: {scanned} keys in {} tables ({} in L0), {} absent",
            ks.table_count(),
            ks.l0_table_count(),
            absent.len()
        ));
    }
    println!("read {}: {}", dir.display(), report.join("; "));
    Ok(())
}

/// Rewrites every table of the store (a major compaction of each keyspace), so that a
/// store written by a build of lsm-tree change 7 from before it kept upstream's filter
/// (a blocked filter in the `filter` section, which upstream refuses) becomes readable by
/// upstream: the way back for such stores, run with the patched build.
fn compact(dir: &Path) -> Result<()> {
    let db = Database::builder(dir).open()?;
    for name in KEYSPACES {
        let ks = db.keyspace(name, KeyspaceCreateOptions::default)?;
        ks.rotate_memtable_and_wait()?;
        ks.major_compact()?;
    }
    db.persist(PersistMode::SyncAll)?;
    println!("compacted {}", dir.display());
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let build = if cfg!(feature = "patched") {
        "patched"
    } else {
        "upstream"
    };
    match args.get(1..).unwrap_or_default() {
        [cmd, dir] if cmd == "write" => write(Path::new(dir)),
        [cmd, dir] if cmd == "read" => read(Path::new(dir)),
        [cmd, dir] if cmd == "compact" => compact(Path::new(dir)),
        _ => Err(format!("usage: {} write|read|compact DIR ({build} build)", args[0]).into()),
    }
    .map_err(|e| format!("{build} build: {e}").into())
}
