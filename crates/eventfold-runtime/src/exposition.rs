//! The runtime's metrics in Prometheus text format (`GET /metrics`): each part renders its
//! own samples (`metrics.rs`, the views, the process managers); this module orders them and
//! writes the HELP and TYPE lines they share.

use crate::command::PartitionState;
use crate::service::{AggregateService, PartitionReport};
use crate::view::ViewSlot;
use eventfold_log::Log;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

/// What the metrics are read from.
pub(crate) struct Sources<'a> {
    pub services: &'a BTreeMap<String, Arc<dyn AggregateService>>,
    pub log: &'a dyn Log,
    pub partitions: &'a [PartitionReport],
    pub views: &'a BTreeMap<String, Arc<ViewSlot>>,
    pub processes: &'a BTreeMap<String, Arc<crate::process::ProcessService>>,
}

/// Every metric of the runtime, in Prometheus text format.
pub(crate) fn render(s: Sources<'_>) -> String {
    let mut out = String::new();
    commands(&mut out, s.services);
    log_stats(&mut out, s.log);
    partitions(&mut out, s.partitions);
    views(&mut out, s.views);
    processes(&mut out, s.processes);
    out
}

/// Commands by outcome and the command path's histograms, per aggregate type.
fn commands(out: &mut String, services: &BTreeMap<String, Arc<dyn AggregateService>>) {
    out.push_str("# HELP eventfold_commands_total Commands by aggregate type and outcome.\n# TYPE eventfold_commands_total counter\n");
    for s in services.values() {
        s.metrics().render_commands(out);
    }
    let (mut command, mut latency, mut batch) = (String::new(), String::new(), String::new());
    for s in services.values() {
        s.metrics().render_histograms(&mut command, &mut latency, &mut batch);
    }
    out.push_str("# HELP eventfold_command_latency_seconds Time from a command's submission to its outcome (queue, processing, commit; through Kafka for partitions owned elsewhere).\n# TYPE eventfold_command_latency_seconds histogram\n");
    out.push_str(&command);
    out.push_str("# HELP eventfold_commit_latency_seconds Time from the start of a commit to its durability.\n# TYPE eventfold_commit_latency_seconds histogram\n");
    out.push_str(&latency);
    out.push_str("# HELP eventfold_commit_batch_commands Commands per commit unit.\n# TYPE eventfold_commit_batch_commands histogram\n");
    out.push_str(&batch);
}

/// The log's counters; Kafka's per-step transaction times and broker requests too.
fn log_stats(out: &mut String, log: &dyn Log) {
    let ls = log.stats();
    let backend = log.backend();
    for (name, help, value) in [
        (
            "eventfold_log_group_commits_total",
            "Group commits (embedded: fsyncs) or transactions.",
            ls.group_commits as f64,
        ),
        ("eventfold_log_units_total", "Commit units written.", ls.units as f64),
        ("eventfold_log_records_total", "Records appended.", ls.records as f64),
        (
            "eventfold_log_write_seconds_total",
            "Time spent writing and syncing.",
            ls.write_micros as f64 / 1e6,
        ),
        (
            "eventfold_log_busy_seconds_total",
            "Time the committer was busy.",
            ls.busy_micros as f64 / 1e6,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{backend=\"{backend}\"}} {value}"
        );
    }
    if log.coordination().is_some() {
        let name = "eventfold_log_transaction_stage_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Time the Kafka log's commits spent in each step (produce, send_offsets, delivery, commit, local_write).\n# TYPE {name} counter"
        );
        for (stage, micros) in ls.stages.named() {
            let _ = writeln!(
                out,
                "{name}{{backend=\"{backend}\",stage=\"{stage}\"}} {}",
                micros as f64 / 1e6
            );
        }
        let name = "eventfold_log_broker_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests the Kafka log sent to the broker on behalf of readers: partition ends (list_offsets) and reads the local cache could not answer (fetch).\n# TYPE {name} counter\n{name}{{backend=\"{backend}\",kind=\"list_offsets\"}} {}\n{name}{{backend=\"{backend}\",kind=\"fetch\"}} {}",
            ls.end_offset_queries, ls.broker_reads
        );
    }
}

/// One gauge per partition: restore progress, state, queue and cache.
fn partitions(out: &mut String, parts: &[PartitionReport]) {
    partition_gauge(
        out,
        parts,
        "eventfold_restore_progress",
        "Restore progress of a partition (0 to 1).",
        |p| p.restore_progress.to_string(),
    );
    partition_gauge(
        out,
        parts,
        "eventfold_partition_up",
        "Whether a partition takes commands (1), restores (0), failed (-1) or is owned by another instance (2).",
        |p| {
            match p.state {
                PartitionState::Ready => "1",
                PartitionState::Restoring => "0",
                PartitionState::Failed => "-1",
                PartitionState::Remote => "2",
            }
            .to_owned()
        },
    );
    partition_gauge(
        out,
        parts,
        "eventfold_partition_queued_commands",
        "Commands waiting in a partition's queue.",
        |p| p.queued.to_string(),
    );
    partition_gauge(
        out,
        parts,
        "eventfold_partition_cached_aggregates",
        "Aggregates a partition's processor keeps in memory.",
        |p| p.cached_aggregates.to_string(),
    );
}

/// The views' applied offsets, states and unique conflicts.
fn views(out: &mut String, views: &BTreeMap<String, Arc<ViewSlot>>) {
    let (mut applied, mut up, mut conflicts) = (String::new(), String::new(), String::new());
    for slot in views.values() {
        slot.serving().render_metrics(&mut applied, &mut up, &mut conflicts);
    }
    if !applied.is_empty() {
        out.push_str("# HELP eventfold_view_applied_offset Next source offset a view partition will apply.\n# TYPE eventfold_view_applied_offset gauge\n");
        out.push_str(&applied);
        out.push_str("# HELP eventfold_view_up Whether a view partition has caught up (1), catches up (0) or failed (-1).\n# TYPE eventfold_view_up gauge\n");
        out.push_str(&up);
    }
    if !conflicts.is_empty() {
        out.push_str("# HELP eventfold_view_unique_conflicts_total Rows not indexed because another row holds the unique value.\n# TYPE eventfold_view_unique_conflicts_total counter\n");
        out.push_str(&conflicts);
    }
}

/// The process managers' states, lags and timers.
fn processes(out: &mut String, processes: &BTreeMap<String, Arc<crate::process::ProcessService>>) {
    if !processes.is_empty() {
        out.push_str("# HELP eventfold_process_manager_up Process managers: up (1: caught up), lag (source events not read), reactions, timers pending and overdue (due over 1 s ago), commands outstanding.\n");
        for p in processes.values() {
            p.render_metrics(out);
        }
    }
}

/// Appends gauge `name` with one sample per partition of `parts`.
fn partition_gauge(
    out: &mut String,
    parts: &[PartitionReport],
    name: &str,
    help: &str,
    value: impl Fn(&PartitionReport) -> String,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for p in parts {
        let _ = writeln!(
            out,
            "{name}{{aggregate=\"{}\",partition=\"{}\"}} {}",
            p.aggregate,
            p.partition,
            value(p)
        );
    }
}
