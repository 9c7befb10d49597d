//! The replay of a partition's changelogs into the local store (Kafka mode, where the
//! store is a cache of the topics): the events partition (per-entity index and record
//! cache) and the state partition (states and outcomes), from where the store stopped to
//! the end taken now. Part of the restore barrier: the partition takes no command before
//! it is done.

use super::shared::PartitionShared;
use crate::changelog;
use crate::command::Topics;
use crate::error::{Error, Result};
use eventfold_core::{Aggregate, Record};
use eventfold_log::{CommitUnit, Log};
use eventfold_store::Batch;
use std::sync::Arc;
use std::time::Instant;

/// Bytes of store writes a bulk restore gathers before it writes them.
const INGEST_BYTES: usize = 64 << 20;

/// What a replay reads, writes and reports to.
pub(crate) struct Replay<'a> {
    pub log: &'a Arc<dyn Log>,
    pub topics: &'a Topics,
    pub partition: u32,
    /// A changelog span at least this long is restored by bulk ingestion.
    pub bulk_min_records: u64,
    /// Held by a bulk write to the store until it lands (see `Processor::ingesting`).
    pub ingesting: &'a Arc<tokio::sync::Mutex<()>>,
    /// Told the progress: from 0 to 0.5 in `/readyz`.
    pub shared: &'a PartitionShared,
}

/// A topic partition's records to replay: offsets `from..end`.
struct Span {
    topic: Arc<str>,
    from: u64,
    end: u64,
    /// The events topic (else the state topic).
    events: bool,
}

/// How far a replay got, over every span.
struct Done {
    offsets: u64,
    total: u64,
    records: usize,
}

impl Replay<'_> {
    /// Brings the local store up to the log.
    ///
    /// A long span (`bulk_min_records`: a new instance, or one long away) is written by
    /// bulk ingestion, in parts of [`INGEST_BYTES`]: new table files instead of the
    /// journal and memtables, several times cheaper. Each part lands in two steps, the
    /// records that say how far the store got (the events cache; the state topic's end)
    /// after the rest, so a crash in between replays that part again (every write is a
    /// put of the same value).
    pub async fn run<A: Aggregate>(&self) -> Result<()> {
        let p = self.partition;
        // A bulk write of an earlier, dropped restore lands before the store is read.
        drop(self.ingesting.lock().await);
        // Touching the results topic provisions it, so that clients can subscribe to their
        // outcomes before the first command is committed.
        self.log.end_offset(&self.topics.results, p).await?;
        let spans = self.spans().await?;
        let total = spans.iter().map(|s| s.end.saturating_sub(s.from)).sum::<u64>().max(1);
        let mut done = Done {
            offsets: 0,
            total,
            records: 0,
        };
        let started = Instant::now();
        for span in spans {
            self.span::<A>(span, &mut done).await?;
        }
        if done.records > 0 {
            tracing::info!(
                aggregate = A::TYPE,
                partition = p,
                records = done.records,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "local store restored from the changelog"
            );
        }
        Ok(())
    }

    /// The events span, then the state span. The state topic's end is taken first: a
    /// transaction committed in between then has its events inside the events' span too,
    /// so every outcome record restored refers to events that are restored before it.
    async fn spans(&self) -> Result<Vec<Span>> {
        let p = self.partition;
        let mut spans = Vec::with_capacity(2);
        for (topic, events) in [(&self.topics.state, false), (&self.topics.events, true)] {
            let from = self.log.store().log_end(topic, p)?;
            let end = self.log.end_offset(topic, p).await?;
            spans.insert(
                0,
                Span {
                    topic: topic.clone(),
                    from,
                    end,
                    events,
                },
            );
        }
        Ok(spans)
    }

    /// Replays one span, in parts.
    async fn span<A: Aggregate>(&self, span: Span, done: &mut Done) -> Result<()> {
        let (
            p,
            Span {
                topic,
                mut from,
                end,
                events,
            },
        ) = (self.partition, span);
        let bulk = end.saturating_sub(from) >= self.bulk_min_records;
        // Store writes of the records read so far, and the marks of how far they go.
        let (mut data, mut marks) = (Batch::new(), Batch::new());
        while from < end {
            let records = self.log.read(&topic, p, from, 10_000).await?;
            let Some(last) = records.last().map(|(o, _)| *o) else {
                break;
            };
            apply_changelog::<A>(&mut data, &mut marks, &topic, p, events, &records)?;
            done.offsets += last + 1 - from;
            done.records += records.len();
            from = last + 1;
            if !bulk || data.bytes() + marks.bytes() >= INGEST_BYTES || from >= end {
                if !events {
                    marks.put_log_end(&topic, p, from);
                }
                let (data, marks) = (std::mem::take(&mut data), std::mem::take(&mut marks));
                self.write(data, marks, bulk).await?;
            }
            self.shared.set_progress(0.5 * done.offsets as f64 / done.total as f64);
        }
        if !data.is_empty() || !marks.is_empty() {
            // Only offsets without records were left (Kafka's transaction markers).
            if !events {
                marks.put_log_end(&topic, p, from);
            }
            self.write(data, marks, true).await?;
        }
        Ok(())
    }

    /// Writes a part: by bulk ingestion (`bulk`), else as a unit of the partition's lane.
    async fn write(&self, data: Batch, marks: Batch, bulk: bool) -> Result<()> {
        if bulk {
            return ingest_restored(self.ingesting.clone(), self.log.store().clone(), data, marks).await;
        }
        let mut local = data;
        local.append(marks);
        self.log
            .commit(CommitUnit {
                local,
                lane: Some(self.partition),
                ..Default::default()
            })
            .await?;
        Ok(())
    }
}

/// Writes `data`, then `marks`, by ingestion on a blocking thread, holding `lock` until
/// both landed (even if the restore that asked is dropped meanwhile).
async fn ingest_restored(
    lock: Arc<tokio::sync::Mutex<()>>,
    store: eventfold_store::Store,
    data: Batch,
    marks: Batch,
) -> Result<()> {
    let guard = lock.lock_owned().await;
    let written = tokio::task::spawn_blocking(move || {
        let _guard = guard;
        store.ingest(data)?;
        store.ingest(marks)
    })
    .await;
    match written {
        Ok(r) => Ok(r?),
        Err(e) => Err(Error::Unavailable(format!("the restore's write task failed: {e}"))),
    }
}

/// Adds the store writes of changelog `records` of `topic`/`partition` to `data`: an
/// events record is kept (per-entity reads) and marked in `marks`; a state record only
/// changes the local tables (the copy's end is recorded by the caller).
fn apply_changelog<A: Aggregate>(
    data: &mut Batch,
    marks: &mut Batch,
    topic: &str,
    partition: u32,
    events: bool,
    records: &[(u64, Record)],
) -> Result<()> {
    for (offset, r) in records {
        let applied = if events {
            marks.put_log(topic, partition, *offset, r);
            changelog::apply_event_record(data, topic, partition, *offset, r)
        } else {
            changelog::apply_state_record(data, A::TYPE, partition, r)
        };
        applied.map_err(|reason| Error::Corrupt {
            table: "log",
            key: format!("{topic}/{partition}@{offset}"),
            reason,
        })?;
    }
    Ok(())
}
