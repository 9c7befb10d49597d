//! The OpenAPI 3.1 document of the HTTP API (DESIGN §6), served at `GET /openapi.json`.
//!
//! Built from [`ROUTES`], the table the router is built from: a route without an operation
//! here panics while the document is built, which every server start does. What a table
//! cannot show is checked by `tests/openapi.rs` against the running server and the
//! sources: every error code and status the code can answer is listed, every `$ref`
//! resolves, every path parameter is declared, and real answers match what is listed.
//!
//! Error responses list their stable codes as an `enum` narrowing the shared `Error`
//! schema, so a client generator (and a reader) sees per route and status which codes can
//! come back; `Error`'s own `enum` is the union of them all.

use crate::app::HttpOptions;
use crate::auth::Access;
use crate::route_table::{ROUTES, Route};
use eventfold_runtime::Runtime;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// OpenAPI version of the document.
pub const OPENAPI_VERSION: &str = "3.1.0";

/// Codes of the failures every read of the store may give (500).
const STORE_FAILURES: &[&str] = &["storage_error", "corrupt_record", "internal"];

/// The code a Server-Sent Events stream ends with when reading the events fails (in the
/// `data` of an `error` event, not as an HTTP status: the 200 has already gone out).
const STREAM_ERROR: &str = "read_failed";

/// The document for the service `runtime` runs: the path parameters naming aggregate
/// types, views and process managers list the registered ones.
pub fn document(runtime: &Runtime, options: &HttpOptions) -> Value {
    let ctx = Ctx { runtime, options };
    let mut paths = Map::new();
    let protect_metrics = options.auth.as_ref().is_some_and(|a| a.options().protect_metrics);
    for r in ROUTES {
        let item = paths.entry(r.path).or_insert_with(|| json!({}));
        let mut op = ctx.operation(r.method, r.path);
        guarded(&mut op, r, protect_metrics);
        item[r.method.to_ascii_lowercase()] = op;
    }
    let mut doc = json!({
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": format!("{} (eventfold HTTP API)", runtime.options().app_id),
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Commands, state and events of aggregates, view queries with read-your-writes, \
                process manager state, and operations (DESIGN §6; docs/http-api.md). Every error body is \
                `{\"error\": <stable code>, \"message\": <sentence>}`; a 503 carries `Retry-After`. Every \
                GET also answers HEAD (same status and headers, no body). A path with no route answers 404 \
                `not_found`, a method a path does not list 405 `method_not_allowed` with `Allow`. When the \
                service has tokens (`--auth-tokens`), each operation needs a bearer token of the role its \
                `x-eventfold-role` names (roles nest: admin, write, read); `/healthz` and `/readyz` are open.",
        },
        "tags": [
            {"name": "aggregates", "description": "Commands, state and events of one aggregate."},
            {"name": "views", "description": "Rows of views by key and by index."},
            {"name": "process-managers", "description": "State and timers of one process manager key."},
            {"name": "operations", "description": "Health, readiness, metrics, cluster, this document."},
            {"name": "console", "description": "The web console's page and assets (HTML; docs/console.md)."},
        ],
        "paths": paths,
        "components": components(),
    });
    // The shared enum: every code some response lists, and the stream's.
    let mut codes = BTreeSet::from([STREAM_ERROR.to_owned()]);
    collect_codes(&doc, &mut codes);
    doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"] = json!(codes);
    doc
}

/// Every string of an `error` property's `enum` inside `v` except the shared one.
fn collect_codes(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if let Some(list) = m
                .get("properties")
                .and_then(|p| p.get("error"))
                .and_then(|e| e.get("enum"))
                .and_then(Value::as_array)
            {
                out.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            m.values().for_each(|v| collect_codes(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_codes(v, out)),
        _ => {}
    }
}

struct Ctx<'a> {
    runtime: &'a Runtime,
    options: &'a HttpOptions,
}

