//! Encode and decode the session's datagrams: data segments, selective ACKs and path probes.
//!
//! Every integer is little-endian. The first byte is the packet type.
//!
//! | type      | layout after the type byte                                                       |
//! |-----------|-----------------------------------------------------------------------------------|
//! | 1 `Data`  | flags (1: bit 0 = FIN), packet number (8), sequence (8), payload (rest)            |
//! | 2 `Ack`   | flags (1: bit 0 = echo present), range count (1), echo (8), cumulative (8),        |
//! |           | window end (8), then `count` ranges of start (8) and end (8), end exclusive        |
//! | 3 `Probe` | packet number (8)                                                                  |
//! | 4 `Close` | packet number (8): the sender removed the path this arrives on                     |
//!
//! A packet number names one transmission (never reused), a sequence number one segment of the
//! byte stream. An ACK says: every segment below `cumulative` arrived, so did every segment in the
//! ranges (ascending, disjoint, all above `cumulative`), the receiver accepts segments below
//! `window end`, and (if present) `echo` is the packet number that triggered this ACK. Decoding
//! checks every field before it allocates and never panics.

use bytes::{Buf, BufMut, Bytes, BytesMut};

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
/// Bytes of an ACK without ranges.
pub const ACK_HEADER_LEN: usize = 27;
/// Bytes per ACK range.
const RANGE_LEN: usize = 16;
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
    /// The ACK's window ends before its cumulative point.
    #[error("window end {window_end} is below the cumulative ack {cumulative}")]
    BadWindow {
        /// Advertised window end.
        window_end: u64,
        /// Cumulative point.
        cumulative: u64,
    },
    /// Bytes follow the last field of a fixed-size packet.
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
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
                out.put_u8(u8::from(data.fin));
                out.put_u64_le(data.packet_number);
                out.put_u64_le(data.seq);
                out.put_slice(&data.payload);
                out.freeze()
            }
            Packet::Ack(ack) => {
                let ranges = &ack.ranges[..ack.ranges.len().min(MAX_ACK_RANGES)];
                let mut out = BytesMut::with_capacity(ACK_HEADER_LEN + ranges.len() * RANGE_LEN);
                out.put_u8(TYPE_ACK);
                out.put_u8(u8::from(ack.echo.is_some()));
                out.put_u8(ranges.len() as u8);
                out.put_u64_le(ack.echo.unwrap_or(0));
                out.put_u64_le(ack.cumulative);
                out.put_u64_le(ack.window_end);
                for &(start, end) in ranges {
                    out.put_u64_le(start);
                    out.put_u64_le(end);
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
                if flags & !1 != 0 {
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
                    payload,
                }))
            }
            TYPE_ACK => {
                if len < ACK_HEADER_LEN {
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
                let expected = ACK_HEADER_LEN + count * RANGE_LEN;
                if len < expected {
                    return Err(truncated);
                }
                if len > expected {
                    return Err(CodecError::TrailingBytes(len - expected));
                }
                let echo = body.get_u64_le();
                let cumulative = body.get_u64_le();
                let window_end = body.get_u64_le();
                if window_end < cumulative {
                    return Err(CodecError::BadWindow {
                        window_end,
                        cumulative,
                    });
                }
                let mut ranges = Vec::with_capacity(count);
                let mut floor = cumulative;
                for _ in 0..count {
                    let start = body.get_u64_le();
                    let end = body.get_u64_le();
                    if start <= floor || end <= start {
                        return Err(CodecError::BadRanges);
                    }
                    floor = end;
                    ranges.push((start, end));
                }
                Ok(Packet::Ack(AckPacket {
                    echo: (flags & 1 == 1).then_some(echo),
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
        let data = Packet::Data(DataPacket {
            packet_number: 7,
            seq: 3,
            fin: true,
            payload: Bytes::from_static(b"hi"),
        });
        assert_eq!(
            data.encode().as_ref(),
            &[1, 1, 7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, b'h', b'i']
        );
        let probe = Packet::Probe { packet_number: 1 };
        assert_eq!(probe.encode().as_ref(), &[3, 1, 0, 0, 0, 0, 0, 0, 0]);
        let ack = Packet::Ack(AckPacket {
            echo: None,
            cumulative: 1,
            window_end: 2,
            ranges: vec![],
        });
        let mut expected = vec![2, 0, 0];
        expected.extend_from_slice(&[0; 8]);
        expected.extend_from_slice(&1u64.to_le_bytes());
        expected.extend_from_slice(&2u64.to_le_bytes());
        assert_eq!(ack.encode().as_ref(), expected.as_slice());
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
            payload: Bytes::from(vec![0; 11]),
        })
        .encode();
        assert!(matches!(
            Packet::decode(big, 10),
            Err(CodecError::PayloadTooLarge { .. })
        ));
        let overlapping = Packet::Ack(AckPacket {
            echo: Some(1),
            cumulative: 5,
            window_end: 100,
            ranges: vec![(7, 9), (8, 12)],
        })
        .encode();
        assert_eq!(Packet::decode(overlapping, 10), Err(CodecError::BadRanges));
    }

    fn packet() -> impl Strategy<Value = Packet> {
        prop_oneof![
            (
                any::<u64>(),
                any::<u64>(),
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(packet_number, seq, fin, payload)| Packet::Data(
                    DataPacket {
                        packet_number,
                        seq,
                        fin,
                        payload: payload.into(),
                    }
                )),
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
