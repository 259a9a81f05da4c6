//! Publish to a topic with `POST /topics/{name}` and follow it as server-sent events.
//!
//! # Routes
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /topics` | JSON list of the node's topics: name, class, policy, subscribers |
//! | `POST /topics/{name}` | publishes the body: `202` JSON `{id, topic, class, sequence, bytes}` |
//! | `GET /topics/{name}/events` | `200 text/event-stream`: every message of the topic, from peers and from this node |
//!
//! Each message is one event: `id:` its artifact id (64 hex digits), `event: message`, and `data:`
//! one line of JSON `{id, topic, origin, from, sequence, payload, text}`: `payload` is the body in
//! standard base64 (with padding), `text` the body as a string when it is UTF-8 (`null`
//! otherwise). When the node drops the subscriber, the last event is `event: end` with `data:
//! {"reason": "lagged"}` or `{"reason": "shutdown"}`, and the stream ends. A comment line is sent
//! every [`KEEP_ALIVE`] so proxies and clients see the stream is alive.
//!
//! Refusals are JSON: `400 invalid_topic`, `404 unknown_topic`, `413 too_large` (with
//! `max_bytes`), `503 too_many_subscribers` (with `Retry-After`), `503 shutting_down`, `503
//! publish_refused` (gossip refused it, for example its pool is full), and the body limits of
//! `PUT /objects` (`408 body_timeout`, `503 busy` when the body budget is used up).
//!
//! A stream holds one connection but no request slot (the cap of concurrent requests counts a
//! request until its response starts), and the header timeout does not run while a response
//! is being sent, so streams live as long as their clients read them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use data_encoding::BASE64;
use serde_json::json;

use super::errors::{error, KeyPath};
use super::serve::ConnectionCut;
use super::{hex, BodyBudget, BodyRefused};
use crate::net::topics::{SubscriptionItem, TopicEvent, Topics, TopicsError};

/// How often an idle event stream sends a comment line.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The topic routes over `topics`.
pub(super) fn routes(topics: Topics) -> Router {
    Router::new()
        .route("/topics", get(list))
        .route("/topics/{name}", post(publish))
        .route("/topics/{name}/events", get(events))
        .with_state(topics)
}

impl IntoResponse for TopicsError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match self {
            Self::InvalidName(_) => {
                error(StatusCode::BAD_REQUEST, "invalid_topic", message, json!({}))
            }
            Self::UnknownTopic(_) => {
                error(StatusCode::NOT_FOUND, "unknown_topic", message, json!({}))
            }
            Self::TooLarge { max, .. } => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                message,
                json!({ "max_bytes": max }),
            ),
            Self::SubscriberLimit { .. } => {
                let mut response = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too_many_subscribers",
                    message,
                    json!({}),
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(1));
                response
            }
            Self::Closed => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                message,
                json!({}),
            ),
            Self::Gossip(_) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "publish_refused",
                message,
                json!({}),
            ),
            _ => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                message,
                json!({}),
            ),
        }
    }
}

async fn list(State(topics): State<Topics>) -> Json<serde_json::Value> {
    let list: Vec<_> = topics
        .topics()
        .values()
        .map(|topic| {
            let policy = topic.policy;
            json!({
                "name": topic.name.as_str(),
                "class": topic.class.0,
                "relay": match policy.relay {
                    meshwire_gossip::proto::Relay::All => "all",
                    meshwire_gossip::proto::Relay::Origin => "origin",
                },
                "max_bytes": policy.max_bytes,
                "push_whole_max_bytes": policy.push_whole_max_bytes,
                "latency_sensitive": policy.latency_sensitive,
                "expiry_ms": policy.expiry.as_millis() as u64,
                "subscribers": topics.subscriber_count(topic.name.as_str()),
            })
        })
        .collect();
    Json(json!(list))
}

async fn publish(
    State(topics): State<Topics>,
    KeyPath(name): KeyPath,
    axum::Extension(budget): axum::Extension<BodyBudget>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, TopicsError> {
    let topic = topics.topic(&name)?;
    let (content, _reserved) = match budget
        .read(
            super::declared_length(&headers),
            body,
            topic.policy.max_bytes,
        )
        .await
    {
        Ok(read) => read,
        Err(BodyRefused::TooLarge { len }) => {
            return Err(topics.check_size(topic, len).unwrap_err())
        }
        Err(BodyRefused::Answer(response)) => return Ok(response),
    };
    let bytes = content.len();
    let published = topics.publish(&name, content)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "id": hex(&published.id.0),
            "topic": name,
            "class": published.class.0,
            "sequence": published.sequence,
            "bytes": bytes,
        })),
    )
        .into_response())
}

async fn events(
    State(topics): State<Topics>,
    KeyPath(name): KeyPath,
    cut: Option<axum::Extension<ConnectionCut>>,
) -> Result<Response, TopicsError> {
    let subscription = topics.subscribe(&name, cut.map(|axum::Extension(cut)| cut.0))?;
    let stream = futures_util::stream::unfold(subscription, |mut subscription| async move {
        let item = subscription.next().await?;
        Some((Ok::<Event, Infallible>(render(&item)), subscription))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

/// One subscription item as a server-sent event.
fn render(item: &SubscriptionItem) -> Event {
    match item {
        SubscriptionItem::Event(event) => {
            let id = hex(&event.id.0);
            Event::default()
                .id(id.clone())
                .event("message")
                .data(event_json(&id, event).to_string())
        }
        SubscriptionItem::Ended(reason) => Event::default()
            .event("end")
            .data(json!({ "reason": reason.name() }).to_string()),
    }
}

fn event_json(id: &str, event: &Arc<TopicEvent>) -> serde_json::Value {
    json!({
        "id": id,
        "topic": event.topic.as_str(),
        "origin": event.origin.to_string(),
        "from": event.from.to_string(),
        "sequence": event.sequence,
        "payload": BASE64.encode(&event.body),
        "text": std::str::from_utf8(&event.body).ok(),
    })
}
