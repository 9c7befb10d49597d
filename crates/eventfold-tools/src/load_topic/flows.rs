//! The flows workload of `load-topic` (issue 53, Kafka mode): the shop's order flow driven
//! through the topics alone. Per flow, `PlaceOrder` then `ConfirmOrder` on a fresh order are
//! produced to `<app>.order.commands` (key = order id, so both land on its partition, in
//! order); whatever runs the flow (eventfold's process manager, or the Kafka Streams peer)
//! authorizes the payment and ships the order. A `read_committed` consumer of
//! `<app>.order.events` times each flow from its `OrderConfirmed` to its `OrderShipped`.
//!
//! The start of the clock is the `OrderConfirmed` event, not the `ConfirmOrder` result: both
//! systems commit a command's events and its result in one transaction, so they become
//! readable at the same instant, and `OrderConfirmed` sits on the same partition as the
//! `OrderShipped` that follows it, so one consumer reads them in order.
//!
//! Open loop with a `rate` (flow `n` starts at `start + n / rate`); closed loop otherwise, at
//! most `in_flight` flows started and not yet ended (shipped or cancelled). A flow is
//! measured when it starts after the warm-up; completed flows/s counts measured flows shipped
//! over the time from the end of the warm-up to the last of them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use hdrhistogram::Histogram;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::{Headers as _, Message};
use rdkafka::producer::{BaseRecord, Producer};
use serde_json::{Value, json};

use super::{MAX_COMMANDS, TopicLoadOptions, command_headers, consumer_at_end, lock, micros_since, produce, producer};
use crate::load::{LATENCY_US_MAX, Latency, Limit};

/// The `PlaceOrder` of every flow: one item of 1.00, below any decline limit, so the payment
/// is authorized and the order shipped. `{w}` is the customer, one of 64.
const PLACE_BODY: &str =
    r#"{"type":"PlaceOrder","customer_id":"c{w}","items":[{"sku":"sku-1","qty":1,"price_cents":100}]}"#;
const CONFIRM_BODY: &str = r#"{"type":"ConfirmOrder"}"#;

/// What the latency of a flow spans, as the JSON summary states it.
const LATENCY_SPAN: &str = "OrderConfirmed read on the events topic (committed in one transaction with the \
                            ConfirmOrder result) to OrderShipped read, both read_committed";

/// What one flows run measured.
#[derive(Debug, Clone)]
pub struct FlowTopicSummary {
    /// The topic the commands went to, `<app>.order.commands`.
    pub commands_topic: String,
    /// The topic the flows were timed on, `<app>.order.events`.
    pub events_topic: String,
    /// This run's id, 8 hex digits: command ids are `{run_id}-{n}-{step}`.
    pub run_id: String,
    /// Flows started (two commands each), the warm-up's included.
    pub flows: u64,
    /// Flows started during the warm-up: checked, not measured.
    pub warmup_flows: u64,
    /// Measured flows that ended shipped.
    pub completed: u64,
    /// Counts over every flow, the warm-up's included.
    pub counts: Counts,
    /// Flows with no terminal event within the result timeout.
    pub missing: u64,
    /// End of the warm-up to the last measured flow shipped.
    pub elapsed: Duration,
    /// Flows per second asked for; `None`: closed loop.
    pub target_rate: Option<f64>,
    /// The closed loop's window (`None` with a rate).
    pub in_flight: Option<usize>,
    /// `OrderConfirmed` read to `OrderShipped` read, measured flows that completed.
    pub latency_ms: Latency,
}

/// What the events consumer saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Flows that ended with `OrderShipped`.
    pub shipped: u64,
    /// Flows that ended with `OrderCancelled` (a declined payment: not expected here).
    pub cancelled: u64,
    /// A second terminal event for a flow that had ended (an exactly-once violation).
    pub duplicates: u64,
    /// A terminal event before the flow's `OrderConfirmed` was read.
    pub unconfirmed: u64,
}

