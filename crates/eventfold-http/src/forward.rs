//! Forwarding a request to the instance that owns its partition (DESIGN §6 "Routing"): one
//! hop, marked with [`FORWARDED_BY`], with the owner's answer streamed back (so an SSE
//! follow keeps flowing through the instance that received it).

use crate::connector::Connector;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

/// Header marking a forwarded request (value: the forwarding instance id): a request
/// carrying it is never forwarded again (one hop).
pub const FORWARDED_BY: &str = "ef-forwarded-by";

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), and are
/// therefore never passed on by a proxy.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Forwards requests to other instances of the cluster.
#[derive(Debug, Clone)]
pub struct Forwarder {
    client: Client<Connector, Body>,
    instance_id: String,
    /// Bound on reaching the owner and getting its response headers.
    timeout: Duration,
}

impl Forwarder {
    /// A forwarder for this instance (`instance_id` goes into [`FORWARDED_BY`]). `timeout`
    /// bounds connecting to the owner and waiting for its response headers; the body is
    /// not bounded (an SSE follow may stream for as long as the client listens).
    pub fn new(instance_id: &str, timeout: Duration) -> Self {
        Self::with_tls(instance_id, timeout, None)
    }

    /// As [`new`](Self::new), verifying an owner that serves HTTPS with `tls` (see
    /// [`client_config`](crate::tls::client_config); `None`: the system's CAs).
    pub fn with_tls(instance_id: &str, timeout: Duration, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        let tls = match tls {
            Some(tls) => tls,
            None => Arc::new(crate::tls::client_config(Vec::new()).expect("no extra CA: nothing to refuse")),
        };
        let client = Client::builder(TokioExecutor::new()).build(Connector::new(tls, timeout));
        Self {
            client,
            instance_id: instance_id.to_owned(),
            timeout,
        }
    }

    /// Whether `headers` show the request was already forwarded once.
    pub fn already_forwarded(headers: &HeaderMap) -> bool {
        headers.contains_key(FORWARDED_BY)
    }

    /// Sends the request (method, path and query, headers minus hop-by-hop ones and `Host`,
    /// body streamed; so `Authorization` too: the owner authenticates the caller's own
    /// token, and a forwarded request has the caller's role, never more) to `base_url` (e.g. `http://10.0.0.2:8080`) with [`FORWARDED_BY`] set,
    /// and returns the owner's response: status, headers (minus hop-by-hop ones) and body
    /// streamed back. If the owner cannot be reached: 503 with `Retry-After: 1` and
    /// `{"error":"owner_unavailable","message":...}` naming the owner and the reason.
    pub async fn forward(&self, base_url: &str, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let url = format!("{}{path}", base_url.trim_end_matches('/'));
        let mut headers = strip_hop_by_hop(&parts.headers);
        headers.remove(header::HOST);
        // An instance id that is no valid header value still marks the hop.
        let marker = HeaderValue::from_str(&self.instance_id).unwrap_or(HeaderValue::from_static("unnamed"));
        headers.insert(HeaderName::from_static(FORWARDED_BY), marker);
        let mut request = match build_request(parts.method.clone(), &url, body) {
            Ok(r) => r,
            Err(e) => return unavailable(base_url, &self.instance_id, &error_chain(&*e)),
        };
        *request.headers_mut() = headers;
        let sent = tokio::time::timeout(self.timeout, self.client.request(request)).await;
        let response = match sent {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return unavailable(base_url, &self.instance_id, &error_chain(&e)),
            Err(_) => {
                return unavailable(
                    base_url,
                    &self.instance_id,
                    &format!("no response within {:?}", self.timeout),
                );
            }
        };
        tracing::debug!(method = %parts.method, %url, status = %response.status(), "forwarded a request to its owner");
        let mut out = Response::builder().status(response.status());
        if let Some(h) = out.headers_mut() {
            *h = strip_hop_by_hop(response.headers());
        }
        let body = response.into_body().map_err(|e| {
            tracing::warn!(reason = %error_chain(&e), "the owner's response broke off while being forwarded");
            e
        });
        out.body(Body::new(body)).unwrap_or_else(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "bad_gateway",
                format!("cannot pass on the response of the owner at {base_url}: {e}"),
            )
            .into_response()
        })
    }
}

