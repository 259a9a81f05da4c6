//! Encode and decode the session's datagrams: data segments, selective ACKs and path probes.
//!
//! Fixed-width integers are little-endian; `v` marks an unsigned LEB128 varint (7 bits per byte,
//! low group first, at most 10 bytes; [`meshwire_proto::varint`]). The first byte is the packet
//! type.
//!
//! | type      | layout after the type byte                                                       |
//! |-----------|-----------------------------------------------------------------------------------|
//! | 1 `Data`  | flags (1: bit 0 = FIN, bit 1 = window-limited), packet number (8), sequence (8), |
//! |           | payload (rest)                                                                    |
//! | 2 `Ack`   | flags (1: bit 0 = echo present), range count (1), echo (v, only if present),       |
//! |           | cumulative (v), window end − cumulative (v), then `count` ranges, each as its      |
//! |           | start − (the previous range's end, or cumulative) − 1 (v) and its length − 1 (v)   |
//! | 3 `Probe` | packet number (8)                                                                  |
//! | 4 `Close` | packet number (8): the sender removed the path this arrives on                     |
//!
//! ACKs are varints because the receiver sends one per arrival: with 32 ranges of fixed 16-byte
//! pairs an ACK took 539 B, and through a relay (whose per-path bucket counts both directions)
//! a lossy transfer's ACKs took a third of the bytes the data did. Gaps and lengths of a few
//! segments take one byte each.
//!
//! A packet number names one transmission (never reused), a sequence number one segment of the
//! byte stream. An ACK says: every segment below `cumulative` arrived, so did every segment in the
//! ranges (ascending, disjoint, all above `cumulative`), the receiver accepts segments below
//! `window end`, and (if present) `echo` is the packet number that triggered this ACK. Decoding
//! checks every field before it allocates and never panics.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use meshwire_proto::varint::{self, VarintError};

/// Type byte of a data segment.
const TYPE_DATA: u8 = 1;
/// Type byte of an acknowledgement.
const TYPE_ACK: u8 = 2;
/// Type byte of a path probe.
const TYPE_PROBE: u8 = 3;
/// Type byte of a path close.
const TYPE_CLOSE: u8 = 4;
/// Bytes of a probe or a path close: the type and a packet number.
const NUMBERED_LEN: usize = 9;
/// Bytes before a data segment's payload.
pub const DATA_HEADER_LEN: usize = 18;
/// Bytes of the shortest ACK: type, flags, count, and one-byte cumulative and window varints.
const ACK_MIN_LEN: usize = 5;
/// Most bytes of one varint (a `u64` in 7-bit groups).
const MAX_VARINT_LEN: usize = varint::MAX_LEN_U64;
/// Most ranges one ACK carries.
pub const MAX_ACK_RANGES: usize = 32;

/// Why a datagram is not a valid session packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The datagram ends before its fixed fields do.
    #[error("truncated packet: {len} bytes")]
    Truncated {
        /// Length received.
        len: usize,
    },
    /// The type byte is not one this version knows.
    #[error("unknown packet type {0}")]
    UnknownType(u8),
    /// Flag bits this version does not define are set.
    #[error("unknown flags {0:#04x}")]
    UnknownFlags(u8),
    /// A data segment's payload exceeds the session MTU.
    #[error("payload of {len} bytes exceeds the mtu of {mtu}")]
    PayloadTooLarge {
        /// Payload length.
        len: usize,
        /// The limit.
        mtu: usize,
    },
    /// More ACK ranges than [`MAX_ACK_RANGES`].
    #[error("{0} ack ranges exceed the limit")]
    TooManyRanges(usize),
    /// The ACK's ranges are empty, unordered, overlapping or not above the cumulative point.
    #[error("malformed ack ranges")]
    BadRanges,
    /// The ACK's window, counted from its cumulative point, ends past the last sequence number.
    #[error("a window of {window} segments past the cumulative ack {cumulative} overflows")]
    BadWindow {
        /// Segments the window extends past `cumulative`.
        window: u64,
        /// Cumulative point.
        cumulative: u64,
    },
    /// Bytes follow the last field of a packet.
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
    /// A varint runs past 10 bytes or past the range of a `u64`.
    #[error("malformed varint")]
    BadVarint,
}

/// Reads an unsigned LEB128 varint from the front of `body`, a datagram of `len` bytes: padded
/// encodings are accepted, more than [`MAX_VARINT_LEN`] bytes or a value past a `u64` is
/// [`CodecError::BadVarint`], a datagram that ends inside the varint [`CodecError::Truncated`].
fn get_varint(body: &mut &[u8], len: usize) -> Result<u64, CodecError> {
    varint::get_u64(body).map_err(|error| match error {
        VarintError::Truncated => CodecError::Truncated { len },
        _ => CodecError::BadVarint,
    })
}

