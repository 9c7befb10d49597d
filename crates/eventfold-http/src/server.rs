//! The accept loop under the router: a bound on open connections and a deadline on
//! reading each request's headers, which `axum::serve` does not offer (its hyper builder
//! has no timer, so hyper's header timeout never fires). Otherwise it serves like
//! `axum::serve`: HTTP/1.1 with keep-alive, each connection a task, and a graceful stop
//! that finishes the requests in flight.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Limits of the connections themselves, below the routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections open at once (4096). At the bound the service stops accepting: new
    /// connections wait in the kernel's accept queue (up to
    /// [`LISTEN_BACKLOG`](crate::LISTEN_BACKLOG)) until one closes.
    pub max_connections: usize,
    /// How long a client has to send a request's complete headers, from when the
    /// connection opens or its previous answer went out (10 s): so it is also the idle
    /// timeout of a kept-alive connection. Past it the connection is closed.
    pub header_read_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves, then stops
/// accepting and waits for the open connections to finish what they were answering.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        // A free slot first: at the bound, connections wait in the kernel's queue.
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = open.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
        };
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// As `axum::serve` (after hyper 0.14): a connection reset before it was accepted is the
/// client's affair; anything else (typically EMFILE, out of file descriptors) is logged
/// and the loop waits a second for descriptors to free up.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "cannot accept a connection; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
