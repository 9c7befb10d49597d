//! The live view workers: one task per (view, source partition) follows the source,
//! wakes on the source service's commit notifications (polling as a fallback), applies a
//! batch and commits its rows, index entries and checkpoint in one store batch; a
//! partitioned view's partition catches up in bulk when it starts without a checkpoint.

use super::events::{Decoded, ReadFailure, SourceEvent, read_events};
use super::fold::{Committed, Pending, Worker};
use super::options::ViewOptions;
use super::overlay::Overlay;
use super::service::{ViewService, service};
use super::storage::{bulk_marker_key, load_row, rebuild_marker_key};
use crate::command::Topics;
use crate::error::Result;
use crate::service::AggregateService;
use eventfold_core::partition::partition_for;
use eventfold_core::{Index, Projection, Scope};
use eventfold_log::Log;
use eventfold_store::{Batch, Store, view_checkpoint_key};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::broadcast;

/// How often an idle partition of a partitioned view checks whether this instance took
/// its source partition over.
const OWNERSHIP_POLL: Duration = Duration::from_millis(100);

/// Starts the processors of projection `P` over the source service `source`.
///
/// `source` is `None` for a replicated view of an aggregate type this instance does not
/// run (a lookup table of events others write): it reads `topics` the same way, polling
/// (no commit here announces new events).
pub(crate) fn start<P: Projection>(
    log: &Arc<dyn Log>,
    topics: Topics,
    source: Option<&Arc<dyn AggregateService>>,
    options: &ViewOptions,
) -> Arc<ViewService> {
    let (svc, projection, starts) = service::<P>(log, topics, source.cloned(), options);
    // A rebuild that did not finish left the view half cleared: serving it (or building
    // on it) would be wrong, so its partitions stop until the rebuild is run again.
    match log.store().get_meta(&rebuild_marker_key(&svc.storage)) {
        Ok(None) => {}
        Ok(Some(_)) => {
            let reason = format!(
                "a rebuild of view `{}` was interrupted; run the rebuild again before serving it",
                P::VIEW
            );
            tracing::error!(view = P::VIEW, %reason, "view not started");
            for part in &svc.partitions {
                *part.failure.lock().expect("not poisoned") = Some(reason.clone());
            }
            return svc;
        }
        Err(e) => panic!("cannot read the rebuild marker of view `{}`: {e}", P::VIEW),
    }
    for (p, from) in starts.into_iter().enumerate() {
        let worker = Worker {
            projection: projection.clone(),
            svc: svc.clone(),
            log: log.clone(),
            partition: p as u32,
            partitions: log.partitions(),
            next: from,
        };
        let wake = match source {
            Some(s) => s.subscribe(),
            None => broadcast::channel(1).1, // closed at once: the worker polls
        };
        let handle = tokio::spawn(worker.run(wake));
        svc.workers.lock().expect("not poisoned").push(handle);
    }
    svc
}

/// Why a worker step failed.
enum Step {
    /// Reading the source failed: worth retrying.
    Read(String),
    /// Applying or storing failed: the view partition stops.
    Fatal(String),
}

impl From<ReadFailure> for Step {
    fn from(f: ReadFailure) -> Self {
        match f {
            ReadFailure::Read(e) => Step::Read(e),
            ReadFailure::Decode(e) => Step::Fatal(e),
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read(e) | Self::Fatal(e) => f.write_str(e),
        }
    }
}

/// The live workers' committed state: the store.
struct Stored<'a> {
    store: &'a Store,
    view: &'a str,
    indexes: &'a [Index],
}

impl Committed for Stored<'_> {
    fn row(&self, key: &str) -> Result<Option<Value>> {
        load_row(self.store, self.view, key)
    }

    fn owner(&self, index: usize, value: &[u8]) -> Result<Option<String>> {
        Ok(self.store.get_view_unique(self.view, self.indexes[index].name, value)?)
    }
}

