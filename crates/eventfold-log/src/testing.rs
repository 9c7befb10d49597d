//! Test doubles around a real log, for eventfold's own tests and users' tests.

use crate::{CommitFuture, CommitUnit, Coordinated, Log, Result, Stats};
use async_trait::async_trait;
use eventfold_core::Record;
use eventfold_store::Store;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The Kafka broker of the tests: `EVENTFOLD_KAFKA_BOOTSTRAP` (default `127.0.0.1:9092`).
/// Fails the calling test with the way out when no broker answers: Kafka tests never skip.
pub fn require_kafka_broker() -> String {
    use std::net::{TcpStream, ToSocketAddrs};
    let bootstrap = std::env::var("EVENTFOLD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let first = bootstrap.split(',').next().unwrap_or_default().trim().to_owned();
    let reachable = first
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(3)).is_ok());
    assert!(
        reachable,
        "no Kafka broker at {bootstrap} (EVENTFOLD_KAFKA_BOOTSTRAP): start one with `scripts/kafka/broker.sh start` \
         (Kafka tests never skip)"
    );
    bootstrap
}

/// Changes to a commit: given the inner log and a unit, starts the commit (or not yet) and
/// returns its future (see [`Intercept::on_commit`]).
pub type CommitHook = Box<dyn Fn(&dyn Log, CommitUnit) -> CommitFuture + Send + Sync>;

/// A log that goes to an inner log for everything except what a test changes: the one
/// forwarding wrapper, so that no test forwards every [`Log`] method by hand. The Kafka
/// capabilities ([`Log::coordination`]) are the inner log's. Built with [`Intercept::new`]
/// and the methods that change one call:
/// [`gate_end_offsets`](Intercept::gate_end_offsets) (observe a partition while it
/// restores), [`slow_reads`](Intercept::slow_reads) (observe a consumer mid-way),
/// [`on_commit`](Intercept::on_commit) (hold or count commits) and
/// [`units_in_flight`](Intercept::units_in_flight). `read_with` and `write_local` are the
/// trait's defaults, as in the tests' earlier wrappers: through this log's `read` (slow
/// reads slow them too) and a plain store write.
pub struct Intercept {
    inner: Arc<dyn Log>,
    gate: Option<Arc<Semaphore>>,
    read_delay: Option<std::time::Duration>,
    commit: Option<CommitHook>,
    units_in_flight: Option<usize>,
}

/// Opens the gate of [`Intercept::gate_end_offsets`].
#[derive(Clone)]
pub struct Gate(Arc<Semaphore>);

impl Gate {
    /// Lets every waiting and later `end_offset` call through.
    pub fn open(&self) {
        self.0.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl Intercept {
    /// `inner`, unchanged so far.
    pub fn new(inner: Arc<dyn Log>) -> Self {
        Self {
            inner,
            gate: None,
            read_delay: None,
            commit: None,
            units_in_flight: None,
        }
    }

    /// `end_offset` (the first call of every partition's restore) waits for
    /// [`Gate::open`]: lets tests observe a partition while it restores. The gate starts
    /// closed.
    pub fn gate_end_offsets(mut self) -> (Self, Gate) {
        let gate = Arc::new(Semaphore::new(0));
        self.gate = Some(gate.clone());
        (self, Gate(gate))
    }

    /// Every `read` first sleeps `delay`: a consumer that reads in small batches (a view
    /// catching up with a small `max_batch_events`) then takes long enough to be observed
    /// mid-way.
    pub fn slow_reads(mut self, delay: std::time::Duration) -> Self {
        self.read_delay = Some(delay);
        self
    }

    /// Every `commit` goes through `hook`, which starts it on the inner log it is given
    /// (e.g. holding back its answer until the test releases it).
    pub fn on_commit(mut self, hook: impl Fn(&dyn Log, CommitUnit) -> CommitFuture + Send + Sync + 'static) -> Self {
        self.commit = Some(Box::new(hook));
        self
    }

    /// Says `units` for [`Log::units_in_flight`] instead of the inner log's count.
    pub fn units_in_flight(mut self, units: usize) -> Self {
        self.units_in_flight = Some(units);
        self
    }
}

#[async_trait]
impl Log for Intercept {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn partitions(&self) -> u32 {
        self.inner.partitions()
    }
    fn store(&self) -> &Store {
        self.inner.store()
    }
    fn commit(&self, unit: CommitUnit) -> CommitFuture {
        match &self.commit {
            Some(hook) => hook(&*self.inner, unit),
            None => self.inner.commit(unit),
        }
    }
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        if let Some(delay) = self.read_delay {
            tokio::time::sleep(delay).await;
        }
        self.inner.read(topic, partition, from, max).await
    }
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        let _permit = match &self.gate {
            Some(gate) => Some(gate.acquire().await.expect("the gate is never closed")),
            None => None,
        };
        self.inner.end_offset(topic, partition).await
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    fn units_in_flight(&self) -> usize {
        self.units_in_flight.unwrap_or_else(|| self.inner.units_in_flight())
    }
    async fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.inner.committed_offset(group, topic, partition).await
    }
    async fn send(&self, append: crate::Append) -> Result<u64> {
        self.inner.send(append).await
    }
    fn coordination(&self) -> Option<&dyn Coordinated> {
        self.inner.coordination()
    }
}