impl FlowTopicSummary {
    /// Measured flows shipped per second.
    pub fn throughput_per_s(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds == 0.0 {
            0.0
        } else {
            self.completed as f64 / seconds
        }
    }

    /// Flows that did not end shipped exactly once.
    pub fn failed(&self) -> u64 {
        self.missing + self.counts.cancelled + self.counts.duplicates + self.counts.unconfirmed
    }

    /// Explains why the run failed: a flow that did not end shipped exactly once.
    pub fn check(&self) -> anyhow::Result<()> {
        ensure!(self.flows > 0, "no flows were started");
        let c = &self.counts;
        ensure!(
            self.missing == 0,
            "{} of {} flows did not end on {} within the result timeout",
            self.missing,
            self.flows,
            self.events_topic
        );
        ensure!(c.cancelled == 0, "{} flows ended cancelled, not shipped", c.cancelled);
        ensure!(c.duplicates == 0, "{} flows ended more than once", c.duplicates);
        ensure!(
            c.unconfirmed == 0,
            "{} flows ended before their OrderConfirmed was read",
            c.unconfirmed
        );
        Ok(())
    }

    /// The summary as `load-topic --workload flows --json` prints it.
    pub fn to_json(&self) -> Value {
        json!({
            "workload": "flows",
            "commands_topic": self.commands_topic,
            "events_topic": self.events_topic,
            "run_id": self.run_id,
            "requests": self.flows * 2,
            "flows": self.flows,
            "warmup_flows": self.warmup_flows,
            "completed": self.completed,
            "shipped": self.counts.shipped,
            "cancelled": self.counts.cancelled,
            "missing": self.missing,
            "duplicates": self.counts.duplicates,
            "unconfirmed": self.counts.unconfirmed,
            "failed": self.failed(),
            "passed": self.check().is_ok(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput_per_s(),
            "target_rate_per_s": self.target_rate,
            "in_flight": self.in_flight,
            "latency": LATENCY_SPAN,
            "latency_ms": self.latency_ms.to_json(),
        })
    }
}

impl std::fmt::Display for FlowTopicSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.counts;
        writeln!(
            f,
            "{} -> {}  (run {})",
            self.commands_topic, self.events_topic, self.run_id
        )?;
        write!(
            f,
            "{} flows ({} of them warm-up), {} measured shipped in {:.3} s: {:.1} completed flows/s",
            self.flows,
            self.warmup_flows,
            self.completed,
            self.elapsed.as_secs_f64(),
            self.throughput_per_s()
        )?;
        if let Some(rate) = self.target_rate {
            write!(f, " (target {rate:.1})")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  shipped {}  cancelled {}  missing {}  duplicates {}  unconfirmed {}",
            c.shipped, c.cancelled, self.missing, c.duplicates, c.unconfirmed
        )?;
        let l = &self.latency_ms;
        writeln!(
            f,
            "  OrderConfirmed-to-OrderShipped ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            l.p50, l.p90, l.p99, l.p99_9, l.max
        )?;
        match self.check() {
            Ok(()) => write!(f, "ok"),
            Err(e) => write!(f, "FAILED: {e}"),
        }
    }
}

/// A step of a flow, as read from the order's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Confirmed,
    Shipped,
    Cancelled,
}

impl Step {
    /// The step an order event of this type marks, if any (`OrderPlaced` marks none).
    fn of(event_type: &[u8]) -> Option<Self> {
        match event_type {
            b"OrderConfirmed" => Some(Self::Confirmed),
            b"OrderShipped" => Some(Self::Shipped),
            b"OrderCancelled" => Some(Self::Cancelled),
            _ => None,
        }
    }
}

