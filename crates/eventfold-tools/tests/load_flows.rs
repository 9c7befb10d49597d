//! `eventfold load --workload flows` against a real shop (the `shop` binary of
//! examples/shop on the embedded log, as a child process): every flow completes and is
//! checked from outside; a shop without its process manager leaves every flow not
//! completed, and one that declines every payment cancels them, and both fail the run.
//!
//! Cargo builds the `shop` binary only for the shop package's own tests, so this test
//! builds it first with the cargo that runs it (`cargo build -p shop`, a no-op when it is
//! fresh, as under `cargo test --workspace`) into the same target directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use eventfold_tools::load::Limit;
use eventfold_tools::load::flows::{self, FlowOptions, FlowSummary};
use serde_json::Value;

/// The `shop` binary beside this test's `eventfold`, built once per test process.
fn shop_binary() -> &'static Path {
    static SHOP: OnceLock<PathBuf> = OnceLock::new();
    SHOP.get_or_init(|| {
        let eventfold = Path::new(env!("CARGO_BIN_EXE_eventfold"));
        let profile_dir = eventfold.parent().expect("the binary is in a profile directory");
        let target_dir = profile_dir
            .parent()
            .expect("the profile directory is in the target directory");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut build = Command::new(cargo);
        build
            .args(["build", "-p", "shop", "--bin", "shop", "--target-dir"])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|name| name == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "cargo build -p shop failed: {status}");
        let shop = profile_dir.join(format!("shop{}", std::env::consts::EXE_SUFFIX));
        assert!(shop.is_file(), "no shop binary at {}", shop.display());
        shop
    })
}

/// A running shop on its own data directory, killed and both removed on drop.
struct Shop {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the shop (4 partitions, fsync on) with `extra` flags on a free port and returns
/// it once `/readyz` answers 200.
async fn start_shop(name: &str, extra: &[&str]) -> Shop {
    let binary = shop_binary().to_owned();
    let dir = std::env::temp_dir().join(format!(
        "eventfold-load-flows-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let (child, url) = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            let mut child = Command::new(binary)
                .args(["--http", "127.0.0.1:0", "--partitions", "4", "--data-dir"])
                .arg(&dir)
                .args(&extra)
                .env_remove("EVENTFOLD_KAFKA")
                .env("EVENTFOLD_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the shop starts");
            let stderr = child.stderr.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the shop printed no URL within 60 s");
                };
                if let Some(rest) = line.strip_prefix("shop: serving ") {
                    let url = rest.split_whitespace().next().unwrap().to_owned();
                    return (child, url);
                }
            }
        }
    })
    .await
    .unwrap();
    let shop = Shop { child, dir, url };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client.get(format!("{}/readyz", shop.url)).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            return shop;
        }
        assert!(Instant::now() < deadline, "shop at {} not ready within 60 s", shop.url);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get_json(url: &str) -> Value {
    let response = reqwest::get(url).await.unwrap();
    assert_eq!(response.status(), 200, "GET {url}");
    response.json().await.unwrap()
}

fn options(url: &str, count: u64) -> FlowOptions {
    FlowOptions {
        url: url.to_owned(),
        limit: Limit::Count(count),
        concurrency: 4,
        // A debug shop on a machine shared with builds: correctness, not speed, here.
        flow_timeout: Duration::from_secs(30),
        max_error_rate: 0.0,
        ..FlowOptions::default()
    }
}

fn assert_monotonic(name: &str, l: &eventfold_tools::load::Latency) {
    assert!(l.p50 > 0.0, "{name}: {l:?}");
    assert!(
        l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p99_9 && l.p99_9 <= l.max,
        "{name}: {l:?}"
    );
}

