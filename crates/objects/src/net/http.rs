//! Serve a node's objects, status and metrics over HTTP (axum on hyper), under limits and a token.
//!
//! # Routes
//!
//! | route | answer |
//! | --- | --- |
//! | `PUT /objects/{key}` | `201` JSON `{key, version, hash, etag, acks, replicas}` once W replicas hold it; with `If-Match: "<etag>"` or `If-None-Match: *`, only if the current copy matches (`412`, `409` otherwise) |
//! | `GET /objects/{key}` | `200`, the content (streamed in 64 KiB chunks, or 256 KiB chunks read from this node's content file), quorum read; `?local=true` or header `x-meshwire-read: local` reads this node's store only |
//! | `GET /status` | JSON: peer id, peers (connected, configured, RTT, queue depth), store size, quorum settings, members |
//! | `GET /peers` | JSON list of peers |
//! | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics 1.0 when `Accept` prefers `application/openmetrics-text` |
//! | `GET /dashboard` | the live dashboard, one static HTML page; served without the token (it holds no data) and reads it from `#token=` in its URL |
//! | `GET /dashboard/data` | JSON `{now_unix_seconds, status, metrics}`: the `/status` body and every sample of the `/metrics` registry as `{name, labels, value}`, what the dashboard and `meshwire status` poll |
//! | `GET /topics`, `POST /topics/{name}`, `GET /topics/{name}/events` | publish/subscribe, when the daemon runs topics: see [`topics`] |
//! | `GET /pipeline`, `POST /pipeline/batches` | the batch pipeline round a ring, when the daemon runs one: see [`ring`] |
//!
//! Errors are JSON `{"error": code, "message": text, ...}` with these statuses: `400 invalid_key`,
//! `400 invalid_path` (a key that is not UTF-8), `400 bad_request` (other malformed requests),
//! `400 invalid_precondition`, `400 invalid_topic`, `401 unauthorized`, `404 not_found`, `404 unknown_topic`, `404 no_route`, `405
//! method_not_allowed`, `408 body_timeout`, `409 conflict`, `412 precondition_failed` (with
//! `current_etag`), `413 too_large` (with `max_bytes`), `503 quorum_not_reached` (with `needed`,
//! `reached`, `asked`; a write adds `superseded` and `outcome: "unknown"`), `503 busy` (with
//! `Retry-After`), `503 too_many_subscribers`, `503 shutting_down`, `503 publish_refused`, `409 not_first`, `502 pipeline_failed`, `504 pipeline_timeout`, `502 content_unavailable`, `500 store_error`, `500 clock_exhausted`. A request hyper cannot parse at all (a malformed request line, raw
//! non-UTF-8 bytes in the path rather than `%FF`, headers over its buffer, a URI over its length)
//! gets `400 bad_request`, `431 headers_too_large` or `414 uri_too_long`, and the connection
//! closes (see `parse_errors`).
//!
//! Connections are HTTP/1.1 keep-alive, accepted under the caps of [`limits`] and, when required,
//! the token of [`auth`].

pub mod auth;
pub mod dashboard;
pub mod errors;
pub mod limits;
mod parse_errors;
pub mod ring;
pub mod serve;
pub mod topics;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::auth::Gate;
use self::errors::{error, KeyPath};
use self::limits::HttpLimits;
use super::ring::Ring;
use super::service::{ObjectService, ObjectServiceError, ReadBody, WriteOutcome, PIECE_BYTES};
use super::store::{Body as StoreBody, StoreError};
use super::topics::Topics;
use crate::proto::cas::{etag, parse_precondition, Precondition};
use crate::proto::object::Stamp;
use futures_util::StreamExt as _;

/// Size of the chunks a response body is streamed in.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// Size of the chunks a response body is read from a content file in, each on the blocking pool:
/// 16 GETs of 8 MiB objects from their files, one after another, moved 330 MiB/s with 64 KiB
/// chunks and 375 MiB/s with these (450 MiB/s reading each object whole, which a slow reader
/// then held whole).
pub const FILE_CHUNK_BYTES: usize = 256 * 1024;

/// The header that switches a read to local-only when its value is `local`.
pub const READ_MODE_HEADER: &str = "x-meshwire-read";

