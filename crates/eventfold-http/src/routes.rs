//! Routes and handlers of the HTTP API.

pub use crate::app::HttpOptions;
use crate::app::{ApiPath, App, owner_unavailable};
use crate::error::ApiError;
use crate::forward::Forwarder;
use crate::guard::{self, Guard};
use crate::route_table::ROUTES;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use eventfold_core::partition::partition_for;
use eventfold_core::{Outcome, Position};
use eventfold_runtime::{AggregateService, CommandRequest, PartitionState, ProcessState, Runtime, ViewState};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::json;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, broadcast};

/// The API router over `runtime`.
pub fn router(runtime: Runtime, options: HttpOptions) -> Router {
    let limit = options.max_body_bytes;
    let forwarder = options
        .registry
        .as_ref()
        .map(|r| Forwarder::with_tls(r.instance_id(), options.forward_timeout, options.forward_tls.clone()));
    let in_flight = Arc::new(Semaphore::new(options.max_in_flight));
    let app = App {
        runtime,
        options: Arc::new(options),
        forwarder,
    };
    let mut router = Router::new();
    for r in ROUTES {
        let guard = Guard {
            method: r.method,
            path: r.path,
            access: r.access,
            auth: app.options.auth.clone(),
            in_flight: in_flight.clone(),
            max_in_flight: app.options.max_in_flight,
            body: (r.method == "POST").then_some((app.options.body_read_timeout, limit)),
        };
        let checked = handler(&app, r.method, r.path).layer(axum::middleware::from_fn_with_state(guard, guard::guard));
        router = router.route(r.path, checked);
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

/// The handler of one entry of [`ROUTES`].
fn handler(app: &App, method: &str, path: &str) -> MethodRouter<App> {
    // Reads of one aggregate go to the instance owning its partition (`layer`, as
    // `Router::route_layer` does to each route).
    let to_owner = || axum::middleware::from_fn_with_state(app.clone(), to_owner);
    match (method, path) {
        ("POST", "/v1/aggregates/{type}/{id}/commands") => post(post_command),
        ("GET", "/v1/aggregates/{type}/{id}") => get(get_state).layer(to_owner()),
        ("GET", "/v1/aggregates/{type}/{id}/events") => get(get_events).layer(to_owner()),
        ("GET", "/v1/aggregates") => get(crate::listing::aggregates),
        ("GET", "/v1/views") => get(crate::listing::views),
        ("GET", "/v1/process-managers") => get(crate::listing::process_managers),
        ("GET", "/console") => get(crate::console::page),
        ("GET", "/console/{asset}") => get(crate::console::asset),
        ("GET", "/v1/views/{view}") => get(crate::views::query),
        ("GET", "/v1/views/{view}/{key}") => get(crate::views::get_row),
        ("GET", "/v1/process-managers/{name}/{key}") => get(crate::process::get_state),
        ("GET", "/v1/cluster") => get(cluster),
        ("GET", "/healthz") => get(healthz),
        ("GET", "/readyz") => get(readyz),
        ("GET", "/metrics") => get(metrics),
        ("GET", "/openapi.json") => {
            // The registered types, views and process managers are fixed once the
            // runtime is built: render the document once.
            let doc = Bytes::from(crate::openapi::document(&app.runtime, &app.options).to_string());
            get(move || {
                let doc = doc.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                        doc,
                    )
                }
            })
        }
        _ => unreachable!("route {method} {path} of ROUTES has no handler"),
    }
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {}", uri.path()),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Forwards a read of an aggregate whose partition another instance owns to that owner
/// (once: a forwarded request is answered where it lands). No live owner known: 503.
async fn to_owner(State(app): State<App>, req: Request, next: Next) -> Response {
    let (Some(forwarder), Some(registry)) = (&app.forwarder, &app.options.registry) else {
        return next.run(req).await;
    };
    if Forwarder::already_forwarded(req.headers()) {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let target = Path::<(String, String)>::from_request_parts(&mut parts, &app)
        .await
        .ok()
        .and_then(|Path((ty, id))| {
            let svc = app.runtime.aggregate(&ty).ok()?;
            svc.owner_is_remote(&id).then_some((ty, id))
        });
    let req = Request::from_parts(parts, body);
    let Some((ty, id)) = target else {
        return next.run(req).await;
    };
    let p = partition_for(id.as_bytes(), app.runtime.log().partitions());
    match registry.owner(&ty, p) {
        Some(owner) if owner.instance_id != registry.instance_id() => forwarder.forward(&owner.http, req).await,
        // The registry still shows this instance (the group just moved the partition):
        // the local copy answers.
        Some(_) => next.run(req).await,
        None => owner_unavailable(&ty, p).into_response(),
    }
}

fn service<'a>(app: &'a App, ty: &str) -> Result<&'a Arc<dyn AggregateService>, ApiError> {
    app.runtime.aggregate(ty).map_err(|_| {
        let known: Vec<_> = app.runtime.aggregate_names().collect();
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_aggregate_type",
            format!("unknown aggregate type `{ty}`; known types: {}", known.join(", ")),
        )
    })
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

