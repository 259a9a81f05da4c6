//! Encode and decode bulk batches: a header, a stream of chunks, and an end record that proves the
//! batch arrived whole.
//!
//! # Design
//!
//! The xx network moved 4 Mbit batches (1000 payloads) as single HTTP/2 messages, so the receiver
//! saw nothing until the last byte and the sender waited on flow-control windows (`docs/lessons.md`).
//! Here a batch is a stream of records the receiver can act on as they arrive. One batch fills one
//! QUIC unidirectional stream. Fixed-width integers are little-endian; `v` marks an unsigned LEB128
//! varint in its shortest encoding ([`crate::varint`], at most 5 bytes for a `u32`):
//!
//! | record | bytes     | fields                                                                          |
//! |--------|-----------|---------------------------------------------------------------------------------|
//! | header | 44 + m    | magic `"MB"` (2), version = 2 (1), reserved = 0 (1), protocol (u32), batch id   |
//! |        |           | (u64), round (u64), phase (u32), slot count (u32), total bytes (u64), metadata  |
//! |        |           | length m (u32), metadata (m)                                                    |
//! | chunk  | 3..11 + n | tag = 1 (1), slots (v), length n (v), data (n); `n > 0`                         |
//! | end    | 17        | tag = 2 (1), chunk count (u32), slot count (u32), total bytes (u64)             |
//!
//! The magic differs from a message frame's `"MW"`, so a node tells a batch stream from a message
//! stream by its first two bytes. After the end record the stream must finish.
//!
//! The chunk prefix is varints because a batch may be a thousand small payloads, one chunk each:
//! the xx network's case, 1000 payloads of 500 bytes, is what the lab's ring sweep sends. Version 1
//! spent 9 bytes on each (slots and length as `u32`s), 1.8% of a 500-byte payload against gRPC's
//! 5-byte message prefix; version 2 spends 4 (tag, one slot in one byte, 500 in two), 0.8%.
//! [`chunk_prefix_len`] gives a chunk's prefix, [`MAX_CHUNK_PREFIX_LEN`] the largest. A decoder
//! refuses every other version ([`BatchError::UnsupportedVersion`]), version 1 included, and a
//! varint that is padded, longer than a `u32` takes or above `u32::MAX`
//! ([`BatchError::BadVarint`]), so a decoded batch re-encodes to exactly its bytes.
//!
//! Invariants, checked on both sides: chunks never carry more bytes or slots than the header
//! declared ([`BatchError::Overrun`]); the end record comes only when exactly the declared bytes
//! and slots have arrived and repeats the counts the receiver saw ([`BatchError::Short`],
//! [`BatchError::EndMismatch`]); a stream that ends before the end record is
//! [`BatchError::Truncated`]. So a receiver never takes a partial batch for a whole one. QUIC
//! already protects the bytes in transit; the end record protects against a sender that stops,
//! crashes or lies about its sizes.
//!
//! Limits ([`BatchLimits`]) bound metadata, chunk and batch sizes before anything is allocated: a
//! receiver buffers at most one chunk plus one read.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::varint::{self, VarintError};

pub mod repair;

/// The two bytes that open every batch stream: `"MB"`.
pub const BATCH_MAGIC: [u8; 2] = *b"MB";
/// The batch format version this code writes and accepts (2: varint chunk prefixes).
pub const BATCH_VERSION: u8 = 2;
/// Length of the header before its metadata.
pub const HEADER_FIXED_LEN: usize = 44;
/// Longest chunk record prefix (the bytes before its data): the tag and two five-byte varints.
/// [`chunk_prefix_len`] gives a given chunk's.
pub const MAX_CHUNK_PREFIX_LEN: usize = 1 + 2 * varint::MAX_LEN_U32;
/// Length of the end record.
pub const END_LEN: usize = 17;

const TAG_CHUNK: u8 = 1;
const TAG_END: u8 = 2;

