//! Offline view rebuilds: a view applied again from offset 0 of its source, while nothing
//! else writes it.
//!
//! The rebuild runs the live workers' [`Worker::apply`] (so it builds exactly the rows,
//! index entries, unique-index owners and checkpoints a live view builds from the same
//! events), with three differences that only hold because nothing else writes the view:
//!
//! - **Reading is pipelined:** a reader task reads the source in chunks of
//!   [`ViewOptions::rebuild_batch_events`] and decodes the payloads, while the previous
//!   chunk is applied, and the one before it committed (one store batch per chunk, not
//!   fsynced; one fsync at the end, before the marker goes).
//! - **Rows come from memory:** what the rebuild wrote is kept in a [`Memory`] (rows as
//!   JSON, unique-index owners), so it reads the store only for what it evicted; until it
//!   evicts anything, a row it has not written does not exist (the view was cleared).
//! - **Batches are large**, so their commits are few.

use super::{
    Applied, Committed, Decoded, SourceEvent, UniqueValue, Worker, decode, parse_row, rebuild_marker_key, service,
};
use crate::error::{Error, Result};
use crate::service::Topics;
use crate::view::{ViewOptions, storage_name};
use eventfold_core::{Aggregate, Index, Projection};
use eventfold_log::Log;
use eventfold_store::{Batch, Store};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a rebuild did.
#[derive(Debug, Clone, Default)]
pub struct RebuildStats {
    /// Entries removed before the rebuild (rows, index entries, checkpoints).
    pub cleared: u64,
    /// Source events applied.
    pub events: u64,
    /// Rows the view holds afterwards.
    pub rows: u64,
    /// Rows left out of a unique index because another row held the value.
    pub unique_conflicts: u64,
    /// Time the rebuild took (clearing included).
    pub elapsed: Duration,
}

/// Rebuilds the view of projection `P` from its source events in `log`, from offset 0 of
/// every partition: clears the view's rows, index entries and checkpoints, then applies
/// the events up to the end offsets taken at the start, in batches of
/// `options.rebuild_batch_events`, each committed with its checkpoint like a live view
/// (see the module docs). `progress(applied, total)` is called after each batch.
///
/// Nothing else may write the view meanwhile: run it while the service is stopped (the
/// store's lock makes a second process fail to open it). A durable marker is written
/// first and removed last, so an interrupted rebuild is noticed: the service refuses to
/// serve that view until a rebuild completes.
pub async fn rebuild<P: Projection>(
    log: Arc<dyn Log>,
    app_id: &str,
    options: &ViewOptions,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<RebuildStats> {
    let started = std::time::Instant::now();
    let source = Topics::new(app_id, <P::Source as Aggregate>::TYPE);
    let store = log.store().clone();
    let storage = storage_name(P::VIEW, P::VERSION);
    // The ends first: a source that cannot be read (a missing topic, a broker away)
    // fails the rebuild before it touches the view.
    let mut ends = Vec::new();
    for p in 0..log.partitions() {
        ends.push(log.end_offset(&source.events, p).await?);
    }
    let marker = rebuild_marker_key(&storage);
    let mut b = Batch::new();
    b.put_meta(&marker, 1);
    store.commit(b, true)?;
    let cleared = store.clear_view(&storage, 10_000)?;
    let (svc, projection, _) = service::<P>(&log, source.clone(), None, options);
    let total: u64 = ends.iter().sum();
    progress(0, total);
    let failed = |partition: u32, reason: String| Error::ViewFailed {
        view: P::VIEW.to_owned(),
        partition,
        reason,
    };

    let (tx, mut rx) = mpsc::channel(2);
    let reader = tokio::spawn(read::<P>(
        log.clone(),
        source.events.clone(),
        ends,
        options.rebuild_batch_events.max(1),
        tx,
    ));
    let workers: Vec<Worker<P>> = (0..log.partitions())
        .map(|p| Worker {
            projection: projection.clone(),
            svc: svc.clone(),
            log: log.clone(),
            partition: p,
            partitions: log.partitions(),
            next: 0,
        })
        .collect();
    let mut memory = Memory::new(&store, &storage, &svc.indexes, options.rebuild_cache_bytes);
    // The batch being committed while the next one is applied.
    let mut committing: Option<(u32, tokio::task::JoinHandle<eventfold_store::Result<()>>)> = None;
    let mut applied = 0;
    while let Some(chunk) = rx.recv().await {
        let Chunk {
            partition,
            events,
            next,
        } = chunk.map_err(|(p, e)| failed(p, e))?;
        let worker = &workers[partition as usize];
        let Applied { batch, rows, owners } = worker
            .apply(&source.events, &events, next, &memory)
            .map_err(|e| failed(partition, e))?;
        // What `memory` forgets must be in the store: the batch before is committed first.
        if let Some((p, commit)) = committing.take() {
            finish(commit).await.map_err(|e| failed(p, e))?;
        }
        memory.remember(rows, owners);
        let store = store.clone();
        committing = Some((
            partition,
            tokio::task::spawn_blocking(move || store.commit(batch, false)),
        ));
        applied += events.len() as u64;
        progress(applied, total);
    }
    if let Some((p, commit)) = committing.take() {
        finish(commit).await.map_err(|e| failed(p, e))?;
    }
    reader
        .await
        .map_err(|e| failed(0, format!("the reader task failed: {e}")))?;
    // The batches were not fsynced: they are durable before the marker goes.
    store.sync()?;
    let mut b = Batch::new();
    b.delete_meta(&marker);
    store.commit(b, true)?;
    Ok(RebuildStats {
        cleared,
        events: applied,
        rows: store.count_view_rows(&storage)?,
        unique_conflicts: svc.unique_conflicts.iter().map(|n| n.load(Ordering::Relaxed)).sum(),
        elapsed: started.elapsed(),
    })
}

async fn finish(commit: tokio::task::JoinHandle<eventfold_store::Result<()>>) -> Result<(), String> {
    match commit.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("cannot commit: {e}")),
        Err(e) => Err(format!("commit task failed: {e}")),
    }
}

