//! Requests whose body travels piece by piece: the sender writes it from a [`BodySource`] as the
//! pieces are produced, the receiver's handler reads it as a [`RequestBody`] as it arrives. On the
//! wire a streamed request is an ordinary request frame (same header, limits and answer); only
//! neither end holds its payload whole. For large payloads kept on disk (an object's content):
//! a node that sends or stores one then holds one piece of it at a time, not all of it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use meshwire_proto::wire::{self, Kind, ProtocolId};
use meshwire_proto::PeerId;
use quinn::{ReadError, RecvStream, VarInt, WriteError};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::serve::{Handler, HandlerError, StreamedHandler};
use super::{Inner, Node, RequestError, SubscribeError};
use crate::framing::{read_bytes, read_frame_header, wire_error_label, ReadFrameError};

/// The largest piece a [`RequestBody`] hands its handler at once; also what a streamed request
/// reserves of the node's inbound request budget (`inbound_request_bytes`) while it is served.
pub const STREAMED_PIECE_BYTES: usize = 256 * 1024;

/// Stream reset code: the sender's [`BodySource`] failed or broke its promised length.
const RESET_SOURCE_FAILED: u32 = 2;

/// Where a streamed request's body comes from, one piece at a time.
pub trait BodySource: Send {
    /// The next piece of the body, or `None` after the last one.
    fn next_piece(&mut self) -> impl Future<Output = std::io::Result<Option<Bytes>>> + Send;
}

/// A [`BodySource`] behind a pointer: the answers of one handler may come from sources of
/// different types.
trait DynSource: Send {
    fn next_piece_boxed(
        &mut self,
    ) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Option<Bytes>>> + Send + '_>>;
}

impl<S: BodySource> DynSource for S {
    fn next_piece_boxed(
        &mut self,
    ) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Option<Bytes>>> + Send + '_>> {
        Box::pin(self.next_piece())
    }
}

/// An answer's body of `len` bytes that a source produces piece by piece while it is sent
/// ([`Node::handle_streamed_answers`]). A source that fails, or produces more or fewer bytes
/// than `len`, resets the answer's stream: the asker sees a failed answer, never a short one.
pub struct StreamedAnswer {
    pub(super) len: u64,
    source: Box<dyn DynSource>,
}

impl std::fmt::Debug for StreamedAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamedAnswer")
            .field("len", &self.len)
            .finish()
    }
}

impl StreamedAnswer {
    /// An answer body of `len` bytes from `source`.
    pub fn new<S: BodySource + 'static>(len: u64, source: S) -> Self {
        Self {
            len,
            source: Box::new(source),
        }
    }

    /// Writes the pieces to `send`; resets it and returns `false` if the source fails or breaks
    /// its length (or the stream fails).
    pub(super) async fn send(&mut self, send: &mut quinn::SendStream) -> bool {
        let mut sent = 0u64;
        loop {
            match self.source.next_piece_boxed().await {
                Ok(Some(piece)) => {
                    sent += piece.len() as u64;
                    if sent > self.len || send.write_chunk(piece).await.is_err() {
                        break;
                    }
                }
                Ok(None) if sent == self.len => return true,
                Ok(None) | Err(_) => break,
            }
        }
        let _ = send.reset(VarInt::from_u32(RESET_SOURCE_FAILED));
        false
    }
}

/// The body of a handler's answer: held, or streamed from a source.
#[derive(Debug)]
pub enum AnswerBody {
    /// Sent from its buffer.
    Held(Bytes),
    /// Sent piece by piece as its source produces it.
    Streamed(StreamedAnswer),
}