/// Length of the prefix of a chunk record of `slots` slots and `len` bytes: 3 to
/// [`MAX_CHUNK_PREFIX_LEN`] (4 for one slot and 128 to 16,383 bytes).
pub fn chunk_prefix_len(slots: u32, len: u32) -> usize {
    1 + varint::encoded_len(slots.into()) + varint::encoded_len(len.into())
}

/// Size limits of batches, checked before any allocation on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Largest application metadata in the header.
    pub max_metadata_bytes: u32,
    /// Largest chunk.
    pub max_chunk_bytes: u32,
    /// Largest batch (sum of its chunks).
    pub max_batch_bytes: u64,
    /// Most slots one batch may declare.
    pub max_slots: u32,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_metadata_bytes: 64 * 1024,
            max_chunk_bytes: 4 * 1024 * 1024,
            max_batch_bytes: 1 << 30,
            max_slots: 1 << 24,
        }
    }
}

/// What a batch is: its identity, its place in the protocol, its declared size and opaque metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    /// The service the batch belongs to (the same numbering as message protocols).
    pub protocol: u32,
    /// Sender-chosen identifier; a pipeline keeps it around the ring.
    pub batch_id: u64,
    /// Application round.
    pub round: u64,
    /// Application phase within the round.
    pub phase: u32,
    /// Slots (payloads) the batch carries.
    pub slot_count: u32,
    /// Bytes the chunks carry in total.
    pub total_bytes: u64,
    /// Opaque application metadata.
    pub metadata: Bytes,
}

/// One chunk of a batch: some slots' worth of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Slots the chunk carries.
    pub slots: u32,
    /// The chunk's bytes.
    pub data: Bytes,
}

/// A malformed, oversized, short or long batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The stream does not start with `"MB"`.
    #[error("bad batch magic {0:02x?}, expected \"MB\"")]
    BadMagic([u8; 2]),
    /// A batch version this code does not speak.
    #[error("unsupported batch version {0} (this node speaks {BATCH_VERSION})")]
    UnsupportedVersion(u8),
    /// The reserved header byte is not zero.
    #[error("reserved batch header byte is {0:#x}, must be 0")]
    ReservedNotZero(u8),
    /// A size exceeds its limit.
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLarge {
        /// Which size: `metadata`, `chunk`, `batch` or `slots`.
        what: &'static str,
        /// The size announced.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A chunk with no bytes.
    #[error("empty chunk")]
    EmptyChunk,
    /// A record tag this version does not define.
    #[error("unknown batch record tag {0}")]
    UnknownRecord(u8),
    /// More bytes or slots than the header declared.
    #[error("batch overrun: {what} would reach {actual}, header declared {declared}")]
    Overrun {
        /// `bytes` or `slots`.
        what: &'static str,
        /// Declared in the header.
        declared: u64,
        /// Reached with this chunk.
        actual: u64,
    },
    /// The batch ended with fewer bytes or slots than the header declared.
    #[error("short batch: {actual} of {declared} {what}")]
    Short {
        /// `bytes` or `slots`.
        what: &'static str,
        /// Declared in the header.
        declared: u64,
        /// Present when the batch ended.
        actual: u64,
    },
    /// The end record's counts differ from what arrived.
    #[error("end record says {claimed} {what}, {actual} arrived")]
    EndMismatch {
        /// `chunks`, `slots` or `bytes`.
        what: &'static str,
        /// What the end record says.
        claimed: u64,
        /// What the receiver counted.
        actual: u64,
    },
    /// The stream ended before the end record.
    #[error("batch truncated after {received} of {declared} bytes")]
    Truncated {
        /// Chunk bytes that arrived.
        received: u64,
        /// Chunk bytes the header declared (0 if the header itself was cut).
        declared: u64,
    },
    /// Bytes after the end record.
    #[error("{0} bytes after the end of the batch")]
    TrailingBytes(usize),
    /// The sender used the encoder out of order (a chunk after the end).
    #[error("batch already ended")]
    AlreadyEnded,
    /// A chunk prefix's `slots` or `length` varint is padded, longer than a `u32` takes, or above
    /// `u32::MAX`.
    #[error("malformed {0} varint in a chunk prefix")]
    BadVarint(&'static str),
    /// A recovery shard for the batch's tail is malformed or contradicts the stream.
    #[error("bad repair shard: {0}")]
    BadRepair(&'static str),
    /// More bytes arrived after a hole in the stream than the receiver holds.
    #[error("{held} bytes held after a hole in the batch stream, limit {max}")]
    ReorderOverflow {
        /// Bytes held.
        held: u64,
        /// The limit.
        max: u64,
    },
}

impl BatchError {
    /// A short, stable name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Self::BadMagic(_) => "bad_magic",
            Self::UnsupportedVersion(_) => "unsupported_version",
            Self::ReservedNotZero(_) => "reserved_not_zero",
            Self::TooLarge { .. } => "too_large",
            Self::EmptyChunk => "empty_chunk",
            Self::UnknownRecord(_) => "unknown_record",
            Self::Overrun { .. } => "overrun",
            Self::Short { .. } => "short",
            Self::EndMismatch { .. } => "end_mismatch",
            Self::Truncated { .. } => "truncated",
            Self::TrailingBytes(_) => "trailing_bytes",
            Self::AlreadyEnded => "already_ended",
            Self::BadVarint(_) => "bad_varint",
            Self::BadRepair(_) => "bad_repair",
            Self::ReorderOverflow { .. } => "reorder_overflow",
        }
    }
}

