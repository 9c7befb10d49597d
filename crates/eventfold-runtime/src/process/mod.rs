//! Process managers: services that react to events (DESIGN §7).
//!
//! One worker task per registered process manager (`worker`) reads the events of its
//! subscribed aggregate types from every partition, its due timers, and the outcomes of
//! the commands it sent; `decide` turns a batch of them into a plan, which the worker
//! commits as **one unit**: states, timers, outbox entries (the commands), the consumed
//! positions and the answered outbox entries. Only then are the new commands handed to
//! their targets (`outbox`), each with a deterministic command id as its idempotency
//! key, so a command handed over again after a crash is deduplicated by its target.
//!
//! Owns: the `process` table rows of its process manager and its meta checkpoints
//! (`pm/<name>/<topic>/<partition>`). Does not touch: aggregates' state or dedup records
//! (commands go through [`AggregateService::submit`](crate::service::AggregateService),
//! like any client's, or in Kafka mode to another app's commands topic: `targets`).
//!
//! In Kafka mode one instance at a time runs a process manager (the member of its consumer
//! group assigned the changelog's partition 0, see `owner`); its rows are also written
//! to the changelog topic `<app>.<name>.state` in the same transaction, and the instance
//! that takes it over restores them from there.

mod changelog;
mod decide;
mod feed;
mod outbox;
mod owner;
mod shared;
mod sources;
mod targets;
mod worker;

use shared::Shared;
pub use shared::{ProcessOptions, ProcessState};
pub(crate) use targets::{Foreign, Targets};

use crate::clock::Clock;
use crate::error::{Error, Result};
use eventfold_core::ProcessManager;
use eventfold_core::time::rfc3339_ms;
use eventfold_log::Log;
use serde::Serialize;
use serde_json::value::RawValue;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What `/readyz` and `/metrics` show of a process manager.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    /// Its name.
    pub name: String,
    /// Lifecycle state.
    pub state: ProcessState,
    /// Source events not read yet (at the last look).
    pub lag: u64,
    /// Inputs reacted to since start.
    pub reactions: u64,
    /// Timers pending.
    pub timers_pending: u64,
    /// Timers due more than a second ago and not fired yet.
    pub timers_overdue: u64,
    /// Commands handed to their targets and not answered yet.
    pub commands_outstanding: u64,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A process manager's pending timer, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TimerView {
    /// Timer id.
    pub id: String,
    /// Due time (RFC 3339, UTC).
    pub due: String,
}

/// The state of one correlation key: `{name, key, state, timers}`.
#[derive(Debug, Serialize)]
pub struct ProcessStateView {
    /// The process manager.
    pub name: String,
    /// The correlation key.
    pub key: String,
    /// Its state document.
    pub state: Box<RawValue>,
    /// Its pending timers.
    pub timers: Vec<TimerView>,
}

/// Overdue timers are counted up to this many.
const OVERDUE_COUNT_LIMIT: usize = 10_000;

/// One process manager as the HTTP layer sees it.
pub struct ProcessService {
    name: &'static str,
    store: eventfold_store::Store,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProcessService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessService").field("name", &self.name).finish()
    }
}

impl ProcessService {
    /// Its name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// Its status.
    pub fn report(&self) -> ProcessReport {
        let s = &self.shared;
        let now = self.clock.now_ms();
        // Counting overdue timers reads them: at most once a second, up to OVERDUE_COUNT_LIMIT.
        if now.saturating_sub(s.overdue_checked_ms.load(Ordering::Relaxed)) >= 1000 {
            s.overdue_checked_ms.store(now, Ordering::Relaxed);
            let floor = s.due_floor.lock().expect("not poisoned").clone();
            let from = floor.as_ref().map(|(d, k, t)| (*d, k.as_str(), t.as_str()));
            let n = self
                .store
                .due_timers_from(self.name, from, now.saturating_sub(1000), OVERDUE_COUNT_LIMIT)
                .map_or(0, |t| t.len() as u64);
            s.overdue.store(n, Ordering::Relaxed);
        }
        ProcessReport {
            name: self.name.to_owned(),
            state: s.state(),
            lag: s.lag.load(Ordering::Relaxed),
            reactions: s.reactions.load(Ordering::Relaxed),
            timers_pending: s.timers_pending.load(Ordering::Relaxed),
            timers_overdue: s.overdue.load(Ordering::Relaxed),
            commands_outstanding: s.outstanding.load(Ordering::Relaxed),
            error: s.failure.lock().expect("not poisoned").clone(),
        }
    }

    /// Whether it has caught up (or runs on another instance) and has not failed.
    pub fn is_ready(&self) -> bool {
        matches!(self.shared.state(), ProcessState::Ready | ProcessState::Remote)
    }