/// Runs a store write of the bulk catch-up on a blocking thread.
async fn blocking(f: Box<dyn FnOnce() -> eventfold_store::Result<()> + Send>) -> Result<(), Step> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Step::Fatal(format!("bulk catch-up: {e}"))),
        Err(e) => Err(Step::Fatal(format!("bulk catch-up task failed: {e}"))),
    }
}

/// The fallback poll doubles this many times at most while a partition idles.
const IDLE_POLL_DOUBLINGS: u32 = 3;

/// The fallback poll's interval after `idle` reads in a row that found nothing: `base`,
/// doubling from the second one up to `base << IDLE_POLL_DOUBLINGS`. New events of the
/// partition committed here wake the worker at once whatever it is.
fn idle_poll(base: Duration, idle: u32) -> Duration {
    base.saturating_mul(1 << idle.saturating_sub(1).min(IDLE_POLL_DOUBLINGS))
}

impl<P: Projection> Worker<P> {
    async fn run(mut self, mut wake: broadcast::Receiver<(Arc<str>, u64)>) {
        let topic = self.svc.source.events.clone();
        let svc = self.svc.clone();
        let progress = &svc.partitions[self.partition as usize];
        // Whether this instance serves the partition: always for a replicated view; for a
        // partitioned one, while it owns the source partition.
        let mut serving = false;
        let mut target = u64::MAX;
        // Reads in a row that found nothing: the fallback poll slows down while the
        // partition idles (on Kafka each poll at the end asks the broker for the end).
        let mut idle_polls: u32 = 0;
        loop {
            if svc.retired.load(Ordering::Acquire) {
                return;
            }
            if !svc.is_local(self.partition) {
                if serving {
                    tracing::info!(
                        view = P::VIEW,
                        partition = self.partition,
                        "view partition moved to another instance"
                    );
                    serving = false;
                    progress.caught_up.store(false, Ordering::Release);
                }
                tokio::time::sleep(OWNERSHIP_POLL).await;
                continue;
            }
            if !serving {
                target = match self.take_over(&topic).await {
                    Ok(Some(target)) => target,
                    Ok(None) => continue,
                    Err(e) => return self.fail(e),
                };
                serving = true;
            }
            if self.next >= target {
                self.caught_up(target);
            }
            match self.step(&topic, self.svc.options.max_batch_events).await {
                // Nothing left to read: caught up even if `next` is below the target, as
                // in Kafka, where transaction markers take offsets but are never read.
                Ok(0) => {
                    idle_polls = idle_polls.saturating_add(1);
                    self.caught_up(target);
                }
                // A backlog: read on at once.
                Ok(n) if n.saturating_mul(4) >= self.svc.options.max_batch_events => {
                    idle_polls = 0;
                    continue;
                }
                // Under a steady load, reading again at once made batches of one or two
                // events: wait for the next notification and the linger (less CPU per
                // command; bench/FINDINGS.md, "Moved from code comments").
                Ok(_) => idle_polls = 0,
                // The log's read failed (Kafka: the broker is away): reads are idempotent,
                // try again from the same checkpoint.
                Err(Step::Read(e)) => {
                    tracing::warn!(view = P::VIEW, partition = self.partition, error = %e, "view read failed; retrying");
                    tokio::time::sleep(self.svc.options.poll_interval.max(Duration::from_millis(500))).await;
                    continue;
                }
                Err(Step::Fatal(e)) => return self.fail(e),
            }
            self.wait_for_more(&mut wake, idle_polls).await;
        }
    }

    /// Marks the partition caught up with its target (once: readiness waits for it).
    fn caught_up(&self, target: u64) {
        let progress = &self.svc.partitions[self.partition as usize];
        if !progress.caught_up.load(Ordering::Relaxed) {
            tracing::debug!(
                view = P::VIEW,
                partition = self.partition,
                next = self.next,
                target,
                "view partition caught up"
            );
            progress.caught_up.store(true, Ordering::Release);
        }
    }

