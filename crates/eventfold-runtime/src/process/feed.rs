//! Kafka mode: a process manager's source events, pushed by followers
//! ([`Coordinated::follow`](eventfold_log::Coordinated::follow)) instead of read partition
//! by partition: a read of a partition this instance does not own asks the broker each
//! time (its end, then a fetch), which for every source partition at every poll was too
//! slow and too many requests.

use eventfold_core::Record;
use eventfold_log::Log;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};

/// Records of the sources, in offset order per partition: (source index, offset, record).
pub(crate) struct Feed {
    rx: mpsc::Receiver<(usize, Vec<(u64, Record)>)>,
    pending: VecDeque<(usize, u64, Record)>,
}

impl Feed {
    /// Follows every `(topic, partition, next offset)` of `sources` (their indexes are
    /// the source indexes of the records), waking `news` as records arrive.
    pub(crate) async fn start(
        log: &Arc<dyn Log>,
        sources: &[(Arc<str>, u32, u64)],
        news: &Arc<Notify>,
    ) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel(64);
        let mut topics: Vec<Arc<str>> = Vec::new();
        for (topic, _, _) in sources {
            if !topics.contains(topic) {
                topics.push(topic.clone());
            }
        }
        for topic in topics {
            let index: HashMap<u32, usize> = sources
                .iter()
                .enumerate()
                .filter(|(_, (t, _, _))| *t == topic)
                .map(|(i, (_, p, _))| (*p, i))
                .collect();
            let starts: Vec<(u32, u64)> = sources
                .iter()
                .filter(|(t, _, _)| *t == topic)
                .map(|(_, p, next)| (*p, *next))
                .collect();
            let (l, t) = (log.clone(), topic.clone());
            let mut follower = tokio::task::spawn_blocking(move || l.require_coordination()?.follow(&t, &starts))
                .await
                .map_err(|e| format!("the follow task failed: {e}"))?
                .map_err(|e| format!("cannot follow {topic}: {e}"))?;
            let (tx, news) = (tx.clone(), Arc::downgrade(news));
            tokio::spawn(async move {
                while let Some(batch) = follower.next().await {
                    match batch {
                        Ok((p, records)) => {
                            let Some(i) = index.get(&p).copied() else { continue };
                            if tx.send((i, records)).await.is_err() {
                                return; // the worker stopped
                            }
                            match news.upgrade() {
                                Some(n) => n.notify_one(),
                                None => return,
                            }
                        }
                        Err(e) => tracing::warn!(%topic, error = %e, "following a process manager's source"),
                    }
                }
            });
        }
        Ok(Self {
            rx,
            pending: VecDeque::new(),
        })
    }

    /// Up to `max` records that arrived, oldest first.
    pub(crate) fn take(&mut self, max: usize) -> Vec<(usize, u64, Record)> {
        while self.pending.len() < max {
            match self.rx.try_recv() {
                Ok((i, records)) => self.pending.extend(records.into_iter().map(|(o, r)| (i, o, r))),
                Err(_) => break,
            }
        }
        let n = self.pending.len().min(max);
        self.pending.drain(..n).collect()
    }
}