fn check_limit(what: &'static str, len: u64, max: u64) -> Result<(), BatchError> {
    if len > max {
        return Err(BatchError::TooLarge { what, len, max });
    }
    Ok(())
}

fn check_header(header: &BatchHeader, limits: &BatchLimits) -> Result<(), BatchError> {
    check_limit(
        "metadata",
        header.metadata.len() as u64,
        limits.max_metadata_bytes.into(),
    )?;
    check_limit("batch", header.total_bytes, limits.max_batch_bytes)?;
    check_limit("slots", header.slot_count.into(), limits.max_slots.into())
}

/// Running totals of one batch, kept the same way by the encoder and the decoder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    chunks: u64,
    slots: u64,
    bytes: u64,
}

impl Tally {
    fn add(
        &mut self,
        header: &BatchHeader,
        limits: &BatchLimits,
        slots: u32,
        len: u64,
    ) -> Result<(), BatchError> {
        if len == 0 {
            return Err(BatchError::EmptyChunk);
        }
        check_limit("chunk", len, limits.max_chunk_bytes.into())?;
        let bytes = self.bytes + len;
        if bytes > header.total_bytes {
            return Err(BatchError::Overrun {
                what: "bytes",
                declared: header.total_bytes,
                actual: bytes,
            });
        }
        let total_slots = self.slots + u64::from(slots);
        if total_slots > u64::from(header.slot_count) {
            return Err(BatchError::Overrun {
                what: "slots",
                declared: header.slot_count.into(),
                actual: total_slots,
            });
        }
        self.chunks += 1;
        self.slots = total_slots;
        self.bytes = bytes;
        Ok(())
    }

    fn check_complete(&self, header: &BatchHeader) -> Result<(), BatchError> {
        if self.bytes < header.total_bytes {
            return Err(BatchError::Short {
                what: "bytes",
                declared: header.total_bytes,
                actual: self.bytes,
            });
        }
        if self.slots < u64::from(header.slot_count) {
            return Err(BatchError::Short {
                what: "slots",
                declared: header.slot_count.into(),
                actual: self.slots,
            });
        }
        Ok(())
    }
}

/// The sending side: checks every chunk against the header and writes the records.
///
/// Chunk data is never copied: [`BatchEncoder::chunk`] returns only the record prefix (3 to
/// [`MAX_CHUNK_PREFIX_LEN`] bytes), and the driver writes prefix and data as one vectored write.
#[derive(Debug, Clone)]
pub struct BatchEncoder {
    header: BatchHeader,
    limits: BatchLimits,
    tally: Tally,
    ended: bool,
}

