//! Answer every HTTP error as JSON `{"error": code, "message": text, ...}`, including the ones
//! axum produces before a handler runs (rejections, unknown methods).

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::limits::HttpLimits;
use super::serve::HttpMetrics;
use crate::net::service::ObjectServiceError;

/// Longest message taken over from a non-JSON error body.
const MAX_MESSAGE_BYTES: usize = 1024;

/// A JSON error answer: `{"error": code, "message": message}` plus the fields of `extra`.
pub(crate) fn error(
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: serde_json::Value,
) -> Response {
    let mut body = json!({ "error": code, "message": message });
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    let mut response = (status, Json(body)).into_response();
    response.extensions_mut().insert(ErrorName(code));
    response
}

/// The code of a JSON error answer, for the count of error answers ([`json_errors`]).
#[derive(Debug, Clone)]
pub(crate) struct ErrorName(pub &'static str);

/// The JSON body of `503 busy`.
pub(crate) fn busy_json(retry_after: u64) -> serde_json::Value {
    json!({
        "error": "busy",
        "message": format!(
            "the node is at its connection or request limit; retry after {retry_after} s"
        ),
        "retry_after_secs": retry_after,
    })
}

/// `503 busy` with `Retry-After`: the node is at one of its connection or request caps.
pub(crate) fn busy(limits: &HttpLimits) -> Response {
    let retry_after = limits.retry_after_secs();
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(busy_json(retry_after)),
    )
        .into_response();
    response.extensions_mut().insert(ErrorName("busy"));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
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
            }
            | Self::Superseded {
                needed,
                acks,
                asked,
                superseded,
            } => {
                let (status, code, outcome) = match self {
                    Self::Superseded { .. } => (StatusCode::CONFLICT, "superseded", "superseded"),
                    _ => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "quorum_not_reached",
                        "unknown",
                    ),
                };
                error(
                    status,
                    code,
                    message,
                    json!({ "needed": needed, "reached": acks, "asked": asked,
                            "superseded": superseded, "outcome": outcome }),
                )
            }
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
                json!({ "current_etag": current.as_ref().map(super::etag) }),
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
            Self::Store(_) | Self::Config(_) | Self::Subscribe(_) | Self::ObjectLimit { .. } => {
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "store_error",
                    message,
                    json!({}),
                )
            }
        }
    }
}

/// The `{key}` of a route, as UTF-8 text; anything else is `400 invalid_path` in JSON.
#[derive(Debug)]
pub(crate) struct KeyPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(key)) => Ok(Self(key)),
            Err(rejection) => Err(error(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                rejection.body_text(),
                json!({}),
            )),
        }
    }
}

/// Turns an error answer that is not JSON (axum's rejections, `405`) into the JSON form, keeping
/// its status and headers (`Allow` on a `405`) and its text as the message, and counts every
/// error answer by status and code in `meshwire_http_errors_total`.
pub(crate) async fn json_errors(
    State(metrics): State<HttpMetrics>,
    response: Response,
) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if let Some(&ErrorName(code)) = response.extensions().get::<ErrorName>() {
        metrics.count_error(status.as_u16(), code);
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if is_json {
        // A JSON error made without `error` (none today): counted under its status alone.
        metrics.count_error(status.as_u16(), "unnamed");
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, MAX_MESSAGE_BYTES).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_lowercase(),
    };
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::NOT_FOUND => "no_route",
        status if status.is_server_error() => "internal_error",
        _ => "bad_request",
    };
    metrics.count_error(status.as_u16(), code);
    let body = error(status, code, text, json!({})).into_body();
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, body)
}
