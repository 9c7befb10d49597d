//! View routes (DESIGN §6): key lookups and index queries, with read-your-writes.
//!
//! - `GET /v1/views/{view}/{key}` -> `{key, value}`; 404 `row_not_found`.
//! - `GET /v1/views/{view}?...` -> `{rows: [{key, value}], next_cursor}`.
//!
//! Query parameters: `{index}=v` (equality), `{index}_gte=v`, `{index}_lt=v` (half-open
//! range), `{index}_prefix=v` (string indexes: values starting with `v`, by UTF-8 bytes;
//! may be combined with `_gte`/`_lt` on the same index), `order=asc|desc` (default `asc`),
//! `order_by={index}`, `limit` (1..=1000, default 20), `cursor` (the `next_cursor` of the
//! previous page), `min_position` (a command's `position`, repeatable: wait until the view has
//! applied all of them). Conditions may name several indexes: one **drives** the scan and gives the
//! order (`order_by`, else the first index with a range or prefix, else the first one
//! named), the others filter the rows it yields. Rows come ordered by (driving value,
//! key); without any condition or `order_by`, by key.
//!
//! A cursor is opaque and URL-safe; it names the driving index, the order and the position
//! of the last row examined, so the next page starts right after it (rows written since
//! appear if they sort later). A cursor from another query shape is refused (400).
//!
//! **Partitioned views across instances** (Kafka mode with a registry): a key lookup for a
//! row whose partition another instance serves is forwarded to it (one hop, like
//! aggregate reads). An index query is **scattered**: every instance serving some of the
//! view's partitions is asked for the same page over those partitions (header
//! [`SHARD_PARTITIONS`]; it answers with each row's scan position), this instance answers
//! for its own, and the parts are **merged** by scan position. A part that stopped early
//! (its scan budget ran out) bounds the merge: only rows up to its position are complete,
//! and the cursor continues from there, so pages concatenate to the full answer with no
//! gap or repeat. A partition no live instance claims gives 503 `owner_unavailable`.

use crate::app::{ApiPath, App, owner_unavailable};
use crate::error::ApiError;
use crate::forward::{Forwarder, SHARD_PARTITIONS};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use eventfold_core::{IndexKind, Position, Scope};
use eventfold_runtime::{Condition, QueryRow, ViewService};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::cmp::Ordering;
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

