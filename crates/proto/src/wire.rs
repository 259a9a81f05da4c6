//! Encode a message once and frame it for any number of destinations; decode frames by slicing.
//!
//! # Design
//!
//! A frame is `[frame header][msg header][dst][payload]`, every integer little-endian:
//!
//! | part         | bytes | fields                                                                  |
//! |--------------|-------|-------------------------------------------------------------------------|
//! | frame header | 8     | magic `"MW"` (2), wire version (1), reserved = 0 (1), body length (u32)  |
//! | msg header   | 16    | kind (1), flags (1), reserved = 0 (2), protocol (u32), message id (u64)  |
//! | dst          | 32    | the destination's [`PeerId`]                                            |
//! | payload      | n     | opaque bytes; `n = body length - 48`                                   |
//!
//! The body length counts everything after the frame header, so a reader learns the whole frame's
//! size from its first eight bytes and checks it against [`Limits`] before it allocates anything.
//!
//! The frame header and msg header do not depend on the destination, so [`EncodedMessage`] holds them
//! in one shared 24-byte [`Bytes`] next to the caller's payload [`Bytes`]. Sending to a peer writes
//! three chunks: the shared head, that peer's destination (a `Bytes` the driver makes once per peer)
//! and the shared payload. Fan-out to a thousand peers therefore costs one encoding and reference-count
//! increments; the payload is never copied (the Safe Network lesson, `docs/lessons.md`).
//!
//! Decoding never copies: [`decode_body`] slices the received buffer. Every malformed input is a
//! [`WireError`]; nothing here panics on bytes from a peer. The byte layout is frozen by the golden
//! vectors in this module's tests: changing the format means changing them on purpose.

use bytes::{BufMut, Bytes, BytesMut};

use crate::peer_id::{PeerId, PEER_ID_LEN};

/// The two bytes that open every frame: `"MW"`.
pub const MAGIC: [u8; 2] = *b"MW";
/// The wire version this code writes and accepts.
pub const WIRE_VERSION: u8 = 1;
/// Length of the frame header.
pub const FRAME_HEADER_LEN: usize = 8;
/// Length of the message header.
pub const MSG_HEADER_LEN: usize = 16;
/// Length of the destination field.
pub const DST_LEN: usize = PEER_ID_LEN;
/// Bytes shared by every destination of one message: frame header and message header.
pub const HEAD_LEN: usize = FRAME_HEADER_LEN + MSG_HEADER_LEN;
/// Smallest possible body (a frame with an empty payload), as counted by the body length.
pub const MIN_BODY_LEN: usize = MSG_HEADER_LEN + DST_LEN;
/// Bytes a frame adds to its payload.
pub const FRAME_OVERHEAD: usize = HEAD_LEN + DST_LEN;

/// Default largest payload accepted or sent: 16 MiB. Bulk data travels as a stream of frames.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 16 * 1024 * 1024;

/// Size limits checked before any allocation, on both the encoding and the decoding side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload in bytes.
    pub max_payload_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

/// What a frame carries; the driver routes on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A one-way message to the protocol's subscribers.
    Message = 1,
    /// A request that expects exactly one `Response` or `ErrorResponse` on the same stream.
    Request = 2,
    /// A successful answer to a request.
    Response = 3,
    /// A failed answer: the payload is an [`ErrorCode`] byte followed by a UTF-8 reason.
    ErrorResponse = 4,
}

