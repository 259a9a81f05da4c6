//! Unreliable QUIC datagrams between connected peers, routed by protocol id to one bounded inbox
//! per protocol, with a send that never drops silently.
//!
//! Every datagram starts with its protocol id as a LEB128 varint: one byte for ids below 128
//! (meshwire's datagram services use `0x40..=0x7f`, see [`crate::protocols`]), at most five.
//!
//! quinn queues outgoing datagrams behind its congestion controller in a bounded buffer and, when
//! that buffer is full, discards the *oldest* queued datagrams to make room. [`crate::Node::send_datagram`]
//! checks the free space first and refuses with [`DatagramError::BufferFull`] instead, so the caller
//! (the multipath session) learns about every datagram that did not go out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use meshwire_proto::batch::repair::RepairShard;
use meshwire_proto::varint;
use meshwire_proto::wire::ProtocolId;
use meshwire_proto::PeerId;
use quinn::{Connection, SendDatagramError};
use tokio::sync::mpsc;

use crate::node::{Registry, SubscribeError};

/// Recovery shards held for batch streams not read yet, over all connections. Shards usually
/// overtake their stream: QUIC sends datagrams ahead of queued stream data.
const EARLY_SHARDS: usize = 1024;

/// A datagram that arrived from a peer.
#[derive(Debug, Clone)]
pub struct InboundDatagram {
    /// The authenticated sender.
    pub from: PeerId,
    /// The protocol it was sent on.
    pub protocol: ProtocolId,
    /// Its bytes, after the protocol tag.
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
    /// Larger than the connection's current datagram limit, less the protocol tag.
    #[error("datagram of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// The largest payload the connection takes on this protocol.
        max: usize,
    },
    /// The connection's datagram send buffer has no room: congestion control holds the queue.
    #[error("datagram send buffer full")]
    BufferFull,
    /// The connection closed.
    #[error("connection lost")]
    ConnectionLost,
}

/// Where a node's inbound datagrams go: one bounded queue per protocol, drops counted; recovery
/// shards ([`crate::protocols::BATCH_REPAIR`]) to the inbound batch stream they name.
#[derive(Default)]
pub(crate) struct DatagramInbox {
    subscribers: Registry<mpsc::Sender<InboundDatagram>>,
    /// Inbound batch streams taking recovery shards, and shards that came before their stream.
    taps: Mutex<Taps>,
    dropped: AtomicU64,
}

#[derive(Default)]
struct Taps {
    /// Streams taking shards, by connection and stream id.
    open: HashMap<(usize, u64), mpsc::Sender<Bytes>>,
    /// Shards for streams not tapped yet, oldest first, at most [`EARLY_SHARDS`].
    early: VecDeque<((usize, u64), Bytes)>,
    /// Per connection, the highest stream tapped so far: a shard for a lower stream without a
    /// tap is late (its batch is complete) and dropped at once.
    highest: HashMap<usize, u64>,
    /// Connections whose peer has sent recovery shards: their streams keep the bytes handed on.
    repairing: HashSet<usize>,
    /// Per connection, the bytes its inbound batch streams hold after holes, all streams together.
    held: HashMap<usize, Arc<AtomicU64>>,
}

/// The recovery shards for one inbound batch stream; dropping it stops their delivery.
#[derive(Debug)]
pub(crate) struct StreamTap {
    pub(crate) shards: mpsc::Receiver<Bytes>,
    /// The peer has sent recovery shards on this connection before.
    pub(crate) repairing: bool,
    /// The bytes held after holes by every inbound batch stream of this connection.
    pub(crate) held: Arc<AtomicU64>,
    inbox: Arc<DatagramInbox>,
    key: (usize, u64),
}

impl Drop for StreamTap {
    fn drop(&mut self) {
        crate::node::lock(&self.inbox.taps).open.remove(&self.key);
    }
}

