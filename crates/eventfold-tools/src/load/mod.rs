//! Load generator: drives `POST /v1/aggregates/{type}/{id}/commands` on any eventfold
//! service from many concurrent workers and summarises status codes, throughput and latency.
//!
//! [`run`] (or [`run_until`], which also takes a shutdown signal) sends commands until a
//! [`Limit`] is reached and returns a [`Summary`]; the `eventfold load` subcommand is a thin
//! CLI over it. Every logical request carries its own `Idempotency-Key`, and retries (on
//! transport errors and 503) reuse that key, so a retried command is applied at most once.
//!
//! With a target rate the generator runs open loop: request `n` is due at
//! `start + n / rate`, and its latency is measured from that intended send time rather than
//! from the moment a worker got round to sending it. A stalled server therefore shows up as
//! high latency instead of silently lowering the offered load (coordinated omission). How
//! late requests left against the schedule is reported too (`Summary::start_lag_ms`): a
//! generator short of workers or of CPU shows there, not only in the latency.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Url;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{self, Instant};

mod client;
pub mod flows;
use client::{Call, Connection, Target};

/// Most concurrent workers one run may start.
pub const CONCURRENCY_MAX: usize = 10_000;
/// Most retries of one logical request.
pub const RETRIES_MAX: u32 = 100;
/// Highest latency the histogram distinguishes; larger values are recorded as this.
pub(crate) const LATENCY_US_MAX: u64 = 3_600_000_000;
/// First backoff step when the server gives no `Retry-After`; doubles per retry.
const BACKOFF_BASE: Duration = Duration::from_millis(25);
/// How often the progress bar is refreshed.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// What to send, where, and for how long. [`Default`] is the `shop-orders` preset against
/// `http://127.0.0.1:8080` for 10 s from 64 workers.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Base URL of the service, e.g. `http://127.0.0.1:8080` (plain HTTP only).
    pub url: String,
    /// Aggregate type in the command path.
    pub aggregate_type: String,
    /// Command body template; `{id}`, `{n}` and `{worker}` are substituted per request.
    pub body: String,
    /// How aggregate ids are chosen.
    pub ids: Ids,
    /// Prefix of every aggregate id.
    pub id_prefix: String,
    /// Number of concurrent workers (also the connection pool size).
    pub concurrency: usize,
    /// When the measured phase ends.
    pub limit: Limit,
    /// Target requests per second across all workers (open loop); `None` = as fast as possible.
    pub rate: Option<f64>,
    /// Requests are sent but not measured for this long first.
    pub warmup: Duration,
    /// Retries per request on transport errors and 503, always with the same key.
    pub retries: u32,
    /// Upper bound on any wait between retries, including a server's `Retry-After`.
    pub retry_after_max: Duration,
    /// Timeout of one HTTP attempt.
    pub timeout: Duration,
    /// Largest fraction of failed requests for which [`Summary::check`] passes.
    pub max_error_rate: f64,
    /// Seed of the id choice; `None` picks one at random.
    pub seed: Option<u64>,
    /// Draw a progress bar on stderr (it stays hidden when stderr is not a terminal).
    pub progress: bool,
    /// Send `GET {url}{path}` instead of commands, with this path template (`{id}`, `{n}`
    /// and `{worker}` substituted), e.g. `/v1/views/orders/{id}`.
    pub get: Option<String>,
    /// Bearer token sent with every request (a service with `--auth-tokens`).
    pub token: Option<String>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let mut opts = Self {
            url: "http://127.0.0.1:8080".to_owned(),
            aggregate_type: String::new(),
            body: String::new(),
            ids: Ids::Fresh,
            id_prefix: "load-".to_owned(),
            concurrency: 64,
            limit: Limit::Duration(Duration::from_secs(10)),
            rate: None,
            warmup: Duration::ZERO,
            retries: 3,
            retry_after_max: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            max_error_rate: 0.01,
            seed: None,
            progress: false,
            get: None,
            token: None,
        };
        Preset::ShopOrders.apply(&mut opts);
        opts
    }
}

