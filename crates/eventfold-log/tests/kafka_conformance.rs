//! The Log conformance suite against the Kafka backend and a REAL Apache Kafka broker.
//!
//! The broker address is `EVENTFOLD_KAFKA_BOOTSTRAP` (default `127.0.0.1:9092`); start one
//! with `scripts/kafka/broker.sh start` (scripts/test.sh does). Without a broker these tests
//! fail: Kafka tests never skip silently.

use async_trait::async_trait;
use eventfold_log::conformance::{Factory, run_all};
use eventfold_log::kafka::{KafkaLog, KafkaOptions};
use eventfold_log::{Append, CommitUnit, Coordinated, Error, Log};
use eventfold_store::{Store, StoreOptions};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

const PARTITIONS: u32 = 4;

/// A timestamp for records on topics with time retention (`.throughput`, `.results`): a
/// broker deletes a transaction of 1970 records within minutes, before tests read it.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

use eventfold_log::testing::require_kafka_broker as require_broker;

fn options(bootstrap: &str, partitions: u32, prefix: &str) -> KafkaOptions {
    let mut o = KafkaOptions::new(bootstrap, partitions, format!("{prefix}-tx"));
    o.operation_timeout = Duration::from_secs(20);
    o
}

/// Opens a KafkaLog over the same broker topics and the same store directory each time.
/// While a log from an earlier call is alive it is returned (one fjall handle per
/// directory); once dropped, the next call really reopens (a new producer with the same
/// transactional id, the store replayed from disk).
struct Kafka {
    bootstrap: String,
    prefix: String,
    dir: PathBuf,
    current: Mutex<Weak<KafkaLog>>,
    opened: Mutex<u32>,
}

#[async_trait]
impl Factory for Kafka {
    async fn open(&self) -> Arc<dyn Log> {
        if let Some(log) = self.current.lock().unwrap().upgrade() {
            return log;
        }
        let (bootstrap, prefix, dir) = (self.bootstrap.clone(), self.prefix.clone(), self.dir.clone());
        let log = tokio::task::spawn_blocking(move || {
            let store = Store::open(&dir, &StoreOptions::default()).expect("open the local store");
            KafkaLog::open(options(&bootstrap, PARTITIONS, &prefix), store)
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!("cannot open the Kafka log ({e}); is the broker up? `scripts/kafka/broker.sh start`")
        });
        let log = Arc::new(log);
        *self.current.lock().unwrap() = Arc::downgrade(&log);
        *self.opened.lock().unwrap() += 1;
        log
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_log_passes_the_conformance_suite() {
    let bootstrap = require_broker();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("conf-{}", uuid::Uuid::now_v7().simple());
    let f = Kafka {
        bootstrap,
        prefix: prefix.clone(),
        dir: dir.path().to_owned(),
        current: Mutex::new(Weak::new()),
        opened: Mutex::new(0),
    };
    let started = Instant::now();
    run_all(&f, &prefix).await;
    eprintln!(
        "kafka conformance suite: {:.1} s, {} opens of the log",
        started.elapsed().as_secs_f64(),
        f.opened.lock().unwrap()
    );
    throughput(&*f.open().await, &prefix).await;
}

/// Not a check: prints what group commit achieves here (16 concurrent writers, each
/// with 4 units in flight) and how long reads take.
async fn throughput(log: &dyn Log, prefix: &str) {
    let t: Arc<str> = Arc::from(format!("{prefix}.throughput"));
    let before = log.stats();
    let started = Instant::now();
    let t = &t;
    let writers = (0..16u32).map(|w| async move {
        let mut pending = std::collections::VecDeque::new();
        for i in 0..100u32 {
            let record = eventfold_core::Record {
                key: format!("w{w}").into_bytes(),
                value: format!("{w}:{i}").into_bytes(),
                headers: vec![],
                timestamp_ms: now_ms(),
            };
            pending.push_back(log.commit(CommitUnit {
                appends: vec![Append {
                    topic: t.clone(),
                    partition: w % PARTITIONS,
                    record,
                    entity: None,
                }],
                ..Default::default()
            }));
            if pending.len() >= 4 {
                pending.pop_front().unwrap().await.unwrap();
            }
        }
        for p in pending {
            p.await.unwrap();
        }
    });
    futures_join_all(writers).await;
    let secs = started.elapsed().as_secs_f64();
    let s = log.stats();
    let (txns, units) = (s.group_commits - before.group_commits, s.units - before.units);
    let read_started = Instant::now();
    let mut read = 0;
    for p in 0..PARTITIONS {
        read += log.read(t, p, 0, 10_000).await.unwrap().len();
    }
    assert_eq!(read, 1600, "every unit of the throughput run is readable");
    eprintln!(
        "kafka throughput: {units} units in {txns} transactions in {secs:.2} s: {:.0} units/s, {:.0} transactions/s, {:.1} units per transaction; reading 4 partitions of 400: {:.0} ms",
        units as f64 / secs,
        txns as f64 / secs,
        units as f64 / txns.max(1) as f64,
        read_started.elapsed().as_secs_f64() * 1e3,
    );
}

/// Polls every future to completion (no extra dependency for a join).
async fn futures_join_all<F: std::future::Future<Output = ()> + Send>(futures: impl Iterator<Item = F>) {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// An existing topic with another partition count is refused, naming the topic and both
/// counts; the log keeps serving its other topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_another_partition_count_is_refused() {
    let bootstrap = require_broker();
    let prefix = format!("parts-{}", uuid::Uuid::now_v7().simple());
    let topic: Arc<str> = Arc::from(format!("{prefix}.order.events"));
    let dir = tempfile::tempdir().unwrap();
    let open = |partitions: u32| {
        let (bootstrap, prefix) = (bootstrap.clone(), prefix.clone());
        let dir = dir.path().join(partitions.to_string());
        tokio::task::spawn_blocking(move || {
            let store = Store::open(&dir, &StoreOptions::default()).unwrap();
            KafkaLog::open(
                options(&bootstrap, partitions, &format!("{prefix}-{partitions}")),
                store,
            )
            .unwrap()
        })
    };
    let unit = |topic: &Arc<str>| CommitUnit {
        appends: vec![Append {
            topic: topic.clone(),
            partition: 0,
            record: Default::default(),
            entity: None,
        }],
        ..Default::default()
    };
    // Created with 2 partitions by a first log.
    let two = open(2).await.unwrap();
    two.commit(unit(&topic)).await.unwrap();
    drop(two);

    let four = open(4).await.unwrap();
    let check = |e: Error, what: &str| {
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Config(_)),
            "{what}: a configuration error, got {msg}"
        );
        for part in [&*topic, "2 partitions", "expects 4"] {
            assert!(msg.contains(part), "{what}: `{msg}` names {part:?}");
        }
    };
    check(four.end_offset(&topic, 0).await.unwrap_err(), "end_offset");
    check(four.read(&topic, 0, 0, 10).await.unwrap_err(), "read");
    check(four.commit(unit(&topic)).await.unwrap_err(), "commit");
    let other: Arc<str> = Arc::from(format!("{prefix}.order.state"));
    four.commit(unit(&other)).await.expect("other topics keep working");
    assert_eq!(four.read(&other, 0, 0, 10).await.unwrap().len(), 1);
}

