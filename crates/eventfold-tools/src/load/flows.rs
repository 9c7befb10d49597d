//! The `flows` workload: the shop's order flow (DESIGN §7) end to end over HTTP.
//!
//! Each flow places a fresh order (`PlaceOrder`), confirms it (`ConfirmOrder`), and then
//! waits until the order reads `shipped`: the shop's process manager `order_flow` reacts to
//! `OrderConfirmed` with `AuthorizePayment` on `pay-{order}`, and to `PaymentAuthorized`
//! with `ShipOrder` on the order. The flow latency runs from the `ConfirmOrder` answer to
//! the first read that shows the order shipped; the rate is that of completed flows.
//!
//! With a rate the generator runs open loop, as [`super::run`] does: flow `n` is due at
//! `start + n / rate`, and how late flows started against that schedule is reported
//! (`start_lag`). Without one, each of `concurrency` workers runs flows back to back
//! (closed loop): the rate of completed flows is then the most the service sustains with
//! that many flows in flight.
//!
//! How a flow sees its end: it polls `GET /v1/aggregates/order/{id}` every
//! `poll_interval` on its worker's keep-alive connection, with `If-None-Match` set to the
//! version the `ConfirmOrder` answer gave, so that until the order changes the service
//! answers 304 with no body. Following the order's events over SSE instead
//! (`Accept: text/event-stream`) would see `OrderShipped` the moment it is committed, but
//! costs more on a 2-core machine shared with the service: an SSE response holds its
//! connection, so every flow would open (and the service accept) a connection of its own,
//! and the service wakes every open stream on every commit of any order (one broadcast
//! channel per aggregate type, each stream filtering for its id), which at 2,000 flows/s
//! (6,000 order commits/s) and some dozens of flows in flight is some 10^5 wake-ups a
//! second. A poll costs a request on an open connection; the price is resolution: a
//! flow's latency is over-stated by at most one `poll_interval` (half of it on average).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use reqwest::Url;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::{self, Instant};

use super::client::{Call, Connection, Reply, Target};
use super::{CONCURRENCY_MAX, Latency, Limit, RETRIES_MAX, Workload, backoff, drive, lock, micros, micros_histogram};

/// `PlaceOrder` of every flow: one item of 1.00, well under the shop's default decline
/// limit, so that every payment is authorized and every flow ends in `OrderShipped`.
pub const PLACE_ORDER_BODY: &str =
    r#"{"type":"PlaceOrder","customer_id":"flow-c{worker}","items":[{"sku":"sku-1","qty":1,"price_cents":100}]}"#;
const CONFIRM_ORDER_BODY: &str = r#"{"type":"ConfirmOrder"}"#;

/// What to run, where, and for how long. [`Default`]: `http://127.0.0.1:8080`, 10 s, 64
/// workers, closed loop, a poll every 2 ms, 10 s for a flow to complete.
#[derive(Debug, Clone)]
pub struct FlowOptions {
    /// Base URL of the shop, e.g. `http://127.0.0.1:8080` (plain HTTP only).
    pub url: String,
    /// Prefix of every order id: `{prefix}{run_id}-{n}`.
    pub id_prefix: String,
    /// Concurrent workers, each with one connection: the most flows in flight.
    pub concurrency: usize,
    /// When the measured phase ends (flows started; each is then awaited).
    pub limit: Limit,
    /// Flows started per second (open loop); `None` = closed loop, as fast as possible.
    pub rate: Option<f64>,
    /// Flows are run but not measured for this long first.
    pub warmup: Duration,
    /// Retries of a command on transport errors and 503, always with the same key.
    pub retries: u32,
    /// Upper bound on any wait between retries, including a server's `Retry-After`.
    pub retry_after_max: Duration,
    /// Timeout of one HTTP attempt.
    pub timeout: Duration,
    /// A flow not shipped this long after its `ConfirmOrder` answer did not complete.
    pub flow_timeout: Duration,
    /// Time between two reads of a confirmed order.
    pub poll_interval: Duration,
    /// Largest fraction of flows that may end otherwise than shipped for
    /// [`FlowSummary::check`] to pass.
    pub max_error_rate: f64,
    /// Seed of the retry jitter; `None` picks one at random.
    pub seed: Option<u64>,
    /// Draw a progress bar on stderr (hidden when stderr is not a terminal).
    pub progress: bool,
    /// Bearer token sent with every request (a service with `--auth-tokens`).
    pub token: Option<String>,
}

