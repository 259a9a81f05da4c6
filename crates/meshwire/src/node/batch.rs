//! Send and receive bulk batches: a header, then chunks the receiver sees as they arrive.
//!
//! # Design
//!
//! Each batch is one QUIC unidirectional stream carrying the records of [`meshwire_proto::batch`]
//! (header, chunks, end record). The stream's first two bytes (`"MB"`) tell the node's accept path
//! it is a batch, not a message stream (`"MW"`). The stream window is the node's bandwidth-delay
//! product ([`crate::TransportSettings::bdp_bytes`], 25 MB by default), so a batch is bound by
//! latency and bandwidth, not by flow-control windows (the xx network's 600 ms hops, `docs/lessons.md`).
//!
//! The receiving node reads the header (within `inbound_request_timeout`), then hands an
//! [`InboundBatch`] to the protocol's batch subscriber, which pulls chunks one by one as they
//! arrive. Pulling is the backpressure: an application that stops reading stops the stream, and
//! QUIC flow control slows the sender.
//!
//! **Tail repair.** On a path that has lost packets the sender adds Reed–Solomon recovery shards
//! for the batch's last round trip, one datagram each ([`meshwire_proto::batch::repair`],
//! [`crate::TransportSettings::batch_repair`]): a loss there would otherwise add a retransmission
//! round trip to the batch. The receiver reads the stream out of order, hands bytes on in order,
//! and rebuilds holes from the shards; a batch completed that way is stopped with
//! [`STOP_BATCH_REPAIRED`], which the sender's [`BatchSender::finish`] takes as success. The
//! receiver holds at most one chunk, the bytes after a hole (for all of a connection's batch
//! streams together at most the connection's receive window, twice the stream window, else
//! [`meshwire_proto::batch::BatchError::ReorderOverflow`]) and, on a connection whose peer
//! has sent shards, the last 4 MiB handed on (original shards for decoding; a connection that
//! never lost a packet keeps none). Shard bytes sent are counted in
//! `meshwire_batch_repair_sent_bytes_total`, batches rebuilt in `meshwire_batches_repaired_total`.
//!
//! Failure is typed on both ends, never a partial batch passed off as whole:
//! - a sender that drops or fails a [`BatchSender`] before [`BatchSender::finish`] resets the
//!   stream with [`RESET_BATCH_ABANDONED`]; the receiver's next read is [`BatchError::Reset`];
//! - a receiver that finds the batch malformed, short, long or truncated
//!   ([`BatchError::Codec`]) stops the stream with [`STOP_BATCH_MALFORMED`]; a sender still writing
//!   or waiting in [`BatchSender::finish`] gets [`BatchError::Stopped`];
//! - a batch for a protocol nobody subscribed to is stopped with [`STOP_BATCH_NO_SUBSCRIBER`].
//!
//! Unlike a malformed message frame, a bad batch costs only its stream: the connection and the
//! other batches on it go on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use meshwire_proto::batch::repair::{
    self, Reassembly, RepairPlan, RepairShard, TailBuffer, MAX_RECOVERY_SHARDS, MAX_REGION_BYTES,
    MAX_SHARD_BYTES, REPAIR_HEADER_LEN,
};
use meshwire_proto::batch::{
    self as codec, BatchDecoder, BatchEncoder, BatchEvent, BatchHeader, BatchLimits, Chunk,
};
use meshwire_proto::wire::ProtocolId;
use meshwire_proto::PeerId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use quinn::{
    Connection, ConnectionError, ReadError, RecvStream, SendStream, StoppedError, VarInt,
    WriteError,
};
use tokio::sync::mpsc;

use super::registry::Registry;
use super::{Inner, Node, SubscribeError};
use crate::datagram::{self, StreamTap};
use crate::metrics::Metrics;
use crate::protocols::BATCH_REPAIR;

pub(super) use meshwire_proto::batch::BATCH_MAGIC;

