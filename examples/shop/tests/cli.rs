//! The `shop` binary as a user meets it: startup output, flags, refusals with clear
//! messages, and data surviving a graceful restart.

mod common;

use common::{get, post, shop, start};
use std::process::Command;

#[test]
fn prints_url_data_dir_and_an_example_then_keeps_data_across_a_graceful_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut shop1, url, lines) = start(dir.path(), &[]);
    let text = lines.join("\n");
    assert!(
        text.contains(dir.path().to_str().unwrap()),
        "names the data directory: {text}"
    );
    assert!(text.contains("8 partitions"), "{text}");
    assert!(text.contains("curl"), "shows an example: {text}");
    let body = r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"apple","qty":2,"price_cents":150}]}"#;
    let (st, b) = post(&url, "/v1/aggregates/order/o-1/commands", body, "");
    assert_eq!(st, 200, "{b}");
    // SIGTERM: graceful shutdown.
    let pid = shop1.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = shop1.0.wait().unwrap();
    assert!(status.success(), "exits 0 on SIGTERM: {status:?}");
    let (_shop2, url, _) = start(dir.path(), &[]);
    let (st, b) = get(&url, "/v1/aggregates/order/o-1");
    assert_eq!(st, 200);
    assert_eq!(b["version"], 1);
    assert_eq!(b["state"]["total_cents"], 300);
}

#[test]
fn refuses_another_partition_count_for_existing_data() {
    let dir = tempfile::tempdir().unwrap();
    drop(start(dir.path(), &["--partitions", "8"]));
    let out = shop(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--partitions",
        "4",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("created with 8 partitions") && err.contains("--partitions 8"),
        "{err}"
    );
}

#[test]
fn rejects_bad_flags_with_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = shop(&["--data-dir", d, "--partitions", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--partitions must be between 1 and 1024"));
    let out = shop(&["--data-dir", d, "--http", "not-an-address"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--http"));
    let help = shop(&["--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--http",
        "--data-dir",
        "--kafka",
        "--app-id",
        "--partitions",
        "--instance-id",
        "--dedup-window-secs",
        "--kafka-config",
        "--bulk-min-records",
    ] {
        assert!(help.contains(flag), "--help documents {flag}");
    }
    let out = shop(&[
        "--data-dir",
        d,
        "--kafka",
        "127.0.0.1:1",
        "--kafka-config",
        "no-equals-sign",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not KEY=VALUE"));
}

/// `--kafka-config` reaches librdkafka: a property it does not know is refused by name
/// before anything connects (so no broker is needed here).
#[test]
fn kafka_client_settings_reach_librdkafka() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = shop(&[
        "--data-dir",
        d,
        "--kafka",
        "127.0.0.1:1",
        "--kafka-config",
        "no.such.property=1",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no.such.property"), "{stderr}");
}

/// A shop whose stderr is closed (its supervisor stopped reading) keeps serving: logging
/// then fails, which must not panic the thread that logged (tracing's own report of the
/// failure was an `eprintln!`, which panics on EPIPE: requests were cut off unanswered).
#[test]
fn a_closed_stderr_does_not_stop_the_service() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // Every request logs at trace level.
    let mut child = common::Shop(
        shop(&["--data-dir", d, "--http", "127.0.0.1:0"])
            .env("EVENTFOLD_LOG", "trace")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    let url = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "shop exited before serving");
        if let Some(rest) = line.strip_prefix("shop: serving ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let ready_by = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while common::get_status(&url, "/readyz") != 200 {
        // Keep reading meanwhile: a full pipe would block the shop's logging.
        let mut line = String::new();
        let _ = stderr.read_line(&mut line);
        assert!(std::time::Instant::now() < ready_by, "not ready within 60 s");
    }
    drop(stderr);
    for i in 0..20 {
        let body = r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"apple","qty":1,"price_cents":10}]}"#;
        let (st, b) = post(&url, &format!("/v1/aggregates/order/o-{i}/commands"), body, "");
        assert_eq!(st, 200, "command {i}: {b}");
    }
    assert!(child.0.try_wait().unwrap().is_none(), "the shop still runs");
}
