//! What every handler shares: the HTTP layer's options and the state of the router
//! (`App`), and the answer when no instance owns a partition. Kept apart from `routes`
//! and `views` so that each imports it and neither imports the other.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::forward::Forwarder;
use axum::extract::{FromRequestParts, Path};
use axum::http::StatusCode;
use axum::http::request::Parts;
use eventfold_runtime::{Registry, Runtime};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;

/// Limits of the HTTP layer.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest accepted request body in bytes (64 KiB); larger gets 413.
    pub max_body_bytes: usize,
    /// Most events returned by one `GET .../events` (1000).
    pub max_events_page: usize,
    /// Address shown in `/v1/cluster`.
    pub advertised_address: String,
    /// How long a view query waits for its `min_position` before 504 (5 s).
    pub view_wait: Duration,
    /// Kafka mode with several instances: who owns which partition. Reads of an aggregate
    /// whose partition another instance owns are forwarded there (one hop), and
    /// `/v1/cluster` lists the instances. `None`: every partition is served here.
    pub registry: Option<Arc<Registry>>,
    /// How long a forwarded request waits for the owner's answer to start (10 s).
    pub forward_timeout: Duration,
    /// What forwarding to an owner serving HTTPS trusts: [`tls::client_config`](crate::tls::client_config) (the
    /// system's CAs, plus e.g. a private CA). `None`: the system's CAs alone.
    pub forward_tls: Option<Arc<rustls::ClientConfig>>,
    /// Bearer tokens: every route but the open ones (`Access` in `ROUTES`) needs one with
    /// enough role. `None`: no authentication.
    pub auth: Option<Arc<Auth>>,
    /// Requests handled at once, over all routes but the open ones (2048); one more gets
    /// 503 `overloaded`. Counted until the handler answers (not while a stream flows).
    pub max_in_flight: usize,
    /// How long a request's body may take to arrive after its headers (10 s); later: 408.
    pub body_read_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_events_page: 1000,
            advertised_address: String::new(),
            view_wait: Duration::from_secs(5),
            registry: None,
            forward_timeout: Duration::from_secs(10),
            forward_tls: None,
            auth: None,
            max_in_flight: 2048,
            body_read_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Clone)]
pub(crate) struct App {
    pub(crate) runtime: Runtime,
    pub(crate) options: Arc<HttpOptions>,
    /// Sends reads to the owning instance (with a registry only).
    pub(crate) forwarder: Option<Forwarder>,
}

/// 503 `owner_unavailable` with `Retry-After: 1`: no live instance claims partition `p` of
/// aggregate type `ty` (the consumer group is moving it).
pub(crate) fn owner_unavailable(ty: &str, p: u32) -> ApiError {
    let mut err = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "owner_unavailable",
        format!(
            "partition {p} of `{ty}` is owned by another instance and no live instance claims it yet (the consumer group is moving it); retry shortly"
        ),
    );
    err.retry_after = Some(Duration::from_secs(1));
    err
}

/// The path parameters, refused as 400 `invalid_path` `{error, message}` like every other
/// error (axum's own `Path` answers a segment that is not UTF-8 with a plain-text 400).
pub(crate) struct ApiPath<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(t)) => Ok(Self(t)),
            Err(e) => Err(ApiError::bad_request("invalid_path", e.body_text())),
        }
    }
}
