//! Offline view rebuilds: a view applied again from offset 0 of its source, while nothing
//! else writes it.
//!
//! The rebuild runs the live workers' [`Worker::fold`] (so it builds exactly the rows,
//! index entries, unique-index owners and checkpoints a live view builds from the same
//! events), but writes nothing per batch: only because nothing else writes the view,
//!
//! - **reading is pipelined:** a reader task reads the source in chunks of
//!   [`ViewOptions::rebuild_batch_events`] and decodes the payloads while the previous
//!   chunk is applied;
//! - **the view is built in memory** (an [`Overlay`]: rows, unique-index entries and
//!   owners) up to [`ViewOptions::rebuild_cache_bytes`]; entries of non-unique indexes
//!   are not tracked change by change but derived from the final rows. Rows changed
//!   recently stay parsed (up to [`ViewOptions::rebuild_hot_bytes`]): the next event of
//!   the same entity changes them without parsing them again, and each is serialized to
//!   JSON once, when the least recently changed are demoted or the overlay is written;
//! - **it is written once, sorted,** as new table files ([`Store::ingest`]: no journal, no
//!   memtable), when the memory is full and at the end. After such a spill the rebuild
//!   goes on like a live worker over what it wrote: rows it does not hold are read from
//!   the store, and index entries move change by change (tombstones included).
//!
//! The checkpoints and the removal of the rebuild marker are committed last, in one batch.

use super::events::{Decoded, ReadFailure, SourceEvent, read_events};
use super::fold::{Pending, Worker};
use super::options::ViewOptions;
use super::overlay::Overlay;
use super::service::{ViewService, service};
use super::storage::{rebuild_marker_key, storage_name};
use crate::command::Topics;
use crate::error::{Error, Result};
use eventfold_core::{Aggregate, Projection, Scope};
use eventfold_log::Log;
use eventfold_store::{Batch, Store, ViewWrite, view_checkpoint_key};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What a rebuild did.
#[derive(Debug, Clone, Default)]
pub struct RebuildStats {
    /// About how many rows and index entries the view held before, replaced or deleted
    /// by the rebuild (counted from the metadata of the table files dropped whole, which
    /// also count overwritten versions and tombstones, plus the keys deleted one by one).
    pub cleared: u64,
    /// Source events applied.
    pub events: u64,
    /// Rows the view holds afterwards.
    pub rows: u64,
    /// Rows left out of a unique index because another row held the value.
    pub unique_conflicts: u64,
    /// Time the rebuild took (writing included).
    pub elapsed: Duration,
}

/// Rebuilds the view of projection `P` from its source events in `log`, from offset 0 of
/// every partition up to the end offsets taken at the start, in batches of
/// `options.rebuild_batch_events`, and replaces the view's rows, index entries and
/// checkpoints with the result (see the module docs). `progress(applied, total)` is
/// called after each batch.
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
    let (svc, projection, _) = service::<P>(&log, source.clone(), None, options);
    let total: u64 = ends.iter().sum();
    progress(0, total);
    let failed = |partition: u32, reason: String| Error::ViewFailed {
        view: P::VIEW.to_owned(),
        partition,
        reason,
    };

    let partitions = log.partitions();
    let applied = Arc::new(AtomicU64::new(0));
    let replaced = Arc::new(Mutex::new(false));
    let (folds, readers) = start_threads(&log, &svc, &projection, &ends, options, &applied, &replaced);
    while !folds.iter().all(|f| f.is_finished()) {
        progress(applied.load(Ordering::Relaxed), total);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Folded {
        write,
        rows,
        mut cleared,
        checkpoints,
    } = merge(folds, readers, &storage, partitions)
        .await
        .map_err(|(p, e)| failed(p, e))?;
    let replace = !*replaced.lock().expect("not poisoned");
    let folded_in = started.elapsed();
    cleared += ingest(&store, (write, replace)).await.map_err(|e| failed(0, e))?;
    tracing::debug!(
        view = P::VIEW,
        fold_s = folded_in.as_secs_f64(),
        write_s = (started.elapsed() - folded_in).as_secs_f64(),
        "rebuild: events folded, view written"
    );
    let applied = applied.load(Ordering::Relaxed);
    progress(applied, total);
    // Ingested data is durable: the checkpoints and the marker's removal go together.
    let mut b = Batch::new();
    for (p, next) in checkpoints.into_iter().enumerate() {
        let key = view_checkpoint_key(&storage, &source.events, p as u32);
        match next {
            Some(next) => b.put_meta(&key, next),
            None => b.delete_meta(&key),
        }
    }
    b.delete_meta(&marker);
    store.commit(b, true)?;
    let rows = match rows {
        Some(n) => n,
        None => store.count_view_rows(&storage)?,
    };
    Ok(RebuildStats {
        cleared,
        events: applied,
        rows,
        unique_conflicts: svc.unique_conflicts.iter().map(|n| n.load(Ordering::Relaxed)).sum(),
        elapsed: started.elapsed(),
    })
}

