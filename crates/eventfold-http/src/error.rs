//! The one way errors leave the API: `{error, message}` with a status (and Retry-After).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use eventfold_runtime::Error;
use serde_json::json;
use std::time::Duration;

/// An API error: status, stable code, human message.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human sentence.
    pub message: String,
    /// `Retry-After` for 503.
    pub retry_after: Option<Duration>,
    /// Extra fields merged into the body.
    pub extra: Option<serde_json::Value>,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            extra: None,
        }
    }

    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        use eventfold_core::Error as Core;
        let message = e.to_string();
        let (status, code, retry_after) = match &e {
            Error::UnknownAggregate(_) => (StatusCode::NOT_FOUND, "unknown_aggregate_type", None),
            Error::BadCommand(Core::UnknownCommand { .. }) => (StatusCode::BAD_REQUEST, "unknown_command_type", None),
            Error::BadCommand(Core::InvalidPosition(_)) => (StatusCode::BAD_REQUEST, "invalid_position", None),
            Error::BadCommand(_) => (StatusCode::BAD_REQUEST, "malformed_command", None),
            Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request", None),
            Error::VersionMismatch { .. } => (StatusCode::PRECONDITION_FAILED, "version_mismatch", None),
            Error::Restoring { retry_after, .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "partition_restoring",
                Some(*retry_after),
            ),
            Error::Overloaded { retry_after, .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "overloaded", Some(*retry_after))
            }
            Error::NotOwner { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "not_owner",
                Some(Duration::from_secs(1)),
            ),
            Error::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                Some(Duration::from_secs(1)),
            ),
            Error::ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                Some(Duration::from_secs(1)),
            ),
            Error::PartitionFailed { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "partition_failed", None),
            Error::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "outcome_unknown", None),
            Error::Corrupt { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt_record", None),
            Error::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "storage_error", None),
            Error::Log(_) => (StatusCode::INTERNAL_SERVER_ERROR, "commit_failed", None),
            Error::UnknownView(_) => (StatusCode::NOT_FOUND, "unknown_view", None),
            Error::UnknownProcessManager(_) => (StatusCode::NOT_FOUND, "unknown_process_manager", None),
            Error::ViewBehind { .. } => (StatusCode::GATEWAY_TIMEOUT, "view_behind", None),
            Error::ViewFailed { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "view_failed", None),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal", None),
        };
        if status.is_server_error() {
            tracing::warn!(code, %message, "request failed");
        }
        let extra = match &e {
            Error::VersionMismatch { expected, actual } => {
                Some(json!({"expected_version": expected, "actual_version": actual}))
            }
            Error::ViewBehind { position, .. } => Some(json!({"position": position})),
            _ => None,
        };
        Self {
            status,
            code,
            message,
            retry_after,
            extra,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.code, "message": self.message});
        if let (Some(serde_json::Value::Object(extra)), Some(obj)) = (self.extra, body.as_object_mut()) {
            obj.extend(extra);
        }
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs().max(1);
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
