//! Serve a node's objects, status and metrics over HTTP (axum).
//!
//! # Routes
//!
//! | route | answer |
//! | --- | --- |
//! | `PUT /objects/{key}` | `201` JSON `{key, version, hash, etag, acks, replicas}` once W replicas hold it; with `If-Match: "<etag>"` or `If-None-Match: *`, only if the current copy matches (`412`, `409` otherwise) |
//! | `GET /objects/{key}` | `200`, the content (streamed in 64 KiB chunks), quorum read; `?local=true` or header `x-meshwire-read: local` reads this node's store only |
//! | `GET /status` | JSON: peer id, peers with RTTs and queue depths, store size |
//! | `GET /peers` | JSON list of peers |
//! | `GET /metrics` | Prometheus text |
//!
//! Errors are JSON `{"error": code, "message": text, ...}` with these statuses: `400 invalid_key`,
//! `400 invalid_precondition`, `412 precondition_failed` (with `current_etag`), `409 conflict`,
//! `413 too_large` (with `max_bytes`), `404 not_found`, `404 no_route`, `503 quorum_not_reached`
//! (with `needed`, `reached`, `asked`; a write adds `superseded` and `outcome: "unknown"`),
//! `502 content_unavailable`, `500 store_error`, `500 clock_exhausted`.
//! Connections are HTTP/1.1 keep-alive.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::service::{ObjectService, ObjectServiceError};
use super::store::StoredObject;
use crate::proto::cas::{etag, parse_precondition};

/// Size of the chunks a response body is streamed in.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// The header that switches a read to local-only when its value is `local`.
pub const READ_MODE_HEADER: &str = "x-meshwire-read";

/// The API's router over `service`.
pub fn router(service: ObjectService) -> Router {
    Router::new()
        .route("/objects/{key}", get(get_object).put(put_object))
        .route("/status", get(status))
        .route("/peers", get(peers))
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .with_state(service)
}

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: ObjectService,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(service))
        .with_graceful_shutdown(shutdown)
        .await
}

fn error(status: StatusCode, code: &str, message: String, extra: serde_json::Value) -> Response {
    let mut body = json!({ "error": code, "message": message });
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    (status, Json(body)).into_response()
}

impl IntoResponse for ObjectServiceError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match self {
            Self::InvalidKey(_) => {
                error(StatusCode::BAD_REQUEST, "invalid_key", message, json!({}))
            }
            Self::TooLarge { max, .. } => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                message,
                json!({ "max_bytes": max }),
            ),
            Self::NotFound => error(StatusCode::NOT_FOUND, "not_found", message, json!({})),
            Self::QuorumNotReached {
                needed,
                reached,
                asked,
            } => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "quorum_not_reached",
                message,
                json!({ "needed": needed, "reached": reached, "asked": asked }),
            ),
            Self::WriteUnconfirmed {
                needed,
                acks,
                asked,
                superseded,
            } => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "quorum_not_reached",
                message,
                json!({ "needed": needed, "reached": acks, "asked": asked,
                        "superseded": superseded, "outcome": "unknown" }),
            ),
            Self::InvalidPrecondition(_) => error(
                StatusCode::BAD_REQUEST,
                "invalid_precondition",
                message,
                json!({}),
            ),
            Self::PreconditionFailed { current } => error(
                StatusCode::PRECONDITION_FAILED,
                "precondition_failed",
                message,
                json!({ "current_etag": current.as_ref().map(etag) }),
            ),
            Self::Conflict { needed, prepared } => error(
                StatusCode::CONFLICT,
                "conflict",
                message,
                json!({ "needed": needed, "prepared": prepared }),
            ),
            Self::NotApplied {
                needed,
                prepared,
                asked,
            } => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "quorum_not_reached",
                message,
                json!({ "needed": needed, "reached": prepared, "asked": asked,
                        "outcome": "not_applied" }),
            ),
            Self::ContentUnavailable => error(
                StatusCode::BAD_GATEWAY,
                "content_unavailable",
                message,
                json!({}),
            ),
            Self::Clock(_) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "clock_exhausted",
                message,
                json!({}),
            ),
            Self::Store(_) | Self::Config(_) | Self::Subscribe(_) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store_error",
                message,
                json!({}),
            ),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Deserialize)]
struct ReadQuery {
    local: Option<bool>,
}

#[derive(Debug, Serialize)]
struct Written {
    key: String,
    version: u64,
    hash: String,
    etag: String,
    acks: usize,
    replicas: usize,
}

