//! Queue messages per peer within count and byte bounds, and write each queue onto one stream.

use std::sync::Arc;

use bytes::Bytes;
use meshwire_proto::wire::{Destination, EncodedMessage, Kind, MsgHeader, ProtocolId, WireError};
use meshwire_proto::PeerId;
use quinn::SendStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use super::{lock, Current, Inner, Node};

/// Why a message was not queued. Every variant hands the unsent payload back
/// ([`SendError::into_payload`]), so the caller can retry or send it elsewhere without a copy.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The peer is neither connected nor configured.
    #[error("unknown peer {peer}")]
    UnknownPeer {
        /// The peer.
        peer: PeerId,
        /// The payload that was not queued.
        payload: Bytes,
    },
    /// The peer's outbound queue is full (count or bytes); the message was not queued.
    #[error("outbound queue to {peer} is full")]
    QueueFull {
        /// The peer.
        peer: PeerId,
        /// The payload that was not queued.
        payload: Bytes,
    },
    /// The message exceeds the frame limits.
    #[error("message too large: {source}")]
    TooLarge {
        /// The limit it broke.
        source: WireError,
        /// The payload that was not queued.
        payload: Bytes,
    },
    /// The node is shutting down.
    #[error("the node is shutting down")]
    Closed {
        /// The payload that was not queued.
        payload: Bytes,
    },
}

impl SendError {
    /// The payload that was not queued.
    pub fn payload(&self) -> &Bytes {
        match self {
            Self::UnknownPeer { payload, .. }
            | Self::QueueFull { payload, .. }
            | Self::TooLarge { payload, .. }
            | Self::Closed { payload } => payload,
        }
    }

    /// Takes the payload that was not queued back.
    pub fn into_payload(self) -> Bytes {
        match self {
            Self::UnknownPeer { payload, .. }
            | Self::QueueFull { payload, .. }
            | Self::TooLarge { payload, .. }
            | Self::Closed { payload } => payload,
        }
    }
}

impl std::fmt::Debug for SendError {
    // The payload may be large: show its length, not its bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let payload_len = self.payload().len();
        match self {
            Self::UnknownPeer { peer, .. } => f
                .debug_struct("UnknownPeer")
                .field("peer", peer)
                .field("payload_len", &payload_len)
                .finish(),
            Self::QueueFull { peer, .. } => f
                .debug_struct("QueueFull")
                .field("peer", peer)
                .field("payload_len", &payload_len)
                .finish(),
            Self::TooLarge { source, .. } => f
                .debug_struct("TooLarge")
                .field("source", source)
                .field("payload_len", &payload_len)
                .finish(),
            Self::Closed { .. } => f
                .debug_struct("Closed")
                .field("payload_len", &payload_len)
                .finish(),
        }
    }
}

/// What `send_many` did for each destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendManyReport {
    /// Destinations whose queue took the message.
    pub queued: usize,
    /// Destinations that refused it, and why.
    pub failed: Vec<(PeerId, SendError)>,
}

pub(super) struct Outbound {
    chunks: [Bytes; 3],
    len: u64,
    _permit: OwnedSemaphorePermit,
}

impl Outbound {
    fn new(message: &EncodedMessage, dst: &Destination, permit: OwnedSemaphorePermit) -> Self {
        Self {
            chunks: message.chunks_for(dst),
            len: message.frame_len() as u64,
            _permit: permit,
        }
    }
}

#[derive(Clone)]
pub(super) struct OutboundQueue {
    pub(super) tx: mpsc::Sender<Outbound>,
    pub(super) bytes: Arc<Semaphore>,
}

impl OutboundQueue {
    fn try_push(
        &self,
        peer: PeerId,
        message: &EncodedMessage,
        dst: &Destination,
    ) -> Result<(), SendError> {
        let len = message.frame_len() as u32;
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(len)
            .map_err(|_| queue_full(peer, message))?;
        let item = Outbound::new(message, dst, permit);
        self.tx.try_send(item).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => queue_full(peer, message),
            mpsc::error::TrySendError::Closed(_) => unknown_peer(peer, message),
        })
    }

    async fn push(
        &self,
        peer: PeerId,
        message: &EncodedMessage,
        dst: &Destination,
    ) -> Result<(), SendError> {
        let len = message.frame_len() as u32;
        let permit = self
            .bytes
            .clone()
            .acquire_many_owned(len)
            .await
            .map_err(|_| unknown_peer(peer, message))?;
        let item = Outbound::new(message, dst, permit);
        self.tx
            .send(item)
            .await
            .map_err(|_| unknown_peer(peer, message))
    }
}

impl Node {
    /// Queues `payload` for `peer`, waiting while the peer's queue is full.
    pub async fn send(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let message = self.inner.encode_message(protocol, payload)?;
        let (queue, dst) = self.inner.queue_for(peer, &message)?;
        queue.push(peer, &message, &dst).await
    }