impl Kind {
    /// Reads a kind byte.
    pub fn from_byte(byte: u8) -> Result<Self, WireError> {
        match byte {
            1 => Ok(Self::Message),
            2 => Ok(Self::Request),
            3 => Ok(Self::Response),
            4 => Ok(Self::ErrorResponse),
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

/// Why a request failed, as carried in an `ErrorResponse` payload's first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorCode {
    /// The handler ran and returned an error.
    Handler = 1,
    /// No handler is registered for the protocol.
    NoHandler = 2,
    /// The request exceeded the responder's limits.
    TooLarge = 3,
    /// The responder could not decode the request.
    Malformed = 4,
    /// The responder had no room for the request at the moment (its request budget was full):
    /// the request was not read, and may be sent again later.
    Busy = 5,
}

impl ErrorCode {
    /// Reads an error-code byte.
    pub fn from_byte(byte: u8) -> Result<Self, WireError> {
        match byte {
            1 => Ok(Self::Handler),
            2 => Ok(Self::NoHandler),
            3 => Ok(Self::TooLarge),
            4 => Ok(Self::Malformed),
            5 => Ok(Self::Busy),
            other => Err(WireError::UnknownErrorCode(other)),
        }
    }
}

/// Which service a frame belongs to. Services pick distinct numbers; the driver routes on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtocolId(pub u32);

/// The destination-independent fields of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgHeader {
    /// What the frame carries.
    pub kind: Kind,
    /// Service-defined flag bits, carried unchanged.
    pub flags: u8,
    /// The service the frame belongs to.
    pub protocol: ProtocolId,
    /// Sender-chosen identifier: message number or request id.
    pub message_id: u64,
}

/// A malformed or oversized frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The first two bytes are not `"MW"`.
    #[error("bad magic bytes {0:02x?}, expected \"MW\"")]
    BadMagic([u8; 2]),
    /// A wire version this code does not speak.
    #[error("unsupported wire version {0} (this node speaks {WIRE_VERSION})")]
    UnsupportedVersion(u8),
    /// A reserved field is not zero.
    #[error("reserved field is {0:#x}, must be 0")]
    ReservedNotZero(u16),
    /// The body cannot even hold the message header and destination.
    #[error("frame body of {len} bytes is shorter than the {MIN_BODY_LEN}-byte minimum")]
    BodyTooShort {
        /// Announced body length.
        len: u32,
    },
    /// The payload is larger than the configured limit.
    #[error("payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// Payload length in bytes.
        len: u64,
        /// The configured limit.
        max: u32,
    },
    /// A kind byte this version does not define.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// An error-code byte this version does not define.
    #[error("unknown error code {0}")]
    UnknownErrorCode(u8),
    /// Fewer bytes than the frame announced.
    #[error("frame truncated: expected {expected} bytes, got {actual}")]
    Truncated {
        /// Bytes the frame needs.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
    /// More bytes than the frame announced.
    #[error("{0} trailing bytes after the frame")]
    TrailingBytes(usize),
    /// An error response without its code byte.
    #[error("error response has no error code")]
    EmptyErrorResponse,
}

/// A message encoded once: its shared head (frame header and message header) and its payload.
///
/// Cloning is cheap (two reference counts). [`EncodedMessage::chunks_for`] yields the three chunks
/// of one destination's frame, ready for a vectored write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedMessage {
    head: Bytes,
    payload: Bytes,
}

impl EncodedMessage {
    /// Encodes `header` and takes `payload` by reference count, after checking the payload limit.
    pub fn encode(header: &MsgHeader, payload: Bytes, limits: &Limits) -> Result<Self, WireError> {
        Ok(Self {
            head: Self::encode_head(header, payload.len(), limits)?,
            payload,
        })
    }

    /// The head (frame header and message header) of a message whose payload is `payload_len`
    /// bytes, after checking the payload limit: for a sender that writes the destination and the
    /// payload's pieces after it itself (a request whose header and content are separate
    /// buffers, so the content is not copied to join them).
    pub fn encode_head(
        header: &MsgHeader,
        payload_len: usize,
        limits: &Limits,
    ) -> Result<Bytes, WireError> {
        check_payload_len(payload_len as u64, limits)?;
        let body_len = (MIN_BODY_LEN + payload_len) as u32;
        let mut head = BytesMut::with_capacity(HEAD_LEN);
        head.put_slice(&MAGIC);
        head.put_u8(WIRE_VERSION);
        head.put_u8(0);
        head.put_u32_le(body_len);
        head.put_u8(header.kind as u8);
        head.put_u8(header.flags);
        head.put_u16_le(0);
        head.put_u32_le(header.protocol.0);
        head.put_u64_le(header.message_id);
        Ok(head.freeze())
    }

    /// The three chunks of this message's frame for one destination: head, `dst`, payload.
    ///
    /// `dst` is a [`Destination`], made once per peer, so this allocates nothing.
    pub fn chunks_for(&self, dst: &Destination) -> [Bytes; 3] {
        [self.head.clone(), dst.0.clone(), self.payload.clone()]
    }

    /// Total frame length on the wire.
    pub fn frame_len(&self) -> usize {
        FRAME_OVERHEAD + self.payload.len()
    }

    /// The payload, shared.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Writes the whole frame for `dst` into one contiguous buffer (tests and tools; the driver uses
    /// [`EncodedMessage::chunks_for`]).
    pub fn to_contiguous(&self, dst: &Destination) -> Bytes {
        let mut out = BytesMut::with_capacity(self.frame_len());
        for chunk in self.chunks_for(dst) {
            out.put_slice(&chunk);
        }
        out.freeze()
    }
}