/// Stream reset code: the sender gave the batch up before its end.
pub const RESET_BATCH_ABANDONED: u32 = 0x10;
/// Stop-sending code: the receiver found the batch malformed, short, long or truncated.
pub const STOP_BATCH_MALFORMED: u32 = 0x11;
/// Stop-sending code: nobody on the receiving node subscribed to the batch's protocol.
pub const STOP_BATCH_NO_SUBSCRIBER: u32 = 0x12;
/// Stop-sending code: the receiving application discarded the batch.
pub const STOP_BATCH_DISCARDED: u32 = 0x13;
/// Stop-sending code: the receiver has the whole batch, part of it rebuilt from recovery shards,
/// and needs no retransmission. A success for the sender.
pub const STOP_BATCH_REPAIRED: u32 = 0x14;

/// Bytes read from the stream at a time.
const READ_STEP: usize = 64 * 1024;
/// Inbound batches waiting for their subscriber before the node stops accepting more.
const INBOUND_BATCH_QUEUE: usize = 64;

/// Why a batch could not be sent or received whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The batch broke the format or its own declared sizes (short, long, truncated, malformed).
    #[error(transparent)]
    Codec(#[from] codec::BatchError),
    /// No connection to the peer.
    #[error("not connected to {0}")]
    NotConnected(PeerId),
    /// The sender reset the stream with this code (for example, it gave the batch up).
    #[error("the sender reset the batch with code {0:#x}")]
    Reset(u64),
    /// The receiver stopped the stream with this code (for example, it found the batch malformed).
    #[error("the receiver stopped the batch with code {0:#x}")]
    Stopped(u64),
    /// The connection broke under the batch.
    #[error("connection lost: {0}")]
    ConnectionLost(#[source] ConnectionError),
    /// The stream was already closed on this side.
    #[error("the batch's stream is closed")]
    StreamClosed,
    /// The header did not arrive within the node's inbound timeout.
    #[error("batch header timed out after {0:?}")]
    HeaderTimeout(Duration),
}

impl BatchError {
    /// A short, stable name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Codec(error) => error.label(),
            Self::NotConnected(_) => "not_connected",
            Self::Reset(_) => "reset",
            Self::Stopped(_) => "stopped",
            Self::ConnectionLost(_) => "connection_lost",
            Self::StreamClosed => "stream_closed",
            Self::HeaderTimeout(_) => "header_timeout",
        }
    }
}

impl From<WriteError> for BatchError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::Stopped(code) => Self::Stopped(code.into_inner()),
            WriteError::ConnectionLost(error) => Self::ConnectionLost(error),
            _ => Self::StreamClosed,
        }
    }
}

impl From<ReadError> for BatchError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Reset(code) => Self::Reset(code.into_inner()),
            ReadError::ConnectionLost(error) => Self::ConnectionLost(error),
            _ => Self::StreamClosed,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Default)]
struct BatchMetrics {
    sent: Counter,
    received: Counter,
    bytes_received: Counter,
    repair_sent: Counter,
    repaired: Counter,
    errors: Family<ReasonLabel, Counter>,
}

impl BatchMetrics {
    fn error(&self, error: &BatchError) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: error.label(),
            })
            .inc();
    }
}

/// The node's batch state: subscribers per protocol, limits and metrics.
pub(super) struct BatchService {
    subscribers: Registry<mpsc::Sender<InboundBatch>>,
    limits: BatchLimits,
    metrics: BatchMetrics,
}

impl BatchService {
    pub(super) fn new(metrics: &Metrics) -> Self {
        let batch_metrics = BatchMetrics::default();
        metrics.register_with(|registry| {
            registry.register(
                "batches_sent",
                "Batches sent whole and acknowledged",
                batch_metrics.sent.clone(),
            );
            registry.register(
                "batches_received",
                "Batches received whole",
                batch_metrics.received.clone(),
            );
            registry.register_with_unit(
                "batch_received",
                "Chunk bytes of batches received",
                prometheus_client::registry::Unit::Bytes,
                batch_metrics.bytes_received.clone(),
            );
            registry.register_with_unit(
                "batch_repair_sent",
                "Recovery shard bytes sent for batch tails (redundant bytes)",
                prometheus_client::registry::Unit::Bytes,
                batch_metrics.repair_sent.clone(),
            );
            registry.register(
                "batches_repaired",
                "Batches received whole with bytes rebuilt from recovery shards",
                batch_metrics.repaired.clone(),
            );
            registry.register(
                "batch_errors",
                "Batches that failed on either end, by reason",
                batch_metrics.errors.clone(),
            );
        });
        Self {
            subscribers: Registry::default(),
            limits: BatchLimits::default(),
            metrics: batch_metrics,
        }
    }
}

