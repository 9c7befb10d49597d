//! The runtime: registered aggregate types, their processors, readiness and metrics.

use crate::clock::{Clock, SystemClock};
use crate::command::{PartitionState, Topics};
use crate::error::{Error, Result};
use crate::metrics::AggregateMetrics;
pub use crate::options::RuntimeOptions;
use crate::processor::{PartitionShared, Processor, ProcessorConfig};
use crate::remote::Requester;
use crate::service::{AggregateService, PartitionReport, TypedService};
use crate::source::{GroupMember, TypedMember};
use crate::view::{ViewOptions, ViewReport, ViewService, ViewSlot, ViewStarter};
use eventfold_core::{Aggregate, Projection};
use eventfold_log::Log;
use eventfold_log::MemberControl;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// What a starting aggregate type needs to know about ownership.
struct Grouping {
    /// Kafka mode: partitions start unowned and follow the consumer group.
    grouped: bool,
    /// The group member, once joined (recoveries seek it).
    member: Arc<OnceLock<Arc<dyn MemberControl>>>,
    /// Sends commands of partitions owned elsewhere to their owner.
    remote: Option<Arc<Requester>>,
    /// The lookup tables `handle` reads (resolved once the views exist).
    tables: crate::lookup::Tables,
}

type Started = (Arc<dyn AggregateService>, Option<Arc<dyn GroupMember>>);
type Starter = Box<dyn FnOnce(&Arc<dyn Log>, &RuntimeOptions, &Arc<dyn Clock>, &Grouping) -> Started + Send>;

/// Called with the partitions this instance owns, by aggregate type, after every change.
pub type OwnershipHook = Arc<dyn Fn(BTreeMap<String, Vec<u32>>) + Send + Sync>;