/// Why [`BodyBudget::read`] read no body.
enum BodyRefused {
    /// Longer than the route's limit (`len`: the declared length, or the limit + 1).
    TooLarge { len: usize },
    /// The answer already made: `503 busy` (budget) or `408 body_timeout`.
    Answer(Response),
}

/// Bytes of request bodies that may be held at once, in KiB permits.
#[derive(Debug, Clone)]
struct BodyBudget {
    kib: Arc<Semaphore>,
    limits: Arc<HttpLimits>,
    metrics: serve::HttpMetrics,
}

impl BodyBudget {
    /// Reserves `bytes` of body until the permit drops; `None` (counted as `body_budget`) when
    /// they do not fit.
    fn reserve(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let reserved = u32::try_from(bytes.div_ceil(1024).max(1))
            .ok()
            .and_then(|kib| self.kib.clone().try_acquire_many_owned(kib).ok());
        if reserved.is_none() {
            self.metrics.refuse("body_budget");
        }
        reserved
    }

    /// Reads a request body of at most `max` bytes: a `declared` `Content-Length` over `max` is
    /// refused before anything is read; the body's bytes are reserved (until the returned permit
    /// drops) before it is read; a body without a `Content-Length` is read up to `max`, and past
    /// it refused.
    async fn read(
        &self,
        declared: Option<usize>,
        body: Body,
        max: usize,
    ) -> Result<(Bytes, OwnedSemaphorePermit), BodyRefused> {
        if let Some(len) = declared.filter(|len| *len > max) {
            return Err(BodyRefused::TooLarge { len });
        }
        let reserved = self
            .reserve(declared.unwrap_or(max))
            .ok_or_else(|| BodyRefused::Answer(self.busy()))?;
        match axum::body::to_bytes(body, max).await {
            Ok(content) => Ok((content, reserved)),
            Err(failure) if limits::over_length_limit(&failure) => {
                Err(BodyRefused::TooLarge { len: max + 1 })
            }
            Err(failure) => Err(BodyRefused::Answer(body_failure(&failure, max))),
        }
    }

    /// The `503 busy` of a body that did not fit.
    fn busy(&self) -> Response {
        errors::busy(&self.limits)
    }
}

/// The API's routes over `service` (and `topics`, when the node runs them), without limits or
/// authentication.
fn routes(service: ObjectService, topics: Option<Topics>, ring: Option<Ring>) -> Router {
    let router = Router::new()
        .route("/objects/{key}", get(get_object).put(put_object))
        .route("/status", get(status))
        .route("/peers", get(peers))
        .route("/metrics", get(metrics))
        .route(dashboard::PAGE_PATH, get(dashboard::page))
        .route("/dashboard/data", get(dashboard::data))
        .fallback(no_route)
        .with_state(service);
    let router = match topics {
        Some(topics) => router.merge(self::topics::routes(topics)),
        None => router,
    };
    match ring {
        Some(ring) => router.merge(self::ring::routes(ring)),
        None => router,
    }
}

/// The routes behind the request cap and the token check, with every error in JSON.
pub(crate) fn router(
    service: ObjectService,
    topics: Option<Topics>,
    ring: Option<Ring>,
    gate: Gate,
    limits: &HttpLimits,
) -> Router {
    let requests = Arc::new(Semaphore::new(limits.max_concurrent_requests));
    let busy = Arc::new(limits.clone());
    let counted = gate.clone();
    let budget = BodyBudget {
        kib: Arc::new(Semaphore::new(
            limits.max_body_bytes_in_flight.div_ceil(1024),
        )),
        limits: busy.clone(),
        metrics: gate.metrics().clone(),
    };
    routes(service, topics, ring)
        .layer(axum::Extension(budget))
        .layer(middleware::from_fn(move |request, next| {
            request_slot(
                requests.clone(),
                busy.clone(),
                counted.clone(),
                request,
                next,
            )
        }))
        .layer(middleware::from_fn_with_state(gate.clone(), auth::check))
        .layer(middleware::map_response_with_state(
            gate.metrics().clone(),
            errors::json_errors,
        ))
}

