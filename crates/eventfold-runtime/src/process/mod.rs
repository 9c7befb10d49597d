//! Process managers: services that react to events (DESIGN §7).
//!
//! One worker task per registered process manager ([`worker`]) reads the events of its
//! subscribed aggregate types from every partition, its due timers, and the outcomes of
//! the commands it sent; [`decide`] turns a batch of them into a plan, which the worker
//! commits as **one unit**: states, timers, outbox entries (the commands), the consumed
//! positions and the answered outbox entries. Only then are the new commands handed to
//! their targets ([`outbox`]), each with a deterministic command id as its idempotency
//! key, so a command handed over again after a crash is deduplicated by its target.
//!
//! Owns: the `process` table rows of its process manager and its meta checkpoints
//! (`pm/<name>/<topic>/<partition>`). Does not touch: aggregates' state or dedup records
//! (commands go through [`AggregateService::submit`], like any client's).
//!
//! Runs on the embedded log. In Kafka mode a process manager is reported `failed` with
//! the reason: its state would have to move between instances with the partitions.

mod decide;
mod outbox;
mod shared;
mod worker;

use shared::Shared;
pub use shared::{ProcessOptions, ProcessState};

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::service::AggregateService;
use eventfold_core::ProcessManager;
use eventfold_core::time::rfc3339_ms;
use eventfold_log::Log;
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
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
        // Counting overdue timers reads them: at most once a second, and at most 100,000.
        if now.saturating_sub(s.overdue_checked_ms.load(Ordering::Relaxed)) >= 1000 {
            s.overdue_checked_ms.store(now, Ordering::Relaxed);
            let n = self
                .store
                .due_timers(self.name, now.saturating_sub(1000), 100_000)
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

    /// Whether it has caught up and not failed.
    pub fn is_ready(&self) -> bool {
        self.shared.state() == ProcessState::Ready
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
            .ok_or_else(|| {
                Error::Store(eventfold_store::Error::Corrupt {
                    table: "process",
                    key: format!("{}/{key}", self.name),
                    reason: "state is not JSON".into(),
                })
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
        let up = u8::from(r.state == ProcessState::Ready);
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

/// Starts a registered process manager once the aggregates run.
pub(crate) type Starter = Box<
    dyn FnOnce(
            &Arc<dyn Log>,
            &BTreeMap<String, Arc<dyn AggregateService>>,
            &Arc<dyn Clock>,
            &ProcessOptions,
        ) -> Arc<ProcessService>
        + Send,
>;

/// The starter of process manager `P`.
pub(crate) fn starter<P: ProcessManager>(config: P::Config) -> Starter {
    Box::new(move |log, services, clock, options| start::<P>(log, services, clock, options, config))
}

/// Starts process manager `P` over `services` (the aggregates it reads and sends to).
pub(crate) fn start<P: ProcessManager>(
    log: &Arc<dyn Log>,
    services: &BTreeMap<String, Arc<dyn AggregateService>>,
    clock: &Arc<dyn Clock>,
    options: &ProcessOptions,
    config: P::Config,
) -> Arc<ProcessService> {
    let svc = Arc::new(ProcessService {
        name: P::NAME,
        store: log.store().clone(),
        clock: clock.clone(),
        shared: Arc::new(Shared::default()),
    });
    if log.store_is_cache() {
        svc.shared.fail(
            P::NAME,
            "process managers run on the embedded log only so far: in Kafka mode their state would have to move between instances with the partitions".into(),
        );
        return svc;
    }
    match worker::Worker::<P>::new(log, services, clock, options, config, svc.shared.clone()) {
        Ok(w) => {
            tokio::spawn(w.run());
        }
        Err(reason) => svc.shared.fail(P::NAME, reason),
    }
    svc
}
