//! The `payments` binary on the embedded log, over HTTP: it decides payments by its own
//! flag `--decline-above-cents`. (This test also makes `cargo test --workspace` build the
//! binary, which the shop's cross-app test runs.)

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The running service, killed and reaped on drop.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary on port 0 and returns it with the URL it prints on stderr.
fn start(dir: &std::path::Path, decline_above: u64) -> (Service, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_payments"))
        .args([
            "--http",
            "127.0.0.1:0",
            "--decline-above-cents",
            &decline_above.to_string(),
            "--data-dir",
        ])
        .arg(dir)
        .env_remove("EVENTFOLD_KAFKA")
        .env("EVENTFOLD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the payments binary starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let service = Service(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the service prints its URL");
        if let Some(rest) = line.strip_prefix("payments: serving ") {
            let url = rest.split_whitespace().next().expect("a URL after `serving`");
            return (service, url.to_owned());
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn payments_are_authorized_up_to_the_flag_and_declined_above() {
    let dir = tempfile::tempdir().unwrap();
    let (_service, url) = start(dir.path(), 1_000);
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("{url}/readyz"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .ok()
        != Some(200)
    {
        assert!(Instant::now() < deadline, "not ready in 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (id, amount, event) in [
        ("pay-a", 1_000, "PaymentAuthorized"),
        ("pay-b", 1_001, "PaymentDeclined"),
    ] {
        let r = http
            .post(format!("{url}/v1/aggregates/payment/{id}/commands"))
            .json(&json!({"type": "AuthorizePayment", "order_id": id, "amount_cents": amount}))
            .send()
            .await
            .expect("the command is answered");
        assert_eq!(r.status().as_u16(), 200, "{id}");
        let body: Value = r.json().await.expect("a JSON answer");
        assert_eq!(body["events"][0]["type"], event, "{id}: {body}");
    }
}