/// An outgoing batch: send its chunks, then [`BatchSender::finish`] it. Dropped before the finish,
/// it resets the stream and the receiver sees [`BatchError::Reset`].
#[derive(Debug)]
pub struct BatchSender {
    send: SendStream,
    encoder: BatchEncoder,
    finished: bool,
    metrics: BatchMetrics,
    connection: Connection,
    /// The stream's last bytes, for recovery shards; `None` when repair is off or the connection
    /// had lost no packet when the batch opened.
    tail: Option<TailBuffer>,
}

impl BatchSender {
    /// The header the batch was opened with.
    pub fn header(&self) -> &BatchHeader {
        self.encoder.header()
    }

    /// Sends one chunk; the data is written by reference, never copied.
    pub async fn send_chunk(&mut self, chunk: Chunk) -> Result<(), BatchError> {
        let result = async {
            let prefix = self.encoder.chunk(chunk.slots, chunk.data.len())?;
            if let Some(tail) = &mut self.tail {
                tail.push(&prefix);
                tail.push(&chunk.data);
            }
            self.send
                .write_all_chunks(&mut [prefix, chunk.data])
                .await?;
            Ok(())
        }
        .await;
        self.fail_on_error(result)
    }

    /// Sends the end record and waits until the receiver has acknowledged every byte (or has
    /// rebuilt the missing ones from recovery shards). Fails if the chunks sent do not add up to
    /// the header, or the receiver stopped the batch.
    pub async fn finish(mut self) -> Result<(), BatchError> {
        let result = async {
            let end = self.encoder.end()?;
            if let Some(tail) = &mut self.tail {
                tail.push(&end);
            }
            self.send.write_chunk(end).await?;
            self.finished = true;
            // Cannot fail: the stream was neither finished nor reset before.
            let _ = self.send.finish();
            self.send_repair();
            match self.send.stopped().await {
                Ok(None) => Ok(()),
                Ok(Some(code)) if code == VarInt::from_u32(STOP_BATCH_REPAIRED) => Ok(()),
                Ok(Some(code)) => Err(BatchError::Stopped(code.into_inner())),
                Err(StoppedError::ConnectionLost(error)) => Err(BatchError::ConnectionLost(error)),
                Err(_) => Err(BatchError::StreamClosed),
            }
        }
        .await;
        let result = self.fail_on_error(result);
        if result.is_ok() {
            self.metrics.sent.inc();
        }
        result
    }

    /// Queues recovery shards for the stream's last round trip if the connection has lost packets:
    /// as many as cover the 99th percentile of that tail's losses at the measured loss rate.
    fn send_repair(&mut self) {
        let Some(tail) = &self.tail else {
            return;
        };
        let path = self.connection.stats().path;
        if path.lost_packets == 0 || path.sent_packets == 0 {
            return;
        }
        let loss_rate = path.lost_packets as f64 / path.sent_packets as f64;
        let Some(max_datagram) = self.connection.max_datagram_size() else {
            return;
        };
        // One datagram per shard: the tag (one byte) and the repair header come off.
        let shard_bytes = max_datagram
            .saturating_sub(1 + REPAIR_HEADER_LEN)
            .min(usize::from(MAX_SHARD_BYTES)) as u16;
        let Some(plan) = RepairPlan::for_tail(
            tail.end(),
            path.cwnd,
            shard_bytes,
            u32::from(path.current_mtu),
            loss_rate,
        ) else {
            return;
        };
        let Ok(shards) = repair::encode_region(&plan, tail) else {
            return;
        };
        let stream = u64::from(self.send.id());
        for (index, data) in shards.into_iter().enumerate() {
            let payload = RepairShard {
                stream,
                plan,
                index: index as u16,
                data,
            }
            .encode();
            // A full datagram buffer ends the shards: the receiver uses what arrives.
            if datagram::send(&self.connection, BATCH_REPAIR, &payload).is_err() {
                break;
            }
            self.metrics.repair_sent.inc_by(payload.len() as u64);
        }
    }

