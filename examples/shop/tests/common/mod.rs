//! Helpers shared by the shop's process-level tests: start the binary, talk HTTP.
#![allow(dead_code)] // each test file uses a different subset

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running shop process, killed and reaped on drop.
pub struct Shop(pub Child);

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn shop(args: &[&str]) -> Command {
    service(std::path::Path::new(env!("CARGO_BIN_EXE_shop")), args)
}

/// A command running the service binary `exe` with `args`.
pub fn service(exe: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(exe);
    c.args(args).env_remove("EVENTFOLD_KAFKA").env("EVENTFOLD_LOG", "warn");
    c
}

/// Starts shop on port 0 and returns it, once `/readyz` answers 200, with the base URL it
/// printed (it serves HTTP while it restores).
pub fn start(dir: &std::path::Path, extra: &[&str]) -> (Shop, String, Vec<String>) {
    start_service(std::path::Path::new(env!("CARGO_BIN_EXE_shop")), dir, extra)
}

/// [`start`] for the service binary `exe` (built with `eventfold::App`, so it prints
/// `<name>: serving <url>`).
pub fn start_service(exe: &std::path::Path, dir: &std::path::Path, extra: &[&str]) -> (Shop, String, Vec<String>) {
    let (guard, url, lines) = spawn_service(exe, dir, extra);
    let ready_by = Instant::now() + Duration::from_secs(60);
    while get_status(&url, "/readyz") != 200 {
        assert!(
            Instant::now() < ready_by,
            "{} at {url} not ready within 60 s",
            exe.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (guard, url, lines)
}

/// Starts the service binary `exe` on port 0 and returns it once it printed its URL
/// (ready or not).
pub fn spawn_service(exe: &std::path::Path, dir: &std::path::Path, extra: &[&str]) -> (Shop, String, Vec<String>) {
    let mut args = vec!["--data-dir", dir.to_str().unwrap(), "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let (guard, url, lines, _) = spawn_logged(exe, &args);
    (guard, url, lines)
}

/// Starts the service binary `exe` with exactly `args` and returns it once it printed its
/// URL, with the lines it printed so far and the receiver of the lines it prints next.
pub fn spawn_logged(
    exe: &std::path::Path,
    args: &[&str],
) -> (Shop, String, Vec<String>, std::sync::mpsc::Receiver<String>) {
    let name = exe.file_name().unwrap().to_str().unwrap().to_owned();
    // Owned by the guard at once, so a failing test still kills and reaps it.
    let mut guard = Shop(
        service(exe, args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stderr = guard.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end even once nobody listens: the shop's stderr stays open, as
        // under a supervisor that keeps its log (`a_closed_stderr_...` tests the other).
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("{name} prints its URL: {lines:?}"));
        lines.push(line.clone());
        if let Some(rest) = line.strip_prefix(&format!("{name}: serving ")) {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            // Keep reading the example line (printed right after, if the service has one).
            if let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) {
                lines.push(l);
            }
            return (guard, url, lines, rx);
        }
    }
}

/// POSTs `body` to `url` + `path`; a non-empty `key` goes in `Idempotency-Key`.
pub fn post(url: &str, path: &str, body: &str, key: &str) -> (u16, serde_json::Value) {
    let headers: &[(&str, &str)] = if key.is_empty() {
        &[]
    } else {
        &[("Idempotency-Key", key)]
    };
    post_with(url, path, body, headers)
}

/// POSTs `body` to `url` + `path` with `headers`.
pub fn post_with(url: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, serde_json::Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut req = reqwest::Client::new()
            .post(format!("{url}{path}"))
            .body(body.to_owned());
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or_default())
    })
}

/// The status of `GET url + path` (0 when the request fails).
pub fn get_status(url: &str, path: &str) -> u16 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("{url}{path}"))
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    })
}

pub fn get(url: &str, path: &str) -> (u16, serde_json::Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::get(format!("{url}{path}")).await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or_default())
    })
}

