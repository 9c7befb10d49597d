//! `eventfold drop-app` against a real Kafka broker (`EVENTFOLD_KAFKA_BOOTSTRAP`, default
//! 127.0.0.1:9092; never skipped): a dry run lists an app's topics and group and deletes
//! nothing; with `yes` they are gone, and a topic of another app whose name merely starts
//! the same way stays.

use std::thread;
use std::time::{Duration, Instant};

use eventfold_tools::drop_app::{self, DropOptions};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

fn bootstrap() -> String {
    std::env::var("EVENTFOLD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn topics_now(consumer: &BaseConsumer, prefix: &str) -> Vec<String> {
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("is a Kafka broker running at EVENTFOLD_KAFKA_BOOTSTRAP? (scripts/kafka/broker.sh start)");
    let mut names: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|t| t.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Polls until `want` holds for the topics starting with `prefix` (metadata follows the
/// controller with a delay).
fn wait_topics(consumer: &BaseConsumer, prefix: &str, want: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names = topics_now(consumer, prefix);
        if want(&names) || Instant::now() > deadline {
            return names;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn drop_app_lists_then_deletes_only_that_apps_topics_and_group() {
    let app = format!("dropapp{:08x}", rand::random::<u32>());
    let mine = [format!("{app}._instances"), format!("{app}.order.events")];
    let other = format!("{app}x.order.events");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let new: Vec<NewTopic> = mine
        .iter()
        .chain([&other])
        .map(|n| NewTopic::new(n, 2, TopicReplication::Fixed(1)))
        .collect();
    for r in rt
        .block_on(admin.create_topics(&new, &AdminOptions::new()))
        .expect("is a Kafka broker running at EVENTFOLD_KAFKA_BOOTSTRAP? (scripts/kafka/broker.sh start)")
    {
        r.expect("topic created");
    }
    let meta: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("metadata client");
    let all = [mine[0].clone(), mine[1].clone(), other.clone()];
    let seen = wait_topics(&meta, &app, |names| all.iter().all(|t| names.contains(t)));
    assert!(
        all.iter().all(|t| seen.contains(t)),
        "created topics not visible: {seen:?}"
    );

    // The app's consumer groups, as a service leaves them (committed offsets, no
    // members): the commands' group `<app>` and a process manager's `<app>.<name>`.
    let pm_group = format!("{app}.order_flow");
    for name in [app.as_str(), pm_group.as_str()] {
        let group: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", name)
            .set("enable.auto.commit", "false")
            .create()
            .expect("group client");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&mine[1], 0, Offset::Offset(0)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = group.commit(&tpl, CommitMode::Sync) {
            assert!(Instant::now() < deadline, "committing an offset for group {name}: {e}");
            thread::sleep(Duration::from_millis(200));
        }
    }

    let mut opts = DropOptions {
        bootstrap: bootstrap(),
        app: app.clone(),
        yes: false,
        timeout: Duration::from_secs(30),
    };
    let listed = drop_app::run(&opts).expect("dry run");
    assert_eq!(listed.topics, mine.to_vec(), "the app's topics, not {other}");
    assert!(listed.group, "the app's consumer group is listed");
    assert_eq!(
        listed.groups,
        vec![app.clone(), pm_group.clone()],
        "the app's groups, its process manager's included"
    );
    assert!(!listed.deleted);
    assert!(listed.to_string().contains("would delete"), "{listed}");
    let still = topics_now(&meta, &app);
    assert!(
        all.iter().all(|t| still.contains(t)),
        "a dry run deleted something: {still:?}"
    );

    opts.yes = true;
    let dropped = drop_app::run(&opts).expect("drop");
    assert!(dropped.deleted);
    assert_eq!(dropped.topics, mine.to_vec());
    let left = wait_topics(&meta, &app, |names| names == [other.clone()]);
    assert_eq!(left, vec![other.clone()], "only the other app's topic is left");
    let again = drop_app::run(&opts).expect("second drop");
    assert!(
        again.topics.is_empty() && !again.group,
        "nothing left to drop: {again:?}"
    );
    assert!(again.to_string().contains("nothing to delete"), "{again}");

    rt.block_on(admin.delete_topics(&[other.as_str()], &AdminOptions::new()))
        .expect("deleting the other topic");
}
