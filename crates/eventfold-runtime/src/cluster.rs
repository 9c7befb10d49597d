//! The instance registry of multi-instance Kafka mode (DESIGN §6 "Routing").
//!
//! Every instance publishes an [`InstanceInfo`] (its id, HTTP address, the partitions it
//! owns per aggregate type, a generation and timestamps) to the compacted topic
//! `<app>._instances`, keyed by instance id, and follows the whole topic to learn about
//! the others. A record with an empty value is a tombstone: that instance left.
//!
//! [`Registry::owner`] answers who serves an (aggregate type, partition): among the
//! *live* claimants (heartbeat seen within three heartbeat intervals, or this instance
//! itself), the one that took the partition last ([`resolve_owner`]). A claim whose
//! instance stopped heartbeating loses to a live one, so a crashed instance does not keep
//! its partitions in the routing table.
//!
//! Publishing and following run on tokio tasks; the methods that read the view
//! (`owner`, `instances`) only take a short lock.

use crate::clock::{Clock, SystemClock};
use eventfold_core::Record;
use eventfold_core::envelope::headers;
use eventfold_core::partition::partition_for;
use eventfold_log::{Append, Follower, Log};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

/// The `ef-type` header value of registry records.
pub const INSTANCE_TYPE: &str = "Instance";

/// A claim is live while its last heartbeat is at most this many heartbeat intervals old.
pub const LIVENESS_HEARTBEATS: u32 = 3;

/// How long [`Registry::leave`] waits for its tombstone to be written.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the follower task waits before following the topic again after it stopped.
const REFOLLOW_DELAY: Duration = Duration::from_secs(1);

/// The name of the registry topic of app `app_id`: `<app>._instances`.
pub fn instances_topic(app_id: &str) -> String {
    format!("{app_id}._instances")
}

/// What one instance publishes about itself (the JSON value of its registry record).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InstanceInfo {
    /// The instance id (also the record key).
    pub instance_id: String,
    /// Base URL of its HTTP API, e.g. `http://127.0.0.1:8081`.
    pub http: String,
    /// Aggregate type -> the partitions this instance owns.
    pub partitions: BTreeMap<String, Vec<u32>>,
    /// Bumped by the instance on every change of its partitions.
    pub generation: u64,
    /// Wall clock (ms since the Unix epoch) when the current ownership was taken.
    pub assigned_ms: i64,
    /// Wall clock (ms since the Unix epoch) of the last heartbeat.
    pub updated_ms: i64,
}

impl InstanceInfo {
    /// Whether this instance claims `partition` of `aggregate`.
    pub fn claims(&self, aggregate: &str, partition: u32) -> bool {
        self.partitions.get(aggregate).is_some_and(|ps| ps.contains(&partition))
    }

    /// Whether the last heartbeat is at most `stale_after_ms` old at `now_ms`.
    pub fn is_fresh(&self, now_ms: i64, stale_after_ms: i64) -> bool {
        now_ms.saturating_sub(self.updated_ms) <= stale_after_ms
    }
}

/// The owner of (`aggregate`, `partition`) among `instances` (keyed by instance id): of the
/// live claimants, the one with the newest `assigned_ms`; ties go to the highest
/// `generation`, then to the greatest instance id. An instance is live when its
/// `updated_ms` is at most `stale_after_ms` before `now_ms`, and `self_id` (this instance,
/// which knows it is alive) always is. `None` when no live instance claims the partition.
pub fn resolve_owner<'a>(
    instances: &'a BTreeMap<String, InstanceInfo>,
    self_id: Option<&str>,
    now_ms: i64,
    stale_after_ms: i64,
    aggregate: &str,
    partition: u32,
) -> Option<&'a InstanceInfo> {
    instances
        .values()
        .filter(|i| Some(i.instance_id.as_str()) == self_id || i.is_fresh(now_ms, stale_after_ms))
        .filter(|i| i.claims(aggregate, partition))
        .max_by(|a, b| {
            (a.assigned_ms, a.generation, &a.instance_id).cmp(&(b.assigned_ms, b.generation, &b.instance_id))
        })
}

