//! Where a process manager's commands go: this service's aggregates, or in Kafka mode
//! another app's, through that app's commands topic like any Kafka client's (DESIGN §2):
//! produced to `<app>.<type>.commands` with `ef-command-id` and `ef-reply-partition`, the
//! outcome read from `<app>.<type>.results` (see [`Requester`]). The other app's owner
//! deduplicates by command id, so a command handed over again gets its original outcome.

use crate::clock::Clock;
use crate::command::{CommandRequest, Topics};
use crate::error::Result;
use crate::remote::Requester;
use crate::service::AggregateService;
use eventfold_core::Outcome;
use eventfold_core::partition::partition_for;
use eventfold_log::Log;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The aggregates a process manager can read and send to.
pub(crate) struct Targets {
    app: String,
    local: BTreeMap<String, Arc<dyn AggregateService>>,
    /// Kafka mode: other apps' aggregates; `None` on the embedded log (one app).
    foreign: Option<Foreign>,
    /// The lookup tables reactions read.
    tables: crate::lookup::Tables,
}

/// Requesters of other apps' aggregate types, made at their first command.
pub(crate) struct Foreign {
    log: Arc<dyn Log>,
    clock: Arc<dyn Clock>,
    /// The results partition this instance listens to is chosen from it.
    instance: String,
    timeout: Duration,
    requesters: Mutex<HashMap<(String, String), Arc<Requester>>>,
}

impl Foreign {
    /// Reaches other apps through `log` as instance `instance` (e.g. `payments-a`).
    pub(crate) fn new(log: Arc<dyn Log>, clock: Arc<dyn Clock>, instance: String, timeout: Duration) -> Self {
        Self {
            log,
            clock,
            instance,
            timeout,
            requesters: Mutex::new(HashMap::new()),
        }
    }
}

/// One aggregate type a command can go to.
#[derive(Clone)]
pub(crate) enum Target {
    /// This service's.
    Local(Arc<dyn AggregateService>),
    /// Another app's, through its topics.
    Remote {
        requester: Arc<Requester>,
        topics: Topics,
        partitions: u32,
        timeout: Duration,
    },
}

impl Target {
    /// Submits `request` (a command of type `command_type`) and waits for its outcome.
    pub(crate) async fn submit(&self, command_type: &str, request: CommandRequest) -> Result<Outcome> {
        match self {
            Target::Local(service) => service.submit(request).await,
            Target::Remote {
                requester,
                topics,
                partitions,
                timeout,
            } => {
                crate::service::check_id(&request.aggregate_id)?;
                let p = partition_for(request.aggregate_id.as_bytes(), *partitions);
                requester.submit(topics, p, command_type, request, *timeout).await
            }
        }
    }
}

impl Targets {
    /// This service's aggregates (`local`, of app `app`), in Kafka mode `foreign`, and
    /// the lookup tables.
    pub(crate) fn new(
        app: String,
        local: BTreeMap<String, Arc<dyn AggregateService>>,
        foreign: Option<Foreign>,
        tables: crate::lookup::Tables,
    ) -> Self {
        Self {
            app,
            local,
            foreign,
            tables,
        }
    }

    /// The lookup tables.
    pub(crate) fn tables(&self) -> &crate::lookup::Tables {
        &self.tables
    }

    /// This service's aggregate type `t`.
    pub(crate) fn local(&self, t: &str) -> Option<&Arc<dyn AggregateService>> {
        self.local.get(t)
    }

    /// Whether other apps can be reached (Kafka mode).
    pub(crate) fn reaches_other_apps(&self) -> bool {
        self.foreign.is_some()
    }

    /// Whether a command to aggregate type `t` of `app` (`None`: this service) can go.
    pub(crate) fn knows(&self, app: Option<&str>, t: &str) -> bool {
        match app {
            Some(a) if a != self.app => self.foreign.is_some() && topic_part(a) && topic_part(t),
            _ => self.local.contains_key(t),
        }
    }

    /// The target of a command to aggregate type `t` of `app`.
    pub(crate) fn get(&self, app: Option<&str>, t: &str) -> Option<Target> {
        let app = match app {
            Some(a) if a != self.app => a,
            _ => return self.local.get(t).cloned().map(Target::Local),
        };
        let foreign = self.foreign.as_ref()?;
        if !topic_part(app) || !topic_part(t) {
            return None;
        }
        let topics = Topics::new(app, t);
        let requester = foreign
            .requesters
            .lock()
            .expect("requesters lock")
            .entry((app.to_owned(), t.to_owned()))
            .or_insert_with(|| {
                Requester::start(
                    foreign.log.clone(),
                    foreign.clock.clone(),
                    &foreign.instance,
                    vec![topics.results.clone()],
                )
            })
            .clone();
        Some(Target::Remote {
            requester,
            topics,
            partitions: foreign.log.partitions(),
            timeout: foreign.timeout,
        })
    }
}

/// Whether `s` can be an app id or aggregate type in a topic name `<app>.<type>.<kind>`:
/// 1 to 100 ASCII letters, digits, `_` or `-`.
fn topic_part(s: &str) -> bool {
    !s.is_empty() && s.len() <= 100 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