impl LoadOptions {
    /// Rejects options that cannot make a meaningful run, naming the offending value.
    pub fn validate(&self) -> anyhow::Result<()> {
        let url = Url::parse(&self.url).with_context(|| format!("invalid url {:?}", self.url))?;
        ensure!(
            url.scheme() == "http",
            "url {:?}: only plain http:// is supported (this build has no TLS)",
            self.url
        );
        ensure!(!url.cannot_be_a_base(), "url {:?} cannot carry a path", self.url);
        Target::of(&url, self.token.as_deref())?;
        ensure!(!self.aggregate_type.is_empty(), "aggregate type is empty");
        ensure!(
            (1..=CONCURRENCY_MAX).contains(&self.concurrency),
            "concurrency {} is outside 1..={CONCURRENCY_MAX}",
            self.concurrency
        );
        match self.limit {
            Limit::Count(count) => ensure!(count > 0, "count must be at least 1"),
            Limit::Duration(duration) => ensure!(!duration.is_zero(), "duration must be positive"),
        }
        if let Some(rate) = self.rate {
            ensure!(
                rate.is_finite() && rate > 0.0,
                "rate {rate} must be a positive number of requests per second"
            );
        }
        if let Some(path) = &self.get {
            ensure!(path.starts_with('/'), "GET path {path:?} must start with /");
        }
        if let Ids::Random { count } | Ids::Sequential { count } = self.ids {
            ensure!(count > 0, "number of distinct ids must be at least 1");
        }
        ensure!(
            self.retries <= RETRIES_MAX,
            "retries {} exceeds the limit {RETRIES_MAX}",
            self.retries
        );
        ensure!(!self.timeout.is_zero(), "timeout must be positive");
        ensure!(
            (0.0..=1.0).contains(&self.max_error_rate),
            "max error rate {} is outside 0..=1",
            self.max_error_rate
        );
        // Render one sample so a broken template fails before any request is sent.
        let sample = Template::parse(&self.body).render(&format!("{}0", self.id_prefix), 0, 0);
        serde_json::from_str::<Value>(&sample)
            .with_context(|| format!("body is not valid JSON once rendered: {sample}"))?;
        Ok(())
    }
}

/// When the measured phase of a run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// Send for this long after warmup.
    Duration(Duration),
    /// Send exactly this many measured requests after warmup.
    Count(u64),
}

/// How the aggregate id of each request is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// A new id per request, `{prefix}{run_id}-{n}`, unique across runs.
    Fresh,
    /// `{prefix}{k}` with `k` uniform in `0..count`.
    Random {
        /// How many ids: `k` is in `0..count`.
        count: u64,
    },
    /// `{prefix}{k}` with `k = n % count`.
    Sequential {
        /// How many ids before they repeat.
        count: u64,
    },
}

/// Built-in workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// `PlaceOrder` on a fresh `order` per request, so every command is accepted.
    ShopOrders,
}

impl Preset {
    /// The body of [`Preset::ShopOrders`]: one item of 1.00 for customer `c{worker}`.
    pub const SHOP_ORDERS_BODY: &str =
        r#"{"type":"PlaceOrder","customer_id":"c{worker}","items":[{"sku":"sku-1","qty":1,"price_cents":100}]}"#;

    /// Sets the aggregate type, body and id choice of this preset.
    pub fn apply(self, opts: &mut LoadOptions) {
        match self {
            Self::ShopOrders => {
                opts.aggregate_type = "order".to_owned();
                opts.body = Self::SHOP_ORDERS_BODY.to_owned();
                opts.ids = Ids::Fresh;
            }
        }
    }
}

/// Parses `500ms`, `10s`, `1.5s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 2m"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!("invalid duration unit {other:?} (use ms, s, m or h)"));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

/// Sends commands until `opts.limit` is reached.
pub async fn run(opts: LoadOptions) -> anyhow::Result<Summary> {
    run_until(opts, std::future::pending()).await
}

/// Like [`run`], but stops early (finishing requests in flight) once `shutdown` completes;
/// the summary then says `interrupted`.
pub async fn run_until(opts: LoadOptions, shutdown: impl Future<Output = ()>) -> anyhow::Result<Summary> {
    opts.validate()?;
    let shared = Arc::new(Shared::new(&opts)?);
    let seed = opts.seed.unwrap_or_else(rand::random);
    let interrupted = drive(&shared, opts.concurrency, seed, opts.progress, "load worker", shutdown).await?;
    Ok(shared.summary(&opts, interrupted))
}

