//! Wiring: options -> store -> log -> runtime -> HTTP server.

use crate::domain::{Customer, CustomerOrders, FlowConfig, Order, OrderFlow, Payment, PaymentConfig};
use crate::views::{CustomersView, OrdersView};
use anyhow::{Context as _, bail};
use eventfold::Projection;
use eventfold::http::HttpOptions;
use eventfold::log::Log;
use eventfold::log::embedded::{self, EmbeddedLog};
use eventfold::log::kafka::{KafkaLog, KafkaOptions, MAX_TRANSACTION_INTERVAL};
use eventfold::rebuild::ProgressDrawTarget;
use eventfold::runtime::{RebuildStats, Registry, Runtime, RuntimeOptions, ViewOptions};
use eventfold::store::{Store, StoreOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Flags of `shop serve` (every flag also reads an `EVENTFOLD_*` environment variable).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// Address to serve HTTP on.
    #[arg(long, env = "EVENTFOLD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Directory of the embedded store [default: $XDG_DATA_HOME/eventfold/<app-id>, else
    /// ~/.local/share/eventfold/<app-id>].
    #[arg(long, env = "EVENTFOLD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Kafka bootstrap servers; absent: the embedded log. In Kafka mode the events, states
    /// and outcomes live in `<app-id>.<type>.{events,state,results}` (created when
    /// missing) and the data directory is only a cache, restored from those topics.
    #[arg(long, env = "EVENTFOLD_KAFKA")]
    pub kafka: Option<String>,
    /// Application id: the topic prefix (`<app-id>.<type>.events`).
    #[arg(long, env = "EVENTFOLD_APP_ID", default_value = "shop")]
    pub app_id: String,
    /// Partitions per topic. Fixed when the data directory is created.
    #[arg(long, env = "EVENTFOLD_PARTITIONS", default_value_t = 8)]
    pub partitions: u32,
    /// Instance id (shown in /v1/cluster; used for routing in Kafka mode). Every instance
    /// of one app needs its own, stable across its restarts.
    #[arg(long, env = "EVENTFOLD_INSTANCE_ID", default_value = "local")]
    pub instance_id: String,
    /// Kafka mode: the base URL other instances forward reads to [default:
    /// http://<--http>]. Set it when --http listens on 0.0.0.0 or behind a proxy.
    #[arg(long, env = "EVENTFOLD_ADVERTISED_HTTP")]
    pub advertised_http: Option<String>,
    /// How long an Idempotency-Key is remembered, in seconds.
    #[arg(long, env = "EVENTFOLD_DEDUP_WINDOW_SECS", default_value_t = 24 * 3600)]
    pub dedup_window_secs: u64,
    /// Largest accepted request body in bytes (larger: 413).
    #[arg(long, env = "EVENTFOLD_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
    /// Payments above this amount (cents) are declined.
    #[arg(long, env = "EVENTFOLD_DECLINE_ABOVE_CENTS", default_value_t = PaymentConfig::default().decline_above_cents)]
    pub decline_above_cents: u64,
    /// Seconds an order may stay `placed` before the order flow cancels it as expired.
    #[arg(long, env = "EVENTFOLD_ORDER_EXPIRY_SECS", default_value_t = 3600)]
    pub order_expiry_secs: u64,
    /// Do not run the shop's process managers (the order flow `order_flow` and the
    /// cascading delete `customer_orders`): orders then change only through the commands
    /// clients send.
    #[arg(long, env = "EVENTFOLD_NO_PROCESS_MANAGERS")]
    pub no_process_managers: bool,
    /// Seconds a command may wait for its outcome before 504.
    #[arg(long, env = "EVENTFOLD_COMMAND_TIMEOUT_SECS", default_value_t = 10)]
    pub command_timeout_secs: u64,
    /// How far behind a partition must start to catch up in bulk (written straight into
    /// the store's table files, several times faster): the changelog replay of a command
    /// partition in Kafka mode (records), and a partitioned view partition starting with
    /// no checkpoint (events; its rows appear when it is done).
    #[arg(long, env = "EVENTFOLD_BULK_MIN_RECORDS", default_value_t = 50_000)]
    pub bulk_min_records: u64,
    /// Disable fsync of commits. Unsafe: only for throwaway benchmarks.
    #[arg(long, env = "EVENTFOLD_NO_FSYNC")]
    pub no_fsync: bool,
    /// Embedded log: nice value of the thread every commit passes through (Linux); 0
    /// leaves it at the process's (the default: over HTTP a raised committer preempts the
    /// request handling at every fsync completion, which cost more than it gained). A
    /// negative value suits loads whose commits queue behind busy cores. Raising it needs
    /// CAP_SYS_NICE (root) or `ulimit -e 30`; without either the service logs that and
    /// runs at normal priority.
    #[arg(long, env = "EVENTFOLD_COMMITTER_NICE", default_value_t = SERVICE_COMMITTER_NICE, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub committer_nice: i32,
    /// Nice value of the store's background threads (flushes, compactions; Linux), so
    /// that they take a core only when request handling leaves one; 0 leaves them at the
    /// process's. Lowering a priority needs no privilege.
    #[arg(long, env = "EVENTFOLD_BACKGROUND_NICE", default_value_t = eventfold::store::DEFAULT_BACKGROUND_NICE, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub background_nice: i32,
    /// Kafka mode: transactional producers committing in parallel (transactional ids
    /// `<app-id>-<instance-id>-<k>`; partition p commits through producer p mod N). Keep
    /// it constant across restarts of an instance.
    #[arg(long, env = "EVENTFOLD_KAFKA_COMMITTERS", default_value_t = KafkaOptions::new("", 1, "").committers)]
    pub kafka_committers: usize,
    /// Kafka mode: transactional producers per committer, taken in turn one transaction
    /// each (ids `<committer's id>.1`, `.2`, ... after the first), so a transaction need
    /// not wait for the broker to finish the previous one's markers. Keep it constant
    /// across restarts of an instance.
    #[arg(long, env = "EVENTFOLD_KAFKA_PRODUCERS_PER_COMMITTER", default_value_t = KafkaOptions::new("", 1, "").producers_per_committer)]
    pub kafka_producers_per_committer: usize,
    /// Kafka mode: milliseconds from the start of one transaction to the start of the next
    /// while commands keep queueing (0 to 1000; 0: back to back). A transaction that finds
    /// the queue empty when the previous one ends does not wait, so a lone command is
    /// never delayed; under load each transaction takes what arrived meanwhile, or starts
    /// early once commands stop arriving (`--kafka-transaction-quiet-us`). Spares the broker
    /// (its cost is mostly per transaction) for a few milliseconds of latency
    /// (bench/FINDINGS.md).
    #[arg(long, env = "EVENTFOLD_KAFKA_MIN_TRANSACTION_INTERVAL_MS", default_value_t = KafkaOptions::new("", 1, "").min_transaction_interval.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=MAX_TRANSACTION_INTERVAL.as_millis() as u64))]
    pub kafka_min_transaction_interval_ms: u64,
    /// Kafka mode: while waiting out `--kafka-min-transaction-interval-ms`, start the
    /// transaction early once no command has arrived for this many microseconds (0: wait
    /// the whole interval; at most 1,000,000). Clients that each wait for their answer
    /// send their next commands in a burst after each transaction, so the lane need not
    /// wait for more; commands from many independent callers keep arriving, and the
    /// interval still spaces the transactions.
    #[arg(long, env = "EVENTFOLD_KAFKA_TRANSACTION_QUIET_US", default_value_t = KafkaOptions::new("", 1, "").transaction_quiet.map_or(0, |q| q.as_micros() as u64), value_parser = clap::value_parser!(u64).range(0..=MAX_TRANSACTION_INTERVAL.as_micros() as u64))]
    pub kafka_transaction_quiet_us: u64,
    /// Kafka mode: bound in seconds on every blocking broker call (transaction commit or
    /// abort, offsets, metadata). A transaction that cannot commit within it fails and its
    /// partition recovers from the committed state once the broker answers again.
    #[arg(long, env = "EVENTFOLD_KAFKA_TIMEOUT_SECS", default_value_t = 30)]
    pub kafka_timeout_secs: u64,
    /// Kafka mode: seconds the consumer group waits for a silent instance before it moves
    /// the instance's partitions to the others (`session.timeout.ms`). Instances are static
    /// group members (`group.instance.id` = `<app-id>-<instance-id>`): one restarted within
    /// this time gets its partitions back without a rebalance; one stopped for good, even
    /// cleanly, hands them over only after it.
    #[arg(long, env = "EVENTFOLD_KAFKA_SESSION_TIMEOUT_SECS", default_value_t = 10)]
    pub kafka_session_timeout_secs: u64,
    /// Kafka mode: seconds after which the broker aborts a transaction left open
    /// (`transaction.timeout.ms`), e.g. by an instance that died mid-commit: until then it
    /// holds back what readers of its partitions see. An instance paused longer than this
    /// finds its producer fenced and stops (restart it).
    #[arg(long, env = "EVENTFOLD_KAFKA_TRANSACTION_TIMEOUT_SECS", default_value_t = 10)]
    pub kafka_transaction_timeout_secs: u64,
    /// Kafka mode: a librdkafka setting for every Kafka client of the instance, as
    /// `KEY=VALUE` (repeatable; e.g. `security.protocol=SASL_SSL`, `sasl.mechanism=PLAIN`,
    /// `debug=eos`). It wins over eventfold's own defaults.
    #[arg(long = "kafka-config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub kafka_config: Vec<(String, String)>,
}