    /// Gives the batch up: the receiver sees [`BatchError::Reset`] with [`RESET_BATCH_ABANDONED`].
    pub fn abandon(mut self) {
        self.reset();
    }

    fn reset(&mut self) {
        if !self.finished {
            self.finished = true;
            let _ = self.send.reset(VarInt::from_u32(RESET_BATCH_ABANDONED));
        }
    }

    fn fail_on_error<T>(&mut self, result: Result<T, BatchError>) -> Result<T, BatchError> {
        if let Err(error) = &result {
            self.metrics.error(error);
            self.reset();
        }
        result
    }
}

impl Drop for BatchSender {
    fn drop(&mut self) {
        self.reset();
    }
}

/// An incoming batch: its header, then its chunks as they arrive.
#[derive(Debug)]
pub struct InboundBatch {
    from: PeerId,
    header: BatchHeader,
    recv: RecvStream,
    decoder: BatchDecoder,
    buffer: BytesMut,
    /// In-order bytes past the end of the chunk record in `buffer`, next to go in once that
    /// record is decoded.
    spill: Option<Bytes>,
    /// The stream after the header, read out of order.
    reassembly: Reassembly,
    /// Recovery shards for this stream.
    tap: StreamTap,
    /// QUIC reported the stream's end: every byte has been read.
    fin: bool,
    /// This stream's share of its connection's bytes held after holes.
    held: Held,
    state: Inbound,
    metrics: BatchMetrics,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Inbound {
    Open,
    Done,
    Failed(BatchError),
}

impl InboundBatch {
    /// The sender.
    pub fn from(&self) -> PeerId {
        self.from
    }

    /// The batch's header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The next chunk as soon as it has arrived; `None` once the batch has arrived whole (end
    /// record checked, stream finished). After an error, every call returns the same error.
    pub async fn next_chunk(&mut self) -> Result<Option<Chunk>, BatchError> {
        match &self.state {
            Inbound::Open => {}
            Inbound::Done => return Ok(None),
            Inbound::Failed(error) => return Err(error.clone()),
        }
        let result = self.pull().await;
        match &result {
            Ok(Some(_)) => {}
            Ok(None) => {
                self.state = Inbound::Done;
                self.metrics.received.inc();
            }
            Err(error) => {
                self.metrics.error(error);
                if matches!(error, BatchError::Codec(_)) {
                    let _ = self.recv.stop(VarInt::from_u32(STOP_BATCH_MALFORMED));
                }
                self.state = Inbound::Failed(error.clone());
            }
        }
        result
    }

    /// Reads every remaining chunk.
    pub async fn collect(mut self) -> Result<(BatchHeader, Vec<Chunk>), BatchError> {
        let mut chunks = Vec::new();
        while let Some(chunk) = self.next_chunk().await? {
            chunks.push(chunk);
        }
        Ok((self.header, chunks))
    }

    /// Discards the batch: the sender sees [`BatchError::Stopped`] with [`STOP_BATCH_DISCARDED`].
    pub fn discard(mut self) {
        let _ = self.recv.stop(VarInt::from_u32(STOP_BATCH_DISCARDED));
    }

