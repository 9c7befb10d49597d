//! Two separately deployed services cooperating through the broker (DESIGN §7, issue 53
//! point 4): the `payments` example service on its own app id, and the shop started with
//! `--payments-app`, whose order flow reads `<payments>.payment.events` and sends
//! `AuthorizePayment` to `<payments>.payment.commands` (the any-client path: outcomes
//! come back on `<payments>.payment.results`). Each service is killed with SIGKILL in the
//! middle of flows and restarted; afterwards, checked over HTTP and by an independent
//! `read_committed` consumer: every order ended once as its amount says, every payment
//! was decided once, and every reaction across the two apps has its cause.

mod common;

use common::{Shop, confirm, events, get, place, spawn_service, start, start_service, types};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DECLINE_ABOVE: u64 = 10_000;
const ORDERS: usize = 24;

/// The `payments` binary, built next to the shop's (`cargo test --workspace` builds it).
fn payments_exe() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_shop")).with_file_name(format!("payments{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.exists(),
        "{} is missing: build it with `cargo build -p payments` (`cargo test --workspace` does)",
        exe.display()
    );
    exe
}

fn order_id(i: usize) -> String {
    format!("x-{i}")
}

/// Even orders are within the payments service's limit, odd ones above it.
fn amount(i: usize) -> u64 {
    if i.is_multiple_of(2) { 500 } else { DECLINE_ABOVE * 5 }
}

/// Waits until `/readyz` of the shop shows the order flow `ready` (Kafka: once the group
/// assigned it here).
fn wait_flow_ready(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, ready) = get(url, "/readyz");
        let state = ready["process_managers"]
            .as_array()
            .and_then(|pms| pms.iter().find(|p| p["name"] == "order_flow"))
            .and_then(|p| p["state"].as_str())
            .map(str::to_owned);
        if state.as_deref() == Some("ready") {
            return;
        }
        assert!(Instant::now() < deadline, "the order flow is not ready: {ready}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGKILLs `service` and starts it again on the same data directory and flags.
fn kill_and_restart(service: &mut Shop, exe: &Path, dir: &Path, flags: &[&str]) -> String {
    service.0.kill().unwrap(); // SIGKILL
    service.0.wait().unwrap();
    let (again, url, _) = start_service(exe, dir, flags);
    *service = again;
    url
}

#[test]
fn the_order_flow_pays_through_another_app_exactly_once_across_sigkills() {
    let bootstrap = common::kafka_bootstrap();
    let r = rand::random::<u32>();
    let (shop_app, pay_app) = (format!("xshop{r}"), format!("xpay{r}"));
    let (shop_dir, pay_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let limit = DECLINE_ABOVE.to_string();
    let pay_flags = [
        "--kafka",
        &bootstrap,
        "--app-id",
        &pay_app,
        "--partitions",
        "4",
        "--instance-id",
        "p1",
        "--decline-above-cents",
        &limit,
    ];
    let shop_flags = [
        "--kafka",
        &bootstrap,
        "--app-id",
        &shop_app,
        "--partitions",
        "4",
        "--instance-id",
        "s1",
        "--payments-app",
        &pay_app,
    ];
    let shop_exe = PathBuf::from(env!("CARGO_BIN_EXE_shop"));
    let pay_exe = payments_exe();
    let (mut payments, mut pay_url, _) = start_service(&pay_exe, pay_dir.path(), &pay_flags);
    let (mut shop, mut shop_url, _) = start(shop_dir.path(), &shop_flags);
    wait_flow_ready(&shop_url);

    // The shop runs no payment aggregate of its own: payments are the other app's.
    let (status, body) = get(&shop_url, "/v1/aggregates/payment/pay-x-0");
    assert_eq!(status, 404, "{body}");

    for i in 0..ORDERS {
        place(&shop_url, &order_id(i), amount(i));
        let (status, body) = confirm(&shop_url, &order_id(i));
        assert_eq!(status, 200, "{body}");
        // Kills while earlier flows are in flight: the shop's order flow (its outbox and
        // changelog), then the payments service (commands produced to it, outcomes due).
        if i == ORDERS / 3 {
            shop_url = kill_and_restart(&mut shop, &shop_exe, shop_dir.path(), &shop_flags);
            wait_flow_ready(&shop_url);
        }
        if i == 2 * ORDERS / 3 {
            pay_url = kill_and_restart(&mut payments, &pay_exe, pay_dir.path(), &pay_flags);
        }
    }

    // Every order ends as its amount says, once.
    let deadline = Instant::now() + Duration::from_secs(90);
    for i in 0..ORDERS {
        let (id, authorized) = (order_id(i), amount(i) <= DECLINE_ABOVE);
        let want: &[&str] = if authorized {
            &["OrderPlaced", "OrderConfirmed", "OrderShipped"]
        } else {
            &["OrderPlaced", "OrderConfirmed", "OrderCancelled"]
        };
        let order_events = loop {
            let e = events(&shop_url, "order", &id);
            if e.len() >= want.len() || Instant::now() > deadline {
                break e;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(types(&order_events), want, "order {id}");
        if !authorized {
            assert_eq!(order_events[2]["payload"]["reason"], "payment_declined", "order {id}");
        }
        // Its payment, decided once, in the other app.
        let payment = events(&pay_url, "payment", &format!("pay-{id}"));
        let decided = if authorized {
            "PaymentAuthorized"
        } else {
            "PaymentDeclined"
        };
        assert_eq!(types(&payment), [decided], "payment of {id}");
        assert_eq!(payment[0]["payload"]["amount_cents"], amount(i), "payment of {id}");
    }

    // The independent consumer: no command wrote twice, each payment event caused by its
    // order's OrderConfirmed (in the other app's topic), each terminal order event by its
    // payment's decision.
    let failures = common::check_flow_topics(
        &bootstrap,
        &format!("{shop_app}.order.events"),
        &format!("{pay_app}.payment.events"),
        ORDERS,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The authorizations reached the other app through its commands topic, each with the
    // order flow's deterministic command id.
    let commands = common::read_committed(&bootstrap, &format!("{pay_app}.payment.commands"), 4);
    let mut ids: Vec<&str> = commands.iter().map(|(_, h, _)| h["ef-command-id"].as_str()).collect();
    assert!(
        ids.iter().all(|id| id.starts_with("order_flow:")),
        "only the order flow sends to payments: {ids:?}"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ORDERS, "one authorization command id per confirmed order");
}

/// On the embedded log there is one app: a flow told to reach another one stops as
/// `failed` with the reason, and the shop's commands go on.
#[test]
fn another_apps_payments_on_the_embedded_log_fail_the_flow_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let shop = Path::new(env!("CARGO_BIN_EXE_shop"));
    let (_shop, url, _) = spawn_service(shop, dir.path(), &["--payments-app", "payments", "--partitions", "4"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let flow = loop {
        let (_, ready) = get(&url, "/readyz");
        let flow = ready["process_managers"]
            .as_array()
            .and_then(|pms| pms.iter().find(|p| p["name"] == "order_flow"))
            .cloned()
            .unwrap_or_default();
        if flow["state"] == "failed" || Instant::now() > deadline {
            break flow;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(flow["state"], "failed", "{flow}");
    let error = flow["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("app `payments`") && error.contains("Kafka only"),
        "{error}"
    );
    place(&url, "e-1", 500);
}
