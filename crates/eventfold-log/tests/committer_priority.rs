//! The embedded committer thread's scheduling priority (`Options::committer_nice`), read
//! back from the kernel (`priority::thread_nice_values`). Alone in its test binary, so the only
//! committer threads are this test's.

use eventfold_log::embedded::{COMMITTER_THREAD, EmbeddedLog, Options};
use eventfold_log::priority::Applied;
use eventfold_store::{Store, StoreOptions};

fn committer_nices() -> Vec<i32> {
    eventfold_log::priority::thread_nice_values(COMMITTER_THREAD)
}

fn open(dir: &std::path::Path, committer_nice: i32) -> EmbeddedLog {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    EmbeddedLog::open(
        store,
        Options {
            committer_nice,
            ..Options::default()
        },
    )
    .unwrap()
}

#[test]
fn the_committer_thread_runs_at_the_nice_value_asked_for_when_permitted() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let raised = open(a.path(), -5);
    let plain = open(b.path(), 0);
    assert_eq!(plain.committer_priority(), Applied::Unchanged);
    match raised.committer_priority() {
        Applied::Set(n) => {
            assert_eq!(n, -5);
            assert_eq!(committer_nices(), vec![-5, 0]);
        }
        // Without CAP_SYS_NICE or RLIMIT_NICE the refusal is reported and nothing changed;
        // CI runs as root, where the priority must really be raised.
        Applied::Refused { wanted: -5, actual } if !rustix::process::geteuid().is_root() => {
            assert_eq!(committer_nices(), vec![actual, 0]);
        }
        other => panic!("committer priority: {other:?}"),
    }
}
