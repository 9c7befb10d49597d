//! What the service runs, as lists (DESIGN §6; the console reads them): `GET /v1/aggregates`
//! (the aggregate types), `GET /v1/views` (each view's state, lag, applied offsets, the
//! version being built and its indexes) and `GET /v1/process-managers` (state, lag, timers,
//! commands outstanding). They reuse the reports `/readyz` and `/metrics` are made from.

use crate::app::App;
use axum::Json;
use axum::extract::State;
use eventfold_core::Scope;
use eventfold_runtime::ViewService;
use serde_json::{Value, json};

/// `GET /v1/aggregates`: `{aggregates: [{type, partitions}]}`, sorted by type.
pub(crate) async fn aggregates(State(app): State<App>) -> Json<Value> {
    let partitions = app.runtime.log().partitions();
    let mut names: Vec<&str> = app.runtime.aggregate_names().collect();
    names.sort_unstable();
    let list: Vec<Value> = names
        .into_iter()
        .map(|name| json!({"type": name, "partitions": partitions}))
        .collect();
    Json(json!({"aggregates": list}))
}

/// `GET /v1/views`: `{views: [...]}`, sorted by name; each entry is the view's report (as
/// `/readyz` shows it: `view`, `state`, `lag`, `position`, `version`, the `partitions` not
/// ready, `building`) plus `source`, `scope`, `indexes` and `applied` (next source offset to
/// apply, per partition).
pub(crate) async fn views(State(app): State<App>) -> Json<Value> {
    let mut reports = app.runtime.view_reports();
    reports.sort_by(|a, b| a.view.cmp(&b.view));
    let list: Vec<Value> = reports
        .into_iter()
        .map(|report| {
            let mut entry = serde_json::to_value(&report).unwrap_or_default();
            if let (Ok(v), Some(obj)) = (app.runtime.view(&report.view), entry.as_object_mut()) {
                describe(&v, obj);
            }
            entry
        })
        .collect();
    Json(json!({"views": list}))
}

/// Adds what the report does not hold: where the view reads, where its rows live, its
/// indexes and how far it has applied each partition of its source.
fn describe(v: &ViewService, obj: &mut serde_json::Map<String, Value>) {
    let indexes: Vec<Value> = v
        .indexes()
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "field": i.field,
                "kind": crate::views::kind_name(i.kind),
                "unique": i.unique,
            })
        })
        .collect();
    let applied: Vec<Value> = v
        .position()
        .marks()
        .map(|(_, partition, offset)| json!({"partition": partition, "offset": offset}))
        .collect();
    let scope = match v.scope() {
        Scope::Replicated => "replicated",
        Scope::Partitioned => "partitioned",
    };
    obj.insert("source".into(), json!(v.source_type()));
    obj.insert("scope".into(), json!(scope));
    obj.insert("indexes".into(), json!(indexes));
    obj.insert("applied".into(), json!(applied));
}

/// `GET /v1/process-managers`: `{process_managers: [...]}`, sorted by name; each entry is
/// the report `/readyz` shows (`name`, `state`, `lag`, `reactions`, `timers_pending`,
/// `timers_overdue`, `commands_outstanding`, `error` when failed).
pub(crate) async fn process_managers(State(app): State<App>) -> Json<Value> {
    let mut reports = app.runtime.process_reports();
    reports.sort_by(|a, b| a.name.cmp(&b.name));
    Json(json!({"process_managers": reports}))
}