impl Default for FlowOptions {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8080".to_owned(),
            id_prefix: "flow-".to_owned(),
            concurrency: 64,
            limit: Limit::Duration(Duration::from_secs(10)),
            rate: None,
            warmup: Duration::ZERO,
            retries: 3,
            retry_after_max: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            flow_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(2),
            max_error_rate: 0.01,
            seed: None,
            progress: false,
            token: None,
        }
    }
}

impl FlowOptions {
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
                "rate {rate} must be a positive number of flows per second"
            );
        }
        ensure!(
            self.retries <= RETRIES_MAX,
            "retries {} exceeds the limit {RETRIES_MAX}",
            self.retries
        );
        ensure!(!self.timeout.is_zero(), "timeout must be positive");
        ensure!(!self.flow_timeout.is_zero(), "flow timeout must be positive");
        ensure!(!self.poll_interval.is_zero(), "poll interval must be positive");
        ensure!(
            (0.0..=1.0).contains(&self.max_error_rate),
            "max error rate {} is outside 0..=1",
            self.max_error_rate
        );
        Ok(())
    }
}

/// Runs flows until `opts.limit` is reached and every flow started has ended.
pub async fn run(opts: FlowOptions) -> anyhow::Result<FlowSummary> {
    run_until(opts, std::future::pending()).await
}

/// Like [`run`], but starts no new flow once `shutdown` completes (the flows in flight are
/// still awaited); the summary then says `interrupted`.
pub async fn run_until(opts: FlowOptions, shutdown: impl Future<Output = ()>) -> anyhow::Result<FlowSummary> {
    opts.validate()?;
    let shared = Arc::new(Shared::new(&opts)?);
    let seed = opts.seed.unwrap_or_else(rand::random);
    let interrupted = drive(&shared, opts.concurrency, seed, opts.progress, "flow worker", shutdown).await?;
    Ok(shared.summary(&opts, interrupted))
}

/// Result of a flows run. Counts cover only the measured phase (after warmup).
#[derive(Debug, Clone)]
pub struct FlowSummary {
    /// `{url}/v1/aggregates/order/{id}`, the orders the flows ran on.
    pub url: String,
    /// Random token in every order id and idempotency key of this run.
    pub run_id: String,
    /// Measured flows started (and ended: each is awaited).
    pub flows: u64,
    /// Flows whose order read `shipped` within the flow timeout.
    pub completed: u64,
    /// Flows whose order was still not shipped `flow_timeout` after its confirmation.
    pub timed_out: u64,
    /// Flows whose order ended `cancelled` (e.g. its payment declined).
    pub cancelled: u64,
    /// Flows whose `PlaceOrder` or `ConfirmOrder` failed (refused, an error status or a
    /// transport error after the retries).
    pub commands_failed: u64,
    /// Flows run during the warm-up, excluded from everything else.
    pub warmup_flows: u64,
    /// Extra command attempts made by retries.
    pub retries: u64,
    /// Reads of confirmed orders (measured flows).
    pub polls: u64,
    /// Measured interval: end of warmup to the last flow's end.
    pub elapsed: Duration,
    /// The `--rate` target, if any.
    pub target_rate: Option<f64>,
    /// `ConfirmOrder` answer to the read that showed the order shipped (completed flows).
    pub latency_ms: Latency,
    /// Flow start (its scheduled instant with a rate) to the `ConfirmOrder` answer: the
    /// two commands (completed flows).
    pub commands_ms: Latency,
    /// Flow start (scheduled instant with a rate) to shipped read (completed flows).
    pub flow_ms: Latency,
    /// With a rate: how late flows started against their schedule.
    pub start_lag_ms: Option<Latency>,
    /// Connections opened (each worker's first, and after an error), warm-up included.
    pub connects: u64,
    /// [`FlowOptions::poll_interval`] of the run.
    pub poll_interval: Duration,
    /// [`FlowOptions::flow_timeout`] of the run.
    pub flow_timeout: Duration,
    /// Threshold used by [`FlowSummary::check`].
    pub max_error_rate: f64,
    /// The run was stopped by the shutdown signal before reaching its limit.
    pub interrupted: bool,
    /// One failure, to show what went wrong.
    pub first_error: Option<String>,
}

impl FlowSummary {
    /// Measured flows that did not end shipped.
    pub fn failed(&self) -> u64 {
        self.flows - self.completed
    }

    /// Fraction of measured flows that did not end shipped (0 when there were none).
    pub fn error_rate(&self) -> f64 {
        if self.flows == 0 {
            return 0.0;
        }
        self.failed() as f64 / self.flows as f64
    }

