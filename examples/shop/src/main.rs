//! The `shop` binary: serve the example service, or drive load against one.

use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (the default when no subcommand is given).
    Serve,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EVENTFOLD_LOG")
                .unwrap_or_else(|_| "info,fjall=warn,lsm_tree=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => rt.block_on(serve(cli.serve)),
    }
}

async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let shop = build(&opts)?;
    let listener = tokio::net::TcpListener::bind(opts.http)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.http))?;
    let addr = listener.local_addr()?;
    let restored = shop.runtime.wait_restored(std::time::Duration::from_secs(300)).await;
    eprintln!(
        "shop: serving http://{addr} ({}, {} partitions; {} in {} ms)",
        match &opts.kafka {
            None => format!("embedded log in {}", opts.data_dir().display()),
            Some(b) => format!("Kafka at {b}, local cache in {}", opts.data_dir().display()),
        },
        opts.partitions,
        if restored { "restored" } else { "still restoring" },
        started.elapsed().as_millis()
    );
    eprintln!(
        "try:  curl -s -X POST http://{addr}/v1/aggregates/order/o-1/commands -H 'Idempotency-Key: k-1' \\\n        -d '{{\"type\":\"PlaceOrder\",\"customer_id\":\"c1\",\"items\":[{{\"sku\":\"apple\",\"qty\":2,\"price_cents\":150}}]}}'"
    );
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        eprintln!("shop: shutting down");
    };
    eventfold::http::serve(listener, shop.router, shutdown).await?;
    Ok(())
}
