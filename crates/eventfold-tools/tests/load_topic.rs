//! `eventfold load-topic` against a real Kafka broker (`EVENTFOLD_KAFKA_BOOTSTRAP`,
//! default 127.0.0.1:9092; never skipped) and a responder thread in the test that answers
//! commands on the results topic: every result is counted once, latency is measured, and a
//! dropped or duplicated result makes the run fail; the warm-up's commands are checked
//! but not measured.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use eventfold_tools::load::Limit;
use eventfold_tools::load_topic::{self, TopicLoadOptions};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;

fn bootstrap() -> String {
    std::env::var("EVENTFOLD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn create_topics(app: &str) {
    let admin: AdminClient<_> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let names = [format!("{app}.order.commands"), format!("{app}.order.results")];
    let topics: Vec<NewTopic> = names
        .iter()
        .map(|n| NewTopic::new(n, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for r in rt
        .block_on(admin.create_topics(&topics, &AdminOptions::new()))
        .expect("is a Kafka broker running at EVENTFOLD_KAFKA_BOOTSTRAP? (scripts/kafka/broker.sh start)")
    {
        r.expect("topic created");
    }
    // The controller acknowledges the creation before every broker has the new metadata:
    // wait until both topics show all their partitions (load-topic refuses a topic it
    // cannot see, which is right for a user and a race for this test).
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("metadata client");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for name in &names {
        loop {
            let visible = consumer
                .fetch_metadata(Some(name), Duration::from_secs(5))
                .map(|m| {
                    m.topics()
                        .iter()
                        .any(|t| t.name() == name && t.error().is_none() && t.partitions().len() == PARTITIONS as usize)
                })
                .unwrap_or(false);
            if visible {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "topic {name} not visible 30 s after its creation"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What the responder does with command number `n` (from the command id `{run}-{n}`).
#[derive(Clone, Copy)]
enum Fault {
    None,
    Drop(u64),
    Duplicate(u64),
    /// Answers nothing for this long, then everything (from the first command on).
    LateStart(Duration),
}

/// Answers every command on `<app>.order.commands` with an accepted or rejected outcome
/// keyed by its `ef-command-id`, until `stop`. Returns the command ids it saw.
fn responder(app: &str, fault: Fault, stop: Arc<AtomicBool>) -> thread::JoinHandle<HashSet<String>> {
    let commands = format!("{app}.order.commands");
    let results = format!("{app}.order.results");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("{app}-responder"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&commands, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("linger.ms", "1")
        .create()
        .unwrap();
    thread::spawn(move || {
        if let Fault::LateStart(d) = fault {
            thread::sleep(d);
        }
        let mut seen = HashSet::new();
        while !stop.load(Ordering::Acquire) {
            producer.poll(Duration::ZERO);
            let Some(m) = consumer.poll(Duration::from_millis(20)) else {
                continue;
            };
            let m = m.unwrap();
            let id = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "ef-command-id"))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8(v.to_vec()).unwrap())
                .expect("load-topic sets ef-command-id");
            let ty = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "ef-type"))
                .and_then(|h| h.value)
                .expect("load-topic sets ef-type");
            assert_eq!(ty, b"PlaceOrder");
            let n: u64 = id.rsplit('-').next().unwrap().parse().unwrap();
            seen.insert(id.clone());
            let copies = match fault {
                Fault::Drop(k) if k == n => 0,
                Fault::Duplicate(k) if k == n => 2,
                _ => 1,
            };
            // Every fifth command is "rejected", to check both outcomes are counted.
            let value = if n.is_multiple_of(5) {
                r#"{"rejected":{"error":"x","message":"y"}}"#.to_owned()
            } else {
                format!(r#"{{"accepted":{{"aggregate_id":"a","version":1,"events":[],"position":"{n}"}}}}"#)
            };
            for _ in 0..copies {
                producer
                    .send(BaseRecord::to(&results).key(id.as_bytes()).payload(value.as_bytes()))
                    .unwrap();
            }
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        seen
    })
}

fn run_with(fault: Fault, count: u64) -> (load_topic::TopicSummary, HashSet<String>) {
    let app = format!("lt{:08x}", rand_u32());
    create_topics(&app);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = responder(&app, fault, stop.clone());
    let summary = load_topic::run(TopicLoadOptions {
        bootstrap: bootstrap(),
        app: app.clone(),
        limit: Limit::Count(count),
        in_flight: 64,
        result_timeout: Duration::from_secs(5),
        ..TopicLoadOptions::default()
    })
    .expect("load-topic runs");
    stop.store(true, Ordering::Release);
    (summary, handle.join().unwrap())
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u32
}

#[test]
fn every_result_is_counted_once_with_its_latency() {
    let (s, seen) = run_with(Fault::None, 300);
    assert_eq!(s.sent, 300);
    assert_eq!(seen.len(), 300, "each command reached the topic once");
    assert!(seen.iter().all(|id| id.starts_with(&s.run_id)));
    assert_eq!((s.accepted, s.rejected), (240, 60));
    assert_eq!((s.missing, s.duplicates), (0, 0));
    s.check().unwrap();
    assert!(s.latency_ms.p50 > 0.0 && s.latency_ms.p50 <= s.latency_ms.max);
    assert!(s.throughput_per_s() > 0.0);
    let json = s.to_json();
    assert_eq!(json["passed"], true);
    assert_eq!(json["requests"], 300);
}

#[test]
fn the_warm_up_is_checked_but_not_measured() {
    // The responder starts 2 s late: the warm-up's first commands wait up to 2 s for their
    // results, the measured ones (due after 3 s) find it running.
    let app = format!("lt{:08x}", rand_u32());
    create_topics(&app);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = responder(&app, Fault::LateStart(Duration::from_secs(2)), stop.clone());
    let s = load_topic::run(TopicLoadOptions {
        bootstrap: bootstrap(),
        app: app.clone(),
        limit: Limit::Count(100),
        rate: Some(100.0),
        warmup: Duration::from_secs(3),
        in_flight: 64,
        result_timeout: Duration::from_secs(10),
        ..TopicLoadOptions::default()
    })
    .expect("load-topic runs");
    stop.store(true, Ordering::Release);
    let seen = handle.join().unwrap();
    // Due at n / 100 s: commands 0..300 fall in the 3 s warm-up.
    assert_eq!(s.warmup_commands, 300);
    assert_eq!((s.sent, s.measured), (400, 100));
    assert_eq!(seen.len(), 400, "the warm-up's commands are produced too");
    assert_eq!((s.accepted + s.rejected, s.missing, s.duplicates), (400, 0, 0));
    s.check().unwrap();
    assert!(
        s.latency_ms.max < 1500.0,
        "a warm-up command's wait for the late responder was measured: max {} ms",
        s.latency_ms.max
    );
    // 100 measured commands at 100/s: about a second from the end of the warm-up.
    assert!(s.elapsed >= Duration::from_millis(950), "{:?}", s.elapsed);
    assert!(
        s.throughput_per_s() > 50.0 && s.throughput_per_s() < 110.0,
        "{}",
        s.throughput_per_s()
    );
    assert_eq!(s.to_json()["warmup_commands"], 300);
}

#[test]
fn a_dropped_result_fails_the_run() {
    let (s, _) = run_with(Fault::Drop(7), 50);
    assert_eq!((s.missing, s.duplicates), (1, 0));
    let err = s.check().unwrap_err().to_string();
    assert!(err.contains("1 of 50 results never arrived"), "{err}");
}

#[test]
fn a_duplicated_result_fails_the_run() {
    let (s, _) = run_with(Fault::Duplicate(3), 50);
    assert_eq!((s.missing, s.duplicates), (0, 1));
    assert!(s.check().unwrap_err().to_string().contains("more than once"));
}

#[test]
fn a_missing_topic_is_a_clear_error() {
    let err = load_topic::run(TopicLoadOptions {
        bootstrap: bootstrap(),
        app: format!("nosuch{:08x}", rand_u32()),
        limit: Limit::Count(1),
        ..TopicLoadOptions::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("does not exist"), "{err}");
}