    /// Completed flows per second over the measured interval.
    pub fn throughput_per_s(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds == 0.0 {
            return 0.0;
        }
        self.completed as f64 / seconds
    }

    /// Whether flows completed and few enough did not.
    pub fn passed(&self) -> bool {
        self.check().is_ok()
    }

    /// Explains why the run failed, if it did.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.completed == 0 {
            bail!("no flow completed ({} started)", self.flows);
        }
        if self.error_rate() > self.max_error_rate {
            bail!(
                "{} of {} flows did not complete ({} not shipped within {:?}, {} cancelled, {} with a failed \
                 command), more than the allowed {:.2}% (--max-error-rate)",
                self.failed(),
                self.flows,
                self.timed_out,
                self.flow_timeout,
                self.cancelled,
                self.commands_failed,
                self.max_error_rate * 100.0
            );
        }
        Ok(())
    }

    /// The summary as one JSON object, in the shape of the commands workload's
    /// (`throughput_per_s` and `latency_ms` are the completed flows' rate and latency;
    /// `failed` counts the flows that did not complete).
    pub fn to_json(&self) -> Value {
        json!({
            "workload": "flows",
            "url": self.url,
            "run_id": self.run_id,
            "flows": self.flows,
            "completed": self.completed,
            "failed": self.failed(),
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "commands_failed": self.commands_failed,
            "warmup_flows": self.warmup_flows,
            "retries": self.retries,
            "polls": self.polls,
            "error_rate": self.error_rate(),
            "max_error_rate": self.max_error_rate,
            "passed": self.passed(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput_per_s(),
            "target_rate_per_s": self.target_rate,
            "latency_ms": self.latency_ms.to_json(),
            "commands_ms": self.commands_ms.to_json(),
            "flow_ms": self.flow_ms.to_json(),
            "start_lag_ms": self.start_lag_ms.as_ref().map(Latency::to_json),
            "connects": self.connects,
            "poll_interval_ms": self.poll_interval.as_secs_f64() * 1000.0,
            "flow_timeout_s": self.flow_timeout.as_secs_f64(),
            "interrupted": self.interrupted,
            "first_error": self.first_error,
        })
    }
}

impl fmt::Display for FlowSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "flows on {}  (run {})", self.url, self.run_id)?;
        write!(
            f,
            "{} flows in {:.3} s: {} completed, {:.1} completed flows/s",
            self.flows,
            self.elapsed.as_secs_f64(),
            self.completed,
            self.throughput_per_s()
        )?;
        if let Some(rate) = self.target_rate {
            write!(f, " (target {rate:.1})")?;
        }
        writeln!(
            f,
            ", {} warmup flows excluded{}",
            self.warmup_flows,
            if self.interrupted { ", interrupted" } else { "" }
        )?;
        writeln!(
            f,
            "not completed: {} not shipped within {:?}, {} cancelled, {} with a failed command; {} retries, \
             {} polls (every {:?})",
            self.timed_out,
            self.flow_timeout,
            self.cancelled,
            self.commands_failed,
            self.retries,
            self.polls,
            self.poll_interval
        )?;
        if let Some(error) = &self.first_error {
            writeln!(f, "  e.g. {error}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  ms         {:>9} {:>9} {:>9} {:>9} {:>9}",
            "p50", "p90", "p99", "p99.9", "max"
        )?;
        let mut row = |name: &str, l: &Latency, note: &str| {
            writeln!(
                f,
                "  {name:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  {note}",
                l.p50, l.p90, l.p99, l.p99_9, l.max
            )
        };
        row(
            "shipped",
            &self.latency_ms,
            "(ConfirmOrder answer to OrderShipped read)",
        )?;
        row("commands", &self.commands_ms, "(start to ConfirmOrder answer)")?;
        row("flow", &self.flow_ms, "(start to OrderShipped read)")?;
        if let Some(l) = &self.start_lag_ms {
            row(
                "start lag",
                l,
                "(started late against the schedule: the generator was behind)",
            )?;
        }
        writeln!(f)?;
        let verdict = match self.check() {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("FAILED: {e}"),
        };
        write!(
            f,
            "not completed {:.2}% ({} flows, max {:.2}%): {verdict}",
            self.error_rate() * 100.0,
            self.failed(),
            self.max_error_rate * 100.0
        )
    }
}