/// What the publisher task is asked to do.
enum Command {
    /// Publish this instance's current record now.
    Publish,
    /// Publish the tombstone, answer, and stop.
    Leave(oneshot::Sender<()>),
}

/// State shared by the registry and its tasks.
struct Inner {
    log: Arc<dyn Log>,
    topic: Arc<str>,
    /// The partition of `<app>._instances` this instance's record goes to.
    partition: u32,
    instance_id: String,
    heartbeat: Duration,
    /// This instance's record (its `updated_ms` is refreshed on every publish).
    own: Mutex<InstanceInfo>,
    /// The other instances, as last read from the topic.
    others: Mutex<BTreeMap<String, InstanceInfo>>,
    /// Set by `leave`: no more records of this instance, and it no longer claims anything.
    left: AtomicBool,
    /// Woken whenever the view changes.
    changed: Notify,
}

impl Inner {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms()
    }

    fn stale_after_ms(&self) -> i64 {
        i64::try_from(self.heartbeat.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_mul(i64::from(LIVENESS_HEARTBEATS))
    }

    /// Every known instance by id, this one included unless it left.
    fn snapshot(&self) -> BTreeMap<String, InstanceInfo> {
        let mut all = self.others.lock().expect("registry lock").clone();
        if !self.left.load(Ordering::SeqCst) {
            let own = self.own.lock().expect("registry lock").clone();
            all.insert(own.instance_id.clone(), own);
        }
        all
    }

    fn record(&self, value: Vec<u8>, now_ms: i64) -> Append {
        Append {
            topic: self.topic.clone(),
            partition: self.partition,
            record: Record {
                key: self.instance_id.clone().into_bytes(),
                value,
                headers: vec![
                    (headers::TYPE.into(), INSTANCE_TYPE.as_bytes().to_vec()),
                    (headers::CONTENT_TYPE.into(), b"application/json".to_vec()),
                ],
                timestamp_ms: now_ms,
            },
            entity: None,
        }
    }

    /// Publishes this instance's record with a fresh `updated_ms`.
    async fn publish(&self) {
        let now = self.now_ms();
        let value = {
            let mut own = self.own.lock().expect("registry lock");
            own.updated_ms = own.updated_ms.max(now);
            serde_json::to_vec(&*own).expect("an InstanceInfo serializes")
        };
        self.changed.notify_waiters();
        if let Err(e) = self.log.send(self.record(value, now)).await {
            tracing::warn!(
                instance = %self.instance_id,
                topic = %self.topic,
                reason = %e,
                "cannot publish this instance to the registry; retrying at the next heartbeat"
            );
        }
    }

    /// Applies one record of the registry topic to the view.
    fn apply(&self, offset: u64, partition: u32, record: &Record) {
        let Ok(id) = std::str::from_utf8(&record.key) else {
            tracing::warn!(topic = %self.topic, partition, offset, "skipping a registry record whose key is not UTF-8");
            return;
        };
        if id == self.instance_id {
            // This instance knows its own record better than the topic does (the topic may
            // hold an older one, or a previous incarnation's).
            return;
        }
        if record.value.is_empty() {
            if self.others.lock().expect("registry lock").remove(id).is_some() {
                tracing::info!(instance = %id, "an instance left the cluster");
                self.changed.notify_waiters();
            }
            return;
        }
        match serde_json::from_slice::<InstanceInfo>(&record.value) {
            Ok(info) if info.instance_id != id => tracing::warn!(
                topic = %self.topic, partition, offset, key = %id, instance = %info.instance_id,
                "skipping a registry record whose key is not its instance id"
            ),
            Ok(info) => {
                let mut others = self.others.lock().expect("registry lock");
                let previous = others.insert(id.to_owned(), info);
                drop(others);
                if previous.is_none() {
                    tracing::info!(instance = %id, "an instance joined the cluster");
                }
                self.changed.notify_waiters();
            }
            Err(e) => tracing::warn!(
                topic = %self.topic, partition, offset, key = %id, reason = %e,
                "skipping a registry record that does not decode as an instance"
            ),
        }
    }
}