/// A pool of workers sharing one state, run by [`drive`]: the command load and the flows.
pub(crate) trait Workload: Send + Sync + 'static {
    /// One worker's loop, until `stop` says so or its limit is reached.
    fn work(
        self: Arc<Self>,
        worker: usize,
        stop: watch::Receiver<bool>,
        rng: StdRng,
    ) -> impl Future<Output = ()> + Send;
    /// The progress bar of a run.
    fn progress_bar(&self) -> ProgressBar;
    /// Shows the counts so far on `bar`.
    fn update_progress(&self, bar: &ProgressBar);
}

/// Runs `concurrency` workers of `shared` (each with its own reproducible random stream
/// from `seed`) until they all end; once `shutdown` completes they are told to stop (what
/// is in flight finishes). Returns whether it was interrupted.
pub(crate) async fn drive<W: Workload>(
    shared: &Arc<W>,
    concurrency: usize,
    seed: u64,
    progress: bool,
    what: &'static str,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut workers = JoinSet::new();
    for worker in 0..concurrency {
        let rng = StdRng::seed_from_u64(seed ^ (worker as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        workers.spawn(Arc::clone(shared).work(worker, stop_rx.clone(), rng));
    }
    let bar = progress.then(|| shared.progress_bar());
    let mut tick = time::interval(PROGRESS_INTERVAL);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut interrupted = false;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                Some(result) => result.with_context(|| format!("{what} panicked"))?,
                None => break,
            },
            () = &mut shutdown, if !interrupted => {
                interrupted = true;
                stop_tx.send_replace(true);
            }
            _ = tick.tick(), if bar.is_some() => {
                if let Some(bar) = &bar {
                    shared.update_progress(bar);
                }
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(interrupted)
}

/// Result of a run. Counts cover only the measured phase (after warmup).
#[derive(Debug, Clone)]
pub struct Summary {
    /// Method and URL pattern, e.g. `POST http://host/v1/aggregates/order/{id}/commands`.
    pub url: String,
    /// Random token in every idempotency key (`{run_id}-{n}`) and fresh id of this run.
    pub run_id: String,
    /// Logical requests completed (retries not counted again).
    pub requests: u64,
    /// Requests completed during warmup, excluded from everything else.
    pub warmup_requests: u64,
    /// Final HTTP status of each request that got one.
    pub status: BTreeMap<u16, u64>,
    /// Requests that ended in a transport error (connect, reset, timeout).
    pub errors: u64,
    /// Extra attempts made by retries.
    pub retries: u64,
    /// Measured interval: end of warmup to the last completion.
    pub elapsed: Duration,
    /// The `--rate` target, if any.
    pub target_rate: Option<f64>,
    /// Latency percentiles in milliseconds.
    pub latency_ms: Latency,
    /// With `--rate`: how late requests left against their schedule, in milliseconds
    /// (their latency counts from the scheduled instant). A high start lag means the
    /// generator was behind (every worker busy, or no core for it), not the service.
    pub start_lag_ms: Option<Latency>,
    /// Requests, warm-up included, that opened a connection (each worker's first, and any
    /// after a failure or a `Connection: close`). Without a warm-up, the workers' first
    /// requests are measured and pay for it.
    pub connects: u64,
    /// How long opening a connection took those requests (TCP connect and HTTP/1.1
    /// handshake); `None` when none did.
    pub connect_ms: Option<Latency>,
    /// Threshold used by [`Summary::check`].
    pub max_error_rate: f64,
    /// The run was stopped by the shutdown signal before reaching its limit.
    pub interrupted: bool,
    /// One transport error message, to show what went wrong.
    pub first_error: Option<String>,
}

/// Latency percentiles in milliseconds (microsecond resolution).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// Percentiles of a histogram of microseconds, in milliseconds.
    pub fn from_histogram_us(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }

    /// `{p50, p90, p99, p99_9, max, mean}` in milliseconds.
    pub fn to_json(&self) -> Value {
        json!({
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "p99_9": self.p99_9,
            "max": self.max,
            "mean": self.mean,
        })
    }
}

/// Status codes that count as success: the command was accepted (2xx) or deliberately
/// rejected by the aggregate (422); both mean the service did its job.
pub fn is_success(status: u16) -> bool {
    (200..300).contains(&status) || status == 422
}

/// Status codes always shown in the summary, even when zero.
const STATUS_SHOWN: [u16; 5] = [200, 412, 422, 503, 504];

impl Summary {
    /// Requests that ended with `status`.
    pub fn status_count(&self, status: u16) -> u64 {
        self.status.get(&status).copied().unwrap_or(0)
    }

    /// Requests with a success status (see [`is_success`]).
    pub fn succeeded(&self) -> u64 {
        self.status
            .iter()
            .filter(|(status, _)| is_success(**status))
            .map(|(_, count)| count)
            .sum()
    }

    /// Requests with a failing status or a transport error.
    pub fn failed(&self) -> u64 {
        self.requests - self.succeeded()
    }

    /// Failed fraction of requests (0 when there were none).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.failed() as f64 / self.requests as f64
    }

    /// Completed requests per second over the measured interval.
    pub fn throughput_per_s(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds == 0.0 {
            return 0.0;
        }
        self.requests as f64 / seconds
    }

    /// Whether the run completed requests and stayed within the error-rate threshold.
    pub fn passed(&self) -> bool {
        self.check().is_ok()
    }

    /// Explains why the run failed, if it did.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.requests == 0 {
            bail!("no requests completed");
        }
        if self.error_rate() > self.max_error_rate {
            bail!(
                "{} of {} requests failed ({:.2}%), more than the allowed {:.2}% (--max-error-rate)",
                self.failed(),
                self.requests,
                self.error_rate() * 100.0,
                self.max_error_rate * 100.0
            );
        }
        Ok(())
    }

    /// The summary as one JSON object.
    pub fn to_json(&self) -> Value {
        let mut status = serde_json::Map::new();
        for code in STATUS_SHOWN {
            status.insert(code.to_string(), json!(self.status_count(code)));
        }
        for (code, count) in &self.status {
            status.insert(code.to_string(), json!(count));
        }
        status.insert("errors".to_owned(), json!(self.errors));
        let latency = &self.latency_ms;
        json!({
            "url": self.url,
            "run_id": self.run_id,
            "requests": self.requests,
            "warmup_requests": self.warmup_requests,
            "retries": self.retries,
            "status": status,
            "succeeded": self.succeeded(),
            "failed": self.failed(),
            "error_rate": self.error_rate(),
            "max_error_rate": self.max_error_rate,
            "passed": self.passed(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput_per_s(),
            "target_rate_per_s": self.target_rate,
            "latency_ms": latency.to_json(),
            "start_lag_ms": self.start_lag_ms.as_ref().map(Latency::to_json),
            "connects": self.connects,
            "connect_ms": self.connect_ms.as_ref().map(Latency::to_json),
            "interrupted": self.interrupted,
            "first_error": self.first_error,
        })
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}  (run {})", self.url, self.run_id)?;
        write!(
            f,
            "{} requests in {:.3} s: {:.1} req/s",
            self.requests,
            self.elapsed.as_secs_f64(),
            self.throughput_per_s()
        )?;
        if let Some(rate) = self.target_rate {
            write!(f, " (target {rate:.1})")?;
        }
        writeln!(
            f,
            ", {} retries, {} warmup requests excluded{}",
            self.retries,
            self.warmup_requests,
            if self.interrupted { ", interrupted" } else { "" }
        )?;
        writeln!(f)?;
        writeln!(f, "  status      requests")?;
        let others = self.status.keys().filter(|code| !STATUS_SHOWN.contains(code));
        let mut codes: Vec<u16> = STATUS_SHOWN.iter().copied().chain(others.copied()).collect();
        codes.sort_unstable();
        for code in codes {
            writeln!(f, "  {code:<8} {:>11}", self.status_count(code))?;
        }
        write!(f, "  {:<8} {:>11}", "errors", self.errors)?;
        if let Some(error) = &self.first_error {
            write!(f, "  (e.g. {error})")?;
        }
        writeln!(f)?;
        writeln!(f)?;
        let l = &self.latency_ms;
        writeln!(
            f,
            "  latency ms {:>9} {:>9} {:>9} {:>9} {:>9}",
            "p50", "p90", "p99", "p99.9", "max"
        )?;
        writeln!(
            f,
            "             {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            l.p50, l.p90, l.p99, l.p99_9, l.max
        )?;
        if let Some(l) = &self.start_lag_ms {
            writeln!(
                f,
                "  start lag  {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  (sent late against the schedule: the generator was behind)",
                l.p50, l.p90, l.p99, l.p99_9, l.max
            )?;
        }
        if let Some(l) = &self.connect_ms {
            writeln!(
                f,
                "  connect    {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  (opening a connection: {} requests, warm-up included)",
                l.p50, l.p90, l.p99, l.p99_9, l.max, self.connects
            )?;
        }
        writeln!(f)?;
        let verdict = match self.check() {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("FAILED: {e}"),
        };
        write!(
            f,
            "error rate {:.2}% ({} failed, max {:.2}%): {verdict}",
            self.error_rate() * 100.0,
            self.failed(),
            self.max_error_rate * 100.0
        )
    }
}

