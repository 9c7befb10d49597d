//! Scheduling priority of eventfold's own threads.
//!
//! **Background threads** (the store's flushes and compactions, see
//! [`crate::StoreOptions::background_nice`]) run at a lower priority: their work can wait
//! a few milliseconds, a request cannot. Lowering a priority is always permitted.
//! Figures: bench/FINDINGS.md, "Moved from code comments".
//!
//! **Committer threads** run at a higher one. A committer is the one thread every commit
//! of its log passes through; whenever it waits for a core, every writer waits with it. On a machine whose cores are busy with request
//! handling (the tokio workers) and background flushes, the kernel's fair scheduler lets it
//! wait its turn after each fsync (bench/FINDINGS.md, "Moved from code comments"). A
//! higher priority (a lower nice value) lets it run as soon as its fsync returns.
//!
//! Raising a priority needs `CAP_SYS_NICE` (root has it) or an `RLIMIT_NICE` that allows
//! the value (`ulimit -e`, systemd's `LimitNICE=`). Without either the thread keeps the
//! process's priority: everything works, only slower under CPU contention.

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The thread runs at this nice value.
    Set(i32),
    /// Asked for nothing (nice 0): the thread keeps the process's priority.
    Unchanged,
    /// Not permitted; the thread keeps the process's priority (this nice value).
    Refused {
        /// The nice value asked for.
        wanted: i32,
        /// The nice value in force.
        actual: i32,
    },
}

/// Sets the calling thread's nice value to `nice` (Linux; elsewhere [`Applied::Unchanged`]).
pub fn apply(nice: i32) -> Applied {
    if nice == 0 {
        return Applied::Unchanged;
    }
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        // On Linux the nice value is per thread: `setpriority(PRIO_PROCESS, tid)`.
        let tid = Some(rustix::thread::gettid());
        match setpriority_process(tid, nice) {
            Ok(()) => Applied::Set(getpriority_process(tid).unwrap_or(nice)),
            Err(_) => Applied::Refused {
                wanted: nice,
                actual: getpriority_process(tid).unwrap_or(0),
            },
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Applied::Unchanged
    }
}

/// Logs what [`apply`] did for the committer thread `thread`.
pub fn log(thread: &str, applied: Applied) {
    match applied {
        Applied::Set(n) => tracing::info!(thread, nice = n, "committer thread priority raised"),
        Applied::Unchanged => {}
        Applied::Refused { wanted, actual } => tracing::info!(
            thread,
            wanted,
            actual,
            "cannot raise the committer thread's priority (needs CAP_SYS_NICE or `ulimit -e {}`); commits run at the process's priority and are slower when the cores are busy",
            20 - wanted
        ),
    }
}

/// The nice values of this process's threads named `name` (as `/proc/self/task/*/comm`
/// shows it: cut to 15 bytes), read back from the kernel, sorted; for diagnostics and
/// tests (Linux; elsewhere empty).
pub fn thread_nice_values(name: &str) -> Vec<i32> {
    let mut nices = Vec::new();
    #[cfg(target_os = "linux")]
    {
        let name = &name.as_bytes()[..name.len().min(15)];
        for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
            let comm = std::fs::read(task.path().join("comm")).unwrap_or_default();
            let tid = task.file_name().to_str().and_then(|t| t.parse().ok());
            let pid = tid.and_then(rustix::process::Pid::from_raw);
            // A thread that ended meanwhile has no comm or priority left: skipped.
            if comm.strip_suffix(b"\n") == Some(name)
                && let Some(nice) = pid.and_then(|p| rustix::process::getpriority_process(Some(p)).ok())
            {
                nices.push(nice);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = name;
    nices.sort_unstable();
    nices
}