/// `KEY=VALUE` of `--kafka-config`.
fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not KEY=VALUE (e.g. security.protocol=SASL_SSL)")),
    }
}

impl ServeOptions {
    /// The data directory in force.
    pub fn data_dir(&self) -> PathBuf {
        if let Some(d) = &self.data_dir {
            return d.clone();
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("."));
        // Kafka mode keeps a cache per instance: never the embedded log's directory.
        match &self.kafka {
            None => base.join("eventfold").join(&self.app_id),
            Some(_) => base
                .join("eventfold")
                .join(format!("{}-kafka-{}", self.app_id, self.instance_id)),
        }
    }
}

/// How often an instance renews its `_instances` entry; one silent for three of these is
/// taken for gone.
const REGISTRY_HEARTBEAT: Duration = Duration::from_secs(2);

/// The shop's default `--committer-nice`: 0, not the embedded log's
/// [`embedded::DEFAULT_COMMITTER_NICE`] (-10), which suits in-process load (commits
/// queued behind busy cores: 1,024 in-process submitters did a median 98,490 commands/s at
/// -10 against 78,611/s at 0). Over HTTP the committer raised above the request handling
/// preempted it at every fsync completion: 64 clients on 2 cores (2026-12-04, 8 rounds in
/// rotating order) did a median 18,931 commands/s, p99 9.12 ms, 72.8 µs of service CPU
/// per command at -10 against 19,782/s, 8.00 ms, 64.7 µs at 0 (and 20,140/s, 8.16 ms,
/// 65.2 µs at -5). At 0 it also needs no privilege.
pub const SERVICE_COMMITTER_NICE: i32 = 0;

