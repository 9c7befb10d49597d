//! Topic provisioning: topics are created on first use with the app's partition count and
//! the configs their suffix calls for; an existing topic with another count is refused.

use super::{KafkaOptions, TopicDefaults, block_on, clients::kafka_error};
use crate::{Error, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The configs of a new topic, chosen by its suffix (DESIGN §2): events are kept
/// forever, state is compacted, commands and results expire.
pub fn topic_config(topic: &str, defaults: &TopicDefaults) -> Vec<(&'static str, String)> {
    let delete = |retention_ms: i64| {
        vec![
            ("cleanup.policy", "delete".into()),
            ("retention.ms", retention_ms.to_string()),
        ]
    };
    if topic.ends_with(".events") {
        let mut c = delete(-1);
        c.push(("retention.bytes", "-1".into()));
        c
    } else if topic.ends_with(".state") || topic.ends_with("._instances") {
        vec![("cleanup.policy", "compact".into())]
    } else if topic.ends_with(".results") {
        delete(defaults.results_retention_ms)
    } else if topic.ends_with(".commands") {
        delete(defaults.commands_retention_ms)
    } else {
        Vec::new()
    }
}

/// Kafka's rule for topic names: 1..=249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn check_topic_name(topic: &str) -> Result<()> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if topic.is_empty() || topic.len() > 249 || topic == "." || topic == ".." || !topic.chars().all(legal) {
        return Err(Error::Config(format!(
            "`{topic}` is not a valid Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-')"
        )));
    }
    Ok(())
}

/// Creates and checks topics; remembers the ones it has verified.
pub(super) struct Provisioner {
    admin: AdminClient<DefaultClientContext>,
    /// Missing topics are created (false: a read-only log only checks).
    create: bool,
    partitions: u32,
    defaults: TopicDefaults,
    timeout: Duration,
    verified: Mutex<HashSet<String>>,
}

impl Provisioner {
    pub(super) fn new(options: &KafkaOptions, create: bool) -> Result<Self> {
        let admin = super::clients::base_config(options)
            .create()
            .map_err(|e| kafka_error("cannot create the Kafka admin client", e))?;
        Ok(Self {
            admin,
            create,
            partitions: options.partitions,
            defaults: options.topics.clone(),
            timeout: options.operation_timeout,
            verified: Mutex::new(HashSet::new()),
        })
    }