/// Parses `If-Match: "<version>"` (the quotes are optional).
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(v) = header_str(headers, "if-match")? else {
        return Ok(None);
    };
    let t = v.trim();
    let t = t.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(t);
    t.parse::<u64>().map(Some).map_err(|_| {
        ApiError::bad_request(
            "invalid_if_match",
            format!("If-Match must be a version in quotes, like \"3\"; got {v:?}"),
        )
    })
}

async fn post_command(
    State(app): State<App>,
    ApiPath((ty, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let svc = service(&app, &ty)?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("request body exceeds the limit of {} bytes", app.options.max_body_bytes),
            )
        } else {
            ApiError::bad_request("malformed_command", format!("cannot read the request body: {e}"))
        }
    })?;
    // Session consistency (DESIGN §5): the client's last position, merged into this
    // write's. Checked before the command runs: a bad token writes nothing.
    let session = header_str(&headers, "x-session-position")?
        .map(|t| {
            Position::decode(t.trim())
                .map_err(|e| ApiError::bad_request("invalid_position", format!("X-Session-Position: {e}")))
        })
        .transpose()?;
    let request = CommandRequest {
        aggregate_id: id,
        body: body.to_vec(),
        idempotency_key: header_str(&headers, "idempotency-key")?.map(str::to_owned),
        expected_version: if_match(&headers)?,
        correlation_id: header_str(&headers, "x-correlation-id")?.map(str::to_owned),
        causation_id: None,
    };
    match svc.submit(request).await? {
        Outcome::Accepted(mut a) => {
            if let Some(mut merged) = session {
                if !a.position.is_empty() {
                    // Our own token: it decodes.
                    let own = Position::decode(&a.position).map_err(|e| {
                        ApiError::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "internal",
                            format!("the write's position: {e}"),
                        )
                    })?;
                    merged.merge(&own);
                }
                a.position = merged.encode();
            }
            Ok((StatusCode::OK, axum::Json(a)).into_response())
        }
        Outcome::Rejected { error, message } => Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"error": error, "message": message})),
        )
            .into_response()),
    }
}

async fn get_state(
    State(app): State<App>,
    ApiPath((ty, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let svc = service(&app, &ty)?;
    let Some(view) = svc.state(&id).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "aggregate_not_found",
            format!("{ty} `{id}` has no events"),
        ));
    };
    let etag = format!("\"{}\"", view.version);
    if header_str(&headers, "if-none-match")?.is_some_and(|v| v.trim() == etag) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    Ok((StatusCode::OK, [(header::ETAG, etag)], axum::Json(view)).into_response())
}

#[derive(Deserialize)]
struct EventsQuery {
    from_version: Option<u64>,
    limit: Option<usize>,
}

