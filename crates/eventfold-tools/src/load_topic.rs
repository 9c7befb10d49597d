//! Load generator for the Kafka command path: produces commands straight to
//! `<app>.<type>.commands` (key = aggregate id, JSON value, `ef-type` and `ef-command-id`
//! headers, murmur2 partitioning like any Kafka client) and measures command-to-result
//! latency with its own `read_committed` consumer of `<app>.<type>.results`, matching results
//! to commands by their key (the command id).
//!
//! It talks to topics only, so it measures any service that follows DESIGN §2: eventfold in
//! Kafka mode, or the Kafka Streams peer of the benchmark suite.
//!
//! Closed loop by default: at most `in_flight` commands are awaiting their result; with a
//! `rate`, open loop: command `n` is due at `start + n / rate` and its latency counts from
//! that instant (no coordinated omission). With a `warmup`, the commands due in its first
//! stretch are produced and checked like the others (missing, duplicates) but left out of
//! the latency and the rate: they meet the start of the producer and of the results
//! consumer. Every command id is `{run_id}-{n}`, so results
//! of other runs on the same topic are ignored, and a result seen twice is reported as a
//! duplicate (an exactly-once violation).
//!
//! [`flows`] is the other workload: the shop's order flow, timed on the events topic.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use crate::load::{LATENCY_US_MAX, Latency, Limit, Preset, Template};

pub mod flows;

/// What to produce, where, and how fast.
#[derive(Debug, Clone)]
pub struct TopicLoadOptions {
    /// Kafka bootstrap servers, e.g. `127.0.0.1:9092`.
    pub bootstrap: String,
    /// Topic prefix (the service's app id), e.g. `shop`.
    pub app: String,
    /// Aggregate type: topics are `<app>.<type>.commands` and `<app>.<type>.results`.
    pub aggregate_type: String,
    /// Command body template; `{id}`, `{n}` and `{worker}` are substituted (`{worker}` is
    /// `n % 64`, so templates shared with `eventfold load` behave alike).
    pub body: String,
    /// Prefix of every (fresh) aggregate id: `{prefix}{run_id}-{n}`.
    pub id_prefix: String,
    /// When to stop producing: after this many measured commands, or this long after the
    /// warm-up.
    pub limit: Limit,
    /// Produce for this long first without measuring (latency, rate): the commands of the
    /// clients' own start. Their results are still awaited and checked.
    pub warmup: Duration,
    /// Commands per second (open loop); `None` = as fast as the window allows.
    pub rate: Option<f64>,
    /// Most commands awaiting their result at once (closed loop window).
    pub in_flight: usize,
    /// How long to wait for the last results after producing stopped.
    pub result_timeout: Duration,
    /// Producer `linger.ms`.
    pub linger_ms: u32,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for TopicLoadOptions {
    fn default() -> Self {
        Self {
            bootstrap: "127.0.0.1:9092".to_owned(),
            app: "shop".to_owned(),
            aggregate_type: "order".to_owned(),
            body: Preset::SHOP_ORDERS_BODY.to_owned(),
            id_prefix: "load-".to_owned(),
            limit: Limit::Duration(Duration::from_secs(10)),
            warmup: Duration::ZERO,
            rate: None,
            in_flight: 4096,
            result_timeout: Duration::from_secs(30),
            linger_ms: 2,
            progress: false,
        }
    }
}

impl TopicLoadOptions {
    fn commands_topic(&self) -> String {
        format!("{}.{}.commands", self.app, self.aggregate_type)
    }

    fn results_topic(&self) -> String {
        format!("{}.{}.results", self.app, self.aggregate_type)
    }