/// The names of the shop's views, for messages.
pub const VIEWS: [&str; 2] = [OrdersView::VIEW, CustomersView::VIEW];

/// Rebuilds view `name` in the data directory from its source events, with a progress
/// bar on stderr (see `eventfold::rebuild`): from the embedded log there, or in Kafka
/// mode from the events topic (`read_committed`, without producing anything or joining
/// the consumer group) into the instance's local store. The service must not be running
/// on that directory.
pub async fn rebuild_view(opts: &ServeOptions, name: &str) -> anyhow::Result<RebuildStats> {
    if !VIEWS.contains(&name) {
        bail!("unknown view `{name}`; views: {}", VIEWS.join(", "));
    }
    let dir = opts.data_dir();
    if !dir.exists() {
        bail!("data directory {} does not exist", dir.display());
    }
    // The rebuild reads the log once, in order: a block cache of the service's size would
    // only take memory (first touched, so zeroed by the kernel: time) and evict.
    let store_options = StoreOptions {
        cache_bytes: 32 << 20,
        background_nice: opts.background_nice,
        ..StoreOptions::default()
    };
    let store = Store::open(&dir, &store_options).with_context(|| {
        format!(
            "cannot open the store in {} (is the service still running on it? stop it first: the store admits one process)",
            dir.display()
        )
    })?;
    let log = open_log(opts, store, true)?;
    let options = ViewOptions::default();
    let draw = ProgressDrawTarget::stderr();
    match name {
        OrdersView::VIEW => eventfold::rebuild::run::<OrdersView>(log, &opts.app_id, &options, draw).await,
        CustomersView::VIEW => eventfold::rebuild::run::<CustomersView>(log, &opts.app_id, &options, draw).await,
        other => unreachable!("checked above: {other}"),
    }
}

/// The Kafka log's options from the flags.
/// The log over `store`: the embedded log, or in Kafka mode the Kafka log, read-only for
/// `reader` (a rebuild: no producer, no group; see `KafkaLog::open_reader`).
fn open_log(opts: &ServeOptions, store: Store, reader: bool) -> anyhow::Result<Arc<dyn Log>> {
    Ok(match &opts.kafka {
        None => Arc::new(EmbeddedLog::open(
            store,
            embedded::Options {
                partitions: opts.partitions,
                fsync: !opts.no_fsync,
                committer_nice: opts.committer_nice,
                ..Default::default()
            },
        )?),
        Some(bootstrap) if reader => {
            let kafka = kafka_options(opts, bootstrap);
            let log = tokio::task::block_in_place(|| KafkaLog::open_reader(kafka, store))
                .with_context(|| format!("cannot read the Kafka log at {bootstrap}"))?;
            Arc::new(log)
        }
        Some(bootstrap) => {
            // One instance per transactional id: a restarted instance fences its previous
            // incarnation. Opening connects and initializes transactions (blocking).
            let kafka = kafka_options(opts, bootstrap);
            let log = tokio::task::block_in_place(|| KafkaLog::open(kafka, store))
                .with_context(|| format!("cannot start the Kafka log at {bootstrap}"))?;
            Arc::new(log)
        }
    })
}