impl BatchEncoder {
    /// Checks `header` against `limits`; returns the encoder and the encoded header record.
    pub fn new(header: BatchHeader, limits: BatchLimits) -> Result<(Self, Bytes), BatchError> {
        check_header(&header, &limits)?;
        let mut out = BytesMut::with_capacity(HEADER_FIXED_LEN + header.metadata.len());
        out.put_slice(&BATCH_MAGIC);
        out.put_u8(BATCH_VERSION);
        out.put_u8(0);
        out.put_u32_le(header.protocol);
        out.put_u64_le(header.batch_id);
        out.put_u64_le(header.round);
        out.put_u32_le(header.phase);
        out.put_u32_le(header.slot_count);
        out.put_u64_le(header.total_bytes);
        out.put_u32_le(header.metadata.len() as u32);
        out.put_slice(&header.metadata);
        let encoder = Self {
            header,
            limits,
            tally: Tally::default(),
            ended: false,
        };
        Ok((encoder, out.freeze()))
    }

    /// The header this batch was opened with.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Accounts for a chunk of `slots` slots and `len` bytes; returns its record prefix.
    pub fn chunk(&mut self, slots: u32, len: usize) -> Result<Bytes, BatchError> {
        if self.ended {
            return Err(BatchError::AlreadyEnded);
        }
        self.tally
            .add(&self.header, &self.limits, slots, len as u64)?;
        // `len` is within `max_chunk_bytes`, a u32.
        let len = len as u32;
        let mut out = BytesMut::with_capacity(chunk_prefix_len(slots, len));
        out.put_u8(TAG_CHUNK);
        varint::put(&mut out, slots.into());
        varint::put(&mut out, len.into());
        Ok(out.freeze())
    }

    /// The end record, if every declared byte and slot has been sent.
    pub fn end(&mut self) -> Result<Bytes, BatchError> {
        if self.ended {
            return Err(BatchError::AlreadyEnded);
        }
        self.tally.check_complete(&self.header)?;
        self.ended = true;
        Ok(encode_end(
            self.tally.chunks as u32,
            self.tally.slots as u32,
            self.tally.bytes,
        ))
    }
}

/// Encodes an end record with the given counts (the encoder's; tests use it to forge bad ones).
pub fn encode_end(chunks: u32, slots: u32, bytes: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(END_LEN);
    out.put_u8(TAG_END);
    out.put_u32_le(chunks);
    out.put_u32_le(slots);
    out.put_u64_le(bytes);
    out.freeze()
}

/// What the decoder found next in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchEvent {
    /// The header: always first.
    Header(BatchHeader),
    /// A chunk, in stream order.
    Chunk(Chunk),
    /// The end record: the batch arrived whole. Nothing may follow.
    End,
}

#[derive(Debug, Clone)]
enum State {
    Header,
    Body { header: BatchHeader, tally: Tally },
    Done,
}

/// The receiving side: turns buffered stream bytes into [`BatchEvent`]s, one at a time.
///
/// The driver appends what the stream delivers to a buffer and calls [`BatchDecoder::poll`] until
/// it returns `None` (more bytes needed); at the end of the stream it calls
/// [`BatchDecoder::finish`]. Chunk data is split off the buffer without copying.
#[derive(Debug, Clone)]
pub struct BatchDecoder {
    limits: BatchLimits,
    state: State,
}

impl BatchDecoder {
    /// A decoder expecting a header.
    pub fn new(limits: BatchLimits) -> Self {
        Self {
            limits,
            state: State::Header,
        }
    }

    /// The header, once decoded.
    pub fn header(&self) -> Option<&BatchHeader> {
        match &self.state {
            State::Body { header, .. } => Some(header),
            _ => None,
        }
    }