impl AnswerBody {
    /// The body's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::Held(body) => body.len() as u64,
            Self::Streamed(answer) => answer.len,
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for AnswerBody {
    fn from(body: Bytes) -> Self {
        Self::Held(body)
    }
}

/// Why a streamed request's body could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The frame announces fewer bytes than the request's own fields need: the sender broke the
    /// protocol.
    #[error("the request body has {len} bytes, fewer than the {needed} its fields need")]
    TooShort {
        /// Bytes the fields read so far and the next one need.
        needed: u64,
        /// Bytes the frame announced.
        len: u64,
    },
    /// The stream ended before the frame's announced length (a sender that gave up, such as a
    /// request past its deadline, ends its stream early).
    #[error("the request body ended after {actual} of {expected} bytes")]
    Truncated {
        /// Bytes the frame announced.
        expected: u64,
        /// Bytes that arrived.
        actual: u64,
    },
    /// The body did not arrive within the node's `inbound_request_timeout`.
    #[error("the request body did not arrive within {0:?}")]
    Timeout(Duration),
    /// The stream or connection failed (the sender reset it, or the peer went away).
    #[error("the request stream failed: {0}")]
    Stream(#[from] ReadError),
}

/// The payload of a streamed request (or of an answer, [`Node::request_streamed_answer`]), read
/// as it arrives. The whole of a request must arrive within the node's `inbound_request_timeout`
/// from its first byte, the whole of an answer within the request's deadline. Dropping it unread
/// asks the sender to stop sending.
#[derive(Debug)]
pub struct RequestBody {
    recv: RecvStream,
    /// Bytes of the payload read from `recv` already, handed out first.
    read: Bytes,
    len: u64,
    left: u64,
    deadline: Instant,
    timeout: Duration,
    /// The room a request holds in the node's inbound request budget (none for an answer).
    _budget: Option<OwnedSemaphorePermit>,
}

impl RequestBody {
    pub(super) fn new(
        (recv, read): (RecvStream, Bytes),
        len: u64,
        started: Instant,
        timeout: Duration,
        budget: Option<OwnedSemaphorePermit>,
    ) -> Self {
        Self {
            recv,
            read,
            len,
            left: len,
            deadline: started + timeout,
            timeout,
            _budget: budget,
        }
    }

    /// The payload's length, as the frame announced it.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the payload not read yet.
    pub fn remaining(&self) -> u64 {
        self.left
    }

    /// Exactly the next `n` bytes (`TooShort` if the frame holds fewer, `Truncated` if the stream
    /// ends first); for a small head the handler
    /// decodes before the rest. `n` is capped by what is left, so a caller cannot be made to
    /// allocate more than the frame holds.
    pub async fn read_exact(&mut self, n: usize) -> Result<Bytes, BodyError> {
        if n as u64 > self.left {
            return Err(BodyError::TooShort {
                needed: self.len - self.left + n as u64,
                len: self.len,
            });
        }
        if self.read.len() >= n {
            // All of it read already (all of a small request): handed out without a copy.
            self.left -= n as u64;
            return Ok(self.read.split_to(n));
        }
        let mut piece = BytesMut::with_capacity(n);
        piece.extend_from_slice(&std::mem::take(&mut self.read));
        while piece.len() < n {
            let read =
                tokio::time::timeout_at(self.deadline, self.recv.read_chunk(n - piece.len(), true));
            match read.await {
                Err(_) => return Err(BodyError::Timeout(self.timeout)),
                Ok(Err(error)) => return Err(error.into()),
                Ok(Ok(None)) => {
                    return Err(BodyError::Truncated {
                        expected: self.len,
                        actual: self.len - self.left + piece.len() as u64,
                    })
                }
                Ok(Ok(Some(chunk))) => piece.extend_from_slice(&chunk.bytes),
            }
        }
        self.left -= n as u64;
        Ok(piece.freeze())
    }

