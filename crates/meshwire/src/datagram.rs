//! Unreliable QUIC datagrams between connected peers: one bounded inbox per node, a send that
//! never drops silently.
//!
//! quinn queues outgoing datagrams behind its congestion controller in a bounded buffer and, when
//! that buffer is full, discards the *oldest* queued datagrams to make room. [`crate::Node::send_datagram`]
//! checks the free space first and refuses with [`DatagramError::BufferFull`] instead, so the caller
//! (the multipath session) learns about every datagram that did not go out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use meshwire_proto::PeerId;
use quinn::{Connection, SendDatagramError};
use tokio::sync::mpsc;

use crate::node::SubscribeError;

/// A datagram that arrived from a peer.
#[derive(Debug, Clone)]
pub struct InboundDatagram {
    /// The authenticated sender.
    pub from: PeerId,
    /// Its bytes.
    pub payload: Bytes,
}

/// Why a datagram was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// No live connection to the peer.
    #[error("not connected to {0}")]
    NotConnected(PeerId),
    /// The peer does not accept datagrams.
    #[error("the peer does not accept datagrams")]
    Unsupported,
    /// Larger than the connection's current datagram limit.
    #[error("datagram of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Datagram length.
        len: usize,
        /// The connection's limit.
        max: usize,
    },
    /// The connection's datagram send buffer has no room: congestion control holds the queue.
    #[error("datagram send buffer full")]
    BufferFull,
    /// The connection closed.
    #[error("connection lost")]
    ConnectionLost,
}

/// Where a node's inbound datagrams go: one subscriber, a bounded queue, drops counted.
#[derive(Debug, Default)]
pub(crate) struct DatagramInbox {
    subscriber: Mutex<Option<mpsc::Sender<InboundDatagram>>>,
    dropped: AtomicU64,
}

impl DatagramInbox {
    /// Attaches a subscriber holding at most `capacity` datagrams, unless a live one is attached.
    pub(crate) fn subscribe(
        &self,
        capacity: usize,
    ) -> Result<mpsc::Receiver<InboundDatagram>, SubscribeError> {
        let mut subscriber = self
            .subscriber
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if subscriber.as_ref().is_some_and(|tx| !tx.is_closed()) {
            return Err(SubscribeError::DatagramsAlreadySubscribed);
        }
        let (tx, rx) = mpsc::channel(capacity.max(1));
        *subscriber = Some(tx);
        Ok(rx)
    }

    /// Datagrams dropped because nobody subscribed or the subscriber's queue was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn deliver(&self, datagram: InboundDatagram) {
        let subscriber = self
            .subscriber
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let delivered = subscriber.is_some_and(|tx| tx.try_send(datagram).is_ok());
        if !delivered {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads `connection`'s datagrams into the inbox until it closes.
    pub(crate) async fn receive_loop(
        self: std::sync::Arc<Self>,
        connection: Connection,
        from: PeerId,
    ) {
        while let Ok(payload) = connection.read_datagram().await {
            self.deliver(InboundDatagram { from, payload });
        }
    }
}

/// Queues `payload` on `connection` if its datagram buffer has room.
pub(crate) fn send(connection: &Connection, payload: Bytes) -> Result<(), DatagramError> {
    let max = connection
        .max_datagram_size()
        .ok_or(DatagramError::Unsupported)?;
    if payload.len() > max {
        return Err(DatagramError::TooLarge {
            len: payload.len(),
            max,
        });
    }
    if connection.datagram_send_buffer_space() < payload.len() {
        return Err(DatagramError::BufferFull);
    }
    connection
        .send_datagram(payload)
        .map_err(|error| match error {
            SendDatagramError::UnsupportedByPeer | SendDatagramError::Disabled => {
                DatagramError::Unsupported
            }
            SendDatagramError::TooLarge => DatagramError::TooLarge { len: max + 1, max },
            SendDatagramError::ConnectionLost(_) => DatagramError::ConnectionLost,
        })
}