/// State shared by the workers of one run.
struct Shared {
    /// Where the connections go.
    target: Target,
    /// Timeout of one attempt.
    timeout: Duration,
    /// `{base}/v1/aggregates/{type}`; the id and `commands` are appended per request.
    type_url: Url,
    template: Template,
    /// `GET {base}{path}` per request instead of a command, when set.
    get: Option<(String, Template)>,
    ids: Ids,
    id_prefix: String,
    run_id: String,
    rate: Option<f64>,
    retries: u32,
    retry_after_max: Duration,
    start: Instant,
    warmup_end: Instant,
    /// End of the run in duration mode.
    end: Option<Instant>,
    /// Measured requests to send in count mode.
    count: Option<u64>,
    /// Next global sequence number `{n}`.
    next_n: AtomicU64,
    /// Measured request slots taken, in count mode.
    slots_taken: AtomicU64,
    tally: Mutex<Tally>,
}

/// How one logical request ended.
enum Response {
    Status(u16),
    Error(String),
}

/// One HTTP attempt.
enum Attempt {
    Status { status: u16, retry_after: Option<Duration> },
    Error(String),
}

impl Shared {
    fn new(opts: &LoadOptions) -> anyhow::Result<Self> {
        let mut type_url = Url::parse(&opts.url)?;
        let target = Target::of(&type_url, opts.token.as_deref())?;
        type_url
            .path_segments_mut()
            .map_err(|()| anyhow::anyhow!("url {:?} cannot carry a path", opts.url))?
            .pop_if_empty()
            .extend(["v1", "aggregates", &opts.aggregate_type]);
        let start = Instant::now();
        let warmup_end = start + opts.warmup;
        let (end, count) = match opts.limit {
            Limit::Duration(duration) => (Some(warmup_end + duration), None),
            Limit::Count(count) => (None, Some(count)),
        };
        Ok(Self {
            target,
            timeout: opts.timeout,
            type_url,
            template: Template::parse(&opts.body),
            get: opts
                .get
                .as_ref()
                .map(|path| (opts.url.trim_end_matches('/').to_owned(), Template::parse(path))),
            ids: opts.ids,
            id_prefix: opts.id_prefix.clone(),
            run_id: format!("{:012x}", rand::random::<u64>() >> 16),
            rate: opts.rate,
            retries: opts.retries,
            retry_after_max: opts.retry_after_max,
            start,
            warmup_end,
            end,
            count,
            next_n: AtomicU64::new(0),
            slots_taken: AtomicU64::new(0),
            tally: Mutex::new(Tally::new()),
        })
    }