/// Source events of one partition, decoded, and the checkpoint after them.
struct Chunk<E> {
    partition: u32,
    events: Vec<Decoded<E>>,
    next: u64,
}

/// A chunk read, or why reading stopped (with the partition).
type ReadResult<E> = Result<Chunk<E>, (u32, String)>;

/// Reads every partition of `topic` from 0 up to its end in `ends`, `max` records at a
/// time, decodes them and sends them on; an error ends the reading (sent as the last
/// item, with the partition it concerns).
async fn read<P: Projection>(
    log: Arc<dyn Log>,
    topic: Arc<str>,
    ends: Vec<u64>,
    max: usize,
    tx: mpsc::Sender<ReadResult<SourceEvent<P>>>,
) {
    for (p, end) in ends.into_iter().enumerate() {
        let p = p as u32;
        let mut next = 0;
        while next < end {
            let want = max.min((end - next).try_into().unwrap_or(usize::MAX));
            let mut records = match log.read(&topic, p, next, want).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err((p, format!("cannot read {topic}/{p}: {e}")))).await;
                    return;
                }
            };
            // Records appended since the start (in Kafka, by other instances) wait for the
            // live workers: the rebuild stops at the ends it took.
            records.retain(|(o, _)| *o < end);
            let Some(last) = records.last().map(|(o, _)| *o) else {
                // Only offsets without records are left (Kafka's transaction markers).
                break;
            };
            next = last + 1;
            let chunk = decode::<P>(&topic, p, records).map(|events| Chunk {
                partition: p,
                events,
                next,
            });
            let failed = chunk.is_err();
            if tx.send(chunk.map_err(|e| (p, e))).await.is_err() || failed {
                return;
            }
        }
    }
}

/// What the rebuild has written, kept in memory (bounded by bytes): rows as JSON
/// (`None`: deleted) and unique-index owners. While it never dropped anything (`whole`),
/// a key it does not hold was never written since the view was cleared: it does not
/// exist. After a drop, such keys are read from the store.
struct Memory<'a> {
    store: &'a Store,
    view: &'a str,
    indexes: &'a [Index],
    rows: HashMap<String, Option<Box<[u8]>>>,
    owners: HashMap<UniqueValue, Option<String>>,
    whole: bool,
    bytes: usize,
    max_bytes: usize,
}

impl<'a> Memory<'a> {
    fn new(store: &'a Store, view: &'a str, indexes: &'a [Index], max_bytes: usize) -> Self {
        Self {
            store,
            view,
            indexes,
            rows: HashMap::new(),
            owners: HashMap::new(),
            whole: true,
            bytes: 0,
            max_bytes,
        }
    }

    /// Takes in a batch's rows and owners. Call it only once every batch before that one
    /// is committed: when full, it forgets everything, and the store must then answer
    /// for what it held.
    fn remember(&mut self, rows: Vec<(String, Option<Vec<u8>>)>, owners: Vec<(UniqueValue, Option<String>)>) {
        /// Hash map and allocation overhead per entry, roughly.
        const ENTRY: usize = 64;
        if self.bytes > self.max_bytes {
            tracing::debug!(bytes = self.bytes, "rebuild memory full: forgetting it");
            self.rows.clear();
            self.owners.clear();
            self.bytes = 0;
            self.whole = false;
        }
        for (key, json) in rows {
            let size = ENTRY + key.len();
            self.bytes += size + json.as_ref().map_or(0, Vec::len);
            if let Some(old) = self.rows.insert(key, json.map(Vec::into_boxed_slice)) {
                self.bytes -= size + old.map_or(0, |j| j.len());
            }
        }
        for ((i, value), key) in owners {
            let size = ENTRY + value.len();
            self.bytes += size + key.as_ref().map_or(0, String::len);
            if let Some(old) = self.owners.insert((i, value), key) {
                self.bytes -= size + old.map_or(0, |k| k.len());
            }
        }
    }
}

impl Committed for Memory<'_> {
    fn row(&self, key: &str) -> Result<Option<Value>> {
        match self.rows.get(key) {
            Some(Some(json)) => parse_row(self.view, key, json).map(Some),
            Some(None) => Ok(None),
            None if self.whole => Ok(None),
            None => super::load_row(self.store, self.view, key),
        }
    }

    fn owner(&self, index: usize, value: &[u8]) -> Result<Option<String>> {
        match self.owners.get(&(index, value.to_vec())) {
            Some(o) => Ok(o.clone()),
            None if self.whole => Ok(None),
            None => Ok(self.store.get_view_unique(self.view, self.indexes[index].name, value)?),
        }
    }
}
