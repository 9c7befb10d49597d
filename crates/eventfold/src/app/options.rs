//! The standard flags every service built with [`App`](super::App) has.

use anyhow::Context as _;
use eventfold_http::auth::{AuthOptions, RateLimit};
use eventfold_http::tls::{self, ClientConfig, Tls};
use eventfold_http::{HttpOptions, ServerLimits};
use eventfold_log::kafka::{KafkaOptions, MAX_TRANSACTION_INTERVAL};
use eventfold_runtime::RuntimeOptions;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The standard flags of a service (every flag also reads an `EVENTFOLD_*` environment
/// variable).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// Address to serve HTTP on (HTTPS only, with --tls-cert).
    #[arg(long, env = "EVENTFOLD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Serve HTTPS only, with this certificate chain (PEM, the service's certificate
    /// first); needs --tls-key.
    #[arg(long, env = "EVENTFOLD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "EVENTFOLD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Kafka mode: CA certificates (PEM) trusted besides the system's when forwarding a
    /// read to an instance serving HTTPS, e.g. the private CA that signed the instances'
    /// certificates.
    #[arg(long, env = "EVENTFOLD_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Directory of the embedded store; by default `$XDG_DATA_HOME/eventfold/<app-id>`, or
    /// `~/.local/share/eventfold/<app-id>` when `XDG_DATA_HOME` is not set.
    #[arg(long, env = "EVENTFOLD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Kafka bootstrap servers; absent: the embedded log. In Kafka mode the events, states
    /// and outcomes live in `<app-id>.<type>.{events,state,results}` (created when
    /// missing) and the data directory is only a cache, restored from those topics.
    #[arg(long, env = "EVENTFOLD_KAFKA")]
    pub kafka: Option<String>,
    /// Application id: the topic prefix (`<app-id>.<type>.events`); the service's name by
    /// default.
    #[arg(long, env = "EVENTFOLD_APP_ID", default_value = "eventfold")]
    pub app_id: String,
    /// Partitions per topic. Fixed when the data directory is created.
    #[arg(long, env = "EVENTFOLD_PARTITIONS", default_value_t = 8)]
    pub partitions: u32,
    /// Instance id (shown in /v1/cluster; used for routing in Kafka mode). Every instance
    /// of one app needs its own, stable across its restarts.
    #[arg(long, env = "EVENTFOLD_INSTANCE_ID", default_value = "local")]
    pub instance_id: String,
    /// Kafka mode: the base URL other instances forward reads to [default:
    /// http(s)://<--http>] (https with --tls-cert). Set it when --http listens on 0.0.0.0
    /// or behind a proxy.
    #[arg(long, env = "EVENTFOLD_ADVERTISED_HTTP")]
    pub advertised_http: Option<String>,
    /// How long an Idempotency-Key is remembered, in seconds.
    #[arg(long, env = "EVENTFOLD_DEDUP_WINDOW_SECS", default_value_t = 24 * 3600)]
    pub dedup_window_secs: u64,
    /// Largest accepted request body in bytes (larger: 413).
    #[arg(long, env = "EVENTFOLD_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
    /// Bearer tokens: a file of one token a line, `<name> <role> <sha256 hex of the
    /// token>` (roles read, write, admin; `<service> auth hash-token` makes a line).
    /// Every route but /healthz and /readyz then needs a token of enough role. Reloaded on
    /// SIGHUP (a file that does not parse keeps the tokens loaded before).
    #[arg(long, env = "EVENTFOLD_AUTH_TOKENS", value_name = "FILE")]
    pub auth_tokens: Option<PathBuf>,
    /// Serve without authentication on an address other than loopback (refused without
    /// this flag or --auth-tokens). Only behind something that authenticates for it.
    #[arg(long, env = "EVENTFOLD_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// With --auth-tokens, /metrics needs a token too (role read); without it /metrics is
    /// open.
    #[arg(long, env = "EVENTFOLD_METRICS_AUTH")]
    pub metrics_auth: bool,
    /// With --auth-tokens: requests a second each token may send on average (0: no
    /// limit); over it, 429 with Retry-After.
    #[arg(long, env = "EVENTFOLD_RATE_LIMIT_PER_TOKEN", default_value_t = RateLimit::default().per_second)]
    pub rate_limit_per_token: u32,
    /// With --auth-tokens: requests a token may send at once after a quiet spell (its
    /// bucket's size).
    #[arg(long, env = "EVENTFOLD_RATE_LIMIT_BURST", default_value_t = RateLimit::default().burst, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_limit_burst: u32,
    /// Requests handled at once (over every route but /healthz and /readyz); one more
    /// gets 503 `overloaded` with Retry-After.
    #[arg(long, env = "EVENTFOLD_MAX_CONCURRENT_REQUESTS", default_value_t = HttpOptions::default().max_in_flight, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_concurrent_requests: usize,
    /// Connections open at once; further ones wait in the kernel's accept queue until one
    /// closes.
    #[arg(long, env = "EVENTFOLD_MAX_CONNECTIONS", default_value_t = ServerLimits::default().max_connections, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers, from when it connects or got its
    /// previous answer (so also the idle timeout of a kept-alive connection); then the
    /// connection is closed.
    #[arg(long, env = "EVENTFOLD_HEADER_READ_TIMEOUT_SECS", default_value_t = ServerLimits::default().header_read_timeout.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_secs: u64,
    /// Seconds a request's body may take to arrive after its headers; then 408 and the
    /// connection is closed.
    #[arg(long, env = "EVENTFOLD_BODY_READ_TIMEOUT_SECS", default_value_t = HttpOptions::default().body_read_timeout.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout_secs: u64,
    /// Do not run the service's process managers: aggregates then change only through the
    /// commands clients send; what the process managers would read waits for a start
    /// without this flag.
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
    /// Aggregates of each type kept in memory, over all partitions (split evenly between
    /// them): the bound on the command path's memory; 0 keeps none between batches (every
    /// command loads its aggregate from the store).
    #[arg(long, env = "EVENTFOLD_CACHE_LIMIT", value_name = "N", default_value_t = RuntimeOptions::default().cache_limit)]
    pub cache_limit: usize,
    /// Memory of the local store, in MiB (at least 128): a quarter is its block cache,
    /// the rest bounds the writes its memtables hold before they are flushed (the
    /// journal kept).
    #[arg(long, env = "EVENTFOLD_STORE_MEMORY_MB", value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(128..=1 << 20))]
    pub store_memory_mb: u64,
    /// Disable fsync of commits. Unsafe: only for throwaway benchmarks.
    #[arg(long, env = "EVENTFOLD_NO_FSYNC")]
    pub no_fsync: bool,
    /// Embedded log: nice value of the thread every commit passes through (Linux); 0
    /// leaves it at the process's (the default: over HTTP a raised committer preempts the
    /// request handling at every fsync completion, which cost more than it gained). A
    /// negative value suits loads whose commits queue behind busy cores. Raising it needs
    /// CAP_SYS_NICE (root) or `ulimit -e 30`; without either the service logs that and
    /// runs at normal priority.
    #[arg(long, env = "EVENTFOLD_COMMITTER_NICE", default_value_t = eventfold_log::embedded::DEFAULT_COMMITTER_NICE, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub committer_nice: i32,
    /// Nice value of the store's background threads (flushes, compactions; Linux), so
    /// that they take a core only when request handling leaves one; 0 leaves them at the
    /// process's. Lowering a priority needs no privilege.
    #[arg(long, env = "EVENTFOLD_BACKGROUND_NICE", default_value_t = eventfold_store::DEFAULT_BACKGROUND_NICE, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
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
    /// Kafka mode: replication factor of the topics this service creates (existing topics
    /// keep theirs). 1 suits a single test broker only: use at least 2 (3 with the
    /// brokers' `min.insync.replicas=2`) in production.
    #[arg(long, env = "EVENTFOLD_KAFKA_REPLICATION_FACTOR", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=32))]
    pub kafka_replication_factor: i32,
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

    /// Refuses flag values that cannot work, with the flag's name.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.partitions == 0 || self.partitions > 1024 {
            anyhow::bail!("--partitions must be between 1 and 1024, got {}", self.partitions);
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            anyhow::bail!("--tls-cert and --tls-key go together: give both (HTTPS) or neither (HTTP)");
        }
        if self.auth_tokens.is_some() && self.insecure_no_auth {
            anyhow::bail!("--auth-tokens and --insecure-no-auth contradict each other: give one");
        }
        // Secure by default: beyond this machine, a service answers strangers only if told.
        if !self.http.ip().to_canonical().is_loopback() && self.auth_tokens.is_none() && !self.insecure_no_auth {
            anyhow::bail!(
                "--http {} is not a loopback address, and anyone who can reach it could run any command: \
                 give --auth-tokens FILE (bearer tokens; see docs/operations.md, \"Securing a deployment\"), \
                 or --insecure-no-auth to serve without authentication",
                self.http
            );
        }
        Ok(())
    }

    /// The scheme the service answers in: `https` with --tls-cert.
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls_cert.is_some() { "https" } else { "http" }
    }

    /// The server's certificate and key (None: plain HTTP). A file that does not parse
    /// stops the start, naming it.
    pub(crate) fn tls(&self) -> anyhow::Result<Option<Tls>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let tls = Tls::from_pem_files(cert, key).context("--tls-cert/--tls-key: cannot serve HTTPS")?;
        Ok(Some(tls))
    }

    /// What forwarding trusts: with --tls-ca, the system's CAs and that file's; None: the
    /// system's alone (the forwarder's default).
    pub(crate) fn forward_tls(&self) -> anyhow::Result<Option<Arc<ClientConfig>>> {
        let Some(path) = &self.tls_ca else {
            return Ok(None);
        };
        let certs = tls::certificates(path).context("--tls-ca: cannot trust it")?;
        let config = tls::client_config(certs).with_context(|| format!("--tls-ca {}", path.display()))?;
        Ok(Some(Arc::new(config)))
    }

    /// The token file's options from the flags.
    pub(crate) fn auth_options(&self) -> AuthOptions {
        AuthOptions {
            rate: RateLimit {
                per_second: self.rate_limit_per_token,
                burst: self.rate_limit_burst,
            },
            protect_metrics: self.metrics_auth,
        }
    }

    /// The limits of the connections.
    pub(crate) fn server_limits(&self) -> ServerLimits {
        ServerLimits {
            max_connections: self.max_connections,
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
        }
    }

    /// The Kafka log's options from the flags.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn kafka_options(&self, bootstrap: &str) -> KafkaOptions {
        KafkaOptions {
            committers: self.kafka_committers,
            producers_per_committer: self.kafka_producers_per_committer,
            min_transaction_interval: Duration::from_millis(self.kafka_min_transaction_interval_ms),
            transaction_quiet: (self.kafka_transaction_quiet_us > 0)
                .then(|| Duration::from_micros(self.kafka_transaction_quiet_us)),
            operation_timeout: Duration::from_secs(self.kafka_timeout_secs.max(1)),
            session_timeout: Duration::from_secs(self.kafka_session_timeout_secs.clamp(6, 1800)),
            transaction_timeout: Duration::from_secs(self.kafka_transaction_timeout_secs.max(1)),
            client_config: self.kafka_config.clone(),
            topics: eventfold_log::kafka::TopicDefaults {
                replication_factor: self.kafka_replication_factor,
                ..Default::default()
            },
            ..KafkaOptions::new(
                bootstrap,
                self.partitions,
                format!("{}-{}", self.app_id, self.instance_id),
            )
        }
    }
}
