//! Durable timers at scale (issue 53): a process manager schedules one timer per placed
//! order an hour ahead; once `--timers` are pending, the clock (a `ManualClock`) moves two
//! hours on and every timer fires. Prints the resident memory at start, with the timers
//! pending and after they fired, and the firing rate. In-process, embedded log, fsync on.
//!
//! `cargo bench -p shop --bench timers -- [--timers 1000000] [--concurrency 64]
//! [--fsync 1] [--runs 1] [--without-pm 1]`
//!
//! `--without-pm 1` places the same orders without the process manager and prints the
//! resident memory then: the timers' share is the difference.
//!
//! The resident memory with the timers pending includes the orders' events and states in
//! the store's memtables (the aggregates' cache is held to 1,000 per partition).

use eventfold::log::embedded::{EmbeddedLog, Options};
use eventfold::runtime::{CommandRequest, ManualClock, Runtime, RuntimeOptions};
use eventfold::store::{Store, StoreOptions};
use eventfold::{Actions, EventMeta, Input, ProcessContext, ProcessManager, Subscription};
use serde::{Deserialize, Serialize};
use shop::domain::{Order, OrderEvent};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HOUR_MS: i64 = 3_600_000;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One timer per placed order, an hour after it; the flow ends when it fires.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Alarm {
    armed: bool,
}

impl ProcessManager for Alarm {
    const NAME: &'static str = "alarm";
    type Event = OrderEvent;
    type Config = ();
    fn subscriptions(_: &Self::Config) -> Vec<Subscription<OrderEvent>> {
        vec![Subscription::to::<Order>(|e| e)]
    }
    fn correlate(event: &OrderEvent, meta: &EventMeta<'_>) -> Option<String> {
        matches!(event, OrderEvent::OrderPlaced { .. }).then(|| meta.aggregate_id.to_owned())
    }
    fn react(&mut self, input: Input<'_, OrderEvent>, ctx: &ProcessContext<'_, ()>, actions: &mut Actions) {
        match input {
            Input::Event { .. } => {
                self.armed = true;
                actions.schedule_at("t", ctx.now_ms + HOUR_MS);
            }
            Input::Timer { .. } => actions.finish(),
            Input::Outcome(_) => {}
        }
    }
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn wait_for(rt: &Runtime, what: &str, limit: Duration, done: impl Fn(u64) -> bool) -> Duration {
    let t = Instant::now();
    loop {
        let pending = rt.process_manager("alarm").unwrap().report().timers_pending;
        if done(pending) {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "{what}: {pending} timers pending after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(timers: u64, concurrency: u64, fsync: bool, without_pm: bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let log = EmbeddedLog::open(
        store,
        Options {
            fsync,
            ..Default::default()
        },
    )
    .unwrap();
    let log: Arc<dyn eventfold::log::Log> = Arc::new(log);
    let clock = ManualClock::at(1_700_000_000_000);
    let builder = Runtime::builder(RuntimeOptions {
        app_id: "bench".into(),
        cache_limit: 1000,
        ..Default::default()
    })
    .clock(Arc::new(clock.clone()))
    .aggregate::<Order>(());
    let builder = if without_pm {
        builder
    } else {
        builder.process_manager::<Alarm>(())
    };
    let rt = builder.build(log.clone());
    rt.wait_restored(Duration::from_secs(10)).await;
    let rss_start = rss_mib();
    let svc = rt.aggregate("order").unwrap().clone();
    let next = Arc::new(AtomicU64::new(0));
    let placing = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (svc, next) = (svc.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= timers {
                    return;
                }
                let req = CommandRequest {
                    aggregate_id: format!("o-{i}"),
                    body: br#"{"type":"PlaceOrder","customer_id":"c","items":[{"sku":"s","qty":1,"price_cents":100}]}"#
                        .to_vec(),
                    ..Default::default()
                };
                svc.submit(req).await.expect("accepted");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let placed = placing.elapsed();
    if without_pm {
        // The same orders without the process manager: what the timers add is the
        // difference to the run with it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!(
            "{timers} orders without the process manager: placed in {:.1} s; RSS {rss_start:.0} MiB at start, {:.0} MiB after",
            placed.as_secs_f64(),
            rss_mib()
        );
        return;
    }
    let armed = wait_for(&rt, "arming", Duration::from_secs(600), |p| p >= timers).await;
    let rss_pending = rss_mib();
    clock.advance(2 * HOUR_MS);
    let fired = wait_for(&rt, "firing", Duration::from_secs(600), |p| p == 0).await;
    let rss_after = rss_mib();
    let report = rt.process_manager("alarm").unwrap().report();
    println!(
        "{timers} timers: orders placed in {:.1} s, all armed {:.1} s later; RSS {rss_start:.0} MiB at start, {rss_pending:.0} MiB with the timers pending (+{:.0} MiB), {rss_after:.0} MiB after they fired; fired in {:.2} s: {:.0} firings/s ({} reactions in all)",
        placed.as_secs_f64(),
        armed.as_secs_f64(),
        rss_pending - rss_start,
        fired.as_secs_f64(),
        timers as f64 / fired.as_secs_f64(),
        report.reactions,
    );
}

fn main() {
    let timers: u64 = arg("--timers", 1_000_000);
    let concurrency: u64 = arg("--concurrency", 64);
    let fsync = arg("--fsync", 1u8) != 0;
    let runs: u32 = arg("--runs", 1);
    let without_pm = arg("--without-pm", 0u8) != 0;
    println!(
        "durable timers, in-process, embedded log, fsync {fsync}, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..runs {
        rt.block_on(run(timers, concurrency, fsync, without_pm));
    }
}