    async fn worker(self: Arc<Self>, worker: usize, mut stop: watch::Receiver<bool>, mut rng: StdRng) {
        let mut connection = Connection::default();
        loop {
            if *stop.borrow() {
                return;
            }
            // Without a rate, a counted run past its warm-up takes its slot before its
            // sequence number: taken the other way round, a worker could take `n`, lose the
            // race for the last slot to a later `n`, and leave a gap in `{n}`.
            let slot_first = self.rate.is_none() && self.count.is_some() && Instant::now() >= self.warmup_end;
            if slot_first
                && let Some(count) = self.count
                && self.slots_taken.fetch_add(1, Ordering::Relaxed) >= count
            {
                return;
            }
            let n = self.next_n.fetch_add(1, Ordering::Relaxed);
            let intended = match self.rate {
                Some(rate) => self.start + Duration::from_secs_f64(n as f64 / rate),
                None => Instant::now(),
            };
            if self.end.is_some_and(|end| intended >= end) {
                return;
            }
            if self.rate.is_some() {
                tokio::select! {
                    () = time::sleep_until(intended) => {}
                    _ = stop.wait_for(|stopped| *stopped) => return,
                }
            }
            let measured = intended >= self.warmup_end;
            if measured
                && !slot_first
                && let Some(count) = self.count
                && self.slots_taken.fetch_add(1, Ordering::Relaxed) >= count
            {
                return;
            }
            let began = Instant::now();
            let (response, retries) = self.execute(&mut connection, n, worker, &mut rng, &stop).await;
            let done = Instant::now();
            let mut tally = lock(&self.tally);
            if let Some(connect) = connection.take_connect_time() {
                tally.record_connect(connect);
            }
            if measured {
                let timing = Timing {
                    latency: done - intended,
                    start_lag: began.saturating_duration_since(intended),
                    done,
                };
                tally.record(response, retries, timing);
            } else {
                tally.warmup_requests += 1;
            }
        }
    }

