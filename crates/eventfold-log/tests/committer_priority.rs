//! The embedded committer thread's scheduling priority (`Options::committer_nice`), read
//! back from the kernel (`/proc/self/task/*/stat`). Alone in its test binary, so the only
//! committer threads are this test's.

use eventfold_log::embedded::{COMMITTER_THREAD, EmbeddedLog, Options};
use eventfold_log::priority::Applied;
use eventfold_store::{Store, StoreOptions};

/// The nice values of this process's committer threads, sorted.
fn committer_nices() -> Vec<i32> {
    let comm = &COMMITTER_THREAD[..15];
    let mut nices = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap();
        let (name, rest) = stat.split_once(" (").unwrap().1.rsplit_once(") ").unwrap();
        if name == comm {
            // After the name: state is field 3 of stat(5), nice field 19.
            nices.push(rest.split(' ').nth(19 - 3).unwrap().parse().unwrap());
        }
    }
    nices.sort_unstable();
    nices
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