/// A peer's identity laid out as the `dst` field, made once per peer and shared by every frame to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination(Bytes);

impl Destination {
    /// Lays out `peer` as a destination field.
    pub fn new(peer: &PeerId) -> Self {
        // An owner-backed `Bytes` is reference-counted from the start: unlike a `Vec`-backed one,
        // its first clone does not allocate, so no destination ever costs an allocation per send.
        Self(Bytes::from_owner(*peer.as_bytes()))
    }

    /// The field's bytes, shared.
    pub fn bytes(&self) -> Bytes {
        self.0.clone()
    }
}

/// A decoded frame header: the version and how many body bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Number of bytes after the frame header.
    pub body_len: u32,
}

impl FrameHeader {
    /// Length of the payload this frame carries.
    pub fn payload_len(&self) -> usize {
        self.body_len as usize - MIN_BODY_LEN
    }
}

/// A decoded frame. `payload` is a slice of the buffer it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The message header.
    pub header: MsgHeader,
    /// The destination peer named in the frame.
    pub dst: PeerId,
    /// The payload bytes, shared with the receive buffer.
    pub payload: Bytes,
}

fn check_payload_len(len: u64, limits: &Limits) -> Result<(), WireError> {
    if len > u64::from(limits.max_payload_bytes) {
        return Err(WireError::PayloadTooLarge {
            len,
            max: limits.max_payload_bytes,
        });
    }
    Ok(())
}

/// Checks the eight-byte frame header: magic, version, reserved byte and body length within limits.
pub fn decode_frame_header(
    bytes: &[u8; FRAME_HEADER_LEN],
    limits: &Limits,
) -> Result<FrameHeader, WireError> {
    let magic = [bytes[0], bytes[1]];
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if bytes[2] != WIRE_VERSION {
        return Err(WireError::UnsupportedVersion(bytes[2]));
    }
    if bytes[3] != 0 {
        return Err(WireError::ReservedNotZero(u16::from(bytes[3])));
    }
    let body_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if (body_len as usize) < MIN_BODY_LEN {
        return Err(WireError::BodyTooShort { len: body_len });
    }
    check_payload_len(u64::from(body_len) - MIN_BODY_LEN as u64, limits)?;
    Ok(FrameHeader { body_len })
}

/// Decodes a frame body (everything after the frame header) whose header was already checked.
/// The payload is a slice of `body`; nothing is copied.
pub fn decode_body(header: &FrameHeader, body: Bytes) -> Result<Frame, WireError> {
    let expected = header.body_len as usize;
    if body.len() < expected {
        return Err(WireError::Truncated {
            expected,
            actual: body.len(),
        });
    }
    if body.len() > expected {
        return Err(WireError::TrailingBytes(body.len() - expected));
    }
    let (header, dst) = decode_message_head(&body[..MIN_BODY_LEN])?;
    Ok(Frame {
        header,
        dst,
        payload: body.slice(MIN_BODY_LEN..),
    })
}

/// Decodes the first [`MIN_BODY_LEN`] bytes of a frame body: the message header and the
/// destination (a receiver that reads the payload piece by piece reads these first). `Truncated`
/// if `head` is shorter; bytes after them are ignored.
pub fn decode_message_head(head: &[u8]) -> Result<(MsgHeader, PeerId), WireError> {
    if head.len() < MIN_BODY_LEN {
        return Err(WireError::Truncated {
            expected: MIN_BODY_LEN,
            actual: head.len(),
        });
    }
    let kind = Kind::from_byte(head[0])?;
    let flags = head[1];
    let reserved = u16::from_le_bytes([head[2], head[3]]);
    if reserved != 0 {
        return Err(WireError::ReservedNotZero(reserved));
    }
    let protocol = ProtocolId(u32::from_le_bytes([head[4], head[5], head[6], head[7]]));
    let mut id = [0u8; 8];
    id.copy_from_slice(&head[8..16]);
    let mut dst = [0u8; PEER_ID_LEN];
    dst.copy_from_slice(&head[MSG_HEADER_LEN..MIN_BODY_LEN]);
    Ok((
        MsgHeader {
            kind,
            flags,
            protocol,
            message_id: u64::from_le_bytes(id),
        },
        PeerId::from_bytes(dst),
    ))
}