/// The view of the cluster's instances, and this instance's entry in it (see the
/// [module docs](self)). Dropping it stops its tasks without a tombstone (the others see
/// the instance go stale); call [`Registry::leave`] for a clean exit.
pub struct Registry {
    inner: Arc<Inner>,
    commands: mpsc::Sender<Command>,
    follower: JoinHandle<()>,
    publisher: JoinHandle<()>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("instance_id", &self.inner.instance_id)
            .field("topic", &self.inner.topic)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Starts following `<app>._instances` (all partitions, from offset 0; key = instance
    /// id, JSON value; an empty value is a tombstone = the instance left) and publishing
    /// this instance's record: at once, on every [`set_owned`](Self::set_owned), and every
    /// `heartbeat`.
    ///
    /// Must be called within a tokio runtime. The first call for an app creates the topic
    /// (a blocking admin round trip, once at startup). Fails when the log cannot follow a
    /// topic (the embedded log: a single instance needs no registry), the topic cannot be
    /// created, or an argument is empty.
    pub fn start(
        log: Arc<dyn Log>,
        app_id: &str,
        instance_id: &str,
        http: &str,
        heartbeat: Duration,
    ) -> Result<Arc<Registry>, eventfold_log::Error> {
        use eventfold_log::Error;
        if app_id.is_empty() || instance_id.is_empty() {
            return Err(Error::Config(
                "the instance registry needs a non-empty app id and instance id".into(),
            ));
        }
        if heartbeat.is_zero() {
            return Err(Error::Config("the registry heartbeat interval must be positive".into()));
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Config("the instance registry must be started within a tokio runtime".into()))?;
        let topic: Arc<str> = Arc::from(instances_topic(app_id));
        let partitions = log.partitions();
        let starts: Vec<(u32, u64)> = (0..partitions).map(|p| (p, 0)).collect();
        let follower = log.require_coordination()?.follow(&topic, &starts)?;
        let now = SystemClock.now_ms();
        let inner = Arc::new(Inner {
            partition: partition_for(instance_id.as_bytes(), partitions),
            topic,
            instance_id: instance_id.to_owned(),
            heartbeat,
            own: Mutex::new(InstanceInfo {
                instance_id: instance_id.to_owned(),
                http: http.to_owned(),
                partitions: BTreeMap::new(),
                generation: 0,
                assigned_ms: now,
                updated_ms: now,
            }),
            others: Mutex::new(BTreeMap::new()),
            left: AtomicBool::new(false),
            changed: Notify::new(),
            log,
        });
        let (commands, rx) = mpsc::channel(4);
        let follower = runtime.spawn(follow_loop(inner.clone(), follower, starts));
        let publisher = runtime.spawn(publish_loop(inner.clone(), rx));
        tracing::info!(
            instance = %inner.instance_id, topic = %inner.topic, partition = inner.partition, %http,
            "joined the instance registry"
        );
        Ok(Arc::new(Registry {
            inner,
            commands,
            follower,
            publisher,
        }))
    }

    /// Replaces the partitions this instance owns, bumps its generation, stamps
    /// `assigned_ms` with now, and publishes the record promptly (in the background).
    pub fn set_owned(&self, partitions: BTreeMap<String, Vec<u32>>) {
        let now = self.inner.now_ms();
        {
            let mut own = self.inner.own.lock().expect("registry lock");
            own.partitions = partitions
                .into_iter()
                .map(|(aggregate, mut ps)| {
                    ps.sort_unstable();
                    ps.dedup();
                    (aggregate, ps)
                })
                .collect();
            own.generation += 1;
            own.assigned_ms = own.assigned_ms.max(now);
            own.updated_ms = own.updated_ms.max(now);
        }
        self.inner.changed.notify_waiters();
        // A full queue already holds a Publish, which sends the record as it is then.
        let _ = self.commands.try_send(Command::Publish);
    }

    /// The instance that owns (`aggregate`, `partition`): among *live* claimants (updated
    /// within three heartbeats, or this instance itself), the one with the newest
    /// `assigned_ms` (ties: highest generation, then the greatest instance id; see
    /// [`resolve_owner`]). `None` if nobody live claims it.
    pub fn owner(&self, aggregate: &str, partition: u32) -> Option<InstanceInfo> {
        let all = self.inner.snapshot();
        resolve_owner(
            &all,
            self.live_self(),
            self.inner.now_ms(),
            self.inner.stale_after_ms(),
            aggregate,
            partition,
        )
        .cloned()
    }

    /// Every known instance (this one included, unless it left) with whether it is alive,
    /// sorted by instance id.
    pub fn instances(&self) -> Vec<(InstanceInfo, bool)> {
        let now = self.inner.now_ms();
        let stale = self.inner.stale_after_ms();
        let me = self.live_self();
        self.inner
            .snapshot()
            .into_values()
            .map(|i| {
                let alive = Some(i.instance_id.as_str()) == me || i.is_fresh(now, stale);
                (i, alive)
            })
            .collect()
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The registry topic, `<app>._instances`.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Leaves the cluster: stops the heartbeats, then publishes the tombstone (waiting at
    /// most a few seconds for it). From then on this instance claims nothing. Idempotent.
    pub async fn leave(&self) {
        if self.inner.left.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.changed.notify_waiters();
        let (tx, rx) = oneshot::channel();
        let sent = tokio::time::timeout(LEAVE_TIMEOUT, async {
            self.commands.send(Command::Leave(tx)).await.is_ok() && rx.await.is_ok()
        })
        .await;
        if !matches!(sent, Ok(true)) {
            tracing::warn!(
                instance = %self.inner.instance_id,
                "the registry tombstone was not confirmed within {LEAVE_TIMEOUT:?}; the others will see this instance go stale"
            );
        }
        // No heartbeat may follow the tombstone, whatever happened to it.
        self.publisher.abort();
    }

    /// Waits until `pred` holds (checked on every change of the view, and every 50 ms for
    /// claims going stale), at most `timeout`. Returns whether it held.
    pub async fn wait_for(&self, pred: impl Fn(&Registry) -> bool, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.inner.changed.notified();
            if pred(self) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            let _ = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(50)),
                changed,
            )
            .await;
        }
    }

