//! The range readers of the Kafka log: `read_committed` consumers assigned for one read.
//! A read that stops at its `max` before the end parks its reader, still assigned and
//! fetching, under the partition and the offset it stopped at. The next read of that
//! partition from there (a restore, a view's catch-up or a process manager's changelog,
//! read in chunks) goes on with it: a reader assigned anew fetched again what the previous
//! one had fetched ahead and dropped, and waited for its first fetch. Also [`Quiet`], the
//! context of eventfold's consumers.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Readers kept for reuse; more are created under concurrency and dropped past this.
const MAX_IDLE_READERS: usize = 8;

/// Parked readers kept at once: one per partition a restore or catch-up reads at a time.
const MAX_PARKED: usize = 64;

/// A parked reader not taken within this is unassigned (it keeps fetching ahead meanwhile).
const PARK_TTL: Duration = Duration::from_secs(2);

/// A reader assigned to a partition and positioned at `next`.
pub(super) struct Parked {
    pub reader: BaseConsumer<Quiet>,
    /// The end (last stable offset) the read that parked it took: still an end to read up
    /// to, the records before it being committed.
    pub end: u64,
    at: Instant,
    next: u64,
}

/// The context of eventfold's consumers: a partition's end is an expected event of every
/// read (`enable.partition.eof`), not an error worth a log line; everything else is logged.
/// It keeps librdkafka's last error-level log line (e.g. a failed SASL authentication), which
/// a call that only times out does not name.
#[derive(Debug, Default)]
pub(super) struct Quiet {
    last_error: Mutex<Option<String>>,
}

impl Quiet {
    /// librdkafka's last error-level log line of this client, if any.
    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("last error lock").clone()
    }
}

impl rdkafka::client::ClientContext for Quiet {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if matches!(level, L::Emerg | L::Alert | L::Critical | L::Error) {
            tracing::debug!(target: "librdkafka", fac, "{message}");
            *self.last_error.lock().expect("last error lock") = Some(message.to_owned());
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::error!(%error, reason, "librdkafka error");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Quiet {}

#[derive(Default)]
pub(super) struct Readers {
    idle: Mutex<Vec<BaseConsumer<Quiet>>>,
    parked: Mutex<HashMap<(String, u32), Parked>>,
}

impl Readers {
    /// The reader parked on `topic`/`partition` at exactly `from`, if any.
    pub fn take_parked(&self, topic: &str, partition: u32, from: u64) -> Option<Parked> {
        let mut parked = self.parked.lock().expect("parked readers lock");
        let key = (topic.to_owned(), partition);
        match parked.get(&key) {
            Some(p) if p.next == from && p.at.elapsed() < PARK_TTL => parked.remove(&key),
            _ => None,
        }
    }

    /// An idle reader, if any (none is assigned).
    pub fn take_idle(&self) -> Option<BaseConsumer<Quiet>> {
        self.idle.lock().expect("readers lock").pop()
    }

    /// Parks `reader`, assigned to `topic`/`partition` and positioned at `next`; a reader
    /// parked there before, and any left too long, go back to the idle ones.
    pub fn park(&self, topic: &str, partition: u32, reader: BaseConsumer<Quiet>, next: u64, end: u64) {
        let mut released = Vec::new();
        {
            let mut parked = self.parked.lock().expect("parked readers lock");
            let stale: Vec<_> = parked
                .iter()
                .filter(|(_, p)| p.at.elapsed() >= PARK_TTL)
                .map(|(k, _)| k.clone())
                .collect();
            released.extend(stale.iter().filter_map(|k| parked.remove(k)));
            let entry = Parked {
                reader,
                end,
                at: Instant::now(),
                next,
            };
            if parked.len() < MAX_PARKED {
                released.extend(parked.insert((topic.to_owned(), partition), entry));
            } else {
                released.push(entry);
            }
        }
        for p in released {
            self.release(p.reader);
        }
    }

    /// Unassigns `reader` and keeps it for reuse (dropped if that fails or enough are kept).
    pub fn release(&self, reader: BaseConsumer<Quiet>) {
        if reader.unassign().is_ok() {
            let mut idle = self.idle.lock().expect("readers lock");
            if idle.len() < MAX_IDLE_READERS {
                idle.push(reader);
            }
        }
    }
}