    /// Whether the end record has been decoded.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Decodes the next record from the front of `buffer`, removing its bytes; `None` if `buffer`
    /// does not hold a whole record yet.
    pub fn poll(&mut self, buffer: &mut BytesMut) -> Result<Option<BatchEvent>, BatchError> {
        match &mut self.state {
            State::Header => {
                if buffer.len() >= 2 && buffer[..2] != BATCH_MAGIC {
                    return Err(BatchError::BadMagic([buffer[0], buffer[1]]));
                }
                if buffer.len() < HEADER_FIXED_LEN {
                    return Ok(None);
                }
                let mut fixed = &buffer[2..HEADER_FIXED_LEN];
                let version = fixed.get_u8();
                if version != BATCH_VERSION {
                    return Err(BatchError::UnsupportedVersion(version));
                }
                let reserved = fixed.get_u8();
                if reserved != 0 {
                    return Err(BatchError::ReservedNotZero(reserved));
                }
                let protocol = fixed.get_u32_le();
                let batch_id = fixed.get_u64_le();
                let round = fixed.get_u64_le();
                let phase = fixed.get_u32_le();
                let slot_count = fixed.get_u32_le();
                let total_bytes = fixed.get_u64_le();
                let metadata_len = fixed.get_u32_le();
                check_limit(
                    "metadata",
                    metadata_len.into(),
                    self.limits.max_metadata_bytes.into(),
                )?;
                let len = HEADER_FIXED_LEN + metadata_len as usize;
                if buffer.len() < len {
                    return Ok(None);
                }
                let mut record = buffer.split_to(len).freeze();
                record.advance(HEADER_FIXED_LEN);
                let header = BatchHeader {
                    protocol,
                    batch_id,
                    round,
                    phase,
                    slot_count,
                    total_bytes,
                    metadata: record,
                };
                check_header(&header, &self.limits)?;
                self.state = State::Body {
                    header: header.clone(),
                    tally: Tally::default(),
                };
                Ok(Some(BatchEvent::Header(header)))
            }
            State::Body { header, tally } => {
                let Some(&tag) = buffer.first() else {
                    return Ok(None);
                };
                match tag {
                    TAG_CHUNK => {
                        let Some(prefix) = ChunkPrefix::parse(buffer)? else {
                            return Ok(None);
                        };
                        let ChunkPrefix {
                            slots,
                            len,
                            prefix_len,
                        } = prefix;
                        // Check before waiting for the data, so an oversized chunk is refused
                        // before its bytes are buffered.
                        let mut next = *tally;
                        next.add(header, &self.limits, slots, len.into())?;
                        if buffer.len() < prefix_len.saturating_add(len as usize) {
                            return Ok(None);
                        }
                        buffer.advance(prefix_len);
                        let data = buffer.split_to(len as usize).freeze();
                        *tally = next;
                        Ok(Some(BatchEvent::Chunk(Chunk { slots, data })))
                    }
                    TAG_END => {
                        if buffer.len() < END_LEN {
                            return Ok(None);
                        }
                        let mut record = &buffer[1..END_LEN];
                        let chunks = record.get_u32_le();
                        let slots = record.get_u32_le();
                        let bytes = record.get_u64_le();
                        tally.check_complete(header)?;
                        for (what, claimed, actual) in [
                            ("chunks", u64::from(chunks), tally.chunks),
                            ("slots", u64::from(slots), tally.slots),
                            ("bytes", bytes, tally.bytes),
                        ] {
                            if claimed != actual {
                                return Err(BatchError::EndMismatch {
                                    what,
                                    claimed,
                                    actual,
                                });
                            }
                        }
                        buffer.advance(END_LEN);
                        self.state = State::Done;
                        if !buffer.is_empty() {
                            return Err(BatchError::TrailingBytes(buffer.len()));
                        }
                        Ok(Some(BatchEvent::End))
                    }
                    other => Err(BatchError::UnknownRecord(other)),
                }
            }
            State::Done => {
                if buffer.is_empty() {
                    Ok(None)
                } else {
                    Err(BatchError::TrailingBytes(buffer.len()))
                }
            }
        }
    }

