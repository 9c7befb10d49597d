//! The OpenAPI document (`GET /openapi.json`) against what the server really does: its
//! routes and methods (asked of the running router), the error codes and statuses in the
//! crate's sources, the OpenAPI 3.1 structure, and the answers to real requests. Embedded
//! log only: the document does not depend on the backend.

use eventfold_core::projection::Event;
use eventfold_core::testing::{Counter, CounterEvent};
use eventfold_core::{
    Actions, EventMeta, Index, Input, ProcessContext, ProcessManager, Projection, Subscription, ViewChanges,
};
use eventfold_http::{HttpOptions, ROUTES};
use eventfold_log::embedded::{EmbeddedLog, Options};
use eventfold_runtime::{Runtime, RuntimeOptions};
use eventfold_store::{Store, StoreOptions};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// `totals`: one row per counter, `{"total"}`, indexed by `total`.
#[derive(Debug, Default)]
struct Totals;

impl Projection for Totals {
    const VIEW: &'static str = "totals";
    type Source = Counter;
    fn indexes(&self) -> Vec<Index> {
        vec![Index::number("total")]
    }
    fn apply(&self, event: &Event<'_, CounterEvent>, view: &mut ViewChanges<'_>) {
        let CounterEvent::Added { n } = event.payload;
        if event.version == 1 {
            view.upsert(event.aggregate_id, json!({"total": n}));
        } else {
            view.update(event.aggregate_id, |row| {
                row["total"] = json!(row["total"].as_u64().unwrap_or(0) + n);
            });
        }
    }
}

/// `tally`: sums what each counter was given; sends nothing.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Tally {
    seen: u64,
}

impl ProcessManager for Tally {
    const NAME: &'static str = "tally";
    type Event = CounterEvent;
    type Config = ();
    fn subscriptions(_: &()) -> Vec<Subscription<CounterEvent>> {
        vec![Subscription::to::<Counter>(|e| e)]
    }
    fn correlate(_: &CounterEvent, meta: &EventMeta<'_>) -> Option<String> {
        Some(meta.aggregate_id.to_owned())
    }
    fn react(&mut self, input: Input<'_, CounterEvent>, _: &ProcessContext<'_, ()>, _: &mut Actions) {
        if let Input::Event {
            event: CounterEvent::Added { n },
            ..
        } = input
        {
            self.seen += n;
        }
    }
}

