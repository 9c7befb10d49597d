//! The API's routes as data, apart from `routes` (which serves them) and `openapi` (which
//! documents them) so that both read the one table and neither imports the other.

/// Every route of the API as (method, path). The router (`routes::router`, whose `handler`
/// gives each entry its handler) is built from this table alone and the OpenAPI document
/// (`GET /openapi.json`) from it too, so a route cannot exist without being documented;
/// `tests/openapi.rs` checks the document against the running router and the sources.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/aggregates/{type}/{id}/commands"),
    ("GET", "/v1/aggregates/{type}/{id}"),
    ("GET", "/v1/aggregates/{type}/{id}/events"),
    ("GET", "/v1/views/{view}"),
    ("GET", "/v1/views/{view}/{key}"),
    ("GET", "/v1/process-managers/{name}/{key}"),
    ("GET", "/v1/cluster"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];