    /// The next piece of the payload, [`STREAMED_PIECE_BYTES`] (or what is left, if less), or
    /// `None` once all of it was read.
    pub async fn next_piece(&mut self) -> Result<Option<Bytes>, BodyError> {
        if self.left == 0 {
            return Ok(None);
        }
        let n = self.left.min(STREAMED_PIECE_BYTES as u64) as usize;
        self.read_exact(n).await.map(Some)
    }
}

impl Node {
    /// Serves requests on `protocol` with `handler`, which reads each request's payload piece by
    /// piece as a [`RequestBody`] instead of receiving it whole (see [`Node::handle`], whose
    /// rules it otherwise follows: one handler per protocol, the same limits and answers).
    pub fn handle_streamed<F, Fut>(
        &self,
        protocol: ProtocolId,
        handler: F,
    ) -> Result<(), SubscribeError>
    where
        F: Fn(PeerId, RequestBody) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, HandlerError>> + Send + 'static,
    {
        let handler: StreamedHandler = Arc::new(move |peer, body| {
            let answer = handler(peer, body);
            Box::pin(async move { answer.await.map(|body| (Bytes::new(), body.into())) })
        });
        self.inner
            .handlers
            .attach(protocol, Handler::Streamed(handler))
    }

    /// [`Node::handle_parts`] whose handler may answer with a body streamed from a source
    /// ([`AnswerBody::Streamed`]): a large answer read from disk is sent piece by piece, never
    /// held whole.
    pub fn handle_streamed_answers<F, Fut>(
        &self,
        protocol: ProtocolId,
        handler: F,
    ) -> Result<(), SubscribeError>
    where
        F: Fn(PeerId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(Bytes, AnswerBody), HandlerError>> + Send + 'static,
    {
        let handler: super::serve::WholeHandler = Arc::new(move |peer, body| {
            let answer = handler(peer, body);
            Box::pin(answer)
        });
        self.inner
            .handlers
            .attach(protocol, Handler::Whole(handler))
    }

    /// [`Node::request_parts`] with a body of `body_len` bytes that `body` produces piece by
    /// piece while it is sent, so the sender never holds it whole. A source that fails, or
    /// produces more or fewer than `body_len` bytes, fails the request as
    /// [`RequestError::Source`] and resets the stream (the receiver sees a failed body, never a
    /// short one).
    pub async fn request_streamed<S: BodySource>(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        head: Bytes,
        (body_len, body): (u64, S),
        deadline: Duration,
    ) -> Result<Bytes, RequestError> {
        let exchange = self
            .inner
            .clone()
            .request_streamed_once(peer, protocol, head, body_len, body);
        self.inner.timed_request(deadline, exchange).await
    }
}

impl Node {
    /// [`Node::request`] whose answer is read as it arrives: its payload comes back as a
    /// [`RequestBody`] once the answer's head has arrived (an error answer is read whole and
    /// returned as the request's error). `deadline` covers the whole exchange, the reading of
    /// the answer's payload included.
    pub async fn request_streamed_answer(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        body: Bytes,
        deadline: Duration,
    ) -> Result<RequestBody, RequestError> {
        let started = Instant::now();
        let inner = self.inner.clone();
        let exchange = async move {
            let opened = inner.open_request(peer, protocol, body.len()).await?;
            let (connection, message_id, mut send, mut recv) = opened.stream;
            let mut chunks: Vec<Bytes> = opened
                .head
                .into_iter()
                .chain([body])
                .filter(|chunk| !chunk.is_empty())
                .collect();
            send.write_all_chunks(&mut chunks)
                .await
                .map_err(RequestError::WriteFailed)?;
            let _ = send.finish();
            let counters = inner.metrics.peer_counters(&peer);
            let sent: usize = chunks.iter().map(Bytes::len).sum();
            inner.metrics.count_sent(&counters, sent as u64);
            let limits = inner.config.limits;
            let read_head = async {
                let Some(header) = read_frame_header(&mut recv, &[], &limits).await? else {
                    return Ok(None);
                };
                let head = read_bytes(&mut recv, wire::MIN_BODY_LEN).await?;
                let (message, dst) = wire::decode_message_head(&head)?;
                Ok::<_, ReadFrameError>(Some((header.payload_len(), message, dst)))
            };
            let (payload_len, message, dst) = match read_head.await {
                Ok(Some(head)) => head,
                Ok(None) => return Err(RequestError::NoResponse),
                Err(ReadFrameError::Stream(error)) => return Err(RequestError::ReadFailed(error)),
                Err(ReadFrameError::Wire(error)) => {
                    inner.protocol_violation(&connection, peer, wire_error_label(&error));
                    return Err(RequestError::Malformed(error));
                }
            };
            inner.metrics.observe_rtt(&peer, connection.rtt());
            inner
                .metrics
                .count_received(&counters, (payload_len + wire::FRAME_OVERHEAD) as u64);
            if dst != inner.local_id {
                inner.protocol_violation(&connection, peer, "wrong_destination");
                return Err(RequestError::WrongDestination);
            }
            match message.kind {
                Kind::Response if message.message_id == message_id => Ok(RequestBody::new(
                    (recv, Bytes::new()),
                    payload_len as u64,
                    started,
                    deadline,
                    None,
                )),
                Kind::ErrorResponse => {
                    let payload = match read_bytes(&mut recv, payload_len).await {
                        Ok(payload) => payload,
                        Err(ReadFrameError::Stream(error)) => {
                            return Err(RequestError::ReadFailed(error))
                        }
                        Err(ReadFrameError::Wire(error)) => {
                            return Err(RequestError::Malformed(error))
                        }
                    };
                    Err(inner.error_answer(&connection, peer, &payload))
                }
                _ => {
                    inner.protocol_violation(&connection, peer, "unexpected_kind");
                    Err(RequestError::UnexpectedResponse)
                }
            }
        };
        self.inner.timed_request(deadline, exchange).await
    }
}

impl Inner {
    async fn request_streamed_once<S: BodySource>(
        self: Arc<Self>,
        peer: PeerId,
        protocol: ProtocolId,
        head: Bytes,
        body_len: u64,
        mut body: S,
    ) -> Result<Bytes, RequestError> {
        let payload_len = usize::try_from(body_len)
            .ok()
            .and_then(|len| len.checked_add(head.len()))
            .ok_or_else(|| RequestError::Source(format!("a body of {body_len} bytes")))?;
        let opened = self.open_request(peer, protocol, payload_len).await?;
        let (connection, message_id, mut send, recv) = opened.stream;
        let mut chunks: Vec<Bytes> = opened
            .head
            .into_iter()
            .chain([head])
            .filter(|chunk| !chunk.is_empty())
            .collect();
        let mut sent = 0u64;
        let written = async {
            send.write_all_chunks(&mut chunks).await?;
            loop {
                let piece = match body.next_piece().await {
                    Ok(piece) => piece,
                    Err(error) => return Ok(Err(RequestError::Source(error.to_string()))),
                };
                let Some(piece) = piece else { break };
                sent += piece.len() as u64;
                if sent > body_len {
                    return Ok(Err(RequestError::Source(format!(
                        "the body source produced more than the {body_len} bytes announced"
                    ))));
                }
                send.write_chunk(piece).await?;
            }
            if sent < body_len {
                return Ok(Err(RequestError::Source(format!(
                    "the body source ended after {sent} of {body_len} bytes"
                ))));
            }
            Ok::<_, WriteError>(Ok(()))
        };
        // A responder that refuses a request from its head stops reading it and still answers:
        // after a stopped write, that answer is read.
        let stopped = match written.await {
            Ok(Ok(())) => {
                let _ = send.finish();
                None
            }
            Ok(Err(failed)) => {
                let _ = send.reset(VarInt::from_u32(RESET_SOURCE_FAILED));
                return Err(failed);
            }
            Err(error @ WriteError::Stopped(_)) => Some(error),
            Err(error) => return Err(RequestError::WriteFailed(error)),
        };
        self.read_response(&connection, peer, recv, (message_id, payload_len), stopped)
            .await
    }
}