/// Waits for every `min_position` given (a query may name several: it waits for their
/// merge).
async fn barrier(app: &App, v: &ViewService, min_positions: &[String]) -> Result<(), ApiError> {
    if min_positions.is_empty() {
        return Ok(());
    }
    let mut pos = Position::default();
    for token in min_positions {
        let p = Position::decode(token)
            .map_err(|e| ApiError::bad_request("invalid_position", format!("min_position: {e}")))?;
        pos.merge(&p);
    }
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
    ApiPath((name, key)): ApiPath<(String, String)>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    req: Request,
) -> Result<Response, ApiError> {
    let v = view(&app, &name)?;
    let mut min_positions = Vec::new();
    for (k, val) in pairs(query)? {
        match k.as_str() {
            "min_position" => min_positions.push(val),
            other => {
                return Err(ApiError::bad_request(
                    "unknown_parameter",
                    format!("unknown parameter `{other}` for a key lookup; only min_position is accepted"),
                ));
            }
        }
    }
    // A partitioned view's row is served by the owner of its partition.
    let p = v.partition_of(&key);
    if let (Some(forwarder), Some(registry)) = (&app.forwarder, &app.options.registry)
        && !v.is_local(p)
        && !Forwarder::already_forwarded(req.headers())
    {
        return Ok(match registry.owner(v.source_type(), p) {
            Some(owner) if owner.instance_id != registry.instance_id() => forwarder.forward(&owner.http, req).await,
            _ => owner_unavailable(v.source_type(), p).into_response(),
        });
    }
    barrier(&app, &v, &min_positions).await?;
    match v.get(&key)? {
        Some(value) => Ok(axum::Json(json!({"key": key, "value": value})).into_response()),
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
    min_positions: Vec<String>,
}

fn parse(v: &ViewService, params: Vec<(String, String)>) -> Result<Parsed, ApiError> {
    let mut p = Parsed {
        order_by: None,
        conditions: BTreeMap::new(),
        descending: false,
        limit: DEFAULT_LIMIT,
        cursor: None,
        min_positions: Vec::new(),
    };
    let (mut seen, mut first_eq, mut first_range) = (Vec::<String>::new(), None, None);
    for (k, val) in params {
        // Only min_position may repeat (the query waits for all of them).
        if seen.contains(&k) && k != "min_position" {
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
            "min_position" => p.min_positions.push(val),
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

pub(crate) fn kind_name(kind: IndexKind) -> &'static str {
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
    ApiPath(name): ApiPath<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let v = view(&app, &name)?;
    let p = parse(&v, pairs(query)?)?;
    let after = p
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, p.order_by.as_deref(), p.descending))
        .transpose()?;
    let shard = headers
        .get(SHARD_PARTITIONS)
        .map(|h| parse_partitions(h.to_str().unwrap_or("?")))
        .transpose()?;
    let q = eventfold_runtime::Query {
        order_by: p.order_by.clone(),
        conditions: p.conditions.clone(),
        descending: p.descending,
        limit: p.limit,
        after,
    };
    if let Some(partitions) = shard {
        // One part of a query scattered by another instance.
        barrier(&app, &v, &p.min_positions).await?;
        let page = v.query_partitions(&q, Some(&partitions))?;
        let rows: Vec<Value> = page
            .rows
            .into_iter()
            .map(|r| json!({"key": r.key, "value": r.value, "position": URL_SAFE_NO_PAD.encode(&r.position)}))
            .collect();
        let next = page.next.map(|n| URL_SAFE_NO_PAD.encode(n));
        return Ok(axum::Json(json!({"rows": rows, "next_position": next})).into_response());
    }
    let page =
        if v.scope() == Scope::Partitioned && app.options.registry.is_some() && !Forwarder::already_forwarded(&headers)
        {
            match scatter(&app, &v, &q, &p.min_positions, &uri, headers.get(header::AUTHORIZATION)).await {
                Ok(page) => page,
                // An instance's refusal (e.g. 504 `view_behind`) or 503 `owner_unavailable`.
                Err(response) => return Ok(response),
            }
        } else {
            barrier(&app, &v, &p.min_positions).await?;
            let page = v.query(&q)?;
            Part {
                rows: page.rows,
                next: page.next,
            }
        };
    let rows: Vec<Value> = page
        .rows
        .into_iter()
        .map(|r| json!({"key": r.key, "value": r.value}))
        .collect();
    let next = page
        .next
        .map(|n| encode_cursor(p.order_by.as_deref(), p.descending, &n));
    Ok(axum::Json(json!({"rows": rows, "next_cursor": next})).into_response())
}

/// Rows in scan order and where the scan stopped (`None`: it is complete).
struct Part {
    rows: Vec<QueryRow>,
    next: Option<Vec<u8>>,
}

fn parse_partitions(list: &str) -> Result<Vec<u32>, ApiError> {
    list.split(',')
        .map(|p| p.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            ApiError::bad_request(
                "invalid_partitions",
                format!("header {SHARD_PARTITIONS} must list partition numbers separated by commas, got {list:?}"),
            )
        })
}

/// Answers `q` on a partitioned view from every instance serving some of its partitions
/// (see the module docs). The first refusal (its status and body passed on as they are)
/// or failure to reach an instance is the answer.
async fn scatter(
    app: &App,
    v: &ViewService,
    q: &eventfold_runtime::Query,
    min_positions: &[String],
    uri: &Uri,
    authorization: Option<&HeaderValue>,
) -> Result<Part, Response> {
    let registry = app.options.registry.as_ref().expect("checked by the caller");
    let forwarder = app.forwarder.as_ref().expect("a registry comes with a forwarder");
    let mut remote: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for p in 0..app.runtime.log().partitions() {
        if v.is_local(p) {
            continue;
        }
        match registry.owner(v.source_type(), p) {
            Some(owner) if owner.instance_id != registry.instance_id() => {
                remote.entry(owner.http).or_default().push(p);
            }
            _ => return Err(owner_unavailable(v.source_type(), p).into_response()),
        }
    }
    let path = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    let extra = if !min_positions.is_empty() {
        app.options.view_wait
    } else {
        std::time::Duration::ZERO
    };
    let asks = remote
        .iter()
        .map(|(url, partitions)| forwarder.shard(url, path, partitions, extra, authorization));
    let local = async {
        barrier(app, v, min_positions).await?;
        let page = v.query(q)?;
        Ok::<_, ApiError>(Part {
            rows: page.rows,
            next: page.next,
        })
    };
    let (local, answers) = tokio::join!(local, futures_util::future::join_all(asks));
    let mut parts = vec![local.map_err(IntoResponse::into_response)?];
    for answer in answers {
        let answer = answer?;
        if !answer.status.is_success() {
            let mut refusal = (answer.status, answer.body).into_response();
            let h = refusal.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Some(r) = answer.retry_after {
                h.insert(header::RETRY_AFTER, r);
            }
            return Err(refusal);
        }
        parts.push(decode_part(&answer.body).map_err(IntoResponse::into_response)?);
    }
    Ok(merge(parts, q.limit, q.descending))
}