/// Topics created beforehand with policies that would lose data (an events topic with a
/// finite retention, a state topic that deletes instead of compacting) are refused with a
/// configuration error naming the topic and the config; the other topics keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_whose_policy_would_lose_data_is_refused() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let bootstrap = require_broker();
    let prefix = format!("policy-{}", uuid::Uuid::now_v7().simple());
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let events = format!("{prefix}.order.events");
    let state = format!("{prefix}.order.state");
    let created = admin
        .create_topics(
            [
                &NewTopic::new(&events, 2, TopicReplication::Fixed(1)).set("retention.ms", "604800000"),
                &NewTopic::new(&state, 2, TopicReplication::Fixed(1)).set("cleanup.policy", "delete"),
            ],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");

    let dir = tempfile::tempdir().unwrap();
    let log = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    let unit = |topic: &str| CommitUnit {
        appends: vec![Append {
            topic: Arc::from(topic),
            partition: 0,
            record: Default::default(),
            entity: None,
        }],
        ..Default::default()
    };
    for (topic, names) in [
        (&events, ["retention.ms=604800000", "retention.ms=-1"]),
        (&state, ["cleanup.policy=delete", "cleanup.policy=compact"]),
    ] {
        let e = log.commit(unit(topic)).await.unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Config(_)), "a configuration error, got {msg}");
        for part in [topic.as_str(), names[0], names[1]] {
            assert!(msg.contains(part), "`{msg}` names {part:?}");
        }
        let e = log.end_offset(topic, 0).await.unwrap_err();
        assert!(matches!(e, Error::Config(_)), "reads are refused too: {e}");
    }
    let results = format!("{prefix}.order.results");
    log.commit(unit(&results)).await.expect("other topics keep working");
    assert_eq!(log.read(&results, 0, 0, 10).await.unwrap().len(), 1);
}

/// Opens a log with `options` on a new store directory under `dir`.
async fn open_log(options: KafkaOptions, dir: &tempfile::TempDir, name: &str) -> KafkaLog {
    let path = dir.path().join(name);
    tokio::task::spawn_blocking(move || {
        KafkaLog::open(options, Store::open(&path, &StoreOptions::default()).unwrap()).unwrap()
    })
    .await
    .unwrap()
}

/// A 2 MB value that the broker refuses (`message.max.bytes` of about 1 MB) even after the
/// producer's LZ4: pseudo-random bytes do not compress.
fn too_large_for_the_broker() -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..2 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn one(topic: &Arc<str>, partition: u32, value: Vec<u8>) -> CommitUnit {
    CommitUnit {
        appends: vec![Append {
            topic: topic.clone(),
            partition,
            record: eventfold_core::Record {
                key: b"k".to_vec(),
                value,
                headers: vec![],
                timestamp_ms: now_ms(),
            },
            entity: None,
        }],
        ..Default::default()
    }
}

/// The stage counters split the commits' time: a transaction without consumed offsets
/// spends next to nothing on `send_offsets`, one with them two broker round trips; every
/// other step takes time, and the steps together fit in the commits' write time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_stages_add_up_within_the_write_time() {
    let bootstrap = require_broker();
    let prefix = format!("stages-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let before = log.stats();
    assert_eq!(
        before.stages,
        eventfold_log::StageMicros::default(),
        "nothing committed yet"
    );
    for i in 0..3u32 {
        log.commit(one(&t, i % 2, format!("v{i}").into_bytes())).await.unwrap();
    }
    let plain = log.stats();
    assert_eq!(plain.group_commits - before.group_commits, 3);
    // Without consumed offsets the step asks the broker nothing: microseconds.
    assert!(
        plain.stages.send_offsets < 1_000,
        "no consumed offsets, no request: {plain:?}"
    );
    for (stage, micros) in plain.stages.named() {
        if stage != "send_offsets" {
            assert!(micros > 0, "stage {stage} took no time: {plain:?}");
        }
    }
    let mut with_offsets = one(&t, 0, b"consumed".to_vec());
    with_offsets.consumed = vec![eventfold_log::Consumed {
        group: format!("{prefix}-group"),
        topic: t.clone(),
        partition: 0,
        next_offset: 1,
    }];
    log.commit(with_offsets).await.unwrap();
    let after = log.stats();
    // Two requests to the broker (AddOffsetsToTxn, TxnOffsetCommit): more than 100 µs.
    let sent = after.stages.send_offsets - plain.stages.send_offsets;
    assert!(sent >= 100, "send_offsets took {sent} µs: {after:?}");
    let stages: u64 = after.stages.named().iter().map(|(_, m)| m).sum();
    assert!(
        stages <= after.write_micros,
        "the steps ({stages} µs) fit in the commits' write time ({} µs): {after:?}",
        after.write_micros
    );
}

/// `min_transaction_interval` spaces only back-to-back transactions. Units committed one
/// after the other, each awaited, find the lane idle and start at once; a stream of units
/// that keeps the queue full commits in transactions at least the interval apart, each
/// taking what arrived meanwhile, and every unit commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_back_to_back_transactions_keep_the_minimum_interval() {
    let bootstrap = require_broker();
    let prefix = format!("pace-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(&bootstrap, 2, &prefix);
    o.min_transaction_interval = eventfold_log::kafka::MAX_TRANSACTION_INTERVAL;
    o.transaction_quiet = None;
    let log = open_log(o, &dir, "a").await;
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    log.commit(one(&t, 0, b"first".to_vec())).await.unwrap();

    // One at a time: with the interval applied, four of these five would wait about 1 s.
    let started = Instant::now();
    for i in 0..5u32 {
        log.commit(one(&t, i % 2, format!("alone {i}").into_bytes()))
            .await
            .unwrap();
    }
    let alone = started.elapsed();
    assert!(
        alone < Duration::from_millis(2500),
        "five units committed one after the other took {alone:?}: a lone unit waited for the interval"
    );
    drop(log);

    // A steady stream on a log spacing transactions 250 ms keeps the lane busy.
    a_steady_stream_keeps_the_interval(&bootstrap, &prefix, &dir, &t, None).await;
}

