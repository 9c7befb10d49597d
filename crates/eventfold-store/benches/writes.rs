//! Store write and lookup cost without the runtime, the network or fsync: what the
//! embedded committer spends per command on the memtables, and a processor per lookup.
//!
//! Each "command" writes what the shop's command path writes for a new order: an entity
//! index entry, a state row and a dedup row, with the key shapes of `eventfold load`
//! (ids `load-<12 hex>-<n>`, idempotency keys `<12 hex>-<n>`), 128 commands per batch, 64
//! ids in flight round-robin (so consecutive keys are not neighbours). Then as many state
//! lookups of ids that are not there (a new aggregate's first command).
//!
//! `cargo bench -p eventfold-store --bench writes -- [--commands 400000] [--runs 3]`

use eventfold_store::{Batch, Store, StoreOptions};
use std::time::Instant;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Nanoseconds per command written and per lookup, for one fresh store.
fn run_once(commands: u64) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Store::open(dir.path(), &StoreOptions::default()).expect("open store");
    let run = format!("{:012x}", rand::random::<u64>() >> 16);
    let id = |n: u64| format!("load-{run}-{}", (n % 64) * 1_000_000 + n / 64);
    let state = br#"{"status":"placed","customer_id":"c1","items":[{"sku":"s","qty":1,"price_cents":100}]}"#;
    let started = Instant::now();
    let mut n = 0;
    while n < commands {
        let mut batch = Batch::new();
        for _ in 0..128.min(commands - n) {
            let id = id(n);
            batch.put_entity("shop.order.events", id.as_bytes(), 1, (n % 8) as u32, n);
            batch.put_state("order", &id, 1, state);
            batch.put_dedup("order", (n % 8) as u32, &format!("{run}-{n}"), 0, b"{}");
            n += 1;
        }
        store.commit(batch, false).expect("commit");
    }
    let write_ns = started.elapsed().as_nanos() as f64 / commands as f64;
    let started = Instant::now();
    for n in 0..commands {
        let missing = format!("load-{run}-x{n}");
        assert!(store.get_state("order", &missing).expect("lookup").is_none());
    }
    let read_ns = started.elapsed().as_nanos() as f64 / commands as f64;
    (write_ns, read_ns)
}

fn main() {
    let commands = arg("--commands", 400_000);
    let runs = arg("--runs", 3);
    eprintln!("{commands} commands per run (entity, state and dedup rows), {runs} runs");
    let mut results: Vec<(f64, f64)> = (0..runs)
        .map(|_| {
            let (w, r) = run_once(commands);
            eprintln!("  run: {w:.0} ns per command written, {r:.0} ns per state lookup");
            (w, r)
        })
        .collect();
    results.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (w, _) = results[results.len() / 2];
    results.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (_, r) = results[results.len() / 2];
    println!("median: {w:.0} ns per command written, {r:.0} ns per state lookup");
}
