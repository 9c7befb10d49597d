//! `cqrs-peer`: serves the shop `order` aggregate on cqrs-es + postgres-es over HTTP.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use cqrs_peer::http::{App, router};
use sqlx::postgres::PgPoolOptions;

const USAGE: &str = "\
cqrs-peer: eventfold's shop `order` aggregate on cqrs-es + postgres-es, over eventfold's HTTP API

Usage: cqrs-peer [OPTIONS]

Options:
  --listen ADDR          address to serve HTTP on [default: 127.0.0.1:8090]
  --database-url URL     PostgreSQL holding the postgres-es schema (see pg.sh)
                         [default: postgres://postgres@127.0.0.1:25432/cqrs]
  --pool-size N          sqlx connections to PostgreSQL, opened at start [default: 32]
  --max-body-bytes B     larger command bodies get 413 [default: 65536]
  -h, --help             print this help
";

struct Options {
    listen: SocketAddr,
    database_url: String,
    pool_size: u32,
    max_body_bytes: usize,
}

fn parse_args() -> Result<Option<Options>, String> {
    let mut opts = Options {
        listen: "127.0.0.1:8090".parse().expect("valid default address"),
        database_url: "postgres://postgres@127.0.0.1:25432/cqrs".to_owned(),
        pool_size: 32,
        max_body_bytes: 65536,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if name == "-h" || name == "--help" {
            return Ok(None);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--listen" => {
                let v = value()?;
                opts.listen = v.parse().map_err(|e| format!("--listen {v:?}: {e}"))?;
            }
            "--database-url" => opts.database_url = value()?,
            "--pool-size" => {
                let v = value()?;
                opts.pool_size = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--pool-size {v:?}: expected a positive integer"))?;
            }
            "--max-body-bytes" => {
                let v = value()?;
                opts.max_body_bytes = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--max-body-bytes {v:?}: expected a positive integer"))?;
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(Some(opts))
}

#[tokio::main]
async fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(Some(opts)) => opts,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("cqrs-peer: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cqrs-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(opts: Options) -> Result<(), String> {
    let pool = PgPoolOptions::new()
        .max_connections(opts.pool_size)
        // Keep every connection open so no request pays for a connection handshake.
        .min_connections(opts.pool_size)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&opts.database_url)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", opts.database_url))?;
    // Fail at start, not on the first command, when the schema is missing.
    sqlx::query("SELECT 1 FROM events LIMIT 0")
        .execute(&pool)
        .await
        .map_err(|e| format!("the postgres-es `events` table is not usable (run pg.sh start): {e}"))?;

    let app = router(App::new(pool.clone()), opts.max_body_bytes);
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", opts.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "cqrs-peer: serving http://{local} (database {}, pool {})",
        opts.database_url, opts.pool_size
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| format!("server: {e}"))?;
    pool.close().await;
    Ok(())
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    eprintln!("cqrs-peer: shutting down");
}
