//! eventfold-http: the HTTP API of DESIGN §6 on axum.
//!
//! Every error leaves through [`ApiError`], so every error body is
//! `{"error": <stable code>, "message": <sentence>}`.

pub mod cluster;
mod error;
pub mod forward;
mod routes;
mod views;

pub use axum::Router;
pub use error::ApiError;
pub use routes::{HttpOptions, router};

use std::future::Future;
use tokio::net::TcpListener;

/// Serves `router` on `listener` until `shutdown` resolves, then drains open requests.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}
