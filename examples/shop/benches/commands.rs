//! In-process command throughput: the shop's `order` aggregate on the embedded log with
//! fsync on, driven by N concurrent submitters without HTTP. Prints the median of runs.
//!
//! `cargo bench -p shop --bench commands -- [--concurrency 64] [--seconds 5] [--runs 3]
//! [--fsync 1] [--committer-nice -10] [--background-nice 10] [--huge-pages 0]
//! [--cache-limit 100000] [--state-every 8] [--interval 0]`
//!
//! `--interval N` prints the rate of every N seconds of a run as it goes (0: none), to
//! see whether a long run slows down as its store grows.

use eventfold::log::embedded::{EmbeddedLog, Options};
use eventfold::log::priority::Applied;
use eventfold::runtime::{CommandRequest, Runtime, RuntimeOptions};
use eventfold::store::{Store, StoreOptions};
use shop::domain::Order;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Thread priorities of a run: the log's committer, the store's background threads.
#[derive(Clone, Copy)]
struct Nice {
    committer: i32,
    background: i32,
}

/// What a run varies besides the load.
#[derive(Clone, Copy)]
struct Setup {
    fsync: bool,
    nice: Nice,
    /// `RuntimeOptions::cache_limit`: aggregates kept in memory over all partitions.
    cache_limit: usize,
    /// `RuntimeOptions::state_every`: an aggregate's state is stored every N versions.
    state_every: u64,
    /// Seconds between progress lines (0: none).
    interval: u64,
}

async fn run_once(concurrency: u64, seconds: u64, setup: Setup) -> (f64, Vec<u64>) {
    let Setup {
        fsync,
        nice,
        cache_limit,
        state_every,
        interval,
    } = setup;
    let dir = tempfile::tempdir().unwrap();
    let store_options = StoreOptions {
        background_nice: nice.background,
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), &store_options).unwrap();
    let log = EmbeddedLog::open(
        store,
        Options {
            fsync,
            committer_nice: nice.committer,
            ..Default::default()
        },
    )
    .unwrap();
    if let Applied::Refused { .. } = log.committer_priority() {
        eprintln!(
            "  committer priority: {:?} (run as root or with `ulimit -e 30`)",
            log.committer_priority()
        );
    }
    let log: Arc<dyn eventfold::log::Log> = Arc::new(log);
    let rt = Runtime::builder(RuntimeOptions {
        app_id: "bench".into(),
        cache_limit,
        state_every,
        ..Default::default()
    })
    .aggregate::<Order>(())
    .build(log.clone());
    rt.wait_restored(Duration::from_secs(10)).await;
    let svc = rt.aggregate("order").unwrap().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let started = Instant::now();
    for w in 0..concurrency {
        let (svc, stop, done) = (svc.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let req = CommandRequest {
                    aggregate_id: format!("o-{w}-{i}"),
                    body: format!(r#"{{"type":"PlaceOrder","customer_id":"c{w}","items":[{{"sku":"s","qty":1,"price_cents":100}}]}}"#).into_bytes(),
                    ..Default::default()
                };
                svc.submit(req).await.expect("accepted");
                lat.push(t.elapsed().as_micros() as u64);
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            lat
        }));
    }
    if interval == 0 {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
    } else {
        let (mut last, mut last_s) = (0, 0);
        for s in (interval..seconds).step_by(interval as usize).chain([seconds]) {
            tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
            let now = done.load(Ordering::Relaxed);
            eprintln!(
                "    {s:>4} s: {:.0} commands/s",
                (now - last) as f64 / (s - last_s) as f64
            );
            (last, last_s) = (now, s);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let n = lat.len();
    let pct = |p: f64| lat[((n as f64 * p) as usize).min(n - 1)];
    let stats = log.stats();
    eprintln!(
        "  run: {:.0} commands/s, {} group commits ({:.1} commands, {:.1} units per fsync; committer busy {:.0}%, writing {:.0}%), p50 {} us, p99 {} us",
        n as f64 / elapsed,
        stats.group_commits,
        n as f64 / stats.group_commits.max(1) as f64,
        stats.units as f64 / stats.group_commits.max(1) as f64,
        stats.busy_micros as f64 / 1e4 / elapsed,
        stats.write_micros as f64 / 1e4 / elapsed,
        pct(0.5),
        pct(0.99)
    );
    (n as f64 / elapsed, vec![pct(0.5), pct(0.99)])
}

fn main() {
    let concurrency = arg("--concurrency", 64);
    let seconds = arg("--seconds", 5);
    let runs = arg("--runs", 3);
    let fsync = arg("--fsync", 1u64) == 1;
    // Nice values (0: as the process); the shop's defaults otherwise. The background one is
    // process-wide: the first run's value holds for all runs.
    let nice = Nice {
        committer: arg("--committer-nice", eventfold::log::embedded::IN_PROCESS_COMMITTER_NICE),
        background: arg("--background-nice", eventfold::store::DEFAULT_BACKGROUND_NICE),
    };
    // As the shop binary does; `--huge-pages 1` keeps them, to compare.
    let huge_pages = arg("--huge-pages", 0u64) == 1;
    let cache_limit = arg("--cache-limit", RuntimeOptions::default().cache_limit);
    let state_every = arg("--state-every", RuntimeOptions::default().state_every);
    let setup = Setup {
        fsync,
        nice,
        cache_limit,
        state_every,
        interval: arg("--interval", 0),
    };
    if !huge_pages {
        eventfold::process::disable_transparent_huge_pages().expect("prctl(PR_SET_THP_DISABLE)");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    eprintln!(
        "in-process PlaceOrder, {concurrency} submitters, {seconds} s x {runs} runs, fsync {fsync}, committer nice {}, background nice {}, huge pages {huge_pages}, cache limit {cache_limit}, state every {state_every}, {} cores",
        nice.committer,
        nice.background,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    let mut results: Vec<(f64, Vec<u64>)> = (0..runs)
        .map(|_| rt.block_on(run_once(concurrency, seconds, setup)))
        .collect();
    results.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (tput, pcts) = &results[results.len() / 2];
    println!("median: {tput:.0} commands/s (p50 {} us, p99 {} us)", pcts[0], pcts[1]);
}
