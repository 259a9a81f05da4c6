//! Make requests: one fresh stream per request, the whole exchange under one deadline.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use meshwire_proto::wire::{
    self, EncodedMessage, ErrorCode, Kind, MsgHeader, ProtocolId, WireError,
};
use meshwire_proto::PeerId;
use quinn::{Connection, ConnectionError, ReadError, RecvStream, SendStream, WriteError};
use tokio::time::Instant;

use super::{Inner, Node};
use crate::framing::{read_end_if_arrived, read_frame, wire_error_label, ReadFrameError};

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
    /// The peer has no handler for the protocol (the peer's words).
    #[error("the peer refused the request: {0}")]
    Refused(String),
    /// The request exceeds this node's frame limits; nothing was sent.
    #[error("request too large: {0}")]
    TooLarge(WireError),
    /// The request or its response exceeds the peer's limits (the peer's words).
    #[error("too large for the peer: {0}")]
    RemoteTooLarge(String),
    /// The peer's handler returned an error (its text).
    #[error("the peer's handler failed: {0}")]
    Remote(String),
    /// The connection broke before the request stream opened.
    #[error("peer gone: {0}")]
    ConnectionLost(ConnectionError),
    /// Writing the request failed.
    #[error("peer gone while sending the request: {0}")]
    WriteFailed(WriteError),
    /// Reading the response failed.
    #[error("peer gone while reading the response: {0}")]
    ReadFailed(ReadError),
    /// The peer finished the stream without a response.
    #[error("peer gone: the stream ended without a response")]
    NoResponse,
    /// The response does not decode; the connection was closed.
    #[error("malformed response: {0}")]
    Malformed(WireError),
    /// The response was addressed to another node; the connection was closed.
    #[error("malformed response: addressed to another node")]
    WrongDestination,
    /// The response is not a response to this request; the connection was closed.
    #[error("malformed response: unexpected kind or message id")]
    UnexpectedResponse,
    /// The peer found the request malformed (the peer's words).
    #[error("the peer found the request malformed: {0}")]
    RemoteMalformed(String),
    /// The peer had no room for the request and did not read it (its request budget was full):
    /// sending it again later may succeed (the peer's words).
    #[error("the peer was busy: {0}")]
    Busy(String),
    /// The body source of a streamed request failed or broke its announced length; the stream
    /// was reset (see [`Node::request_streamed`]).
    #[error("the request body could not be produced: {0}")]
    Source(String),
}

impl RequestError {
    fn label(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "not_connected",
            Self::Timeout(_) => "timeout",
            Self::Refused(_) => "refused",
            Self::TooLarge(_) | Self::RemoteTooLarge(_) => "too_large",
            Self::Remote(_) => "remote_error",
            Self::Busy(_) => "busy",
            Self::Source(_) => "source",
            Self::ConnectionLost(_)
            | Self::WriteFailed(_)
            | Self::ReadFailed(_)
            | Self::NoResponse => "peer_gone",
            Self::Malformed(_)
            | Self::WrongDestination
            | Self::UnexpectedResponse
            | Self::RemoteMalformed(_) => "protocol_error",
        }
    }
}