/// The flows' progress as the events consumer sees it: pure, so its rules are unit-tested.
struct Tracker {
    /// µs after start at which flow `n`'s `OrderConfirmed` was read, plus one (0 = not yet).
    confirmed_at_us: Vec<u64>,
    ended: Vec<bool>,
    histogram: Histogram<u64>,
    counts: Counts,
    /// Measured flows shipped, and when the last of them was read (µs after start).
    completed: u64,
    last_completed_us: Option<u64>,
}

impl Tracker {
    fn new(capacity: usize) -> Self {
        Self {
            confirmed_at_us: vec![0; capacity],
            ended: vec![false; capacity],
            histogram: crate::load::micros_histogram(),
            counts: Counts::default(),
            completed: 0,
            last_completed_us: None,
        }
    }

    /// Records flow `n` reaching `step` at `at_us`; true when this ended the flow.
    fn record(&mut self, n: usize, step: Step, at_us: u64, measured: bool) -> bool {
        if n >= self.ended.len() {
            return false;
        }
        if step == Step::Confirmed {
            if self.confirmed_at_us[n] == 0 {
                self.confirmed_at_us[n] = at_us + 1;
            }
            return false;
        }
        if std::mem::replace(&mut self.ended[n], true) {
            self.counts.duplicates += 1;
            return false;
        }
        let confirmed = self.confirmed_at_us[n];
        if confirmed == 0 {
            self.counts.unconfirmed += 1;
            return true;
        }
        match step {
            Step::Cancelled => self.counts.cancelled += 1,
            Step::Shipped | Step::Confirmed => {
                self.counts.shipped += 1;
                if measured {
                    let latency = at_us.saturating_sub(confirmed - 1);
                    self.histogram.saturating_record(latency.clamp(1, LATENCY_US_MAX));
                    self.completed += 1;
                    self.last_completed_us = Some(at_us);
                }
            }
        }
        true
    }
}

/// The flow index of an order id of this run (`{prefix}{n}`), if it is one.
fn flow_index(key: &[u8], prefix: &str) -> Option<u64> {
    std::str::from_utf8(key).ok()?.strip_prefix(prefix)?.parse().ok()
}

/// Shared between the producing thread and the events consumer.
struct Shared {
    start: Instant,
    warmup_end: Instant,
    /// The first measured flow's `n` (`u64::MAX` until there is one).
    first_measured: AtomicU64,
    /// Flows started and flows ended.
    window: Mutex<(u64, u64)>,
    window_changed: Condvar,
    stop_consumer: AtomicBool,
}

