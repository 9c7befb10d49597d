//! What a request passes before its route's handler (the layer `routes::router` puts on
//! every entry of [`ROUTES`](crate::ROUTES)): its bearer token against the route's
//! [`Access`] (401, 403), the token's rate limit (429 + `Retry-After`), the bound on
//! requests in flight (503 `overloaded`), and for a route with a body, the deadline on
//! reading it (408). Open routes (`/healthz`, `/readyz`) pass straight through, so probes
//! still answer when the service is at its bound.

use crate::auth::{Access, Auth, Role, Verdict};
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The state of one route's guard.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    /// The route, for messages.
    pub(crate) method: &'static str,
    pub(crate) path: &'static str,
    pub(crate) access: Access,
    /// The service's tokens; `None`: no authentication.
    pub(crate) auth: Option<Arc<Auth>>,
    /// Requests in flight, shared by every route.
    pub(crate) in_flight: Arc<Semaphore>,
    pub(crate) max_in_flight: usize,
    /// A route that takes a body: its deadline and largest size.
    pub(crate) body: Option<(Duration, usize)>,
}

pub(crate) async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    if let Some(auth) = &g.auth
        && let Some(needed) = g.access.required(auth.options().protect_metrics)
        && let Some(refusal) = authorize(&g, auth, needed, &req)
    {
        return refusal;
    }
    if g.access == Access::Open {
        return next.run(req).await;
    }
    // Held until the handler has answered (a stream's body is not counted).
    let Ok(_permit) = g.in_flight.try_acquire() else {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "{} requests are in flight, the most this service takes at once; retry shortly",
                g.max_in_flight
            ),
        );
        err.retry_after = Some(Duration::from_secs(1));
        return err.into_response();
    };
    let req = match g.body {
        Some((deadline, limit)) => match read_body(req, deadline, limit).await {
            Ok(req) => req,
            Err(refusal) => return refusal,
        },
        None => req,
    };
    next.run(req).await
}

/// The bearer token of `req` checked for `needed`: `Some` is the refusal to send.
fn authorize(g: &Guard, auth: &Auth, needed: Role, req: &Request) -> Option<Response> {
    let Some(token) = bearer(req) else {
        return Some(unauthenticated(
            format!(
                "{} {} needs a bearer token with role `{needed}` or above (header `Authorization: Bearer <token>`)",
                g.method, g.path
            ),
            "Bearer realm=\"eventfold\"",
        ));
    };
    match auth.check(token, needed) {
        (Verdict::Allowed, _) => None,
        (Verdict::Unknown, _) => Some(unauthenticated(
            "the bearer token is not one of this service's tokens".to_owned(),
            "Bearer realm=\"eventfold\", error=\"invalid_token\"",
        )),
        (Verdict::Forbidden { role }, name) => Some(
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "token `{}` has role `{role}`; {} {} needs `{needed}` or above",
                    name.unwrap_or_default(),
                    g.method,
                    g.path
                ),
            )
            .into_response(),
        ),
        (Verdict::Limited(wait), name) => {
            let rate = auth.options().rate;
            let mut err = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "token `{}` is over its rate limit ({} requests a second, bursts of {}); retry in {} ms",
                    name.unwrap_or_default(),
                    rate.per_second,
                    rate.burst,
                    wait.as_millis().max(1)
                ),
            );
            // Whole seconds, rounded up: never earlier than the bucket allows.
            err.retry_after = Some(Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)));
            Some(err.into_response())
        }
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case).
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthenticated(message: String, challenge: &'static str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message).into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    r
}

/// Reads the whole body of `req` within `deadline` (from when its headers were read), at
/// most `limit` bytes, so that a client sending its body slowly cannot hold a request
/// open; the handler then gets it in one piece.
async fn read_body(req: Request, deadline: Duration, limit: usize) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let read = http_body_util::Limited::new(body, limit).collect();
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(collected)) => Ok(Request::from_parts(parts, Body::from(collected.to_bytes()))),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
        .into_response()),
        Ok(Err(e)) => {
            Err(ApiError::bad_request("bad_request", format!("cannot read the request body: {e}")).into_response())
        }
        Err(_) => {
            let mut r = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!("the request body did not arrive within {deadline:?}"),
            )
            .into_response();
            // The rest of the body is not read: the connection cannot carry another request.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(r)
        }
    }
}