/// One segment of the byte stream in one transmission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPacket {
    /// This transmission's number.
    pub packet_number: u64,
    /// The segment's position in the stream, counted in segments.
    pub seq: u64,
    /// The stream ends with this segment.
    pub fin: bool,
    /// The sender has more new data and the receive window stops it after this segment.
    pub window_limited: bool,
    /// The segment's bytes.
    pub payload: Bytes,
}

/// A selective acknowledgement with the receiver's window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckPacket {
    /// The packet number that triggered this ACK, if one did.
    pub echo: Option<u64>,
    /// Every segment below this arrived.
    pub cumulative: u64,
    /// The receiver accepts segments below this.
    pub window_end: u64,
    /// Further received segments, as ascending disjoint half-open ranges above `cumulative`.
    pub ranges: Vec<(u64, u64)>,
}

/// A session datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// A stream segment.
    Data(DataPacket),
    /// An acknowledgement.
    Ack(AckPacket),
    /// A path probe: the receiver answers with an ACK echoing its number.
    Probe {
        /// The probe's number.
        packet_number: u64,
    },
    /// The sender removed the path this arrives on: stop sending and probing on it.
    Close {
        /// A packet number never used before by the sender, so a replayed close is recognised.
        packet_number: u64,
    },
}

impl Packet {
    /// The packet as one datagram.
    pub fn encode(&self) -> Bytes {
        match self {
            Packet::Data(data) => {
                let mut out = BytesMut::with_capacity(DATA_HEADER_LEN + data.payload.len());
                out.put_u8(TYPE_DATA);
                out.put_u8(u8::from(data.fin) | (u8::from(data.window_limited) << 1));
                out.put_u64_le(data.packet_number);
                out.put_u64_le(data.seq);
                out.put_slice(&data.payload);
                out.freeze()
            }
            Packet::Ack(ack) => {
                let ranges = &ack.ranges[..ack.ranges.len().min(MAX_ACK_RANGES)];
                let mut out = BytesMut::with_capacity(3 + (3 + 2 * ranges.len()) * MAX_VARINT_LEN);
                out.put_u8(TYPE_ACK);
                out.put_u8(u8::from(ack.echo.is_some()));
                out.put_u8(ranges.len() as u8);
                if let Some(echo) = ack.echo {
                    varint::put(&mut out, echo);
                }
                varint::put(&mut out, ack.cumulative);
                varint::put(&mut out, ack.window_end.saturating_sub(ack.cumulative));
                // Valid ranges (ascending, disjoint, above `cumulative`) encode exactly; the
                // saturation only keeps an invalid one from panicking.
                let mut floor = ack.cumulative;
                for &(start, end) in ranges {
                    varint::put(&mut out, start.saturating_sub(floor).saturating_sub(1));
                    varint::put(&mut out, end.saturating_sub(start).saturating_sub(1));
                    floor = end;
                }
                out.freeze()
            }
            Packet::Probe { packet_number } => numbered(TYPE_PROBE, *packet_number),
            Packet::Close { packet_number } => numbered(TYPE_CLOSE, *packet_number),
        }
    }