    /// Rejects options that cannot make a meaningful run.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(!self.bootstrap.is_empty(), "--bootstrap must not be empty");
        ensure!(
            !self.app.is_empty() && !self.aggregate_type.is_empty(),
            "--app and --type must not be empty"
        );
        ensure!(self.in_flight >= 1, "--in-flight must be at least 1");
        if let Some(rate) = self.rate {
            ensure!(rate.is_finite() && rate > 0.0, "--rate must be positive, got {rate}");
        }
        match self.limit {
            Limit::Count(0) => bail!("--count must be at least 1"),
            Limit::Duration(d) if d.is_zero() => bail!("--duration must be positive"),
            _ => {}
        }
        let sample = Template::parse(&self.body).render("id", 0, 0);
        let value: Value = serde_json::from_str(&sample).context("--body is not valid JSON after substitution")?;
        ensure!(
            value.get("type").and_then(Value::as_str).is_some(),
            "--body must be a JSON object with a string \"type\" (it becomes the ef-type header)"
        );
        Ok(())
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct TopicSummary {
    /// The topic the commands went to, `<app>.<type>.commands`.
    pub commands_topic: String,
    /// The topic the results were read from, `<app>.<type>.results`.
    pub results_topic: String,
    /// This run's id, 8 hex digits: command ids are `{run_id}-{n}`.
    pub run_id: String,
    /// Commands produced, the warm-up's included.
    pub sent: u64,
    /// Commands produced during the warm-up: checked, not measured.
    pub warmup_commands: u64,
    /// Results of measured commands.
    pub measured: u64,
    /// Results with an `accepted` outcome (the warm-up's included, like the counts below).
    pub accepted: u64,
    /// Results with a `rejected` outcome.
    pub rejected: u64,
    /// Commands whose result never arrived within the result timeout.
    pub missing: u64,
    /// Results seen more than once for the same command id.
    pub duplicates: u64,
    /// End of the warm-up (the first send without one) to the last measured result.
    pub elapsed: Duration,
    /// Commands per second asked for ([`TopicLoadOptions::rate`]); `None`: closed loop.
    pub target_rate: Option<f64>,
    /// Command produced (its scheduled instant with a rate) to its result read, measured
    /// commands.
    pub latency_ms: Latency,
}

impl TopicSummary {
    /// Results of measured commands per second over the measured run.
    pub fn throughput_per_s(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds == 0.0 {
            0.0
        } else {
            self.measured as f64 / seconds
        }
    }

    /// Explains why the run failed: a missing or duplicated result.
    pub fn check(&self) -> anyhow::Result<()> {
        ensure!(self.sent > 0, "no commands were produced");
        ensure!(
            self.missing == 0,
            "{} of {} results never arrived on {}",
            self.missing,
            self.sent,
            self.results_topic
        );
        ensure!(
            self.duplicates == 0,
            "{} results arrived more than once",
            self.duplicates
        );
        Ok(())
    }

    /// The summary as `load-topic --json` prints it.
    pub fn to_json(&self) -> Value {
        json!({
            "commands_topic": self.commands_topic,
            "results_topic": self.results_topic,
            "run_id": self.run_id,
            "requests": self.sent,
            "warmup_commands": self.warmup_commands,
            "measured": self.measured,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "passed": self.check().is_ok(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput_per_s(),
            "target_rate_per_s": self.target_rate,
            "latency_ms": self.latency_ms.to_json(),
        })
    }
}

impl std::fmt::Display for TopicSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} -> {}  (run {})",
            self.commands_topic, self.results_topic, self.run_id
        )?;
        write!(
            f,
            "{} commands ({} of them warm-up), {} measured results in {:.3} s: {:.1} commands/s",
            self.sent,
            self.warmup_commands,
            self.measured,
            self.elapsed.as_secs_f64(),
            self.throughput_per_s()
        )?;
        if let Some(rate) = self.target_rate {
            write!(f, " (target {rate:.1})")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  accepted {}  rejected {}  missing {}  duplicates {}",
            self.accepted, self.rejected, self.missing, self.duplicates
        )?;
        let l = &self.latency_ms;
        writeln!(
            f,
            "  command-to-result ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            l.p50, l.p90, l.p99, l.p99_9, l.max
        )?;
        match self.check() {
            Ok(()) => write!(f, "ok"),
            Err(e) => write!(f, "FAILED: {e}"),
        }
    }
}

