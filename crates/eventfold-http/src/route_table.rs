//! The API's routes as data, apart from `routes` (which serves them) and `openapi` (which
//! documents them) so that both read the one table and neither imports the other.

use crate::auth::{Access, Role};

/// One route: its method, its path and what it asks of the caller when the service has
/// tokens (`--auth-tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// `GET` or `POST` (every `GET` also answers `HEAD`).
    pub method: &'static str,
    /// The path template, e.g. `/v1/aggregates/{type}/{id}`.
    pub path: &'static str,
    /// The role the caller's token needs, or open.
    pub access: Access,
}

const fn route(method: &'static str, path: &'static str, access: Access) -> Route {
    Route { method, path, access }
}

const READ: Access = Access::Role(Role::Read);
const WRITE: Access = Access::Role(Role::Write);
const ADMIN: Access = Access::Role(Role::Admin);

/// Every route of the API. The router (`routes::router`, whose `handler` gives each entry
/// its handler and whose guard checks its access) is built from this table alone and the
/// OpenAPI document (`GET /openapi.json`) from it too, so a route cannot exist without
/// being documented nor without a role; `tests/openapi.rs` checks the document against
/// the running router and the sources. Reads need `read`, commands `write`, the cluster's
/// internals (instances' addresses, owners, lag) `admin`; probes and the console's
/// static files are open.
pub const ROUTES: &[Route] = &[
    route("POST", "/v1/aggregates/{type}/{id}/commands", WRITE),
    route("GET", "/v1/aggregates/{type}/{id}", READ),
    route("GET", "/v1/aggregates/{type}/{id}/events", READ),
    route("GET", "/v1/aggregates", READ),
    route("GET", "/v1/views", READ),
    route("GET", "/v1/views/{view}", READ),
    route("GET", "/v1/views/{view}/{key}", READ),
    route("GET", "/v1/process-managers", READ),
    route("GET", "/v1/process-managers/{name}/{key}", READ),
    route("GET", "/v1/cluster", ADMIN),
    route("GET", "/healthz", Access::Open),
    route("GET", "/readyz", Access::Open),
    route("GET", "/metrics", Access::Metrics),
    route("GET", "/openapi.json", READ),
    // The console's page and assets hold no data: the page asks for a token and sends it
    // with each API request, which the routes above check.
    route("GET", "/console", Access::Open),
    route("GET", "/console/{asset}", Access::Open),
];