/// A unit about every millisecond for 2 s on a log (named `b` in `dir`) spacing
/// transactions 250 ms, with `quiet`: every transaction takes longer than a millisecond
/// (librdkafka alone waits that long before it registers the partitions), so units queue
/// during each and the lane stays busy, and the stream never leaves a quiet spell of 100
/// ms. Every unit commits once, in transactions at least the interval apart.
async fn a_steady_stream_keeps_the_interval(
    bootstrap: &str,
    prefix: &str,
    dir: &tempfile::TempDir,
    t: &Arc<str>,
    quiet: Option<Duration>,
) {
    let interval = Duration::from_millis(250);
    let mut o = options(bootstrap, 2, prefix);
    o.min_transaction_interval = interval;
    o.transaction_quiet = quiet;
    let log = open_log(o, dir, "b").await;
    log.commit(one(t, 0, b"first".to_vec())).await.unwrap();
    let before = log.stats();
    let started = Instant::now();
    let mut pending = Vec::new();
    while started.elapsed() < Duration::from_secs(2) {
        pending.push(log.commit(one(t, pending.len() as u32 % 2, b"stream".to_vec())));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let units = pending.len() as u64;
    // Each was enqueued by `commit`: awaiting them in turn waits for all.
    for (i, receipt) in pending.into_iter().enumerate() {
        receipt
            .await
            .unwrap_or_else(|e| panic!("unit {i} of the stream failed: {e}"));
    }
    let took = started.elapsed();
    let after = log.stats();
    let transactions = after.group_commits - before.group_commits;
    assert_eq!(
        after.units - before.units,
        units,
        "every unit of the stream committed once"
    );
    let most = took.as_millis() / interval.as_millis() + 1;
    assert!(
        (2..=most as u64).contains(&transactions),
        "{units} units in {took:?} (quiet {quiet:?}) took {transactions} transactions: at most {most} are {interval:?} apart"
    );
}

/// `transaction_quiet` ends the wait for the interval early once units stop arriving: a
/// burst queued behind a transaction commits a quiet spell after its last unit, not a
/// whole interval after that transaction began; a steady stream, whose units never leave
/// such a spell, still commits in transactions the interval apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_spell_ends_the_wait_for_the_interval() {
    let bootstrap = require_broker();
    let prefix = format!("quiet-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let interval = eventfold_log::kafka::MAX_TRANSACTION_INTERVAL;
    let quiet = Duration::from_millis(100);
    let mut o = options(&bootstrap, 2, &prefix);
    o.min_transaction_interval = interval;
    o.transaction_quiet = Some(quiet);
    let log = open_log(o, &dir, "a").await;
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    log.commit(one(&t, 0, b"first".to_vec())).await.unwrap();

    for round in 0..3 {
        // One unit starts a transaction at once (the lane is idle); a burst queues
        // behind it while it runs, so the lane is busy when it ends.
        let started = Instant::now();
        let lead = log.commit(one(&t, 0, format!("lead {round}").into_bytes()));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let burst: Vec<_> = (0..10u32)
            .map(|i| log.commit(one(&t, i % 2, format!("burst {round} {i}").into_bytes())))
            .collect();
        lead.await.unwrap();
        for receipt in burst {
            receipt.await.unwrap();
        }
        let took = started.elapsed();
        assert!(
            took < interval - Duration::from_millis(200),
            "round {round}: a burst behind a transaction took {took:?}: it waited for the {interval:?} interval, not a {quiet:?} quiet spell"
        );
    }
    drop(log);

    // A unit every millisecond or so: never a quiet spell, so the interval holds.
    a_steady_stream_keeps_the_interval(&bootstrap, &prefix, &dir, &t, Some(quiet)).await;
}

/// A unit refused before its transaction fails alone and fences its partition; a
/// transaction the broker rejects is aborted (nothing of it is visible), fails its units
/// and fences their partitions; the log keeps committing to other partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_fence_their_partitions_and_others_keep_working() {
    let bootstrap = require_broker();
    let prefix = format!("fail-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(&bootstrap, 4, &prefix);
    // Let a 2 MB record through the client so that the broker (message.max.bytes of
    // about 1 MB) rejects it inside the transaction: an abortable error.
    o.max_record_bytes = 4 << 20;
    o.client_config
        .push(("message.max.bytes".into(), (8 << 20).to_string()));
    let log = open_log(o, &dir, "a").await;
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));

    // Refused alone (partition out of range): later units elsewhere are unaffected.
    assert!(log.commit(one(&t, 4, b"x".to_vec())).await.is_err());

    // Rejected by the broker: the small record of the same unit is aborted with it.
    let mut bad = one(&t, 0, too_large_for_the_broker());
    bad.appends.push(one(&t, 0, b"small".to_vec()).appends.remove(0));
    let e = log
        .commit(bad)
        .await
        .expect_err("a 2 MB record is refused by the broker");
    assert!(matches!(e, Error::Kafka(_)), "{e}");
    assert!(e.to_string().contains("aborted"), "the transaction was aborted: {e}");
    assert!(
        log.read(&t, 0, 0, 10).await.unwrap().is_empty(),
        "nothing aborted is visible"
    );

    // The producer survived the abort: other partitions commit.
    let ok = log.commit(one(&t, 1, b"after".to_vec())).await.unwrap();
    assert_eq!(log.read(&t, 1, 0, 10).await.unwrap()[0].0, ok.offsets[0]);

    // Partition 0 is fenced: a unit built after a failed one must not land.
    let e = log.commit(one(&t, 0, b"later".to_vec())).await.unwrap_err();
    assert!(e.to_string().contains("earlier unit"), "{e}");
    assert_eq!(log.stats().group_commits, 1);

    // Once its writer has drained, `resume` lifts the fence: units built on the committed
    // state land again, after nothing of the failed ones.
    log.resume(0).await.unwrap();
    let ok = log.commit(one(&t, 0, b"resumed".to_vec())).await.unwrap();
    let got = log.read(&t, 0, 0, 10).await.unwrap();
    assert_eq!(got.len(), 1, "only the unit after the resume: {got:?}");
    assert_eq!((got[0].0, got[0].1.value.as_slice()), (ok.offsets[0], &b"resumed"[..]));
}

