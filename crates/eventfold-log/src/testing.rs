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

/// Wraps a log so that `end_offset` (the first call of every partition's restore) waits
/// for [`Gate::open`]: lets tests observe a partition while it restores. Everything else
/// goes straight to the inner log.
pub struct GatedLog {
    inner: Arc<dyn Log>,
    gate: Arc<Semaphore>,
}

/// Opens a [`GatedLog`].
#[derive(Clone)]
pub struct Gate(Arc<Semaphore>);

impl Gate {
    /// Lets every waiting and later `end_offset` call through.
    pub fn open(&self) {
        self.0.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl GatedLog {
    /// A closed gate in front of `inner`.
    pub fn new(inner: Arc<dyn Log>) -> (Self, Gate) {
        let gate = Arc::new(Semaphore::new(0));
        (
            Self {
                inner,
                gate: gate.clone(),
            },
            Gate(gate),
        )
    }
}

#[async_trait]
impl Log for GatedLog {
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
        self.inner.commit(unit)
    }
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        self.inner.read(topic, partition, from, max).await
    }
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        let _permit = self.gate.acquire().await.expect("the gate is never closed");
        self.inner.end_offset(topic, partition).await
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    fn units_in_flight(&self) -> usize {
        self.inner.units_in_flight()
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

/// Wraps a log so that every `read` first sleeps `delay`: a consumer that reads in small
/// batches (a view catching up with a small `max_batch_events`) then takes long enough to
/// be observed mid-way. Everything else goes straight to the inner log.
pub struct SlowReads {
    inner: Arc<dyn Log>,
    delay: std::time::Duration,
}

impl SlowReads {
    /// Reads of `inner` delayed by `delay` each.
    pub fn new(inner: Arc<dyn Log>, delay: std::time::Duration) -> Self {
        Self { inner, delay }
    }
}

#[async_trait]
impl Log for SlowReads {
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
        self.inner.commit(unit)
    }
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<(u64, Record)>> {
        tokio::time::sleep(self.delay).await;
        self.inner.read(topic, partition, from, max).await
    }
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.inner.end_offset(topic, partition).await
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    fn units_in_flight(&self) -> usize {
        self.inner.units_in_flight()
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