struct Server {
    base: String,
    runtime: Runtime,
    options: HttpOptions,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// A server with an aggregate type, a view and a process manager, so that every route has
/// something to answer for.
async fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let log = EmbeddedLog::open(
        store,
        Options {
            partitions: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let runtime = Runtime::builder(RuntimeOptions {
        app_id: "test".into(),
        ..Default::default()
    })
    .aggregate::<Counter>(())
    .view::<Totals>()
    .process_manager::<Tally>(())
    .build(Arc::new(log));
    assert!(
        runtime.wait_restored(Duration::from_secs(10)).await,
        "partitions restore"
    );
    let options = HttpOptions {
        max_body_bytes: 1024,
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = eventfold_http::router(runtime.clone(), options.clone());
    tokio::spawn(eventfold_http::serve(listener, router, std::future::pending()));
    Server {
        base,
        runtime,
        options,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

/// One answer of the server.
struct Answer {
    method: &'static str,
    path: String,
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Server {
    async fn call(&self, method: &'static str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
        let mut req = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.body(b.to_owned());
        }
        let resp = req.send().await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            method,
            path: path.to_owned(),
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.call("GET", path, &[], None).await
    }

    async fn document(&self) -> Value {
        let a = self.get("/openapi.json").await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        a.body
    }
}

/// `$ref` target inside `doc` (local JSON pointers only).
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc
            .pointer(r.strip_prefix('#').unwrap_or_else(|| panic!("non-local $ref {r}")))
            .unwrap_or_else(|| panic!("$ref {r} does not resolve")),
        None => v,
    }
}

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// (method in upper case, path template) of every operation of the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths is an object") {
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((m.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// The path template of the document that `path` matches, literal segments first (as
/// the router does).
fn template_of(doc: &Value, path: &str) -> Option<String> {
    let segs: Vec<&str> = path.split('?').next().unwrap().split('/').collect();
    let mut matches: Vec<(usize, &String)> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .filter_map(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            let fits = ts.len() == segs.len()
                && ts
                    .iter()
                    .zip(&segs)
                    .all(|(t, s)| (t.starts_with('{') && !s.is_empty()) || t == s);
            fits.then(|| (ts.iter().filter(|t| t.starts_with('{')).count(), t))
        })
        .collect();
    matches.sort();
    matches.first().map(|(_, t)| (*t).clone())
}

/// A concrete path for a template, naming what the test server registered.
fn concrete(template: &str) -> String {
    template
        .replace("{type}", "counter")
        .replace("{id}", "c-1")
        .replace("{view}", "totals")
        .replace("{name}", "tally")
        .replace("{key}", "c-1")
        .replace("{asset}", "console.js")
}

/// The codes an error response's schema lists (its narrowing of `Error`).
fn listed_codes(doc: &Value, response: &Value) -> Option<Vec<String>> {
    let schema = resolve(doc, &resolve(doc, response)["content"]["application/json"]["schema"]);
    let all_of = schema.get("allOf")?.as_array()?;
    assert!(
        all_of.iter().any(|s| s["$ref"] == "#/components/schemas/Error"),
        "an error response narrows the Error schema: {schema}"
    );
    let codes = all_of
        .iter()
        .find_map(|s| s.pointer("/properties/error/enum"))?
        .as_array()?
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    Some(codes)
}

/// (status, code) of every error response of the document: the operations' and the
/// shared ones (`x-status`).
fn documented_pairs(doc: &Value) -> BTreeSet<(u16, String)> {
    let mut out = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for m in METHODS {
            let Some(op) = item.get(m) else { continue };
            for (status, response) in op["responses"].as_object().unwrap() {
                for code in listed_codes(doc, response).unwrap_or_default() {
                    out.insert((status.parse().unwrap(), code));
                }
            }
        }
    }
    for response in doc["components"]["responses"].as_object().unwrap().values() {
        let status = response["x-status"]
            .as_u64()
            .expect("a shared response says its x-status") as u16;
        for code in listed_codes(doc, response).expect("a shared response is an error") {
            out.insert((status, code));
        }
    }
    out
}

/// The response the document lists for `answer`, or why there is none; checks the
/// answer's headers, content type and error code against it.
fn check_answer(doc: &Value, a: &Answer) -> Result<(), String> {
    let what = format!("{} {} answered {} {}", a.method, a.path, a.status, a.body);
    let shared = |name: &str| &doc["components"]["responses"][name];
    let response = match template_of(doc, &a.path) {
        None => shared("NotFound"),
        Some(t) => match doc["paths"][&t].get(a.method.to_ascii_lowercase()) {
            None => shared("MethodNotAllowed"),
            Some(op) => op["responses"]
                .get(a.status.as_str())
                .ok_or_else(|| format!("{what}: {} {t} lists no {}", a.method, a.status))?,
        },
    };
    if let Some(s) = response.get("x-status")
        && s != a.status.as_u16()
    {
        return Err(format!("{what}: expected the shared {s}"));
    }
    for (name, header) in response["headers"].as_object().into_iter().flatten() {
        if resolve(doc, header)["required"] == true && !a.headers.contains_key(name.as_str()) {
            return Err(format!("{what}: the document promises header {name}"));
        }
    }
    match a.headers.get("content-type").map(|c| c.to_str().unwrap()) {
        None => {
            if response.get("content").is_some() {
                return Err(format!("{what}: no content type, the document lists content"));
            }
        }
        Some(ct) => {
            let media = ct.split(';').next().unwrap().trim();
            if response["content"].get(media).is_none() {
                return Err(format!("{what}: content type {media} is not listed"));
            }
        }
    }
    if let Some(codes) = listed_codes(doc, response) {
        let code = a.body["error"].as_str().unwrap_or_default();
        if !codes.iter().any(|c| c == code) {
            return Err(format!("{what}: code {code:?} is not among {codes:?}"));
        }
        if !a.body["message"].is_string() {
            return Err(format!("{what}: no message"));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_openapi_json_serves_the_document_of_the_running_service() {
    let s = start().await;
    let a = s.get("/openapi.json").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/json");
    assert_eq!(a.body, eventfold_http::openapi::document(&s.runtime, &s.options));
    assert!(a.body["openapi"].as_str().unwrap().starts_with("3.1."));
    // The registered aggregate types, views and process managers are the path
    // parameters' values.
    let param = |path: &str, name: &str| {
        let op = &a.body["paths"][path]["get"];
        op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| resolve(&a.body, p))
            .find(|p| p["name"] == name && p["in"] == "path")
            .unwrap_or_else(|| panic!("{path} declares {name}"))
            .clone()
    };
    assert_eq!(
        param("/v1/aggregates/{type}/{id}", "type")["schema"]["enum"],
        json!(["counter"])
    );
    let view = param("/v1/views/{view}", "view");
    assert_eq!(view["schema"]["enum"], json!(["totals"]));
    assert!(
        view["description"].as_str().unwrap().contains("`total` (number)"),
        "{view}"
    );
    assert_eq!(
        param("/v1/process-managers/{name}/{key}", "name")["schema"]["enum"],
        json!(["tally"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_in_the_document_with_its_methods_and_nothing_else() {
    let s = start().await;
    let doc = s.document().await;
    let routes: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(
        operations(&doc),
        routes,
        "the document's operations are the router's ROUTES"
    );
    // Ask the router itself (not the table) which methods each path takes: a method no
    // route uses gets 405 with `Allow`.
    let mut by_path: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (m, p) in &routes {
        by_path.entry(p).or_default().insert(m.clone());
    }
    for (path, mut methods) in by_path {
        if methods.contains("GET") {
            methods.insert("HEAD".into()); // axum answers HEAD on every GET route
        }
        let a = s.call("PATCH", &concrete(path), &[], None).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "PATCH {path}: {}", a.body);
        let allow: BTreeSet<String> = a.headers["allow"]
            .to_str()
            .unwrap()
            .split(',')
            .map(|m| m.trim().to_owned())
            .collect();
        assert_eq!(allow, methods, "the router's methods of {path}");
        check_answer(&doc, &a).unwrap();
    }
}

/// A Rust string literal starting at `s` (after its opening quote), without escapes.
fn literal(s: &str) -> Option<&str> {
    let end = s.find('"')?;
    let lit = &s[..end];
    (!lit.contains('\\')).then_some(lit)
}

/// The crate's sources (not the document's own), without tests and comments.
fn sources() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.ends_with(".rs") || name == "openapi.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        out.push((name, code.join("\n")));
    }
    assert!(out.len() >= 5, "found the sources: {out:?}");
    out
}

fn status_named(name: &str) -> Option<u16> {
    Some(match name {
        "BAD_REQUEST" => 400,
        "UNAUTHORIZED" => 401,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "METHOD_NOT_ALLOWED" => 405,
        "REQUEST_TIMEOUT" => 408,
        "PRECONDITION_FAILED" => 412,
        "PAYLOAD_TOO_LARGE" => 413,
        "UNPROCESSABLE_ENTITY" => 422,
        "TOO_MANY_REQUESTS" => 429,
        "INTERNAL_SERVER_ERROR" => 500,
        "BAD_GATEWAY" => 502,
        "SERVICE_UNAVAILABLE" => 503,
        "GATEWAY_TIMEOUT" => 504,
        _ => return None,
    })
}

/// Every error code the sources write as a literal, with its status where the source
/// gives one: `StatusCode::X, "code"` (`ApiError::new` and error.rs's table of runtime
/// errors), `bad_request("code"` (400) and `"error": "code"` (a body built by hand, like
/// the event stream's error event). An `ApiError::new` or `bad_request` whose code is no
/// literal is a failure: this scan could not see it.
fn source_codes() -> BTreeSet<(Option<u16>, String)> {
    let mut out = BTreeSet::new();
    let mut unseen = Vec::new();
    for (file, src) in sources() {
        for (i, _) in src.match_indices("StatusCode::") {
            let rest = &src[i + "StatusCode::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            let after = rest[name.len()..].trim_start();
            let Some(after) = after.strip_prefix(',') else { continue };
            let Some(lit) = after.trim_start().strip_prefix('"').and_then(literal) else {
                continue;
            };
            match status_named(&name) {
                Some(status) => out.insert((Some(status), lit.to_owned())),
                None => panic!("{file}: add StatusCode::{name} to status_named (code {lit})"),
            };
        }
        for (i, _) in src.match_indices("bad_request(") {
            if src[..i].ends_with("fn ") {
                continue;
            }
            match src[i + "bad_request(".len()..]
                .trim_start()
                .strip_prefix('"')
                .and_then(literal)
            {
                Some(lit) => out.insert((Some(400), lit.to_owned())),
                None => {
                    unseen.push(format!("{file}: {}", &src[i..(i + 60).min(src.len())]));
                    false
                }
            };
        }
        for (i, _) in src.match_indices("ApiError::new(") {
            let rest = src[i + "ApiError::new(".len()..].trim_start();
            let seen = rest
                .strip_prefix("StatusCode::")
                .and_then(|r| r.split_once(','))
                .and_then(|(_, r)| r.trim_start().strip_prefix('"'))
                .and_then(literal)
                .is_some();
            if !seen {
                unseen.push(format!("{file}: {}", &src[i..(i + 80).min(src.len())]));
            }
        }
        for (i, _) in src.match_indices("\"error\":") {
            let rest = src[i + "\"error\":".len()..].trim_start();
            if let Some(lit) = rest.strip_prefix('"').and_then(literal) {
                out.insert((None, lit.to_owned()));
            }
        }
    }
    assert!(
        unseen.is_empty(),
        "error codes this scan cannot read (write them as literals): {unseen:#?}"
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_of_the_sources_is_in_the_document_with_its_status_and_back() {
    let s = start().await;
    let doc = s.document().await;
    let source = source_codes();
    assert!(source.len() > 30, "the scan found the codes: {source:?}");
    let codes: BTreeSet<String> = source.iter().map(|(_, c)| c.clone()).collect();
    let error_enum: BTreeSet<String> = doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
        .as_array()
        .expect("Error.error has an enum")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let missing: Vec<_> = codes.difference(&error_enum).collect();
    let stale: Vec<_> = error_enum.difference(&codes).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "codes the sources use but the Error schema lacks: {missing:?}; codes it lists that no source uses: {stale:?}"
    );
    let with_status: BTreeSet<(u16, String)> = source.into_iter().filter_map(|(s, c)| Some((s?, c))).collect();
    let documented = documented_pairs(&doc);
    let missing: Vec<_> = with_status.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&with_status).collect();
    assert!(
        missing.is_empty(),
        "(status, code) the sources answer that no response of the document lists: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "(status, code) the document lists that no source answers: {stale:?}"
    );
}

#[test]
fn the_router_is_built_from_the_routes_table_only() {
    // The route check above compares the document with ROUTES; a route added beside the
    // table would escape it.
    let count = |needle: &str| sources().iter().map(|(_, s)| s.matches(needle).count()).sum::<usize>();
    assert_eq!(count(".route("), 1, "one `.route(` call: the loop over ROUTES");
    for needle in [".route_service(", ".nest(", ".nest_service(", ".fallback_service("] {
        assert_eq!(count(needle), 0, "{needle} adds routes that ROUTES does not list");
    }
}

/// Problems of `doc` as an OpenAPI 3.1 document (the structure this API uses; not a full
/// validator).
fn structure_problems(doc: &Value) -> Vec<String> {
    let mut p = Vec::new();
    if !doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1.")) {
        p.push(format!("openapi is {}", doc["openapi"]));
    }
    if !doc["info"]["title"].is_string() || !doc["info"]["version"].is_string() {
        p.push("info needs title and version".into());
    }
    // Every $ref resolves.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(doc, &mut all);
    for r in &all {
        if r.strip_prefix('#').is_none_or(|ptr| doc.pointer(ptr).is_none()) {
            p.push(format!("$ref {r} does not resolve"));
        }
    }
    let mut operation_ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with('/') {
            p.push(format!("path {path} does not start with /"));
        }
        let template: BTreeSet<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        for key in item.as_object().unwrap().keys() {
            if !METHODS.contains(&key.as_str())
                && !["summary", "description", "parameters", "servers"].contains(&key.as_str())
            {
                p.push(format!("{path}: unknown key {key}"));
            }
        }
        for m in METHODS {
            let Some(op) = item.get(m) else { continue };
            let at = format!("{m} {path}");
            match op["operationId"].as_str() {
                Some(id) if operation_ids.insert(id.to_owned()) => {}
                other => p.push(format!("{at}: operationId {other:?} missing or not unique")),
            }
            let mut declared = BTreeSet::new();
            for param in op["parameters"].as_array().into_iter().flatten() {
                let param = resolve(doc, param);
                let (name, place) = (param["name"].as_str().unwrap_or(""), param["in"].as_str().unwrap_or(""));
                if name.is_empty() || !["path", "query", "header", "cookie"].contains(&place) {
                    p.push(format!("{at}: parameter {param} needs a name and a valid `in`"));
                }
                if param.get("schema").is_none() && param.get("content").is_none() {
                    p.push(format!("{at}: parameter {name} has no schema"));
                }
                if !declared.insert((place.to_owned(), name.to_ascii_lowercase())) {
                    p.push(format!("{at}: parameter {name} in {place} twice"));
                }
                if place == "path" {
                    if param["required"] != true {
                        p.push(format!("{at}: path parameter {name} must be required"));
                    }
                    if !template.contains(name) {
                        p.push(format!("{at}: path parameter {name} is not in the path"));
                    }
                }
                if place == "header"
                    && ["accept", "content-type", "authorization"].contains(&name.to_ascii_lowercase().as_str())
                {
                    p.push(format!("{at}: OpenAPI ignores a header parameter named {name}"));
                }
            }
            for t in &template {
                if !declared.contains(&("path".to_owned(), t.to_ascii_lowercase())) {
                    p.push(format!("{at}: path parameter {{{t}}} is not declared"));
                }
            }
            for requirement in op["security"].as_array().into_iter().flatten() {
                for scheme in requirement.as_object().into_iter().flatten().map(|(k, _)| k) {
                    if doc["components"]["securitySchemes"].get(scheme).is_none() {
                        p.push(format!("{at}: security scheme {scheme} is not declared"));
                    }
                }
            }
            let Some(responses) = op["responses"].as_object().filter(|r| !r.is_empty()) else {
                p.push(format!("{at}: no responses"));
                continue;
            };
            for (status, r) in responses {
                let valid = status == "default"
                    || (status.len() == 3
                        && status.chars().all(|c| c.is_ascii_digit())
                        && ("100".."600").contains(&status.as_str()));
                if !valid {
                    p.push(format!("{at}: response key {status}"));
                }
                if !resolve(doc, r)["description"].is_string() {
                    p.push(format!("{at}: response {status} has no description"));
                }
            }
        }
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_structurally_valid_openapi_3_1() {
    let s = start().await;
    let doc = s.document().await;
    let problems = structure_problems(&doc);
    assert!(problems.is_empty(), "{problems:#?}");
    // The checks can fail: a broken copy is caught.
    let mut broken = doc.clone();
    broken["paths"]["/v1/views/{view}/{key}"]["get"]["parameters"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["name"] != "key");
    broken["paths"]["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] =
        json!({"$ref": "#/components/schemas/Nope"});
    let problems = structure_problems(&broken);
    assert!(
        problems.iter().any(|p| p.contains("{key} is not declared")) && problems.iter().any(|p| p.contains("Nope")),
        "{problems:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_have_their_status_headers_and_codes_in_the_document() {
    let s = start().await;
    let doc = s.document().await;
    let mut answers = Vec::new();
    let cmd = "/v1/aggregates/counter/c-1/commands";
    let add = r#"{"type":"Add","n":5}"#;
    let placed = s.call("POST", cmd, &[("Idempotency-Key", "k-1")], Some(add)).await;
    assert_eq!(placed.status, StatusCode::OK, "{}", placed.body);
    let pos = placed.body["position"].as_str().unwrap().to_owned();
    answers.push(placed);
    for (headers, body, status) in [
        (vec![("If-Match", "\"7\"")], add, 412),
        (vec![], r#"{"type":"Add","n":500}"#, 422),
        (vec![], "not json", 400),
        (vec![], r#"{"type":"Nope"}"#, 400),
        (vec![("If-Match", "seven")], add, 400),
        (vec![("X-Session-Position", "garbage")], add, 400),
    ] {
        let a = s.call("POST", cmd, &headers, Some(body)).await;
        assert_eq!(a.status.as_u16(), status, "{}", a.body);
        answers.push(a);
    }
    let big = format!(r#"{{"type":"Add","n":1,"pad":"{}"}}"#, "x".repeat(2000));
    answers.push(s.call("POST", cmd, &[], Some(&big)).await);
    answers.push(s.call("POST", "/v1/aggregates/nope/x/commands", &[], Some(add)).await);
    answers.push(s.get("/v1/aggregates/counter/c-1").await);
    answers.push(
        s.call("GET", "/v1/aggregates/counter/c-1", &[("If-None-Match", "\"1\"")], None)
            .await,
    );
    answers.push(s.get("/v1/aggregates/counter/none").await);
    answers.push(s.get("/v1/aggregates/counter/c-1/events?from_version=1").await);
    answers.push(s.get("/v1/aggregates/counter/c-1/events?from_version=x").await);
    let encoded: String = pos
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    answers.push(s.get(&format!("/v1/views/totals?min_position={encoded}")).await);
    answers.push(s.get(&format!("/v1/views/totals/c-1?min_position={encoded}")).await);
    for q in [
        "/v1/views/totals?total_gte=1&order=desc&limit=10",
        "/v1/views/totals/zzz",
        "/v1/views/totals?limit=0",
        "/v1/views/totals?nope=1",
        "/v1/views/totals?order=up",
        "/v1/views/totals?cursor=!!",
        "/v1/views/totals?total=x",
        "/v1/views/totals?total_prefix=1",
        "/v1/views/totals?total=1&total_gte=1",
        "/v1/views/totals?min_position=garbage",
        "/v1/views/totals/c-1?x=1",
        "/v1/views/nope",
        "/v1/views/nope/k",
        "/v1/process-managers/tally/zzz",
        "/v1/process-managers/nope/k",
        "/v1/cluster",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/aggregates",
        "/v1/views",
        "/v1/process-managers",
        "/console",
        "/console/console.js",
        "/console/console.css",
        "/console/icon.svg",
        "/console/nope.js",
        "/console/%FF",
        "/nope",
        // Path segments that are not UTF-8: JSON errors too.
        "/v1/aggregates/counter/%FF",
        "/v1/aggregates/counter/%FF/events",
        "/v1/views/%FF",
        "/v1/views/totals/%FF",
        "/v1/process-managers/tally/%FF",
    ] {
        answers.push(s.get(q).await);
    }
    let bad = s
        .call("POST", "/v1/aggregates/counter/%FF/commands", &[], Some(add))
        .await;
    assert_eq!(
        (bad.status, &bad.body["error"]),
        (StatusCode::BAD_REQUEST, &json!("invalid_path"))
    );
    answers.push(bad);
    // The console's revalidation: 304 with its headers.
    let page = s.get("/console").await;
    let etag = page.headers["etag"].to_str().unwrap().to_owned();
    let unchanged = s.call("GET", "/console", &[("If-None-Match", &etag)], None).await;
    assert_eq!(unchanged.status, StatusCode::NOT_MODIFIED);
    answers.push(unchanged);
    // The process manager reacts in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let pm = loop {
        let a = s.get("/v1/process-managers/tally/c-1").await;
        if a.status == StatusCode::OK || std::time::Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(pm.status, StatusCode::OK, "{}", pm.body);
    answers.push(pm);
    // The live stream: its headers only.
    let resp = s
        .client
        .get(format!("{}/v1/aggregates/counter/c-1/events", s.base))
        .header("Accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    answers.push(Answer {
        method: "GET",
        path: "/v1/aggregates/counter/c-1/events".into(),
        status: resp.status(),
        headers: resp.headers().clone(),
        body: Value::Null,
    });
    drop(resp);

    let statuses: BTreeSet<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(
        statuses,
        BTreeSet::from([200, 304, 400, 404, 412, 413, 422]),
        "the requests cover these statuses"
    );
    let problems: Vec<String> = answers.iter().filter_map(|a| check_answer(&doc, a).err()).collect();
    assert!(problems.is_empty(), "{problems:#?}");
    // The check can fail: an answer the document does not list is caught.
    let mut teapot = s.get("/healthz").await;
    teapot.status = StatusCode::IM_A_TEAPOT;
    assert!(check_answer(&doc, &teapot).is_err());
    let mut odd = s.get("/v1/views/nope").await;
    odd.body["error"] = json!("row_not_found");
    assert!(
        check_answer(&doc, &odd).is_err(),
        "unknown_view's 404 lists no row_not_found"
    );
}
