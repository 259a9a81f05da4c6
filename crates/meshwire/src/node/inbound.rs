//! Accept a connection's streams, check every inbound frame and deliver messages to subscribers.

use std::sync::Arc;

use bytes::Bytes;
use meshwire_proto::wire::{self, Kind, ProtocolId};
use meshwire_proto::PeerId;
use quinn::{Connection, RecvStream, VarInt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::registry::Attachment;
use super::{batch, Inner, Node, SubscribeError, CLOSE_PROTOCOL_VIOLATION};
use crate::framing::{read_frame_after, wire_error_label, ReadFrameError};
use crate::metrics::PeerCounters;

/// Stop-sending code: no complete frame arrived on a one-way message stream within
/// [`crate::NodeConfig::inbound_stream_timeout`].
pub const STOP_STREAM_TIMEOUT: u32 = 0x03;

/// A message received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMessage {
    /// The sender.
    pub from: PeerId,
    /// The protocol it was sent on.
    pub protocol: ProtocolId,
    /// The sender's message id.
    pub message_id: u64,
    /// The payload, sliced from the receive buffer.
    pub payload: Bytes,
}

/// A message waiting in an [`Inbox`], holding its payload's share of the inbox's byte budget.
type Queued = (InboundMessage, OwnedSemaphorePermit);

/// The messages sent to this node on one protocol, from [`Node::subscribe`]. At most
/// [`crate::NodeConfig::inbound_queue_messages`] messages and
/// [`crate::NodeConfig::inbound_queue_bytes`] payload bytes wait in it: while it is full, the node
/// stops reading the senders' streams, and QUIC flow control slows the senders down. Nothing is
/// dropped while the inbox lives; dropping it unsubscribes.
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::Receiver<Queued>,
}

impl Inbox {
    /// The next message, waiting for one; `None` once the node has shut down.
    pub async fn recv(&mut self) -> Option<InboundMessage> {
        self.rx.recv().await.map(|(message, _)| message)
    }