/// A unit of lane 0 that also writes to partition 1 of another topic (an outcome for the
/// results partition its sender listens on) fails: lane 0 is refused until its `resume`,
/// and then commits again, its outcome to partition 1 included; lane 1, writing to the
/// same results partition, is never refused because of it. (Before, the fence on the
/// results partition outlived every `resume` of lane 0: a partition answering another
/// instance's commands recovered again and again, 200 times in one crash test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_lifts_the_fence_of_a_unit_that_also_wrote_to_another_partition() {
    let bootstrap = require_broker();
    let prefix = format!("lanefence-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(&bootstrap, 2, &prefix);
    // Both lanes on one committer: they share its fences.
    o.committers = 1;
    let faults = o.faults.commit_timeouts.clone();
    let log = open_log(o, &dir, "a").await;
    let events: Arc<str> = Arc::from(format!("{prefix}.events"));
    let results: Arc<str> = Arc::from(format!("{prefix}.results"));
    let unit = |value: &[u8]| {
        let mut u = one(&events, 0, value.to_vec());
        u.appends
            .push(one(&results, 1, [b"outcome of ", value].concat()).appends.remove(0));
        u.lane = Some(0);
        u
    };
    // A commit that times out: the unit fails, its outcome unknown.
    faults.store(1, std::sync::atomic::Ordering::Relaxed);
    let e = log.commit(unit(b"unknown")).await.unwrap_err();
    assert!(e.to_string().contains("unknown"), "{e}");
    let e = log.commit(unit(b"later")).await.unwrap_err();
    assert!(e.to_string().contains("earlier unit"), "lane 0 is fenced: {e}");
    let mut other = one(&results, 1, b"lane 1".to_vec());
    other.lane = Some(1);
    log.commit(other)
        .await
        .expect("lane 1 is not fenced by lane 0's failure");
    log.resume(0).await.unwrap();
    log.commit(unit(b"resumed"))
        .await
        .expect("after its resume lane 0 commits again, its outcome to partition 1 included");
    let values = |r: Vec<(u64, eventfold_core::Record)>| r.into_iter().map(|(_, r)| r.value).collect::<Vec<_>>();
    let got = values(log.read(&results, 1, 0, 10).await.unwrap());
    // The timed-out commit may or may not have landed; what came after did, in order.
    let after: Vec<Vec<u8>> = got
        .into_iter()
        .filter(|v| v.as_slice() != b"outcome of unknown")
        .collect();
    assert_eq!(after, vec![b"lane 1".to_vec(), b"outcome of resumed".to_vec()]);
    let got = values(log.read(&events, 0, 0, 10).await.unwrap());
    assert_eq!(got.last().map(Vec::as_slice), Some(&b"resumed"[..]), "{got:?}");
}

/// Another instance can see a transaction (and answer a command's outcome from it) before
/// the committer has written it to its local store; `applied` waits for that write, so a
/// local read made after it sees every transaction others could see before it was called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_waits_until_visible_transactions_are_in_the_local_store() {
    let bootstrap = require_broker();
    let prefix = format!("applied-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let o = options(&bootstrap, 2, &prefix);
    let delay = o.faults.local_write_delay_ms.clone();
    let log = Arc::new(open_log(o, &dir, "a").await);
    let mut reader_options = options(&bootstrap, 2, &prefix);
    reader_options.transactional_id = format!("{prefix}-reader");
    let reader = open_log(reader_options, &dir, "b").await;
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    log.commit(one(&t, 0, b"first".to_vec())).await.unwrap();
    log.applied().await;
    delay.store(3_000, std::sync::atomic::Ordering::Relaxed);
    let mut unit = one(&t, 0, b"second".to_vec());
    unit.local.put_meta("probe", 7);
    let committing = tokio::spawn({
        let log = log.clone();
        async move { log.commit(unit).await }
    });
    // The other instance sees the transaction...
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while reader.read(&t, 0, 0, 10).await.unwrap().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the transaction never became visible"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...while this instance's store does not hold it yet (the committer waits 3 s).
    assert_eq!(log.store().get_meta("probe").unwrap(), None);
    let waited = std::time::Instant::now();
    log.applied().await;
    assert_eq!(
        log.store().get_meta("probe").unwrap(),
        Some(7),
        "read after `applied` ({:?})",
        waited.elapsed()
    );
    delay.store(0, std::sync::atomic::Ordering::Relaxed);
    committing.await.unwrap().unwrap();
}

/// A group committed to Kafka while an earlier group's local write is still running (the
/// apply thread writes them in order) is refused, not written, when that write fails:
/// the cache would have a hole. Later units are refused before any transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_local_write_refuses_the_groups_committed_behind_it() {
    let bootstrap = require_broker();
    let prefix = format!("lwfail-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let o = options(&bootstrap, 2, &prefix);
    let (delay, failures) = (
        o.faults.local_write_delay_ms.clone(),
        o.faults.local_write_failures.clone(),
    );
    let log = Arc::new(open_log(o, &dir, "a").await);
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let first = log.commit(one(&t, 0, b"first".to_vec())).await.unwrap();
    delay.store(2_000, std::sync::atomic::Ordering::Relaxed);
    failures.store(1, std::sync::atomic::Ordering::Relaxed);
    let failing = tokio::spawn({
        let log = log.clone();
        let unit = one(&t, 0, b"failing".to_vec());
        async move { log.commit(unit).await }
    });
    // Its transaction commits in milliseconds; its local write then waits 2 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut behind = one(&t, 1, b"behind".to_vec());
    behind.local.put_meta("behind", 1);
    let behind = log.commit(behind).await;
    let e = failing.await.unwrap().unwrap_err();
    assert!(
        e.to_string().contains("local store write failed: injected failure"),
        "{e}"
    );
    let e = behind.unwrap_err();
    assert!(
        e.to_string().contains("local store write failed"),
        "refused, not written: {e}"
    );
    assert_eq!(
        log.store().get_meta("behind").unwrap(),
        None,
        "nothing of it in the store"
    );
    assert_eq!(first.offsets, vec![0]);
    let later = log.commit(one(&t, 1, b"later".to_vec())).await.unwrap_err();
    assert!(later.to_string().contains("stopped"), "{later}");
}

/// A second instance with the same transactional id fences the first, which then refuses
/// every unit (fail-stop) while the second commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_fenced_by_another_instance_stops() {
    let bootstrap = require_broker();
    let prefix = format!("fence-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let first = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    first.commit(one(&t, 0, b"1".to_vec())).await.unwrap();
    let second = open_log(options(&bootstrap, 2, &prefix), &dir, "b").await;
    let e = first.commit(one(&t, 1, b"zombie".to_vec())).await.unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    let e = first.commit(one(&t, 0, b"zombie".to_vec())).await.unwrap_err();
    assert!(matches!(e, Error::Closed(_)), "every later unit is refused: {e}");
    second.commit(one(&t, 1, b"2".to_vec())).await.unwrap();
    let values = |r: Vec<(u64, eventfold_core::Record)>| r.into_iter().map(|(_, r)| r.value).collect::<Vec<_>>();
    assert_eq!(values(second.read(&t, 0, 0, 10).await.unwrap()), vec![b"1".to_vec()]);
    assert_eq!(values(second.read(&t, 1, 0, 10).await.unwrap()), vec![b"2".to_vec()]);
}