impl Ctx<'_> {
    /// The operation of one entry of [`ROUTES`].
    fn operation(&self, method: &str, path: &str) -> Value {
        let o = self.options;
        match (method, path) {
            ("POST", "/v1/aggregates/{type}/{id}/commands") => json!({
                "tags": ["aggregates"],
                "operationId": "postCommand",
                "summary": "Run a command on one aggregate",
                "description": "The body is the command: a JSON document of the aggregate type's commands, \
                    internally tagged by `type`. The answer is the outcome; a retry with the same \
                    `Idempotency-Key` within the dedup window returns the original outcome and executes nothing.",
                "parameters": [
                    self.type_param(), ref_param("Id"), ref_param("IdempotencyKey"), ref_param("IfMatch"),
                    ref_param("SessionPosition"), ref_param("CorrelationId"),
                ],
                "requestBody": {
                    "required": true,
                    "description": format!("The command, at most {} bytes.", o.max_body_bytes),
                    "content": {"application/json": {"schema": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"type": "string", "description": "The command's name."}},
                    }}},
                },
                "responses": responses(
                    json!({
                        "200": ok("The command was accepted: the events it wrote (possibly none), the \
                            aggregate's new version and the position of the write (for `min_position` and \
                            `X-Session-Position`).", "Accepted"),
                        "422": {
                            "description": "The aggregate refused the command (its rule's own code); nothing was written.",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Rejection"}}},
                        },
                    }),
                    &[
                        (400, &[
                            "malformed_command", "unknown_command_type", "invalid_if_match", "invalid_position",
                            "bad_request", "invalid_path",
                        ]),
                        (404, &["unknown_aggregate_type"]),
                        (412, &["version_mismatch"]),
                        (413, &["payload_too_large"]),
                        (500, &["partition_failed", "corrupt_record", "storage_error", "commit_failed", "internal"]),
                        (503, &["overloaded", "partition_restoring", "not_owner", "unavailable", "shutting_down"]),
                        (504, &["outcome_unknown"]),
                    ],
                ),
            }),
            ("GET", "/v1/aggregates/{type}/{id}") => json!({
                "tags": ["aggregates"],
                "operationId": "getAggregate",
                "summary": "The current state of one aggregate",
                "description": "In Kafka mode a read reaching an instance that does not own the aggregate's \
                    partition is forwarded to the owner (one hop).",
                "parameters": [self.type_param(), ref_param("Id"), ref_param("IfNoneMatch"), ref_param("ForwardedBy")],
                "responses": responses(
                    json!({
                        "200": {
                            "description": "The state after `version` events.",
                            "headers": {"ETag": {"$ref": "#/components/headers/ETag"}},
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AggregateState"}}},
                        },
                        "304": {
                            "description": "`If-None-Match` names the current version.",
                            "headers": {"ETag": {"$ref": "#/components/headers/ETag"}},
                        },
                    }),
                    &[
                        (400, &["bad_request", "invalid_path"]),
                        (404, &["unknown_aggregate_type", "aggregate_not_found"]),
                        (500, STORE_FAILURES),
                        (502, &["bad_gateway"]),
                        (503, &["owner_unavailable"]),
                    ],
                ),
            }),
            ("GET", "/v1/aggregates/{type}/{id}/events") => json!({
                "tags": ["aggregates"],
                "operationId": "getAggregateEvents",
                "summary": "The events of one aggregate, or a live stream of them",
                "description": "With `Accept: text/event-stream` the answer is a Server-Sent Events stream: the \
                    stored events from `from_version`, then each new one as it is committed; each SSE event is \
                    named by the event's type, its `id` is the event's version (what `Last-Event-ID` resumes \
                    from) and its `data` an `Event`. If reading fails the stream ends with an SSE event named \
                    `error` whose data is `{\"error\": \"read_failed\", \"message\": ...}`.",
                "parameters": [
                    self.type_param(), ref_param("Id"),
                    {
                        "name": "from_version", "in": "query",
                        "description": "The first version to return (default 1).",
                        "schema": {"type": "integer", "minimum": 0, "default": 1},
                    },
                    {
                        "name": "limit", "in": "query",
                        "description": format!("Most events returned (brought into 1..={}; default {}). \
                            Not applied to the stream.", o.max_events_page, o.max_events_page),
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "Last-Event-ID", "in": "header",
                        "description": "Stream only: the last version seen; the stream resumes after it \
                            (an `EventSource` sends it when it reconnects).",
                        "schema": {"type": "string"},
                    },
                    ref_param("ForwardedBy"),
                ],
                "responses": responses(
                    json!({"200": {
                        "description": "The events from `from_version` on (empty when there are none), or with \
                            `Accept: text/event-stream` the live stream.",
                        "content": {
                            "application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}},
                            "text/event-stream": {"schema": {"type": "string", "description": "Server-Sent Events; each `data` is an `Event`."}},
                        },
                    }}),
                    &[
                        (400, &["bad_request", "invalid_query", "invalid_path"]),
                        (404, &["unknown_aggregate_type"]),
                        (500, STORE_FAILURES),
                        (502, &["bad_gateway"]),
                        (503, &["owner_unavailable"]),
                    ],
                ),
            }),
            ("GET", "/v1/views/{view}") => json!({
                "tags": ["views"],
                "operationId": "queryView",
                "summary": "Rows of a view by its indexes, a page at a time",
                "description": "Conditions on indexes: `{index}=v` (equality), `{index}_gte=v` and `{index}_lt=v` \
                    (half-open range), `{index}_prefix=v` (string indexes). One index drives the scan and gives \
                    the order (`order_by`, else the first index with a range or prefix, else the first named), \
                    the others filter. Rows come ordered by (driving value, key); with no condition, by key. \
                    Pass `next_cursor` back as `cursor` for the next page; it is `null` on the last page.",
                "parameters": [
                    self.view_param(),
                    {
                        "name": "conditions", "in": "query", "style": "form", "explode": true,
                        "description": "Index conditions, each a query parameter named `{index}`, `{index}_gte`, \
                            `{index}_lt` or `{index}_prefix` (see the `view` parameter for each view's indexes). \
                            Values: numbers in decimal, timestamps as RFC 3339, a date or milliseconds.",
                        "schema": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    {"name": "order", "in": "query", "description": "Direction of the driving index (default `asc`).",
                     "schema": {"type": "string", "enum": ["asc", "desc"], "default": "asc"}},
                    {"name": "order_by", "in": "query", "description": "The index that drives the scan and gives the order.",
                     "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "description": "Rows per page.",
                     "schema": {"type": "integer", "minimum": 1, "maximum": crate::views::MAX_LIMIT, "default": crate::views::DEFAULT_LIMIT}},
                    {"name": "cursor", "in": "query", "description": "The `next_cursor` of the previous page of the same query.",
                     "schema": {"type": "string"}},
                    self.min_position(),
                    ref_param("ForwardedBy"),
                    {
                        "name": "ef-partitions", "in": "header",
                        "description": "Between instances only (Kafka mode): the partitions this part of a \
                            scattered query answers for, comma-separated. Its answer gives each row's scan \
                            `position` and a `next_position` instead of `next_cursor`.",
                        "schema": {"type": "string"},
                    },
                ],
                "responses": responses(
                    json!({"200": ok("One page of rows.", "Page")}),
                    &[
                        (400, &[
                            "unknown_index", "invalid_value", "invalid_limit", "invalid_order", "invalid_cursor",
                            "invalid_position", "conflicting_parameters", "unsupported_condition", "invalid_query",
                            "invalid_partitions", "bad_request", "invalid_path",
                        ]),
                        (404, &["unknown_view"]),
                        (500, &["view_failed", "storage_error", "corrupt_record", "internal"]),
                        (502, &["bad_gateway"]),
                        (503, &["owner_unavailable", "not_owner"]),
                        (504, &["view_behind"]),
                    ],
                ),
            }),
            ("GET", "/v1/views/{view}/{key}") => json!({
                "tags": ["views"],
                "operationId": "getViewRow",
                "summary": "One row of a view",
                "parameters": [
                    self.view_param(),
                    {"name": "key", "in": "path", "required": true, "description": "The row's key.", "schema": {"type": "string"}},
                    self.min_position(),
                    ref_param("ForwardedBy"),
                ],
                "responses": responses(
                    json!({"200": ok("The row: `value` is its document.", "Row")}),
                    &[
                        (400, &["unknown_parameter", "invalid_position", "invalid_query", "bad_request", "invalid_path"]),
                        (404, &["unknown_view", "row_not_found"]),
                        (500, &["view_failed", "storage_error", "corrupt_record", "internal"]),
                        (502, &["bad_gateway"]),
                        (503, &["owner_unavailable", "not_owner"]),
                        (504, &["view_behind"]),
                    ],
                ),
            }),
            ("GET", "/v1/process-managers/{name}/{key}") => json!({
                "tags": ["process-managers"],
                "operationId": "getProcessManagerState",
                "summary": "The state and pending timers of one process manager key",
                "parameters": [
                    self.names_param(
                        "name",
                        "The process manager.",
                        self.runtime.process_reports().into_iter().map(|p| p.name).collect(),
                    ),
                    {"name": "key", "in": "path", "required": true, "description": "The correlation key.",
                     "schema": {"type": "string"}},
                ],
                "responses": responses(
                    json!({"200": ok("Its state and pending timers.", "ProcessState")}),
                    &[
                        (400, &["bad_request", "invalid_path"]),
                        (404, &["unknown_process_manager", "not_found"]),
                        (500, STORE_FAILURES),
                    ],
                ),
            }),
            ("GET", "/v1/aggregates") => json!({
                "tags": ["aggregates"],
                "operationId": "listAggregateTypes",
                "summary": "The aggregate types of this service",
                "responses": {"200": ok("The aggregate types, sorted.", "AggregateList")},
            }),
            ("GET", "/v1/views") => json!({
                "tags": ["views"],
                "operationId": "listViews",
                "summary": "Every view: state, lag, applied offsets, version being built, indexes",
                "responses": {"200": ok("The views, sorted by name.", "ViewList")},
            }),
            ("GET", "/v1/process-managers") => json!({
                "tags": ["process-managers"],
                "operationId": "listProcessManagers",
                "summary": "Every process manager: state, lag, timers, commands outstanding",
                "responses": {"200": ok("The process managers, sorted by name.", "ProcessManagerList")},
            }),
            ("GET", "/console") => json!({
                "tags": ["console"],
                "operationId": "getConsole",
                "summary": "The web console's page (no data: it asks for a token and calls this API)",
                "responses": console_answer("The page.", &["text/html"]),
            }),
            ("GET", "/console/{asset}") => json!({
                "tags": ["console"],
                "operationId": "getConsoleAsset",
                "summary": "A script, style sheet or icon of the web console",
                "parameters": [{"name": "asset", "in": "path", "required": true,
                    "description": "The file's name.",
                    "schema": {"type": "string", "enum": ["index.html", "console.js", "console.css", "icon.svg"]}}],
                "responses": responses(
                    console_answer("The file.", &["text/html", "text/javascript", "text/css", "image/svg+xml"]),
                    &[(400, &["invalid_path"]), (404, &["not_found"])],
                ),
            }),
            ("GET", "/v1/cluster") => json!({
                "tags": ["operations"],
                "operationId": "getCluster",
                "summary": "Instances, partitions, owners and lag",
                "responses": {"200": ok("The cluster as this instance sees it.", "Cluster")},
            }),
            ("GET", "/healthz") => json!({
                "tags": ["operations"],
                "operationId": "getHealth",
                "summary": "Liveness",
                "responses": {"200": {
                    "description": "The process answers.",
                    "content": {"application/json": {"schema": {
                        "type": "object", "required": ["status"],
                        "properties": {"status": {"const": "ok"}},
                    }}},
                }},
            }),
            ("GET", "/readyz") => json!({
                "tags": ["operations"],
                "operationId": "getReadiness",
                "summary": "Readiness: every partition restored, every view and process manager caught up",
                "responses": responses(
                    json!({"200": ok("Ready.", "Ready")}),
                    &[(503, &["not_ready"])],
                ),
            }),
            ("GET", "/metrics") => json!({
                "tags": ["operations"],
                "operationId": "getMetrics",
                "summary": "Prometheus metrics",
                "responses": {"200": {
                    "description": "Prometheus text exposition format 0.0.4.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }},
            }),
            ("GET", "/openapi.json") => json!({
                "tags": ["operations"],
                "operationId": "getOpenApi",
                "summary": "This document",
                "responses": {"200": {
                    "description": "The OpenAPI 3.1 document of this API.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }},
            }),
            _ => panic!("route {method} {path} has no operation in the OpenAPI document"),
        }
    }

    fn type_param(&self) -> Value {
        self.names_param(
            "type",
            "The aggregate type.",
            self.runtime.aggregate_names().map(str::to_owned).collect(),
        )
    }

    /// `{view}`, with each registered view's indexes in the description: a query's
    /// parameter names depend on the view, which one parameter cannot express.
    fn view_param(&self) -> Value {
        let mut description = String::from("The view.");
        let mut names = Vec::new();
        for name in self.runtime.view_names() {
            names.push(name.to_owned());
            let Ok(v) = self.runtime.view(name) else { continue };
            let indexes: Vec<String> = v
                .indexes()
                .iter()
                .map(|i| format!("`{}` ({})", i.name, crate::views::kind_name(i.kind)))
                .collect();
            let indexes = if indexes.is_empty() {
                "none".to_owned()
            } else {
                indexes.join(", ")
            };
            description.push_str(&format!(" `{name}`: indexes {indexes}."));
        }
        self.names_param("view", &description, names)
    }

    /// A path parameter naming something registered; the registered names as its `enum`
    /// (none registered: any string, every value then answers 404).
    fn names_param(&self, name: &str, description: &str, mut names: Vec<String>) -> Value {
        names.sort();
        let mut schema = json!({"type": "string"});
        if !names.is_empty() {
            schema["enum"] = json!(names);
        }
        json!({"name": name, "in": "path", "required": true, "description": description, "schema": schema})
    }

    fn min_position(&self) -> Value {
        json!({
            "name": "min_position", "in": "query", "style": "form", "explode": true,
            "description": format!(
                "The `position` of a command (repeatable): answer once the view has applied that write, \
                 or every one given, waiting {:?} at most (then 504 `view_behind`).",
                self.options.view_wait
            ),
            "schema": {"type": "array", "items": {"type": "string"}},
        })
    }
}

/// A console file's answers: 200 (as one of `media`) with its security headers, 304 for a
/// current `ETag`.
fn console_answer(description: &str, media: &[&str]) -> Value {
    let headers = json!({
        "Content-Security-Policy": {"required": true, "schema": {"type": "string"},
            "description": format!("`{}`", crate::console::CONTENT_SECURITY_POLICY)},
        "Cache-Control": {"required": true, "schema": {"const": "no-cache"}},
        "ETag": {"required": true, "schema": {"type": "string"}},
    });
    json!({
        "200": {"description": description, "headers": headers, "content": media.iter()
            .map(|m| (m.to_string(), json!({"schema": {"type": "string"}})))
            .collect::<Map<String, Value>>()},
        "304": {"description": "Unchanged since the `ETag` sent in `If-None-Match`.", "headers": headers},
    })
}

/// What the guard in front of every route adds to `op` (the route `r`): its role and
/// security requirement, 401 and 403 when it needs a token, 429 for a token over its rate,
/// 503 `overloaded` at the bound on requests in flight, and 408/413 for a body read too
/// slowly or too large.
fn guarded(op: &mut Value, r: &Route, protect_metrics: bool) {
    let needed = r.access.required(protect_metrics);
    op["security"] = match (needed, r.access) {
        (Some(_), _) => json!([{"bearer": []}]),
        // Open metrics: a token is taken and not needed.
        (None, Access::Metrics) => json!([{}, {"bearer": []}]),
        (None, _) => json!([]),
    };
    if r.access == Access::Open {
        // Probes pass the guard untouched.
        return;
    }
    if let Some(role) = needed {
        op["x-eventfold-role"] = json!(role.as_str());
        let responses = &mut op["responses"];
        add_codes(responses, 401, &["unauthenticated"]);
        add_codes(responses, 403, &["forbidden"]);
        add_codes(responses, 429, &["rate_limited"]);
        responses["401"]["headers"] = json!({"WWW-Authenticate": {"$ref": "#/components/headers/WWW-Authenticate"}});
    }
    let responses = &mut op["responses"];
    add_codes(responses, 503, &["overloaded"]);
    if r.method == "POST" {
        add_codes(responses, 400, &["bad_request"]);
        add_codes(responses, 408, &["request_timeout"]);
        add_codes(responses, 413, &["payload_too_large"]);
    }
}

/// Adds `codes` to the error response of `status` in `responses` (made if missing).
fn add_codes(responses: &mut Value, status: u16, codes: &[&str]) {
    let key = status.to_string();
    let Some(existing) = responses.get_mut(&key) else {
        responses[key] = error_response(status, codes);
        return;
    };
    let Some(list) =
        existing["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"]["enum"].as_array_mut()
    else {
        return;
    };
    for c in codes {
        if !list.iter().any(|v| v == c) {
            list.push(json!(c));
        }
    }
}

fn ref_param(name: &str) -> Value {
    json!({"$ref": format!("#/components/parameters/{name}")})
}

/// A JSON response of schema `schema` (a component).
fn ok(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}},
    })
}

