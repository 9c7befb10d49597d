//! The accept loop under the router: a bound on open connections and a deadline on
//! reading each request's headers, which `axum::serve` does not offer (its hyper builder
//! has no timer, so hyper's header timeout never fires). Otherwise it serves like
//! `axum::serve`: HTTP/1.1 with keep-alive, each connection a task, and a graceful stop
//! that finishes the requests in flight. With [`Tls`], HTTPS only: each connection's
//! handshake runs in its own task, bounded by the header timeout, so a slow or silent
//! client holds a connection slot no longer than a slow plain one.

use crate::tls::Tls;
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
    /// timeout of a kept-alive connection. Past it the connection is closed. With TLS the
    /// handshake has this long too, and the headers as long again after it.
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
    accept_loop(listener, router, limits, None, shutdown).await
}

/// As [`serve_with`], over TLS: HTTPS only (a plain HTTP request fails its handshake).
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    tls: Tls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    accept_loop(listener, router, limits, Some(tls), shutdown).await
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    tls: Option<Tls>,
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
        let service = TowerToHyperService::new(router.clone());
        let Some(tls) = &tls else {
            let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                drop(permit);
            });
            continue;
        };
        // The handshake in the connection's task, so that one slow client does not hold
        // up the accepting; a stop waits for it (bounded) like for a connection.
        let (acceptor, builder, watcher) = (tls.acceptor.clone(), builder.clone(), graceful.watcher());
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let conn = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
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
