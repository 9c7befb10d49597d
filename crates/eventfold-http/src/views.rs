//! View routes (DESIGN §6): key lookups and index queries, with read-your-writes.
//!
//! - `GET /v1/views/{view}/{key}` -> `{key, value}`; 404 `row_not_found`.
//! - `GET /v1/views/{view}?...` -> `{rows: [{key, value}], next_cursor}`.
//!
//! Query parameters: `{index}=v` (equality), `{index}_gte=v`, `{index}_lt=v` (half-open
//! range), `{index}_prefix=v` (string indexes: values starting with `v`, by UTF-8 bytes;
//! may be combined with `_gte`/`_lt` on the same index), `order=asc|desc` (default `asc`),
//! `order_by={index}`, `limit` (1..=1000, default 20), `cursor` (the `next_cursor` of the
//! previous page), `min_position` (a command's `position`: wait until the view has
//! applied it). Conditions may name several indexes: one **drives** the scan and gives the
//! order (`order_by`, else the first index with a range or prefix, else the first one
//! named), the others filter the rows it yields. Rows come ordered by (driving value,
//! key); without any condition or `order_by`, by key.
//!
//! A cursor is opaque and URL-safe; it names the driving index, the order and the position
//! of the last row examined, so the next page starts right after it (rows written since
//! appear if they sort later). A cursor from another query shape is refused (400).

use crate::error::ApiError;
use crate::routes::App;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use eventfold_core::{IndexKind, Position};
use eventfold_runtime::{Condition, ViewService};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest page size.
pub const MAX_LIMIT: usize = 1000;

const CURSOR_V1: u8 = 1;

fn view(app: &App, name: &str) -> Result<Arc<ViewService>, ApiError> {
    app.runtime.view(name).map_err(|_| {
        let known: Vec<_> = app.runtime.view_names().collect();
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_view",
            format!("unknown view `{name}`; known views: {}", known.join(", ")),
        )
    })
}

/// Waits for `min_position`, if given.
async fn barrier(app: &App, v: &ViewService, min_position: Option<&str>) -> Result<(), ApiError> {
    let Some(token) = min_position else {
        return Ok(());
    };
    let pos =
        Position::decode(token).map_err(|e| ApiError::bad_request("invalid_position", format!("min_position: {e}")))?;
    v.wait_for(&pos, app.options.view_wait).await?;
    Ok(())
}

fn pairs(query: Result<Query<Vec<(String, String)>>, QueryRejection>) -> Result<Vec<(String, String)>, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
}

pub(crate) async fn get_row(
    State(app): State<App>,
    Path((name, key)): Path<(String, String)>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let v = view(&app, &name)?;
    let mut min_position = None;
    for (k, val) in pairs(query)? {
        match k.as_str() {
            "min_position" if min_position.is_none() => min_position = Some(val),
            "min_position" => return Err(conflict("min_position is given twice")),
            other => {
                return Err(ApiError::bad_request(
                    "unknown_parameter",
                    format!("unknown parameter `{other}` for a key lookup; only min_position is accepted"),
                ));
            }
        }
    }
    barrier(&app, &v, min_position.as_deref()).await?;
    match v.get(&key)? {
        Some(value) => Ok(axum::Json(json!({"key": key, "value": value}))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "row_not_found",
            format!("view `{name}` has no row `{key}`"),
        )),
    }
}

fn conflict(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("conflicting_parameters", message)
}

/// A parsed `GET /v1/views/{view}` query.
struct Parsed {
    order_by: Option<String>,
    conditions: BTreeMap<String, Condition>,
    descending: bool,
    limit: usize,
    cursor: Option<String>,
    min_position: Option<String>,
}

