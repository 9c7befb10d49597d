//! The runtime: registered aggregate types, their processors, readiness and metrics.

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::metrics::AggregateMetrics;
use crate::processor::{PartitionShared, Processor, ProcessorConfig};
use crate::service::{AggregateService, PartitionReport, PartitionState, Topics, TypedService};
use crate::view::{ViewOptions, ViewReport, ViewService};
use eventfold_core::{Aggregate, Projection};
use eventfold_log::Log;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// Options of the command path (defaults in parentheses).
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Topic prefix (`shop`).
    pub app_id: String,
    /// Most commands per commit unit (1024).
    pub max_batch: usize,
    /// Commands queued per partition before 503 (4096).
    pub queue_capacity: usize,
    /// Commands queued per *restoring* partition before 503 (1024).
    pub restore_queue_limit: usize,
    /// How long a caller waits for an outcome before 504 (10 s).
    pub command_timeout: Duration,
    /// `Retry-After` on 503 (1 s).
    pub retry_after: Duration,
    /// How long a command id is remembered (24 h).
    pub dedup_window: Duration,
    /// How often expired dedup records are removed (60 s).
    pub dedup_sweep_every: Duration,
    /// Aggregates kept in memory per partition (100,000).
    pub cache_limit: usize,
    /// Batches per partition whose commit may be under way at once (4): processing of
    /// the next batch overlaps with the fsync of the previous ones.
    pub max_inflight_commits: usize,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            app_id: "app".into(),
            max_batch: 1024,
            queue_capacity: 4096,
            restore_queue_limit: 1024,
            command_timeout: Duration::from_secs(10),
            retry_after: Duration::from_secs(1),
            dedup_window: Duration::from_secs(24 * 3600),
            dedup_sweep_every: Duration::from_secs(60),
            cache_limit: 100_000,
            max_inflight_commits: 4,
        }
    }
}

type ViewStarter = Box<
    dyn FnOnce(&Arc<dyn Log>, &BTreeMap<String, Arc<dyn AggregateService>>, &ViewOptions) -> Arc<ViewService> + Send,
>;

type Starter = Box<dyn FnOnce(&Arc<dyn Log>, &RuntimeOptions, &Arc<dyn Clock>) -> Arc<dyn AggregateService> + Send>;

/// Registers aggregate types, then starts their processors.
pub struct RuntimeBuilder {
    options: RuntimeOptions,
    clock: Arc<dyn Clock>,
    starters: Vec<(&'static str, Starter)>,
    views: Vec<(&'static str, ViewStarter)>,
    view_options: ViewOptions,
}

impl RuntimeBuilder {
    /// Registers the view of projection `P` (its source aggregate type must be registered
    /// too, before `build`).
    pub fn view<P: Projection>(mut self) -> Self {
        assert!(
            self.views.iter().all(|(n, _)| *n != P::VIEW),
            "view `{}` registered twice",
            P::VIEW
        );
        eventfold_store::Store::check_key("view name", P::VIEW).expect("view names must be valid keys");
        let starter: ViewStarter = Box::new(|log, services, options| {
            let source = <P::Source as Aggregate>::TYPE;
            let svc = services.get(source).unwrap_or_else(|| {
                panic!(
                    "view `{}` reads aggregate type `{source}`, which is not registered",
                    P::VIEW
                )
            });
            crate::view::start::<P>(log, svc, options)
        });
        self.views.push((P::VIEW, starter));
        self
    }

    /// Uses `options` for the view processors and queries.
    pub fn view_options(mut self, options: ViewOptions) -> Self {
        self.view_options = options;
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
        let starter: Starter = Box::new(move |log, options, clock| start::<A>(log, options, clock, config));
        self.starters.push((A::TYPE, starter));
        self
    }

    /// Starts every processor on the current tokio runtime.
    pub fn build(self, log: Arc<dyn Log>) -> Runtime {
        let mut services = BTreeMap::new();
        for (name, starter) in self.starters {
            services.insert(name.to_owned(), starter(&log, &self.options, &self.clock));
        }
        let mut views = BTreeMap::new();
        for (name, starter) in self.views {
            views.insert(name.to_owned(), starter(&log, &services, &self.view_options));
        }
        Runtime {
            inner: Arc::new(Inner {
                services,
                views,
                log,
                options: self.options,
            }),
        }
    }
}

fn start<A: Aggregate>(
    log: &Arc<dyn Log>,
    options: &RuntimeOptions,
    clock: &Arc<dyn Clock>,
    config: A::Config,
) -> Arc<dyn AggregateService> {
    let topics = Topics::new(&options.app_id, A::TYPE);
    let metrics = Arc::new(AggregateMetrics::new(A::TYPE));
    let (notify, _) = broadcast::channel(4096);
    let mut partitions = Vec::new();
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
            cache_limit: options.cache_limit,
            max_inflight: options.max_inflight_commits.max(1),
            group: options.app_id.clone(),
        };
        let processor = Processor::new(
            cfg,
            log.clone(),
            clock.clone(),
            shared.clone(),
            metrics.clone(),
            notify.clone(),
        );
        tokio::spawn(processor.run(rx));
        partitions.push((shared, tx));
    }
    if log.store_is_cache() {
        let senders = partitions.iter().map(|(_, tx)| tx.clone()).collect();
        tokio::spawn(crate::source::run::<A>(
            log.clone(),
            topics.commands.clone(),
            options.app_id.clone(),
            senders,
        ));
    }
    Arc::new(TypedService::<A> {
        topics,
        log: log.clone(),
        options: options.clone(),
        partitions,
        metrics,
        notify,
    })
}