/// A lane's producers take turns, one transaction each, and its transactions stay in
/// order; a second instance fences every producer of the lane, not only the one it
/// would use first (its open initializes them all), so the first instance's next
/// transaction, whichever producer's turn it is, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_producer_of_a_lane_commits_in_turn_and_is_fenced() {
    let bootstrap = require_broker();
    let prefix = format!("turns-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let lane = |mut o: KafkaOptions| {
        o.committers = 1;
        o.producers_per_committer = 3;
        o
    };
    let first = open_log(lane(options(&bootstrap, 1, &prefix)), &dir, "a").await;
    let mut offsets = Vec::new();
    for i in 0..7u8 {
        offsets.push(first.commit(one(&t, 0, vec![b'0' + i])).await.unwrap().offsets[0]);
    }
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    let read = first.read(&t, 0, 0, 100).await.unwrap();
    let values: Vec<Vec<u8>> = read.iter().map(|(_, r)| r.value.clone()).collect();
    assert_eq!(values, (0..7u8).map(|i| vec![b'0' + i]).collect::<Vec<_>>());
    assert_eq!(read.iter().map(|(o, _)| *o).collect::<Vec<_>>(), offsets);
    // Seven transactions over three producers: the next one is the second producer's.
    let second = open_log(lane(options(&bootstrap, 1, &prefix)), &dir, "b").await;
    let e = first.commit(one(&t, 0, b"zombie".to_vec())).await.unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    second.commit(one(&t, 0, b"second".to_vec())).await.unwrap();
    let read = second.read(&t, 0, 0, 100).await.unwrap();
    assert_eq!(read.len(), 8, "the zombie's record never lands: {read:?}");
    assert_eq!(read[7].1.value, b"second");
}

/// Reads end at the end of committed data without waiting out a timeout, also when only a
/// transaction marker lies between `from` and the end, and when readers are reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_stop_at_transaction_markers_without_waiting() {
    let bootstrap = require_broker();
    let prefix = format!("marker-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let log = {
        let (bootstrap, prefix, dir) = (bootstrap.clone(), prefix.clone(), dir.path().to_owned());
        tokio::task::spawn_blocking(move || {
            KafkaLog::open(
                options(&bootstrap, 2, &prefix),
                Store::open(&dir, &StoreOptions::default()).unwrap(),
            )
            .unwrap()
        })
        .await
        .unwrap()
    };
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let unit = CommitUnit {
        appends: vec![Append {
            topic: t.clone(),
            partition: 1,
            record: Default::default(),
            entity: None,
        }],
        ..Default::default()
    };
    let off = log.commit(unit).await.unwrap().offsets[0];
    let end = log.end_offset(&t, 1).await.unwrap();
    assert_eq!(end, off + 2, "one record and its commit marker");
    for round in 0..5 {
        let started = Instant::now();
        assert_eq!(log.read(&t, 1, 0, 10).await.unwrap().len(), 1);
        assert!(
            log.read(&t, 1, off + 1, 10).await.unwrap().is_empty(),
            "only the marker is left"
        );
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "round {round}: two reads took {took:?}");
        eprintln!("round {round}: two reads in {took:?}");
    }
}

/// Records of entities (events) are kept in the local cache and read back from it; a log
/// on an empty store reads the same records, at the same offsets, from the broker. Of the
/// other appends only the end of the copy is kept (`Store::log_end`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_reads_equal_the_brokers() {
    let bootstrap = require_broker();
    let prefix = format!("cache-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    let events: Arc<str> = Arc::from(format!("{prefix}.order.events"));
    let state: Arc<str> = Arc::from(format!("{prefix}.order.state"));
    let (mut pending, mut last_state) = (Vec::new(), 0);
    for n in 0..12u64 {
        // Several units in flight at once sometimes (they may share a transaction), one
        // at a time others: markers sit between some records.
        let record = |v: &str| eventfold_core::Record {
            key: format!("o-{n}").into_bytes(),
            value: v.as_bytes().to_vec(),
            headers: vec![("ef-n".into(), n.to_string().into_bytes())],
            timestamp_ms: 1_000 + n as i64,
        };
        let unit = CommitUnit {
            appends: vec![
                Append {
                    topic: events.clone(),
                    partition: 1,
                    record: record("event"),
                    entity: Some((format!("o-{n}").into_bytes(), 1)),
                },
                Append {
                    topic: state.clone(),
                    partition: 1,
                    record: record("state"),
                    entity: None,
                },
            ],
            ..Default::default()
        };
        pending.push(log.commit(unit));
        if n % 3 == 0 {
            // `commit` enqueues at once: awaiting in order waits for all of them.
            for receipt in pending.drain(..) {
                last_state = receipt.await.unwrap().offsets[1];
            }
        }
    }
    for receipt in pending {
        last_state = receipt.await.unwrap().offsets[1];
    }
    let store = log.store();
    let stored = store.stored_log_end(&events, 1).unwrap();
    assert!(stored > 0, "events are kept locally");
    assert_eq!(
        store.stored_log_end(&state, 1).unwrap(),
        0,
        "state records are not kept"
    );
    assert_eq!(store.log_end(&state, 1).unwrap(), last_state + 1);
    let fresh = open_log(options(&bootstrap, 2, &format!("{prefix}-b")), &dir, "b").await;
    for from in [0, 1, 3, stored - 1] {
        let cached = log.read(&events, 1, from, 100).await.unwrap();
        let broker = fresh.read(&events, 1, from, 100).await.unwrap();
        assert_eq!(cached, broker, "from {from}");
    }
    assert_eq!(log.read(&events, 1, 0, 100).await.unwrap().len(), 12);
    assert_eq!(log.read(&state, 1, 0, 100).await.unwrap().len(), 12, "from the broker");
    // Reads below the cache's end are answered by the cache (white box: a record put
    // there directly, which the broker does not have, is what a read returns).
    let marker = eventfold_core::Record {
        value: b"only in the cache".to_vec(),
        ..Default::default()
    };
    let mut b = eventfold_store::Batch::new();
    b.put_log(&events, 1, stored, &marker);
    store.commit(b, false).unwrap();
    assert_eq!(log.read(&events, 1, stored, 1).await.unwrap(), vec![(stored, marker)]);
}

