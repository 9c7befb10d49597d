//! The HTTP API: eventfold's routes and bodies (DESIGN §6) for the `order` aggregate, served
//! by cqrs-es's `CqrsFramework` on postgres-es.
//!
//! | route | answers |
//! |---|---|
//! | `POST /v1/aggregates/order/{id}/commands` | 200 `{aggregate_id, version, events}`; 400 `malformed_command` / `unknown_command_type` / `bad_request` / `if_match_unsupported`; 404 `unknown_aggregate_type`; 409 `aggregate_conflict`; 413 `payload_too_large`; 422 the rejection; 500 `store_error` |
//! | `GET /v1/aggregates/order/{id}` | 200 `{id, version, state}` + `ETag`; 304 on `If-None-Match`; 404 `aggregate_not_found` |
//! | `GET /healthz` | 200 `{"status":"ok"}` |
//!
//! `Idempotency-Key` is checked for shape (as eventfold does) and then **ignored**: cqrs-es
//! has no command deduplication, so a retried command runs again.

use std::cell::RefCell;
use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cqrs_es::persist::PersistedEventStore;
use cqrs_es::{AggregateError, CqrsFramework, EventEnvelope, EventStore, Query};
use postgres_es::PostgresEventRepository;
use serde_json::{Value, json};
use sqlx::{Pool, Postgres};

use crate::domain::{Order, OrderCommand, OrderEvent};

type Store = PersistedEventStore<PostgresEventRepository, Order>;

/// What the handlers share.
#[derive(Clone)]
pub struct App {
    cqrs: Arc<CqrsFramework<Order, Store>>,
    /// A second store on the same pool, for `GET` (the framework keeps its own private).
    store: Arc<Store>,
}

impl App {
    /// The framework exactly as `postgres_es::postgres_cqrs` builds it (plain event store: every
    /// command loads all of the aggregate's events), plus the [`CommitTap`] query.
    pub fn new(pool: Pool<Postgres>) -> Self {
        let cqrs = postgres_es::postgres_cqrs(pool.clone(), vec![Box::new(CommitTap)], ());
        let store = PersistedEventStore::new_event_store(PostgresEventRepository::new(pool));
        Self {
            cqrs: Arc::new(cqrs),
            store: Arc::new(store),
        }
    }
}

/// The router with every route; `max_body_bytes` bounds command bodies (413 above it).
pub fn router(app: App, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/aggregates/{type}/{id}/commands", post(post_command))
        .route("/v1/aggregates/{type}/{id}", get(get_state))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(app)
}

tokio::task_local! {
    /// The events the current request committed, as `(sequence, event)`.
    static COMMITTED: RefCell<Vec<(usize, OrderEvent)>>;
}

/// A cqrs-es query that hands the committed envelopes back to the request that committed
/// them. `CqrsFramework::execute` calls its queries inline, in the caller's task, right
/// after the commit, so a task-local carries them: this is how the peer learns the new
/// version without a second database round trip.
struct CommitTap;

#[async_trait]
impl Query<Order> for CommitTap {
    async fn dispatch(&self, _aggregate_id: &str, events: &[EventEnvelope<Order>]) {
        // Outside a request scope (never, here) there is nobody to tell.
        let _ = COMMITTED.try_with(|committed| {
            committed
                .borrow_mut()
                .extend(events.iter().map(|e| (e.sequence, e.payload.clone())));
        });
    }
}

/// An error answer `{error, message}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable error code.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.code, "message": self.message}))).into_response()
    }
}

impl From<AggregateError<crate::domain::OrderRejection>> for ApiError {
    fn from(err: AggregateError<crate::domain::OrderRejection>) -> Self {
        match err {
            AggregateError::UserError(rejection) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                rejection.code(),
                rejection.to_string(),
            ),
            // A concurrent command on the same order committed the same sequence number
            // first (primary key violation on (aggregate_type, aggregate_id, sequence)).
            AggregateError::AggregateConflict => Self::new(
                StatusCode::CONFLICT,
                "aggregate_conflict",
                "another command on this aggregate committed first; nothing was written, retry",
            ),
            other => {
                eprintln!("cqrs-peer: store error: {other}");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "store_error", other.to_string())
            }
        }
    }
}

/// Decodes a command like eventfold's codec: a body that is not an object with a string
/// `"type"`, or that does not fit the command's fields, is `malformed_command`; a `"type"`
/// that names no command is `unknown_command_type`.
pub fn decode_command(body: &[u8]) -> Result<OrderCommand, ApiError> {
    #[derive(serde::Deserialize)]
    struct Tag<'a> {
        #[serde(borrow, rename = "type")]
        _ty: std::borrow::Cow<'a, str>,
    }
    if let Err(e) = serde_json::from_slice::<Tag<'_>>(body) {
        let reason = if e.is_data() {
            "expected a JSON object with a string field \"type\"".to_owned()
        } else {
            e.to_string()
        };
        return Err(ApiError::bad_request(
            "malformed_command",
            format!("malformed command: {reason}"),
        ));
    }
    serde_json::from_slice::<OrderCommand>(body).map_err(|e| {
        if e.to_string().starts_with("unknown variant") {
            ApiError::bad_request("unknown_command_type", format!("order has no such command: {e}"))
        } else {
            ApiError::bad_request("malformed_command", format!("malformed command: {e}"))
        }
    })
}

