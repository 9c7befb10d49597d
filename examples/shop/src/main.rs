//! The `shop` binary: serve the example service, or drive load against one.

use clap::{Parser, Subcommand};
use std::io::Write as _;

/// mimalloc: the command path allocates many small short-lived buffers; measured faster
/// than the system allocator in `benches/commands.rs`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use shop::service::{ServeOptions, build};

#[derive(Parser)]
#[command(
    name = "shop",
    version,
    about = "eventfold example service: orders, payments, customers"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeOptions,
}

// Parsed once at start-up: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (the default when no subcommand is given).
    Serve,
    /// Operate on the views in the data directory (the service must be stopped).
    Views {
        #[command(subcommand)]
        command: ViewsCommand,
    },
}

#[derive(Subcommand)]
enum ViewsCommand {
    /// Rebuild a view from the event log: clear its rows, indexes and checkpoints, then
    /// apply every event again, with a progress bar; prints events/s at the end.
    ///
    /// Run it with the service stopped (the store allows one process) and with the same
    /// --data-dir, --app-id and --partitions as the service. In Kafka mode (--kafka, and
    /// the instance's --instance-id or --data-dir) it reads the events topic
    /// (read_committed) into that instance's local store; it produces nothing and does
    /// not join the consumer group.
    #[command(
        after_help = "Examples:\n  shop views rebuild orders --data-dir /var/lib/shop\n  shop views rebuild orders --kafka 127.0.0.1:9092 --data-dir /var/lib/shop-kafka-1"
    )]
    Rebuild {
        /// The view: orders or customers.
        view: String,
        #[command(flatten)]
        opts: ServeOptions,
    },
}

/// Makes this process keep the memory it frees, for a batch command such as `views
/// rebuild`: it allocates and frees gigabytes, and mimalloc returns freed pages to the OS
/// after 10 ms, then faults them in again (zeroed) for the next allocations. Unless
/// `MIMALLOC_PURGE_DELAY` is set already, the process re-executes itself once with it set
/// to -1 (never return freed memory; the command exits when done). A failed exec is
/// logged and the command goes on as it is.
fn keep_freed_memory() {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                tracing::debug!(error = %e, "cannot find the executable to set MIMALLOC_PURGE_DELAY");
                return;
            }
        };
        let e = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("MIMALLOC_PURGE_DELAY", "-1")
            .exec();
        tracing::debug!(error = %e, "cannot re-execute with MIMALLOC_PURGE_DELAY=-1; going on without");
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EVENTFOLD_LOG")
                .unwrap_or_else(|_| "info,fjall=warn,lsm_tree=warn".into()),
        )
        .with_writer(std::io::stderr)
        // The service's log is best effort: with stderr closed (a supervisor that stopped
        // reading it), tracing's own "unable to write" report would be an `eprintln!`,
        // which panics on EPIPE, in whichever thread logged: a request handler's
        // connection then closed without an answer.
        .log_internal_errors(false)
        .init();
    if let Err(e) = eventfold::process::disable_transparent_huge_pages() {
        tracing::debug!(error = %e, "cannot turn transparent huge pages off; going on with them");
    }
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Views { .. })) {
        keep_freed_memory();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => rt.block_on(serve(cli.serve)),
        Command::Views {
            command: ViewsCommand::Rebuild { view, opts },
        } => {
            let stats = rt.block_on(shop::service::rebuild_view(&opts, &view))?;
            println!("{}", eventfold::rebuild::summary(&view, &stats));
            Ok(())
        }
    }
}

async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let listener =
        eventfold::http::bind(opts.http).map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.http))?;
    let addr = listener.local_addr()?;
    // Other instances forward reads to the address really bound (--http may say port 0).
    let mut opts = opts;
    opts.advertised_http.get_or_insert_with(|| format!("http://{addr}"));
    let shop = build(&opts)?;
    eprintln!(
        "shop: serving http://{addr} ({}, {} partitions); restoring, see /readyz",
        match &opts.kafka {
            None => format!("embedded log in {}", opts.data_dir().display()),
            Some(b) => format!("Kafka at {b}, local cache in {}", opts.data_dir().display()),
        },
        opts.partitions,
    );
    eprintln!(
        "try:  curl -s -X POST http://{addr}/v1/aggregates/order/o-1/commands -H 'Idempotency-Key: k-1' \\\n        -d '{{\"type\":\"PlaceOrder\",\"customer_id\":\"c1\",\"items\":[{{\"sku\":\"apple\",\"qty\":2,\"price_cents\":150}}]}}'"
    );
    // The API (and /readyz, which shows restore progress) answers while the partitions
    // restore; commands for a restoring partition wait (bounded) or get 503.
    let runtime = shop.runtime.clone();
    tokio::spawn(async move {
        if runtime.wait_restored(std::time::Duration::from_secs(24 * 3600)).await {
            let _ = writeln!(
                std::io::stderr(),
                "shop: restored in {} ms",
                started.elapsed().as_millis()
            );
        }
    });
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        // Not `eprintln!`: a closed stderr must not turn a graceful stop into a panic.
        let _ = writeln!(std::io::stderr(), "shop: shutting down");
    };
    eventfold::http::serve(listener, shop.router, shutdown).await?;
    if let Some(registry) = shop.registry {
        // Others stop forwarding here at once rather than after the heartbeats run out.
        registry.leave().await;
    }
    flush_store(shop.runtime.log().store().clone()).await;
    Ok(())
}

/// Writes the store's memtables to table files on a graceful stop, so that the next start
/// does not replay the journals (after 1M commands, most of a restart's time). Failing
/// here loses nothing: the journal still holds every write. Logged through `tracing`,
/// which, unlike `eprintln!`, does not panic when stderr has been closed meanwhile (a
/// supervisor gone, a test that stopped reading).
async fn flush_store(store: eventfold::store::Store) {
    let started = std::time::Instant::now();
    match tokio::task::spawn_blocking(move || store.flush()).await {
        Ok(Ok(())) => tracing::info!(ms = started.elapsed().as_millis() as u64, "store flushed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not flush the store; the next start replays its journal"),
        Err(e) => tracing::warn!(error = %e, "the store flush failed; the next start replays its journal"),
    }
}