async fn put_object(
    State(service): State<ObjectService>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ObjectServiceError> {
    crate::proto::object::validate_key(&key).map_err(ObjectServiceError::InvalidKey)?;
    let max = service.config().max_object_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(len) = declared.filter(|len| *len > max) {
        return Err(ObjectServiceError::TooLarge { len, max });
    }
    // Without a Content-Length the body is read up to the limit; past it, the request is refused.
    let content = axum::body::to_bytes(body, max)
        .await
        .map_err(|_| ObjectServiceError::TooLarge { len: max + 1, max })?;
    let precondition = parse_precondition(
        headers.get(header::IF_MATCH).map(HeaderValue::as_bytes),
        headers
            .get(header::IF_NONE_MATCH)
            .map(HeaderValue::as_bytes),
    )?;
    let outcome = match precondition {
        Some(precondition) => service.put_if(&key, content, precondition).await?,
        None => service.put(&key, content).await?,
    };
    Ok((
        StatusCode::CREATED,
        Json(Written {
            key,
            version: outcome.stamp.version,
            hash: hex(&outcome.stamp.hash),
            etag: etag(&outcome.stamp),
            acks: outcome.acks,
            replicas: outcome.replicas,
        }),
    )
        .into_response())
}

async fn get_object(
    State(service): State<ObjectService>,
    Path(key): Path<String>,
    Query(query): Query<ReadQuery>,
    headers: HeaderMap,
) -> Result<Response, ObjectServiceError> {
    let local = query.local.unwrap_or(false)
        || headers
            .get(READ_MODE_HEADER)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"local"));
    if local {
        let object = service.get_local(&key)?;
        return Ok(object_response(object, None));
    }
    crate::proto::object::validate_key(&key).map_err(ObjectServiceError::InvalidKey)?;
    let read = service.get(&key).await?;
    Ok(object_response(read.object, Some(read.answers)))
}

fn object_response(object: StoredObject, answers: Option<usize>) -> Response {
    let len = object.content.len();
    let content = object.content;
    // Slices share the stored buffer: many readers of one large object hold one copy.
    let chunks = (0..len).step_by(CHUNK_BYTES).map(move |start| {
        Ok::<Bytes, Infallible>(content.slice(start..(start + CHUNK_BYTES).min(len)))
    });
    let mut response = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(etag) = HeaderValue::from_str(&etag(&object.stamp)) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(
        "x-meshwire-version",
        HeaderValue::from(object.stamp.version),
    );
    if let Some(answers) = answers {
        headers.insert("x-meshwire-answers", HeaderValue::from(answers));
    }
    response
}

#[derive(Debug, Serialize)]
struct PeerJson {
    peer: String,
    connected: bool,
    address: Option<String>,
    rtt_ms: Option<f64>,
    queued_messages: usize,
    queued_bytes: usize,
    latency_estimate_ms: f64,
    error_rate: f64,
}

fn peer_list(service: &ObjectService) -> Vec<PeerJson> {
    service
        .node()
        .peers()
        .into_iter()
        .map(|status| {
            let (latency, _, error_rate) = service.peer_score(status.peer);
            PeerJson {
                peer: status.peer.to_string(),
                connected: status.connected,
                address: status.address.map(|a| a.to_string()),
                rtt_ms: status.rtt.map(|rtt| rtt.as_secs_f64() * 1e3),
                queued_messages: status.queued_messages,
                queued_bytes: status.queued_bytes,
                latency_estimate_ms: latency.as_secs_f64() * 1e3,
                error_rate,
            }
        })
        .collect()
}

async fn peers(State(service): State<ObjectService>) -> Json<Vec<PeerJson>> {
    Json(peer_list(&service))
}

async fn status(
    State(service): State<ObjectService>,
) -> Result<Json<serde_json::Value>, ObjectServiceError> {
    let size = service.store().size()?;
    let config = service.config();
    Ok(Json(json!({
        "peer_id": service.node().peer_id().to_string(),
        "address": service.node().local_addr().ok().map(|a| a.to_string()),
        "peers": peer_list(&service),
        "store": size,
        "replication": config.replication,
        "write_quorum": config.write_quorum,
        "read_quorum": config.read_quorum,
        "read_policy": config.read_policy.name(),
        "members": service.members().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "max_clock_skew_ms": config.max_clock_skew.as_millis() as u64,
    })))
}

async fn metrics(State(service): State<ObjectService>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        service.node().metrics().encode_text(),
    )
        .into_response()
}

async fn no_route() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no_route",
        "no such route (see GET/PUT /objects/{key}, /status, /peers, /metrics)".into(),
        json!({}),
    )
}