/// Checks an aggregate id as eventfold does: 1 to 256 bytes of printable text without `/`.
pub fn check_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > 256 || id.chars().any(|c| c.is_control() || c == '/') {
        return Err(ApiError::bad_request(
            "bad_request",
            format!("invalid aggregate id {id:?}: expected 1 to 256 bytes of printable characters without '/'"),
        ));
    }
    Ok(())
}

fn check_type(ty: &str) -> Result<(), ApiError> {
    if ty == "order" {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_aggregate_type",
            format!("no aggregate type {ty:?} (this peer serves only \"order\")"),
        ))
    }
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::bad_request("bad_request", format!("header {name} is not visible ASCII"))),
    }
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn post_command(
    State(app): State<App>,
    Path((ty, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_type(&ty)?;
    check_id(&id)?;
    // Same shape check as eventfold, then ignored: cqrs-es cannot deduplicate commands.
    if let Some(key) = header_str(&headers, "idempotency-key")?
        && (key.is_empty() || key.len() > 256 || !key.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(ApiError::bad_request(
            "bad_request",
            "invalid Idempotency-Key: expected 1 to 256 printable ASCII characters without spaces",
        ));
    }
    // cqrs-es's `CqrsFramework::execute` takes no expected version, so a precondition cannot
    // be honoured; refusing it is safer than silently ignoring it.
    if headers.contains_key(header::IF_MATCH) {
        return Err(ApiError::bad_request(
            "if_match_unsupported",
            "this peer cannot check If-Match: cqrs-es executes commands without an expected version",
        ));
    }
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", e.body_text())
        } else {
            ApiError::bad_request("malformed_command", format!("cannot read the request body: {e}"))
        }
    })?;
    let command = decode_command(&body)?;

    let (result, committed) = COMMITTED
        .scope(RefCell::new(Vec::new()), async {
            let result = app.cqrs.execute(&id, command).await;
            (result, COMMITTED.with(RefCell::take))
        })
        .await;
    result?;

    // Every order command writes exactly one event, so this is never empty after `Ok`; the
    // fallback only keeps the answer well formed if that ever changed.
    let version = committed.last().map_or(0, |(sequence, _)| *sequence);
    let events: Vec<Value> = committed
        .into_iter()
        .map(|(sequence, event)| {
            json!({
                "version": sequence,
                "type": event.type_name(),
                "id": id,
                "payload": event,
            })
        })
        .collect();
    Ok(Json(json!({"aggregate_id": id, "version": version, "events": events})).into_response())
}

async fn get_state(
    State(app): State<App>,
    Path((ty, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    check_type(&ty)?;
    check_id(&id)?;
    // Loads the aggregate the way a command does: all its events, folded.
    let context = app.store.load_aggregate(&id).await?;
    if context.current_sequence == 0 {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "aggregate_not_found",
            format!("{ty} `{id}` has no events"),
        ));
    }
    let etag = format!("\"{}\"", context.current_sequence);
    let etag_value = HeaderValue::from_str(&etag).expect("a quoted number is a valid header value");
    if header_str(&headers, "if-none-match")?.is_some_and(|v| v.trim() == etag) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag_value)]).into_response());
    }
    let body = json!({"id": id, "version": context.current_sequence, "state": context.aggregate});
    Ok((StatusCode::OK, [(header::ETAG, etag_value)], Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_classifies_like_eventfold() {
        let ok = decode_command(br#"{"type":"ConfirmOrder"}"#).unwrap();
        assert_eq!(ok, OrderCommand::ConfirmOrder);
        assert_eq!(decode_command(b"not json").unwrap_err().code(), "malformed_command");
        assert_eq!(decode_command(b"[1]").unwrap_err().code(), "malformed_command");
        assert_eq!(decode_command(br#"{"qty":1}"#).unwrap_err().code(), "malformed_command");
        assert_eq!(
            decode_command(br#"{"type":7}"#).unwrap_err().code(),
            "malformed_command"
        );
        assert_eq!(
            decode_command(br#"{"type":"Nope"}"#).unwrap_err().code(),
            "unknown_command_type"
        );
        let missing = decode_command(br#"{"type":"AddItem","sku":"a","qty":1}"#).unwrap_err();
        assert_eq!(
            (missing.status(), missing.code()),
            (StatusCode::BAD_REQUEST, "malformed_command")
        );
        let negative = decode_command(br#"{"type":"AddItem","sku":"a","qty":-1,"price_cents":1}"#);
        assert_eq!(negative.unwrap_err().code(), "malformed_command");
    }

    #[test]
    fn ids_are_checked_like_eventfold() {
        assert!(check_id("order-1").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("a/b").is_err());
        assert!(check_id("a\nb").is_err());
        assert!(check_id(&"x".repeat(257)).is_err());
        assert!(check_id(&"x".repeat(256)).is_ok());
    }

    #[test]
    fn errors_map_to_statuses() {
        let rejected = ApiError::from(AggregateError::UserError(crate::domain::OrderRejection::AlreadyPlaced));
        assert_eq!(
            (rejected.status(), rejected.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "already_placed")
        );
        let conflict = ApiError::from(AggregateError::<crate::domain::OrderRejection>::AggregateConflict);
        assert_eq!(
            (conflict.status(), conflict.code()),
            (StatusCode::CONFLICT, "aggregate_conflict")
        );
    }
}