/// Holds one of the concurrent-request slots while the request runs; none left: `503 busy`.
async fn request_slot(
    requests: Arc<Semaphore>,
    limits: Arc<HttpLimits>,
    gate: Gate,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let Ok(_slot) = requests.try_acquire_owned() else {
        gate.metrics().refuse("request_limit");
        return errors::busy(&limits);
    };
    next.run(request).await
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
    KeyPath(key): KeyPath,
    axum::Extension(budget): axum::Extension<BodyBudget>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ObjectServiceError> {
    crate::proto::object::validate_key(&key).map_err(ObjectServiceError::InvalidKey)?;
    let max = service.config().max_object_bytes;
    let precondition = parse_precondition(
        headers.get(header::IF_MATCH).map(HeaderValue::as_bytes),
        headers
            .get(header::IF_NONE_MATCH)
            .map(HeaderValue::as_bytes),
    )?;
    // A body large enough for a content file (or of unknown length) goes to one piece by piece,
    // and from there to the replicas, never held whole (a conditional one too: its replicas
    // check the precondition before they take the content).
    let declared = declared_length(&headers);
    let streamed = service
        .streamed_min_bytes()
        .is_some_and(|min| declared.is_none_or(|len| len >= min));
    if streamed {
        return put_streamed(&service, key, precondition, &budget, declared, body).await;
    }
    // The body's bytes stay reserved until the write is done.
    let (content, _reserved) = match budget.read(declared, body, max).await {
        Ok(read) => read,
        Err(BodyRefused::TooLarge { len }) => {
            return Err(ObjectServiceError::TooLarge { len, max })
        }
        Err(BodyRefused::Answer(response)) => return Ok(response),
    };
    let outcome = match precondition {
        Some(precondition) => service.put_if(&key, content, precondition).await?,
        None => service.put(&key, content).await?,
    };
    Ok(written(key, outcome))
}

/// A PUT's body written to a content file as it arrives, then to the replicas from there. It
/// holds one piece ([`PIECE_BYTES`]) of the body budget while it runs.
async fn put_streamed(
    service: &ObjectService,
    key: String,
    precondition: Option<Precondition>,
    budget: &BodyBudget,
    declared: Option<usize>,
    body: Body,
) -> Result<Response, ObjectServiceError> {
    let max = service.config().max_object_bytes;
    if let Some(len) = declared.filter(|len| *len > max) {
        return Err(ObjectServiceError::TooLarge { len, max });
    }
    let Some(_reserved) = budget.reserve(PIECE_BYTES) else {
        return Ok(budget.busy());
    };
    let mut writer = service.object_writer().await?.ok_or(StoreError::Stopped)?;
    let mut data = body.into_data_stream();
    while let Some(piece) = data.next().await {
        match piece {
            Ok(piece) => writer.write(piece).await?,
            Err(failure) => return Ok(body_failure(&failure, max)),
        }
    }
    let content = writer.finish().await?;
    let outcome = match precondition {
        Some(precondition) => service.put_written_if(&key, content, precondition).await?,
        None => service.put_written(&key, content).await?,
    };
    Ok(written(key, outcome))
}

/// A request's declared `Content-Length`, if it has a valid one.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// The `201` of a write.
fn written(key: String, outcome: WriteOutcome) -> Response {
    (
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
        .into_response()
}

async fn get_object(
    State(service): State<ObjectService>,
    KeyPath(key): KeyPath,
    Query(query): Query<ReadQuery>,
    headers: HeaderMap,
) -> Result<Response, ObjectServiceError> {
    let local = query.local.unwrap_or(false)
        || headers
            .get(READ_MODE_HEADER)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"local"));
    if local {
        let (stamp, body) = service.get_local_body(&key).await?;
        return Ok(object_response(&service, stamp, body.into(), None));
    }
    crate::proto::object::validate_key(&key).map_err(ObjectServiceError::InvalidKey)?;
    let read = service.get_body(&key, true).await?;
    Ok(object_response(
        &service,
        read.stamp,
        read.body,
        Some(read.answers),
    ))
}