    async fn pull(&mut self) -> Result<Option<Chunk>, BatchError> {
        loop {
            if !self.decoder.is_done() {
                match self.decoder.poll(&mut self.buffer)? {
                    Some(BatchEvent::Chunk(chunk)) => {
                        self.metrics.bytes_received.inc_by(chunk.data.len() as u64);
                        return Ok(Some(chunk));
                    }
                    // A second header cannot be decoded: the decoder reads one.
                    Some(BatchEvent::Header(_)) | Some(BatchEvent::End) | None => {}
                }
            }
            if self.decoder.is_done() && !self.buffer.is_empty() {
                return Err(codec::BatchError::TrailingBytes(self.buffer.len()).into());
            }
            if let Some(mut bytes) = self.spill.take().or_else(|| self.reassembly.pop()) {
                self.held.set(self.reassembly.pending())?;
                // A chunk gets room for its whole record at once, and only its own bytes go in:
                // grown as its bytes arrive the buffer would move them at every doubling, and
                // grown past the record's end by the packet that also starts the next record it
                // moved the whole record once more: every byte copied twice, and the receiver's
                // CPU per GB 1.38 times plain quinn's in `bench/transport.sh` (1.26 without).
                if let Some(len) = self.decoder.next_record_len(&self.buffer) {
                    let missing = len.saturating_sub(self.buffer.len());
                    self.buffer.reserve(missing);
                    if bytes.len() > missing {
                        self.spill = Some(bytes.split_off(missing));
                    }
                }
                self.buffer.extend_from_slice(&bytes);
                continue;
            }
            if self.fin {
                self.decoder.finish(self.buffer.len())?;
                return Ok(None);
            }
            if self.decoder.is_done()
                && self.reassembly.declared_end() == Some(self.reassembly.next_offset())
            {
                // Every byte up to the end the recovery shards declare is here, the end record
                // checked: no retransmission is needed.
                let _ = self.recv.stop(VarInt::from_u32(STOP_BATCH_REPAIRED));
                if self.reassembly.rebuilt() {
                    self.metrics.repaired.inc();
                }
                return Ok(None);
            }
            tokio::select! {
                read = self.recv.read_chunk(READ_STEP, false) => match read? {
                    Some(read) => self.reassembly.insert(read.offset, read.bytes)?,
                    None => self.fin = true,
                },
                Some(shard) = self.tap.shards.recv() => {
                    self.reassembly.retain();
                    self.reassembly.add_repair(RepairShard::decode(shard)?)?;
                }
            }
            self.held.set(self.reassembly.pending())?;
        }
    }
}

/// Bytes one inbound batch holds after holes, charged to its connection's budget: read out of
/// order, a stream's bytes count as consumed for QUIC's flow control, so the connection window no
/// longer bounds what its streams hold together; this does, at the same size.
#[derive(Debug)]
struct Held {
    connection: Arc<AtomicU64>,
    mine: u64,
    max: u64,
}

impl Held {
    /// Records that this stream now holds `pending` bytes; fails once the connection's streams
    /// together hold more than the budget.
    fn set(&mut self, pending: usize) -> Result<(), BatchError> {
        let pending = pending as u64;
        if pending == self.mine {
            return Ok(());
        }
        if pending > self.mine {
            let added = pending - self.mine;
            self.mine = pending;
            let total = self.connection.fetch_add(added, Ordering::Relaxed) + added;
            if total > self.max {
                return Err(codec::BatchError::ReorderOverflow {
                    held: total,
                    max: self.max,
                }
                .into());
            }
        } else {
            self.connection
                .fetch_sub(self.mine - pending, Ordering::Relaxed);
            self.mine = pending;
        }
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.connection.fetch_sub(self.mine, Ordering::Relaxed);
    }
}

/// What an inbound batch needs from its node besides the stream.
struct InboundContext {
    from: PeerId,
    limits: BatchLimits,
    metrics: BatchMetrics,
    /// Bytes the stream may hold after a hole, and its connection's streams together.
    max_pending: usize,
    tap: StreamTap,
}

/// Reads a batch stream's header (its magic already read) into an [`InboundBatch`].
async fn read_header(
    mut recv: RecvStream,
    context: InboundContext,
) -> Result<InboundBatch, (BatchError, RecvStream)> {
    let mut decoder = BatchDecoder::new(context.limits);
    let mut buffer = BytesMut::from(&BATCH_MAGIC[..]);
    let mut reassembly = Reassembly::new(0, context.max_pending, context.tap.repairing);
    reassembly.skip(Bytes::from_static(&BATCH_MAGIC));
    loop {
        match decoder.poll(&mut buffer) {
            Ok(Some(BatchEvent::Header(header))) => {
                return Ok(InboundBatch {
                    from: context.from,
                    header,
                    recv,
                    decoder,
                    buffer,
                    spill: None,
                    reassembly,
                    held: Held {
                        connection: context.tap.held.clone(),
                        mine: 0,
                        max: context.max_pending as u64,
                    },
                    tap: context.tap,
                    fin: false,
                    state: Inbound::Open,
                    metrics: context.metrics,
                })
            }
            Ok(_) => {}
            Err(error) => return Err((error.into(), recv)),
        }
        match recv.read_chunk(READ_STEP, true).await {
            Ok(Some(read)) => {
                buffer.extend_from_slice(&read.bytes);
                reassembly.skip(read.bytes);
            }
            Ok(None) => {
                let error =
                    decoder
                        .finish(buffer.len())
                        .err()
                        .unwrap_or(codec::BatchError::Truncated {
                            received: 0,
                            declared: 0,
                        });
                return Err((error.into(), recv));
            }
            Err(error) => return Err((error.into(), recv)),
        }
    }
}

impl Inner {
    /// Serves one inbound batch stream whose magic has been read: reads the header, then hands the
    /// batch to the protocol's subscriber.
    pub(super) async fn accept_batch(
        self: Arc<Self>,
        connection: &Connection,
        remote: PeerId,
        recv: RecvStream,
    ) {
        let service = &self.batches;
        let timeout = self.config.inbound_request_timeout;
        let window = self.config.transport.bdp_bytes();
        let context = InboundContext {
            from: remote,
            limits: service.limits,
            metrics: service.metrics.clone(),
            // The connection's receive window (twice the stream window), which bounded what
            // QUIC held out of order for all of the connection's streams.
            max_pending: usize::try_from(window.saturating_mul(2))
                .unwrap_or(usize::MAX)
                .max(MAX_REGION_BYTES as usize),
            tap: self.datagrams.tap_stream(
                connection.stable_id(),
                u64::from(recv.id()),
                usize::from(MAX_RECOVERY_SHARDS),
            ),
        };
        let header = tokio::time::timeout(timeout, read_header(recv, context)).await;
        let batch = match header {
            Ok(Ok(batch)) => batch,
            Ok(Err((error, mut recv))) => {
                service.metrics.error(&error);
                let _ = recv.stop(VarInt::from_u32(STOP_BATCH_MALFORMED));
                return;
            }
            Err(_) => {
                // The stream was dropped with the timed-out future; quinn stops it.
                service.metrics.error(&BatchError::HeaderTimeout(timeout));
                return;
            }
        };
        let protocol = ProtocolId(batch.header.protocol);
        let subscriber = service.subscribers.get(protocol);
        let refused = match subscriber {
            Some(subscriber) => subscriber.send(batch).await.err().map(|error| error.0),
            None => Some(batch),
        };
        if let Some(mut batch) = refused {
            self.metrics.drop_message("no_subscriber");
            let _ = batch.recv.stop(VarInt::from_u32(STOP_BATCH_NO_SUBSCRIBER));
        }
    }
}

impl Node {
    /// Opens a batch to `peer` on a fresh stream and sends its header. The header's `total_bytes`
    /// and `slot_count` must match the chunks sent before [`BatchSender::finish`].
    pub async fn open_batch(
        &self,
        peer: PeerId,
        header: BatchHeader,
    ) -> Result<BatchSender, BatchError> {
        let service = &self.inner.batches;
        let result = async {
            let (encoder, head) = BatchEncoder::new(header, service.limits)?;
            let (connection, _) = self
                .inner
                .current(peer)
                .ok_or(BatchError::NotConnected(peer))?;
            let mut send = connection
                .open_uni()
                .await
                .map_err(BatchError::ConnectionLost)?;
            // Shards go only to a path that has lost packets: one that has not yet keeps no tail.
            let lossy = connection.stats().path.lost_packets > 0;
            let tail = (self.inner.config.transport.batch_repair && lossy).then(|| {
                let mut tail = TailBuffer::new(0, MAX_REGION_BYTES);
                tail.push(&head);
                tail
            });
            send.write_chunk(head).await?;
            Ok(BatchSender {
                send,
                encoder,
                finished: false,
                metrics: service.metrics.clone(),
                connection,
                tail,
            })
        }
        .await;
        if let Err(error) = &result {
            service.metrics.error(error);
        }
        result
    }