    /// Starts serving the partition: takes the catch-up target, the source's end now (see
    /// the module docs on readiness), and on a partitioned view catches up in bulk when
    /// it should. A partition taken over continues from its own checkpoint: the rows
    /// stored with it are the fold up to there. Returns the target; `None` to go round
    /// again (the log was away, after a pause; or the view retired or the partition moved
    /// away midway); or why the partition stops.
    async fn take_over(&mut self, topic: &Arc<str>) -> Result<Option<u64>, String> {
        // The log may be away (a broker restart, which is also when partitions move):
        // retry like a failed read.
        let target = match self.log.end_offset(topic, self.partition).await {
            Ok(end) => end,
            Err(e) => {
                tracing::warn!(view = P::VIEW, partition = self.partition, error = %e, "cannot read the source's end offset; retrying");
                tokio::time::sleep(self.svc.options.poll_interval.max(Duration::from_millis(500))).await;
                return Ok(None);
            }
        };
        self.svc.partitions[self.partition as usize]
            .target
            .store(target, Ordering::Release);
        if self.svc.scope == Scope::Partitioned {
            match self.bulk_catch_up(topic, target).await {
                Ok(true) => {}
                Ok(false) => return Ok(None), // retired, or the partition moved away
                Err(Step::Read(e)) => {
                    tracing::warn!(view = P::VIEW, partition = self.partition, error = %e, "bulk catch-up: read failed; retrying");
                    tokio::time::sleep(self.svc.options.poll_interval.max(Duration::from_millis(500))).await;
                    return Ok(None);
                }
                Err(Step::Fatal(e)) => return Err(e),
            }
            tracing::info!(
                view = P::VIEW,
                partition = self.partition,
                from = self.next,
                target,
                "view partition served here"
            );
        }
        Ok(Some(target))
    }