/// How one flow ended.
enum Outcome {
    Shipped {
        /// Start to `ConfirmOrder` answer.
        commands: Duration,
        /// `ConfirmOrder` answer to the read that showed it shipped.
        shipped: Duration,
        polls: u64,
    },
    Cancelled {
        polls: u64,
    },
    TimedOut {
        polls: u64,
        last: String,
    },
    CommandFailed(String),
}

/// State shared by the workers of one run.
struct Shared {
    target: Target,
    /// `{base path}/v1/aggregates/order/`, the order id appended per flow.
    order_path: String,
    id_prefix: String,
    run_id: String,
    rate: Option<f64>,
    retries: u32,
    retry_after_max: Duration,
    timeout: Duration,
    flow_timeout: Duration,
    poll_interval: Duration,
    start: Instant,
    warmup_end: Instant,
    end: Option<Instant>,
    count: Option<u64>,
    next_n: AtomicU64,
    slots_taken: AtomicU64,
    tally: Mutex<Tally>,
}

impl Shared {
    fn new(opts: &FlowOptions) -> anyhow::Result<Self> {
        let url = Url::parse(&opts.url)?;
        let target = Target::of(&url, opts.token.as_deref())?;
        let order_path = format!("{}/v1/aggregates/order/", url.path().trim_end_matches('/'));
        let start = Instant::now();
        let warmup_end = start + opts.warmup;
        let (end, count) = match opts.limit {
            Limit::Duration(duration) => (Some(warmup_end + duration), None),
            Limit::Count(count) => (None, Some(count)),
        };
        Ok(Self {
            target,
            order_path,
            id_prefix: opts.id_prefix.clone(),
            run_id: format!("{:012x}", rand::random::<u64>() >> 16),
            rate: opts.rate,
            retries: opts.retries,
            retry_after_max: opts.retry_after_max,
            timeout: opts.timeout,
            flow_timeout: opts.flow_timeout,
            poll_interval: opts.poll_interval,
            start,
            warmup_end,
            end,
            count,
            next_n: AtomicU64::new(0),
            slots_taken: AtomicU64::new(0),
            tally: Mutex::new(Tally::new()),
        })
    }

    /// Runs flows until the limit or the stop signal; the same schedule as the commands
    /// workload's workers (`super::Shared::worker`).
    async fn worker(self: Arc<Self>, worker: usize, mut stop: watch::Receiver<bool>, mut rng: StdRng) {
        let mut connection = Connection::default();
        loop {
            if *stop.borrow() {
                return;
            }
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
            let mut retries = 0;
            let outcome = self
                .flow(&mut connection, n, worker, intended, &mut rng, &mut retries)
                .await;
            let done = Instant::now();
            let mut tally = lock(&self.tally);
            if connection.take_connect_time().is_some() {
                tally.connects += 1;
            }
            if measured {
                tally.record(outcome, retries, began.saturating_duration_since(intended), done);
            } else {
                tally.warmup_flows += 1;
            }
        }
    }