/// A log told that it alone writes a partition (`set_sole_writer`, which the runtime says
/// of the partitions it owns and restored) answers reads at the end of its copy without a
/// request to the broker: its own commits, even one whose transaction others already see
/// while it is not in the cache yet (the read waits for it), and nothing past them (only
/// transaction markers). Told otherwise, it asks the broker and finds another writer's
/// records, which a wrong claim would hide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_writer_reads_the_end_of_its_copy_without_asking_the_broker() {
    let bootstrap = require_broker();
    let prefix = format!("sole-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let o = options(&bootstrap, 2, &prefix);
    let delay = o.faults.local_write_delay_ms.clone();
    let log = Arc::new(open_log(o, &dir, "a").await);
    let mut other_options = options(&bootstrap, 2, &prefix);
    other_options.transactional_id = format!("{prefix}-other");
    let other = open_log(other_options, &dir, "b").await;
    let events: Arc<str> = Arc::from(format!("{prefix}.order.events"));
    let event = |n: u64| CommitUnit {
        appends: vec![Append {
            topic: events.clone(),
            partition: 0,
            record: eventfold_core::Record {
                key: format!("o-{n}").into_bytes(),
                value: format!("event {n}").into_bytes(),
                headers: vec![],
                timestamp_ms: 1,
            },
            entity: Some((format!("o-{n}").into_bytes(), 1)),
        }],
        ..Default::default()
    };
    let requests = |log: &KafkaLog| {
        let s = log.stats();
        s.end_offset_queries + s.broker_reads
    };
    let offsets = |got: Vec<(u64, eventfold_core::Record)>| got.into_iter().map(|(o, _)| o).collect::<Vec<_>>();
    log.commit(event(0)).await.unwrap();
    log.set_sole_writer(&events, 0, true);
    let before = requests(&log);
    for n in 1..=3 {
        let at = log.commit(event(n)).await.unwrap().offsets[0];
        assert_eq!(offsets(log.read(&events, 0, at, 10).await.unwrap()), vec![at]);
        assert_eq!(
            log.read(&events, 0, at + 1, 10).await.unwrap(),
            vec![],
            "past the last commit"
        );
        let mut lent = 0;
        log.read_with(&events, 0, at + 1, 10, &mut |_, _| {
            lent += 1;
            true
        })
        .await
        .unwrap();
        assert_eq!(lent, 0, "read_with past the last commit");
    }
    // A transaction others see before this log's cache holds it (its write waits 1.5 s).
    let end = log.store().stored_log_end(&events, 0).unwrap();
    delay.store(1_500, std::sync::atomic::Ordering::Relaxed);
    let committing = tokio::spawn({
        let (log, unit) = (log.clone(), event(4));
        async move { log.commit(unit).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while other.read(&events, 0, end, 10).await.unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the transaction never became visible"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        log.store().stored_log_end(&events, 0).unwrap(),
        end,
        "not in the cache yet"
    );
    let got = log.read(&events, 0, end, 10).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1.value, b"event 4");
    delay.store(0, std::sync::atomic::Ordering::Relaxed);
    let last = committing.await.unwrap().unwrap().offsets[0];
    assert_eq!(requests(&log), before, "no request to the broker while the sole writer");
    // Another writer (as if the partition had moved without this log being told).
    let theirs = other.commit(event(99)).await.unwrap().offsets[0];
    // The writer's `end_offset` waits until the broker's last stable offset covers its
    // commit (the markers come after the commit's answer): from then on every
    // read_committed reader sees it.
    assert!(other.end_offset(&events, 0).await.unwrap() > theirs);
    assert_eq!(
        log.read(&events, 0, last + 1, 10).await.unwrap(),
        vec![],
        "a sole writer trusts its copy"
    );
    log.set_sole_writer(&events, 0, false);
    assert_eq!(offsets(log.read(&events, 0, last + 1, 10).await.unwrap()), vec![theirs]);
    assert!(requests(&log) > before, "read from the broker");
}

/// Topics are created on first use with the configs of their suffix (DESIGN §2), as the
/// broker reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_with_the_configs_of_their_suffix() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;

    let bootstrap = require_broker();
    let prefix = format!("cfg-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(options(&bootstrap, 3, &prefix), &dir, "a").await;
    let want = [
        ("events", "cleanup.policy", "delete"),
        ("events", "retention.ms", "-1"),
        ("state", "cleanup.policy", "compact"),
        ("results", "cleanup.policy", "delete"),
        ("results", "retention.ms", "86400000"),
        ("commands", "retention.ms", "604800000"),
    ];
    for (suffix, _, _) in want {
        let t = format!("{prefix}.order.{suffix}");
        assert_eq!(log.end_offset(&t, 2).await.unwrap(), 0, "{t} is created empty");
    }
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for (suffix, key, value) in want {
        let t = format!("{prefix}.order.{suffix}");
        let got = admin
            .describe_configs([&ResourceSpecifier::Topic(&t)], &AdminOptions::new())
            .await
            .unwrap()
            .remove(0)
            .unwrap();
        let entry = got.get(key).unwrap_or_else(|| panic!("{t} has {key}"));
        assert_eq!(entry.value.as_deref(), Some(value), "{t}: {key}");
    }
    // One replica: the log says what a broker restart can cost (`single_replica_risk`).
    let warning = log.broker_warning().expect("a warning about one replica");
    assert!(warning.contains("replication factor 1"), "{warning}");
}

/// A data directory of the embedded log, or of a Kafka log with another partition count,
/// is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_another_log_is_refused() {
    let bootstrap = require_broker();
    let prefix = format!("dir-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let (embedded, kafka) = (dir.path().join("embedded"), dir.path().join("kafka"));
    tokio::task::spawn_blocking(move || {
        let store = || Store::open(&embedded, &StoreOptions::default()).unwrap();
        drop(eventfold_log::embedded::EmbeddedLog::open(store(), Default::default()).unwrap());
        std::thread::sleep(Duration::from_millis(200)); // the committer thread lets go of the store
        let e = KafkaLog::open(options(&bootstrap, 8, &prefix), store())
            .err()
            .expect("refused");
        assert!(e.to_string().contains("embedded log"), "{e}");

        let store = || Store::open(&kafka, &StoreOptions::default()).unwrap();
        drop(KafkaLog::open(options(&bootstrap, 2, &prefix), store()).unwrap());
        let e = KafkaLog::open(options(&bootstrap, 3, &prefix), store())
            .err()
            .expect("refused");
        assert!(
            matches!(e, Error::Config(_)) && e.to_string().contains("2 partitions"),
            "{e}"
        );
    })
    .await
    .unwrap();
}

/// A commit that times out leaves its outcome unknown: its units fail, their partitions
/// are fenced, the producer is rebuilt (a new `init_transactions` settles the old
/// transaction first), and later units of other partitions commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_commit_rebuilds_the_producer() {
    let bootstrap = require_broker();
    let prefix = format!("timeout-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let o = options(&bootstrap, 3, &prefix);
    let faults = o.faults.commit_timeouts.clone();
    let log = open_log(o, &dir, "a").await;
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    log.commit(one(&t, 0, b"before".to_vec())).await.unwrap();

    faults.store(1, std::sync::atomic::Ordering::Relaxed);
    let e = log.commit(one(&t, 1, b"unknown".to_vec())).await.unwrap_err();
    assert!(
        e.to_string().contains("unknown") && e.to_string().contains("rebuilt"),
        "{e}"
    );

    let ok = log
        .commit(one(&t, 2, b"after".to_vec()))
        .await
        .expect("a new producer commits");
    assert_eq!(log.read(&t, 2, 0, 10).await.unwrap()[0].0, ok.offsets[0]);
    let e = log.commit(one(&t, 1, b"later".to_vec())).await.unwrap_err();
    assert!(e.to_string().contains("earlier unit"), "partition 1 is fenced: {e}");
    // Whatever became of the timed-out transaction, it is settled: reads do not hang.
    let landed = log.read(&t, 1, 0, 10).await.unwrap();
    assert!(landed.len() <= 1, "{landed:?}");
    eprintln!(
        "the timed-out commit {}",
        if landed.is_empty() { "was aborted" } else { "landed" }
    );
}

/// `follow` delivers committed records in offset order per partition, from the given
/// starts, then live as they commit; records of an aborted transaction never appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sees_committed_records_in_order_then_live() {
    let bootstrap = require_broker();
    let prefix = format!("follow-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let log = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    let value = |p: u32, i: u32| format!("{p}-{i}").into_bytes();
    let mut offsets = [Vec::new(), Vec::new()];
    for i in 0..20 {
        for p in 0..2u32 {
            let receipt = log.commit(one(&t, p, value(p, i))).await.unwrap();
            offsets[p as usize].push(receipt.offsets[0]);
        }
    }
    // Partition 0 from its start, partition 1 from its 6th record.
    let mut follower = log.follow(&t, &[(0, 0), (1, offsets[1][5])]).unwrap();
    let mut got: [Vec<(u64, Vec<u8>)>; 2] = [Vec::new(), Vec::new()];
    let mut collect = async |got: &mut [Vec<(u64, Vec<u8>)>; 2], want: [usize; 2]| {
        while got[0].len() < want[0] || got[1].len() < want[1] {
            let (p, records) = tokio::time::timeout(Duration::from_secs(20), follower.next())
                .await
                .expect("records arrive within 20 s")
                .expect("the follower runs")
                .expect("no error");
            got[p as usize].extend(records.into_iter().map(|(o, r)| (o, r.value)));
        }
    };
    collect(&mut got, [20, 15]).await;
    let want = |p: u32, from: usize| -> Vec<(u64, Vec<u8>)> {
        (from..20)
            .map(|i| (offsets[p as usize][i], value(p, i as u32)))
            .collect()
    };
    assert_eq!(got[0], want(0, 0), "partition 0 from offset 0, in order");
    assert_eq!(got[1], want(1, 5), "partition 1 from its 6th record, in order");

    // Live: an aborted transaction (a record the broker refuses takes its companion
    // down) is never delivered; the next committed record is.
    let mut bad = one(&t, 0, too_large_for_the_broker());
    bad.appends.push(one(&t, 0, b"aborted".to_vec()).appends.remove(0));
    log.commit(bad)
        .await
        .expect_err("a 2 MB record is refused by the broker");
    let later = log.commit(one(&t, 1, b"live".to_vec())).await.unwrap();
    collect(&mut got, [20, 16]).await;
    assert_eq!(got[1].last().unwrap(), &(later.offsets[0], b"live".to_vec()));
    assert_eq!(got[0].len(), 20, "nothing of the aborted transaction");
    assert!(got.iter().flatten().all(|(_, v)| v != b"aborted"));
}

/// The next group event of `m` (within 30 s).
async fn next_event(m: &mut eventfold_log::Membership) -> eventfold_log::GroupEvent {
    tokio::time::timeout(Duration::from_secs(30), m.next())
        .await
        .expect("a group event within 30 s")
        .expect("the member runs")
}

/// Waits for the next non-empty assignment of `m` (a cooperative rebalance first assigns
/// a newcomer nothing), answering revocations and skipping records.
async fn next_assignment(m: &mut eventfold_log::Membership) -> Vec<(Arc<str>, u32, u64)> {
    loop {
        match next_event(m).await {
            eventfold_log::GroupEvent::Assigned(a) if !a.is_empty() => return a,
            eventfold_log::GroupEvent::Revoked { done, .. } => done.done(),
            _ => {}
        }
    }
}

/// Two members of one group split the partitions; records reach the member that owns
/// them, stamped with the epoch of their assignment; a seek re-delivers from the offset
/// under a higher epoch; a member that leaves hands its partitions to the other. A unit
/// consuming offsets commits them with the member's generation (read back as the group's
/// committed offset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_members_split_partitions_and_hand_them_over() {
    let bootstrap = require_broker();
    let prefix = format!("group-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let input: Arc<str> = Arc::from(format!("{prefix}.commands"));
    let group = format!("{prefix}-group");
    let mut o = options(&bootstrap, 2, &format!("{prefix}-a"));
    o.session_timeout = Duration::from_secs(6);
    let a = open_log(o.clone(), &dir, "a").await;
    o.transactional_id = format!("{prefix}-b-tx");
    let b = open_log(o, &dir, "b").await;
    for p in 0..2 {
        a.commit(one(&input, p, format!("r{p}").into_bytes())).await.unwrap();
    }

    let mut ma = a.join(&group, std::slice::from_ref(&input)).unwrap();
    let first = next_assignment(&mut ma).await;
    assert_eq!(first.len(), 2, "a lone member gets every partition: {first:?}");
    let mut mb = b.join(&group, std::slice::from_ref(&input)).unwrap();
    // Cooperative: a gives one partition up, b gets it; a keeps the other.
    let given = loop {
        match next_event(&mut ma).await {
            eventfold_log::GroupEvent::Revoked { partitions, lost, done } => {
                assert!(!lost, "handed over, not lost");
                done.done();
                break partitions;
            }
            _ => continue,
        }
    };
    assert_eq!(given.len(), 1, "{given:?}");
    let got_b = next_assignment(&mut mb).await;
    assert_eq!(
        got_b.iter().map(|(t, p, _)| (t.clone(), *p)).collect::<Vec<_>>(),
        given,
        "b gets what a gave up"
    );
    let (_, pb, epoch_b) = got_b[0].clone();
    assert_eq!(ma.control().assignment(), vec![(input.clone(), 1 - pb)]);

    // b reads its partition's record, stamped with its assignment's epoch.
    let (offset, epoch) = loop {
        if let eventfold_log::GroupEvent::Records {
            partition,
            epoch,
            records,
            ..
        } = next_event(&mut mb).await
        {
            assert_eq!(partition, pb);
            assert_eq!(records[0].1.value, format!("r{pb}").into_bytes());
            break (records[0].0, epoch);
        }
    };
    assert_eq!(epoch, epoch_b);
    // A seek back re-delivers it under a higher epoch.
    let control = mb.control();
    let t = input.clone();
    let seek_epoch = tokio::task::spawn_blocking(move || control.seek(&t, pb, offset))
        .await
        .unwrap()
        .unwrap();
    assert!(seek_epoch > epoch_b);
    loop {
        if let eventfold_log::GroupEvent::Records { epoch, records, .. } = next_event(&mut mb).await {
            assert_eq!(
                (records[0].0, epoch),
                (offset, seek_epoch),
                "re-delivered from the seek"
            );
            break;
        }
    }
    // b consumes it: the offset commits with b's generation.
    let unit = CommitUnit {
        consumed: vec![eventfold_log::Consumed {
            group: group.clone(),
            topic: input.clone(),
            partition: pb,
            next_offset: offset + 1,
        }],
        ..one(&Arc::from(format!("{prefix}.events")), pb, b"e".to_vec())
    };
    b.commit(unit).await.expect("the owner commits with its generation");
    assert_eq!(b.committed_offset(&group, &input, pb).await.unwrap(), Some(offset + 1));

    // b leaves: a gets both partitions again.
    drop(mb);
    let back = next_assignment(&mut ma).await;
    assert_eq!(back.iter().map(|(_, p, _)| *p).collect::<Vec<_>>(), vec![pb]);
    assert!(back[0].2 > epoch_b, "epochs only grow");
    assert_eq!(ma.control().assignment().len(), 2);
}

/// `settle` waits for transactions open on a partition when it is called: not settled
/// while another producer's transaction stays open, settled once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_waits_for_open_transactions() {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let bootstrap = require_broker();
    let prefix = format!("settle-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let t: Arc<str> = Arc::from(format!("{prefix}.events"));
    let mut o = options(&bootstrap, 1, &prefix);
    o.operation_timeout = Duration::from_secs(2);
    let log = open_log(o, &dir, "a").await;
    log.commit(one(&t, 0, b"first".to_vec())).await.unwrap();
    assert!(log.settle(&t, 0).await.unwrap(), "nothing open");

    // Another producer (a previous owner) leaves a transaction open on the partition.
    let (topic, bs) = (t.to_string(), bootstrap.clone());
    let other = tokio::task::spawn_blocking(move || {
        let p: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("transactional.id", format!("{topic}-other"))
            .create()
            .unwrap();
        p.init_transactions(Duration::from_secs(20)).unwrap();
        p.begin_transaction().unwrap();
        p.send(BaseRecord::to(&topic).partition(0).key("k").payload("open"))
            .map_err(|(e, _)| e)
            .unwrap();
        p.flush(Duration::from_secs(20)).unwrap();
        p
    })
    .await
    .unwrap();
    assert!(!log.settle(&t, 0).await.unwrap(), "an open transaction is not settled");
    let other = tokio::task::spawn_blocking(move || {
        other.commit_transaction(Duration::from_secs(20)).unwrap();
        other
    })
    .await
    .unwrap();
    assert!(log.settle(&t, 0).await.unwrap(), "settled once it committed");
    let end = log.end_offset(&t, 0).await.unwrap();
    let values: Vec<Vec<u8>> = log
        .read(&t, 0, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec![b"first".to_vec(), b"open".to_vec()], "end {end}");
    drop(other);
}

/// A paused partition delivers nothing while the other partitions go on; resumed, its
/// records arrive. (The runtime pauses a partition whose processor is behind instead of
/// holding up the group's events.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_waits_while_the_others_flow() {
    let bootstrap = require_broker();
    let prefix = format!("pause-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let input: Arc<str> = Arc::from(format!("{prefix}.commands"));
    let log = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    log.commit(one(&input, 0, b"before".to_vec())).await.unwrap();
    let mut m = log
        .join(&format!("{prefix}-group"), std::slice::from_ref(&input))
        .unwrap();
    assert_eq!(next_assignment(&mut m).await.len(), 2);
    // Whatever was fetched before the pause is delivered; wait for it.
    loop {
        if let eventfold_log::GroupEvent::Records { partition: 0, .. } = next_event(&mut m).await {
            break;
        }
    }
    m.control().pause(&input, 0);
    log.commit(one(&input, 0, b"while paused".to_vec())).await.unwrap();
    log.commit(one(&input, 1, b"other partition".to_vec())).await.unwrap();
    let mut got_other = false;
    let quiet_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet_until {
        let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(200), m.next()).await else {
            continue;
        };
        if let eventfold_log::GroupEvent::Records { partition, records, .. } = event {
            assert_eq!(partition, 1, "a paused partition delivered {records:?}");
            got_other = true;
        }
    }
    assert!(got_other, "the other partition kept flowing");
    m.control().resume(&input, 0);
    loop {
        if let eventfold_log::GroupEvent::Records {
            partition: 0, records, ..
        } = next_event(&mut m).await
        {
            assert_eq!(records[0].1.value, b"while paused");
            break;
        }
    }
}