struct Inner {
    services: BTreeMap<String, Arc<dyn AggregateService>>,
    views: BTreeMap<String, Arc<ViewService>>,
    log: Arc<dyn Log>,
    options: RuntimeOptions,
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

    /// The view `name`.
    pub fn view(&self, name: &str) -> Result<&Arc<ViewService>> {
        self.inner
            .views
            .get(name)
            .ok_or_else(|| Error::UnknownView(name.to_owned()))
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

    /// Whether every partition has restored and every view caught up (and none failed).
    pub fn is_ready(&self) -> bool {
        self.partitions().iter().all(|p| p.state == PartitionState::Ready)
            && self.inner.views.values().all(|v| v.is_ready())
    }

    /// State, lag and position of every view, by name.
    pub async fn view_reports(&self) -> Vec<ViewReport> {
        let mut out = Vec::with_capacity(self.inner.views.len());
        for v in self.inner.views.values() {
            out.push(v.report().await);
        }
        out
    }

    /// Waits until every partition is out of `Restoring` (or `timeout` passes).
    pub async fn wait_restored(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.partitions().iter().all(|p| p.state != PartitionState::Restoring) {
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
        let mut out = String::new();
        out.push_str("# HELP eventfold_commands_total Commands by aggregate type and outcome.\n# TYPE eventfold_commands_total counter\n");
        for s in self.inner.services.values() {
            s.metrics().render_commands(&mut out);
        }
        let (mut latency, mut batch) = (String::new(), String::new());
        for s in self.inner.services.values() {
            s.metrics().render_histograms(&mut latency, &mut batch);
        }
        out.push_str("# HELP eventfold_commit_latency_seconds Time from the start of a commit to its durability.\n# TYPE eventfold_commit_latency_seconds histogram\n");
        out.push_str(&latency);
        out.push_str("# HELP eventfold_commit_batch_commands Commands per commit unit.\n# TYPE eventfold_commit_batch_commands histogram\n");
        out.push_str(&batch);
        let ls = self.inner.log.stats();
        let backend = self.inner.log.backend();
        for (name, help, value) in [
            (
                "eventfold_log_group_commits_total",
                "Group commits (embedded: fsyncs) or transactions.",
                ls.group_commits as f64,
            ),
            ("eventfold_log_units_total", "Commit units written.", ls.units as f64),
            ("eventfold_log_records_total", "Records appended.", ls.records as f64),
            (
                "eventfold_log_write_seconds_total",
                "Time spent writing and syncing.",
                ls.write_micros as f64 / 1e6,
            ),
            (
                "eventfold_log_busy_seconds_total",
                "Time the committer was busy.",
                ls.busy_micros as f64 / 1e6,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{backend=\"{backend}\"}} {value}"
            );
        }
        let parts = self.partitions();
        out.push_str("# HELP eventfold_restore_progress Restore progress of a partition (0 to 1).\n# TYPE eventfold_restore_progress gauge\n");
        for p in &parts {
            let _ = writeln!(
                out,
                "eventfold_restore_progress{{aggregate=\"{}\",partition=\"{}\"}} {}",
                p.aggregate, p.partition, p.restore_progress
            );
        }
        out.push_str("# HELP eventfold_partition_up Whether a partition takes commands (1), restores (0) or failed (-1).\n# TYPE eventfold_partition_up gauge\n");
        for p in &parts {
            let v = match p.state {
                PartitionState::Ready => 1,
                PartitionState::Restoring => 0,
                PartitionState::Failed => -1,
            };
            let _ = writeln!(
                out,
                "eventfold_partition_up{{aggregate=\"{}\",partition=\"{}\"}} {v}",
                p.aggregate, p.partition
            );
        }
        out.push_str("# HELP eventfold_partition_queued_commands Commands waiting in a partition's queue.\n# TYPE eventfold_partition_queued_commands gauge\n");
        for p in &parts {
            let _ = writeln!(
                out,
                "eventfold_partition_queued_commands{{aggregate=\"{}\",partition=\"{}\"}} {}",
                p.aggregate, p.partition, p.queued
            );
        }
        let (mut applied, mut up, mut conflicts) = (String::new(), String::new(), String::new());
        for v in self.inner.views.values() {
            v.render_metrics(&mut applied, &mut up, &mut conflicts);
        }
        if !applied.is_empty() {
            out.push_str("# HELP eventfold_view_applied_offset Next source offset a view partition will apply.\n# TYPE eventfold_view_applied_offset gauge\n");
            out.push_str(&applied);
            out.push_str("# HELP eventfold_view_up Whether a view partition has caught up (1), catches up (0) or failed (-1).\n# TYPE eventfold_view_up gauge\n");
            out.push_str(&up);
        }
        if !conflicts.is_empty() {
            out.push_str("# HELP eventfold_view_unique_conflicts_total Rows not indexed because another row holds the unique value.\n# TYPE eventfold_view_unique_conflicts_total counter\n");
            out.push_str(&conflicts);
        }
        out
    }
}
