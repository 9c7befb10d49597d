//! Kafka security for real (issue 56, point 4): the shop in Kafka mode through the test
//! broker's SASL_SSL listener (TLS with a generated CA, SCRAM-SHA-256), as a principal whose
//! ACLs allow only the app's topics, consumer groups and transactional ids, and not
//! `DescribeConfigs`: the shop then warns that it cannot check the topics' policies, and
//! serves. A wrong password and an app id outside the ACLs are refused with the reason.
//!
//! The listener is `scripts/kafka/broker.sh`'s (on by default at the plain port + 2): its
//! address is `EVENTFOLD_KAFKA_SASL_BOOTSTRAP` (default: the plain bootstrap's port + 2),
//! its CA `<EVENTFOLD_KAFKA_DIR or /tmp/eventfold-kafka>/ssl/ca.pem`, and the ACLs are made
//! with `broker.sh acl` over the plain listener.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The SASL_SSL side of the test broker.
struct Secured {
    plain: String,
    sasl: String,
    ca: PathBuf,
}

impl Secured {
    fn from_env() -> Self {
        let plain = common::kafka_bootstrap();
        let (host, port) = plain.split(',').next().unwrap().rsplit_once(':').unwrap();
        let port: u16 = port.parse().unwrap();
        let sasl = std::env::var("EVENTFOLD_KAFKA_SASL_BOOTSTRAP").unwrap_or_else(|_| format!("{host}:{}", port + 2));
        let dir = std::env::var("EVENTFOLD_KAFKA_DIR").unwrap_or_else(|_| "/tmp/eventfold-kafka".into());
        let ca = PathBuf::from(dir).join("ssl/ca.pem");
        assert!(
            ca.exists(),
            "no CA at {} : start the broker with scripts/kafka/broker.sh (its SASL_SSL listener is on by default)",
            ca.display()
        );
        Self { plain, sasl, ca }
    }

    /// Runs `broker.sh acl args` against the plain listener.
    fn acl(&self, args: &[&str]) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka/broker.sh");
        let port = self.plain.rsplit_once(':').unwrap().1;
        let out = Command::new(script)
            .arg("acl")
            .args(args)
            .env("EVENTFOLD_KAFKA_PORT", port)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "broker.sh acl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Lets principal `User:app` use the topics, groups and transactional ids of `app`.
    fn allow_app(&self, app: &str) {
        let topics = format!("{app}.");
        for (kind, name, ops) in [
            ("--topic", topics.as_str(), &["Read", "Write", "Create", "Describe"][..]),
            ("--group", app, &["Read", "Describe"][..]),
            ("--transactional-id", app, &["Write", "Describe"][..]),
        ] {
            let mut args = vec!["--add", "--allow-principal", "User:app"];
            for op in ops {
                args.extend(["--operation", op]);
            }
            args.extend([kind, name, "--resource-pattern-type", "prefixed"]);
            self.acl(&args);
        }
    }

    /// The shop's Kafka-mode flags for this listener, as `user` with `password`.
    fn shop_args(&self, app: &str, user: &str, password: &str) -> Vec<String> {
        let mut args: Vec<String> = ["--kafka", &self.sasl, "--app-id", app, "--partitions", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for kv in [
            "security.protocol=SASL_SSL".to_owned(),
            "sasl.mechanism=SCRAM-SHA-256".to_owned(),
            format!("sasl.username={user}"),
            format!("sasl.password={password}"),
            format!("ssl.ca.location={}", self.ca.display()),
        ] {
            args.extend(["--kafka-config".to_owned(), kv]);
        }
        args
    }
}

fn app_id(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("sec-{what}-{nanos}")
}

#[test]
fn the_shop_runs_through_sasl_ssl_as_a_principal_limited_to_its_own_topics() {
    let sec = Secured::from_env();
    let app = app_id("ok");
    sec.allow_app(&app);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shop.log");
    let mut args = sec.shop_args(&app, "app", "app-secret");
    args.extend(["--data-dir".to_owned(), dir.path().join("data").display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_shop, url) = common::start_logged(&args, &[], &log, Duration::from_secs(120));

    let body = r#"{"type":"PlaceOrder","customer_id":"c-1","items":[{"sku":"sku-1","qty":2,"price_cents":150}]}"#;
    let (status, answer) = common::post(&url, "/v1/aggregates/order/o-1/commands", body, "k-o-1");
    assert_eq!(status, 200, "{answer}");
    let (status, state) = common::get(&url, "/v1/aggregates/order/o-1");
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["version"], 1, "{state}");
    // The same key again is deduplicated through the secured cluster too.
    let (status, again) = common::post(&url, "/v1/aggregates/order/o-1/commands", body, "k-o-1");
    assert_eq!((status, &again["events"]), (200, &answer["events"]), "{again}");

    let printed = std::fs::read_to_string(&log).unwrap();
    assert!(
        printed.contains("cannot read the topic's configs"),
        "without DescribeConfigs the shop warns that it cannot check the topics' policies:\n{printed}"
    );
}

/// Starts the shop with `args` and waits until it exits by itself (at most `within`);
/// returns what it printed.
fn refused(args: &[String], within: Duration) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shop.log");
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    let data = dir.path().join("data").display().to_string();
    all.extend([
        "--data-dir",
        &data,
        "--http",
        "127.0.0.1:0",
        "--kafka-timeout-secs",
        "10",
    ]);
    let mut shop = common::Shop(
        common::shop(&all)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = shop.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the shop still runs after {within:?}:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let printed = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "the shop exits with an error:\n{printed}");
    printed
}

#[test]
fn a_wrong_password_and_an_app_outside_the_acls_are_refused_with_the_reason() {
    let sec = Secured::from_env();

    let app = app_id("badpw");
    sec.allow_app(&app);
    let printed = refused(&sec.shop_args(&app, "app", "not-the-password"), Duration::from_secs(90));
    assert!(
        printed.contains("Authentication failed") || printed.contains("SASL authentication error"),
        "a wrong password is named as such:\n{printed}"
    );

    let app = app_id("noacl");
    let printed = refused(&sec.shop_args(&app, "app", "app-secret"), Duration::from_secs(90));
    assert!(
        printed.to_lowercase().contains("authorization"),
        "an app id outside the principal's ACLs is refused with the broker's authorization error:\n{printed}"
    );
}
