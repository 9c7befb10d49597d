//! End to end: the `quickstart` binary on the embedded log, driven over HTTP.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The running service, killed and reaped on drop so a failing test leaves no process.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary on port 0 and returns it with the URL it prints on stderr.
fn start(dir: &std::path::Path) -> (Service, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .args(["--http", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env_remove("EVENTFOLD_KAFKA")
        .env("EVENTFOLD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the quickstart binary starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let service = Service(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Keeps reading after the URL so the service never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the service prints its URL");
        if let Some(rest) = line.strip_prefix("quickstart: serving ") {
            let url = rest.split_whitespace().next().expect("a URL after `serving`");
            return (service, url.to_owned());
        }
    }
}

/// Sends `command` to account `id`: the status and the JSON answer.
async fn send(http: &reqwest::Client, url: &str, id: &str, command: Value) -> (u16, Value) {
    let r = http
        .post(format!("{url}/v1/aggregates/account/{id}/commands"))
        .json(&command)
        .send()
        .await
        .expect("the command is answered");
    (r.status().as_u16(), r.json().await.expect("a JSON answer"))
}

async fn get(http: &reqwest::Client, url: &str, path: &str) -> (u16, Value) {
    let r = http.get(format!("{url}{path}")).send().await.expect("GET is answered");
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_change_the_account_and_the_view_reads_them_back() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_service, url) = start(dir.path());
    let http = reqwest::Client::new();
    let ready_by = Instant::now() + Duration::from_secs(60);
    while get(&http, &url, "/readyz").await.0 != 200 {
        assert!(Instant::now() < ready_by, "not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, body) = send(&http, &url, "a-1", json!({"type": "Open", "owner": "ann"})).await;
    assert_eq!((status, &body["version"]), (200, &json!(1)), "{body}");
    let (status, body) = send(&http, &url, "a-1", json!({"type": "Deposit", "amount_cents": 500})).await;
    assert_eq!(
        (status, &body["events"][0]["type"]),
        (200, &json!("Deposited")),
        "{body}"
    );
    let (status, body) = send(&http, &url, "a-1", json!({"type": "Withdraw", "amount_cents": 800})).await;
    assert_eq!((status, &body["error"]), (422, &json!("insufficient_funds")), "{body}");
    let (status, body) = send(&http, &url, "a-1", json!({"type": "Withdraw", "amount_cents": 200})).await;
    assert_eq!((status, &body["version"]), (200, &json!(3)), "{body}");
    let position = body["position"].as_str().expect("a position").to_owned();

    // min_position: the view has applied the withdrawal before it answers.
    let (status, body) = get(&http, &url, &format!("/v1/views/accounts/a-1?min_position={position}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["value"], json!({"owner": "ann", "balance_cents": 300}));
    let (status, body) = get(
        &http,
        &url,
        &format!("/v1/views/accounts?owner=ann&min_position={position}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["rows"],
        json!([{"key": "a-1", "value": {"owner": "ann", "balance_cents": 300}}])
    );
    let (status, body) = get(&http, &url, "/v1/aggregates/account/a-1").await;
    assert_eq!(
        (status, &body["state"]),
        (200, &json!({"owner": "ann", "balance_cents": 300}))
    );
}

/// The shell commands of docs/guide.md's "Run it" section, each with the answer printed
/// under it (`# ...`), in order.
fn guide_commands() -> Vec<(String, Option<String>)> {
    let guide = include_str!("../../../docs/guide.md");
    let section = guide.split("## 6. Run it").nth(1).expect("the guide's section 6");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut commands: Vec<(String, Option<String>)> = Vec::new();
    for block in section.split("```sh\n").skip(1) {
        let block = block.split("```").next().unwrap_or_default();
        let mut lines = block.lines().peekable();
        while let Some(line) = lines.next() {
            if let Some(answer) = line.strip_prefix("# ") {
                let last = commands.last_mut().expect("an answer follows a command");
                assert!(last.1.is_none(), "two answers under `{}`", last.0);
                last.1 = Some(answer.to_owned());
                continue;
            }
            let mut command = line.to_owned();
            while command.ends_with('\\') {
                command.pop();
                command.push_str(lines.next().expect("a continued line"));
            }
            if !command.starts_with("cargo ") {
                commands.push((command, None));
            }
        }
    }
    commands
}

/// Whether `got` answers as the guide prints `shown`: as JSON with ids, timestamps and
/// positions (which differ on every run) taken as any string; or, where the guide elides
/// with `...`, the shown pieces in order.
fn answers_as_printed(shown: &str, got: &str) -> bool {
    fn volatile(key: &str, v: &str) -> bool {
        let uuid = v.len() == 36 && v.chars().filter(|c| *c == '-').count() == 4;
        key == "position" || key == "timestamp" || uuid
    }
    fn matches(key: &str, shown: &Value, got: &Value) -> bool {
        match (shown, got) {
            (Value::String(s), Value::String(_)) if volatile(key, s) => true,
            (Value::Object(s), Value::Object(g)) => {
                s.len() == g.len() && s.iter().all(|(k, v)| g.get(k).is_some_and(|gv| matches(k, v, gv)))
            }
            (Value::Array(s), Value::Array(g)) => {
                s.len() == g.len() && s.iter().zip(g).all(|(s, g)| matches(key, s, g))
            }
            _ => shown == got,
        }
    }
    if let Ok(shown) = serde_json::from_str::<Value>(shown) {
        return serde_json::from_str::<Value>(got).is_ok_and(|got| matches("", &shown, &got));
    }
    let mut rest = got;
    for piece in shown
        .split("...")
        .map(|p| p.trim_matches(','))
        .filter(|p| !p.is_empty())
    {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

#[test]
fn the_guides_curl_examples_answer_as_printed() {
    let commands = guide_commands();
    assert!(commands.len() >= 8, "found only {commands:?}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_service, url) = start(dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !Command::new("curl")
        .args(["-sf", &format!("{url}/readyz")])
        .output()
        .expect("curl runs (the guide needs it)")
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "not ready in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // One shell for all, as a reader types them (`POS=...` is used by the next command);
    // a marker after each separates their answers.
    let host = url.trim_start_matches("http://");
    let script: String = commands
        .iter()
        .map(|(c, _)| format!("{}\necho; echo @@end@@\n", c.replace("localhost:8080", host)))
        .collect();
    let out = Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("bash runs the guide's commands");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let answers: Vec<&str> = stdout.split("@@end@@\n").map(str::trim).collect();
    for (i, (command, shown)) in commands.iter().enumerate() {
        let got = answers.get(i).copied().unwrap_or_default();
        match shown {
            Some(shown) => assert!(
                answers_as_printed(shown, got),
                "`{command}` answered\n  {got}\nthe guide prints\n  {shown}"
            ),
            None => assert!(got.is_empty(), "`{command}` printed `{got}`; the guide shows nothing"),
        }
    }
}
