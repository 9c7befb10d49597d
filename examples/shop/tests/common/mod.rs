//! Helpers shared by the shop's process-level tests: start the binary, talk HTTP.
#![allow(dead_code)] // each test file uses a different subset

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
    let mut c = Command::new(env!("CARGO_BIN_EXE_shop"));
    c.args(args).env_remove("EVENTFOLD_KAFKA").env("EVENTFOLD_LOG", "warn");
    c
}

/// Starts shop on port 0 and returns it with the base URL it printed.
pub fn start(dir: &std::path::Path, extra: &[&str]) -> (Shop, String, Vec<String>) {
    let mut args = vec!["--data-dir", dir.to_str().unwrap(), "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    // Owned by the guard at once, so a failing test still kills and reaps it.
    let mut guard = Shop(
        shop(&args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stderr = guard.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("shop prints its URL");
        lines.push(line.clone());
        if let Some(rest) = line.strip_prefix("shop: serving ") {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            // Keep reading the example line.
            if let Ok(l) = rx.recv_timeout(Duration::from_secs(5)) {
                lines.push(l);
            }
            return (guard, url, lines);
        }
    }
}

/// POSTs `body` to `url` + `path`; a non-empty `key` goes in `Idempotency-Key`.
pub fn post(url: &str, path: &str, body: &str, key: &str) -> (u16, serde_json::Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut req = reqwest::Client::new()
            .post(format!("{url}{path}"))
            .body(body.to_owned());
        if !key.is_empty() {
            req = req.header("Idempotency-Key", key);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or_default())
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
