//! The store's background threads run at `StoreOptions::background_nice`, read back from
//! the kernel (`priority::thread_nice_values`). Alone in its test binary: the setting is
//! process-wide (the first store opened with a nonzero value sets it).

use eventfold_store::priority::thread_nice_values;
use eventfold_store::{Batch, Store, StoreOptions};

#[test]
fn flush_and_compaction_workers_run_at_the_background_nice_value() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        &StoreOptions {
            background_nice: 7,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let mut b = Batch::new();
    b.put_meta("x", 1);
    store.commit(b, true).unwrap();
    // Memtables written out: the workers have run.
    store.flush().unwrap();
    let workers = thread_nice_values("fjall:worker");
    assert!(!workers.is_empty(), "no fjall worker threads");
    assert!(workers.iter().all(|n| *n == 7), "worker nice values {workers:?}");
    // The test's own thread is untouched.
    let me = rustix::thread::gettid();
    assert_eq!(rustix::process::getpriority_process(Some(me)).unwrap(), 0);
}