    /// Decodes one datagram; data payloads longer than `mtu` are rejected. The payload is a slice
    /// of `datagram`, not a copy.
    pub fn decode(datagram: Bytes, mtu: usize) -> Result<Packet, CodecError> {
        let len = datagram.len();
        let truncated = CodecError::Truncated { len };
        let Some(&kind) = datagram.first() else {
            return Err(truncated);
        };
        match kind {
            TYPE_DATA => {
                if len < DATA_HEADER_LEN {
                    return Err(truncated);
                }
                let mut header = &datagram[1..DATA_HEADER_LEN];
                let flags = header.get_u8();
                if flags & !3 != 0 {
                    return Err(CodecError::UnknownFlags(flags));
                }
                let packet_number = header.get_u64_le();
                let seq = header.get_u64_le();
                let payload = datagram.slice(DATA_HEADER_LEN..);
                if payload.len() > mtu {
                    return Err(CodecError::PayloadTooLarge {
                        len: payload.len(),
                        mtu,
                    });
                }
                Ok(Packet::Data(DataPacket {
                    packet_number,
                    seq,
                    fin: flags & 1 == 1,
                    window_limited: flags & 2 == 2,
                    payload,
                }))
            }
            TYPE_ACK => {
                if len < ACK_MIN_LEN {
                    return Err(truncated);
                }
                let mut body = &datagram[1..];
                let flags = body.get_u8();
                if flags & !1 != 0 {
                    return Err(CodecError::UnknownFlags(flags));
                }
                let count = usize::from(body.get_u8());
                if count > MAX_ACK_RANGES {
                    return Err(CodecError::TooManyRanges(count));
                }
                let echo = if flags & 1 == 1 {
                    Some(get_varint(&mut body, len)?)
                } else {
                    None
                };
                let cumulative = get_varint(&mut body, len)?;
                let extra = get_varint(&mut body, len)?;
                let window_end = cumulative.checked_add(extra).ok_or(CodecError::BadWindow {
                    window: extra,
                    cumulative,
                })?;
                let mut ranges = Vec::with_capacity(count);
                let mut floor = cumulative;
                for _ in 0..count {
                    let gap = get_varint(&mut body, len)?;
                    let length = get_varint(&mut body, len)?;
                    let start = floor
                        .checked_add(gap)
                        .and_then(|at| at.checked_add(1))
                        .ok_or(CodecError::BadRanges)?;
                    let end = start
                        .checked_add(length)
                        .and_then(|at| at.checked_add(1))
                        .ok_or(CodecError::BadRanges)?;
                    floor = end;
                    ranges.push((start, end));
                }
                if !body.is_empty() {
                    return Err(CodecError::TrailingBytes(body.len()));
                }
                Ok(Packet::Ack(AckPacket {
                    echo,
                    cumulative,
                    window_end,
                    ranges,
                }))
            }
            TYPE_PROBE | TYPE_CLOSE => {
                if len < NUMBERED_LEN {
                    return Err(truncated);
                }
                if len > NUMBERED_LEN {
                    return Err(CodecError::TrailingBytes(len - NUMBERED_LEN));
                }
                let packet_number = (&datagram[1..NUMBERED_LEN]).get_u64_le();
                Ok(if kind == TYPE_PROBE {
                    Packet::Probe { packet_number }
                } else {
                    Packet::Close { packet_number }
                })
            }
            other => Err(CodecError::UnknownType(other)),
        }
    }
}

/// A probe or a close: the type byte and a packet number.
fn numbered(kind: u8, packet_number: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(NUMBERED_LEN);
    out.put_u8(kind);
    out.put_u64_le(packet_number);
    out.freeze()
}

