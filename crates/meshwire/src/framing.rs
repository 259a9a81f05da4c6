//! Read whole frames from QUIC streams, growing buffers only as bytes arrive.

use std::future::Future;

use bytes::{Bytes, BytesMut};
use meshwire_proto::wire::{self, Frame, FrameHeader, Limits, WireError, FRAME_HEADER_LEN};
use quinn::{ReadError, ReadExactError, RecvStream};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadFrameError {
    /// The peer sent bytes that are not a valid frame.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The stream or connection failed underneath.
    #[error(transparent)]
    Stream(#[from] ReadError),
}

/// Buffer growth step: a peer announcing a large frame gets memory only as it sends bytes.
const READ_STEP: usize = 64 * 1024;

/// Reads the next frame, or `None` if the stream ended cleanly between frames.
pub(crate) async fn read_frame(
    recv: &mut RecvStream,
    limits: &Limits,
) -> Result<Option<Frame>, ReadFrameError> {
    read_frame_after(recv, &[], limits).await
}

/// Reads the next frame whose first `prefix.len()` bytes were already read (the node reads a
/// stream's first two bytes to tell message streams from batch streams).
pub(crate) async fn read_frame_after(
    recv: &mut RecvStream,
    prefix: &[u8],
    limits: &Limits,
) -> Result<Option<Frame>, ReadFrameError> {
    match read_frame_header(recv, prefix, limits).await? {
        Some(header) => read_frame_body(recv, &header).await.map(Some),
        None => Ok(None),
    }
}

/// Reads and checks the next frame's header (its first `prefix.len()` bytes already read), or
/// `None` if the stream ended cleanly between frames; the body is left on the stream.
pub(crate) async fn read_frame_header(
    recv: &mut RecvStream,
    prefix: &[u8],
    limits: &Limits,
) -> Result<Option<FrameHeader>, ReadFrameError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    let start = prefix.len().min(FRAME_HEADER_LEN);
    head[..start].copy_from_slice(&prefix[..start]);
    match recv.read_exact(&mut head[start..]).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(0)) if start == 0 => return Ok(None),
        Err(ReadExactError::FinishedEarly(actual)) => {
            return Err(WireError::Truncated {
                expected: FRAME_HEADER_LEN,
                actual: start + actual,
            }
            .into())
        }
        Err(ReadExactError::ReadError(error)) => return Err(error.into()),
    }
    Ok(Some(wire::decode_frame_header(&head, limits)?))
}

/// Reads the body announced by `header`, growing its buffer only as bytes arrive.
pub(crate) async fn read_frame_body(
    recv: &mut RecvStream,
    header: &FrameHeader,
) -> Result<Frame, ReadFrameError> {
    let body = read_bytes(recv, header.body_len as usize).await?;
    Ok(wire::decode_body(header, body)?)
}

/// Reads exactly `len` bytes, growing the buffer only as bytes arrive; a stream that ends first
/// is `Truncated`.
pub(crate) async fn read_bytes(recv: &mut RecvStream, len: usize) -> Result<Bytes, ReadFrameError> {
    let mut body = BytesMut::with_capacity(len.min(READ_STEP));
    while body.len() < len {
        match recv.read_chunk(len - body.len(), true).await? {
            Some(chunk) => body.extend_from_slice(&chunk.bytes),
            None => {
                return Err(WireError::Truncated {
                    expected: len,
                    actual: body.len(),
                }
                .into())
            }
        }
    }
    Ok(body.freeze())
}

/// Reads the stream's end if it has already arrived, without waiting. quinn answers a stream
/// dropped before its end was read with STOP_SENDING even when the peer's FIN is already in
/// (quinn-proto's `Recv::stop` says as much), so every request and every response whose frame was
/// read whole cost the other end a frame and a packet. A stream whose end has not arrived, or
/// that holds more than the frame, is still stopped when dropped.
pub(crate) fn read_end_if_arrived(recv: &mut RecvStream) {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let _ = std::pin::pin!(recv.read_chunk(1, true)).poll(&mut cx);
}

/// A short, stable name for a wire error, used as a metric label.
pub(crate) fn wire_error_label(error: &WireError) -> &'static str {
    match error {
        WireError::BadMagic(_) => "bad_magic",
        WireError::UnsupportedVersion(_) => "unsupported_version",
        WireError::ReservedNotZero(_) => "reserved_not_zero",
        WireError::BodyTooShort { .. } => "body_too_short",
        WireError::PayloadTooLarge { .. } => "too_large",
        WireError::UnknownKind(_) => "unknown_kind",
        WireError::UnknownErrorCode(_) => "unknown_error_code",
        WireError::Truncated { .. } => "truncated",
        WireError::TrailingBytes(_) => "trailing_bytes",
        WireError::EmptyErrorResponse => "empty_error_response",
        _ => "other",
    }
}