impl std::fmt::Debug for DatagramInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatagramInbox")
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl DatagramInbox {
    /// Attaches a subscriber to `protocol` holding at most `capacity` datagrams, unless a live one
    /// is attached.
    pub(crate) fn subscribe(
        &self,
        protocol: ProtocolId,
        capacity: usize,
    ) -> Result<mpsc::Receiver<InboundDatagram>, SubscribeError> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.subscribers.attach(protocol, tx)?;
        Ok(rx)
    }

    /// Datagrams dropped: untagged, for a protocol nobody subscribed to, or to a full queue.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Takes the recovery shards for stream `stream` of connection `connection`, at most
    /// `capacity` waiting; later ones are dropped and counted.
    pub(crate) fn tap_stream(
        self: &Arc<Self>,
        connection: usize,
        stream: u64,
        capacity: usize,
    ) -> StreamTap {
        let (tx, shards) = mpsc::channel(capacity.max(1));
        let key = (connection, stream);
        let mut taps = crate::node::lock(&self.taps);
        let highest = taps.highest.entry(connection).or_insert(stream);
        *highest = (*highest).max(stream);
        taps.early.retain(|(early, shard)| {
            *early != key || {
                let _ = tx.try_send(shard.clone());
                false
            }
        });
        taps.open.insert(key, tx);
        let repairing = taps.repairing.contains(&connection);
        let held = taps.held.entry(connection).or_default().clone();
        drop(taps);
        StreamTap {
            shards,
            repairing,
            held,
            inbox: self.clone(),
            key,
        }
    }

    fn deliver(&self, from: PeerId, connection: usize, datagram: Bytes) {
        let delivered = match decode_tag(&datagram) {
            Some((crate::protocols::BATCH_REPAIR, tag_len)) => {
                let payload = datagram.slice(tag_len..);
                RepairShard::stream_of(&payload)
                    .is_some_and(|stream| self.route_shard((connection, stream), payload))
            }
            Some((protocol, tag_len)) => {
                let subscriber = self.subscribers.get(protocol);
                subscriber.is_some_and(|tx| {
                    let payload = datagram.slice(tag_len..);
                    tx.try_send(InboundDatagram {
                        from,
                        protocol,
                        payload,
                    })
                    .is_ok()
                })
            }
            None => false,
        };
        if !delivered {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands a recovery shard to its stream's tap, or holds it until the stream is read.
    fn route_shard(&self, key: (usize, u64), shard: Bytes) -> bool {
        let mut taps = crate::node::lock(&self.taps);
        taps.repairing.insert(key.0);
        if let Some(tx) = taps.open.get(&key) {
            return tx.try_send(shard).is_ok();
        }
        if taps.highest.get(&key.0).is_some_and(|&high| high >= key.1) {
            return false;
        }
        if taps.early.len() == EARLY_SHARDS {
            taps.early.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        taps.early.push_back((key, shard));
        true
    }

    /// Reads `connection`'s datagrams into the inbox until it closes.
    pub(crate) async fn receive_loop(self: Arc<Self>, connection: Connection, from: PeerId) {
        let id = connection.stable_id();
        while let Ok(datagram) = connection.read_datagram().await {
            self.deliver(from, id, datagram);
        }
        let mut taps = crate::node::lock(&self.taps);
        taps.highest.remove(&id);
        taps.repairing.remove(&id);
        taps.held.remove(&id);
        taps.early.retain(|((connection, _), _)| *connection != id);
    }
}

/// Appends `protocol` as a LEB128 varint.
fn encode_tag(protocol: ProtocolId, out: &mut BytesMut) {
    varint::put(out, protocol.0.into());
}

/// The protocol at the start of `datagram` and the tag's length; `None` if the tag is truncated,
/// overlong or past a `u32` (a padded tag is accepted).
fn decode_tag(datagram: &[u8]) -> Option<(ProtocolId, usize)> {
    let mut rest = datagram;
    let id = varint::get_u32(&mut rest).ok()?;
    Some((ProtocolId(id), datagram.len() - rest.len()))
}

fn tag_len(protocol: ProtocolId) -> usize {
    varint::encoded_len(protocol.0.into())
}

/// Queues `payload` on `protocol` on `connection` if its datagram buffer has room.
pub(crate) fn send(
    connection: &Connection,
    protocol: ProtocolId,
    payload: &[u8],
) -> Result<(), DatagramError> {
    let max = connection
        .max_datagram_size()
        .ok_or(DatagramError::Unsupported)?;
    let total = tag_len(protocol) + payload.len();
    if total > max {
        return Err(DatagramError::TooLarge {
            len: payload.len(),
            max: max.saturating_sub(tag_len(protocol)),
        });
    }
    if connection.datagram_send_buffer_space() < total {
        return Err(DatagramError::BufferFull);
    }
    let mut datagram = BytesMut::with_capacity(total);
    encode_tag(protocol, &mut datagram);
    datagram.put_slice(payload);
    connection
        .send_datagram(datagram.freeze())
        .map_err(|error| match error {
            SendDatagramError::UnsupportedByPeer | SendDatagramError::Disabled => {
                DatagramError::Unsupported
            }
            SendDatagramError::TooLarge => DatagramError::TooLarge {
                len: payload.len(),
                max: max.saturating_sub(tag_len(protocol)),
            },
            SendDatagramError::ConnectionLost(_) => DatagramError::ConnectionLost,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::lock;

    #[test]
    fn tags_round_trip_and_small_ids_take_one_byte() {
        for id in [
            0,
            1,
            0x40,
            0x7f,
            0x80,
            0x3fff,
            0x4000,
            0x6d77_7201,
            u32::MAX,
        ] {
            let mut out = BytesMut::new();
            encode_tag(ProtocolId(id), &mut out);
            assert_eq!(out.len(), tag_len(ProtocolId(id)), "{id:#x}");
            out.put_slice(b"payload");
            assert_eq!(
                decode_tag(&out),
                Some((ProtocolId(id), tag_len(ProtocolId(id))))
            );
        }
        assert_eq!(tag_len(ProtocolId(0x7f)), 1);
    }

    /// Recovery shards that overtake their stream wait for it; shards for a stream already done
    /// are dropped; shards for streams that never come are bounded, the oldest dropped and counted.
    #[tokio::test]
    async fn early_shards_wait_for_their_stream_and_are_bounded() {
        let inbox = Arc::new(DatagramInbox::default());
        assert!(inbox.route_shard((1, 6), Bytes::from_static(b"early")));
        let mut tap = inbox.tap_stream(1, 6, 4);
        assert_eq!(tap.shards.recv().await.unwrap(), &b"early"[..]);
        assert!(inbox.route_shard((1, 6), Bytes::from_static(b"on time")));
        assert_eq!(tap.shards.recv().await.unwrap(), &b"on time"[..]);
        drop(tap);
        // Stream 2 is below a stream already read on connection 1: its batch is complete.
        assert!(!inbox.route_shard((1, 2), Bytes::from_static(b"late")));
        assert!(!inbox.route_shard((1, 6), Bytes::from_static(b"late")));
        let dropped = inbox.dropped();
        for stream in 0..2 * EARLY_SHARDS as u64 {
            inbox.route_shard((2, stream), Bytes::from_static(b"never read"));
        }
        assert_eq!(lock(&inbox.taps).early.len(), EARLY_SHARDS);
        assert_eq!(inbox.dropped() - dropped, EARLY_SHARDS as u64);
    }

    #[test]
    fn truncated_and_overlong_tags_are_refused() {
        assert_eq!(decode_tag(&[]), None);
        assert_eq!(decode_tag(&[0x80]), None);
        assert_eq!(decode_tag(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]), None);
        // Five bytes whose value needs more than 32 bits.
        assert_eq!(decode_tag(&[0xff, 0xff, 0xff, 0xff, 0x7f]), None);
        // A padded tag is read as what it says.
        assert_eq!(decode_tag(&[0xc0, 0x00, 1]), Some((ProtocolId(0x40), 2)));
    }
}