/// Shared between the producing thread and the results consumer.
struct Shared {
    start: Instant,
    /// `start` + the warm-up: commands due from then on are measured.
    warmup_end: Instant,
    /// The first measured command's `n` (`u64::MAX` until there is one): results of
    /// commands before it are checked, not measured.
    first_measured: AtomicU64,
    /// Send (or due) instant of command `n`, µs after `start`, plus one (0 = not sent).
    sent_at_us: Vec<AtomicU64>,
    received: Vec<AtomicBool>,
    window: Mutex<Window>,
    window_changed: Condvar,
    stop_consumer: AtomicBool,
}

#[derive(Default)]
struct Window {
    sent: u64,
    done: u64,
    measured: u64,
    last_measured: Option<Instant>,
    accepted: u64,
    rejected: u64,
    duplicates: u64,
}

impl Shared {
    /// The first measured command's `n`, once the producer reached it.
    fn first_measured(&self) -> Option<u64> {
        Some(self.first_measured.load(Ordering::Acquire)).filter(|&n| n != u64::MAX)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Upper bound on commands one run may send (the per-command slots are preallocated).
const MAX_COMMANDS: u64 = 50_000_000;

/// Runs the load and waits for every result (or the result timeout).
pub fn run(opts: TopicLoadOptions) -> anyhow::Result<TopicSummary> {
    opts.validate()?;
    let commands_topic = opts.commands_topic();
    let results_topic = opts.results_topic();
    let run_id = format!("{:08x}", rand::random::<u32>());
    // Closed loop: enough for 200k commands/s, far above what one broker takes here.
    let slots = |d: Duration| (d.as_secs_f64() * opts.rate.unwrap_or(200_000.0)).ceil() as u64 + 1;
    let capacity = match opts.limit {
        Limit::Count(n) => n + slots(opts.warmup),
        Limit::Duration(d) => slots(opts.warmup + d),
    }
    .min(MAX_COMMANDS);

    let consumer = consumer_at_end(&opts.bootstrap, &[&results_topic])?;
    let producer = producer(&opts.bootstrap, opts.linger_ms)?;

    let start = Instant::now();
    let shared = Arc::new(Shared {
        start,
        warmup_end: start + opts.warmup,
        first_measured: AtomicU64::new(u64::MAX),
        sent_at_us: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        received: (0..capacity).map(|_| AtomicBool::new(false)).collect(),
        window: Mutex::new(Window::default()),
        window_changed: Condvar::new(),
        stop_consumer: AtomicBool::new(false),
    });
    let consumer_thread = {
        let shared = Arc::clone(&shared);
        let prefix = format!("{run_id}-");
        thread::Builder::new()
            .name("load-topic-results".into())
            .spawn(move || consume_results(&consumer, &shared, &prefix))
            .context("spawning the results consumer")?
    };

    let bar = progress_bar(opts.progress, opts.limit);
    let template = Template::parse(&opts.body);
    let ef_type = {
        let sample: Value = serde_json::from_str(&template.render("id", 0, 0))?;
        sample["type"].as_str().unwrap_or_default().to_owned()
    };
    let deadline = match opts.limit {
        Limit::Duration(d) => Some(shared.warmup_end + d),
        Limit::Count(_) => None,
    };
    let mut n: u64 = 0;
    let mut last_progress = Instant::now();
    while n < capacity {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        if let (Limit::Count(count), Some(first)) = (opts.limit, shared.first_measured())
            && n - first >= count
        {
            break;
        }
        let due = match opts.rate {
            Some(rate) => {
                let due = shared.start + Duration::from_secs_f64(n as f64 / rate);
                if due > now {
                    thread::sleep((due - now).min(Duration::from_millis(1)));
                    continue;
                }
                due
            }
            None => {
                let mut window = lock(&shared.window);
                while window.sent - window.done >= opts.in_flight as u64 {
                    window = shared
                        .window_changed
                        .wait_timeout(window, Duration::from_millis(50))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                Instant::now()
            }
        };
        if shared.first_measured().is_none() && due >= shared.warmup_end {
            // Before the command is produced: its result cannot be read before this.
            shared.first_measured.store(n, Ordering::Release);
        }
        let command_id = format!("{run_id}-{n}");
        let aggregate_id = format!("{}{command_id}", opts.id_prefix);
        let body = template.render(&aggregate_id, n, (n % 64) as usize);
        let headers = command_headers(&ef_type, &command_id);
        shared.sent_at_us[n as usize].store(micros_since(shared.start, due) + 1, Ordering::Release);
        lock(&shared.window).sent += 1;
        let record = BaseRecord::to(&commands_topic)
            .key(aggregate_id.as_bytes())
            .payload(body.as_bytes())
            .headers(headers);
        produce(&producer, record)?;
        n += 1;
        if last_progress.elapsed() >= Duration::from_millis(100) {
            last_progress = Instant::now();
            update_progress(&bar, &shared, opts.limit);
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .with_context(|| format!("flushing commands to {commands_topic}"))?;
    let sent = n;

    // Wait for the outstanding results.
    let wait_end = Instant::now() + opts.result_timeout;
    loop {
        let window = lock(&shared.window);
        if window.done >= sent || Instant::now() >= wait_end {
            break;
        }
        drop(window);
        update_progress(&bar, &shared, opts.limit);
        thread::sleep(Duration::from_millis(20));
    }
    // A short grace period to notice duplicates that trail the last result.
    thread::sleep(Duration::from_millis(200));
    shared.stop_consumer.store(true, Ordering::Release);
    let histogram = consumer_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the results consumer panicked"))??;
    bar.finish_and_clear();

    let window = lock(&shared.window);
    let end = window.last_measured.unwrap_or(shared.warmup_end);
    Ok(TopicSummary {
        commands_topic,
        results_topic,
        run_id,
        sent,
        warmup_commands: shared.first_measured().unwrap_or(sent),
        measured: window.measured,
        accepted: window.accepted,
        rejected: window.rejected,
        missing: sent.saturating_sub(window.done),
        duplicates: window.duplicates,
        elapsed: end.saturating_duration_since(shared.warmup_end),
        target_rate: opts.rate,
        latency_ms: Latency::from_histogram_us(&histogram),
    })
}

/// The idempotent, murmur2-partitioning producer both workloads send commands with (the
/// partitioner of Kafka's Java clients, so a command lands where the service expects it).
fn producer(bootstrap: &str, linger_ms: u32) -> anyhow::Result<ThreadedProducer<DefaultProducerContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms.to_string())
        .set("partitioner", "murmur2_random")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("creating the Kafka producer")
}

/// Queues one record, waiting while the producer's queue is full.
fn produce(
    producer: &ThreadedProducer<DefaultProducerContext>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                thread::sleep(Duration::from_millis(1));
            }
            Err((e, r)) => bail!("producing to {}: {e}", r.topic),
        }
    }
}