    /// The next message if one is waiting.
    pub fn try_recv(&mut self) -> Result<InboundMessage, mpsc::error::TryRecvError> {
        self.rx.try_recv().map(|(message, _)| message)
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// The node's end of an [`Inbox`].
#[derive(Clone)]
pub(super) struct InboxSender {
    tx: mpsc::Sender<Queued>,
    bytes: Arc<Semaphore>,
    budget: u32,
}

impl Attachment for InboxSender {
    fn is_attached(&self) -> bool {
        !self.tx.is_closed()
    }
}

impl InboxSender {
    /// Queues `message` once the inbox has room for it, in messages and in bytes; gives it back
    /// if the inbox is gone.
    async fn send(&self, message: InboundMessage) -> Result<(), InboundMessage> {
        // At least one largest frame fits the budget (checked at start); the clamp only keeps
        // the wait finite whatever the settings.
        let share = u32::try_from(message.payload.len())
            .unwrap_or(u32::MAX)
            .min(self.budget);
        let permit = tokio::select! {
            permit = self.bytes.clone().acquire_many_owned(share) => match permit {
                Ok(permit) => permit,
                Err(_) => return Err(message),
            },
            () = self.tx.closed() => return Err(message),
        };
        self.tx
            .send((message, permit))
            .await
            .map_err(|mpsc::error::SendError((message, _))| message)
    }
}

impl Node {
    /// Receives every message sent to this node on `protocol`. One subscriber per protocol; a
    /// subscriber that stops reading slows its senders down (nothing is dropped while it lives).
    pub fn subscribe(&self, protocol: ProtocolId) -> Result<Inbox, SubscribeError> {
        let config = &self.inner.config;
        let (tx, rx) = mpsc::channel(config.inbound_queue_messages);
        let sender = InboxSender {
            tx,
            bytes: Arc::new(Semaphore::new(config.inbound_queue_bytes as usize)),
            budget: config.inbound_queue_bytes,
        };
        self.inner.subscribers.attach(protocol, sender)?;
        Ok(Inbox { rx })
    }

    /// Closes the connection to `peer` because it sent something a service above the node could
    /// not accept (a malformed payload of a well-formed frame). The connection closes with
    /// [`CLOSE_PROTOCOL_VIOLATION`] and `reason`, `meshwire_frame_errors_total{reason}` counts it,
    /// and a configured peer is redialed with backoff as after any loss. Returns whether a live
    /// connection was closed.
    pub fn close_for_violation(&self, peer: PeerId, reason: &'static str) -> bool {
        let Some((connection, _)) = self.inner.current(peer) else {
            return false;
        };
        self.inner.protocol_violation(&connection, peer, reason);
        true
    }
}

impl Inner {
    pub(super) fn protocol_violation(
        &self,
        connection: &Connection,
        remote: PeerId,
        reason: &'static str,
    ) {
        self.metrics.frame_error(reason);
        tracing::warn!(peer = %remote.short(), reason, "malformed frame; closing the connection");
        connection.close(
            VarInt::from_u32(CLOSE_PROTOCOL_VIOLATION),
            reason.as_bytes(),
        );
    }

    /// Checks that an inbound frame has the kind this stream carries and is addressed to this
    /// node, and counts it. A frame that fails closes the connection; returns whether it passed.
    pub(super) fn accept_frame(
        &self,
        connection: &Connection,
        remote: PeerId,
        frame: &wire::Frame,
        expected: Kind,
        counters: &PeerCounters,
    ) -> bool {
        self.accept_head(
            connection,
            remote,
            (&frame.header, &frame.dst, frame.payload.len()),
            expected,
            counters,
        )
    }

    /// [`Self::accept_frame`] for a frame whose payload (`payload_len` bytes) is still on the
    /// stream: its message header and destination are checked, the whole frame counted.
    pub(super) fn accept_head(
        &self,
        connection: &Connection,
        remote: PeerId,
        (header, dst, payload_len): (&wire::MsgHeader, &PeerId, usize),
        expected: Kind,
        counters: &PeerCounters,
    ) -> bool {
        if header.kind != expected {
            self.protocol_violation(connection, remote, "unexpected_kind");
            return false;
        }
        if *dst != self.local_id {
            self.protocol_violation(connection, remote, "wrong_destination");
            return false;
        }
        self.metrics
            .count_received(counters, (payload_len + wire::FRAME_OVERHEAD) as u64);
        true
    }

    pub(super) async fn connection_loop(self: Arc<Self>, connection: Connection, remote: PeerId) {
        loop {
            tokio::select! {
                stream = connection.accept_uni() => match stream {
                    Ok(recv) => {
                        tokio::spawn(self.clone().read_messages(connection.clone(), remote, recv));
                    }
                    Err(_) => break,
                },
                stream = connection.accept_bi() => match stream {
                    Ok((send, recv)) => {
                        tokio::spawn(self.clone().serve_request(connection.clone(), remote, send, recv));
                    }
                    Err(_) => break,
                },
            }
        }
        let reason = connection.closed().await;
        self.on_connection_closed(remote, &connection, reason);
    }

    async fn read_messages(
        self: Arc<Self>,
        connection: Connection,
        remote: PeerId,
        mut recv: RecvStream,
    ) {
        // One-way streams are capped per connection (`max_concurrent_uni_streams`), so one left
        // open without a complete frame would hold its place until the connection closes: each
        // frame (the first one with the stream's magic) must arrive within the stream timeout of
        // the stream's opening or of the previous frame's delivery. Time spent waiting for a full
        // inbox does not count; an honest writer finishes its idle stream at half the timeout.
        let timeout = self.config.inbound_stream_timeout;
        let mut deadline = tokio::time::Instant::now() + timeout;
        // A stream's first two bytes say what it carries: message frames or one batch.
        let mut magic = [0u8; 2];
        match tokio::time::timeout_at(deadline, recv.read_exact(&mut magic)).await {
            Ok(Ok(())) => {}
            Ok(Err(quinn::ReadExactError::FinishedEarly(1))) => {
                self.protocol_violation(&connection, remote, "truncated");
                return;
            }
            Ok(Err(_)) => return,
            Err(_) => {
                self.stream_timed_out(&mut recv);
                return;
            }
        }
        if magic == batch::BATCH_MAGIC {
            self.accept_batch(&connection, remote, recv).await;
            return;
        }
        let mut prefix: &[u8] = &magic;
        let counters = self.metrics.peer_counters(&remote);
        loop {
            let read = tokio::time::timeout_at(
                deadline,
                read_frame_after(&mut recv, prefix, &self.config.limits),
            )
            .await;
            prefix = &[];
            let Ok(read) = read else {
                self.stream_timed_out(&mut recv);
                return;
            };
            let frame = match read {
                Ok(Some(frame)) => frame,
                Ok(None) | Err(ReadFrameError::Stream(_)) => return,
                Err(ReadFrameError::Wire(error)) => {
                    self.protocol_violation(&connection, remote, wire_error_label(&error));
                    return;
                }
            };
            if !self.accept_frame(&connection, remote, &frame, Kind::Message, &counters) {
                return;
            }
            self.deliver(InboundMessage {
                from: remote,
                protocol: frame.header.protocol,
                message_id: frame.header.message_id,
                payload: frame.payload,
            })
            .await;
            deadline = tokio::time::Instant::now() + timeout;
        }
    }

    /// Frees a one-way stream's place: asks the peer to stop sending on it (QUIC answers with a
    /// reset) and counts `meshwire_frame_errors_total{reason="stream_timeout"}`.
    fn stream_timed_out(&self, recv: &mut RecvStream) {
        self.metrics.frame_error("stream_timeout");
        let _ = recv.stop(VarInt::from_u32(STOP_STREAM_TIMEOUT));
    }

    async fn deliver(&self, message: InboundMessage) {
        let subscriber = self.subscribers.get(message.protocol);
        let Some(subscriber) = subscriber else {
            self.metrics.drop_message("no_subscriber");
            return;
        };
        if subscriber.send(message).await.is_err() {
            self.metrics.drop_message("no_subscriber");
        }
    }
}
