//! Kafka mode: which instance runs a process manager, and how it takes over.
//!
//! Every instance joins the consumer group `<app>.<name>` on the changelog topic
//! `<app>.<name>.state`; the member assigned its partition 0 runs the process manager.
//! On assignment it restores the local store from the changelog (from where the store's
//! copy stops), then runs a [`Worker`] whose every commit is one transaction carrying the
//! changelog records and the group's generation; on revocation it stops the worker. A
//! worker stopped by a failed transaction or an unreachable broker starts over from the
//! restore; one stopped by a failed reaction leaves the process manager `failed`.

use super::changelog::{self, applied_key};
use super::shared::{ProcessOptions, Shared};
use super::sources::{checkpoint_key, timers_key};
use super::targets::Targets;
use super::worker::{ChangelogTarget, Stop, Worker};
use crate::clock::Clock;
use eventfold_core::ProcessManager;
use eventfold_log::{GroupEvent, Log};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait before starting over after a failure of the log.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Everything a process manager's owner needs to start its worker.
pub(crate) struct Owner<P: ProcessManager> {
    pub log: Arc<dyn Log>,
    pub targets: Arc<Targets>,
    pub clock: Arc<dyn Clock>,
    pub options: ProcessOptions,
    pub config: P::Config,
    pub shared: Arc<Shared>,
    pub target: ChangelogTarget,
}

impl<P: ProcessManager> Owner<P> {
    /// Follows the group's assignments until the log closes.
    pub(crate) async fn run(self) {
        let this = Arc::new(self);
        let topic = this.target.topic.clone();
        let mut membership = loop {
            let (log, group, topics) = (this.log.clone(), this.target.group.clone(), vec![topic.clone()]);
            match tokio::task::spawn_blocking(move || log.require_coordination()?.join(&group, &topics)).await {
                Ok(Ok(m)) => break m,
                Ok(Err(e)) => {
                    tracing::warn!(process_manager = P::NAME, error = %e, "cannot join the process manager's group; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return this.shared.fail(P::NAME, format!("the join task failed: {e}")),
            }
        };
        let control = membership.control();
        let mut running: Option<tokio::task::JoinHandle<()>> = None;
        while let Some(event) = membership.next().await {
            match event {
                GroupEvent::Assigned(parts) => {
                    if parts.iter().any(|(t, p, _)| *t == topic && *p == 0) {
                        // Its records are read by the restore, not delivered by the member.
                        control.pause(&topic, 0);
                        if running.as_ref().is_none_or(|t| t.is_finished()) {
                            tracing::info!(process_manager = P::NAME, "process manager assigned here");
                            running = Some(tokio::spawn(this.clone().own()));
                        }
                    }
                }
                GroupEvent::Revoked { partitions, done, .. } => {
                    if partitions.iter().any(|(t, p)| *t == topic && *p == 0) {
                        if let Some(task) = running.take() {
                            task.abort();
                            let _ = task.await;
                        }
                        tracing::info!(process_manager = P::NAME, "process manager moved to another instance");
                        this.shared.set_remote();
                    }
                    done.done();
                }
                GroupEvent::Records { .. } => {}
                GroupEvent::Error(e) => {
                    tracing::warn!(process_manager = P::NAME, error = %e, "process manager's group member");
                }
            }
        }
        if let Some(task) = running {
            task.abort();
        }
    }

    /// Runs the process manager while this instance owns it: restore, then work; after a
    /// failure of the log, both again.
    async fn own(self: Arc<Self>) {
        loop {
            self.shared.set_catching_up();
            if let Err(e) = self.restore().await {
                tracing::warn!(process_manager = P::NAME, error = %e, "restoring from the changelog failed; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            let worker = match Worker::<P>::new(
                &self.log,
                &self.targets,
                &self.clock,
                &self.options,
                self.config.clone(),
                self.shared.clone(),
                Some(self.target.clone()),
            ) {
                Ok(w) => w,
                Err(e) => return self.shared.fail(P::NAME, e),
            };
            match worker.run().await {
                Stop::Fatal(e) => return self.shared.fail(P::NAME, e),
                Stop::Retry(e) => {
                    tracing::warn!(process_manager = P::NAME, error = %e, "process manager starts over from its changelog");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    // Lifts the fence a failed transaction left on the lane.
                    if let Some(c) = self.log.coordination() {
                        let _ = c.resume(self.target.lane).await;
                    }
                }
            }
        }
    }

    /// Brings the local rows up to the end of the changelog, from where the local copy
    /// stops (settled first: a previous owner's last transaction is decided).
    async fn restore(&self) -> Result<(), String> {
        let topic = &self.target.topic;
        let store = self.log.store().clone();
        let settled = async { self.log.require_coordination()?.settle(topic, 0).await };
        settled.await.map_err(|e| format!("cannot settle {topic}: {e}"))?;
        let end = self
            .log
            .end_offset(topic, 0)
            .await
            .map_err(|e| format!("cannot read the end of {topic}: {e}"))?;
        let mut from = store
            .get_meta(&applied_key(P::NAME))
            .map_err(|e| e.to_string())?
            .unwrap_or(0);
        let start = from;
        while from < end {
            let records = self
                .log
                .read(topic, 0, from, 4096)
                .await
                .map_err(|e| format!("cannot read {topic}: {e}"))?;
            let Some(last) = records.last().map(|(o, _)| *o) else {
                break;
            };
            let mut batch = changelog::replay(
                &store,
                P::NAME,
                &records,
                |t, p| checkpoint_key(P::NAME, t, p),
                &timers_key(P::NAME),
            )?;
            batch.put_meta(&applied_key(P::NAME), last + 1);
            self.log
                .write_local(batch)
                .await
                .map_err(|e| format!("cannot write the restored rows: {e}"))?;
            from = last + 1;
        }
        tracing::info!(
            process_manager = P::NAME,
            from = start,
            to = end,
            "restored from the changelog"
        );
        Ok(())
    }
}