    /// Sends request `n`, retrying with the same idempotency key.
    async fn execute(
        &self,
        connection: &mut Connection,
        n: u64,
        worker: usize,
        rng: &mut StdRng,
        stop: &watch::Receiver<bool>,
    ) -> (Response, u32) {
        let id = match self.ids {
            Ids::Fresh => format!("{}{}-{n}", self.id_prefix, self.run_id),
            Ids::Random { count } => format!("{}{}", self.id_prefix, rng.random_range(0..count)),
            Ids::Sequential { count } => format!("{}{}", self.id_prefix, n % count),
        };
        let url = match &self.get {
            Some((base, path)) => match Url::parse(&format!("{base}{}", path.render(&id, n, worker))) {
                Ok(url) => url,
                Err(e) => return (Response::Error(format!("invalid GET url: {e}")), 0),
            },
            None => {
                let mut url = self.type_url.clone();
                url.path_segments_mut()
                    .expect("checked to be a base url")
                    .extend([id.as_str(), "commands"]);
                url
            }
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let body = bytes::Bytes::from(self.template.render(&id, n, worker));
        let key = format!("{}-{n}", self.run_id);
        let mut retries = 0;
        loop {
            let attempt = self.attempt(connection, &path, &key, &body).await;
            let delay = match &attempt {
                Attempt::Status {
                    status: 503,
                    retry_after,
                } => retry_after.unwrap_or_else(|| backoff(retries, rng)),
                Attempt::Error(_) => backoff(retries, rng),
                Attempt::Status { .. } => return (attempt.into_response(), retries),
            };
            if retries >= self.retries || *stop.borrow() {
                return (attempt.into_response(), retries);
            }
            retries += 1;
            time::sleep(delay.min(self.retry_after_max)).await;
        }
    }

    async fn attempt(&self, connection: &mut Connection, path: &str, key: &str, body: &bytes::Bytes) -> Attempt {
        let call = Call {
            path,
            command: self.get.is_none().then(|| (key, body.clone())),
            if_none_match: None,
        };
        match connection.send(&self.target, call, self.timeout).await {
            Ok(reply) => Attempt::Status {
                status: reply.status,
                retry_after: reply.retry_after,
            },
            Err(e) => Attempt::Error(e),
        }
    }

    fn progress_bar(&self) -> ProgressBar {
        let (len, template) = match (self.count, self.end) {
            (Some(count), _) => (count, "{elapsed_precise} [{wide_bar}] {pos}/{len} {msg}"),
            (None, Some(end)) => {
                let total_ms = (end - self.start).as_millis();
                (
                    u64::try_from(total_ms).unwrap_or(u64::MAX),
                    "{elapsed_precise} [{wide_bar}] {msg}",
                )
            }
            (None, None) => unreachable!("a run has a count or an end"),
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(template)
            .expect("constant template is valid")
            .progress_chars("=> ");
        bar.set_style(style);
        bar
    }

    fn update_progress(&self, bar: &ProgressBar) {
        let now = Instant::now();
        let tally = lock(&self.tally);
        if self.count.is_some() {
            bar.set_position(tally.requests);
        } else {
            let elapsed_ms = (now - self.start).as_millis();
            bar.set_position(u64::try_from(elapsed_ms).unwrap_or(u64::MAX));
        }
        if now < self.warmup_end {
            bar.set_message(format!("warming up, {} requests", tally.warmup_requests));
            return;
        }
        let seconds = (now - self.warmup_end).as_secs_f64();
        let rate = if seconds > 0.0 {
            tally.requests as f64 / seconds
        } else {
            0.0
        };
        let requests = if self.count.is_some() {
            String::new()
        } else {
            format!("{} requests, ", tally.requests)
        };
        bar.set_message(format!(
            "{requests}{rate:.0} req/s, {} failed, {} retries",
            tally.failed, tally.retries
        ));
    }

    fn summary(&self, opts: &LoadOptions, interrupted: bool) -> Summary {
        let tally = lock(&self.tally);
        let finished = tally.last_done.unwrap_or_else(Instant::now);
        let latency_ms = Latency::from_histogram_us(&tally.latency_us);
        let start_lag_ms = opts.rate.map(|_| Latency::from_histogram_us(&tally.start_lag_us));
        let connects = tally.connect_us.len();
        let connect_ms = (connects > 0).then(|| Latency::from_histogram_us(&tally.connect_us));
        let url = match &opts.get {
            Some(path) => format!("GET {}{path}", opts.url.trim_end_matches('/')),
            None => format!(
                "POST {}/v1/aggregates/{}/{{id}}/commands",
                opts.url.trim_end_matches('/'),
                opts.aggregate_type
            ),
        };
        let summary = Summary {
            url,
            run_id: self.run_id.clone(),
            requests: tally.requests,
            warmup_requests: tally.warmup_requests,
            status: tally.status.clone(),
            errors: tally.errors,
            retries: tally.retries,
            elapsed: finished.saturating_duration_since(self.warmup_end),
            target_rate: opts.rate,
            latency_ms,
            start_lag_ms,
            connects,
            connect_ms,
            max_error_rate: opts.max_error_rate,
            interrupted,
            first_error: tally.first_error.clone(),
        };
        debug_assert_eq!(
            summary.status.values().sum::<u64>() + summary.errors,
            summary.requests,
            "every request ends in a status or an error"
        );
        debug_assert_eq!(summary.failed(), tally.failed);
        summary
    }
}

impl Attempt {
    fn into_response(self) -> Response {
        match self {
            Self::Status { status, .. } => Response::Status(status),
            Self::Error(message) => Response::Error(message),
        }
    }
}

/// When a measured request was scheduled, sent and done, as `Tally::record` takes it.
struct Timing {
    /// Scheduled instant to completion.
    latency: Duration,
    /// Scheduled instant to the first attempt.
    start_lag: Duration,
    done: Instant,
}

/// `d` in whole microseconds for a histogram (at least 1, the histograms' lowest value).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// A histogram of microseconds up to `LATENCY_US_MAX`, 3 significant digits.
pub(crate) fn micros_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("constant histogram bounds are valid")
}

/// Counters of the measured phase.
struct Tally {
    latency_us: Histogram<u64>,
    /// Scheduled send instant to the actual send (`--rate` only).
    start_lag_us: Histogram<u64>,
    /// Connection opening times of the requests that opened one, warm-up included.
    connect_us: Histogram<u64>,
    status: BTreeMap<u16, u64>,
    requests: u64,
    failed: u64,
    errors: u64,
    retries: u64,
    warmup_requests: u64,
    last_done: Option<Instant>,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Self {
            latency_us: micros_histogram(),
            start_lag_us: micros_histogram(),
            connect_us: micros_histogram(),
            status: BTreeMap::new(),
            requests: 0,
            failed: 0,
            errors: 0,
            retries: 0,
            warmup_requests: 0,
            last_done: None,
            first_error: None,
        }
    }

