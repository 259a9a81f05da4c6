//! Requests whose body travels piece by piece: the sender writes it from a [`BodySource`] as the
//! pieces are produced, the receiver's handler reads it as a [`RequestBody`] as it arrives. On the
//! wire a streamed request is an ordinary request frame (same header, limits and answer); only
//! neither end holds its payload whole. For large payloads kept on disk (an object's content):
//! a node that sends or stores one then holds one piece of it at a time, not all of it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use meshwire_proto::wire::{self, ProtocolId};
use meshwire_proto::PeerId;
use quinn::{ReadError, RecvStream, VarInt, WriteError};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::serve::{Handler, HandlerError, StreamedHandler};
use super::{Inner, Node, RequestError, SubscribeError};

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

/// Why a streamed request's body could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The stream ended before the frame's announced length.
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

/// The payload of a streamed request, read as it arrives. The whole of it must arrive within the
/// node's `inbound_request_timeout` from the request's first byte. Dropping it unread asks the
/// sender to stop sending.
#[derive(Debug)]
pub struct RequestBody {
    recv: RecvStream,
    len: u64,
    left: u64,
    deadline: Instant,
    timeout: Duration,
    /// The room this request holds in the node's inbound request budget.
    _budget: OwnedSemaphorePermit,
}

impl RequestBody {
    pub(super) fn new(
        recv: RecvStream,
        len: u64,
        started: Instant,
        timeout: Duration,
        budget: OwnedSemaphorePermit,
    ) -> Self {
        Self {
            recv,
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

    /// Exactly the next `n` bytes (`Truncated` if fewer are left); for a small head the handler
    /// decodes before the rest. `n` is capped by what is left, so a caller cannot be made to
    /// allocate more than the frame holds.
    pub async fn read_exact(&mut self, n: usize) -> Result<Bytes, BodyError> {
        if n as u64 > self.left {
            return Err(BodyError::Truncated {
                expected: self.len - self.left + n as u64,
                actual: self.len,
            });
        }
        let mut piece = BytesMut::with_capacity(n);
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
            Box::pin(async move { answer.await.map(|body| [Bytes::new(), body]) })
        });
        self.inner
            .handlers
            .attach(protocol, Handler::Streamed(handler))
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
        let counters = self.metrics.peer_counters(&peer);
        self.metrics
            .count_sent(&counters, (wire::FRAME_OVERHEAD + payload_len) as u64);
        self.read_response(&connection, peer, recv, message_id, stopped)
            .await
    }
}