/// Registers aggregate types, then starts their processors.
pub struct RuntimeBuilder {
    options: RuntimeOptions,
    clock: Arc<dyn Clock>,
    starters: Vec<(&'static str, Starter)>,
    views: Vec<(&'static str, u32, ViewStarter)>,
    view_options: ViewOptions,
    ownership_hook: Option<OwnershipHook>,
    processes: Vec<(&'static str, crate::process::Starter)>,
    /// Other apps' events topics the process managers read (Kafka mode), to provision.
    foreign_sources: Vec<Arc<str>>,
    process_options: crate::process::ProcessOptions,
}

impl RuntimeBuilder {
    /// Registers the view of projection `P` (a partitioned view's source aggregate type
    /// must be registered too, before `build`; a replicated view may read the events of a
    /// type this instance does not run, written by other instances of the app: a lookup
    /// table).
    ///
    /// Several versions of one view ([`Projection::VERSION`]) may be registered during a
    /// migration: the newest is built side by side while the one stored as serving keeps
    /// answering, and queries switch when the newest has caught up (see `build`).
    pub fn view<P: Projection>(mut self) -> Self {
        assert!(
            self.views.iter().all(|(n, v, _)| (*n, *v) != (P::VIEW, P::VERSION)),
            "view `{}` version {} registered twice",
            P::VIEW,
            P::VERSION
        );
        assert!(P::VERSION >= 1, "view `{}`: versions start at 1", P::VIEW);
        eventfold_store::Store::check_key("view name", P::VIEW).expect("view names must be valid keys");
        let app = self.options.app_id.clone();
        let starter: ViewStarter = Box::new(move |log, services, options| {
            let source = <P::Source as Aggregate>::TYPE;
            match services.get(source) {
                Some(svc) => crate::view::start::<P>(log, svc.topics().clone(), Some(svc), options),
                // A lookup table of events this instance does not write: every instance
                // reads all of a replicated view's partitions anyway.
                None if P::SCOPE == eventfold_core::Scope::Replicated => {
                    crate::view::start::<P>(log, Topics::new(&app, source), None, options)
                }
                None => panic!(
                    "view `{}` is partitioned and reads aggregate type `{source}`, which is not registered (a partitioned view lives with its source's partitions)",
                    P::VIEW
                ),
            }
        });
        self.views.push((P::VIEW, P::VERSION, starter));
        self
    }

    /// Registers process manager `P` with its configuration (this service's aggregate
    /// types it reads and sends commands to must be registered too, before `build`;
    /// another app's, see [`eventfold_core::Subscription::from_app`], are reached in Kafka
    /// mode only).
    pub fn process_manager<P: eventfold_core::ProcessManager>(mut self, config: P::Config) -> Self {
        assert!(
            eventfold_core::process::valid_name(P::NAME),
            "process manager name `{}`: expected 1 to 64 ASCII letters, digits, `_` or `-`",
            P::NAME
        );
        assert!(
            self.processes.iter().all(|(n, _)| *n != P::NAME),
            "process manager `{}` registered twice",
            P::NAME
        );
        for sub in P::subscriptions(&config) {
            if let Some(app) = sub.app() {
                let events = Topics::new(app, sub.aggregate_type()).events;
                if !self.foreign_sources.contains(&events) {
                    self.foreign_sources.push(events);
                }
            }
        }
        self.processes.push((P::NAME, crate::process::starter::<P>(config)));
        self
    }

    /// Uses `options` for the process manager workers.
    pub fn process_options(mut self, options: crate::process::ProcessOptions) -> Self {
        self.process_options = options;
        self
    }

    /// Uses `options` for the view processors and queries.
    pub fn view_options(mut self, options: ViewOptions) -> Self {
        self.view_options = options;
        self
    }

    /// Calls `hook` with the partitions this instance owns after every change of the
    /// consumer group's assignment (Kafka mode), e.g. to publish them for routing.
    pub fn on_ownership(mut self, hook: OwnershipHook) -> Self {
        self.ownership_hook = Some(hook);
        self
    }

    /// Uses `clock` for record timestamps and dedup expiry.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Registers aggregate type `A` with its configuration.
    pub fn aggregate<A: Aggregate>(mut self, config: A::Config) -> Self {
        assert!(
            self.starters.iter().all(|(n, _)| *n != A::TYPE),
            "aggregate type `{}` registered twice",
            A::TYPE
        );
        eventfold_store::Store::check_key("aggregate type", A::TYPE).expect("aggregate type names must be valid keys");
        let starter: Starter =
            Box::new(move |log, options, clock, grouping| start::<A>(log, options, clock, grouping, config));
        self.starters.push((A::TYPE, starter));
        self
    }

    /// Every topic of the aggregates registered so far (`<app>.<type>.{commands, events,
    /// state, results}`), of the process managers (`<app>.<name>.state`) and the other
    /// apps' events topics they read (checked for the partition count like the others),
    /// for [`Coordinated::provision`](eventfold_log::Coordinated::provision) before
    /// [`RuntimeBuilder::build`].
    pub fn topics(&self) -> Vec<Arc<str>> {
        let app = &self.options.app_id;
        self.topic_sets()
            .into_iter()
            .flat_map(|(_, t)| [t.commands, t.events, t.state, t.results])
            .chain(
                self.processes
                    .iter()
                    .map(|(name, _)| crate::process::changelog_topic(app, name)),
            )
            .chain(self.foreign_sources.iter().cloned())
            .collect()
    }

    /// The topics of each registered aggregate type, in registration order.
    fn topic_sets(&self) -> Vec<(&'static str, Topics)> {
        self.starters
            .iter()
            .map(|(name, _)| (*name, Topics::new(&self.options.app_id, name)))
            .collect()
    }

    /// Starts every processor on the current tokio runtime.
    ///
    /// In Kafka mode (a log with [`Log::coordination`]) the instance joins the consumer
    /// group `app_id` for every commands topic: partitions start unowned and are restored
    /// when the group assigns them; commands for partitions owned elsewhere go to their
    /// owner through the commands topic. Call
    /// [`Coordinated::provision`](eventfold_log::Coordinated::provision) with
    /// [`RuntimeBuilder::topics`] first to refuse, at start, topics that cannot hold what the runtime keeps in them
    /// (the shop exits then); the runtime itself retries what fails later.
    pub fn build(self, log: Arc<dyn Log>) -> Runtime {
        let grouped = log.coordination().is_some();
        let topics = self.topic_sets();
        let grouping = Grouping {
            grouped,
            member: Arc::new(OnceLock::new()),
            remote: grouped.then(|| {
                let results = topics.iter().map(|(_, t)| t.results.clone()).collect();
                Requester::start(log.clone(), self.clock.clone(), &self.options.instance_id, results)
            }),
            tables: crate::lookup::Tables::default(),
        };
        let mut services = BTreeMap::new();
        let mut members: HashMap<Arc<str>, Arc<dyn GroupMember>> = HashMap::new();
        let mut types: HashMap<Arc<str>, String> = HashMap::new();
        for ((name, starter), (_, t)) in self.starters.into_iter().zip(&topics) {
            let (service, member) = starter(&log, &self.options, &self.clock, &grouping);
            services.insert(name.to_owned(), service);
            if let Some(m) = member {
                members.insert(t.commands.clone(), m);
                types.insert(t.commands.clone(), name.to_owned());
            }
        }
        let group = grouped.then(|| {
            let state = Arc::new(GroupState::default());
            tokio::spawn(join_group(
                log.clone(),
                self.options.clone(),
                grouping.member.clone(),
                members,
                types,
                state.clone(),
                self.ownership_hook.clone(),
            ));
            state
        });
        let views = crate::view::start_slots(&log, &services, &self.view_options, self.views);
        let slots: Arc<BTreeMap<String, Arc<ViewSlot>>> = Arc::new(views);
        let tables = grouping.tables.clone();
        crate::view::connect_lookups(&slots, &tables);
        let foreign = grouped.then(|| {
            crate::process::Foreign::new(
                log.clone(),
                self.clock.clone(),
                format!("{}-{}", self.options.app_id, self.options.instance_id),
                self.options.command_timeout,
            )
        });
        let targets = Arc::new(crate::process::Targets::new(
            self.options.app_id.clone(),
            services.clone(),
            foreign,
            tables.clone(),
        ));
        let processes = start_processes(self.processes, |i| crate::process::StartWith {
            log: &log,
            targets: &targets,
            clock: &self.clock,
            options: &self.process_options,
            app: &self.options.app_id,
            // Lanes from the top: a partition's lane is its number.
            lane: u32::MAX - i as u32,
        });
        Runtime {
            inner: Arc::new(Inner {
                services,
                views: slots,
                processes,
                log,
                options: self.options,
                group,
            }),
        }
    }
}

/// Starts each registered process manager with what `with(i)` gives the `i`-th.
fn start_processes<'a>(
    starters: Vec<(&'static str, crate::process::Starter)>,
    with: impl Fn(usize) -> crate::process::StartWith<'a>,
) -> BTreeMap<String, Arc<crate::process::ProcessService>> {
    starters
        .into_iter()
        .enumerate()
        .map(|(i, (name, start))| (name.to_owned(), start(with(i))))
        .collect()
}

/// What the runtime knows of its consumer group membership (Kafka mode).
#[derive(Default)]
struct GroupState {
    /// Set at the first assignment (possibly empty): until then nothing is known to be ours.
    joined: Arc<AtomicBool>,
    /// Partitions owned now, by aggregate type.
    owned: RwLock<BTreeMap<String, Vec<u32>>>,
}

/// Joins the consumer group (retrying while the broker cannot be reached) and runs it.
async fn join_group(
    log: Arc<dyn Log>,
    options: RuntimeOptions,
    cell: Arc<OnceLock<Arc<dyn MemberControl>>>,
    members: HashMap<Arc<str>, Arc<dyn GroupMember>>,
    types: HashMap<Arc<str>, String>,
    state: Arc<GroupState>,
    hook: Option<OwnershipHook>,
) {
    let topics: Vec<Arc<str>> = members.keys().cloned().collect();
    let membership = loop {
        let (l, g, t) = (log.clone(), options.app_id.clone(), topics.clone());
        match tokio::task::spawn_blocking(move || l.require_coordination()?.join(&g, &t)).await {
            Ok(Ok(m)) => break m,
            Ok(Err(e)) => {
                tracing::error!(group = %options.app_id, error = %e, "cannot join the consumer group; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return tracing::error!(error = %e, "join task failed"),
        }
    };
    tracing::info!(group = %options.app_id, topics = topics.len(), "joined the consumer group");
    let control = membership.control();
    let _ = cell.set(control.clone());
    let st = state.clone();
    let changed: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let mut owned: BTreeMap<String, Vec<u32>> = types.values().map(|t| (t.clone(), Vec::new())).collect();
        for (topic, p) in control.assignment() {
            if let Some(t) = types.get(&topic) {
                owned.entry(t.clone()).or_default().push(p);
            }
        }
        *st.owned.write().expect("not poisoned") = owned.clone();
        if let Some(hook) = &hook {
            hook(owned);
        }
    });
    let timeout = options.command_timeout.max(Duration::from_secs(30));
    crate::source::run_group(membership, members, state.joined.clone(), changed, timeout).await;
}

fn start<A: Aggregate>(
    log: &Arc<dyn Log>,
    options: &RuntimeOptions,
    clock: &Arc<dyn Clock>,
    grouping: &Grouping,
    config: A::Config,
) -> Started {
    let topics = Topics::new(&options.app_id, A::TYPE);
    let metrics = Arc::new(AggregateMetrics::new(A::TYPE));
    let (notify, _) = broadcast::channel(4096);
    let mut partitions = Vec::new();
    let mut controls = Vec::new();
    for p in 0..log.partitions() {
        let shared = Arc::new(PartitionShared::default());
        let (tx, rx) = mpsc::channel(options.queue_capacity);
        let cfg = ProcessorConfig::<A> {
            partition: p,
            topics: topics.clone(),
            config: config.clone(),
            max_batch: options.max_batch,
            dedup_window_ms: options.dedup_window.as_millis() as i64,
            dedup_sweep_every: options.dedup_sweep_every,
            // A bound for the aggregate type, not per partition: memory then does not
            // grow with the partition count.
            cache_limit: options.cache_limit / log.partitions().max(1) as usize,
            max_inflight: options
                .max_inflight_commits
                .unwrap_or_else(|| log.units_in_flight())
                .max(1),
            group: options.app_id.clone(),
            bulk_min_records: options.restore_bulk_min_records,
            state_every: options.state_every,
            tables: grouping.tables.clone(),
        };
        let processor = Processor::new(
            cfg,
            log.clone(),
            clock.clone(),
            shared.clone(),
            metrics.clone(),
            notify.clone(),
            grouping.member.clone(),
        );
        let control = grouping.grouped.then(|| {
            let (ctl, ctl_rx) = mpsc::unbounded_channel();
            controls.push((ctl, tx.clone(), shared.clone()));
            ctl_rx
        });
        tokio::spawn(processor.run(rx, control));
        partitions.push((shared, tx));
    }
    let member = grouping.grouped.then(|| {
        Arc::new(TypedMember::<A> {
            topic: topics.commands.clone(),
            partitions: controls,
        }) as Arc<dyn GroupMember>
    });
    let service = Arc::new(TypedService::<A> {
        topics,
        log: log.clone(),
        options: options.clone(),
        partitions,
        metrics,
        notify,
        remote: grouping.remote.clone(),
    });
    (service, member)
}

struct Inner {
    services: BTreeMap<String, Arc<dyn AggregateService>>,
    views: Arc<BTreeMap<String, Arc<ViewSlot>>>,
    log: Arc<dyn Log>,
    options: RuntimeOptions,
    group: Option<Arc<GroupState>>,
    processes: BTreeMap<String, Arc<crate::process::ProcessService>>,
}

/// A running set of aggregate types. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("aggregates", &self.inner.services.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Runtime {
    /// A builder with `options`.
    pub fn builder(options: RuntimeOptions) -> RuntimeBuilder {
        RuntimeBuilder {
            options,
            clock: Arc::new(SystemClock),
            starters: Vec::new(),
            views: Vec::new(),
            view_options: ViewOptions::default(),
            ownership_hook: None,
            processes: Vec::new(),
            foreign_sources: Vec::new(),
            process_options: crate::process::ProcessOptions::default(),
        }
    }

    /// The service of aggregate type `name`.
    pub fn aggregate(&self, name: &str) -> Result<&Arc<dyn AggregateService>> {
        self.inner
            .services
            .get(name)
            .ok_or_else(|| Error::UnknownAggregate(name.to_owned()))
    }

    /// Names of the registered aggregate types.
    pub fn aggregate_names(&self) -> impl Iterator<Item = &str> {
        self.inner.services.keys().map(String::as_str)
    }

    /// The view `name`: the version that answers queries now.
    pub fn view(&self, name: &str) -> Result<Arc<ViewService>> {
        self.inner
            .views
            .get(name)
            .map(|slot| slot.serving())
            .ok_or_else(|| Error::UnknownView(name.to_owned()))
    }

    /// The newer version of view `name` being built side by side, if any.
    pub fn view_building(&self, name: &str) -> Option<Arc<ViewService>> {
        self.inner.views.get(name).and_then(|slot| slot.building())
    }

    /// The process manager `name`.
    pub fn process_manager(&self, name: &str) -> Result<&Arc<crate::process::ProcessService>> {
        self.inner
            .processes
            .get(name)
            .ok_or_else(|| Error::UnknownProcessManager(name.to_owned()))
    }

    /// State, lag and timers of every process manager, by name.
    pub fn process_reports(&self) -> Vec<crate::process::ProcessReport> {
        self.inner.processes.values().map(|p| p.report()).collect()
    }

    /// Names of the registered views.
    pub fn view_names(&self) -> impl Iterator<Item = &str> {
        self.inner.views.keys().map(String::as_str)
    }

    /// The log this runtime commits to.
    pub fn log(&self) -> &Arc<dyn Log> {
        &self.inner.log
    }

    /// The options in force.
    pub fn options(&self) -> &RuntimeOptions {
        &self.inner.options
    }

    /// Every partition of every aggregate type.
    pub fn partitions(&self) -> Vec<PartitionReport> {
        self.inner.services.values().flat_map(|s| s.partitions()).collect()
    }

    /// Whether the instance joined its consumer group (Kafka mode; always true otherwise).
    pub fn has_joined(&self) -> bool {
        self.inner
            .group
            .as_ref()
            .is_none_or(|g| g.joined.load(Ordering::Acquire))
    }

    /// The partitions this instance owns, by aggregate type (every partition without a
    /// consumer group).
    pub fn owned_partitions(&self) -> BTreeMap<String, Vec<u32>> {
        match &self.inner.group {
            Some(g) => g.owned.read().expect("not poisoned").clone(),
            None => self
                .inner
                .services
                .keys()
                .map(|name| (name.clone(), (0..self.inner.log.partitions()).collect()))
                .collect(),
        }
    }

    /// Whether every owned partition has restored and every view caught up (and none
    /// failed), and, in Kafka mode, the consumer group has assigned this instance its
    /// partitions.
    pub fn is_ready(&self) -> bool {
        self.has_joined()
            && self
                .partitions()
                .iter()
                .all(|p| matches!(p.state, PartitionState::Ready | PartitionState::Remote))
            && self.inner.views.values().all(|v| v.serving().is_ready())
            && self.inner.processes.values().all(|p| p.is_ready())
    }

    /// State, lag and position of every view, by name.
    pub fn view_reports(&self) -> Vec<ViewReport> {
        let mut out = Vec::with_capacity(self.inner.views.len());
        for slot in self.inner.views.values() {
            let mut report = slot.serving().report();
            if let Some(b) = slot.building() {
                report.building = Some(Box::new(b.report()));
            }
            out.push(report);
        }
        out
    }

    /// Waits until the instance joined its consumer group (Kafka mode) and every
    /// partition is out of `Restoring` (or `timeout` passes).
    pub async fn wait_restored(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.has_joined() && self.partitions().iter().all(|p| p.state != PartitionState::Restoring) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// All metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        crate::exposition::render(crate::exposition::Sources {
            services: &self.inner.services,
            log: &*self.inner.log,
            partitions: &self.partitions(),
            views: &self.inner.views,
            processes: &self.inner.processes,
        })
    }
}