    fn record_connect(&mut self, connect: Duration) {
        self.connect_us.saturating_record(micros(connect));
    }

    fn record(&mut self, response: Response, retries: u32, timing: Timing) {
        self.latency_us.saturating_record(micros(timing.latency));
        self.start_lag_us.saturating_record(micros(timing.start_lag));
        let done = timing.done;
        self.requests += 1;
        self.retries += u64::from(retries);
        match response {
            Response::Status(status) => {
                *self.status.entry(status).or_default() += 1;
                if !is_success(status) {
                    self.failed += 1;
                }
            }
            Response::Error(message) => {
                self.errors += 1;
                self.failed += 1;
                self.first_error.get_or_insert(message);
            }
        }
        self.last_done = Some(self.last_done.map_or(done, |last| last.max(done)));
    }
}

/// A body template split at its placeholders.
#[derive(Debug, Clone)]
pub(crate) struct Template(Vec<Part>);

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Id,
    N,
    Worker,
}

impl Template {
    pub(crate) fn parse(text: &str) -> Self {
        const PLACEHOLDERS: [(&str, Part); 3] = [("{id}", Part::Id), ("{n}", Part::N), ("{worker}", Part::Worker)];
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        'scan: while let Some(c) = rest.chars().next() {
            for (token, part) in &PLACEHOLDERS {
                if let Some(after) = rest.strip_prefix(token) {
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(part.clone());
                    rest = after;
                    continue 'scan;
                }
            }
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Self(parts)
    }

