//! The store's background threads run at `StoreOptions::background_nice`, read back from
//! the kernel (`/proc/self/task/*/stat`). Alone in its test binary: the setting is
//! process-wide (the first store opened with a nonzero value sets it).

use eventfold_store::{Batch, Store, StoreOptions};

/// The nice value in a `/proc/.../stat` line.
fn nice_of(stat: &str) -> i32 {
    // After the name: state is field 3 of stat(5), nice field 19.
    stat.rsplit_once(") ")
        .unwrap()
        .1
        .split(' ')
        .nth(19 - 3)
        .unwrap()
        .parse()
        .unwrap()
}

/// `(thread name, nice value)` of this process's threads.
fn threads() -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let name = stat.split_once(" (").unwrap().1.rsplit_once(") ").unwrap().0;
        out.push((name.to_owned(), nice_of(&stat)));
    }
    out
}

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
    let all = threads();
    let workers: Vec<i32> = all
        .iter()
        .filter(|(n, _)| n == "fjall:worker")
        .map(|(_, n)| *n)
        .collect();
    assert!(!workers.is_empty(), "no fjall worker threads among {all:?}");
    assert!(workers.iter().all(|n| *n == 7), "worker nice values {workers:?}");
    // The test's own thread is untouched.
    assert_eq!(nice_of(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()), 0);
}
