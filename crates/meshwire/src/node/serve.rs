//! Serve requests with one handler per protocol, each answer on the request's own stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use meshwire_proto::wire::{
    self, Destination, EncodedMessage, ErrorCode, Kind, Limits, MsgHeader, ProtocolId, WireError,
};
use meshwire_proto::PeerId;
use quinn::{Connection, RecvStream, SendStream, VarInt};

use super::registry::Attachment;
use super::streamed::{AnswerBody, RequestBody, STREAMED_PIECE_BYTES};
use super::{Inner, Node, SubscribeError};
use crate::framing::{
    read_bytes, read_end_if_arrived, read_frame_body, read_frame_header, wire_error_label,
    ReadFrameError,
};

/// Stream reset code: the request took too long to arrive.
const RESET_REQUEST_TIMEOUT: u32 = 1;

/// How long the answer to a malformed request may take to be acknowledged before the
/// connection closes anyway.
const MALFORMED_ANSWER_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// A boxed error a service's handler fails with.
pub type ServiceError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request handler could not answer; its text reaches the caller as
/// [`crate::RequestError::Remote`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// The service behind the handler has stopped.
    #[error("the service has stopped")]
    Stopped,
    /// The request does not decode: the peer broke the protocol. The caller gets this error's
    /// text as the answer, then the node closes the connection with
    /// [`crate::CLOSE_PROTOCOL_VIOLATION`] (reason `malformed_request`, counted in
    /// `meshwire_frame_errors_total`). A request that is well formed but refused is
    /// [`HandlerError::Failed`] or an answer of the service's own, and keeps the connection.
    #[error("malformed request: {0}")]
    Malformed(#[source] ServiceError),
    /// The service failed to serve the request.
    #[error(transparent)]
    Failed(ServiceError),
}

impl HandlerError {
    /// A request refused because of `error`: [`HandlerError::Malformed`] (the connection closes)
    /// when the peer broke the protocol, else [`HandlerError::Failed`].
    pub fn refused(
        breaks_protocol: bool,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        if breaks_protocol {
            Self::Malformed(Box::new(error))
        } else {
            Self::Failed(Box::new(error))
        }
    }

    /// The error for a request body that could not be read: one whose frame announces fewer
    /// bytes than its own fields need is malformed (the peer broke the protocol). A stream that
    /// ended early, failed or timed out is not: a sender that gives up on a request (its deadline
    /// passed, its own client went away) ends the stream short, so that fails the request and
    /// keeps the connection.
    pub fn from_body(error: super::streamed::BodyError) -> Self {
        let short = matches!(error, super::streamed::BodyError::TooShort { .. });
        Self::refused(short, error)
    }
}

/// An answer in two pieces, written one after the other (see [`Node::handle_parts`]).
type HandlerFuture =
    Pin<Box<dyn Future<Output = Result<(Bytes, AnswerBody), HandlerError>> + Send>>;
/// A handler given each request's payload whole.
pub(super) type WholeHandler = Arc<dyn Fn(PeerId, Bytes) -> HandlerFuture + Send + Sync>;
/// A handler that reads each request's payload as it arrives ([`Node::handle_streamed`]).
pub(super) type StreamedHandler = Arc<dyn Fn(PeerId, RequestBody) -> HandlerFuture + Send + Sync>;

/// What serves a protocol's requests.
#[derive(Clone)]
pub(super) enum Handler {
    Whole(WholeHandler),
    Streamed(StreamedHandler),
}

/// A request whose head was read: its payload read whole for a [`Handler::Whole`] (or no
/// handler), or left on the stream for a [`Handler::Streamed`]; or refused for want of room.
enum Arrival {
    Whole {
        frame: wire::Frame,
        handler: Option<Handler>,
        _budget: tokio::sync::OwnedSemaphorePermit,
    },
    Streamed {
        message: MsgHeader,
        dst: PeerId,
        handler: StreamedHandler,
        payload_len: usize,
        /// The payload's first bytes, read with its head (all of a small one).
        read: Bytes,
        budget: tokio::sync::OwnedSemaphorePermit,
    },
    Busy,
}

impl Attachment for Handler {
    fn is_attached(&self) -> bool {
        // A handler serves until it is removed with `Node::stop_handling`.
        true
    }
}