fn decode_part(body: &[u8]) -> Result<Part, ApiError> {
    let bad = |why: String| ApiError::new(StatusCode::BAD_GATEWAY, "bad_gateway", why);
    #[derive(serde::Deserialize)]
    struct Row {
        key: String,
        value: Box<RawValue>,
        position: String,
    }
    #[derive(serde::Deserialize)]
    struct Body {
        rows: Vec<Row>,
        next_position: Option<String>,
    }
    let b: Body = serde_json::from_slice(body)
        .map_err(|e| bad(format!("another instance's part of the query does not decode: {e}")))?;
    let pos = |t: &str| {
        URL_SAFE_NO_PAD
            .decode(t)
            .map_err(|e| bad(format!("another instance's part of the query has a bad position: {e}")))
    };
    let rows = b
        .rows
        .into_iter()
        .map(|r| {
            Ok(QueryRow {
                position: pos(&r.position)?,
                key: r.key,
                value: r.value,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Part {
        rows,
        next: b.next_position.as_deref().map(pos).transpose()?,
    })
}

/// Merges the parts of a scattered query into one page of at most `limit` rows. A part
/// that stopped early has seen every one of its rows up to its `next` only: rows beyond the
/// earliest such position are left for the next page, which starts there.
fn merge(parts: Vec<Part>, limit: usize, descending: bool) -> Part {
    let order = |a: &[u8], b: &[u8]| if descending { b.cmp(a) } else { a.cmp(b) };
    let frontier = parts.iter().filter_map(|p| p.next.clone()).min_by(|a, b| order(a, b));
    let mut rows: Vec<QueryRow> = parts.into_iter().flat_map(|p| p.rows).collect();
    rows.sort_by(|a, b| order(&a.position, &b.position));
    let complete = rows
        .iter()
        .take_while(|r| {
            frontier
                .as_ref()
                .is_none_or(|f| order(&r.position, f) != Ordering::Greater)
        })
        .count();
    let more = rows.len() > limit.min(complete) || frontier.is_some();
    rows.truncate(limit.min(complete));
    let next = if rows.len() == limit && more {
        rows.last().map(|r| r.position.clone())
    } else {
        frontier
    };
    Part { rows, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(positions: &[u8], next: Option<u8>) -> Part {
        Part {
            rows: positions
                .iter()
                .map(|p| QueryRow {
                    key: format!("k{p}"),
                    value: RawValue::from_string(p.to_string()).unwrap(),
                    position: vec![*p],
                })
                .collect(),
            next: next.map(|n| vec![n]),
        }
    }

    fn keys(p: &Part) -> Vec<u8> {
        p.rows.iter().map(|r| r.position[0]).collect()
    }

    #[test]
    fn complete_parts_merge_in_order_up_to_the_limit() {
        let m = merge(vec![part(&[1, 4, 9], None), part(&[2, 3, 10], None)], 4, false);
        assert_eq!((keys(&m), m.next), (vec![1, 2, 3, 4], Some(vec![4])));
        let m = merge(vec![part(&[1, 4], None), part(&[2], None)], 4, false);
        assert_eq!((keys(&m), m.next), (vec![1, 2, 4], None));
        // Exactly `limit` rows and nothing else: the last page.
        let m = merge(vec![part(&[1, 4], None), part(&[2, 3], None)], 4, false);
        assert_eq!((keys(&m), m.next), (vec![1, 2, 3, 4], None));
    }

    #[test]
    fn a_part_that_stopped_early_bounds_the_page() {
        // The second part examined up to 5 only: rows after 5 may still be missing there.
        let m = merge(vec![part(&[1, 6, 7], None), part(&[2], Some(5))], 10, false);
        assert_eq!((keys(&m), m.next), (vec![1, 2], Some(vec![5])));
        // No row before its position: an empty page that still moves the cursor on.
        let m = merge(vec![part(&[6], None), part(&[], Some(5))], 10, false);
        assert_eq!((keys(&m), m.next), (vec![], Some(vec![5])));
    }

    #[test]
    fn descending_parts_merge_from_the_highest() {
        let m = merge(vec![part(&[9, 4, 1], None), part(&[10, 3], Some(3))], 3, true);
        assert_eq!((keys(&m), m.next), (vec![10, 9, 4], Some(vec![4])));
        let m = merge(vec![part(&[9, 4, 1], None), part(&[10, 3], Some(3))], 10, true);
        assert_eq!((keys(&m), m.next), (vec![10, 9, 4, 3], Some(vec![3])));
    }

    #[test]
    fn shard_partition_lists_are_checked() {
        assert_eq!(parse_partitions("0, 3,7").unwrap(), vec![0, 3, 7]);
        assert_eq!(parse_partitions("1;2").unwrap_err().code, "invalid_partitions");
    }
}