/// Whether `datagram` is a path close (checked before a path is learned from it).
pub fn is_close(datagram: &[u8]) -> bool {
    datagram.first() == Some(&TYPE_CLOSE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn golden_vectors() {
        // Segment 3 in packet 7, payload "hi", with the flags byte set as given.
        let hi = |fin, window_limited| {
            Packet::Data(DataPacket {
                packet_number: 7,
                seq: 3,
                fin,
                window_limited,
                payload: Bytes::from_static(b"hi"),
            })
        };
        let wire = |flags| {
            [
                1, flags, 7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, b'h', b'i',
            ]
        };
        assert_eq!(hi(true, false).encode().as_ref(), &wire(1));
        let limited = hi(false, true);
        assert_eq!(limited.encode().as_ref(), &wire(2));
        let mut unknown = limited.encode().to_vec();
        unknown[1] = 4;
        assert_eq!(
            Packet::decode(Bytes::from(unknown), 10),
            Err(CodecError::UnknownFlags(4))
        );
        let probe = Packet::Probe { packet_number: 1 };
        assert_eq!(probe.encode().as_ref(), &[3, 1, 0, 0, 0, 0, 0, 0, 0]);
        let ack = Packet::Ack(AckPacket {
            echo: None,
            cumulative: 1,
            window_end: 2,
            ranges: vec![],
        });
        assert_eq!(ack.encode().as_ref(), &[2, 0, 0, 1, 1]);
        // Echo 300 (two varint bytes), cumulative 5, window end 105, ranges 7..9 and 10..11.
        let ack = Packet::Ack(AckPacket {
            echo: Some(300),
            cumulative: 5,
            window_end: 105,
            ranges: vec![(7, 9), (10, 11)],
        });
        assert_eq!(
            ack.encode().as_ref(),
            &[2, 1, 2, 0xac, 0x02, 5, 100, 1, 1, 0, 0]
        );
    }

    #[test]
    fn an_ack_of_many_ranges_stays_small() {
        let ranges = (0..MAX_ACK_RANGES as u64)
            .map(|index| (1_000_000 + 10 * index, 1_000_000 + 10 * index + 5))
            .collect();
        let ack = Packet::Ack(AckPacket {
            echo: Some(u64::from(u32::MAX)),
            cumulative: 999_000,
            window_end: 1_100_000,
            ranges,
        });
        assert!(ack.encode().len() <= 80, "{}", ack.encode().len());
    }

    #[test]
    fn rejects_bad_varints_and_overflowing_ranges() {
        // An eleven-byte varint, and a tenth byte carrying more than a u64's top bit.
        let mut long = vec![2, 0, 0];
        long.extend_from_slice(&[0x80; 10]);
        long.push(0);
        assert_eq!(
            Packet::decode(Bytes::from(long), 10),
            Err(CodecError::BadVarint)
        );
        let mut wide = vec![2, 0, 0];
        wide.extend_from_slice(&[0xff; 9]);
        wide.extend_from_slice(&[0x02, 0]);
        assert_eq!(
            Packet::decode(Bytes::from(wide), 10),
            Err(CodecError::BadVarint)
        );
        // A padded varint (1 in two bytes) is read as what it says, as before the shared reader.
        assert_eq!(
            Packet::decode(Bytes::from_static(&[2, 0, 0, 0x81, 0x00, 1]), 10),
            Ok(Packet::Ack(AckPacket {
                echo: None,
                cumulative: 1,
                window_end: 2,
                ranges: vec![],
            }))
        );
        // cumulative u64::MAX, window + 1.
        let mut window = vec![2, 0, 0];
        window.extend_from_slice(&[0xff; 9]);
        window.extend_from_slice(&[0x01, 1]);
        assert!(matches!(
            Packet::decode(Bytes::from(window), 10),
            Err(CodecError::BadWindow { .. })
        ));
        // cumulative u64::MAX - 1, one range just above it.
        let mut range = vec![2, 0, 1, 0xfe];
        range.extend_from_slice(&[0xff; 8]);
        range.extend_from_slice(&[0x01, 0, 0, 0]);
        assert_eq!(
            Packet::decode(Bytes::from(range), 10),
            Err(CodecError::BadRanges)
        );
        // A range count larger than the ranges present.
        assert_eq!(
            Packet::decode(Bytes::from_static(&[2, 0, 2, 1, 1, 0, 0]), 10),
            Err(CodecError::Truncated { len: 7 })
        );
        assert_eq!(
            Packet::decode(Bytes::from_static(&[2, 0, 0, 1, 1, 9]), 10),
            Err(CodecError::TrailingBytes(1))
        );
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(
            Packet::decode(Bytes::new(), 10),
            Err(CodecError::Truncated { len: 0 })
        );
        assert_eq!(
            Packet::decode(Bytes::from_static(&[9]), 10),
            Err(CodecError::UnknownType(9))
        );
        let big = Packet::Data(DataPacket {
            packet_number: 0,
            seq: 0,
            fin: false,
            window_limited: false,
            payload: Bytes::from(vec![0; 11]),
        })
        .encode();
        assert!(matches!(
            Packet::decode(big, 10),
            Err(CodecError::PayloadTooLarge { .. })
        ));
    }

    fn packet() -> impl Strategy<Value = Packet> {
        prop_oneof![
            (
                any::<u64>(),
                any::<u64>(),
                any::<bool>(),
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(packet_number, seq, fin, window_limited, payload)| {
                    Packet::Data(DataPacket {
                        packet_number,
                        seq,
                        fin,
                        window_limited,
                        payload: payload.into(),
                    })
                }),
            (
                proptest::option::of(any::<u64>()),
                0u64..1 << 40,
                0u64..1 << 20,
                proptest::collection::vec((1u64..100, 1u64..100), 0..MAX_ACK_RANGES)
            )
                .prop_map(|(echo, cumulative, extra, gaps)| {
                    let mut ranges = Vec::new();
                    let mut floor = cumulative;
                    for (gap, len) in gaps {
                        ranges.push((floor + gap, floor + gap + len));
                        floor += gap + len;
                    }
                    Packet::Ack(AckPacket {
                        echo,
                        cumulative,
                        window_end: cumulative + extra,
                        ranges,
                    })
                }),
            any::<u64>().prop_map(|packet_number| Packet::Probe { packet_number }),
            any::<u64>().prop_map(|packet_number| Packet::Close { packet_number }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(packet in packet()) {
            prop_assert_eq!(Packet::decode(packet.encode(), 64), Ok(packet));
        }

        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(packet) = Packet::decode(Bytes::from(bytes), 512) {
                prop_assert_eq!(Packet::decode(packet.encode(), 512), Ok(packet));
            }
        }
    }
}