    /// Queues `payload` for `peer`, or fails at once with [`SendError::QueueFull`].
    pub fn try_send(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let message = self.inner.encode_message(protocol, payload)?;
        let (queue, dst) = self.inner.queue_for(peer, &message)?;
        queue.try_push(peer, &message, &dst)
    }

    /// Queues one message for many peers: encoded once, with only the destination written per
    /// peer and the payload shared by reference. A full or unknown peer is reported in the
    /// result and never delays the others.
    pub fn send_many(
        &self,
        peers: &[PeerId],
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<SendManyReport, SendError> {
        let message = self.inner.encode_message(protocol, payload)?;
        let mut report = SendManyReport::default();
        let known = lock(&self.inner.peers);
        for peer in peers {
            let entry = known.get(peer);
            let result = match entry {
                Some(entry) => entry.queue.try_push(*peer, &message, &entry.dst),
                None => Err(unknown_peer(*peer, &message)),
            };
            match result {
                Ok(()) => report.queued += 1,
                Err(error) => {
                    // Only a known peer has series (an unknown one would never be forgotten).
                    match entry {
                        Some(_) => {
                            let counters = self.inner.metrics.peer_counters(peer);
                            self.inner
                                .metrics
                                .drop_peer_message(&counters, "send_refused");
                        }
                        None => self.inner.metrics.drop_message("send_refused"),
                    }
                    report.failed.push((*peer, error));
                }
            }
        }
        Ok(report)
    }
}

impl Inner {
    fn encode_message(
        &self,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<EncodedMessage, SendError> {
        if self.is_shutting_down() {
            return Err(SendError::Closed { payload });
        }
        let header = MsgHeader {
            kind: Kind::Message,
            flags: 0,
            protocol,
            message_id: self.next_id(),
        };
        // A clone of the handle, not of the bytes: kept to hand back if the payload is too large.
        EncodedMessage::encode(&header, payload.clone(), &self.config.limits)
            .map_err(|source| SendError::TooLarge { source, payload })
    }

    fn queue_for(
        &self,
        peer: PeerId,
        message: &EncodedMessage,
    ) -> Result<(OutboundQueue, Destination), SendError> {
        let peers = lock(&self.peers);
        let entry = peers
            .get(&peer)
            .ok_or_else(|| unknown_peer(peer, message))?;
        Ok((entry.queue.clone(), entry.dst.clone()))
    }

    pub(super) async fn write_loop(
        self: Arc<Self>,
        peer: PeerId,
        mut queue: mpsc::Receiver<Outbound>,
        mut current: watch::Receiver<Option<Current>>,
    ) {
        // Looked up once: the writer updates it after every drained queue.
        let rtt_gauge = self.metrics.peer_rtt_gauge(&peer);
        let counters = self.metrics.peer_counters(&peer);
        let mut stream: Option<(usize, SendStream)> = None;
        // The peer stops a one-way stream that stays without a complete frame for its
        // `inbound_stream_timeout`; finishing an idle stream well before that means it never
        // stops one this writer may still be writing to.
        let idle = self.config.inbound_stream_timeout / 2;
        loop {
            let next = match stream.as_mut() {
                Some((_, send)) => match tokio::time::timeout(idle, queue.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        let _ = send.finish();
                        stream = None;
                        continue;
                    }
                },
                None => queue.recv().await,
            };
            let Some(mut item) = next else {
                break;
            };
            let connection = loop {
                let live = current
                    .borrow_and_update()
                    .clone()
                    .filter(Current::is_alive);
                if let Some(live) = live {
                    break Some(live.connection);
                }
                if current.changed().await.is_err() {
                    break None;
                }
            };
            let Some(connection) = connection else {
                self.metrics.drop_peer_message(&counters, "peer_removed");
                break;
            };
            if stream.as_ref().map(|(id, _)| *id) != Some(connection.stable_id()) {
                stream = match connection.open_uni().await {
                    Ok(send) => Some((connection.stable_id(), send)),
                    Err(_) => {
                        self.metrics.drop_peer_message(&counters, "connection_lost");
                        continue;
                    }
                };
            }
            let Some((_, send)) = stream.as_mut() else {
                continue;
            };
            match send.write_all_chunks(&mut item.chunks).await {
                Ok(()) => {
                    self.metrics.count_sent(&counters, item.len);
                    if queue.is_empty() {
                        rtt_gauge.set(connection.rtt().as_secs_f64());
                    }
                }
                Err(_) => {
                    self.metrics.drop_peer_message(&counters, "connection_lost");
                    stream = None;
                }
            }
        }
        // The peer was removed: count what was still queued.
        queue.close();
        while queue.try_recv().is_ok() {
            self.metrics.drop_peer_message(&counters, "peer_removed");
        }
    }
}

fn queue_full(peer: PeerId, message: &EncodedMessage) -> SendError {
    SendError::QueueFull {
        peer,
        payload: message.payload().clone(),
    }
}

fn unknown_peer(peer: PeerId, message: &EncodedMessage) -> SendError {
    SendError::UnknownPeer {
        peer,
        payload: message.payload().clone(),
    }
}