fn parse(v: &ViewService, params: Vec<(String, String)>) -> Result<Parsed, ApiError> {
    let mut p = Parsed {
        order_by: None,
        conditions: BTreeMap::new(),
        descending: false,
        limit: DEFAULT_LIMIT,
        cursor: None,
        min_position: None,
    };
    let (mut seen, mut first_eq, mut first_range) = (Vec::<String>::new(), None, None);
    for (k, val) in params {
        if seen.contains(&k) {
            return Err(conflict(format!("parameter `{k}` is given twice")));
        }
        seen.push(k.clone());
        match k.as_str() {
            "order" => {
                p.descending = match val.as_str() {
                    "asc" => false,
                    "desc" => true,
                    _ => {
                        return Err(ApiError::bad_request(
                            "invalid_order",
                            format!("order must be `asc` or `desc`, got {val:?}"),
                        ));
                    }
                }
            }
            "limit" => {
                p.limit = val
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid_limit",
                            format!("limit must be an integer from 1 to {MAX_LIMIT}, got {val:?}"),
                        )
                    })?
            }
            "cursor" => p.cursor = Some(val),
            "min_position" => p.min_position = Some(val),
            "order_by" => {
                v.index(&val).ok_or_else(|| unknown_index(v, &val))?;
                p.order_by = Some(val);
            }
            name => {
                let (index, op) = if v.index(name).is_some() {
                    (name, "")
                } else if let Some(i) = name.strip_suffix("_gte").filter(|i| v.index(i).is_some()) {
                    (i, "_gte")
                } else if let Some(i) = name.strip_suffix("_lt").filter(|i| v.index(i).is_some()) {
                    (i, "_lt")
                } else if let Some(i) = name.strip_suffix("_prefix").filter(|i| v.index(i).is_some()) {
                    (i, "_prefix")
                } else {
                    return Err(unknown_index(v, name));
                };
                let idx = v.index(index).expect("checked above");
                let c = p.conditions.entry(index.to_owned()).or_default();
                if op == "_prefix" {
                    if idx.kind != IndexKind::String {
                        return Err(ApiError::bad_request(
                            "unsupported_condition",
                            format!(
                                "parameter `{name}`: index `{index}` holds {} values; `_prefix` applies to string indexes only",
                                kind_name(idx.kind)
                            ),
                        ));
                    }
                    c.prefix = Some(val);
                } else {
                    let value = idx
                        .parse(&val)
                        .map_err(|e| ApiError::bad_request("invalid_value", format!("parameter `{name}`: {e}")))?;
                    match op {
                        "" => c.eq = Some(value),
                        "_gte" => c.gte = Some(value),
                        _ => c.lt = Some(value),
                    }
                }
                // A prefix is a range of the index (one key range), so it may drive a scan.
                if op.is_empty() {
                    first_eq.get_or_insert_with(|| index.to_owned());
                } else {
                    first_range.get_or_insert_with(|| index.to_owned());
                }
                if c.eq.is_some() && (c.gte.is_some() || c.lt.is_some() || c.prefix.is_some()) {
                    return Err(conflict(format!(
                        "`{index}` is given both as an equality and as a range or prefix; use one"
                    )));
                }
            }
        }
    }
    p.order_by = p.order_by.or(first_range).or(first_eq);
    Ok(p)
}

fn kind_name(kind: IndexKind) -> &'static str {
    match kind {
        IndexKind::String => "string",
        IndexKind::Number => "number",
        IndexKind::Timestamp => "timestamp",
    }
}

fn unknown_index(v: &ViewService, name: &str) -> ApiError {
    let known: Vec<_> = v
        .indexes()
        .iter()
        .map(|i| format!("{} ({})", i.name, kind_name(i.kind)))
        .collect();
    ApiError::bad_request(
        "unknown_index",
        format!(
            "view `{}` has no index or parameter `{name}`; indexes: {} (each also as `<index>_gte` and `<index>_lt`, string indexes as `<index>_prefix`); parameters: order, order_by, limit, cursor, min_position",
            v.name(),
            known.join(", ")
        ),
    )
}

fn encode_cursor(order_by: Option<&str>, descending: bool, after: &[u8]) -> String {
    let mut raw = vec![CURSOR_V1, if descending { b'd' } else { b'a' }];
    raw.extend_from_slice(order_by.unwrap_or("").as_bytes());
    raw.push(0);
    raw.extend_from_slice(after);
    URL_SAFE_NO_PAD.encode(raw)
}

fn decode_cursor(token: &str, order_by: Option<&str>, descending: bool) -> Result<Vec<u8>, ApiError> {
    let bad = |why: &str| ApiError::bad_request("invalid_cursor", format!("cursor {token:?} {why}"));
    let raw = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad("is not a cursor of this API"))?;
    let [version, dir, rest @ ..] = raw.as_slice() else {
        return Err(bad("is not a cursor of this API"));
    };
    let nul = rest.iter().position(|b| *b == 0);
    let (Some(nul), CURSOR_V1, b'a' | b'd') = (nul, *version, *dir) else {
        return Err(bad("is not a cursor of this API"));
    };
    if rest[..nul] != *order_by.unwrap_or("").as_bytes() || (*dir == b'd') != descending {
        return Err(bad(
            "belongs to a query with another order or driving index; repeat the query that returned it",
        ));
    }
    Ok(rest[nul + 1..].to_vec())
}

pub(crate) async fn query(
    State(app): State<App>,
    Path(name): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let v = view(&app, &name)?;
    let p = parse(&v, pairs(query)?)?;
    let after = p
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, p.order_by.as_deref(), p.descending))
        .transpose()?;
    barrier(&app, &v, p.min_position.as_deref()).await?;
    let q = eventfold_runtime::Query {
        order_by: p.order_by.clone(),
        conditions: p.conditions,
        descending: p.descending,
        limit: p.limit,
        after,
    };
    let page = v.query(&q)?;
    let rows: Vec<Value> = page
        .rows
        .into_iter()
        .map(|(key, value)| json!({"key": key, "value": value}))
        .collect();
    let next = page
        .next
        .map(|n| encode_cursor(p.order_by.as_deref(), p.descending, &n));
    Ok(axum::Json(json!({"rows": rows, "next_cursor": next})))
}
