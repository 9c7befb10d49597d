//! The command path without HTTP: dedup while commits are in flight, versions under
//! concurrency, dedup expiry, and the restore barrier.

use eventfold_core::testing::{Counter, CounterEvent};
use eventfold_core::{Aggregate, Outcome};
use eventfold_log::Log;
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_log::testing::Intercept;
use eventfold_runtime::{CommandRequest, Error, ManualClock, PartitionState, Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

fn embedded(dir: &tempfile::TempDir, partitions: u32) -> Arc<dyn Log> {
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    Arc::new(
        EmbeddedLog::open(
            store,
            Options {
                partitions,
                ..Default::default()
            },
        )
        .unwrap(),
    )
}

fn add(id: &str, n: u64, key: Option<&str>) -> CommandRequest {
    CommandRequest {
        aggregate_id: id.into(),
        body: format!(r#"{{"type":"Add","n":{n}}}"#).into_bytes(),
        idempotency_key: key.map(str::to_owned),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_submitted_concurrently_executes_once() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder(RuntimeOptions::default())
        .aggregate::<Counter>(())
        .build(embedded(&dir, 2));
    let svc = rt.aggregate("counter").unwrap().clone();
    // Keep the partition busy so that copies arrive while the first is in flight.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                svc.submit(add("busy", 0, None)).await.map(|_| None)
            } else {
                svc.submit(add("once", 1, Some("the-key"))).await.map(Some)
            }
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        if let Some(o) = t.await.unwrap().unwrap() {
            outcomes.push(o);
        }
    }
    assert_eq!(outcomes.len(), 20);
    assert!(
        outcomes.windows(2).all(|w| w[0] == w[1]),
        "every copy gets the same outcome"
    );
    let state = svc.state("once").await.unwrap().unwrap();
    assert_eq!(state.version, 1, "executed exactly once");
    let events = svc.events("once", 1, 100).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].command_id, "the-key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_keep_versions_contiguous_and_state_equal_to_the_fold() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder(RuntimeOptions {
        max_batch: 7,
        // A tiny cache: evictions happen while batches are in flight.
        cache_limit: 3,
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(embedded(&dir, 3));
    let svc = rt.aggregate("counter").unwrap().clone();
    let mut tasks = Vec::new();
    for w in 0..32u64 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut accepted = Vec::new();
            for i in 0..30u64 {
                let id = format!("agg-{}", (w + i) % 10);
                let key = format!("w{w}-{i}");
                match svc.submit(add(&id, 1 + (i % 3), Some(&key))).await.unwrap() {
                    Outcome::Accepted(a) => accepted.push((id, key, a.version)),
                    Outcome::Rejected { error, .. } => assert_eq!(error, "limit_exceeded"),
                }
            }
            accepted
        }));
    }
    let mut acked: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for t in tasks {
        for (id, key, v) in t.await.unwrap() {
            acked.entry(id).or_default().push((key, v));
        }
    }
    for i in 0..10 {
        let id = format!("agg-{i}");
        let events = svc.events(&id, 1, 10_000).await.unwrap();
        let versions: Vec<u64> = events.iter().map(|e| e.version).collect();
        assert_eq!(
            versions,
            (1..=events.len() as u64).collect::<Vec<_>>(),
            "versions of {id} are 1..n"
        );
        let mut fold = Counter::default();
        for e in &events {
            fold.apply(&serde_json::from_str::<CounterEvent>(e.payload.get()).unwrap());
        }
        let state = svc.state(&id).await.unwrap().unwrap();
        assert_eq!(state.version, events.len() as u64);
        assert_eq!(
            serde_json::from_str::<Counter>(state.state.get()).unwrap(),
            fold,
            "state of {id} is the fold of its events"
        );
        let acks = acked.remove(&id).unwrap_or_default();
        assert_eq!(acks.len(), events.len(), "one event per accepted command of {id}");
        for (key, v) in acks {
            assert_eq!(
                events[(v - 1) as usize].command_id,
                key,
                "the acknowledged version of {key} holds its event"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_records_expire_after_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(1_000_000);
    let options = RuntimeOptions {
        dedup_window: Duration::from_secs(60),
        dedup_sweep_every: Duration::from_millis(20),
        ..Default::default()
    };
    let rt = Runtime::builder(options)
        .clock(Arc::new(clock.clone()))
        .aggregate::<Counter>(())
        .build(embedded(&dir, 1));
    let svc = rt.aggregate("counter").unwrap().clone();
    let first = svc.submit(add("c", 1, Some("k"))).await.unwrap();
    clock.advance(59_000);
    assert_eq!(
        svc.submit(add("c", 1, Some("k"))).await.unwrap(),
        first,
        "inside the window: the original outcome"
    );
    assert_eq!(svc.state("c").await.unwrap().unwrap().version, 1);
    // Past the window the record is ignored at once, dropped by a compaction or not: the
    // key is a new command.
    clock.advance(2_000);
    let again = svc.submit(add("c", 1, Some("k"))).await.unwrap();
    match &again {
        Outcome::Accepted(a) => assert_eq!(a.version, 2, "an expired key is a new command"),
        other => panic!("{other:?}"),
    }
    // Horizon ticks and, 61 s after the first, a whole-table compaction run; the key's
    // newer record stays.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let store = rt.log().store().clone();
    assert_eq!(
        svc.submit(add("c", 1, Some("k"))).await.unwrap(),
        again,
        "the reused key keeps its new outcome"
    );
    // Once that one expires too, the next whole-table compaction (a window after the
    // last) removes the record itself.
    clock.advance(61_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.get_dedup("counter", 0, "k").unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expired dedup record was not removed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_for_the_restore_barrier_and_overflow_gets_restoring() {
    let dir = tempfile::tempdir().unwrap();
    let (log, gate) = Intercept::new(embedded(&dir, 1)).gate_end_offsets();
    let log = Arc::new(log);
    let options = RuntimeOptions {
        restore_queue_limit: 2,
        ..Default::default()
    };
    let rt = Runtime::builder(options).aggregate::<Counter>(()).build(log);
    let svc = rt.aggregate("counter").unwrap().clone();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!rt.is_ready());
    assert!(rt.partitions().iter().all(|p| p.state == PartitionState::Restoring));

    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.submit(add(&format!("r{i}"), 1, None)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    match svc.submit(add("r9", 1, None)).await {
        Err(Error::Restoring { partition: 0, .. }) => {}
        other => panic!("a full restore queue answers Restoring, got {other:?}"),
    }
    assert!(
        waiting.iter().all(|t| !t.is_finished()),
        "commands wait while the partition restores"
    );
    gate.open();
    for t in waiting {
        assert!(
            matches!(t.await.unwrap().unwrap(), Outcome::Accepted(_)),
            "queued commands run after the barrier"
        );
    }
    assert!(rt.is_ready());
    let names: HashSet<_> = rt.aggregate_names().collect();
    assert_eq!(names, HashSet::from(["counter"]));
}

/// A retried key gets its original outcome back whichever way its dedup record holds it:
/// by reference to the events (what the live path writes) or as JSON (older stores, and
/// restores from a Kafka changelog).
/// A reference to events the store does not hold stops the partition, naming the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_keys_get_their_outcome_back_from_either_dedup_format() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder(RuntimeOptions::default())
        .aggregate::<Counter>(())
        .build(embedded(&dir, 1));
    let svc = rt.aggregate("counter").unwrap().clone();
    let slow = |key: &str| CommandRequest {
        aggregate_id: "c-1".into(),
        body: br#"{"type":"Slow","ms":0}"#.to_vec(),
        idempotency_key: Some(key.into()),
        ..Default::default()
    };
    svc.submit(add("c-1", 1, None)).await.unwrap();
    let added = svc.submit(add("c-1", 2, Some("k-add"))).await.unwrap();
    let nothing = svc.submit(slow("k-none")).await.unwrap();
    // Later events of the aggregate must not leak into the replayed outcomes.
    svc.submit(add("c-1", 3, None)).await.unwrap();
    let Outcome::Accepted(a) = &added else {
        panic!("accepted: {added:?}")
    };
    assert_eq!((a.version, a.events.len()), (2, 1));

    let store = rt.log().store().clone();
    let row = store.get_dedup("counter", 0, "k-add").unwrap().unwrap();
    assert_eq!(row.outcome[0], 0x01, "refers to its events");
    assert!(row.outcome.len() < 20, "{} bytes", row.outcome.len());
    assert_eq!(svc.submit(add("c-1", 2, Some("k-add"))).await.unwrap(), added);
    assert_eq!(svc.submit(slow("k-none")).await.unwrap(), nothing);

    // As a store written before references held it: the outcome's JSON, no position.
    let mut old = added.clone();
    if let Outcome::Accepted(a) = &mut old {
        a.position.clear();
    }
    let mut b = eventfold_store::Batch::new();
    b.put_dedup(
        "counter",
        0,
        "k-old",
        row.timestamp_ms,
        &serde_json::to_vec(&old).unwrap(),
    );
    let mut bad = vec![0x01];
    bad.extend_from_slice(&9u64.to_le_bytes());
    bad.extend_from_slice(&1u32.to_le_bytes());
    bad.extend_from_slice(b"c-1");
    b.put_dedup("counter", 0, "k-bad", row.timestamp_ms, &bad);
    store.commit(b, true).unwrap();
    assert_eq!(svc.submit(add("c-1", 2, Some("k-old"))).await.unwrap(), added);

    let err = svc.submit(add("c-1", 2, Some("k-bad"))).await.unwrap_err().to_string();
    assert!(
        err.contains("table `dedup`") && err.contains("k-bad") && err.contains("versions 9..=9"),
        "{err}"
    );
    assert_eq!(svc.state("c-1").await.unwrap().unwrap().version, 3, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_are_stored_every_few_versions_and_loads_fold_the_events_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder(RuntimeOptions {
        state_every: 4,
        // Nothing stays in memory between batches: every command loads its aggregate
        // from the store, as after a restart.
        cache_limit: 0,
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(embedded(&dir, 1));
    let svc = rt.aggregate("counter").unwrap().clone();
    let store = rt.log().store().clone();
    let mut total = 0;
    for v in 1..=10u64 {
        match svc.submit(add("a", v, None)).await.unwrap() {
            Outcome::Accepted(a) => assert_eq!(a.version, v, "built on version {}", v - 1),
            other => panic!("{other:?}"),
        }
        total += v;
        let stored = store.get_state("counter", "a").unwrap().map(|row| row.version);
        assert_eq!(stored, (v >= 4).then_some(v / 4 * 4), "stored state after version {v}");
        let state = svc.state("a").await.unwrap().unwrap();
        assert_eq!(state.version, v);
        assert_eq!(
            serde_json::from_str::<Counter>(state.state.get()).unwrap(),
            Counter { total },
            "state at version {v} is the stored one with the events after it"
        );
    }
    // The rule checks the folded total: 55 + 46 is above the limit, and nothing is written.
    match svc.submit(add("a", 46, None)).await.unwrap() {
        Outcome::Rejected { error, .. } => assert_eq!(error, "limit_exceeded"),
        other => panic!("{other:?}"),
    }
    assert_eq!(svc.state("a").await.unwrap().unwrap().version, 10);
    assert!(svc.state("never").await.unwrap().is_none(), "no state, no events: none");

    // An event after the stored state that does not decode fails the read and names it.
    let topic = "app.counter.events";
    let event = store.entity_events(topic, b"a", 10, 1).unwrap().remove(0);
    let mut record = event.record.clone();
    record.value = br#"{"type":"Nope"}"#.to_vec();
    let mut b = eventfold_store::Batch::new();
    b.put_log(topic, event.partition, event.offset, &record);
    store.commit(b, true).unwrap();
    let err = svc.state("a").await.unwrap_err().to_string();
    assert!(
        err.contains("table `log`") && err.contains("event 10 of counter/a does not decode"),
        "{err}"
    );
    let err = svc.submit(add("a", 1, None)).await.unwrap_err().to_string();
    assert!(err.contains("event 10 of counter/a does not decode"), "{err}");
}

/// What a test sees of a log whose commits are held (see [`held_commits`]): how many are
/// under way, the most at once, and the permits that release them one each.
struct Held {
    outstanding: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
    release: Arc<tokio::sync::Semaphore>,
}

/// `inner` with the answer of every commit held back until the test releases it, counting
/// how many are under way (what a processor keeps in flight); it says `units` for
/// `units_in_flight`.
fn held_commits(inner: Arc<dyn Log>, units: usize) -> (Intercept, Held) {
    use std::sync::atomic::Ordering::SeqCst;
    let held = Held {
        outstanding: Default::default(),
        most: Default::default(),
        release: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let (outstanding, most, release) = (held.outstanding.clone(), held.most.clone(), held.release.clone());
    let log = Intercept::new(inner)
        .units_in_flight(units)
        .on_commit(move |inner, unit| {
            let now = outstanding.fetch_add(1, SeqCst) + 1;
            most.fetch_max(now, SeqCst);
            let committed = inner.commit(unit);
            let (outstanding, release) = (outstanding.clone(), release.clone());
            Box::pin(async move {
                release.acquire().await.expect("never closed").forget();
                let receipt = committed.await;
                outstanding.fetch_sub(1, SeqCst);
                receipt
            })
        });
    (log, held)
}

/// Submits commands one at a time to a partition whose commits are held until the last
/// was submitted, and returns the most commits it had under way at once; then lets them
/// finish.
async fn most_commits_under_way(units: usize, max_inflight_commits: Option<usize>) -> usize {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (log, held) = held_commits(embedded(&dir, 1), units);
    let (most, release) = (held.most, held.release);
    let rt = Runtime::builder(RuntimeOptions {
        max_inflight_commits,
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(Arc::new(log));
    let svc = rt.aggregate("counter").unwrap().clone();
    let mut tasks = Vec::new();
    for i in 0..12 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(
            async move { svc.submit(add(&format!("c{i}"), 1, None)).await },
        ));
        // Each command comes while the earlier ones' commits are held: a unit of its own
        // as long as the processor may start one.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let seen = most.load(SeqCst);
    release.add_permits(1_000);
    for t in tasks {
        let outcome = t.await.unwrap().expect("every command commits once released");
        assert!(
            matches!(outcome, Outcome::Accepted(a) if a.version == 1),
            "accepted at version 1"
        );
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processors_keep_as_many_commits_under_way_as_the_log_asks_unless_told() {
    assert_eq!(most_commits_under_way(3, None).await, 3, "the log's units_in_flight");
    assert_eq!(most_commits_under_way(7, None).await, 7, "the log's units_in_flight");
    assert_eq!(most_commits_under_way(7, Some(2)).await, 2, "the runtime option wins");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_cache_keeps_its_limit_while_commits_are_always_under_way() {
    // Under a steady load a partition always has a unit in flight. Commits are held and
    // released one at a time, each only once a newer command is under way, so no commit
    // ever finishes with nothing behind it; 200 new aggregates pass through a cache of 10.
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (log, held) = held_commits(embedded(&dir, 1), 4);
    let (outstanding, release) = (held.outstanding, held.release);
    let rt = Runtime::builder(RuntimeOptions {
        cache_limit: 10,
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(Arc::new(log));
    let svc = rt.aggregate("counter").unwrap().clone();
    let under_way = |n: usize| {
        let outstanding = outstanding.clone();
        async move {
            let waited = std::time::Instant::now();
            while outstanding.load(SeqCst) < n {
                assert!(
                    waited.elapsed() < Duration::from_secs(10),
                    "{n} commits never under way"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    let submit = |i: u64| {
        let svc = svc.clone();
        tokio::spawn(async move { svc.submit(add(&format!("fresh-{i}"), 1, None)).await })
    };
    let cached = |rt: &Runtime| rt.partitions().iter().map(|p| p.cached_aggregates).sum::<u64>();
    let mut oldest = submit(0);
    under_way(1).await;
    let mut most = 0;
    for i in 1..200u64 {
        let next = submit(i);
        under_way(2).await;
        release.add_permits(1);
        let outcome = oldest.await.unwrap().expect("commits");
        assert!(
            matches!(outcome, Outcome::Accepted(ref a) if a.version == 1),
            "{outcome:?}"
        );
        most = most.max(cached(&rt));
        oldest = next;
    }
    release.add_permits(1);
    oldest.await.unwrap().expect("commits");
    // At most the limit, plus the aggregate of the unit still in flight and the batch
    // being added when the limit is crossed.
    assert!(most <= 12, "the cache held up to {most} aggregates with a limit of 10");
    assert!(most >= 10, "the cache filled up to its limit: {most}");
    assert!(
        rt.render_metrics()
            .contains("eventfold_partition_cached_aggregates{aggregate=\"counter\",partition=\"0\"}"),
        "exported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_limit_bounds_the_aggregates_cached_over_all_partitions() {
    // 800 new aggregates over 4 partitions, 16 at a time, with a limit of 40 for the type:
    // once every command of a round is answered, the partitions together hold at most 40
    // (a limit per partition would let them hold 160).
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder(RuntimeOptions {
        cache_limit: 40,
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .build(embedded(&dir, 4));
    let svc = rt.aggregate("counter").unwrap().clone();
    let cached = || rt.partitions().iter().map(|p| p.cached_aggregates).sum::<u64>();
    let mut most = 0;
    for round in 0..50u64 {
        let tasks: Vec<_> = (0..16u64)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move { svc.submit(add(&format!("new-{round}-{i}"), 1, None)).await })
            })
            .collect();
        for t in tasks {
            let outcome = t.await.unwrap().expect("commits");
            assert!(
                matches!(outcome, Outcome::Accepted(ref a) if a.version == 1),
                "{outcome:?}"
            );
        }
        let now = cached();
        assert!(now <= 40, "round {round}: {now} aggregates cached with a limit of 40");
        most = most.max(now);
    }
    assert!(most >= 16, "the cache was used: at most {most} aggregates in it");
    // Cached aggregates still answer with their newest version.
    match svc.submit(add("new-49-15", 1, None)).await.unwrap() {
        Outcome::Accepted(a) => assert_eq!(a.version, 2),
        other => panic!("{other:?}"),
    }
}
