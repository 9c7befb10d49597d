//! eventfold-http: the HTTP API of DESIGN §6 on axum.
//!
//! Every error leaves through [`ApiError`], so every error body is
//! `{"error": <stable code>, "message": <sentence>}`.

#![warn(missing_docs)]

mod app;
pub mod auth;
pub mod cluster;
mod connector;
pub mod console;
mod error;
pub mod forward;
mod guard;
mod listing;
pub mod openapi;
mod process;
mod route_table;
mod routes;
mod server;
pub mod tls;
mod views;

pub use axum::Router;
pub use error::ApiError;
pub use route_table::{ROUTES, Route};
pub use routes::{HttpOptions, router};
pub use server::{ServerLimits, serve_tls, serve_with};

use std::future::Future;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket};

/// Connections the kernel may hold for [`serve`] to accept (Linux caps it at
/// `net.core.somaxconn`, 4096 by default since 5.4). `TcpListener::bind` of std and tokio
/// listens with 128: when a burst of clients connects faster than a busy service accepts
/// (1,024 load-generator workers opening their connections within 0.2 s), the kernel drops
/// the SYNs past that queue and each of those clients waits for its TCP retransmission,
/// 1 s, before its first request goes out.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` for [`serve`], with [`LISTEN_BACKLOG`] pending connections.
/// Must be called inside a tokio runtime.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As std and tokio do: a restarted service can bind again while the old connections
    // sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `router` on `listener` with the default [`ServerLimits`] until `shutdown`
/// resolves, then drains open requests.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, ServerLimits::default(), shutdown).await
}
