//! Process manager routes (DESIGN §6): `GET /v1/process-managers/{name}/{key}` ->
//! `{name, key, state, timers: [{id, due}]}`; 404 `unknown_process_manager` for a name
//! not registered, 404 `not_found` for a key with no state and no timer.

use crate::app::{ApiPath, App};
use crate::error::ApiError;
use axum::extract::State;
use axum::http::StatusCode;

pub(crate) async fn get_state(
    State(app): State<App>,
    ApiPath((name, key)): ApiPath<(String, String)>,
) -> Result<axum::Json<eventfold_runtime::ProcessStateView>, ApiError> {
    let pm = app.runtime.process_manager(&name)?;
    match pm.get(&key)? {
        Some(view) => Ok(axum::Json(view)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("process manager `{name}` has no state and no timer for key `{key}`"),
        )),
    }
}