    fn live_self(&self) -> Option<&str> {
        (!self.inner.left.load(Ordering::SeqCst)).then_some(self.inner.instance_id.as_str())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.follower.abort();
        self.publisher.abort();
    }
}

/// Publishes this instance's record at once, on request and every heartbeat; on `Leave`,
/// publishes the tombstone and stops.
async fn publish_loop(inner: Arc<Inner>, mut commands: mpsc::Receiver<Command>) {
    let mut ticks = tokio::time::interval(inner.heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let command = tokio::select! {
            c = commands.recv() => c,
            _ = ticks.tick() => Some(Command::Publish),
        };
        match command {
            Some(Command::Publish) => {
                if !inner.left.load(Ordering::SeqCst) {
                    inner.publish().await;
                }
            }
            Some(Command::Leave(done)) => {
                let now = inner.now_ms();
                match inner.log.send(inner.record(Vec::new(), now)).await {
                    Ok(_) => tracing::info!(instance = %inner.instance_id, "left the instance registry"),
                    Err(e) => tracing::warn!(
                        instance = %inner.instance_id, reason = %e,
                        "cannot publish the registry tombstone; the others will see this instance go stale"
                    ),
                }
                let _ = done.send(());
                return;
            }
            None => return,
        }
    }
}

/// Applies the registry topic's records to the view; follows again (from the next offsets)
/// if the follower stops.
async fn follow_loop(inner: Arc<Inner>, mut follower: Follower, starts: Vec<(u32, u64)>) {
    let mut next: BTreeMap<u32, u64> = starts.into_iter().collect();
    loop {
        while let Some(batch) = follower.next().await {
            match batch {
                Ok((partition, records)) => {
                    for (offset, record) in &records {
                        inner.apply(*offset, partition, record);
                        next.insert(partition, offset + 1);
                    }
                }
                Err(e) => {
                    tracing::warn!(topic = %inner.topic, reason = %e, "reading the instance registry failed; retrying")
                }
            }
        }
        tracing::warn!(topic = %inner.topic, "the instance registry follower stopped; following again");
        loop {
            tokio::time::sleep(REFOLLOW_DELAY).await;
            let (log, topic) = (inner.log.clone(), inner.topic.clone());
            let starts: Vec<(u32, u64)> = next.iter().map(|(p, o)| (*p, *o)).collect();
            match tokio::task::spawn_blocking(move || log.require_coordination()?.follow(&topic, &starts)).await {
                Ok(Ok(f)) => {
                    follower = f;
                    break;
                }
                Ok(Err(e)) => {
                    tracing::warn!(topic = %inner.topic, reason = %e, "cannot follow the instance registry; retrying")
                }
                Err(e) => {
                    tracing::warn!(topic = %inner.topic, reason = %e, "following the instance registry panicked; retrying")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, claims: &[(&str, &[u32])], generation: u64, assigned_ms: i64, updated_ms: i64) -> InstanceInfo {
        InstanceInfo {
            instance_id: id.to_owned(),
            http: format!("http://{id}"),
            partitions: claims.iter().map(|(a, ps)| ((*a).to_owned(), ps.to_vec())).collect(),
            generation,
            assigned_ms,
            updated_ms,
        }
    }

    fn map(infos: Vec<InstanceInfo>) -> BTreeMap<String, InstanceInfo> {
        infos.into_iter().map(|i| (i.instance_id.clone(), i)).collect()
    }

    fn owner_of(m: &BTreeMap<String, InstanceInfo>, me: Option<&str>, now: i64, agg: &str, p: u32) -> Option<String> {
        resolve_owner(m, me, now, 300, agg, p).map(|i| i.instance_id.clone())
    }

    #[test]
    fn the_only_live_claimant_owns_and_unclaimed_partitions_have_no_owner() {
        let m = map(vec![
            info("a", &[("order", &[0, 1])], 1, 100, 1000),
            info("b", &[("order", &[2]), ("payment", &[0])], 1, 100, 1000),
        ]);
        assert_eq!(owner_of(&m, None, 1000, "order", 0).as_deref(), Some("a"));
        assert_eq!(owner_of(&m, None, 1000, "order", 2).as_deref(), Some("b"));
        assert_eq!(owner_of(&m, None, 1000, "payment", 0).as_deref(), Some("b"));
        assert_eq!(owner_of(&m, None, 1000, "order", 3), None);
        assert_eq!(owner_of(&m, None, 1000, "customer", 0), None);
    }

    #[test]
    fn the_newest_assignment_wins_then_the_generation_then_the_id() {
        let m = map(vec![
            info("a", &[("order", &[0, 1, 2])], 9, 100, 1000),
            info("b", &[("order", &[0])], 1, 200, 1000),
        ]);
        assert_eq!(
            owner_of(&m, None, 1000, "order", 0).as_deref(),
            Some("b"),
            "newest assigned_ms"
        );
        assert_eq!(owner_of(&m, None, 1000, "order", 1).as_deref(), Some("a"));

        let m = map(vec![
            info("a", &[("order", &[0])], 3, 100, 1000),
            info("b", &[("order", &[0])], 2, 100, 1000),
        ]);
        assert_eq!(
            owner_of(&m, None, 1000, "order", 0).as_deref(),
            Some("a"),
            "highest generation"
        );

        let m = map(vec![
            info("a", &[("order", &[0])], 2, 100, 1000),
            info("b", &[("order", &[0])], 2, 100, 1000),
        ]);
        assert_eq!(
            owner_of(&m, None, 1000, "order", 0).as_deref(),
            Some("b"),
            "greatest id"
        );
    }

    #[test]
    fn a_stale_claim_loses_to_a_live_one_and_alone_gives_no_owner() {
        // `a` took the partition last but stopped heartbeating 301 ms ago (stale after 300).
        let m = map(vec![
            info("a", &[("order", &[0, 1])], 5, 500, 699),
            info("b", &[("order", &[0])], 1, 100, 1000),
        ]);
        assert_eq!(owner_of(&m, None, 1000, "order", 0).as_deref(), Some("b"));
        assert_eq!(owner_of(&m, None, 1000, "order", 1), None, "nobody live claims it");
        // Exactly at the bound it is still live.
        assert_eq!(owner_of(&m, None, 999, "order", 0).as_deref(), Some("a"));
    }

    #[test]
    fn this_instance_is_always_live() {
        let m = map(vec![
            info("me", &[("order", &[0])], 1, 500, 0),
            info("b", &[("order", &[0])], 1, 100, 1000),
        ]);
        assert_eq!(owner_of(&m, Some("me"), 1000, "order", 0).as_deref(), Some("me"));
        assert_eq!(owner_of(&m, None, 1000, "order", 0).as_deref(), Some("b"));
        assert_eq!(owner_of(&m, Some("b"), 1000, "order", 0).as_deref(), Some("b"));
    }

    #[test]
    fn instance_info_round_trips_as_json() {
        let i = info("a", &[("order", &[0, 3])], 7, 123, 456);
        let json = serde_json::to_value(&i).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "instance_id": "a", "http": "http://a", "partitions": {"order": [0, 3]},
                "generation": 7, "assigned_ms": 123, "updated_ms": 456
            })
        );
        assert_eq!(serde_json::from_value::<InstanceInfo>(json).unwrap(), i);
    }

    #[test]
    fn records_of_others_are_applied_and_bad_ones_skipped() {
        let log: Arc<dyn Log> = Arc::new(NoLog);
        let inner = Inner {
            log,
            topic: Arc::from("app._instances"),
            partition: 0,
            instance_id: "me".into(),
            heartbeat: Duration::from_millis(100),
            own: Mutex::new(info("me", &[], 0, 0, 0)),
            others: Mutex::new(BTreeMap::new()),
            left: AtomicBool::new(false),
            changed: Notify::new(),
        };
        let rec = |key: &str, value: Vec<u8>| Record {
            key: key.as_bytes().to_vec(),
            value,
            headers: vec![],
            timestamp_ms: 0,
        };
        let b = info("b", &[("order", &[1])], 1, 10, 10);
        inner.apply(0, 0, &rec("b", serde_json::to_vec(&b).unwrap()));
        inner.apply(1, 0, &rec("c", b"not json".to_vec()));
        inner.apply(2, 0, &rec("d", serde_json::to_vec(&b).unwrap())); // key is not the id
        inner.apply(
            3,
            0,
            &rec(
                "me",
                serde_json::to_vec(&info("me", &[("order", &[1])], 9, 9, 9)).unwrap(),
            ),
        );
        inner.apply(
            4,
            0,
            &Record {
                key: vec![0xff],
                ..rec("", vec![])
            },
        );
        assert_eq!(inner.others.lock().unwrap().clone(), map(vec![b.clone()]));
        assert_eq!(inner.snapshot().keys().collect::<Vec<_>>(), ["b", "me"]);
        assert!(
            inner.snapshot()["me"].partitions.is_empty(),
            "own record comes from memory"
        );
        inner.apply(5, 0, &rec("b", Vec::new()));
        assert!(
            inner.others.lock().unwrap().is_empty(),
            "a tombstone removes the instance"
        );
    }

    /// A log nothing is ever sent to (for `Inner` without a backend).
    struct NoLog;

    #[async_trait::async_trait]
    impl Log for NoLog {
        fn backend(&self) -> &'static str {
            "none"
        }
        fn partitions(&self) -> u32 {
            1
        }
        fn store(&self) -> &eventfold_store::Store {
            unreachable!("not used by the registry")
        }
        fn commit(&self, _unit: eventfold_log::CommitUnit) -> eventfold_log::CommitFuture {
            Box::pin(async { Err(eventfold_log::Error::Closed("no log".into())) })
        }
        async fn read(&self, _: &str, _: u32, _: u64, _: usize) -> eventfold_log::Result<Vec<(u64, Record)>> {
            Ok(Vec::new())
        }
        async fn end_offset(&self, _: &str, _: u32) -> eventfold_log::Result<u64> {
            Ok(0)
        }
        async fn committed_offset(&self, _: &str, _: &str, _: u32) -> eventfold_log::Result<Option<u64>> {
            Ok(None)
        }
    }
}