/// A rebuild thread's task: what it leaves to write, or why it stopped (with the
/// partition).
type FoldTask = JoinHandle<Result<Folded, (u32, String)>>;

/// Starts the rebuild's threads: partitions are folded by `threads` blocking threads
/// (partition p by thread p mod threads), each fed by its own reader task reading its
/// partitions up to `ends`. Returns the folding threads and the readers.
fn start_threads<P: Projection>(
    log: &Arc<dyn Log>,
    svc: &Arc<ViewService>,
    projection: &Arc<P>,
    ends: &[u64],
    options: &ViewOptions,
    applied: &Arc<AtomicU64>,
    replaced: &Arc<Mutex<bool>>,
) -> (Vec<FoldTask>, Vec<JoinHandle<()>>) {
    let store = log.store();
    let topic = &svc.source.events;
    let partitions = log.partitions();
    let threads = match P::SCOPE {
        Scope::Partitioned => options.rebuild_threads.clamp(1, partitions.max(1) as usize),
        Scope::Replicated => 1,
    };
    let mut folds = Vec::new();
    let mut readers = Vec::new();
    for t in 0..threads {
        let (tx, rx) = mpsc::channel(2);
        let mine: Vec<(u32, u64)> = (0..partitions)
            .filter(|p| *p as usize % threads == t)
            .map(|p| (p, ends[p as usize]))
            .collect();
        readers.push(tokio::spawn(read::<P>(
            log.clone(),
            topic.clone(),
            mine,
            options.rebuild_batch_events.max(1),
            tx,
        )));
        let folder = Folder {
            workers: (0..partitions)
                .map(|p| Worker {
                    projection: projection.clone(),
                    svc: svc.clone(),
                    log: log.clone(),
                    partition: p,
                    partitions,
                    next: 0,
                })
                .collect(),
            overlay: Overlay::new(store.clone(), svc.clone(), threads),
            topic: topic.clone(),
            applied: applied.clone(),
            replaced: replaced.clone(),
        };
        folds.push(tokio::task::spawn_blocking(move || folder.run(rx)));
    }
    (folds, readers)
}

/// Waits for the rebuild's threads (they have finished) and readers, and merges what the
/// threads left to write into one [`Folded`] for the view stored as `storage`.
async fn merge(
    folds: Vec<FoldTask>,
    readers: Vec<JoinHandle<()>>,
    storage: &str,
    partitions: u32,
) -> Result<Folded, (u32, String)> {
    let mut write = ViewWrite::with_capacity(storage, 0, 0);
    let (mut rows, mut cleared) = (Some(0), 0);
    let mut checkpoints = vec![None; partitions as usize];
    for fold in folds {
        let folded = fold
            .await
            .map_err(|e| (0, format!("the rebuild thread failed: {e}")))??;
        write.append(folded.write);
        rows = rows.zip(folded.rows).map(|(a, b)| a + b);
        cleared += folded.cleared;
        for (p, next) in folded.checkpoints.into_iter().enumerate() {
            checkpoints[p] = checkpoints[p].or(next);
        }
    }
    for reader in readers {
        reader.await.map_err(|e| (0, format!("the reader task failed: {e}")))?;
    }
    Ok(Folded {
        write,
        rows,
        cleared,
        checkpoints,
    })
}

/// One rebuild thread: folds the chunks of its partitions into its overlay.
struct Folder<P: Projection> {
    /// One per partition of the source (only this thread's are used).
    workers: Vec<Worker<P>>,
    overlay: Overlay,
    topic: Arc<str>,
    /// Events applied, by all threads.
    applied: Arc<AtomicU64>,
    /// Whether a spill has replaced the view's old data (the first one does); held while
    /// a thread spills, so that first spill ends before any other starts.
    replaced: Arc<Mutex<bool>>,
}