/// Header of one part of a scatter-gather query: the partitions the receiving instance
/// answers for (comma-separated). It answers with the scan position of every row, so the
/// instance that scattered the query can merge the parts in index order.
pub const SHARD_PARTITIONS: &str = "ef-partitions";

/// What another instance answered to one part of a scattered query.
#[derive(Debug)]
pub struct ShardAnswer {
    /// Its status.
    pub status: StatusCode,
    /// Its `Retry-After`, if any.
    pub retry_after: Option<HeaderValue>,
    /// Its body.
    pub body: axum::body::Bytes,
}

impl Forwarder {
    /// Sends `GET {base_url}{path_and_query}` marked as forwarded and as one part of a
    /// scattered query for `partitions`, with the caller's own `authorization` (so the
    /// other instance checks the caller's token and role, never more), and reads the whole
    /// answer; the whole exchange is bounded by the forward timeout plus `extra` (a query
    /// may wait for a position). Reaching the instance failing: the 503
    /// `owner_unavailable` response to give.
    pub async fn shard(
        &self,
        base_url: &str,
        path_and_query: &str,
        partitions: &[u32],
        extra: Duration,
        authorization: Option<&HeaderValue>,
    ) -> Result<ShardAnswer, Response> {
        let url = format!("{}{path_and_query}", base_url.trim_end_matches('/'));
        let list: Vec<String> = partitions.iter().map(u32::to_string).collect();
        let exchange = async {
            let mut request = build_request(Method::GET, &url, Body::empty())?;
            let headers = request.headers_mut();
            headers.insert(FORWARDED_BY, HeaderValue::from_str(&self.instance_id)?);
            headers.insert(SHARD_PARTITIONS, HeaderValue::from_str(&list.join(","))?);
            if let Some(credentials) = authorization {
                headers.insert(header::AUTHORIZATION, credentials.clone());
            }
            let response = self.client.request(request).await?;
            let status = response.status();
            let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, retry_after, body))
        };
        match tokio::time::timeout(self.timeout + extra, exchange).await {
            Ok(Ok((status, retry_after, body))) => Ok(ShardAnswer {
                status: StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
                retry_after,
                body,
            }),
            Ok(Err(e)) => Err(unavailable(base_url, &self.instance_id, &error_chain(&*e))),
            Err(_) => Err(unavailable(
                base_url,
                &self.instance_id,
                &format!("no answer within {:?}", self.timeout + extra),
            )),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request to `url` (the owner's base URL and the path: refused if it is no URI).
fn build_request(method: Method, url: &str, body: Body) -> Result<hyper::Request<Body>, BoxError> {
    let uri: Uri = url.parse()?;
    Ok(hyper::Request::builder().method(method).uri(uri).body(body)?)
}

/// `headers` without the hop-by-hop ones (those listed in `Connection` too).
fn strip_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let listed: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if !HOP_BY_HOP.contains(&n) && !listed.iter().any(|l| l == n) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// An error with its causes, e.g. `error sending request: connection refused`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// 503 `owner_unavailable`, `Retry-After: 1`.
fn unavailable(base_url: &str, instance_id: &str, reason: &str) -> Response {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "owner_unavailable",
        format!("instance {instance_id} cannot forward the request to the owner at {base_url}: {reason}"),
    );
    e.retry_after = Some(Duration::from_secs(1));
    e.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, X-Secret"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.append("x-multi", HeaderValue::from_static("1"));
        h.append("x-multi", HeaderValue::from_static("2"));
        let out = strip_hop_by_hop(&h);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-multi"]);
        assert_eq!(out.get_all("x-multi").iter().count(), 2);
    }

    #[test]
    fn already_forwarded_looks_for_the_marker() {
        let mut h = HeaderMap::new();
        assert!(!Forwarder::already_forwarded(&h));
        h.insert(FORWARDED_BY, HeaderValue::from_static("a"));
        assert!(Forwarder::already_forwarded(&h));
    }
}
