//! Topic provisioning: topics are created on first use with the app's partition count and
//! the configs their suffix calls for; an existing topic with another count, or with a
//! cleanup or retention policy that would lose what eventfold keeps in it, is refused.

use super::common::{block_on, kafka_error};
use super::options::{KafkaOptions, TopicDefaults};
use crate::{Error, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
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

/// Why an existing topic's configs would lose what eventfold keeps in it (empty: they do
/// not). `config` gives a config's value (`None`: not set). Checked by suffix:
/// - events (the source of truth): `cleanup.policy=delete` with `retention.ms=-1` and
///   `retention.bytes=-1` (compaction would drop an aggregate's older events, a finite
///   retention all old ones);
/// - state and `_instances`: `cleanup.policy=compact` only (with `delete` the latest state
///   and the dedup outcomes would expire, and a restore would miss them);
/// - commands: no `compact` (it would drop commands not processed yet).
///
/// Results may be configured freely: an outcome is read within seconds of its write.
pub fn policy_problems(topic: &str, config: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let policy = config("cleanup.policy").unwrap_or_else(|| "delete".into());
    let policies: Vec<String> = policy.split(',').map(|p| p.trim().to_ascii_lowercase()).collect();
    let has = |p: &str| policies.iter().any(|x| x == p);
    let mut problems = Vec::new();
    if topic.ends_with(".events") {
        if has("compact") {
            problems.push(format!(
                "cleanup.policy={policy}, but compaction would drop every event of an aggregate but its last (set cleanup.policy=delete)"
            ));
        }
        for key in ["retention.ms", "retention.bytes"] {
            let value = config(key);
            if value.as_deref().map(str::trim) != Some("-1") {
                problems.push(format!(
                    "{key}={}, but the events topic is the source of truth and must keep every event (set {key}=-1)",
                    value.as_deref().unwrap_or("<unset>")
                ));
            }
        }
    } else if topic.ends_with(".state") || topic.ends_with("._instances") {
        if !has("compact") || has("delete") {
            problems.push(format!(
                "cleanup.policy={policy}, but this topic keeps the latest record per key for as long as it is current (set cleanup.policy=compact)"
            ));
        }
    } else if topic.ends_with(".commands") && has("compact") {
        problems.push(format!(
            "cleanup.policy={policy}, but compaction would drop commands not processed yet (set cleanup.policy=delete)"
        ));
    }
    problems
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
        let admin = super::common::base_config(options)
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
        self.check_policy(topic)?;
        self.verified.lock().expect("verified lock").insert(topic.to_owned());
        Ok(())
    }

    /// Refuses `topic` if its configs would lose what eventfold keeps in it
    /// ([`policy_problems`]), naming each config and how to fix it.
    fn check_policy(&self, topic: &str) -> Result<()> {
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        let described = block_on(self.admin.describe_configs([&ResourceSpecifier::Topic(topic)], &opts))
            .map_err(|e| kafka_error(&format!("cannot describe the configs of topic `{topic}`"), e))?;
        let resource = match described.into_iter().next() {
            None => return Err(Error::Kafka(format!("no configs returned for topic `{topic}`"))),
            // A principal allowed to use the topic but not to describe its configs: the
            // policy goes unchecked rather than the app unable to start.
            Some(Err(
                code @ (RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed),
            )) => {
                tracing::warn!(topic, %code, "cannot read the topic's configs: its cleanup and retention policy is not checked");
                return Ok(());
            }
            Some(Err(e)) => {
                return Err(Error::Kafka(format!(
                    "cannot describe the configs of topic `{topic}`: {e}"
                )));
            }
            // rdkafka 0.39 drops the per-resource error: a refused describe arrives as a
            // resource without a single config (a described topic has dozens).
            Some(Ok(resource)) if resource.entries.is_empty() => {
                tracing::warn!(
                    topic,
                    "cannot read the topic's configs (none returned: DescribeConfigs not allowed?): its cleanup and retention policy is not checked"
                );
                return Ok(());
            }
            Some(Ok(resource)) => resource,
        };
        let problems = policy_problems(topic, |key| resource.get(key).and_then(|e| e.value.clone()));
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::Config(format!(
            "topic `{topic}` is configured to lose data eventfold keeps in it: {}. Change it (e.g. `kafka-configs.sh --bootstrap-server ... --alter --entity-type topics --entity-name {topic} --add-config KEY=VALUE`) or use another app id",
            problems.join("; ")
        )))
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
                Err((name, RDKafkaErrorCode::InvalidReplicationFactor)) => {
                    return Err(Error::Kafka(format!(
                        "cannot create topic `{name}` with replication factor {}: the cluster has fewer live brokers than that (lower --kafka-replication-factor, or add brokers)",
                        self.defaults.replication_factor
                    )));
                }
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
    fn policies_that_lose_data_are_named() {
        let d = TopicDefaults::default();
        // The configs eventfold creates pass.
        for t in ["a.o.events", "a.o.state", "a.o.commands", "a.o.results", "a._instances"] {
            let created = topic_config(t, &d);
            let get = |k: &str| created.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
            assert_eq!(policy_problems(t, get), Vec::<String>::new(), "{t}");
        }
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        let events = policy_problems(
            "a.o.events",
            with(&[("cleanup.policy", "compact,delete"), ("retention.ms", "604800000")]),
        );
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(events[0].contains("cleanup.policy=compact,delete"), "{events:?}");
        assert!(events[1].contains("retention.ms=604800000"), "{events:?}");
        assert!(events[2].contains("retention.bytes=<unset>"), "{events:?}");
        let losing: [&'static [(&'static str, &'static str)]; 3] = [
            &[("cleanup.policy", "delete")],
            &[("cleanup.policy", "compact,delete")],
            &[("cleanup.policy", "Delete")],
        ];
        for pairs in losing {
            let p = policy_problems("a.o.state", with(pairs));
            assert!(
                p.len() == 1 && p[0].contains("set cleanup.policy=compact"),
                "{pairs:?}: {p:?}"
            );
            assert_eq!(policy_problems("a._instances", with(pairs)).len(), 1, "{pairs:?}");
        }
        assert_eq!(
            policy_problems("a.o.state", with(&[("cleanup.policy", " COMPACT ")])).len(),
            0
        );
        assert_eq!(
            policy_problems("a.o.commands", with(&[("cleanup.policy", "compact")])).len(),
            1
        );
        assert_eq!(
            policy_problems("a.o.results", with(&[("cleanup.policy", "compact")])).len(),
            0
        );
        assert_eq!(
            policy_problems("other", with(&[("cleanup.policy", "compact")])).len(),
            0
        );
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