    /// The whole length (prefix and data) of the chunk record at the front of `buffer`, once its
    /// whole prefix (at most [`MAX_CHUNK_PREFIX_LEN`] bytes) has arrived and its length fits both
    /// [`BatchLimits::max_chunk_bytes`] and the bytes the header still has to come; `None` before,
    /// for any other record, and for a chunk [`BatchDecoder::poll`] will refuse (a malformed
    /// prefix included).
    ///
    /// A driver reserves room for the record before reading its data, so the data is copied into
    /// the buffer once instead of again each time the buffer grows. The length is bounded by what
    /// the batch may still deliver, so the reservation never exceeds the one chunk a receiver
    /// buffers anyway.
    pub fn next_record_len(&self, buffer: &[u8]) -> Option<usize> {
        let State::Body { header, tally } = &self.state else {
            return None;
        };
        if buffer.first() != Some(&TAG_CHUNK) {
            return None;
        }
        let ChunkPrefix {
            len, prefix_len, ..
        } = ChunkPrefix::parse(buffer).ok()??;
        let len = u64::from(len);
        let remaining = header.total_bytes.saturating_sub(tally.bytes);
        if len > u64::from(self.limits.max_chunk_bytes) || len > remaining {
            return None;
        }
        usize::try_from(len).ok()?.checked_add(prefix_len)
    }

    /// Called when the stream ended, with the bytes still buffered: an error unless the end
    /// record arrived and nothing followed it.
    pub fn finish(&self, buffered: usize) -> Result<(), BatchError> {
        match &self.state {
            State::Done if buffered == 0 => Ok(()),
            State::Done => Err(BatchError::TrailingBytes(buffered)),
            State::Header => Err(BatchError::Truncated {
                received: 0,
                declared: 0,
            }),
            State::Body { header, tally } => Err(BatchError::Truncated {
                received: tally.bytes,
                declared: header.total_bytes,
            }),
        }
    }
}

/// The prefix of a chunk record: its fields and its length.
#[derive(Debug, Clone, Copy)]
struct ChunkPrefix {
    slots: u32,
    len: u32,
    prefix_len: usize,
}

impl ChunkPrefix {
    /// Reads the prefix of the chunk record at the front of `buffer` (its tag included); `None`
    /// until the whole prefix has arrived, which is at most [`MAX_CHUNK_PREFIX_LEN`] bytes.
    fn parse(buffer: &[u8]) -> Result<Option<Self>, BatchError> {
        let mut rest = buffer.get(1..).unwrap_or_default();
        let mut field = |what| match varint::get_canonical_u32(&mut rest) {
            Ok(value) => Ok(Some(value)),
            Err(VarintError::Truncated) => Ok(None),
            Err(_) => Err(BatchError::BadVarint(what)),
        };
        let Some(slots) = field("slots")? else {
            return Ok(None);
        };
        let Some(len) = field("length")? else {
            return Ok(None);
        };
        Ok(Some(Self {
            slots,
            len,
            prefix_len: buffer.len() - rest.len(),
        }))
    }
}

/// Decodes a whole batch held in one buffer (tests, tools and the fuzz target).
pub fn decode_all(
    bytes: &[u8],
    limits: BatchLimits,
) -> Result<(BatchHeader, Vec<Chunk>), BatchError> {
    let mut decoder = BatchDecoder::new(limits);
    let mut buffer = BytesMut::from(bytes);
    let mut header = None;
    let mut chunks = Vec::new();
    while let Some(event) = decoder.poll(&mut buffer)? {
        match event {
            BatchEvent::Header(h) => header = Some(h),
            BatchEvent::Chunk(chunk) => chunks.push(chunk),
            BatchEvent::End => break,
        }
    }
    decoder.finish(buffer.len())?;
    match header {
        Some(header) => Ok((header, chunks)),
        None => Err(BatchError::Truncated {
            received: 0,
            declared: 0,
        }),
    }
}

/// Encodes a whole batch into one buffer (tests and tools; the driver streams the records).
pub fn encode_all(
    header: BatchHeader,
    chunks: &[Chunk],
    limits: BatchLimits,
) -> Result<Bytes, BatchError> {
    let (mut encoder, head) = BatchEncoder::new(header, limits)?;
    let mut out = BytesMut::from(&head[..]);
    for chunk in chunks {
        out.put_slice(&encoder.chunk(chunk.slots, chunk.data.len())?);
        out.put_slice(&chunk.data);
    }
    out.put_slice(&encoder.end()?);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests;
