//! A service that cannot start says where and why: the store another process holds, the
//! address something else listens on.

use clap::Parser;
use eventfold::app::{App, NoFlags, ServeOptions, Services};
use eventfold::core::testing::Counter;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeOptions,
}

fn app() -> App<NoFlags> {
    App::new("counter", |_: &NoFlags, s: &mut Services| {
        s.aggregate::<Counter>(());
    })
}

fn options(dir: &std::path::Path) -> ServeOptions {
    let dir = dir.to_str().expect("a UTF-8 temporary directory");
    Cli::try_parse_from(["counter", "--data-dir", dir, "--http", "127.0.0.1:0"])
        .expect("the standard flags parse")
        .serve
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_in_use_names_its_directory_and_the_likely_cause() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(dir.path());
    let running = app().start(&opts, &NoFlags {}).expect("the first instance starts");
    let err = match app().start(&opts, &NoFlags {}) {
        Ok(_) => panic!("a second instance opened the store the first one holds"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(err.contains("in use by another process"), "{err}");
    assert!(err.contains("--data-dir"), "{err}");
    drop(running);
}

#[test]
fn an_address_in_use_names_the_address_and_the_likely_cause() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let err = app()
        .run_from(["counter", "--http", &addr, "--data-dir", data_dir])
        .expect_err("serving on a taken address fails");
    let err = format!("{err:#}");
    assert!(err.contains(&addr), "{err}");
    assert!(err.contains("another process listens there"), "{err}");
    assert!(err.contains("--http"), "{err}");
}

/// The replication factor flag reaches topic creation: the single test broker cannot
/// hold two replicas, and the start says so.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_factor_the_cluster_cannot_hold_stops_the_start() {
    let bootstrap = std::env::var("EVENTFOLD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let dir = tempfile::tempdir().unwrap();
    let app_id = format!("rf-{}", std::process::id());
    let args = [
        "counter",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--kafka",
        &bootstrap,
        "--app-id",
        &app_id,
        "--kafka-replication-factor",
        "2",
    ];
    let opts = Cli::try_parse_from(args).expect("the flags parse").serve;
    let err = match app().start(&opts, &NoFlags {}) {
        Ok(_) => panic!("topics with 2 replicas were created on a single broker"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("with replication factor 2"), "{err}");
    assert!(err.contains("--kafka-replication-factor"), "{err}");
}