    /// The state and pending timers of `key`; `None` when it has neither.
    pub fn get(&self, key: &str) -> Result<Option<ProcessStateView>> {
        if key.is_empty() || key.len() > 1024 || key.contains('\0') {
            return Err(Error::BadRequest(format!(
                "invalid correlation key {key:?}: expected 1 to 1024 bytes without NUL"
            )));
        }
        let state = self.store.get_process_state(self.name, key)?;
        let timers = self.store.timers_of(self.name, key)?;
        if state.is_none() && timers.is_empty() {
            return Ok(None);
        }
        let json = state.unwrap_or_else(|| b"null".to_vec());
        let state = String::from_utf8(json)
            .ok()
            .and_then(|s| RawValue::from_string(s).ok())
            .ok_or_else(|| Error::Corrupt {
                table: "process",
                key: format!("{}/{key}", self.name),
                reason: "state is not JSON".into(),
            })?;
        Ok(Some(ProcessStateView {
            name: self.name.to_owned(),
            key: key.to_owned(),
            state,
            timers: timers
                .into_iter()
                .map(|t| TimerView {
                    id: t.timer,
                    due: rfc3339_ms(t.due_ms),
                })
                .collect(),
        }))
    }

    /// Appends its Prometheus lines.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        let r = self.report();
        let n = self.name;
        let up = u8::from(matches!(r.state, ProcessState::Ready | ProcessState::Remote));
        let _ = writeln!(out, "eventfold_process_manager_up{{name=\"{n}\"}} {up}");
        let _ = writeln!(out, "eventfold_process_manager_lag{{name=\"{n}\"}} {}", r.lag);
        let _ = writeln!(
            out,
            "eventfold_process_manager_reactions_total{{name=\"{n}\"}} {}",
            r.reactions
        );
        let _ = writeln!(
            out,
            "eventfold_process_manager_timers_pending{{name=\"{n}\"}} {}",
            r.timers_pending
        );
        let _ = writeln!(
            out,
            "eventfold_process_manager_timers_overdue{{name=\"{n}\"}} {}",
            r.timers_overdue
        );
        let _ = writeln!(
            out,
            "eventfold_process_manager_commands_outstanding{{name=\"{n}\"}} {}",
            r.commands_outstanding
        );
    }
}

/// What a registered process manager is started with once the aggregates run.
pub(crate) struct StartWith<'a> {
    pub log: &'a Arc<dyn Log>,
    /// The aggregates it reads and sends to.
    pub targets: &'a Arc<Targets>,

    pub clock: &'a Arc<dyn Clock>,
    pub options: &'a ProcessOptions,
    /// The app id (Kafka mode: the changelog topic's and the group's prefix).
    pub app: &'a str,
    /// Kafka mode: the commit lane of its transactions (none of the partitions').
    pub lane: u32,
}

/// Starts a registered process manager.
pub(crate) type Starter = Box<dyn FnOnce(StartWith<'_>) -> Arc<ProcessService> + Send>;

/// The starter of process manager `P`.
pub(crate) fn starter<P: ProcessManager>(config: P::Config) -> Starter {
    Box::new(move |with| start::<P>(with, config))
}

/// The changelog topic of process manager `name` (Kafka mode), to provision.
pub(crate) fn changelog_topic(app: &str, name: &str) -> Arc<str> {
    changelog::topic(app, name)
}

/// Starts process manager `P` over `with.targets` (the aggregates it reads and sends to).
fn start<P: ProcessManager>(with: StartWith<'_>, config: P::Config) -> Arc<ProcessService> {
    let svc = Arc::new(ProcessService {
        name: P::NAME,
        store: with.log.store().clone(),
        clock: with.clock.clone(),
        shared: Arc::new(Shared::default()),
    });
    if with.log.coordination().is_some() {
        svc.shared.set_remote();
        let owner = owner::Owner::<P> {
            log: with.log.clone(),
            targets: with.targets.clone(),
            clock: with.clock.clone(),
            options: with.options.clone(),
            config,
            shared: svc.shared.clone(),
            target: worker::ChangelogTarget {
                topic: changelog::topic(with.app, P::NAME),
                group: changelog::group(with.app, P::NAME),
                lane: with.lane,
            },
        };
        tokio::spawn(owner.run());
        return svc;
    }
    match worker::Worker::<P>::new(
        with.log,
        with.targets,
        with.clock,
        with.options,
        config,
        svc.shared.clone(),
        None,
    ) {
        Ok(w) => {
            let shared = svc.shared.clone();
            tokio::spawn(async move {
                // The embedded log is fail-stop: whatever stopped the worker, it stays stopped.
                let why = w.run().await;
                shared.fail(P::NAME, why.to_string());
            });
        }
        Err(reason) => svc.shared.fail(P::NAME, reason),
    }
    svc
}