/// Reads of a partition in chunks (a restore, a catch-up) go on where the previous chunk
/// stopped, with the reader parked there: together they return what one read returns, at
/// the same offsets, markers skipped, and records committed between two chunks (by this
/// log: read-your-writes) are read too, not cut off at the end an earlier chunk took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_reads_go_on_where_the_previous_chunk_stopped() {
    let bootstrap = require_broker();
    let prefix = format!("chunks-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(options(&bootstrap, 2, &prefix), &dir, "a").await;
    // The state topic is not kept in the cache: every read goes to the broker.
    let state: Arc<str> = Arc::from(format!("{prefix}.order.state"));
    let commit = |from: u64, n: u64| {
        let units: Vec<_> = (from..from + n)
            .map(|k| CommitUnit {
                appends: vec![Append {
                    topic: state.clone(),
                    partition: 1,
                    record: eventfold_core::Record {
                        key: format!("k-{k}").into_bytes(),
                        value: k.to_string().into_bytes(),
                        headers: vec![],
                        timestamp_ms: now_ms(),
                    },
                    entity: None,
                }],
                ..Default::default()
            })
            .map(|u| log.commit(u))
            .collect();
        async move {
            for u in units {
                u.await.unwrap();
            }
        }
    };
    for k in (0..60).step_by(6) {
        commit(k, 6).await; // several transactions: markers between the records
    }
    let (mut got, mut from, mut chunks) = (Vec::new(), 0, 0);
    loop {
        let chunk = log.read(&state, 1, from, 7).await.unwrap();
        let Some(last) = chunk.last().map(|(o, _)| *o) else {
            break;
        };
        assert!(chunk.len() <= 7);
        got.extend(chunk);
        from = last + 1;
        chunks += 1;
        if chunks == 3 {
            commit(60, 10).await; // past the end the first chunks took
        }
    }
    let values: Vec<String> = got
        .iter()
        .map(|(_, r)| String::from_utf8(r.value.clone()).unwrap())
        .collect();
    assert_eq!(values, (0..70).map(|k| k.to_string()).collect::<Vec<_>>());
    let whole = log.read(&state, 1, 0, 1000).await.unwrap();
    assert_eq!(got, whole, "chunks and one read agree, offsets included");
}
