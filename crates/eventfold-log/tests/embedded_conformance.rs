//! The Log conformance suite against the embedded backend.

use async_trait::async_trait;
use eventfold_log::Log;
use eventfold_log::conformance::{Factory, run_all};
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_store::{Store, StoreOptions};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Reopens the same directory; the previous store handle is dropped first because a fjall
/// database is locked by one process handle at a time.
struct Embedded {
    dir: PathBuf,
    current: Mutex<Option<Arc<dyn Log>>>,
}

#[async_trait]
impl Factory for Embedded {
    async fn open(&self) -> Arc<dyn Log> {
        let mut cur = self.current.lock().unwrap();
        if let Some(log) = cur.as_ref() {
            return log.clone();
        }
        let store = Store::open(&self.dir, &StoreOptions::default()).unwrap();
        let log: Arc<dyn Log> = Arc::new(
            EmbeddedLog::open(
                store,
                Options {
                    partitions: 4,
                    ..Options::default()
                },
            )
            .unwrap(),
        );
        *cur = Some(log.clone());
        log
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_log_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let f = Embedded {
        dir: dir.path().to_owned(),
        current: Mutex::new(None),
    };
    run_all(&f, "conf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_log_survives_a_real_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        EmbeddedLog::open(
            store,
            Options {
                partitions: 2,
                ..Options::default()
            },
        )
        .unwrap()
    };
    let t: Arc<str> = Arc::from("re.events");
    {
        let log = open();
        let unit = eventfold_log::CommitUnit {
            appends: vec![eventfold_log::Append {
                topic: t.clone(),
                partition: 1,
                record: Default::default(),
                entity: None,
            }],
            ..Default::default()
        };
        log.commit(unit).await.unwrap();
    }
    // The committer thread of the first log holds a store clone until its channel closes.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let log = open();
    assert_eq!(log.end_offset(&t, 1).await.unwrap(), 1);
}

/// Beyond the suite: the embedded log has no transaction markers, so its offsets are
/// contiguous from 0 (positions and restore rely on `end_offset` = record count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_offsets_are_contiguous_from_zero() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let log = EmbeddedLog::open(
        store,
        Options {
            partitions: 2,
            ..Options::default()
        },
    )
    .unwrap();
    let t: Arc<str> = Arc::from("c.events");
    let mut all = Vec::new();
    for n in 1..=5 {
        let appends = (0..n)
            .map(|_| eventfold_log::Append {
                topic: t.clone(),
                partition: 1,
                record: Default::default(),
                entity: None,
            })
            .collect();
        all.extend(
            log.commit(eventfold_log::CommitUnit {
                appends,
                ..Default::default()
            })
            .await
            .unwrap()
            .offsets,
        );
    }
    assert_eq!(all, (0..15).collect::<Vec<u64>>());
    assert_eq!(log.end_offset(&t, 1).await.unwrap(), 15);
}

/// Beyond the suite: one process owns every partition of the embedded log, so it has no
/// coordination (no consumer groups, fencing or followers) and its store is the only copy;
/// a caller that needs coordination gets `Config`, through a wrapper too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_log_has_no_coordination() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let log: Arc<dyn Log> = Arc::new(EmbeddedLog::open(store, Options::default()).unwrap());
    assert!(log.coordination().is_none());
    assert!(matches!(
        log.require_coordination(),
        Err(eventfold_log::Error::Config(_))
    ));
    let wrapped = eventfold_log::testing::Intercept::new(log);
    assert!(wrapped.coordination().is_none());
}
