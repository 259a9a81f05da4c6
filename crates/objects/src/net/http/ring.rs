//! Send batches round the node's ring pipeline with `POST /pipeline/batches`.
//!
//! # Routes
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /pipeline` | JSON: the ring, this node's position, batches in flight, completed and failed, the latest ring ping |
//! | `POST /pipeline/batches` | first node only: sends the body round the ring in chunks and answers when it is back: `200` JSON `{batch_id, bytes, chunks, intact, elapsed_ms}` |
//!
//! Refusals are JSON: `409 not_first` (only the ring's first node submits), `413 too_large` (with
//! `max_bytes`), `504 pipeline_timeout` (the batch did not come back within the deadline), `502
//! pipeline_failed` (a node on the way failed it), `503 shutting_down`, and the body limits of
//! `PUT /objects` (`408 body_timeout`, `503 busy`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use meshwire::pipeline::PipelineError;
use serde_json::json;

use super::errors::error;
use super::{BodyBudget, BodyRefused};
use crate::net::ring::{Ring, RingError};

/// The pipeline routes over `ring`.
pub(super) fn routes(ring: Ring) -> Router {
    Router::new()
        .route("/pipeline", get(status))
        .route("/pipeline/batches", post(submit))
        .with_state(ring)
}

impl IntoResponse for RingError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let (status, code, extra) = match self {
            Self::TooLarge { max, .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                json!({ "max_bytes": max }),
            ),
            Self::Pipeline(PipelineError::NotFirst) => {
                (StatusCode::CONFLICT, "not_first", json!({}))
            }
            Self::Pipeline(PipelineError::Timeout(_)) => {
                (StatusCode::GATEWAY_TIMEOUT, "pipeline_timeout", json!({}))
            }
            Self::Pipeline(PipelineError::Closed) => {
                (StatusCode::SERVICE_UNAVAILABLE, "shutting_down", json!({}))
            }
            Self::Pipeline(_) => (StatusCode::BAD_GATEWAY, "pipeline_failed", json!({})),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                json!({}),
            ),
        };
        error(status, code, message, extra)
    }
}

async fn status(State(ring): State<Ring>) -> Json<serde_json::Value> {
    let status = ring.status();
    Json(json!({
        "ring": ring.config().ring.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "position": status.position,
        "first": status.position == 0,
        "in_flight": status.in_flight,
        "completed": status.completed,
        "failed": status.failed,
        "last_ring_ping_ms": status.last_ring_ping.map(|ping| ping.as_secs_f64() * 1000.0),
    }))
}

async fn submit(
    State(ring): State<Ring>,
    axum::Extension(budget): axum::Extension<BodyBudget>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, RingError> {
    if !ring.is_first() {
        return Err(RingError::Pipeline(PipelineError::NotFirst));
    }
    let max = ring.config().max_batch_bytes;
    let (data, _reserved) = match budget
        .read(super::declared_length(&headers), body, max)
        .await
    {
        Ok(read) => read,
        Err(BodyRefused::TooLarge { len }) => return Err(RingError::TooLarge { bytes: len, max }),
        Err(BodyRefused::Answer(response)) => return Ok(response),
    };
    let run = ring.run(data).await?;
    Ok(Json(json!({
        "batch_id": run.batch_id,
        "bytes": run.bytes,
        "chunks": run.chunks,
        "intact": run.intact,
        "elapsed_ms": run.elapsed.as_secs_f64() * 1000.0,
    }))
    .into_response())
}