/// `answers` (the successful ones and any special) plus one error response per status,
/// each listing the codes it can carry.
fn responses(mut answers: Value, errors: &[(u16, &[&str])]) -> Value {
    for (status, codes) in errors {
        answers[status.to_string()] = error_response(*status, codes);
    }
    answers
}

/// An error response: the `Error` schema narrowed to `codes`, with the fields some codes
/// add to the body, and `Retry-After` on a 503.
fn error_response(status: u16, codes: &[&str]) -> Value {
    let mut narrowed = json!({"properties": {"error": {"enum": codes}}});
    let mut add = |name: &str, schema: Value, why: &str| {
        let mut schema = schema;
        schema["description"] = json!(why);
        narrowed["properties"][name] = schema;
    };
    if codes.contains(&"version_mismatch") {
        add(
            "expected_version",
            json!({"type": "integer"}),
            "`version_mismatch`: the version `If-Match` named.",
        );
        add(
            "actual_version",
            json!({"type": "integer"}),
            "`version_mismatch`: the aggregate's version.",
        );
    }
    if codes.contains(&"view_behind") {
        add(
            "position",
            json!({"type": "string"}),
            "`view_behind`: how far the view got.",
        );
    }
    if codes.contains(&"not_ready") {
        add(
            "partitions",
            json!({"type": "array", "items": {"type": "object"}}),
            "`not_ready`: the partitions not ready.",
        );
        add(
            "views",
            json!({"type": "array", "items": {"type": "object"}}),
            "`not_ready`: every view's state.",
        );
        add(
            "process_managers",
            json!({"type": "array", "items": {"type": "object"}}),
            "`not_ready`: every process manager's state.",
        );
    }
    let mut response = json!({
        "description": status_description(status),
        "content": {"application/json": {"schema": {
            "allOf": [{"$ref": "#/components/schemas/Error"}, narrowed],
        }}},
    });
    if status == 503 || status == 429 {
        response["headers"] = json!({"Retry-After": {"$ref": "#/components/headers/Retry-After"}});
    }
    response
}

