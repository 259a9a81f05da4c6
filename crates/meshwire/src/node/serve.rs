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
use super::{Inner, Node, SubscribeError};
use crate::framing::{read_frame_body, read_frame_header, wire_error_label, ReadFrameError};

/// Stream reset code: the request took too long to arrive.
const RESET_REQUEST_TIMEOUT: u32 = 1;

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
    /// The request body does not decode.
    #[error("malformed request: {0}")]
    Malformed(#[source] ServiceError),
    /// The service failed to serve the request.
    #[error(transparent)]
    Failed(ServiceError),
}

/// An answer in two pieces, written one after the other (see [`Node::handle_parts`]).
type HandlerFuture = Pin<Box<dyn Future<Output = Result<[Bytes; 2], HandlerError>> + Send>>;
pub(super) type Handler = Arc<dyn Fn(PeerId, Bytes) -> HandlerFuture + Send + Sync>;

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
        let handler: Handler = Arc::new(move |peer, body| {
            let answer = handler(peer, body);
            Box::pin(async move { answer.await.map(|body| [Bytes::new(), body]) })
        });
        self.inner.handlers.attach(protocol, handler)
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
        let handler: Handler = Arc::new(move |peer, body| {
            let answer = handler(peer, body);
            Box::pin(async move { answer.await.map(|(head, body)| [head, body]) })
        });
        self.inner.handlers.attach(protocol, handler)
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
            [Bytes::new(), reply],
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
        let arrival = tokio::time::timeout(self.config.inbound_request_timeout, async {
            let Some(header) = read_frame_header(&mut recv, &[], &limits).await? else {
                return Ok(None);
            };
            // Room in the node's request budget before any of the body is read, so requests
            // from all streams cannot together hold more than the budget; held until answered.
            // A request that finds no room is refused at once: one waiting would leave its body
            // in the connection's receive window, where it could starve the requests that hold
            // the room.
            let Ok(budget) = self
                .request_bytes
                .clone()
                .try_acquire_many_owned(header.body_len)
            else {
                return Ok(Some(None));
            };
            let frame = read_frame_body(&mut recv, &header).await?;
            Ok(Some(Some((frame, budget))))
        })
        .await;
        let (frame, _budget) = match arrival {
            Err(_) => {
                self.metrics.frame_error("request_timeout");
                let _ = send.reset(VarInt::from_u32(RESET_REQUEST_TIMEOUT));
                return;
            }
            Ok(Ok(Some(None))) => {
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
            Ok(Ok(Some(Some(request)))) => request,
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
        if !self.accept_frame(&connection, remote, &frame, Kind::Request, &counters) {
            return;
        }
        let protocol = frame.header.protocol;
        let handler = self.handlers.get(protocol);
        let error = |code, text: &str| {
            (
                Kind::ErrorResponse,
                [Bytes::new(), wire::encode_error_payload(code, text)],
            )
        };
        let (kind, body) = match handler {
            None => error(
                ErrorCode::NoHandler,
                &format!("no handler for protocol {}", protocol.0),
            ),
            Some(handler) => match handler(remote, frame.payload).await {
                Ok(parts) => {
                    let len: u64 = parts.iter().map(|part| part.len() as u64).sum();
                    if len > u64::from(limits.max_payload_bytes) {
                        error(
                            ErrorCode::TooLarge,
                            &format!("response of {len} bytes exceeds the limit"),
                        )
                    } else {
                        (Kind::Response, parts)
                    }
                }
                Err(failure) => error(ErrorCode::Handler, &failure.to_string()),
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
        [head, body]: [Bytes; 2],
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
        let payload_len = head.len() + body.len();
        let Ok(frame_head) = EncodedMessage::encode_head(&header, payload_len, limits) else {
            return;
        };
        // Empty pieces are left out (a write of only empty chunks could wait for nothing).
        let mut chunks: Vec<Bytes> = [frame_head, Destination::new(&remote).bytes(), head, body]
            .into_iter()
            .filter(|chunk| !chunk.is_empty())
            .collect();
        if send.write_all_chunks(&mut chunks).await.is_ok() {
            let counters = self.metrics.peer_counters(&remote);
            self.metrics
                .count_sent(&counters, (wire::FRAME_OVERHEAD + payload_len) as u64);
        }
        let _ = send.finish();
    }
}
