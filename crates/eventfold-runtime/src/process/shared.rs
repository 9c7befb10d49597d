//! What a process manager's worker and its readers share: options, lifecycle, counters.

use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

/// Knobs of the process manager workers (defaults in parentheses).
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// Most inputs (events, timers, outcomes) per batch (1024).
    pub max_batch: usize,
    /// The longest a worker sleeps without being woken (100 ms): the bound on how late a
    /// timer fires after it is due, and on noticing a clock moved by hand.
    pub poll_interval: Duration,
    /// Commands handed over and not answered yet above which the worker reads no new
    /// events (10,000): backpressure when targets are slow.
    pub max_outstanding: usize,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        Self {
            max_batch: 1024,
            poll_interval: Duration::from_millis(100),
            max_outstanding: 10_000,
        }
    }
}

/// Lifecycle of a process manager, as `/readyz` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// Reading what its sources held when it started (the restore barrier).
    CatchingUp,
    /// Caught up; reacting as events arrive.
    Ready,
    /// Stopped after a fatal error (see `error`); restart after the fix.
    Failed,
    /// Kafka mode: another instance runs it.
    Remote,
}

/// Status shared between a worker and readers (lock-free on the request path).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    state: AtomicU8,
    pub(super) lag: AtomicU64,
    pub(super) reactions: AtomicU64,
    pub(super) timers_pending: AtomicU64,
    pub(super) outstanding: AtomicU64,
    /// When the worker last looked at the overdue timers, and how many it found.
    pub(super) overdue: AtomicU64,
    pub(super) overdue_checked_ms: AtomicI64,
    /// The worker's due floor (see `Worker::due_floor`), where overdue counts start.
    pub(super) due_floor: Mutex<Option<(i64, String, String)>>,
    pub(super) failure: Mutex<Option<String>>,
}

impl Shared {
    pub(super) fn state(&self) -> ProcessState {
        match self.state.load(Ordering::Acquire) {
            0 => ProcessState::CatchingUp,
            1 => ProcessState::Ready,
            3 => ProcessState::Remote,
            _ => ProcessState::Failed,
        }
    }

    /// Another instance runs it: its gauges are the owner's to report.
    pub(crate) fn set_remote(&self) {
        if self.state() != ProcessState::Failed {
            self.state.store(3, Ordering::Release);
        }
        for gauge in [&self.lag, &self.timers_pending, &self.outstanding, &self.overdue] {
            gauge.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_catching_up(&self) {
        if self.state() != ProcessState::Failed {
            self.state.store(0, Ordering::Release);
        }
    }

    pub(crate) fn set_ready(&self) {
        if self.state() == ProcessState::CatchingUp {
            self.state.store(1, Ordering::Release);
        }
    }

    pub(crate) fn fail(&self, name: &str, reason: String) {
        tracing::error!(process_manager = name, %reason, "process manager stopped");
        *self.failure.lock().expect("not poisoned") = Some(reason);
        self.state.store(2, Ordering::Release);
    }
}