/// Order `n` of a run: `{prefix}{run_id}-{n}`.
fn order_id(summary: &FlowSummary, n: u64) -> String {
    format!("flow-{}-{n}", summary.run_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flow_completes_closed_loop_and_at_a_rate() {
    let shop = start_shop("ok", &[]).await;

    let summary = flows::run(options(&shop.url, 40)).await.unwrap();

    assert_eq!(summary.flows, 40, "{summary}");
    assert_eq!(summary.completed, 40, "{summary}");
    assert_eq!(
        (
            summary.timed_out,
            summary.cancelled,
            summary.commands_failed,
            summary.failed()
        ),
        (0, 0, 0, 0)
    );
    assert!(summary.polls >= 40, "at least one read per flow: {}", summary.polls);
    assert!(summary.throughput_per_s() > 0.0);
    assert!(summary.start_lag_ms.is_none(), "closed loop");
    for (name, l) in [
        ("latency", &summary.latency_ms),
        ("commands", &summary.commands_ms),
        ("flow", &summary.flow_ms),
    ] {
        assert_monotonic(name, l);
    }
    // The flow covers the commands and the wait for shipping.
    assert!(summary.flow_ms.max >= summary.latency_ms.max.max(summary.commands_ms.max) - 0.01);
    summary.check().unwrap();

    // Checked from outside: every order shipped, its payment authorized by the process
    // manager on `pay-{order}`.
    for n in 0..40 {
        let id = order_id(&summary, n);
        let order = get_json(&format!("{}/v1/aggregates/order/{id}", shop.url)).await;
        assert_eq!(order["state"]["status"], "shipped", "{order}");
        let payments = get_json(&format!("{}/v1/aggregates/payment/pay-{id}/events", shop.url)).await;
        let types: Vec<&str> = payments
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert!(types.contains(&"PaymentAuthorized"), "pay-{id}: {types:?}");
    }

    let json = summary.to_json();
    assert_eq!(json["workload"], "flows");
    assert_eq!(json["flows"], 40);
    assert_eq!(json["completed"], 40);
    assert_eq!(json["failed"], 0);
    assert_eq!(json["passed"], true);
    assert!(json["throughput_per_s"].as_f64().unwrap() > 0.0);
    for p in ["p50", "p90", "p99", "p99_9", "max", "mean"] {
        assert!(json["latency_ms"][p].as_f64().unwrap() > 0.0, "{p}");
    }
    assert_eq!(json["poll_interval_ms"], 2.0);

    // Open loop at 40 flows/s: a schedule, its start lag, the same outcome.
    let at_rate = flows::run(FlowOptions {
        rate: Some(40.0),
        concurrency: 8,
        ..options(&shop.url, 20)
    })
    .await
    .unwrap();
    assert_eq!(at_rate.completed, 20, "{at_rate}");
    // Flow 19 is due 19 / 40 = 0.475 s after the start.
    assert!(at_rate.elapsed >= Duration::from_millis(450), "{:?}", at_rate.elapsed);
    assert!(at_rate.start_lag_ms.is_some());
    assert_eq!(at_rate.to_json()["target_rate_per_s"], 40.0);
    at_rate.check().unwrap();
    let text = at_rate.to_string();
    for needle in ["20 completed", "shipped", "start lag", ": ok"] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flows_that_never_ship_time_out_and_fail_the_run() {
    let shop = start_shop("no-flow", &["--no-process-managers"]).await;

    let summary = flows::run(FlowOptions {
        flow_timeout: Duration::from_millis(300),
        ..options(&shop.url, 6)
    })
    .await
    .unwrap();

    assert_eq!(summary.flows, 6);
    assert_eq!(summary.completed, 0);
    assert_eq!(summary.timed_out, 6, "{summary}");
    assert!(summary.polls >= 6);
    let error = summary.check().unwrap_err().to_string();
    assert!(error.contains("no flow completed"), "{error}");
    let first = summary.first_error.clone().unwrap();
    assert!(first.contains("did not complete in time"), "{first}");
    assert_eq!(summary.to_json()["timed_out"], 6);
    assert_eq!(summary.to_json()["passed"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declined_payments_cancel_flows_and_fail_the_run() {
    // Every flow's order is 1.00: above a limit of 0.50, its payment is declined.
    let shop = start_shop("declined", &["--decline-above-cents", "50"]).await;

    let summary = flows::run(options(&shop.url, 5)).await.unwrap();

    assert_eq!(summary.cancelled, 5, "{summary}");
    assert_eq!((summary.completed, summary.timed_out), (0, 0));
    assert!(summary.check().is_err());

    // The CLI over the same shop: exit status 1, the JSON summary on stdout.
    let url = shop.url.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_eventfold"))
            .args(["load", "--workload", "flows", "--url", &url, "--count", "3"])
            .args(["--concurrency", "2", "--json", "--quiet", "--flow-timeout", "30s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["cancelled"], 3, "{json}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("3 of 3 flows did not complete") || stderr.contains("no flow completed"),
        "{stderr}"
    );
}

#[tokio::test]
async fn cli_runs_flows_and_rejects_the_commands_flags() {
    let shop = start_shop("cli", &[]).await;
    let url = shop.url.clone();
    let run = |extra: &'static [&'static str]| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_eventfold"))
                .args(["load", "--workload", "flows", "--url", &url])
                .args(extra)
                .output()
                .unwrap()
        })
    };

    let output = run(&[
        "--count",
        "10",
        "--concurrency",
        "2",
        "--poll-interval",
        "1ms",
        "--quiet",
    ])
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    for needle in ["10 flows", "10 completed", "completed flows/s", "p99.9", ": ok"] {
        assert!(stdout.contains(needle), "{needle:?} missing from\n{stdout}");
    }

    for extra in [
        &["--body", "{}", "--type", "order"][..],
        &["--get", "/v1/views/orders/{id}"][..],
        &["--ids", "4"][..],
    ] {
        let output = run(extra).await.unwrap();
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {output:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains("not used by --workload flows"), "{stderr}");
    }
    // And the flows' flags are refused for commands.
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_eventfold"))
            .args(["load", "--url", &url, "--count", "1", "--poll-interval", "5ms"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}
