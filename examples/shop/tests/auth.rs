//! The `shop` binary secured (DESIGN §6 "Authentication"): `shop auth hash-token` makes a
//! token file's line, `--auth-tokens` serves with it, SIGHUP reloads it (a bad file keeps
//! the old tokens), a non-loopback address without tokens is refused unless
//! `--insecure-no-auth`, and in Kafka mode a read forwarded to the owner is checked there
//! with the caller's own token.

mod common;

use common::{Shop, shop, spawn_logged, start};
use serde_json::Value;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const ORDER: &str = r#"{"type":"PlaceOrder","customer_id":"c1","items":[{"sku":"apple","qty":2,"price_cents":150}]}"#;

/// `shop auth hash-token <name> <role>` with `token` on stdin: the line it prints.
fn hash_token(name: &str, role: &str, token: &str) -> String {
    let mut child = shop(&["auth", "hash-token", name, role])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

/// `method` `url + path` with `token` as bearer: the status and JSON body.
fn call(method: &str, url: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let mut req = match method {
            "POST" => client.post(format!("{url}{path}")).body(ORDER),
            _ => client.get(format!("{url}{path}")),
        };
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or_default())
    })
}

fn hup(shop: &Shop) {
    let pid = shop.0.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
}

/// Waits for a line of `log` containing `needle`.
fn wait_line(log: &Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no line with {needle:?} within 10 s"));
        if line.contains(needle) {
            return line;
        }
    }
}

#[test]
fn hash_token_makes_an_entry_and_sighup_adds_and_removes_tokens_keeping_them_on_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let alice = hash_token("alice", "write", "alice-token");
    let parts: Vec<&str> = alice.split(' ').collect();
    assert_eq!(parts[..2], ["alice", "write"], "{alice}");
    assert_eq!(parts[2].len(), 64, "{alice}");
    assert!(!alice.contains("alice-token"), "the line never holds the token");
    let bob = hash_token("bob", "read", "bob-token");
    std::fs::write(&tokens, format!("# shop's tokens\n{alice}\n")).unwrap();
    let data = dir.path().join("data");
    let (shop, url, lines, log) = spawn_logged(
        std::path::Path::new(env!("CARGO_BIN_EXE_shop")),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
    );
    let text = lines.join("\n");
    assert!(text.contains("1 bearer tokens from"), "{text}");
    let order = "/v1/aggregates/order/o-1";
    let command = "/v1/aggregates/order/o-1/commands";
    assert_eq!(call("POST", &url, command, Some("alice-token")).0, 200);
    assert_eq!(call("GET", &url, order, Some("bob-token")).0, 401);
    assert_eq!(call("GET", &url, order, None).0, 401);

    // Add bob.
    std::fs::write(&tokens, format!("{alice}\n{bob}\n")).unwrap();
    hup(&shop);
    assert!(wait_line(&log, "reloaded").contains("2 bearer tokens"));
    let (st, body) = call("GET", &url, order, Some("bob-token"));
    assert_eq!((st, body["version"].as_u64()), (200, Some(1)), "{body}");
    assert_eq!(call("POST", &url, command, Some("bob-token")).0, 403, "bob reads only");

    // Remove alice.
    std::fs::write(&tokens, format!("{bob}\n")).unwrap();
    hup(&shop);
    assert!(wait_line(&log, "reloaded").contains("1 bearer tokens"));
    let (st, body) = call("POST", &url, command, Some("alice-token"));
    assert_eq!((st, body["error"].as_str()), (401, Some("unauthenticated")), "{body}");

    // A file that does not parse: the tokens of before stay, and the log says why.
    std::fs::write(&tokens, format!("{bob}\ncarol superuser {}\n", "ab".repeat(32))).unwrap();
    hup(&shop);
    let line = wait_line(&log, "cannot reload");
    assert!(line.contains("tokens:2: unknown role `superuser`"), "{line}");
    assert!(line.contains("the 1 tokens loaded before stay"), "{line}");
    assert_eq!(call("GET", &url, order, Some("bob-token")).0, 200);
    assert_eq!(call("POST", &url, command, Some("alice-token")).0, 401);
    // Probes never need a token.
    assert_eq!(call("GET", &url, "/healthz", None).0, 200);
    assert_eq!(call("GET", &url, "/readyz", None).0, 200);
    drop(shop);
}