    /// One flow: place, confirm, then read the order until it is shipped (or cancelled,
    /// or the flow timeout passes).
    async fn flow(
        &self,
        connection: &mut Connection,
        n: u64,
        worker: usize,
        started: Instant,
        rng: &mut StdRng,
        retries: &mut u32,
    ) -> Outcome {
        let id = format!("{}{}-{n}", self.id_prefix, self.run_id);
        let path = format!("{}{id}", self.order_path);
        let commands = format!("{path}/commands");
        let place = Bytes::from(PLACE_ORDER_BODY.replace("{worker}", &worker.to_string()));
        let key = format!("{}-{n}-place", self.run_id);
        if let Err(e) = self.command(connection, &commands, &key, place, rng, retries).await {
            return Outcome::CommandFailed(format!("PlaceOrder on {id}: {e}"));
        }
        let key = format!("{}-{n}-confirm", self.run_id);
        let confirm = Bytes::from_static(CONFIRM_ORDER_BODY.as_bytes());
        let answer = match self.command(connection, &commands, &key, confirm, rng, retries).await {
            Ok(answer) => answer,
            Err(e) => return Outcome::CommandFailed(format!("ConfirmOrder on {id}: {e}")),
        };
        let confirmed = Instant::now();
        // The answer's version is the confirmed order's ETag: until the order changes, a
        // read answers 304 without a body.
        let mut etag = version(&answer).map(|v| format!("\"{v}\""));
        let deadline = confirmed + self.flow_timeout;
        let mut polls = 0;
        let mut last = "no read answered yet".to_owned();
        let mut next = confirmed;
        loop {
            // One read in flight per flow: after a slow answer the next read goes at once,
            // then the interval again (no burst to catch up a schedule). The last read is
            // at the deadline.
            let now = Instant::now();
            if polls > 0 && now >= deadline {
                return Outcome::TimedOut { polls, last };
            }
            next = (next + self.poll_interval).max(now).min(deadline);
            time::sleep_until(next).await;
            let call = Call {
                path: &path,
                command: None,
                if_none_match: etag.as_deref(),
            };
            polls += 1;
            let reply = match connection.send(&self.target, call, self.timeout).await {
                Ok(reply) => reply,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match reply.status {
                304 => continue,
                200 => {}
                status => {
                    last = format!("GET {path}: status {status}: {}", String::from_utf8_lossy(&reply.body));
                    continue;
                }
            }
            let Ok(order) = serde_json::from_slice::<Value>(&reply.body) else {
                last = format!("GET {path}: not JSON: {}", String::from_utf8_lossy(&reply.body));
                continue;
            };
            match order["state"]["status"].as_str() {
                Some("shipped") => {
                    return Outcome::Shipped {
                        commands: confirmed.saturating_duration_since(started),
                        shipped: Instant::now() - confirmed,
                        polls,
                    };
                }
                Some("cancelled") => return Outcome::Cancelled { polls },
                status => {
                    last = format!("order {id} is {}", status.unwrap_or("without a status"));
                    etag = order["version"].as_u64().map(|v| format!("\"{v}\""));
                }
            }
        }
    }

    /// Sends a command, retrying transport errors and 503 with the same key; `Ok` with the
    /// answer's body on 2xx, `Err` with why otherwise (a 422 refusal included: a flow's
    /// commands must be accepted).
    async fn command(
        &self,
        connection: &mut Connection,
        path: &str,
        key: &str,
        body: Bytes,
        rng: &mut StdRng,
        retries: &mut u32,
    ) -> Result<Bytes, String> {
        let mut attempt = 0;
        loop {
            let call = Call {
                path,
                command: Some((key, body.clone())),
                if_none_match: None,
            };
            let delay = match connection.send(&self.target, call, self.timeout).await {
                Ok(Reply { status, body, .. }) if (200..300).contains(&status) => return Ok(body),
                Ok(Reply {
                    status: 503,
                    retry_after,
                    body,
                }) => {
                    if attempt >= self.retries {
                        return Err(format!("status 503: {}", String::from_utf8_lossy(&body)));
                    }
                    retry_after.unwrap_or_else(|| backoff(attempt, rng))
                }
                Ok(Reply { status, body, .. }) => {
                    return Err(format!("status {status}: {}", String::from_utf8_lossy(&body)));
                }
                Err(e) => {
                    if attempt >= self.retries {
                        return Err(e);
                    }
                    backoff(attempt, rng)
                }
            };
            attempt += 1;
            *retries += 1;
            time::sleep(delay.min(self.retry_after_max)).await;
        }
    }

    fn progress_bar(&self) -> ProgressBar {
        let (len, template) = match (self.count, self.end) {
            (Some(count), _) => (count, "{elapsed_precise} [{wide_bar}] {pos}/{len} {msg}"),
            (None, Some(end)) => (
                u64::try_from((end - self.start).as_millis()).unwrap_or(u64::MAX),
                "{elapsed_precise} [{wide_bar}] {msg}",
            ),
            (None, None) => unreachable!("a run has a count or an end"),
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("constant template is valid")
                .progress_chars("=> "),
        );
        bar
    }

    fn update_progress(&self, bar: &ProgressBar) {
        let now = Instant::now();
        let tally = lock(&self.tally);
        if self.count.is_some() {
            bar.set_position(tally.flows);
        } else {
            bar.set_position(u64::try_from((now - self.start).as_millis()).unwrap_or(u64::MAX));
        }
        if now < self.warmup_end {
            bar.set_message(format!("warming up, {} flows", tally.warmup_flows));
            return;
        }
        let seconds = (now - self.warmup_end).as_secs_f64();
        let rate = if seconds > 0.0 {
            tally.completed as f64 / seconds
        } else {
            0.0
        };
        bar.set_message(format!(
            "{} flows, {rate:.0} completed/s, {} not completed",
            tally.flows,
            tally.flows - tally.completed
        ));
    }

    fn summary(&self, opts: &FlowOptions, interrupted: bool) -> FlowSummary {
        let tally = lock(&self.tally);
        let finished = tally.last_done.unwrap_or_else(Instant::now);
        FlowSummary {
            url: format!("{}/v1/aggregates/order/{{id}}", opts.url.trim_end_matches('/')),
            run_id: self.run_id.clone(),
            flows: tally.flows,
            completed: tally.completed,
            timed_out: tally.timed_out,
            cancelled: tally.cancelled,
            commands_failed: tally.commands_failed,
            warmup_flows: tally.warmup_flows,
            retries: tally.retries,
            polls: tally.polls,
            elapsed: finished.saturating_duration_since(self.warmup_end),
            target_rate: opts.rate,
            latency_ms: Latency::from_histogram_us(&tally.shipped_us),
            commands_ms: Latency::from_histogram_us(&tally.commands_us),
            flow_ms: Latency::from_histogram_us(&tally.flow_us),
            start_lag_ms: opts.rate.map(|_| Latency::from_histogram_us(&tally.start_lag_us)),
            connects: tally.connects,
            poll_interval: opts.poll_interval,
            flow_timeout: opts.flow_timeout,
            max_error_rate: opts.max_error_rate,
            interrupted,
            first_error: tally.first_error.clone(),
        }
    }
}

/// `version` of a command's answer (`{aggregate_id, version, events, position}`).
fn version(answer: &[u8]) -> Option<u64> {
    serde_json::from_slice::<Value>(answer).ok()?["version"].as_u64()
}

/// Counters of the measured phase.
struct Tally {
    shipped_us: Histogram<u64>,
    commands_us: Histogram<u64>,
    flow_us: Histogram<u64>,
    start_lag_us: Histogram<u64>,
    flows: u64,
    completed: u64,
    timed_out: u64,
    cancelled: u64,
    commands_failed: u64,
    warmup_flows: u64,
    retries: u64,
    polls: u64,
    connects: u64,
    last_done: Option<Instant>,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Self {
            shipped_us: micros_histogram(),
            commands_us: micros_histogram(),
            flow_us: micros_histogram(),
            start_lag_us: micros_histogram(),
            flows: 0,
            completed: 0,
            timed_out: 0,
            cancelled: 0,
            commands_failed: 0,
            warmup_flows: 0,
            retries: 0,
            polls: 0,
            connects: 0,
            last_done: None,
            first_error: None,
        }
    }