    /// Sends a whole batch: header, every chunk, end record; returns once the receiver has
    /// acknowledged every byte.
    pub async fn send_batch(
        &self,
        peer: PeerId,
        header: BatchHeader,
        chunks: impl IntoIterator<Item = Chunk>,
    ) -> Result<(), BatchError> {
        let mut sender = self.open_batch(peer, header).await?;
        for chunk in chunks {
            sender.send_chunk(chunk).await?;
        }
        sender.finish().await
    }

    /// Receives every batch sent to this node on `protocol`, header first. One subscriber per
    /// protocol; batches wait (at most 64, then their streams wait) while it is busy.
    pub fn subscribe_batches(
        &self,
        protocol: ProtocolId,
    ) -> Result<mpsc::Receiver<InboundBatch>, SubscribeError> {
        let (tx, rx) = mpsc::channel(INBOUND_BATCH_QUEUE);
        self.inner.batches.subscribers.attach(protocol, tx)?;
        Ok(rx)
    }

    /// The batch size limits this node enforces.
    pub fn batch_limits(&self) -> BatchLimits {
        self.inner.batches.limits
    }
}

/// Cuts `data` into chunks of `chunk_bytes` (the last may be shorter), one slot each, without copying.
pub fn split_into_chunks(data: &Bytes, chunk_bytes: usize) -> Vec<Chunk> {
    let step = chunk_bytes.max(1);
    (0..data.len())
        .step_by(step)
        .map(|start| Chunk {
            slots: 1,
            data: data.slice(start..(start + step).min(data.len())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Keypair, NodeConfig};

    fn node(seed: u8) -> Node {
        let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
        config.rng_seed = Some(seed.into());
        Node::bind(config, "127.0.0.1:0".parse().unwrap()).unwrap()
    }

    fn header(slot_count: u32, total_bytes: u64) -> BatchHeader {
        BatchHeader {
            protocol: 9,
            batch_id: 1,
            round: 0,
            phase: 0,
            slot_count,
            total_bytes,
            metadata: Bytes::new(),
        }
    }

    /// Bytes held after holes count against one budget for all of a connection's batch streams,
    /// and a stream's share is released as its holes fill and when it goes.
    #[test]
    fn bytes_held_after_holes_share_one_budget_per_connection() {
        let connection = Arc::new(AtomicU64::new(0));
        let held = || Held {
            connection: connection.clone(),
            mine: 0,
            max: 1_000,
        };
        let (mut a, mut b) = (held(), held());
        a.set(600).unwrap();
        b.set(400).unwrap();
        assert!(matches!(
            b.set(401),
            Err(BatchError::Codec(codec::BatchError::ReorderOverflow {
                held: 1_001,
                max: 1_000
            }))
        ));
        a.set(100).unwrap();
        b.set(401).unwrap();
        drop(a);
        drop(b);
        assert_eq!(connection.load(Ordering::Relaxed), 0);
    }

    /// A sender that finishes its stream before the end record: the receiver reports the batch
    /// truncated, never whole.
    #[tokio::test]
    async fn a_stream_that_ends_early_is_a_truncated_batch_on_both_ends() {
        let (a, b) = (node(1), node(2));
        let mut inbox = b.subscribe_batches(ProtocolId(9)).unwrap();
        a.connect(b.local_addr().unwrap(), b.peer_id())
            .await
            .unwrap();
        let (connection, _) = a.inner.current(b.peer_id()).unwrap();
        let (_, head) = BatchEncoder::new(header(2, 8), BatchLimits::default()).unwrap();
        let mut encoder = BatchEncoder::new(header(2, 8), BatchLimits::default())
            .unwrap()
            .0;
        let mut send = connection.open_uni().await.unwrap();
        send.write_all(&head).await.unwrap();
        send.write_all(&encoder.chunk(1, 4).unwrap()).await.unwrap();
        send.write_all(b"abcd").await.unwrap();
        send.finish().unwrap();
        drop(send);

        let mut batch = tokio::time::timeout(Duration::from_secs(10), inbox.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(batch.header(), &header(2, 8));
        let first = batch.next_chunk().await.unwrap().unwrap();
        assert_eq!(&first.data[..], b"abcd");
        let error = batch.next_chunk().await.unwrap_err();
        assert_eq!(
            error,
            BatchError::Codec(codec::BatchError::Truncated {
                received: 4,
                declared: 8
            })
        );
        // The error sticks.
        assert_eq!(batch.next_chunk().await.unwrap_err(), error);
        assert!(b
            .metrics()
            .encode_text()
            .contains("batch_errors_total{reason=\"truncated\"} 1"));
    }
}