/// Runs the flows workload and waits for every flow to end (or the result timeout).
pub fn run(opts: &TopicLoadOptions) -> anyhow::Result<FlowTopicSummary> {
    opts.validate()?;
    let commands_topic = opts.commands_topic();
    let events_topic = format!("{}.{}.events", opts.app, opts.aggregate_type);
    let run_id = format!("{:08x}", rand::random::<u32>());
    // Closed loop: room for 50k flows/s, far above what one broker takes here.
    let slots = |d: Duration| (d.as_secs_f64() * opts.rate.unwrap_or(50_000.0)).ceil() as u64 + 1;
    let capacity = match opts.limit {
        Limit::Count(n) => n + slots(opts.warmup),
        Limit::Duration(d) => slots(opts.warmup + d),
    }
    .min(MAX_COMMANDS / 2);

    let consumer = consumer_at_end(&opts.bootstrap, &[&events_topic])?;
    let producer = producer(&opts.bootstrap, opts.linger_ms)?;
    let start = Instant::now();
    let shared = Arc::new(Shared {
        start,
        warmup_end: start + opts.warmup,
        first_measured: AtomicU64::new(u64::MAX),
        window: Mutex::new((0, 0)),
        window_changed: Condvar::new(),
        stop_consumer: AtomicBool::new(false),
    });
    let prefix = format!("{}{run_id}-", opts.id_prefix);
    let consumer_thread = {
        let shared = Arc::clone(&shared);
        let prefix = prefix.clone();
        thread::Builder::new()
            .name("load-topic-events".into())
            .spawn(move || consume_events(&consumer, &shared, &prefix, capacity as usize))
            .context("spawning the events consumer")?
    };

    let deadline = match opts.limit {
        Limit::Duration(d) => Some(shared.warmup_end + d),
        Limit::Count(_) => None,
    };
    let past = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
    let mut n: u64 = 0;
    while n < capacity && !past(deadline) {
        let first = shared.first_measured.load(Ordering::Acquire);
        if let Limit::Count(count) = opts.limit
            && first != u64::MAX
            && n - first >= count
        {
            break;
        }
        let due = match opts.rate {
            Some(rate) => {
                let due = start + Duration::from_secs_f64(n as f64 / rate);
                let now = Instant::now();
                if due > now {
                    thread::sleep((due - now).min(Duration::from_millis(1)));
                    continue;
                }
                due
            }
            None => {
                let mut window = lock(&shared.window);
                while window.0 - window.1 >= opts.in_flight as u64 && !past(deadline) {
                    window = shared
                        .window_changed
                        .wait_timeout(window, Duration::from_millis(50))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                if past(deadline) {
                    break;
                }
                Instant::now()
            }
        };
        if first == u64::MAX && due >= shared.warmup_end {
            shared.first_measured.store(n, Ordering::Release);
        }
        let order = format!("{prefix}{n}");
        lock(&shared.window).0 += 1;
        for (step, ef_type, body) in [("p", "PlaceOrder", PLACE_BODY), ("c", "ConfirmOrder", CONFIRM_BODY)] {
            let command_id = format!("{run_id}-{n}-{step}");
            let body = body.replace("{w}", &(n % 64).to_string());
            let record = BaseRecord::to(&commands_topic)
                .key(order.as_bytes())
                .payload(body.as_bytes())
                .headers(command_headers(ef_type, &command_id));
            produce(&producer, record)?;
        }
        n += 1;
    }
    producer
        .flush(Duration::from_secs(30))
        .with_context(|| format!("flushing commands to {commands_topic}"))?;
    let flows = n;

    let wait_end = Instant::now() + opts.result_timeout;
    while lock(&shared.window).1 < flows && Instant::now() < wait_end {
        thread::sleep(Duration::from_millis(20));
    }
    // A short grace period to notice duplicates that trail the last flow.
    thread::sleep(Duration::from_millis(200));
    shared.stop_consumer.store(true, Ordering::Release);
    let tracker = consumer_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the events consumer panicked"))??;
    let ended = lock(&shared.window).1;
    let first = shared.first_measured.load(Ordering::Acquire);
    let last = tracker.last_completed_us.map(|us| start + Duration::from_micros(us));
    Ok(FlowTopicSummary {
        commands_topic,
        events_topic,
        run_id,
        flows,
        warmup_flows: if first == u64::MAX { flows } else { first },
        completed: tracker.completed,
        counts: tracker.counts,
        missing: flows.saturating_sub(ended),
        elapsed: last.map_or(Duration::ZERO, |l| l.saturating_duration_since(shared.warmup_end)),
        target_rate: opts.rate,
        in_flight: opts.rate.is_none().then_some(opts.in_flight),
        latency_ms: Latency::from_histogram_us(&tracker.histogram),
    })
}

fn consume_events(consumer: &BaseConsumer, shared: &Shared, prefix: &str, capacity: usize) -> anyhow::Result<Tracker> {
    let mut tracker = Tracker::new(capacity);
    while !shared.stop_consumer.load(Ordering::Acquire) {
        let Some(message) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let message = message.context("reading order events")?;
        let now = Instant::now();
        let Some(n) = message.key().and_then(|k| flow_index(k, prefix)) else {
            continue; // another run's order
        };
        let ef_type = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "ef-type").and_then(|h| h.value));
        let Some(step) = ef_type.and_then(Step::of) else {
            continue;
        };
        let measured = n >= shared.first_measured.load(Ordering::Acquire);
        if tracker.record(n as usize, step, micros_since(shared.start, now), measured) {
            lock(&shared.window).1 += 1;
            shared.window_changed.notify_one();
        }
    }
    Ok(tracker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_is_timed_from_its_confirmation_to_its_shipment() {
        let mut t = Tracker::new(4);
        assert!(!t.record(1, Step::Confirmed, 1_000, true));
        assert!(t.record(1, Step::Shipped, 31_000, true));
        assert_eq!(t.counts.shipped, 1);
        assert_eq!(t.completed, 1);
        assert_eq!(t.last_completed_us, Some(31_000));
        let ms = Latency::from_histogram_us(&t.histogram);
        assert!((ms.p50 - 30.0).abs() < 0.1, "{ms:?}");
    }

    #[test]
    fn warm_up_flows_are_counted_not_timed() {
        let mut t = Tracker::new(2);
        t.record(0, Step::Confirmed, 0, false);
        assert!(t.record(0, Step::Shipped, 5_000, false));
        assert_eq!((t.counts.shipped, t.completed, t.histogram.len()), (1, 0, 0));
        assert_eq!(t.last_completed_us, None);
    }

    #[test]
    fn a_second_end_is_a_duplicate_and_a_cancellation_is_not_a_completion() {
        let mut t = Tracker::new(3);
        t.record(0, Step::Confirmed, 0, true);
        assert!(t.record(0, Step::Shipped, 10, true));
        assert!(!t.record(0, Step::Shipped, 20, true));
        assert!(!t.record(0, Step::Cancelled, 30, true));
        assert_eq!(t.counts.duplicates, 2);
        t.record(1, Step::Confirmed, 0, true);
        assert!(t.record(1, Step::Cancelled, 10, true));
        assert_eq!((t.counts.cancelled, t.completed), (1, 1));
        // An end with no confirmation read before it: counted, not timed.
        assert!(t.record(2, Step::Shipped, 10, true));
        assert_eq!((t.counts.unconfirmed, t.counts.shipped, t.histogram.len()), (1, 1, 1));
        // Out of range (another run's numbering): ignored.
        assert!(!t.record(7, Step::Shipped, 10, true));
    }

    #[test]
    fn order_ids_of_this_run_only() {
        assert_eq!(flow_index(b"load-ab12-42", "load-ab12-"), Some(42));
        assert_eq!(flow_index(b"load-ffff-42", "load-ab12-"), None);
        assert_eq!(flow_index(b"load-ab12-x", "load-ab12-"), None);
        assert_eq!(Step::of(b"OrderPlaced"), None);
        assert_eq!(Step::of(b"OrderShipped"), Some(Step::Shipped));
    }

    #[test]
    fn the_summary_fails_on_any_flow_not_shipped_exactly_once() {
        let ok = FlowTopicSummary {
            commands_topic: "a.order.commands".into(),
            events_topic: "a.order.events".into(),
            run_id: "r".into(),
            flows: 10,
            warmup_flows: 2,
            completed: 8,
            counts: Counts {
                shipped: 10,
                ..Counts::default()
            },
            missing: 0,
            elapsed: Duration::from_secs(2),
            target_rate: None,
            in_flight: Some(4),
            latency_ms: Latency::from_histogram_us(&crate::load::micros_histogram()),
        };
        ok.check().unwrap();
        assert_eq!(ok.throughput_per_s(), 4.0);
        assert_eq!(ok.to_json()["requests"], 20);
        let missing = FlowTopicSummary {
            missing: 1,
            ..ok.clone()
        };
        assert!(missing.check().unwrap_err().to_string().contains("did not end"));
        let cancelled = FlowTopicSummary {
            counts: Counts {
                cancelled: 1,
                ..ok.counts
            },
            ..ok.clone()
        };
        assert_eq!(cancelled.failed(), 1);
        assert!(cancelled.check().is_err());
    }
}