impl Node {
    /// Sends `body` to `peer` on `protocol` and waits for the response. `deadline` covers the whole
    /// exchange; on expiry the streams are abandoned and the peer told to stop.
    pub async fn request(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RequestError> {
        self.request_parts(peer, protocol, Bytes::new(), body, deadline)
            .await
    }

    /// [`Node::request`] with the payload in two pieces, `head` then `body`, written one after the
    /// other without joining them: a large `body` (an object's content after its header) is sent
    /// from its own buffer, never copied into a new one.
    pub async fn request_parts(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        head: Bytes,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RequestError> {
        let exchange = self
            .inner
            .clone()
            .request_once(peer, protocol, [head, body]);
        self.inner.timed_request(deadline, exchange).await
    }
}

impl Inner {
    /// Runs a request's `exchange` under `deadline` and counts its outcome and duration.
    pub(super) async fn timed_request<T>(
        &self,
        deadline: Duration,
        exchange: impl std::future::Future<Output = Result<T, RequestError>>,
    ) -> Result<T, RequestError> {
        let started = Instant::now();
        let result = match tokio::time::timeout(deadline, exchange).await {
            Ok(result) => result,
            Err(_) => Err(RequestError::Timeout(deadline)),
        };
        match &result {
            Ok(_) => {
                self.metrics.request_outcome("ok");
                self.metrics
                    .request_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(error) => self.metrics.request_outcome(error.label()),
        }
        result
    }
}

/// A request's stream, opened: the connection, the message id and the stream's two halves, and
/// the bytes that precede the payload.
pub(super) struct OpenedRequest {
    pub stream: (Connection, u64, SendStream, RecvStream),
    pub head: [Bytes; 2],
}

impl Inner {
    async fn request_once(
        self: Arc<Self>,
        peer: PeerId,
        protocol: ProtocolId,
        payload: [Bytes; 2],
    ) -> Result<Bytes, RequestError> {
        let payload_len: usize = payload.iter().map(Bytes::len).sum();
        let opened = self.open_request(peer, protocol, payload_len).await?;
        let (connection, message_id, mut send, recv) = opened.stream;
        // Empty pieces are left out: a write of nothing but empty chunks could wait on flow
        // control for nothing.
        let mut chunks: Vec<Bytes> = opened
            .head
            .into_iter()
            .chain(payload)
            .filter(|chunk| !chunk.is_empty())
            .collect();
        // A responder that refuses a request from its header (one over its frame limit) stops
        // reading it and still answers: after a stopped write, that answer is read.
        let stopped = match send.write_all_chunks(&mut chunks).await {
            Ok(()) => {
                let _ = send.finish();
                None
            }
            Err(error @ WriteError::Stopped(_)) => Some(error),
            Err(error) => return Err(RequestError::WriteFailed(error)),
        };
        self.read_response(&connection, peer, recv, (message_id, payload_len), stopped)
            .await
    }

    /// Opens the stream of a request on `protocol` to `peer` with a payload of `payload_len`
    /// bytes, and encodes what precedes the payload (frame and message header, destination).
    pub(super) async fn open_request(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        payload_len: usize,
    ) -> Result<OpenedRequest, RequestError> {
        let (connection, dst) = self.current(peer).ok_or(RequestError::NotConnected(peer))?;
        let message_id = self.next_id();
        let header = MsgHeader {
            kind: Kind::Request,
            flags: 0,
            protocol,
            message_id,
        };
        let head = EncodedMessage::encode_head(&header, payload_len, &self.config.limits)
            .map_err(RequestError::TooLarge)?;
        let (send, recv) = connection
            .open_bi()
            .await
            .map_err(RequestError::ConnectionLost)?;
        Ok(OpenedRequest {
            stream: (connection, message_id, send, recv),
            head: [head, dst.bytes()],
        })
    }

    /// Counts a request of `payload_len` bytes sent and reads the answer to it (`message_id`)
    /// from `recv`; `stopped` is the write error of a request the responder stopped reading (its
    /// answer says why, if it sent one).
    pub(super) async fn read_response(
        &self,
        connection: &Connection,
        peer: PeerId,
        mut recv: RecvStream,
        (message_id, payload_len): (u64, usize),
        stopped: Option<WriteError>,
    ) -> Result<Bytes, RequestError> {
        let counters = self.metrics.peer_counters(&peer);
        self.metrics
            .count_sent(&counters, (wire::FRAME_OVERHEAD + payload_len) as u64);
        let frame = match read_frame(&mut recv, &self.config.limits).await {
            Ok(Some(frame)) => {
                read_end_if_arrived(&mut recv);
                frame
            }
            Ok(None) | Err(ReadFrameError::Stream(_)) if stopped.is_some() => {
                return Err(RequestError::WriteFailed(stopped.expect("checked above")));
            }
            Ok(None) => return Err(RequestError::NoResponse),
            Err(ReadFrameError::Stream(error)) => return Err(RequestError::ReadFailed(error)),
            Err(ReadFrameError::Wire(error)) => {
                self.protocol_violation(connection, peer, wire_error_label(&error));
                return Err(RequestError::Malformed(error));
            }
        };
        self.metrics.observe_rtt(&peer, connection.rtt());
        self.metrics.count_received(
            &counters,
            (frame.payload.len() + wire::FRAME_OVERHEAD) as u64,
        );
        if frame.dst != self.local_id {
            self.protocol_violation(connection, peer, "wrong_destination");
            return Err(RequestError::WrongDestination);
        }
        match frame.header.kind {
            Kind::Response if frame.header.message_id == message_id => Ok(frame.payload),
            Kind::ErrorResponse => Err(self.error_answer(connection, peer, &frame.payload)),
            _ => {
                self.protocol_violation(connection, peer, "unexpected_kind");
                Err(RequestError::UnexpectedResponse)
            }
        }
    }

    /// The error an error response's `payload` reports; one that does not decode closes the
    /// connection.
    pub(super) fn error_answer(
        &self,
        connection: &Connection,
        peer: PeerId,
        payload: &[u8],
    ) -> RequestError {
        match wire::decode_error_payload(payload) {
            Ok((ErrorCode::Handler, reason)) => RequestError::Remote(reason),
            Ok((ErrorCode::NoHandler, reason)) => RequestError::Refused(reason),
            Ok((ErrorCode::TooLarge, reason)) => RequestError::RemoteTooLarge(reason),
            Ok((ErrorCode::Malformed, reason)) => RequestError::RemoteMalformed(reason),
            Ok((ErrorCode::Busy, reason)) => RequestError::Busy(reason),
            Err(error) => {
                self.protocol_violation(connection, peer, wire_error_label(&error));
                RequestError::Malformed(error)
            }
        }
    }
}