    pub(crate) fn render(&self, id: &str, n: u64, worker: usize) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for part in &self.0 {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Id => out.push_str(id),
                Part::N => write!(out, "{n}").expect("writing to a String cannot fail"),
                Part::Worker => write!(out, "{worker}").expect("writing to a String cannot fail"),
            }
        }
        out
    }
}

/// Exponential backoff with jitter for retries the server gave no delay for.
fn backoff(retry: u32, rng: &mut StdRng) -> Duration {
    let step = BACKOFF_BASE.saturating_mul(1 << retry.min(16));
    step.mul_f64(rng.random_range(0.5..=1.0))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding the tally, so a poisoned lock still holds valid counts.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Workload for Shared {
    fn work(
        self: Arc<Self>,
        worker: usize,
        stop: watch::Receiver<bool>,
        rng: StdRng,
    ) -> impl Future<Output = ()> + Send {
        self.worker(worker, stop, rng)
    }
    fn progress_bar(&self) -> ProgressBar {
        Shared::progress_bar(self)
    }
    fn update_progress(&self, bar: &ProgressBar) {
        Shared::update_progress(self, bar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_substitutes_placeholders() {
        let template = Template::parse(r#"{"id":"{id}","n":{n},"w":"c{worker}","x":"{idx}"}"#);
        assert_eq!(
            template.render("load-7", 42, 3),
            r#"{"id":"load-7","n":42,"w":"c3","x":"{idx}"}"#
        );
        assert_eq!(Template::parse("").render("a", 1, 2), "");
        assert_eq!(Template::parse("é{n}ü").render("a", 1, 2), "é1ü");
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn validation_rejects_bad_options() {
        assert!(LoadOptions::default().validate().is_ok());
        let bad = [
            LoadOptions {
                url: "https://x".into(),
                ..Default::default()
            },
            LoadOptions {
                concurrency: 0,
                ..Default::default()
            },
            LoadOptions {
                limit: Limit::Count(0),
                ..Default::default()
            },
            LoadOptions {
                rate: Some(0.0),
                ..Default::default()
            },
            LoadOptions {
                body: "{\"n\":{id}}".into(),
                ..Default::default()
            },
            LoadOptions {
                max_error_rate: 2.0,
                ..Default::default()
            },
        ];
        for opts in bad {
            assert!(opts.validate().is_err(), "{opts:?}");
        }
    }
}