/// A `200` streaming `body`: slices of [`CHUNK_BYTES`] of a held buffer (many readers of one
/// cached object share one copy), a content file read [`FILE_CHUNK_BYTES`] at a time on the
/// blocking pool, or another replica's copy as it arrives, so a slow client holds a chunk, not
/// the object. A content file found damaged while it streams (checked against its hash as it is
/// read), or a replica's copy that stops arriving or does not match its hash, ends the body
/// with an error: the client's connection is cut short of the `Content-Length`, never handed a
/// silently wrong end.
fn object_response(
    service: &ObjectService,
    stamp: Stamp,
    body: ReadBody,
    answers: Option<usize>,
) -> Response {
    type Cut = Box<dyn std::error::Error + Send + Sync>;
    let len = body.len();
    let stream = match body {
        ReadBody::Local(StoreBody::Held(content)) => {
            let len = content.len();
            let chunks = (0..len).step_by(CHUNK_BYTES).map(move |start| {
                Ok::<Bytes, Cut>(content.slice(start..(start + CHUNK_BYTES).min(len)))
            });
            futures_util::stream::iter(chunks).boxed()
        }
        ReadBody::Local(StoreBody::File(reader)) => {
            let service = service.clone();
            futures_util::stream::try_unfold(reader, move |reader| {
                let service = service.clone();
                async move {
                    let next = service.next_chunk(reader, FILE_CHUNK_BYTES).await;
                    if let Err(error) = &next {
                        tracing::error!(%error, "cut a GET response short");
                    }
                    next.map_err(Cut::from)
                }
            })
            .boxed()
        }
        ReadBody::Remote(content) => {
            futures_util::stream::try_unfold(content, |mut content| async move {
                let next = content.next_piece().await;
                if let Err(error) = &next {
                    tracing::warn!(%error, "cut a GET response short");
                }
                Ok::<_, Cut>(next?.map(|piece| (piece, content)))
            })
            .boxed()
        }
    };
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(etag) = HeaderValue::from_str(&etag(&stamp)) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert("x-meshwire-version", HeaderValue::from(stamp.version));
    if let Some(answers) = answers {
        headers.insert("x-meshwire-answers", HeaderValue::from(answers));
    }
    response
}

#[derive(Debug, Serialize)]
struct PeerJson {
    peer: String,
    connected: bool,
    configured: bool,
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
                configured: status.configured,
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
    Ok(Json(status_json(&service).await?))
}

/// The body of `GET /status` (also part of `GET /dashboard/data`).
async fn status_json(service: &ObjectService) -> Result<serde_json::Value, ObjectServiceError> {
    let size = service.on_store(|store| store.size()).await??;
    let config = service.config();
    Ok(json!({
        "peer_id": service.node().peer_id().to_string(),
        "address": service.node().local_addr().ok().map(|a| a.to_string()),
        "peers": peer_list(service),
        "store": size,
        "replication": config.replication,
        "write_quorum": config.write_quorum,
        "read_quorum": config.read_quorum,
        "read_policy": config.read_policy.name(),
        "members": service.members().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "max_clock_skew_ms": config.max_clock_skew.as_millis() as u64,
    }))
}

/// The media type of Prometheus text format 0.0.4.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The media type of OpenMetrics 1.0 text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(State(service): State<ObjectService>, headers: HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let registry = service.node().metrics();
    if prefers_openmetrics(accept) {
        (
            [(header::CONTENT_TYPE, OPENMETRICS_TEXT)],
            registry.encode_text(),
        )
            .into_response()
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            registry.encode_prometheus_text(),
        )
            .into_response()
    }
}

pub use crate::proto::headers::prefers_openmetrics;

/// The answer to a PUT whose body could not be read: cut off by a body timeout (`408`), over the
/// size limit (`413`), or broken off or badly framed (`400 bad_body`: a bad chunk, a connection
/// that ended mid-body).
fn body_failure(failure: &axum::Error, max: usize) -> Response {
    if let Some(timeout) = limits::body_timeout(failure) {
        let mut response = error(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            timeout.to_string(),
            json!({ "reason": timeout.reason() }),
        );
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    } else if limits::over_length_limit(failure) {
        ObjectServiceError::TooLarge { len: max + 1, max }.into_response()
    } else {
        error(
            StatusCode::BAD_REQUEST,
            "bad_body",
            format!("the request body could not be read: {failure}"),
            json!({}),
        )
    }
}

async fn no_route() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no_route",
        "no such route (see GET/PUT /objects/{key}, /status, /peers, /metrics, /dashboard, /topics, /pipeline)".into(),
        json!({}),
    )
}