fn kafka_options(opts: &ServeOptions, bootstrap: &str) -> KafkaOptions {
    KafkaOptions {
        committers: opts.kafka_committers,
        producers_per_committer: opts.kafka_producers_per_committer,
        min_transaction_interval: Duration::from_millis(opts.kafka_min_transaction_interval_ms),
        transaction_quiet: (opts.kafka_transaction_quiet_us > 0)
            .then(|| Duration::from_micros(opts.kafka_transaction_quiet_us)),
        operation_timeout: Duration::from_secs(opts.kafka_timeout_secs.max(1)),
        session_timeout: Duration::from_secs(opts.kafka_session_timeout_secs.clamp(6, 1800)),
        transaction_timeout: Duration::from_secs(opts.kafka_transaction_timeout_secs.max(1)),
        client_config: opts.kafka_config.clone(),
        ..KafkaOptions::new(
            bootstrap,
            opts.partitions,
            format!("{}-{}", opts.app_id, opts.instance_id),
        )
    }
}

/// A running shop: its runtime and the HTTP router.
pub struct Shop {
    /// The runtime (for in-process use and tests).
    pub runtime: Runtime,
    /// The HTTP API.
    pub router: eventfold::http::Router,
    /// Kafka mode: this instance's entry in `<app-id>._instances` (leave it on shutdown).
    pub registry: Option<Arc<Registry>>,
}

/// Opens the store and starts the runtime (must run inside a tokio runtime).
pub fn build(opts: &ServeOptions) -> anyhow::Result<Shop> {
    if opts.partitions == 0 || opts.partitions > 1024 {
        bail!("--partitions must be between 1 and 1024, got {}", opts.partitions);
    }
    let dir = opts.data_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create data directory {}", dir.display()))?;
    let store_options = StoreOptions {
        background_nice: opts.background_nice,
        // In Kafka mode the store is a cache whose writes are never synced one by one.
        spare_journals: opts.kafka.is_none(),
        ..StoreOptions::default()
    };
    let store =
        Store::open(&dir, &store_options).with_context(|| format!("cannot open the store in {}", dir.display()))?;
    let log = open_log(opts, store, false)?;
    let options = RuntimeOptions {
        app_id: opts.app_id.clone(),
        instance_id: opts.instance_id.clone(),
        dedup_window: Duration::from_secs(opts.dedup_window_secs),
        command_timeout: Duration::from_secs(opts.command_timeout_secs),
        restore_bulk_min_records: opts.bulk_min_records,
        ..Default::default()
    };
    let advertised = opts
        .advertised_http
        .clone()
        .unwrap_or_else(|| format!("http://{}", opts.http));
    // Kafka mode: announce this instance and the partitions it owns, for routing.
    let registry = match &opts.kafka {
        None => None,
        Some(_) => Some(
            tokio::task::block_in_place(|| {
                Registry::start(
                    log.clone(),
                    &opts.app_id,
                    &opts.instance_id,
                    &advertised,
                    REGISTRY_HEARTBEAT,
                )
            })
            .context("cannot announce this instance on the _instances topic")?,
        ),
    };
    let mut builder = Runtime::builder(options);
    if let Some(r) = &registry {
        let r = r.clone();
        builder = builder.on_ownership(Arc::new(move |owned| r.set_owned(owned)));
    }
    let builder = builder
        .aggregate::<Order>(())
        .aggregate::<Payment>(PaymentConfig {
            decline_above_cents: opts.decline_above_cents,
        })
        .aggregate::<Customer>(());
    // The order flow (payment on confirm, ship when paid, cancel when declined, expiry)
    // and the cascading delete of a deleted customer's orders.
    let builder = if opts.no_process_managers {
        builder
    } else {
        builder
            .process_manager::<OrderFlow>(FlowConfig {
                order_expiry: Duration::from_secs(opts.order_expiry_secs),
            })
            .process_manager::<CustomerOrders>(())
    };
    // Kafka mode: every topic is created or checked now, so that one with another
    // partition count or a policy that would lose data stops the start, with the reason.
    let topics = builder.topics();
    tokio::task::block_in_place(|| log.provision(&topics)).context("the app's Kafka topics cannot be used")?;
    let runtime = builder
        .view::<OrdersView>()
        .view::<CustomersView>()
        .view_options(ViewOptions {
            bulk_catch_up_min_events: opts.bulk_min_records,
            ..Default::default()
        })
        .build(log);
    let http = HttpOptions {
        max_body_bytes: opts.max_body_bytes,
        advertised_address: advertised,
        registry: registry.clone(),
        ..Default::default()
    };
    let router = eventfold::http::router(runtime.clone(), http);
    Ok(Shop {
        runtime,
        router,
        registry,
    })
}