    /// Makes sure `topic` exists with the app's partition count: creates it if missing
    /// (or, when this provisioner does not create, refuses it), refuses it if it has
    /// another count. Blocking.
    pub(super) fn ensure(&self, topic: &str) -> Result<()> {
        if self.verified.lock().expect("verified lock").contains(topic) {
            return Ok(());
        }
        check_topic_name(topic)?;
        let deadline = Instant::now() + self.timeout;
        if self.describe(topic)?.is_none() {
            if !self.create {
                return Err(Error::Config(format!(
                    "topic `{topic}` does not exist (check the bootstrap servers, --app-id and the data directory)"
                )));
            }
            self.create(topic)?;
        }
        // A new topic shows up in metadata, then gets leaders; wait for both (bounded) so
        // that the first produce, watermark query or fetch does not race its creation.
        loop {
            match self.describe(topic)? {
                Some(d) if d.partitions != self.partitions => {
                    return Err(Error::Config(format!(
                        "topic `{topic}` has {} partitions but this log expects {}: every topic of the app must have the same partition count (start with {} partitions, or use another app id)",
                        d.partitions, self.partitions, d.partitions
                    )));
                }
                Some(d) if d.leaders == d.partitions => break,
                _ if Instant::now() >= deadline => {
                    return Err(Error::Kafka(format!(
                        "topic `{topic}` was not ready (all partitions with a leader) within {:?}",
                        self.timeout
                    )));
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        self.verified.lock().expect("verified lock").insert(topic.to_owned());
        Ok(())
    }

    /// The topic's partition and leader counts, `None` if it does not exist.
    fn describe(&self, topic: &str) -> Result<Option<Described>> {
        let md = self
            .admin
            .inner()
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|e| kafka_error(&format!("cannot fetch the metadata of topic `{topic}`"), e))?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        if let Some(err) = t.error() {
            return match RDKafkaErrorCode::from(err) {
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => Ok(None),
                // Right after creation a topic may report its leaders as not available yet.
                RDKafkaErrorCode::LeaderNotAvailable => Ok(Some(Described {
                    partitions: t.partitions().len() as u32,
                    leaders: 0,
                })),
                code => Err(Error::Kafka(format!("metadata of topic `{topic}`: {code}"))),
            };
        }
        Ok(Some(Described {
            partitions: t.partitions().len() as u32,
            leaders: t.partitions().iter().filter(|p| p.leader() >= 0).count() as u32,
        }))
    }

    fn create(&self, topic: &str) -> Result<()> {
        let config = topic_config(topic, &self.defaults);
        let mut new = NewTopic::new(
            topic,
            self.partitions as i32,
            TopicReplication::Fixed(self.defaults.replication_factor),
        );
        for (k, v) in &config {
            new = new.set(k, v);
        }
        let opts = AdminOptions::new()
            .operation_timeout(Some(self.timeout))
            .request_timeout(Some(self.timeout));
        let results = block_on(self.admin.create_topics([&new], &opts))
            .map_err(|e| kafka_error(&format!("cannot create topic `{topic}`"), e))?;
        for r in results {
            match r {
                Ok(_) => tracing::info!(topic, partitions = self.partitions, ?config, "created Kafka topic"),
                // Another instance (or thread) created it first: `ensure` checks its count.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(Error::Kafka(format!("cannot create topic `{name}`: {code}")));
                }
            }
        }
        Ok(())
    }
}

/// Why a broker restart can lose an acknowledged transaction with this replication factor,
/// if it can (logged as a warning when a Kafka log opens).
///
/// When the only replica of a partition loses its leadership while its broker runs (a
/// controlled shutdown, or the controller fencing a broker whose heartbeats stalled), the
/// partition has no leader, and Kafka's transaction coordinator (seen with 4.4) then skips
/// the commit markers of such partitions yet completes the transaction: the records of a
/// commit the producer was told succeeded stay in an open transaction, and the next abort
/// of that producer aborts them. With two or more replicas the leadership moves to another
/// broker and the markers go there.
pub fn single_replica_risk(replication_factor: i32) -> Option<String> {
    (replication_factor < 2).then(|| {
        format!(
            "topics get replication factor {replication_factor}: a Kafka broker that loses the leadership of a partition while it runs (a controlled shutdown, or fenced by its controller) can complete a transaction without its markers, and an acknowledged commit is aborted later. Use a replication factor of at least 2 in production; a single test broker should run without controlled shutdown and with a separate controller (scripts/kafka/broker.sh with EVENTFOLD_KAFKA_CONTROLLER=separate)"
        )
    })
}

struct Described {
    partitions: u32,
    leaders: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_follow_the_topic_suffix() {
        let d = TopicDefaults::default();
        let get = |t: &str, k: &str| {
            topic_config(t, &d)
                .into_iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v)
        };
        assert_eq!(get("shop.order.events", "retention.ms").as_deref(), Some("-1"));
        assert_eq!(get("shop.order.state", "cleanup.policy").as_deref(), Some("compact"));
        assert_eq!(get("shop.order.results", "cleanup.policy").as_deref(), Some("delete"));
        assert_eq!(
            get("shop.order.commands", "retention.ms"),
            Some(d.commands_retention_ms.to_string())
        );
        assert_eq!(get("shop._instances", "cleanup.policy").as_deref(), Some("compact"));
        assert!(topic_config("other", &d).is_empty());
    }

    #[test]
    fn one_replica_is_a_risk() {
        assert!(single_replica_risk(1).expect("a risk").contains("replication factor 1"));
        assert_eq!(single_replica_risk(2), None);
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(check_topic_name("shop.order-1_x.events").is_ok());
        for bad in ["", ".", "..", "a b", "a/b", &"x".repeat(250)] {
            assert!(check_topic_name(bad).is_err(), "{bad:?}");
        }
    }
}
