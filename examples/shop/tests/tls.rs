//! The shop over HTTPS (`--tls-cert`, `--tls-key`) with a CA made at test time: commands
//! and reads, the refusals at start, and two Kafka-mode instances forwarding reads to
//! each other over HTTPS (`--tls-ca`).

mod common;

// The HTTP crate's test helper, one copy for both crates.
#[path = "../../../crates/eventfold-http/tests/support/certs.rs"]
mod certs;

use common::{Shop, kafka_bootstrap, spawn_service};
use eventfold::http::tls;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::ServerName;

/// `method url` over HTTPS trusting `ca` (the URL's host must be 127.0.0.1 or localhost):
/// status and JSON body (Null when the request fails: status 0).
fn https(ca: &Path, method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
    let rest = url.strip_prefix("https://").expect("an https URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr: SocketAddr = host.parse().unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let config = tls::client_config(tls::certificates(ca).unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answer = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let mut stream = connector.connect(ServerName::from(addr.ip()), tcp).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    });
    let Ok(answer) = answer else { return (0, Value::Null) };
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Starts the shop with `args` on 127.0.0.1:0 and waits until `/readyz` answers over HTTPS.
fn start_https(dir: &Path, ca: &Path, args: &[&str]) -> (Shop, String) {
    let (shop, url, lines) = spawn_service(Path::new(env!("CARGO_BIN_EXE_shop")), dir, args);
    assert!(url.starts_with("https://"), "{lines:?}");
    let ready_by = Instant::now() + Duration::from_secs(60);
    while https(ca, "GET", &format!("{url}/readyz"), None).0 != 200 {
        assert!(Instant::now() < ready_by, "{url} not ready within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    (shop, url)
}

fn order() -> Value {
    json!({"type": "PlaceOrder", "customer_id": "c-1", "items": [{"sku": "s", "qty": 1, "price_cents": 100}]})
}

#[test]
fn the_shop_serves_commands_and_reads_over_https_only() {
    let dir = tempfile::tempdir().unwrap();
    let c = certs::generate(dir.path(), "shop");
    let args = [
        "--tls-cert",
        c.cert.to_str().unwrap(),
        "--tls-key",
        c.key.to_str().unwrap(),
    ];
    let (_shop, url) = start_https(&dir.path().join("data"), &c.ca, &args);
    let (st, b) = https(
        &c.ca,
        "POST",
        &format!("{url}/v1/aggregates/order/o-1/commands"),
        Some(&order()),
    );
    assert_eq!(st, 200, "{b}");
    let (st, b) = https(&c.ca, "GET", &format!("{url}/v1/aggregates/order/o-1"), None);
    assert_eq!((st, &b["version"]), (200, &json!(1)), "{b}");
    // Plain HTTP gets no answer.
    let plain = url.replacen("https://", "http://", 1);
    assert_eq!(common::get_status(&plain, "/healthz"), 0);
}

#[test]
fn a_certificate_without_its_key_or_that_does_not_parse_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let c = certs::generate(dir.path(), "shop");
    let data = dir.path().join("data");
    let run = |args: &[&str]| {
        let mut all = vec!["--data-dir", data.to_str().unwrap(), "--http", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let out = common::shop(&all).output().unwrap();
        assert!(!out.status.success(), "started with {args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--tls-cert", c.cert.to_str().unwrap()]);
    assert!(err.contains("--tls-cert and --tls-key go together"), "{err}");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not PEM").unwrap();
    let err = run(&[
        "--tls-cert",
        junk.to_str().unwrap(),
        "--tls-key",
        c.key.to_str().unwrap(),
    ]);
    assert!(err.contains("junk.pem") && err.contains("no PEM certificates"), "{err}");
    let err = run(&[
        "--tls-cert",
        c.cert.to_str().unwrap(),
        "--tls-key",
        c.key.to_str().unwrap(),
        "--tls-ca",
        junk.to_str().unwrap(),
    ]);
    assert!(err.contains("--tls-ca") && err.contains("junk.pem"), "{err}");
}

#[test]
fn kafka_instances_forward_reads_to_each_other_over_https() {
    let bootstrap = kafka_bootstrap();
    let app = format!("tls{}", rand::random::<u32>());
    let dir = tempfile::tempdir().unwrap();
    let c = certs::generate(dir.path(), "cluster");
    let flags = |id: &'static str| {
        let mut f = vec![
            "--kafka",
            &bootstrap,
            "--app-id",
            &app,
            "--instance-id",
            id,
            "--partitions",
            "4",
        ];
        f.extend(["--no-process-managers", "--tls-cert", c.cert.to_str().unwrap()]);
        f.extend(["--tls-key", c.key.to_str().unwrap(), "--tls-ca", c.ca.to_str().unwrap()]);
        f
    };
    let (_a, url_a) = start_https(&dir.path().join("a"), &c.ca, &flags("a"));
    let (_b, url_b) = start_https(&dir.path().join("b"), &c.ca, &flags("b"));
    // Both own some partitions, and advertise https URLs.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (st, cluster) = https(&c.ca, "GET", &format!("{url_a}/v1/cluster"), None);
        let owners: Vec<&str> = cluster["partitions"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p["aggregate"] == "order")
                    .filter_map(|p| p["owner"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        let of = |id: &str| owners.iter().filter(|o| **o == id).count();
        if st == 200 && of("a") > 0 && of("b") > 0 && of("a") + of("b") == 4 {
            let text = cluster.to_string();
            assert!(text.contains(&url_a) && text.contains(&url_b), "{cluster}");
            break;
        }
        assert!(Instant::now() < deadline, "the partitions are not split: {cluster}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every order read through either instance: those the other owns are forwarded.
    let ids: Vec<String> = (0..12).map(|i| format!("o-{i}")).collect();
    for id in &ids {
        let (st, b) = https(
            &c.ca,
            "POST",
            &format!("{url_a}/v1/aggregates/order/{id}/commands"),
            Some(&order()),
        );
        assert_eq!(st, 200, "{id}: {b}");
    }
    for id in &ids {
        for url in [&url_a, &url_b] {
            let (st, b) = https(&c.ca, "GET", &format!("{url}/v1/aggregates/order/{id}"), None);
            assert_eq!((st, &b["version"]), (200, &json!(1)), "{id} through {url}: {b}");
        }
    }
}