/// Decodes exactly one complete frame from `bytes`, slicing the payload out of it.
pub fn decode(bytes: &Bytes, limits: &Limits) -> Result<Frame, WireError> {
    if bytes.len() < FRAME_HEADER_LEN {
        return Err(WireError::Truncated {
            expected: FRAME_HEADER_LEN,
            actual: bytes.len(),
        });
    }
    let mut head = [0u8; FRAME_HEADER_LEN];
    head.copy_from_slice(&bytes[..FRAME_HEADER_LEN]);
    let header = decode_frame_header(&head, limits)?;
    decode_body(&header, bytes.slice(FRAME_HEADER_LEN..))
}

/// Splits a byte stream into frames as bytes arrive, without copying payloads.
///
/// Feed received bytes into a [`BytesMut`] and call [`FrameDecoder::decode`] until it returns
/// `Ok(None)`. The decoder reserves room for a frame only after its header passed the limits.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    limits: Limits,
    pending: Option<FrameHeader>,
}

impl FrameDecoder {
    /// A decoder that enforces `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            pending: None,
        }
    }

    /// Takes one complete frame off the front of `buffer`, or returns `Ok(None)` if more bytes are
    /// needed. After an error the stream is unusable: close it.
    pub fn decode(&mut self, buffer: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let header = match self.pending {
            Some(header) => header,
            None => {
                if buffer.len() < FRAME_HEADER_LEN {
                    return Ok(None);
                }
                let mut head = [0u8; FRAME_HEADER_LEN];
                head.copy_from_slice(&buffer[..FRAME_HEADER_LEN]);
                let header = decode_frame_header(&head, &self.limits)?;
                let _ = buffer.split_to(FRAME_HEADER_LEN);
                self.pending = Some(header);
                header
            }
        };
        let body_len = header.body_len as usize;
        if buffer.len() < body_len {
            buffer.reserve(body_len - buffer.len());
            return Ok(None);
        }
        self.pending = None;
        let body = buffer.split_to(body_len).freeze();
        decode_body(&header, body).map(Some)
    }

    /// Whether a frame has started but not finished: a stream ending now was truncated.
    pub fn is_mid_frame(&self, buffer: &BytesMut) -> bool {
        self.pending.is_some() || !buffer.is_empty()
    }
}

/// Encodes an `ErrorResponse` payload: the code byte, then the UTF-8 reason.
pub fn encode_error_payload(code: ErrorCode, reason: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(1 + reason.len());
    out.put_u8(code as u8);
    out.put_slice(reason.as_bytes());
    out.freeze()
}

