//! Make requests under one deadline and serve them with per-protocol handlers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use meshwire_proto::wire::{
    self, Destination, EncodedMessage, ErrorCode, Kind, Limits, MsgHeader, ProtocolId, WireError,
};
use meshwire_proto::PeerId;
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::time::Instant;

use super::{read, write, Inner, Node};
use crate::framing::{read_frame, wire_error_label, ReadFrameError};

/// Stream reset code: the request took too long to arrive.
const RESET_REQUEST_TIMEOUT: u32 = 1;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No connection to the peer.
    #[error("not connected to {0}")]
    NotConnected(PeerId),
    /// The whole exchange did not finish within the deadline; the streams were abandoned.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// The peer has no handler for the protocol.
    #[error("the peer refused the request: {0}")]
    Refused(String),
    /// The request or its response exceeds a frame limit (local or remote).
    #[error("too large: {0}")]
    TooLarge(String),
    /// The peer's handler returned an error.
    #[error("the peer's handler failed: {0}")]
    Remote(String),
    /// The connection or stream broke before the response arrived.
    #[error("peer gone: {0}")]
    PeerGone(String),
    /// The response was malformed; the connection was closed.
    #[error("malformed response: {0}")]
    Protocol(String),
}

impl RequestError {
    fn label(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "not_connected",
            Self::Timeout(_) => "timeout",
            Self::Refused(_) => "refused",
            Self::TooLarge(_) => "too_large",
            Self::Remote(_) => "remote_error",
            Self::PeerGone(_) => "peer_gone",
            Self::Protocol(_) => "protocol_error",
        }
    }
}

/// An error a request handler returns; its text reaches the caller as [`RequestError::Remote`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, HandlerError>> + Send>>;
pub(super) type Handler = Arc<dyn Fn(PeerId, Bytes) -> HandlerFuture + Send + Sync>;

