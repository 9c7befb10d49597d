//! The web console (`GET /console`, its assets under `/console/{asset}`): plain HTML, CSS
//! and JavaScript compiled into the binary, so it needs no CDN nor network at run time.
//!
//! The assets hold no data and are served without a token; the page asks for one, keeps it
//! in `sessionStorage` and sends it as `Authorization: Bearer` on every API request (a
//! page navigation or an `EventSource` cannot carry that header), so the console is behind
//! the same roles as the API. A strict Content-Security-Policy (only this origin, no inline
//! script or style) keeps a row's text from ever running as code.

use crate::app::ApiPath;
use crate::error::ApiError;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

/// The policy every console answer carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Assets change only with the binary: the browser revalidates (`ETag`) instead of
/// serving a console older than the service.
const CACHE_CONTROL: &str = "no-cache";

/// One embedded file: its name under `/console/`, its media type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_bytes!("../console/index.html"),
};

const ASSETS: &[Asset] = &[
    INDEX,
    Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/console.js"),
    },
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../console/console.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../console/icon.svg"),
    },
];

/// `GET /console`: the page.
pub(crate) async fn page(headers: HeaderMap) -> Response {
    serve(&INDEX, &headers)
}

/// `GET /console/{asset}`: a script, style sheet or icon of the page; 404 `not_found` for
/// a name the console does not have (400 `invalid_path` for one that is not UTF-8).
pub(crate) async fn asset(ApiPath(name): ApiPath<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => Ok(serve(a, &headers)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the console has no asset `{name}`"),
        )),
    }
}

/// The strong validator of `a`, computed once per asset.
fn etag(a: &Asset) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.body);
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    });
    let i = ASSETS
        .iter()
        .position(|x| x.name == a.name)
        .expect("a is one of ASSETS");
    &tags[i]
}

fn serve(a: &Asset, headers: &HeaderMap) -> Response {
    let tag = etag(a);
    let common = [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static(CACHE_CONTROL)),
        (header::ETAG, HeaderValue::from_static(tag)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    if unchanged {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static(a.content_type))];
    (StatusCode::OK, common, content_type, a.body).into_response()
}
