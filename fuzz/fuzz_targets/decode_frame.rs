//! Fuzz every decoder in `meshwire_proto::wire` with bytes a hostile peer could send.
//!
//! Input layout: `[limit][chunking][stream...]`
//!
//! * `limit` is the `max_payload_bytes` limit (0..=255), kept small so that frames announcing a
//!   payload over the limit, and frames right at it, are both easy for the fuzzer to reach.
//! * `chunking` seeds the sizes of the pieces the stream is fed to a [`FrameDecoder`] in: its top two
//!   bits pick the largest piece (1 byte, 8, 64 or the whole stream), the rest seed a xorshift.
//! * `stream` goes to `wire::decode`, `wire::decode_frame_header`, `FrameDecoder` and
//!   `wire::decode_error_payload`.
//!
//! Invariants checked (a panic here is a bug in the codec):
//! * no decoder panics;
//! * every decoded frame's payload is within the limit;
//! * every decoded frame re-encodes (`EncodedMessage::encode` + `to_contiguous`) to exactly the bytes
//!   it was decoded from, for `decode` and for each frame the stream decoder yields;
//! * `decode` and the stream decoder agree: one succeeds on a single-frame stream iff the other does,
//!   with the same frame, and a bad frame header is the same error in both;
//! * the stream decoder's buffer never grows beyond what was fed or one frame within the limit;
//! * `decode_error_payload` round-trips through `encode_error_payload` for UTF-8 reasons.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use meshwire_proto::wire::{
    self, Destination, EncodedMessage, ErrorCode, Frame, FrameDecoder, Limits, WireError,
    FRAME_HEADER_LEN, FRAME_OVERHEAD, MIN_BODY_LEN,
};

fuzz_target!(|data: &[u8]| {
    let [limit, chunking, stream @ ..] = data else {
        return;
    };
    let limits = Limits {
        max_payload_bytes: u32::from(*limit),
    };
    let bytes = Bytes::copy_from_slice(stream);

    // One contiguous frame.
    let whole = wire::decode(&bytes, &limits);
    if let Ok(frame) = &whole {
        check_frame(frame, &limits, stream);
    }

    // The frame header alone.
    let header_error = if stream.len() >= FRAME_HEADER_LEN {
        let mut head = [0u8; FRAME_HEADER_LEN];
        head.copy_from_slice(&stream[..FRAME_HEADER_LEN]);
        match wire::decode_frame_header(&head, &limits) {
            Ok(header) => {
                assert!(header.body_len as usize >= MIN_BODY_LEN);
                assert!(header.payload_len() <= limits.max_payload_bytes as usize);
                if whole.is_ok() {
                    assert_eq!(header.body_len as usize, stream.len() - FRAME_HEADER_LEN);
                }
                None
            }
            Err(error) => {
                assert!(
                    whole.is_err(),
                    "decode accepted a frame whose header was refused"
                );
                Some(error)
            }
        }
    } else {
        assert!(
            whole.is_err(),
            "decode accepted fewer bytes than a frame header"
        );
        None
    };

    // The same bytes as a stream, arriving in pieces.
    let mut chunks = Chunks::new(*chunking, stream.len());
    let mut decoder = FrameDecoder::new(limits);
    let mut buffer = BytesMut::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    let mut consumed = 0;
    let mut error = None;
    'feed: while fed < stream.len() {
        let end = (fed + chunks.next()).min(stream.len());
        buffer.extend_from_slice(&stream[fed..end]);
        fed = end;
        loop {
            let result = decoder.decode(&mut buffer);
            // Room is reserved only for bytes already fed or for one frame within the limit.
            let bound = fed.max(FRAME_OVERHEAD + limits.max_payload_bytes as usize) * 2 + 64;
            assert!(
                buffer.capacity() <= bound,
                "buffer capacity {} exceeds {bound}",
                buffer.capacity()
            );
            match result {
                Ok(Some(frame)) => {
                    let len = FRAME_OVERHEAD + frame.payload.len();
                    assert!(consumed + len <= fed, "frame longer than the bytes fed");
                    check_frame(&frame, &limits, &stream[consumed..consumed + len]);
                    consumed += len;
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(e) => {
                    error = Some(e);
                    break 'feed;
                }
            }
        }
    }
    if error.is_none() {
        assert_eq!(
            decoder.is_mid_frame(&buffer),
            consumed != stream.len(),
            "is_mid_frame disagrees with the bytes left over"
        );
    }

    // The two decoders agree.
    match &whole {
        Ok(frame) => {
            assert_eq!(
                error, None,
                "stream decoder refused a frame decode accepted"
            );
            assert_eq!(frames.as_slice(), std::slice::from_ref(frame));
        }
        Err(_) => assert!(
            !(error.is_none() && frames.len() == 1 && consumed == stream.len()),
            "stream decoder accepted a frame decode refused: {whole:?}"
        ),
    }
    if let Some(header_error) = header_error {
        assert_eq!(frames.len(), 0);
        assert_eq!(error, Some(header_error));
    }

    // Error-response payloads: the raw bytes and every decoded payload.
    check_error_payload(stream);
    for frame in &frames {
        check_error_payload(&frame.payload);
    }
});

/// A decoded frame is within the limit and re-encodes to exactly the bytes it came from.
fn check_frame(frame: &Frame, limits: &Limits, original: &[u8]) {
    assert!(
        frame.payload.len() <= limits.max_payload_bytes as usize,
        "payload of {} bytes decoded under a limit of {}",
        frame.payload.len(),
        limits.max_payload_bytes
    );
    let message = EncodedMessage::encode(&frame.header, frame.payload.clone(), limits)
        .expect("a decoded frame must re-encode under the same limits");
    let encoded = message.to_contiguous(&Destination::new(&frame.dst));
    assert_eq!(message.frame_len(), encoded.len());
    assert_eq!(
        &encoded[..],
        original,
        "re-encoded frame differs from its input"
    );
}

/// `decode_error_payload` reads the code byte and the reason, and round-trips UTF-8 reasons.
fn check_error_payload(payload: &[u8]) {
    match wire::decode_error_payload(payload) {
        Ok((code, reason)) => {
            assert_eq!(code as u8, payload[0]);
            if let Ok(text) = std::str::from_utf8(&payload[1..]) {
                assert_eq!(reason, text);
                assert_eq!(&wire::encode_error_payload(code, &reason)[..], payload);
            }
        }
        Err(WireError::EmptyErrorResponse) => assert!(payload.is_empty()),
        Err(WireError::UnknownErrorCode(code)) => {
            assert_eq!(code, payload[0]);
            assert!(ErrorCode::from_byte(code).is_err());
        }
        Err(other) => panic!("unexpected error from decode_error_payload: {other:?}"),
    }
}

/// Piece sizes for feeding the stream decoder, derived from one input byte.
struct Chunks {
    state: u32,
    max: usize,
}

impl Chunks {
    fn new(seed: u8, stream_len: usize) -> Self {
        let max = match seed >> 6 {
            0 => 1,
            1 => 8,
            2 => 64,
            _ => stream_len.max(1),
        };
        Self {
            state: u32::from(seed) | 0x9e37_7900,
            max,
        }
    }

    /// The next piece size, in `1..=max`.
    fn next(&mut self) -> usize {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 17;
        self.state ^= self.state << 5;
        1 + self.state as usize % self.max
    }
}