    fn record(&mut self, outcome: Outcome, retries: u32, start_lag: Duration, done: Instant) {
        self.flows += 1;
        self.retries += u64::from(retries);
        self.start_lag_us.saturating_record(micros(start_lag));
        match outcome {
            Outcome::Shipped {
                commands,
                shipped,
                polls,
            } => {
                self.completed += 1;
                self.polls += polls;
                self.shipped_us.saturating_record(micros(shipped));
                self.commands_us.saturating_record(micros(commands));
                self.flow_us.saturating_record(micros(commands + shipped));
            }
            Outcome::Cancelled { polls } => {
                self.cancelled += 1;
                self.polls += polls;
                self.first_error
                    .get_or_insert_with(|| "an order was cancelled instead of shipped".to_owned());
            }
            Outcome::TimedOut { polls, last } => {
                self.timed_out += 1;
                self.polls += polls;
                self.first_error
                    .get_or_insert_with(|| format!("a flow did not complete in time; its last read: {last}"));
            }
            Outcome::CommandFailed(why) => {
                self.commands_failed += 1;
                self.first_error.get_or_insert(why);
            }
        }
        self.last_done = Some(self.last_done.map_or(done, |last| last.max(done)));
    }
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
    fn validation_rejects_bad_options() {
        assert!(FlowOptions::default().validate().is_ok());
        let bad = [
            FlowOptions {
                url: "https://x".into(),
                ..Default::default()
            },
            FlowOptions {
                concurrency: 0,
                ..Default::default()
            },
            FlowOptions {
                rate: Some(-1.0),
                ..Default::default()
            },
            FlowOptions {
                poll_interval: Duration::ZERO,
                ..Default::default()
            },
            FlowOptions {
                flow_timeout: Duration::ZERO,
                ..Default::default()
            },
        ];
        for opts in bad {
            assert!(opts.validate().is_err(), "{opts:?}");
        }
    }

    #[test]
    fn the_place_order_body_is_json() {
        let body = PLACE_ORDER_BODY.replace("{worker}", "3");
        let value: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["type"], "PlaceOrder");
        assert_eq!(value["customer_id"], "flow-c3");
        assert_eq!(version(br#"{"aggregate_id":"o","version":2,"events":[]}"#), Some(2));
        assert_eq!(version(b"nope"), None);
    }
}