#[test]
fn a_token_file_that_does_not_parse_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice write not-a-hash\n").unwrap();
    let out = shop(&[
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--auth-tokens",
        tokens.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--auth-tokens") && err.contains("tokens:1:"), "{err}");
}

#[test]
fn a_non_loopback_address_without_tokens_is_refused_unless_insecure_is_explicit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let out = shop(&["--data-dir", data.to_str().unwrap(), "--http", addr])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{addr}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a loopback address")
                && err.contains("--auth-tokens FILE")
                && err.contains("--insecure-no-auth"),
            "{addr}: {err}"
        );
    }
    // The environment variable says it too.
    let out = shop(&["--data-dir", data.to_str().unwrap()])
        .env("EVENTFOLD_HTTP", "0.0.0.0:0")
        .output()
        .unwrap();
    assert!(!out.status.success());

    // Told explicitly, it serves on every address.
    let (insecure, url, _, _) = spawn_logged(
        std::path::Path::new(env!("CARGO_BIN_EXE_shop")),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            "0.0.0.0:0",
            "--insecure-no-auth",
        ],
    );
    let url = url.replace("0.0.0.0", "127.0.0.1");
    assert_eq!(call("POST", &url, "/v1/aggregates/order/o-1/commands", None).0, 200);
    drop(insecure);

    // With tokens, it serves there too, and wants them.
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{}\n", hash_token("ci", "read", "ci-token"))).unwrap();
    let (secured, url, _, _) = spawn_logged(
        std::path::Path::new(env!("CARGO_BIN_EXE_shop")),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            "0.0.0.0:0",
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
    );
    let url = url.replace("0.0.0.0", "127.0.0.1");
    assert_eq!(call("GET", &url, "/v1/aggregates/order/o-1", None).0, 401);
    assert_eq!(call("GET", &url, "/v1/aggregates/order/o-1", Some("ci-token")).0, 200);
    drop(secured);

    // Both flags contradict each other.
    let out = shop(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--auth-tokens",
        tokens.to_str().unwrap(),
        "--insecure-no-auth",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("contradict"));
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The instances of `url`'s cluster that own each partition of `order`, as `/v1/cluster`
/// (admin) says.
fn order_owners(url: &str, admin: &str) -> Vec<(u32, String)> {
    let (st, cluster) = call("GET", url, "/v1/cluster", Some(admin));
    assert_eq!(st, 200, "{cluster}");
    cluster["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["aggregate"] == "order")
        .map(|p| {
            (
                p["partition"].as_u64().unwrap() as u32,
                p["owner"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn kafka_a_read_forwarded_to_its_owner_is_checked_there_with_the_callers_own_token() {
    let bootstrap = common::kafka_bootstrap();
    let app = format!("auth{}", rand::random::<u32>());
    let dir = tempfile::tempdir().unwrap();
    // Both instances know root (admin) and alice (read); only a knows carol (read).
    let root = hash_token("root", "admin", "root-token");
    let alice = hash_token("alice", "read", "alice-token");
    let carol = hash_token("carol", "read", "carol-token");
    let (file_a, file_b) = (dir.path().join("tokens-a"), dir.path().join("tokens-b"));
    std::fs::write(&file_a, format!("{root}\n{alice}\n{carol}\n")).unwrap();
    std::fs::write(&file_b, format!("{root}\n{alice}\n")).unwrap();
    let flags = |id: &str, file: &std::path::Path| {
        vec![
            "--kafka".to_owned(),
            bootstrap.clone(),
            "--app-id".to_owned(),
            app.clone(),
            "--instance-id".to_owned(),
            id.to_owned(),
            "--partitions".to_owned(),
            "4".to_owned(),
            "--no-process-managers".to_owned(),
            "--auth-tokens".to_owned(),
            file.to_str().unwrap().to_owned(),
        ]
    };
    let (fa, fb) = (flags("a", &file_a), flags("b", &file_b));
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    let (_a, url_a, _) = start(&dir_a, &strs(&fa));
    let (_b, url_b, _) = start(&dir_b, &strs(&fb));
    // Both own some partitions.
    let deadline = Instant::now() + Duration::from_secs(60);
    let owners = loop {
        let owners = order_owners(&url_a, "root-token");
        let of = |id: &str| owners.iter().filter(|(_, o)| o == id).count();
        if of("a") > 0 && of("b") > 0 && of("a") + of("b") == 4 {
            break owners;
        }
        assert!(Instant::now() < deadline, "the partitions are not split: {owners:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let owner_of = |id: &str| {
        let p = eventfold::core::partition::partition_for(id.as_bytes(), 4);
        owners.iter().find(|(q, _)| *q == p).unwrap().1.clone()
    };
    let ids: Vec<String> = (0..12).map(|i| format!("o-{i}")).collect();
    for id in &ids {
        let (st, b) = call(
            "POST",
            &url_a,
            &format!("/v1/aggregates/order/{id}/commands"),
            Some("root-token"),
        );
        assert_eq!(st, 200, "{b}");
    }
    let (mut on_a, mut on_b) = (0, 0);
    for id in &ids {
        let path = format!("/v1/aggregates/order/{id}");
        // alice is known to both: answered wherever the order lives.
        let (st, b) = call("GET", &url_a, &path, Some("alice-token"));
        assert_eq!(st, 200, "{id}: {b}");
        // carol only to a: what b owns, b refuses, through a.
        let (st, b) = call("GET", &url_a, &path, Some("carol-token"));
        if owner_of(id) == "a" {
            on_a += 1;
            assert_eq!(st, 200, "{id} is a's: {b}");
        } else {
            on_b += 1;
            assert_eq!(
                (st, b["error"].as_str()),
                (401, Some("unauthenticated")),
                "{id} is b's: {b}"
            );
        }
        // Without a token, a refuses before forwarding anything.
        assert_eq!(call("GET", &url_a, &path, None).0, 401);
    }
    assert!(on_a > 0 && on_b > 0, "orders on both instances: {on_a} and {on_b}");
    // A view query scattered over both: b's part refuses carol, so the query does.
    let query = "/v1/views/orders?customer_id=c1";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, b) = call("GET", &url_a, query, Some("alice-token"));
        assert_eq!(st, 200, "{b}");
        if b["rows"].as_array().map(Vec::len) == Some(ids.len()) {
            break;
        }
        assert!(Instant::now() < deadline, "the view shows every order: {b}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(call("GET", &url_a, query, Some("carol-token")).0, 401);
    // A read token cannot write on either instance, forwarded or not.
    assert_eq!(
        call("POST", &url_b, "/v1/aggregates/order/o-0/commands", Some("alice-token")).0,
        403
    );
}
