//! Offline view rebuilds for service binaries (e.g. `shop views rebuild orders`): runs
//! [`eventfold_runtime::view::rebuild`] with a progress bar on stderr and summarises the
//! throughput.
//!
//! The service knows its projections, so the subcommand lives in its binary; this module
//! is the part every such binary shares.

use std::sync::Arc;

use eventfold_core::Projection;
use eventfold_log::Log;
use eventfold_runtime::{RebuildStats, ViewOptions};
pub use indicatif::ProgressDrawTarget;
use indicatif::{ProgressBar, ProgressStyle};

/// Rebuilds the view of `P` from the events in `log` (see
/// [`eventfold_runtime::view::rebuild`]), drawing progress on `draw` (use
/// `ProgressDrawTarget::stderr()`: it stays hidden when stderr is not a terminal), then
/// flushes the store ([`eventfold_store::Store::flush`]).
pub async fn run<P: Projection>(
    log: Arc<dyn Log>,
    app_id: &str,
    options: &ViewOptions,
    draw: ProgressDrawTarget,
) -> anyhow::Result<RebuildStats> {
    let bar = ProgressBar::with_draw_target(None, draw);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} events ({per_sec}, {eta} left) {msg}",
        )
        .expect("constant template is valid")
        .progress_chars("=> "),
    );
    bar.set_message(format!("view {}", P::VIEW));
    let mut progress = |applied: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(applied);
    };
    let store = log.store().clone();
    let stats = eventfold_runtime::view::rebuild::<P>(log, app_id, options, &mut progress).await;
    bar.finish_and_clear();
    let stats = stats?;
    // The service's next start then has no journal to replay (see `Store::flush`).
    tokio::task::spawn_blocking(move || store.flush())
        .await?
        .map_err(|e| anyhow::anyhow!("the view was rebuilt, but the store could not be flushed: {e}"))?;
    Ok(stats)
}

/// One line for the end of a rebuild: events, time, events/s, rows and conflicts.
pub fn summary(view: &str, stats: &RebuildStats) -> String {
    let secs = stats.elapsed.as_secs_f64();
    let rate = if secs > 0.0 { stats.events as f64 / secs } else { 0.0 };
    format!(
        "rebuilt view `{view}`: {} events in {secs:.2} s ({rate:.0} events/s); {} rows, {} unique-index conflicts, about {} old entries cleared",
        stats.events, stats.rows, stats.unique_conflicts, stats.cleared
    )
}
