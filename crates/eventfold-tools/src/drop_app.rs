//! `eventfold drop-app`: delete an application's Kafka topics and consumer group.
//!
//! An eventfold app named `A` owns the topics `A.<type>.<kind>` and `A._instances`
//! (DESIGN §2) and the consumer group `A`. Test and benchmark runs create a fresh app each
//! time; a broker that keeps them all slows down (every partition costs it work: on the
//! project's 2-core machine a broker holding about 1,100 left-over partitions used 1.5
//! cores where a clean one used 0.9 for the same load). This drops one app's topics and
//! group; without `yes` it only lists them.

use std::time::Duration;

use anyhow::{Context as _, bail};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use serde_json::{Value, json};

/// What to drop.
#[derive(Debug, Clone)]
pub struct DropOptions {
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// The app id: topics named `<app>.<anything>` and the consumer groups `<app>` and
    /// `<app>.<anything>` (its process managers') go.
    pub app: String,
    /// Delete; otherwise only list what would be deleted.
    pub yes: bool,
    /// Bound on every broker request.
    pub timeout: Duration,
}

/// What was found (and, with `yes`, deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropSummary {
    /// The app id (topic prefix) dropped.
    pub app: String,
    /// The app's topics, sorted.
    pub topics: Vec<String>,
    /// Whether any of the app's consumer groups existed.
    pub group: bool,
    /// The app's consumer groups (`<app>`, and `<app>.<process manager>`), sorted.
    pub groups: Vec<String>,
    /// Whether they were deleted (false: a dry run).
    pub deleted: bool,
}

impl DropSummary {
    /// `{app, topics, group, groups, deleted}`, as `drop-app --json` prints it.
    pub fn to_json(&self) -> Value {
        json!({ "app": self.app, "topics": self.topics, "group": self.group, "groups": self.groups, "deleted": self.deleted })
    }
}

impl std::fmt::Display for DropSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.topics.is_empty() && !self.group {
            return writeln!(
                f,
                "app {}: nothing to delete (no topic named {}.* and no consumer group {})",
                self.app, self.app, self.app
            );
        }
        let verb = if self.deleted {
            "deleted"
        } else {
            "would delete (run again with --yes)"
        };
        writeln!(f, "app {}: {verb}:", self.app)?;
        for t in &self.topics {
            writeln!(f, "  topic {t}")?;
        }
        for g in &self.groups {
            writeln!(f, "  consumer group {g}")?;
        }
        Ok(())
    }
}

/// Whether `topic` belongs to `app` (`<app>.` followed by at least one character).
pub fn belongs_to(topic: &str, app: &str) -> bool {
    topic
        .strip_prefix(app)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|rest| !rest.is_empty())
}

/// Lists the app's topics and group and, with `yes`, deletes them (topics first: the group
/// of a live service is not empty and the broker refuses to delete it, which is reported).
pub fn run(opts: &DropOptions) -> anyhow::Result<DropSummary> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if opts.app.is_empty() || !opts.app.chars().all(legal) || opts.app.starts_with('.') {
        bail!(
            "--app {:?} is not an app id (letters, digits, '.', '_', '-'; not empty, not starting with '.')",
            opts.app
        );
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &opts.bootstrap)
        .create()
        .context("creating an admin client")?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, opts.timeout)
        .with_context(|| format!("reading the topic list from {}", opts.bootstrap))?;
    let mut topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|t| belongs_to(t, &opts.app))
        .collect();
    topics.sort();
    let listed = admin
        .inner()
        .fetch_group_list(None, opts.timeout)
        .with_context(|| format!("reading the consumer groups from {}", opts.bootstrap))?;
    let mut groups: Vec<String> = listed
        .groups()
        .iter()
        .map(|g| g.name().to_owned())
        .filter(|g| *g == opts.app || belongs_to(g, &opts.app))
        .collect();
    groups.sort();
    let mut summary = DropSummary {
        app: opts.app.clone(),
        topics,
        group: !groups.is_empty(),
        groups,
        deleted: false,
    };
    if !opts.yes {
        return Ok(summary);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime for the admin client")?;
    let admin_opts = AdminOptions::new().request_timeout(Some(opts.timeout));
    rt.block_on(async {
        if !summary.topics.is_empty() {
            let names: Vec<&str> = summary.topics.iter().map(String::as_str).collect();
            let results = admin
                .delete_topics(&names, &admin_opts)
                .await
                .context("deleting topics")?;
            for r in results {
                match r {
                    Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                    Err((topic, code)) => bail!("deleting topic {topic}: {code}"),
                }
            }
        }
        if summary.group {
            let names: Vec<&str> = summary.groups.iter().map(String::as_str).collect();
            let results = admin
                .delete_groups(&names, &admin_opts)
                .await
                .context("deleting the consumer group")?;
            for r in results {
                match r {
                    Ok(_) | Err((_, RDKafkaErrorCode::GroupIdNotFound)) => {}
                    Err((group, RDKafkaErrorCode::NonEmptyGroup)) => bail!(
                        "consumer group {group} still has members: stop every instance of the app first \
                         (its topics are deleted)"
                    ),
                    Err((group, code)) => bail!("deleting consumer group {group}: {code}"),
                }
            }
        }
        Ok(())
    })?;
    summary.deleted = true;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apps_topics_are_those_under_its_name_and_a_dot() {
        assert!(belongs_to("shop.order.events", "shop"));
        assert!(belongs_to("shop._instances", "shop"));
        assert!(!belongs_to("shopx.order.events", "shop"));
        assert!(!belongs_to("shop", "shop"));
        assert!(!belongs_to("shop.", "shop"));
        assert!(!belongs_to("other.shop.events", "shop"));
    }

    #[test]
    fn a_bad_app_id_is_refused_before_any_broker_is_asked() {
        for app in ["", ".", ".hidden", "a b", "a/b", "*"] {
            let opts = DropOptions {
                bootstrap: "127.0.0.1:1".into(),
                app: app.into(),
                yes: true,
                timeout: Duration::from_millis(100),
            };
            let e = run(&opts).unwrap_err().to_string();
            assert!(e.contains("is not an app id"), "{app:?}: {e}");
        }
    }
}