/// What a rebuild thread leaves to write.
struct Folded {
    /// Its overlay, spilled: written by the caller with every thread's.
    write: ViewWrite,
    /// Rows it holds, when it never spilled early (else the store must count them).
    rows: Option<u64>,
    /// Keys of the old view replaced by its early spills.
    cleared: u64,
    /// Next offset of each of its partitions (`None`: not its own, or empty).
    checkpoints: Vec<Option<u64>>,
}

impl<P: Projection> Folder<P> {
    fn run(mut self, mut rx: mpsc::Receiver<ReadResult<SourceEvent<P>>>) -> Result<Folded, (u32, String)> {
        let mut checkpoints = vec![None; self.workers.len()];
        let mut cleared = 0;
        while let Some(chunk) = rx.blocking_recv() {
            let Chunk {
                partition,
                events,
                next,
            } = chunk?;
            let mut pending = Pending {
                derive_plain_entries: self.overlay.whole,
                ..Default::default()
            };
            self.workers[partition as usize]
                .fold(&mut pending, &self.topic, &events, &self.overlay)
                .map_err(|e| (partition, e))?;
            self.overlay.take(pending);
            checkpoints[partition as usize] = Some(next);
            self.applied.fetch_add(events.len() as u64, Ordering::Relaxed);
            if self.overlay.bytes > self.overlay.max_bytes {
                tracing::debug!(
                    bytes = self.overlay.bytes,
                    "rebuild memory full: writing it to the store"
                );
                let mut replaced = self.replaced.lock().expect("not poisoned");
                let write = self.overlay.spill();
                cleared += self
                    .overlay
                    .store
                    .ingest_view(write, !*replaced)
                    .map_err(|e| (partition, format!("cannot write to the store: {e}")))?;
                *replaced = true;
            }
        }
        tracing::debug!(
            parsed_rows = self.overlay.hot_rows,
            parsed_row_bytes = self.overlay.sampled.1 / self.overlay.sampled.0.max(1) as usize,
            demoted = self.overlay.demoted,
            "rebuild thread: events folded"
        );
        let rows = self
            .overlay
            .whole
            .then(|| self.overlay.rows.get_mut().values().filter(|r| r.exists()).count() as u64);
        Ok(Folded {
            write: self.overlay.spill(),
            rows,
            cleared,
            checkpoints,
        })
    }
}

/// Writes a spill with [`Store::ingest_view`] on a blocking thread; returns how many
/// keys of the view were stored before, when the spill replaces them.
async fn ingest(store: &Store, (write, replace): (ViewWrite, bool)) -> Result<u64, String> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || store.ingest_view(write, replace)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(format!("cannot write to the store: {e}")),
        Err(e) => Err(format!("write task failed: {e}")),
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

/// Reads each partition of `topic` in `ends` from 0 up to its end, `max` records at a
/// time, decodes them and sends them on; an error ends the reading (sent as the last
/// item, with the partition it concerns).
async fn read<P: Projection>(
    log: Arc<dyn Log>,
    topic: Arc<str>,
    ends: Vec<(u32, u64)>,
    max: usize,
    tx: mpsc::Sender<ReadResult<SourceEvent<P>>>,
) {
    for (p, end) in ends {
        let mut next = 0;
        while next < end {
            let want = max.min((end - next).try_into().unwrap_or(usize::MAX));
            let chunk = match read_events::<P>(&*log, &topic, p, next, want, end).await {
                Ok(events) => {
                    // Records appended since the start (in Kafka, by other instances) wait
                    // for the live workers: the rebuild stops at the ends it took.
                    let Some(last) = events.last().map(|e| e.offset) else {
                        // Only offsets without records are left (Kafka's transaction markers).
                        break;
                    };
                    next = last + 1;
                    Ok(Chunk {
                        partition: p,
                        events,
                        next,
                    })
                }
                Err(ReadFailure::Read(e) | ReadFailure::Decode(e)) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.send(chunk.map_err(|e| (p, e))).await.is_err() || failed {
                return;
            }
        }
    }
}
