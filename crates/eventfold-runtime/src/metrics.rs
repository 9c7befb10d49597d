//! Metrics in Prometheus text format: commands by outcome, command and commit latency,
//! batch sizes, restore progress. Lock-free on the hot path (atomics only).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Command outcomes counted by `eventfold_commands_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandOutcome {
    /// Events written.
    Accepted,
    /// Refused by the aggregate (422).
    Rejected,
    /// Answered from the dedup store.
    Duplicate,
    /// `If-Match` did not match (412).
    Conflict,
    /// Refused before processing (overload, restoring, failed partition) or failed commit.
    Error,
}

impl CommandOutcome {
    const ALL: [CommandOutcome; 5] = [
        Self::Accepted,
        Self::Rejected,
        Self::Duplicate,
        Self::Conflict,
        Self::Error,
    ];
    fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Rejected => "rejected",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
            Self::Error => "error",
        }
    }
}

/// A fixed-bucket histogram.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// Commit latency buckets, seconds.
pub const LATENCY_BUCKETS: &[f64] = &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Batch size buckets, commands.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

impl Histogram {
    /// A histogram with upper bounds `bounds` (ascending) plus +Inf.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((v * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cum}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count());
    }
}

/// Metrics of one aggregate type.
#[derive(Debug)]
pub struct AggregateMetrics {
    name: String,
    outcomes: [AtomicU64; 5],
    /// Seconds from a command's submission to its outcome: waiting in its partition's
    /// queue, processing, commit (or, for a partition owned elsewhere, the round trip
    /// through the commands and results topics). What a caller waits, minus HTTP.
    pub command_latency: Histogram,
    /// Seconds from the start of a commit to its durability.
    pub commit_latency: Histogram,
    /// Commands per commit.
    pub batch_size: Histogram,
}

impl AggregateMetrics {
    /// Metrics for aggregate type `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            outcomes: Default::default(),
            command_latency: Histogram::new(LATENCY_BUCKETS),
            commit_latency: Histogram::new(LATENCY_BUCKETS),
            batch_size: Histogram::new(BATCH_BUCKETS),
        }
    }

    /// Counts `n` commands with `outcome`.
    pub fn count(&self, outcome: CommandOutcome, n: u64) {
        let i = CommandOutcome::ALL.iter().position(|o| *o == outcome).expect("listed");
        self.outcomes[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Commands counted with `outcome`.
    pub fn counted(&self, outcome: CommandOutcome) -> u64 {
        let i = CommandOutcome::ALL.iter().position(|o| *o == outcome).expect("listed");
        self.outcomes[i].load(Ordering::Relaxed)
    }

    /// Appends this aggregate's series (without HELP/TYPE lines).
    pub fn render_commands(&self, out: &mut String) {
        for (i, o) in CommandOutcome::ALL.iter().enumerate() {
            let _ = writeln!(
                out,
                "eventfold_commands_total{{aggregate=\"{}\",outcome=\"{}\"}} {}",
                self.name,
                o.label(),
                self.outcomes[i].load(Ordering::Relaxed)
            );
        }
    }

    /// Appends the histogram series.
    pub fn render_histograms(&self, command: &mut String, latency: &mut String, batch: &mut String) {
        let labels = format!("aggregate=\"{}\"", self.name);
        self.command_latency
            .render(command, "eventfold_command_latency_seconds", &labels);
        self.commit_latency
            .render(latency, "eventfold_commit_latency_seconds", &labels);
        self.batch_size
            .render(batch, "eventfold_commit_batch_commands", &labels);
    }
}