async fn get_events(
    State(app): State<App>,
    ApiPath((ty, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let svc = service(&app, &ty)?.clone();
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let limit = q
        .limit
        .unwrap_or(app.options.max_events_page)
        .clamp(1, app.options.max_events_page);
    let wants_sse = header_str(&headers, "accept")?.is_some_and(|a| a.contains("text/event-stream"));
    if !wants_sse {
        let events = svc.events(&id, q.from_version.unwrap_or(1), limit).await?;
        return Ok(axum::Json(events).into_response());
    }
    // A reconnecting EventSource sends the last version it saw.
    let resume = header_str(&headers, "last-event-id")?
        .and_then(|v| v.parse::<u64>().ok())
        .map(|v| v + 1);
    let from = resume.or(q.from_version).unwrap_or(1).max(1);
    eventfold_runtime::AggregateService::events(&*svc, &id, from, 1).await?; // validates the id early
    Ok(Sse::new(follow(svc, id, from))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

struct Follow {
    svc: Arc<dyn AggregateService>,
    id: String,
    next: u64,
    rx: broadcast::Receiver<(Arc<str>, u64)>,
    buffer: VecDeque<eventfold_core::EventView>,
}

/// A live stream of an aggregate's events: what is stored, then each new commit.
fn follow(svc: Arc<dyn AggregateService>, id: String, from: u64) -> impl Stream<Item = Result<Event, Infallible>> {
    let rx = svc.subscribe();
    let state = Follow {
        svc,
        id,
        next: from,
        rx,
        buffer: VecDeque::new(),
    };
    stream::unfold(Some(state), |state| async move {
        let mut s = state?;
        loop {
            if let Some(e) = s.buffer.pop_front() {
                s.next = e.version + 1;
                let data = serde_json::to_string(&e).unwrap_or_default();
                let event = Event::default()
                    .id(e.version.to_string())
                    .event(e.event_type.clone())
                    .data(data);
                return Some((Ok(event), Some(s)));
            }
            match s.svc.events(&s.id, s.next, 256).await {
                Ok(events) if !events.is_empty() => {
                    s.buffer.extend(events);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    let data = json!({"error": "read_failed", "message": e.to_string()}).to_string();
                    return Some((Ok(Event::default().event("error").data(data)), None));
                }
            }
            // Wait for a commit touching this aggregate (or a lag, after which we re-read).
            loop {
                match s.rx.recv().await {
                    Ok((id, version)) if *id == *s.id && version >= s.next => break,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

async fn cluster(State(app): State<App>) -> axum::Json<serde_json::Value> {
    let parts = app.runtime.partitions();
    let mut body = crate::cluster::cluster_json(app.options.registry.as_deref(), &parts);
    // Lag of the partitions owned here: records of the commands topic not consumed yet.
    let lags = futures_util::future::join_all(parts.iter().filter_map(|p| {
        let consumed = p.consumed_offset?;
        let svc = app.runtime.aggregate(&p.aggregate).ok()?.clone();
        let log = app.runtime.log().clone();
        let (aggregate, partition) = (p.aggregate.clone(), p.partition);
        Some(async move {
            let end = log.end_offset(&svc.topics().commands, partition).await.ok()?;
            Some(((aggregate, partition), end.saturating_sub(consumed)))
        })
    }))
    .await;
    let lags: std::collections::HashMap<(String, u32), u64> = lags.into_iter().flatten().collect();
    if let Some(serde_json::Value::Array(entries)) = body.get_mut("partitions") {
        for e in entries {
            let key = (
                e["aggregate"].as_str().unwrap_or_default().to_owned(),
                e["partition"].as_u64().unwrap_or_default() as u32,
            );
            if let (Some(lag), Some(obj)) = (lags.get(&key), e.as_object_mut()) {
                obj.insert("commands_lag".into(), json!(lag));
            }
        }
    }
    if let Some(obj) = body.as_object_mut() {
        obj.insert("backend".into(), json!(app.runtime.log().backend()));
        obj.insert(
            "restoring".into(),
            json!(parts.iter().filter(|p| p.state == PartitionState::Restoring).count()),
        );
        if app.options.registry.is_none()
            && let Some(serde_json::Value::Array(instances)) = obj.get_mut("instances")
            && let Some(serde_json::Value::Object(me)) = instances.first_mut()
            && !app.options.advertised_address.is_empty()
        {
            me.insert("http".into(), json!(app.options.advertised_address));
        }
    }
    axum::Json(body)
}

async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(json!({"status": "ok"}))
}

async fn readyz(State(app): State<App>) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let parts = app.runtime.partitions();
    let views = app.runtime.view_reports();
    let processes = app.runtime.process_reports();
    let not_ready: Vec<_> = parts
        .iter()
        .filter(|p| !matches!(p.state, PartitionState::Ready | PartitionState::Remote))
        .collect();
    let views_not_ready: Vec<_> = views.iter().filter(|v| v.state != ViewState::Ready).collect();
    let processes_not_ready: Vec<_> = processes
        .iter()
        .filter(|p| !matches!(p.state, ProcessState::Ready | ProcessState::Remote))
        .collect();
    let joined = app.runtime.has_joined();
    if joined && not_ready.is_empty() && views_not_ready.is_empty() && processes_not_ready.is_empty() {
        let owned = parts.iter().filter(|p| p.state != PartitionState::Remote).count();
        return Ok(axum::Json(json!({
            "ready": true,
            "partitions": parts.len(),
            "owned_partitions": owned,
            "views": views,
            "process_managers": processes,
        })));
    }
    let restoring = not_ready
        .iter()
        .filter(|p| p.state == PartitionState::Restoring)
        .count();
    let failed = not_ready.len() - restoring;
    let mut message = format!("{restoring} partitions restoring, {failed} failed, of {}", parts.len());
    if !joined {
        message.push_str("; waiting for the consumer group to assign partitions");
    }
    for v in &views_not_ready {
        let _ = match v.state {
            ViewState::Failed => write!(message, "; view `{}` failed", v.view),
            _ => write!(message, "; view `{}` catching up ({} events behind)", v.view, v.lag),
        };
    }
    for p in &processes_not_ready {
        let _ = match &p.error {
            Some(e) => write!(message, "; process manager `{}` failed: {e}", p.name),
            None => write!(
                message,
                "; process manager `{}` catching up ({} events behind)",
                p.name, p.lag
            ),
        };
    }
    let mut err = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", message);
    err.retry_after = Some(Duration::from_secs(1));
    err.extra = Some(json!({"partitions": not_ready, "views": views, "process_managers": processes}));
    Err(err)
}

async fn metrics(State(app): State<App>) -> Response {
    let body = app.runtime.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        body,
    )
        .into_response()
}