    /// Waits until there may be more to read: a commit notification for this partition
    /// (then the linger, cut short by a query waiting for a position), a query waiting
    /// for a position, or the fallback poll, slower after `idle_polls` empty reads.
    async fn wait_for_more(&self, wake: &mut broadcast::Receiver<(Arc<str>, u64)>, idle_polls: u32) {
        let progress = &self.svc.partitions[self.partition as usize];
        tokio::select! {
            closed = self.wait_for_own_partition(wake) => {
                if closed {
                    // The source is gone (shutdown); keep polling at the slow pace.
                    tokio::time::sleep(self.svc.options.poll_interval).await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.svc.options.linger) => {}
                    _ = progress.hurry.notified() => {}
                }
                while wake.try_recv().is_ok() {}
            }
            // A query waiting for a position (`wait_for`) reads at once.
            _ = progress.hurry.notified() => {}
            _ = tokio::time::sleep(idle_poll(self.svc.options.poll_interval, idle_polls)) => {}
        }
    }

    /// Catches this partition of a partitioned view up to `target` like an offline
    /// rebuild, when it has no checkpoint (so no rows of its own: the view is partitioned)
    /// and at least `bulk_catch_up_min_events` to apply: folds the events in memory
    /// ([`Overlay`], on blocking threads), writes the rows and entries by
    /// ingestion, then the checkpoint. A durable marker covers the partition meanwhile:
    /// found at the next start (a crash, or the partition moved away), the rows written so
    /// far are removed and the catch-up starts over. Returns false, with `next`
    /// unchanged, when the view retires or the partition moves away midway.
    async fn bulk_catch_up(&mut self, topic: &Arc<str>, target: u64) -> Result<bool, Step> {
        let store = self.log.store().clone();
        let marker = bulk_marker_key(&self.svc.storage, self.partition);
        let interrupted = store
            .get_meta(&marker)
            .map_err(|e| Step::Fatal(format!("cannot read {marker}: {e}")))?
            .is_some();
        let checkpoint = view_checkpoint_key(&self.svc.storage, topic, self.partition);
        if interrupted {
            self.clear_interrupted_bulk(&store, &marker, &checkpoint).await?;
        }
        let min = self.svc.options.bulk_catch_up_min_events;
        if self.next != 0 || target < min.max(1) {
            return Ok(true);
        }
        let _permit = self.svc.bulk.clone().acquire_owned().await.expect("never closed");
        let started = std::time::Instant::now();
        let (s, m) = (store.clone(), marker.clone());
        blocking(Box::new(move || {
            let mut b = Batch::new();
            b.put_meta(&m, 1);
            s.commit(b, true)
        }))
        .await?;
        let Some((mut overlay, next)) = self.fold_in_bulk(topic, target, &store).await? else {
            return Ok(false); // the marker stays: the next start removes what was written
        };
        let write = overlay.spill();
        let s = store.clone();
        blocking(Box::new(move || {
            s.ingest_view(write, false)?;
            let mut b = Batch::new();
            b.put_meta(&checkpoint, next);
            b.delete_meta(&marker);
            s.commit(b, true)
        }))
        .await?;
        tracing::info!(
            view = P::VIEW,
            partition = self.partition,
            events = next,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "view partition caught up in bulk"
        );
        self.next = next;
        self.svc.partitions[self.partition as usize].applied.send_replace(next);
        Ok(true)
    }

    /// Removes what an interrupted bulk catch-up of this partition wrote (its rows, its
    /// checkpoint `checkpoint` and its marker `marker`): it starts over from offset 0.
    async fn clear_interrupted_bulk(&mut self, store: &Store, marker: &str, checkpoint: &str) -> Result<(), Step> {
        let (s, view, (p, n)) = (
            store.clone(),
            self.svc.storage.clone(),
            (self.partition, self.partitions),
        );
        let (marker, checkpoint) = (marker.to_owned(), checkpoint.to_owned());
        blocking(Box::new(move || {
            let removed = s.clear_view_rows(&view, &|key| partition_for(key.as_bytes(), n) == p)?;
            tracing::warn!(view = %view, partition = p, removed, "removed the rows of an interrupted bulk catch-up");
            let mut b = Batch::new();
            b.delete_meta(&checkpoint);
            b.delete_meta(&marker);
            s.commit(b, true)
        }))
        .await?;
        self.next = 0;
        self.svc.partitions[self.partition as usize].applied.send_replace(0);
        Ok(())
    }

    /// Folds the events of this partition from offset 0 up to `target` into an
    /// [`Overlay`] on blocking threads, written to the store by ingestion whenever its
    /// memory is full. Returns the overlay (what it holds is not written yet) and the
    /// next offset; `None` when the view retires or the partition moves away midway.
    async fn fold_in_bulk(&self, topic: &Arc<str>, target: u64, store: &Store) -> Result<Option<(Overlay, u64)>, Step> {
        let mut overlay = Some(Overlay::new(
            store.clone(),
            self.svc.clone(),
            self.svc.options.rebuild_threads,
        ));
        let mut next = 0;
        let max = self.svc.options.rebuild_batch_events.max(1);
        while next < target {
            if self.svc.retired.load(Ordering::Acquire) || !self.svc.is_local(self.partition) {
                return Ok(None);
            }
            let events = read_events::<P>(&*self.log, topic, self.partition, next, max, u64::MAX)
                .await
                .map_err(Step::from)?;
            let Some(last) = events.last().map(|e| e.offset) else {
                break; // only offsets without records are left (Kafka's transaction markers)
            };
            let worker = self.handle();
            let mut o = overlay.take().expect("put back after each chunk");
            let topic = topic.clone();
            let (o, folded) = tokio::task::spawn_blocking(move || {
                let mut pending = Pending {
                    derive_plain_entries: o.whole,
                    ..Default::default()
                };
                let folded = worker.fold(&mut pending, &topic, &events, &o);
                if folded.is_ok() {
                    o.take(pending);
                }
                (o, folded)
            })
            .await
            .map_err(|e| Step::Fatal(format!("bulk catch-up task failed: {e}")))?;
            folded.map_err(Step::Fatal)?;
            next = last + 1;
            overlay = Some(o);
            let o = overlay.as_mut().expect("just put back");
            if o.bytes > o.max_bytes {
                let (s, write) = (store.clone(), o.spill());
                blocking(Box::new(move || s.ingest_view(write, false).map(drop))).await?;
            }
        }
        Ok(Some((overlay.expect("put back after each chunk"), next)))
    }

    /// A copy of this worker for a blocking thread (its checkpoint is not shared).
    fn handle(&self) -> Worker<P> {
        Worker {
            projection: self.projection.clone(),
            svc: self.svc.clone(),
            log: self.log.clone(),
            partition: self.partition,
            partitions: self.partitions,
            next: self.next,
        }
    }

    /// Reads up to `max` source events from the checkpoint, applies them and commits the
    /// rows, index entries and next offset in one batch, then publishes the new offset.
    /// Returns how many events it applied (0: none there yet).
    async fn step(&mut self, topic: &str, max: usize) -> Result<usize, Step> {
        let events = read_events::<P>(&*self.log, topic, self.partition, self.next, max, u64::MAX)
            .await
            .map_err(Step::from)?;
        let Some(next) = events.last().map(|e| e.offset + 1) else {
            return Ok(0);
        };
        let base = Stored {
            store: self.log.store(),
            view: &self.svc.storage,
            indexes: &self.svc.indexes,
        };
        let batch = self.apply(topic, &events, next, &base).map_err(Step::Fatal)?;
        // Not durable by itself (the rows are derived from the log; a crash may lose a
        // tail of them with their checkpoint): the embedded log writes it with its next
        // group commit.
        if let Err(e) = self.log.write_local(batch).await {
            return Err(Step::Fatal(format!("cannot commit: {e}")));
        }
        self.next = next;
        self.svc.partitions[self.partition as usize].applied.send_replace(next);
        Ok(events.len())
    }

    /// Waits for a commit notification that concerns this worker's partition (a lag
    /// counts: something may have been missed). Returns true when the source is gone.
    async fn wait_for_own_partition(&self, wake: &mut broadcast::Receiver<(Arc<str>, u64)>) -> bool {
        loop {
            match wake.recv().await {
                Ok((id, _)) if partition_for(id.as_bytes(), self.partitions) == self.partition => return false,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return false,
                Err(broadcast::error::RecvError::Closed) => return true,
            }
        }
    }

    fn fail(&self, reason: String) {
        tracing::error!(view = P::VIEW, partition = self.partition, %reason, "view partition stopped");
        *self.svc.partitions[self.partition as usize]
            .failure
            .lock()
            .expect("not poisoned") = Some(reason);
    }

    /// Applies `events` over `base` (what is committed) and returns the store batch:
    /// rows, index entries, checkpoint `next`.
    fn apply(
        &self,
        topic: &str,
        events: &[Decoded<SourceEvent<P>>],
        next: u64,
        base: &dyn Committed,
    ) -> Result<Batch, String> {
        let mut pending = Pending::default();
        self.fold(&mut pending, topic, events, base)?;
        let view = self.svc.storage.as_str();
        let mut batch = Batch::with_capacity(pending.rows.len() * 3 + 1);
        for (key, doc) in pending.rows {
            match doc {
                Some(doc) => batch.put_view_row(view, &key, &serde_json::to_vec(&doc).expect("JSON values serialize")),
                None => batch.delete_view_row(view, &key),
            }
        }
        for ((i, value, entry), row) in &pending.entries {
            let idx = &self.svc.indexes[*i];
            match row {
                Some(key) => batch.put_view_entry(view, idx.name, value, key, idx.unique),
                None => batch.delete_view_entry(view, idx.name, value, entry, idx.unique),
            }
        }
        batch.put_meta(&view_checkpoint_key(view, topic, self.partition), next);
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_fallback_poll_slows_down_while_a_partition_idles() {
        let base = Duration::from_millis(500);
        let polls: Vec<u128> = (0..7).map(|idle| idle_poll(base, idle).as_millis()).collect();
        assert_eq!(polls, [500, 500, 1000, 2000, 4000, 4000, 4000]);
        assert_eq!(idle_poll(base, u32::MAX), Duration::from_millis(4000));
    }
}
