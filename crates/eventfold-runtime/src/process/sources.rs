//! Where a process manager reads: one [`Source`] per partition of each subscribed events
//! topic, with the position it read up to (kept in meta, see [`checkpoint_key`]).

use super::targets::Targets;
use crate::command::Topics;
use eventfold_core::ProcessManager;
use eventfold_core::process::Subscription;
use eventfold_log::Log;
use eventfold_store::Store;
use std::sync::Arc;
use tokio::sync::broadcast;

/// One partition of a subscribed events topic.
pub(super) struct Source {
    pub(super) topic: Arc<str>,
    pub(super) partition: u32,
    /// Index into the subscriptions.
    pub(super) sub: usize,
    /// The next offset to read.
    pub(super) next: u64,
    /// The position last committed: a batch writes only the positions that moved.
    pub(super) written: u64,
    /// The topic's end when the worker started: the restore barrier's target.
    pub(super) target: u64,
}

/// The meta entry holding how many timers a process manager has pending.
pub(crate) fn timers_key(name: &str) -> String {
    format!("pm/{name}/timers")
}

/// The meta entry of a process manager's position in a source partition.
pub(crate) fn checkpoint_key(name: &str, topic: &str, partition: u32) -> String {
    format!("pm/{name}/{topic}/{partition}")
}

/// Every partition of every subscription with the position the process manager read it
/// up to, and the wake-ups of the local sources.
#[allow(clippy::type_complexity)]
pub(super) fn open<P: ProcessManager>(
    log: &Arc<dyn Log>,
    targets: &Targets,
    store: &Store,
    subs: &[Subscription<P::Event>],
) -> Result<(Vec<Source>, Vec<broadcast::Receiver<(Arc<str>, u64)>>), String> {
    let (mut sources, mut wake) = (Vec::new(), Vec::new());
    for (i, sub) in subs.iter().enumerate() {
        let t = sub.aggregate_type();
        let (topic, partitions) = match sub.app() {
            Some(app) => {
                if !targets.reaches_other_apps() {
                    return Err(format!(
                        "process manager `{}` reads app `{app}`'s aggregate type `{t}`: another app's events are read from Kafka only (start with --kafka)",
                        P::NAME
                    ));
                }
                (Topics::new(app, t).events, log.partitions())
            }
            None => {
                let svc = targets.local(t).ok_or_else(|| {
                    format!(
                        "process manager `{}` reads aggregate type `{t}`, which is not registered",
                        P::NAME
                    )
                })?;
                wake.push(svc.subscribe());
                (svc.topics().events.clone(), svc.partition_count())
            }
        };
        for partition in 0..partitions {
            let key = checkpoint_key(P::NAME, &topic, partition);
            let next = store
                .get_meta(&key)
                .map_err(|e| format!("cannot read checkpoint {key}: {e}"))?
                .unwrap_or(0);
            sources.push(Source {
                topic: topic.clone(),
                partition,
                sub: i,
                next,
                written: next,
                target: 0,
            });
        }
    }
    Ok((sources, wake))
}

/// Kept in meta by every batch; counted once (a key scan) for a store without it.
pub(super) fn timers_pending<P: ProcessManager>(store: &Store) -> Result<u64, String> {
    match store
        .get_meta(&timers_key(P::NAME))
        .map_err(|e| format!("cannot read the timer count of `{}`: {e}", P::NAME))?
    {
        Some(n) => Ok(n),
        None => store
            .count_timers(P::NAME)
            .map_err(|e| format!("cannot count the timers of `{}`: {e}", P::NAME)),
    }
}