impl Node {
    /// Serves requests on `protocol` with `handler`. One handler per protocol: a second is refused
    /// until [`Node::stop_handling`] removes the first.
    pub fn handle<F, Fut>(&self, protocol: ProtocolId, handler: F) -> Result<(), SubscribeError>
    where
        F: Fn(PeerId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, HandlerError>> + Send + 'static,
    {
        self.handle_parts(protocol, move |peer, body| {
            let answer = handler(peer, body);
            async move { answer.await.map(|body| (Bytes::new(), body)) }
        })
    }

    /// [`Node::handle`] for a handler whose answer comes in two pieces, a head and a body, sent
    /// one after the other without joining them: a large body (an object's content after its
    /// header) is answered from its own buffer, never copied into a new one.
    pub fn handle_parts<F, Fut>(
        &self,
        protocol: ProtocolId,
        handler: F,
    ) -> Result<(), SubscribeError>
    where
        F: Fn(PeerId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(Bytes, Bytes), HandlerError>> + Send + 'static,
    {
        self.handle_streamed_answers(protocol, move |peer, body| {
            let answer = handler(peer, body);
            async move { answer.await.map(|(head, body)| (head, body.into())) }
        })
    }

    /// Stops serving requests on `protocol`; later requests are refused as having no handler.
    /// Returns whether a handler was removed.
    pub fn stop_handling(&self, protocol: ProtocolId) -> bool {
        self.inner.handlers.detach(protocol)
    }
}

impl Inner {
    /// Refuses a request whose body is left unread: asks the peer to stop sending it and
    /// answers with an error of `code`.
    async fn refuse_unread(
        &self,
        send: &mut SendStream,
        recv: &mut RecvStream,
        remote: PeerId,
        code: ErrorCode,
        text: &str,
    ) {
        let _ = recv.stop(VarInt::from_u32(0));
        let reply = wire::encode_error_payload(code, text);
        let limits = self.config.limits;
        self.respond(
            send,
            remote,
            Kind::ErrorResponse,
            ProtocolId(0),
            0,
            (Bytes::new(), reply.into()),
            &limits,
        )
        .await;
    }

    pub(super) async fn serve_request(
        self: Arc<Self>,
        connection: Connection,
        remote: PeerId,
        mut send: SendStream,
        mut recv: RecvStream,
    ) {
        let limits = self.config.limits;
        let started = tokio::time::Instant::now();
        let timeout = self.config.inbound_request_timeout;
        let arrival = tokio::time::timeout(timeout, async {
            let Some(header) = read_frame_header(&mut recv, &[], &limits).await? else {
                return Ok(None);
            };
            // Room in the node's request budget before any of the payload is read, so requests
            // from all streams cannot together hold more than the budget; held until answered.
            // A streamed request holds one piece at a time, so it reserves one piece. A request
            // that finds no room is refused at once: one waiting would leave its body in the
            // connection's receive window, where it could starve the requests that hold the room.
            let reserve = |room: u32| self.request_bytes.clone().try_acquire_many_owned(room);
            let small = header.body_len as usize <= wire::MIN_BODY_LEN + STREAMED_PIECE_BYTES;
            if small {
                // Within one piece, whatever the handler: read in one go, as it arrived.
                let Ok(budget) = reserve(header.body_len) else {
                    return Ok(Some(Arrival::Busy));
                };
                let frame = read_frame_body(&mut recv, &header).await?;
                return Ok(Some(match self.handlers.get(frame.header.protocol) {
                    Some(Handler::Streamed(handler)) => Arrival::Streamed {
                        message: frame.header,
                        dst: frame.dst,
                        handler,
                        payload_len: frame.payload.len(),
                        read: frame.payload,
                        budget,
                    },
                    handler => Arrival::Whole {
                        frame,
                        handler,
                        _budget: budget,
                    },
                }));
            }
            let head = read_bytes(&mut recv, wire::MIN_BODY_LEN).await?;
            let (message, dst) = wire::decode_message_head(&head)?;
            let payload_len = header.payload_len();
            let handler = self.handlers.get(message.protocol);
            let room = match handler {
                Some(Handler::Streamed(_)) => STREAMED_PIECE_BYTES as u32,
                _ => header.body_len,
            };
            let Ok(budget) = reserve(room) else {
                return Ok(Some(Arrival::Busy));
            };
            Ok(Some(match handler {
                Some(Handler::Streamed(handler)) => Arrival::Streamed {
                    message,
                    dst,
                    handler,
                    payload_len,
                    read: Bytes::new(),
                    budget,
                },
                handler => {
                    let payload = read_bytes(&mut recv, payload_len).await?;
                    Arrival::Whole {
                        frame: wire::Frame {
                            header: message,
                            dst,
                            payload,
                        },
                        handler,
                        _budget: budget,
                    }
                }
            }))
        })
        .await;
        let arrival = match arrival {
            Err(_) => {
                self.metrics.frame_error("request_timeout");
                let _ = send.reset(VarInt::from_u32(RESET_REQUEST_TIMEOUT));
                return;
            }
            Ok(Ok(Some(Arrival::Busy))) => {
                self.metrics.drop_message("request_budget");
                self.refuse_unread(
                    &mut send,
                    &mut recv,
                    remote,
                    ErrorCode::Busy,
                    "the inbound request budget is full, retry later",
                )
                .await;
                return;
            }
            Ok(Ok(Some(arrival))) => arrival,
            Ok(Ok(None)) => {
                self.protocol_violation(&connection, remote, "empty_request");
                return;
            }
            Ok(Err(ReadFrameError::Stream(_))) => return,
            Ok(Err(ReadFrameError::Wire(error @ WireError::PayloadTooLarge { .. }))) => {
                self.metrics.frame_error("too_large");
                self.refuse_unread(
                    &mut send,
                    &mut recv,
                    remote,
                    ErrorCode::TooLarge,
                    &error.to_string(),
                )
                .await;
                return;
            }
            Ok(Err(ReadFrameError::Wire(error))) => {
                self.protocol_violation(&connection, remote, wire_error_label(&error));
                return;
            }
        };
        let counters = self.metrics.peer_counters(&remote);
        let (message, answer) = match arrival {
            Arrival::Whole {
                frame,
                handler,
                _budget,
            } => {
                read_end_if_arrived(&mut recv);
                if !self.accept_frame(&connection, remote, &frame, Kind::Request, &counters) {
                    return;
                }
                let answer = match handler {
                    Some(Handler::Whole(handler)) => Some(handler(remote, frame.payload).await),
                    _ => None,
                };
                (frame.header, answer)
            }
            Arrival::Streamed {
                message,
                dst,
                handler,
                payload_len,
                read,
                budget,
            } => {
                let head = (&message, &dst, payload_len);
                if !self.accept_head(&connection, remote, head, Kind::Request, &counters) {
                    return;
                }
                let body = RequestBody::new(
                    (recv, read),
                    payload_len as u64,
                    started,
                    timeout,
                    Some(budget),
                );
                (message, Some(handler(remote, body).await))
            }
            Arrival::Busy => return,
        };
        let protocol = message.protocol;
        let error = |code, text: &str| {
            (
                Kind::ErrorResponse,
                (
                    Bytes::new(),
                    AnswerBody::from(wire::encode_error_payload(code, text)),
                ),
            )
        };
        let malformed = matches!(answer, Some(Err(HandlerError::Malformed(_))));
        if answer.is_none() {
            self.metrics.drop_message("no_handler");
        }
        let (kind, body) = match answer {
            None => error(
                ErrorCode::NoHandler,
                &format!("no handler for protocol {}", protocol.0),
            ),
            Some(Ok(parts)) => {
                let len = parts.0.len() as u64 + parts.1.len();
                if len > u64::from(limits.max_payload_bytes) {
                    error(
                        ErrorCode::TooLarge,
                        &format!("response of {len} bytes exceeds the limit"),
                    )
                } else {
                    (Kind::Response, parts)
                }
            }
            Some(Err(failure)) => error(ErrorCode::Handler, &failure.to_string()),
        };
        self.respond(
            &mut send,
            remote,
            kind,
            protocol,
            message.message_id,
            body,
            &limits,
        )
        .await;
        if malformed {
            // The reason first (bounded: a peer that never acknowledges it waits no longer),
            // then the connection: one that sent a malformed request is not trusted with more.
            let _ = tokio::time::timeout(MALFORMED_ANSWER_LINGER, send.stopped()).await;
            self.protocol_violation(&connection, remote, "malformed_request");
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn respond(
        &self,
        send: &mut SendStream,
        remote: PeerId,
        kind: Kind,
        protocol: ProtocolId,
        message_id: u64,
        (head, body): (Bytes, AnswerBody),
        limits: &Limits,
    ) {
        let header = MsgHeader {
            kind,
            flags: 0,
            protocol,
            message_id,
        };
        let (body, mut streamed) = match body {
            // An error reason is cut to fit the limit rather than lost.
            AnswerBody::Held(body) if kind == Kind::ErrorResponse => (
                body.slice(..body.len().min(limits.max_payload_bytes as usize)),
                None,
            ),
            AnswerBody::Held(body) => (body, None),
            AnswerBody::Streamed(answer) => (Bytes::new(), Some(answer)),
        };
        let body_len = streamed
            .as_ref()
            .map_or(body.len() as u64, |answer| answer.len);
        let Some(payload_len) = usize::try_from(body_len)
            .ok()
            .and_then(|len| len.checked_add(head.len()))
        else {
            return;
        };
        let Ok(frame_head) = EncodedMessage::encode_head(&header, payload_len, limits) else {
            return;
        };
        // Empty pieces are left out (a write of only empty chunks could wait for nothing).
        let mut chunks: Vec<Bytes> = [frame_head, Destination::new(&remote).bytes(), head, body]
            .into_iter()
            .filter(|chunk| !chunk.is_empty())
            .collect();
        if send.write_all_chunks(&mut chunks).await.is_err() {
            return;
        }
        if let Some(answer) = streamed.as_mut() {
            if !answer.send(send).await {
                return;
            }
        }
        let counters = self.metrics.peer_counters(&remote);
        self.metrics
            .count_sent(&counters, (wire::FRAME_OVERHEAD + payload_len) as u64);
        let _ = send.finish();
    }
}