impl Node {
    /// Serves requests on `protocol` with `handler`, replacing any earlier handler.
    pub fn handle<F, Fut>(&self, protocol: ProtocolId, handler: F)
    where
        F: Fn(PeerId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, HandlerError>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |peer, body| Box::pin(handler(peer, body)));
        write(&self.inner.handlers).insert(protocol, handler);
    }

    /// Sends `body` to `peer` on `protocol` and waits for the response. `deadline` covers the whole
    /// exchange; on expiry the streams are abandoned and the peer told to stop.
    pub async fn request(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RequestError> {
        let started = Instant::now();
        let result = match tokio::time::timeout(
            deadline,
            self.inner.clone().request_once(peer, protocol, body),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(RequestError::Timeout(deadline)),
        };
        match &result {
            Ok(_) => {
                self.inner.metrics.request_outcome("ok");
                self.inner
                    .metrics
                    .request_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(error) => self.inner.metrics.request_outcome(error.label()),
        }
        result
    }
}

impl Inner {
    pub(super) async fn serve_request(
        self: Arc<Self>,
        connection: Connection,
        remote: PeerId,
        mut send: SendStream,
        mut recv: RecvStream,
    ) {
        let limits = self.config.limits;
        let arrival = tokio::time::timeout(
            self.config.inbound_request_timeout,
            read_frame(&mut recv, &limits),
        )
        .await;
        let frame = match arrival {
            Err(_) => {
                self.metrics.frame_error("request_timeout");
                let _ = send.reset(VarInt::from_u32(RESET_REQUEST_TIMEOUT));
                return;
            }
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => {
                self.protocol_violation(&connection, remote, "empty_request");
                return;
            }
            Ok(Err(ReadFrameError::Stream(_))) => return,
            Ok(Err(ReadFrameError::Wire(error @ WireError::PayloadTooLarge { .. }))) => {
                self.metrics.frame_error("too_large");
                let _ = recv.stop(VarInt::from_u32(0));
                let reply = wire::encode_error_payload(ErrorCode::TooLarge, &error.to_string());
                self.respond(
                    &mut send,
                    remote,
                    Kind::ErrorResponse,
                    ProtocolId(0),
                    0,
                    reply,
                    &limits,
                )
                .await;
                return;
            }
            Ok(Err(ReadFrameError::Wire(error))) => {
                self.protocol_violation(&connection, remote, wire_error_label(&error));
                return;
            }
        };
        if !self.accept_frame(&connection, remote, &frame, Kind::Request) {
            return;
        }
        let protocol = frame.header.protocol;
        let handler = read(&self.handlers).get(&protocol).cloned();
        let (kind, body) = match handler {
            None => (
                Kind::ErrorResponse,
                wire::encode_error_payload(
                    ErrorCode::NoHandler,
                    &format!("no handler for protocol {}", protocol.0),
                ),
            ),
            Some(handler) => match handler(remote, frame.payload).await {
                Ok(body) if body.len() as u64 > u64::from(limits.max_payload_bytes) => (
                    Kind::ErrorResponse,
                    wire::encode_error_payload(
                        ErrorCode::TooLarge,
                        &format!("response of {} bytes exceeds the limit", body.len()),
                    ),
                ),
                Ok(body) => (Kind::Response, body),
                Err(error) => (
                    Kind::ErrorResponse,
                    wire::encode_error_payload(ErrorCode::Handler, &error.0),
                ),
            },
        };
        self.respond(
            &mut send,
            remote,
            kind,
            protocol,
            frame.header.message_id,
            body,
            &limits,
        )
        .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn respond(
        &self,
        send: &mut SendStream,
        remote: PeerId,
        kind: Kind,
        protocol: ProtocolId,
        message_id: u64,
        body: Bytes,
        limits: &Limits,
    ) {
        let header = MsgHeader {
            kind,
            flags: 0,
            protocol,
            message_id,
        };
        let body = if kind == Kind::ErrorResponse {
            // An error reason is cut to fit the limit rather than lost.
            body.slice(..body.len().min(limits.max_payload_bytes as usize))
        } else {
            body
        };
        let Ok(message) = EncodedMessage::encode(&header, body, limits) else {
            return;
        };
        let dst = Destination::new(&remote);
        if send
            .write_all_chunks(&mut message.chunks_for(&dst))
            .await
            .is_ok()
        {
            self.metrics.frames_sent.inc();
            self.metrics.bytes_sent.inc_by(message.frame_len() as u64);
        }
        let _ = send.finish();
    }

    async fn request_once(
        self: Arc<Self>,
        peer: PeerId,
        protocol: ProtocolId,
        body: Bytes,
    ) -> Result<Bytes, RequestError> {
        let (connection, dst) = self.current(peer).ok_or(RequestError::NotConnected(peer))?;
        let message_id = self.next_id();
        let header = MsgHeader {
            kind: Kind::Request,
            flags: 0,
            protocol,
            message_id,
        };
        let message = EncodedMessage::encode(&header, body, &self.config.limits)
            .map_err(|error| RequestError::TooLarge(error.to_string()))?;
        let gone = |error: &dyn std::fmt::Display| RequestError::PeerGone(error.to_string());
        let (mut send, mut recv) = connection.open_bi().await.map_err(|e| gone(&e))?;
        send.write_all_chunks(&mut message.chunks_for(&dst))
            .await
            .map_err(|e| gone(&e))?;
        let _ = send.finish();
        self.metrics.frames_sent.inc();
        self.metrics.bytes_sent.inc_by(message.frame_len() as u64);
        let frame = match read_frame(&mut recv, &self.config.limits).await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                return Err(RequestError::PeerGone(
                    "stream ended without a response".to_string(),
                ))
            }
            Err(ReadFrameError::Stream(error)) => return Err(gone(&error)),
            Err(ReadFrameError::Wire(error)) => {
                self.protocol_violation(&connection, peer, wire_error_label(&error));
                return Err(RequestError::Protocol(error.to_string()));
            }
        };
        self.metrics.observe_rtt(&peer, connection.rtt());
        self.metrics.frames_received.inc();
        self.metrics
            .bytes_received
            .inc_by((frame.payload.len() + wire::FRAME_OVERHEAD) as u64);
        if frame.dst != self.local_id {
            self.protocol_violation(&connection, peer, "wrong_destination");
            return Err(RequestError::Protocol(
                "response to another node".to_string(),
            ));
        }
        match frame.header.kind {
            Kind::Response if frame.header.message_id == message_id => Ok(frame.payload),
            Kind::ErrorResponse => match wire::decode_error_payload(&frame.payload) {
                Ok((ErrorCode::Handler, reason)) => Err(RequestError::Remote(reason)),
                Ok((ErrorCode::NoHandler, reason)) => Err(RequestError::Refused(reason)),
                Ok((ErrorCode::TooLarge, reason)) => Err(RequestError::TooLarge(reason)),
                Ok((ErrorCode::Malformed, reason)) => Err(RequestError::Protocol(reason)),
                Err(error) => {
                    self.protocol_violation(&connection, peer, wire_error_label(&error));
                    Err(RequestError::Protocol(error.to_string()))
                }
            },
            _ => {
                self.protocol_violation(&connection, peer, "unexpected_kind");
                Err(RequestError::Protocol("unexpected response".to_string()))
            }
        }
    }
}