fn status_description(status: u16) -> &'static str {
    match status {
        400 => "The request is malformed; nothing was done.",
        401 => "No bearer token, or one the service does not know (`WWW-Authenticate: Bearer`).",
        403 => "The token's role is not enough for this operation (`x-eventfold-role`).",
        408 => "The request body did not arrive in time; the connection is closed.",
        429 => "The token is over its rate limit: retry after `Retry-After` seconds.",
        404 => "Nothing of that name.",
        405 => "The path does not take this method.",
        412 => "`If-Match` names another version than the aggregate's; nothing was written.",
        413 => "The body is over the limit; nothing was done.",
        500 => "The server failed (a stopped partition or view, storage); other partitions keep serving.",
        502 => "Another instance's answer could not be passed on.",
        503 => "Not now: retry after `Retry-After` seconds.",
        504 => {
            "No answer in time: for a command the outcome is unknown (a retry with the same \
            `Idempotency-Key` is safe); for a view query the view had not applied `min_position`."
        }
        _ => "An error.",
    }
}

fn components() -> Value {
    let event = json!({
        "type": "object",
        "required": ["version", "type", "id", "command_id", "correlation_id", "causation_id", "timestamp", "payload"],
        "properties": {
            "version": {"type": "integer", "minimum": 1, "description": "The aggregate's version after this event."},
            "type": {"type": "string", "description": "The event's type name."},
            "id": {"type": "string", "description": "The event's id (UUID v7)."},
            "command_id": {"type": "string", "description": "The command that wrote it (its `Idempotency-Key` when given)."},
            "correlation_id": {"type": "string", "description": "The same along a whole flow."},
            "causation_id": {"type": "string", "description": "Its command's id, or for a command a process manager sent, the id of the event it reacted to."},
            "timestamp": {"type": "string", "format": "date-time"},
            "payload": {"description": "The event document."},
        },
    });
    json!({
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error", "message"],
                "properties": {
                    // The enum is filled by `document` from every response.
                    "error": {"type": "string", "description": "Stable machine-readable code."},
                    "message": {"type": "string", "description": "Human sentence."},
                },
            },
            "Rejection": {
                "type": "object",
                "required": ["error", "message"],
                "description": "A command refused by the aggregate; `error` is the code of the aggregate's rule.",
                "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
            },
            "Event": event,
            "Accepted": {
                "type": "object",
                "required": ["aggregate_id", "version", "events", "position"],
                "properties": {
                    "aggregate_id": {"type": "string"},
                    "version": {"type": "integer", "minimum": 0, "description": "The aggregate's version after the command."},
                    "events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
                    "position": {"type": "string", "description": "Opaque token for `min_position` and `X-Session-Position`."},
                },
            },
            "AggregateState": {
                "type": "object",
                "required": ["id", "version", "state"],
                "properties": {
                    "id": {"type": "string"},
                    "version": {"type": "integer", "minimum": 1},
                    "state": {"description": "The state document."},
                },
            },
            "Row": {
                "type": "object",
                "required": ["key", "value"],
                "properties": {"key": {"type": "string"}, "value": {"description": "The row's document."}},
            },
            "Page": {
                "type": "object",
                "required": ["rows", "next_cursor"],
                "properties": {
                    "rows": {"type": "array", "items": {"$ref": "#/components/schemas/Row"}},
                    "next_cursor": {"type": ["string", "null"], "description": "The next page's `cursor`; `null` on the last page."},
                },
            },
            "ProcessState": {
                "type": "object",
                "required": ["name", "key", "state", "timers"],
                "properties": {
                    "name": {"type": "string"},
                    "key": {"type": "string"},
                    "state": {"description": "The state document (`null` when only timers are left)."},
                    "timers": {"type": "array", "items": {
                        "type": "object",
                        "required": ["id", "due"],
                        "properties": {"id": {"type": "string"}, "due": {"type": "string", "format": "date-time"}},
                    }},
                },
            },
            "Cluster": {
                "type": "object",
                "required": ["backend", "instance_id", "instances", "partitions", "restoring"],
                "properties": {
                    "backend": {"type": "string"},
                    "instance_id": {"type": "string"},
                    "instances": {"type": "array", "items": {
                        "type": "object",
                        "required": ["instance_id", "http", "alive", "generation", "assigned_ms", "updated_ms", "partitions"],
                        "properties": {
                            "instance_id": {"type": "string"},
                            "http": {"type": ["string", "null"]},
                            "alive": {"type": "boolean"},
                            "generation": {"type": "integer"},
                            "assigned_ms": {"type": ["integer", "null"]},
                            "updated_ms": {"type": ["integer", "null"]},
                            "partitions": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}},
                                           "description": "Partitions owned, by aggregate type."},
                        },
                    }},
                    "partitions": {"type": "array", "items": {
                        "type": "object",
                        "required": ["aggregate", "partition", "owner", "state", "restore_progress", "queued"],
                        "properties": {
                            "aggregate": {"type": "string"},
                            "partition": {"type": "integer"},
                            "owner": {"type": ["string", "null"]},
                            "state": {"type": "string", "enum": ["ready", "restoring", "failed", "remote"]},
                            "restore_progress": {"type": "number"},
                            "queued": {"type": "integer"},
                            "commands_lag": {"type": "integer", "description": "Kafka, partitions owned here: records of the commands topic not consumed yet."},
                            "error": {"type": "string", "description": "Why a failed partition stopped."},
                        },
                    }},
                    "restoring": {"type": "integer", "description": "Partitions restoring here."},
                },
            },
            "AggregateList": {
                "type": "object",
                "required": ["aggregates"],
                "properties": {"aggregates": {"type": "array", "items": {
                    "type": "object",
                    "required": ["type", "partitions"],
                    "properties": {
                        "type": {"type": "string"},
                        "partitions": {"type": "integer", "description": "Partitions of its topics."},
                    },
                }}},
            },
            "ViewList": {
                "type": "object",
                "required": ["views"],
                "properties": {"views": {"type": "array", "items": {"$ref": "#/components/schemas/ViewReport"}}},
            },
            "ViewReport": {
                "type": "object",
                "required": ["view", "state", "lag", "position", "partitions", "version"],
                "properties": {
                    "view": {"type": "string", "description": "The view's name."},
                    "state": {"type": "string", "enum": ["catching_up", "ready", "failed", "remote"]},
                    "lag": {"type": "integer", "description": "Source events not applied yet, over the partitions served here."},
                    "position": {"type": "string", "description": "What it has applied, as a position token."},
                    "version": {"type": "integer", "description": "The projection version answering queries."},
                    "partitions": {"type": "array", "description": "The partitions not ready, with `applied`, `end`, `lag`, `target`, `error`.",
                                   "items": {"type": "object"}},
                    "building": {"$ref": "#/components/schemas/ViewReport", "description": "A newer version being built side by side."},
                    "source": {"type": "string", "description": "The source aggregate type."},
                    "scope": {"type": "string", "enum": ["partitioned", "replicated"]},
                    "indexes": {"type": "array", "items": {
                        "type": "object",
                        "required": ["name", "field", "kind", "unique"],
                        "properties": {
                            "name": {"type": "string"},
                            "field": {"type": "string", "description": "JSON pointer into the row."},
                            "kind": {"type": "string", "enum": ["string", "number", "timestamp"]},
                            "unique": {"type": "boolean"},
                        },
                    }},
                    "applied": {"type": "array", "description": "Next source offset to apply, per partition.", "items": {
                        "type": "object",
                        "required": ["partition", "offset"],
                        "properties": {"partition": {"type": "integer"}, "offset": {"type": "integer"}},
                    }},
                },
            },
            "ProcessManagerList": {
                "type": "object",
                "required": ["process_managers"],
                "properties": {"process_managers": {"type": "array", "items": {
                    "type": "object",
                    "required": ["name", "state", "lag", "reactions", "timers_pending", "timers_overdue", "commands_outstanding"],
                    "properties": {
                        "name": {"type": "string"},
                        "state": {"type": "string", "enum": ["catching_up", "ready", "failed", "remote"]},
                        "lag": {"type": "integer", "description": "Source events not read yet."},
                        "reactions": {"type": "integer", "description": "Inputs reacted to since start."},
                        "timers_pending": {"type": "integer"},
                        "timers_overdue": {"type": "integer", "description": "Due more than a second ago and not fired yet."},
                        "commands_outstanding": {"type": "integer", "description": "Sent and not answered yet."},
                        "error": {"type": "string", "description": "Why it failed."},
                    },
                }}},
            },
            "Ready": {
                "type": "object",
                "required": ["ready", "partitions", "owned_partitions", "views", "process_managers"],
                "properties": {
                    "ready": {"const": true},
                    "partitions": {"type": "integer"},
                    "owned_partitions": {"type": "integer"},
                    "views": {"type": "array", "items": {"type": "object"}},
                    "process_managers": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
        "parameters": {
            "Id": {
                "name": "id", "in": "path", "required": true,
                "description": "The aggregate id: 1 to 256 bytes of printable characters without `/`.",
                "schema": {"type": "string", "minLength": 1},
            },
            "IdempotencyKey": {
                "name": "Idempotency-Key", "in": "header",
                "description": "1 to 256 visible ASCII characters; becomes the command id. A retry with the \
                    same key within the dedup window returns the original outcome and executes nothing.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 256},
            },
            "IfMatch": {
                "name": "If-Match", "in": "header",
                "description": "`\"<version>\"` (quotes optional): run only if the aggregate is at that \
                    version (`\"0\"`: it must not exist yet), else 412.",
                "schema": {"type": "string"},
            },
            "SessionPosition": {
                "name": "X-Session-Position", "in": "header",
                "description": "Session consistency: the client's last position; the answer's `position` is \
                    the merge of it and this write's. A token that does not decode is 400 `invalid_position` \
                    and the command is not run.",
                "schema": {"type": "string"},
            },
            "CorrelationId": {
                "name": "X-Correlation-Id", "in": "header",
                "description": "Carried on the events the command writes (`correlation_id`).",
                "schema": {"type": "string"},
            },
            "IfNoneMatch": {
                "name": "If-None-Match", "in": "header",
                "description": "An `ETag` seen before: 304 while the aggregate is still at that version.",
                "schema": {"type": "string"},
            },
            "ForwardedBy": {
                "name": "ef-forwarded-by", "in": "header",
                "description": "Between instances only (Kafka mode): marks a request forwarded to the owner \
                    of its partition, which answers it itself (one hop). Clients do not send it.",
                "schema": {"type": "string"},
            },
        },
        "securitySchemes": {
            "bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A token of the service's token file (`--auth-tokens`), as `Authorization: \
                    Bearer <token>`. Roles nest: `admin` ⊇ `write` ⊇ `read`; each operation's `x-eventfold-role` \
                    names the least it needs.",
            },
        },
        "headers": {
            "WWW-Authenticate": {
                "description": "`Bearer realm=\"eventfold\"` (with `error=\"invalid_token\"` for an unknown token).",
                "required": true,
                "schema": {"type": "string"},
            },
            "ETag": {
                "description": "`\"<version>\"`: the aggregate's version.",
                "required": true,
                "schema": {"type": "string"},
            },
            "Retry-After": {
                "description": "Seconds to wait before retrying.",
                "required": true,
                "schema": {"type": "integer", "minimum": 1},
            },
            "Allow": {
                "description": "The methods the path takes.",
                "required": true,
                "schema": {"type": "string"},
            },
        },
        "responses": {
            "NotFound": {
                "description": "Any path with no route: 404 `not_found`.",
                // Not an operation's answer, so no status key says it: this does.
                "x-status": 404,
                "content": {"application/json": {"schema": {"allOf": [
                    {"$ref": "#/components/schemas/Error"},
                    {"properties": {"error": {"enum": ["not_found"]}}},
                ]}}},
            },
            "MethodNotAllowed": {
                "description": "A method a path does not list: 405 `method_not_allowed`.",
                "x-status": 405,
                "headers": {"Allow": {"$ref": "#/components/headers/Allow"}},
                "content": {"application/json": {"schema": {"allOf": [
                    {"$ref": "#/components/schemas/Error"},
                    {"properties": {"error": {"enum": ["method_not_allowed"]}}},
                ]}}},
            },
        },
    })
}