/// Decodes an `ErrorResponse` payload into its code and reason (invalid UTF-8 is replaced).
pub fn decode_error_payload(payload: &[u8]) -> Result<(ErrorCode, String), WireError> {
    let (&code, reason) = payload.split_first().ok_or(WireError::EmptyErrorResponse)?;
    Ok((
        ErrorCode::from_byte(code)?,
        String::from_utf8_lossy(reason).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn sample() -> (EncodedMessage, Destination) {
        let header = MsgHeader {
            kind: Kind::Request,
            flags: 0x81,
            protocol: ProtocolId(0x0102_0304),
            message_id: 0x1122_3344_5566_7788,
        };
        let message =
            EncodedMessage::encode(&header, Bytes::from_static(b"hello"), &Limits::default())
                .unwrap();
        let mut dst = [0u8; 32];
        for (i, byte) in dst.iter_mut().enumerate() {
            *byte = i as u8;
        }
        (message, Destination::new(&PeerId::from_bytes(dst)))
    }

    // Golden vector: changing any byte here changes the wire format.
    const GOLDEN_REQUEST: &str = concat!(
        "4d57",
        "01",
        "00",
        "35000000", // frame header: magic, version, reserved, body len 53
        "02",
        "81",
        "0000",
        "04030201",
        "8877665544332211", // msg header
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", // dst
        "68656c6c6f",       // payload "hello"
    );

    #[test]
    fn golden_request_frame() {
        let (message, dst) = sample();
        let frame = message.to_contiguous(&dst);
        assert_eq!(hex(&frame), GOLDEN_REQUEST);
        let decoded = decode(&frame, &Limits::default()).unwrap();
        assert_eq!(decoded.header.kind, Kind::Request);
        assert_eq!(decoded.header.flags, 0x81);
        assert_eq!(decoded.header.protocol, ProtocolId(0x0102_0304));
        assert_eq!(decoded.header.message_id, 0x1122_3344_5566_7788);
        assert_eq!(&decoded.payload[..], b"hello");
    }

    #[test]
    fn golden_empty_error_response() {
        let header = MsgHeader {
            kind: Kind::ErrorResponse,
            flags: 0,
            protocol: ProtocolId(7),
            message_id: 1,
        };
        let payload = encode_error_payload(ErrorCode::NoHandler, "none");
        let message = EncodedMessage::encode(&header, payload, &Limits::default()).unwrap();
        let frame = message.to_contiguous(&Destination::new(&PeerId::from_bytes([0xff; 32])));
        assert_eq!(
            hex(&frame),
            concat!(
                "4d57",
                "01",
                "00",
                "35000000",
                "04",
                "00",
                "0000",
                "07000000",
                "0100000000000000",
                "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                "02",
                "6e6f6e65",
            )
        );
        let decoded = decode(&frame, &Limits::default()).unwrap();
        assert_eq!(
            decode_error_payload(&decoded.payload).unwrap(),
            (ErrorCode::NoHandler, "none".to_string())
        );
    }

    #[test]
    fn payload_is_sliced_not_copied() {
        let (message, dst) = sample();
        let frame = message.to_contiguous(&dst);
        let decoded = decode(&frame, &Limits::default()).unwrap();
        let start = frame.as_ptr() as usize + FRAME_OVERHEAD;
        assert_eq!(decoded.payload.as_ptr() as usize, start);
    }

    #[test]
    fn chunks_share_head_and_payload() {
        let (message, dst) = sample();
        let a = message.chunks_for(&dst);
        let b = message.chunks_for(&dst);
        assert_eq!(a[0].as_ptr(), b[0].as_ptr());
        assert_eq!(a[2].as_ptr(), b[2].as_ptr());
        assert_eq!(a[2].as_ptr(), message.payload().as_ptr());
    }

    #[test]
    fn rejects_each_malformed_header_field() {
        let (message, dst) = sample();
        let good = message.to_contiguous(&dst).to_vec();
        let limits = Limits::default();
        let with = |index: usize, value: u8| {
            let mut bytes = good.clone();
            bytes[index] = value;
            decode(&Bytes::from(bytes), &limits)
        };
        assert_eq!(with(0, b'X'), Err(WireError::BadMagic([b'X', b'W'])));
        assert_eq!(with(2, 9), Err(WireError::UnsupportedVersion(9)));
        assert_eq!(with(3, 1), Err(WireError::ReservedNotZero(1)));
        assert_eq!(with(8, 0), Err(WireError::UnknownKind(0)));
        assert_eq!(with(10, 1), Err(WireError::ReservedNotZero(1)));
        assert_eq!(
            decode(&Bytes::from(good[..good.len() - 1].to_vec()), &limits),
            Err(WireError::Truncated {
                expected: 53,
                actual: 52
            })
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            decode(&Bytes::from(long), &limits),
            Err(WireError::TrailingBytes(1))
        );
        let mut short = good.clone();
        short[4..8].copy_from_slice(&10u32.to_le_bytes());
        assert_eq!(
            decode(&Bytes::from(short), &limits),
            Err(WireError::BodyTooShort { len: 10 })
        );
    }

    #[test]
    fn limits_apply_before_allocation_on_both_sides() {
        let limits = Limits {
            max_payload_bytes: 4,
        };
        let header = MsgHeader {
            kind: Kind::Message,
            flags: 0,
            protocol: ProtocolId(1),
            message_id: 0,
        };
        assert_eq!(
            EncodedMessage::encode(&header, Bytes::from_static(b"hello"), &limits),
            Err(WireError::PayloadTooLarge { len: 5, max: 4 })
        );
        // A header announcing a 4 GiB body is refused from its first eight bytes alone.
        let mut head = [0u8; FRAME_HEADER_LEN];
        head[..4].copy_from_slice(&[b'M', b'W', WIRE_VERSION, 0]);
        head[4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_frame_header(&head, &limits),
            Err(WireError::PayloadTooLarge { .. })
        ));
        let mut decoder = FrameDecoder::new(limits);
        let mut buffer = BytesMut::from(&head[..]);
        assert!(decoder.decode(&mut buffer).is_err());
        assert!(buffer.capacity() < 1024);
    }

    #[test]
    fn every_error_code_round_trips() {
        use ErrorCode::*;
        for code in [Handler, NoHandler, TooLarge, Malformed, Busy] {
            let payload = encode_error_payload(code, "why");
            assert_eq!(
                decode_error_payload(&payload),
                Ok((code, "why".to_string()))
            );
        }
    }

    #[test]
    fn error_payload_rejects_empty_and_unknown_codes() {
        assert_eq!(
            decode_error_payload(&[]),
            Err(WireError::EmptyErrorResponse)
        );
        assert_eq!(
            decode_error_payload(&[99]),
            Err(WireError::UnknownErrorCode(99))
        );
    }

    fn arb_header() -> impl Strategy<Value = MsgHeader> {
        (1u8..=4, any::<u8>(), any::<u32>(), any::<u64>()).prop_map(
            |(kind, flags, protocol, message_id)| MsgHeader {
                kind: Kind::from_byte(kind).unwrap(),
                flags,
                protocol: ProtocolId(protocol),
                message_id,
            },
        )
    }

    proptest! {
        #[test]
        fn round_trips_arbitrary_frames(
            header in arb_header(),
            dst in any::<[u8; 32]>(),
            payload in proptest::collection::vec(any::<u8>(), 0..2048),
        ) {
            let limits = Limits::default();
            let message = EncodedMessage::encode(&header, Bytes::from(payload.clone()), &limits).unwrap();
            let peer = PeerId::from_bytes(dst);
            let frame = message.to_contiguous(&Destination::new(&peer));
            prop_assert_eq!(frame.len(), payload.len() + FRAME_OVERHEAD);
            let decoded = decode(&frame, &limits).unwrap();
            prop_assert_eq!(decoded.header, header);
            prop_assert_eq!(decoded.dst, peer);
            prop_assert_eq!(&decoded.payload[..], &payload[..]);
        }

        #[test]
        fn stream_decoder_reassembles_any_split(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8),
            cuts in proptest::collection::vec(1usize..64, 1..64),
        ) {
            let limits = Limits::default();
            let dst = Destination::new(&PeerId::from_bytes([3; 32]));
            let mut stream = Vec::new();
            for (i, payload) in payloads.iter().enumerate() {
                let header = MsgHeader { kind: Kind::Message, flags: 0, protocol: ProtocolId(1), message_id: i as u64 };
                let message = EncodedMessage::encode(&header, Bytes::from(payload.clone()), &limits).unwrap();
                stream.extend_from_slice(&message.to_contiguous(&dst));
            }
            let mut decoder = FrameDecoder::new(limits);
            let mut buffer = BytesMut::new();
            let mut frames = Vec::new();
            let mut offset = 0;
            let mut cut = cuts.iter().cycle();
            while offset < stream.len() {
                let end = (offset + cut.next().unwrap()).min(stream.len());
                buffer.extend_from_slice(&stream[offset..end]);
                offset = end;
                while let Some(frame) = decoder.decode(&mut buffer).unwrap() {
                    frames.push(frame);
                }
            }
            prop_assert!(!decoder.is_mid_frame(&buffer));
            prop_assert_eq!(frames.len(), payloads.len());
            for (i, (frame, payload)) in frames.iter().zip(&payloads).enumerate() {
                prop_assert_eq!(frame.header.message_id, i as u64);
                prop_assert_eq!(&frame.payload[..], &payload[..]);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_or_overallocate(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            max in 0u32..256,
        ) {
            let limits = Limits { max_payload_bytes: max };
            let _ = decode(&Bytes::from(bytes.clone()), &limits);
            let mut decoder = FrameDecoder::new(limits);
            let mut buffer = BytesMut::from(&bytes[..]);
            while let Ok(Some(frame)) = decoder.decode(&mut buffer) {
                prop_assert!(frame.payload.len() <= max as usize);
            }
            // The decoder never reserves more than one frame within the limits.
            prop_assert!(buffer.capacity() <= bytes.len().max(FRAME_OVERHEAD + max as usize) * 2 + 64);
        }

        #[test]
        fn frame_headers_beyond_limits_are_refused(body_len in any::<u32>(), max in any::<u32>()) {
            let mut head = [0u8; FRAME_HEADER_LEN];
            head[..4].copy_from_slice(&[b'M', b'W', WIRE_VERSION, 0]);
            head[4..].copy_from_slice(&body_len.to_le_bytes());
            let result = decode_frame_header(&head, &Limits { max_payload_bytes: max });
            let fits = body_len as usize >= MIN_BODY_LEN
                && u64::from(body_len) - MIN_BODY_LEN as u64 <= u64::from(max);
            prop_assert_eq!(result.is_ok(), fits);
        }
    }
}