/// The headers of a command record: `ef-type`, `ef-command-id`, `content-type`.
fn command_headers(ef_type: &str, command_id: &str) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "ef-type",
            value: Some(ef_type),
        })
        .insert(Header {
            key: "ef-command-id",
            value: Some(command_id),
        })
        .insert(Header {
            key: "content-type",
            value: Some("application/json"),
        })
}

fn micros_since(start: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(start).as_micros()).unwrap_or(u64::MAX - 1)
}

/// A `read_committed` consumer assigned to every partition of `topics` at its current end,
/// so only records produced from now on are seen.
fn consumer_at_end(bootstrap: &str, topics: &[&str]) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("eventfold-load-topic-{:08x}", rand::random::<u32>()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "5")
        .create()
        .context("creating the results consumer")?;
    let timeout = Duration::from_secs(10);
    let mut assignment = TopicPartitionList::new();
    for &topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), timeout)
            .with_context(|| format!("reading metadata of {topic} from {bootstrap}"))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            bail!("topic {topic} does not exist on {bootstrap}: is the service running with this --app and --type?");
        }
        for p in partitions {
            let high = end_offset(&consumer, topic, p, timeout)?;
            assignment
                .add_partition_offset(topic, p, Offset::Offset(high))
                .context("building the assignment")?;
        }
    }
    consumer.assign(&assignment).context("assigning the partitions")?;
    Ok(consumer)
}