/// The body of `GET {url}{path}` as text (e.g. `/metrics`).
pub fn get_text(url: &str, path: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("{url}{path}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}

/// The broker of the Kafka tests (`EVENTFOLD_KAFKA_BOOTSTRAP`, default 127.0.0.1:9092);
/// fails when none answers: Kafka tests never skip.
pub fn kafka_bootstrap() -> String {
    let b = std::env::var("EVENTFOLD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let addr = b.split(',').next().unwrap().to_owned();
    if std::net::TcpStream::connect_timeout(&addr.parse().expect("host:port"), Duration::from_secs(3)).is_err() {
        panic!("no Kafka broker at {b}: start one with `scripts/kafka/broker.sh start` (Kafka tests never skip)");
    }
    b
}

/// Every committed record of `topic` (`partitions` partitions) as (key, headers, value),
/// read by a plain rdkafka consumer: independent of eventfold's code path.
pub fn read_committed(bootstrap: &str, topic: &str, partitions: i32) -> Vec<(String, HashMap<String, String>, Value)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "independent-checker")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut eof = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while eof < partitions {
        assert!(
            Instant::now() < deadline,
            "independent consumer did not reach the end of {topic}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for i in 0..h.count() {
                        let hd = h.get(i);
                        headers.insert(
                            hd.key.to_owned(),
                            String::from_utf8_lossy(hd.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push((key, headers, serde_json::from_slice(m.payload().unwrap()).unwrap()));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => eof += 1,
            Some(Err(e)) => panic!("independent consumer: {e}"),
            None => {}
        }
    }
    out
}

/// The in-process embedded log of the view tests: 4 partitions, no fsync, in `dir`.
pub fn test_log(dir: &std::path::Path) -> eventfold::log::embedded::EmbeddedLog {
    use eventfold::log::embedded::{EmbeddedLog, Options};
    use eventfold::store::{Store, StoreOptions};
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    EmbeddedLog::open(
        store,
        Options {
            partitions: 4,
            fsync: false,
            ..Default::default()
        },
    )
    .unwrap()
}

/// POSTs `body` with `key` to `path` on whichever instance `base` names now, until the
/// answer is definitive (a status below 500): across kills, restarts and moving
/// partitions, as a client with an idempotency key does. Fails after 90 s.
pub async fn submit(
    http: &reqwest::Client,
    base: &std::sync::RwLock<String>,
    path: &str,
    key: &str,
    body: &Value,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        assert!(
            Instant::now() < deadline,
            "{path} (key {key}) got no definitive answer in 90 s"
        );
        let url = format!("{}{path}", base.read().unwrap());
        if let Ok(resp) = http.post(&url).header("Idempotency-Key", key).json(body).send().await {
            let status = resp.status().as_u16();
            if status < 500
                && let Ok(json) = resp.json::<Value>().await
            {
                return (status, json);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the events topics of orders and payments (4 partitions each) with an independent
/// `read_committed` consumer: no command
/// wrote events twice, and every reaction of the order flow has its cause (the event its
/// `ef-causation-id` names, of the right type and order).
pub fn check_flow_topics(bootstrap: &str, order_events: &str, payment_events: &str, confirmed: usize) -> Vec<String> {
    let mut failures = Vec::new();
    let orders = read_committed(bootstrap, order_events, 4);
    let payments = read_committed(bootstrap, payment_events, 4);
    let mut by_command: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut by_id: std::collections::HashMap<&str, (&str, &Value)> = std::collections::HashMap::new();
    for (key, h, v) in orders.iter().chain(&payments) {
        *by_command.entry(h["ef-command-id"].as_str()).or_default() += 1;
        by_id.insert(h["ef-id"].as_str(), (key.as_str(), v));
    }
    for (command, n) in &by_command {
        if *n != 1 {
            failures.push(format!(
                "command {command} wrote {n} events (each command here writes one)"
            ));
        }
    }
    let cause_of = |h: &std::collections::HashMap<String, String>| by_id.get(h["ef-causation-id"].as_str()).copied();
    for (key, h, v) in payments.iter() {
        match cause_of(h) {
            Some((order, cause)) if cause["type"] == "OrderConfirmed" && format!("pay-{order}") == *key => {}
            other => failures.push(format!("payment event of {key} ({}) caused by {other:?}", v["type"])),
        }
    }
    for (key, h, v) in orders.iter() {
        let expected = match (v["type"].as_str(), v["reason"].as_str()) {
            (Some("OrderShipped"), _) => "PaymentAuthorized",
            (Some("OrderCancelled"), Some("payment_declined")) => "PaymentDeclined",
            _ => continue,
        };
        match cause_of(h) {
            Some((payment, cause)) if cause["type"] == expected && payment == format!("pay-{key}") => {}
            other => failures.push(format!(
                "{} of {key} caused by {other:?}, expected a {expected}",
                v["type"]
            )),
        }
    }
    if payments.len() != confirmed {
        failures.push(format!(
            "{} payment events for {confirmed} confirmed orders",
            payments.len()
        ));
    }
    failures
}

/// Places `order` (one line of `total_cents`) for customer `c-1`; must be accepted.
pub fn place(url: &str, order: &str, total_cents: u64) {
    let body = json!({
        "type": "PlaceOrder",
        "customer_id": "c-1",
        "items": [{"sku": "sku-1", "qty": 1, "price_cents": total_cents}],
    });
    let (status, answer) = post(
        url,
        &format!("/v1/aggregates/order/{order}/commands"),
        &body.to_string(),
        "",
    );
    assert_eq!(status, 200, "{answer}");
}

/// Sends `ConfirmOrder` to `order`.
pub fn confirm(url: &str, order: &str) -> (u16, Value) {
    post(
        url,
        &format!("/v1/aggregates/order/{order}/commands"),
        r#"{"type":"ConfirmOrder"}"#,
        "",
    )
}

/// The events of aggregate `id` of type `aggregate` (none when unknown).
pub fn events(url: &str, aggregate: &str, id: &str) -> Vec<Value> {
    let (status, body) = get(url, &format!("/v1/aggregates/{aggregate}/{id}/events"));
    if status == 404 {
        return Vec::new();
    }
    assert_eq!(status, 200, "{body}");
    body.as_array().unwrap().clone()
}

/// The `type` of each event.
pub fn types(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect()
}

/// A shop on a port of its own with `args` and `env`, its stderr written to `log`; returned
/// once `/readyz` answers 200 within `ready_within` (the test fails with the log otherwise).
pub fn start_logged(
    args: &[&str],
    env: &[(&str, &str)],
    log: &std::path::Path,
    ready_within: Duration,
) -> (Shop, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut all = vec!["--http", addr.as_str()];
    all.extend_from_slice(args);
    let mut cmd = shop(&all);
    cmd.envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let mut guard = Shop(cmd.spawn().unwrap());
    let url = format!("http://{addr}");
    let deadline = Instant::now() + ready_within;
    while get_status(&url, "/readyz") != 200 {
        let exited = guard.0.try_wait().unwrap();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "shop not ready within {ready_within:?} (exit: {exited:?}):\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (guard, url)
}

/// A TCP port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
