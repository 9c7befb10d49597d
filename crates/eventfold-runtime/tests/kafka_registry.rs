//! The instance registry (`eventfold_runtime::cluster`) against a REAL Apache Kafka broker:
//! two instances, each with its own `KafkaLog`, meet on `<app>._instances`.
//!
//! The broker address is `EVENTFOLD_KAFKA_BOOTSTRAP` (default `127.0.0.1:9092`); start one
//! with `scripts/kafka/broker.sh start`. Without a broker this test fails: Kafka tests
//! never skip silently.

use eventfold_core::envelope::headers;
use eventfold_core::partition::partition_for;
use eventfold_log::Log;
use eventfold_log::kafka::{KafkaLog, KafkaOptions};
use eventfold_runtime::cluster::{INSTANCE_TYPE, InstanceInfo, Registry, instances_topic};
use eventfold_store::{Store, StoreOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const PARTITIONS: u32 = 4;
const HEARTBEAT: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(30);

use eventfold_log::testing::require_kafka_broker as require_broker;

/// A Kafka log of its own (own store, own transactional id), as a separate instance has.
async fn open_log(bootstrap: &str, name: &str, dir: &std::path::Path) -> Arc<dyn Log> {
    let (bootstrap, name, dir) = (bootstrap.to_owned(), name.to_owned(), dir.join(name));
    let log = tokio::task::spawn_blocking(move || {
        let store = Store::open(&dir, &StoreOptions::default()).expect("open the local store");
        let mut o = KafkaOptions::new(bootstrap, PARTITIONS, format!("{name}-tx"));
        o.operation_timeout = Duration::from_secs(20);
        KafkaLog::open(o, store)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("cannot open the Kafka log ({e}); is the broker up? `scripts/kafka/broker.sh start`"));
    Arc::new(log)
}

fn owned(aggregate: &str, partitions: &[u32]) -> BTreeMap<String, Vec<u32>> {
    BTreeMap::from([(aggregate.to_owned(), partitions.to_vec())])
}

fn owner_id(r: &Registry, aggregate: &str, partition: u32) -> Option<String> {
    r.owner(aggregate, partition).map(|i| i.instance_id)
}

fn view(r: &Registry) -> Vec<(String, bool)> {
    r.instances()
        .into_iter()
        .map(|(i, alive)| (i.instance_id, alive))
        .collect()
}

/// Waits until `r` sees `owner` own `aggregate`/`partition`, or fails with what it sees.
async fn expect_owner(r: &Registry, aggregate: &str, partition: u32, owner: Option<&str>) {
    let ok = r
        .wait_for(|r| owner_id(r, aggregate, partition).as_deref() == owner, WAIT)
        .await;
    assert!(
        ok,
        "{} should see {owner:?} own {aggregate}/{partition}, sees {:?}; instances {:?}",
        r.instance_id(),
        owner_id(r, aggregate, partition),
        r.instances()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_see_each_other_follow_ownership_and_drop_leavers_and_stale_claims() {
    let bootstrap = require_broker();
    let dir = tempfile::tempdir().unwrap();
    let run = uuid::Uuid::now_v7().simple().to_string();
    let app = format!("registry-{run}");
    let log_a = open_log(&bootstrap, &format!("a-{run}"), dir.path()).await;
    let log_b = open_log(&bootstrap, &format!("b-{run}"), dir.path()).await;

    let a = Registry::start(log_a.clone(), &app, "a", "http://127.0.0.1:1", HEARTBEAT).unwrap();
    let b = Registry::start(log_b.clone(), &app, "b", "http://127.0.0.1:2", HEARTBEAT).unwrap();
    assert_eq!(a.instance_id(), "a");

    // They see each other, alive.
    let both = vec![("a".to_owned(), true), ("b".to_owned(), true)];
    for r in [&a, &b] {
        assert!(
            r.wait_for(|r| view(r) == both, WAIT).await,
            "{} should see a and b alive, sees {:?}",
            r.instance_id(),
            view(r)
        );
    }
    let b_seen_by_a = a.instances().into_iter().find(|(i, _)| i.instance_id == "b").unwrap().0;
    assert_eq!(b_seen_by_a.http, "http://127.0.0.1:2");
    assert_eq!(owner_id(&a, "order", 0), None, "nobody claims anything yet");

    // Ownership follows set_owned, on both sides.
    a.set_owned(owned("order", &[0, 1]));
    assert_eq!(
        owner_id(&a, "order", 0).as_deref(),
        Some("a"),
        "its own claim is seen at once"
    );
    for r in [&a, &b] {
        expect_owner(r, "order", 0, Some("a")).await;
        expect_owner(r, "order", 1, Some("a")).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await; // a later assigned_ms
    b.set_owned(owned("order", &[1, 2]));
    for r in [&a, &b] {
        expect_owner(r, "order", 1, Some("b")).await; // the newer claim wins
        expect_owner(r, "order", 2, Some("b")).await;
        expect_owner(r, "order", 0, Some("a")).await;
        expect_owner(r, "order", 3, None).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    a.set_owned(owned("order", &[0, 1, 2, 3]));
    for r in [&a, &b] {
        expect_owner(r, "order", 2, Some("a")).await;
        expect_owner(r, "order", 3, Some("a")).await;
    }
    let a_seen_by_b = b.owner("order", 3).unwrap();
    assert_eq!(
        a_seen_by_b.generation, 2,
        "one generation per set_owned: {a_seen_by_b:?}"
    );
    assert_eq!(a_seen_by_b.partitions, owned("order", &[0, 1, 2, 3]));

    // The record sits on partition_for(id) of <app>._instances, keyed by the id, with the headers.
    let topic = instances_topic(&app);
    let records = log_a
        .read(&topic, partition_for(b"a", PARTITIONS), 0, 1000)
        .await
        .unwrap();
    let (_, last) = records
        .iter()
        .rev()
        .find(|(_, r)| r.key == b"a")
        .expect("a's records on its partition");
    assert_eq!(last.header_str(headers::TYPE), Some(INSTANCE_TYPE));
    assert_eq!(last.header_str(headers::CONTENT_TYPE), Some("application/json"));
    let decoded: InstanceInfo = serde_json::from_slice(&last.value).unwrap();
    assert_eq!(decoded.instance_id, "a");

    // b leaves: gone from a's view, and b claims nothing any more.
    b.leave().await;
    assert!(
        a.wait_for(|r| view(r) == vec![("a".to_owned(), true)], WAIT).await,
        "a should no longer see b after it left, sees {:?}",
        view(&a)
    );
    assert!(b.instances().iter().all(|(i, _)| i.instance_id != "b"));
    expect_owner(&b, "order", 1, Some("a")).await;

    // A stale claim loses to a live one: c takes partition 0 last, then stops heartbeating.
    let c = Registry::start(log_b.clone(), &app, "c", "http://127.0.0.1:3", HEARTBEAT).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    c.set_owned(owned("order", &[0]));
    expect_owner(&a, "order", 0, Some("c")).await;
    expect_owner(&c, "order", 0, Some("c")).await;
    drop(c); // no tombstone: its record stays, its heartbeat stops
    expect_owner(&a, "order", 0, Some("a")).await;
    assert_eq!(
        view(&a),
        vec![("a".to_owned(), true), ("c".to_owned(), false)],
        "c is still known, but not alive"
    );

    // A newcomer replays the compacted history: a live, b gone (tombstone), c stale.
    let d = Registry::start(log_a.clone(), &app, "d", "http://127.0.0.1:4", HEARTBEAT).unwrap();
    let expected = vec![("a".to_owned(), true), ("c".to_owned(), false), ("d".to_owned(), true)];
    assert!(
        d.wait_for(|r| view(r) == expected, WAIT).await,
        "d should see a alive, c stale and no b, sees {:?}",
        view(&d)
    );
    expect_owner(&d, "order", 0, Some("a")).await;

    a.leave().await;
    d.leave().await;
}