/// The high watermark of `topic/p`. A topic created a moment ago may not have a partition leader
/// yet, so errors are retried until `timeout` has passed; the last one is reported.
fn end_offset(consumer: &BaseConsumer, topic: &str, p: i32, timeout: Duration) -> anyhow::Result<i64> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, p, left.max(Duration::from_millis(100))) {
            Ok((_, high)) => return Ok(high),
            Err(_) if Instant::now() + Duration::from_millis(200) < deadline => {
                thread::sleep(Duration::from_millis(200))
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("reading the end offset of {topic}/{p}"))),
        }
    }
}

fn consume_results(consumer: &BaseConsumer, shared: &Shared, prefix: &str) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = crate::load::micros_histogram();
    while !shared.stop_consumer.load(Ordering::Acquire) {
        let Some(message) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let message = message.context("reading results")?;
        let now = Instant::now();
        let Some(n) = message
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| k.strip_prefix(prefix))
            .and_then(|k| k.parse::<u64>().ok())
        else {
            continue; // another run's result
        };
        let Some(sent_at) = shared.sent_at_us.get(n as usize) else {
            continue;
        };
        let sent_at = sent_at.load(Ordering::Acquire);
        let accepted = message.payload().is_some_and(|v| v.starts_with(b"{\"accepted\""));
        let mut window = lock(&shared.window);
        if shared.received[n as usize].swap(true, Ordering::AcqRel) {
            window.duplicates += 1;
            continue;
        }
        let measured = n >= shared.first_measured.load(Ordering::Acquire);
        if sent_at > 0 && measured {
            let latency = micros_since(shared.start, now).saturating_sub(sent_at - 1);
            histogram.saturating_record(latency.clamp(1, LATENCY_US_MAX));
        }
        window.done += 1;
        if measured {
            window.measured += 1;
            window.last_measured = Some(now);
        }
        if accepted {
            window.accepted += 1;
        } else {
            window.rejected += 1;
        }
        drop(window);
        shared.window_changed.notify_one();
    }
    Ok(histogram)
}

fn progress_bar(enabled: bool, limit: Limit) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let len = match limit {
        Limit::Count(n) => n,
        Limit::Duration(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {msg}")
            .expect("constant template is valid")
            .progress_chars("=> "),
    );
    bar
}

fn update_progress(bar: &ProgressBar, shared: &Shared, limit: Limit) {
    let window = lock(&shared.window);
    let now = Instant::now();
    if now < shared.warmup_end {
        bar.set_message(format!("warming up, {} sent, {} results", window.sent, window.done));
        return;
    }
    let elapsed = now - shared.warmup_end;
    let first = shared.first_measured().unwrap_or(window.sent);
    match limit {
        Limit::Count(_) => bar.set_position(window.sent - first),
        Limit::Duration(_) => bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
    }
    let rate = window.measured as f64 / elapsed.as_secs_f64().max(1e-9);
    bar.set_message(format!(
        "{} sent, {} results, {rate:.0} measured results/s",
        window.sent, window.done
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_bad_option() {
        let bad_body = TopicLoadOptions {
            body: "{\"no_type\":1}".into(),
            ..TopicLoadOptions::default()
        };
        assert!(bad_body.validate().unwrap_err().to_string().contains("\"type\""));
        let zero_window = TopicLoadOptions {
            in_flight: 0,
            ..TopicLoadOptions::default()
        };
        assert!(zero_window.validate().unwrap_err().to_string().contains("--in-flight"));
        let zero_count = TopicLoadOptions {
            limit: Limit::Count(0),
            ..TopicLoadOptions::default()
        };
        assert!(zero_count.validate().is_err());
        TopicLoadOptions::default().validate().unwrap();
    }

    #[test]
    fn topics_follow_the_design_layout() {
        let opts = TopicLoadOptions::default();
        assert_eq!(opts.commands_topic(), "shop.order.commands");
        assert_eq!(opts.results_topic(), "shop.order.results");
    }
}
