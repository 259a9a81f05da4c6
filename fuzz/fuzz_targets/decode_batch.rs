//! Fuzz the batch decoder in `meshwire_proto::batch` with bytes a hostile peer could send.
//!
//! Input layout: `[piece][stream...]`: `piece` (1..=256) is the size of the pieces the stream is fed
//! to a [`BatchDecoder`] in.
//!
//! Invariants checked (a panic here is a bug in the codec):
//! * the decoder never panics;
//! * fed in pieces or whole, the stream decodes to the same result (`decode_all`);
//! * a batch that decodes whole re-encodes (`encode_all`) to exactly the bytes it came from;
//! * every accepted chunk is within the limits, and chunks never exceed the declared totals;
//! * `next_record_len` announces exactly the chunk `poll` then returns, never more than a chunk.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use meshwire_proto::batch::{self, BatchDecoder, BatchEvent, BatchLimits};

fuzz_target!(|data: &[u8]| {
    let [piece, stream @ ..] = data else {
        return;
    };
    let limits = BatchLimits {
        max_metadata_bytes: 64,
        max_chunk_bytes: 256,
        max_batch_bytes: 4096,
        max_slots: 64,
    };
    let whole = batch::decode_all(stream, limits);
    if let Ok((header, chunks)) = &whole {
        let encoded = batch::encode_all(header.clone(), chunks, limits)
            .expect("a decoded batch must re-encode under the same limits");
        assert_eq!(&encoded[..], stream, "re-encoded batch differs from its input");
    }

    let mut decoder = BatchDecoder::new(limits);
    let mut buffer = BytesMut::new();
    let mut header = None;
    let mut chunks = Vec::new();
    let mut outcome = Ok(());
    'feed: for part in stream.chunks(usize::from(*piece) + 1) {
        buffer.extend_from_slice(part);
        loop {
            let announced = decoder.next_record_len(&buffer);
            if let Some(len) = announced {
                assert!(len <= batch::MAX_CHUNK_PREFIX_LEN + 256, "announced {len} bytes");
            }
            match decoder.poll(&mut buffer) {
                Ok(Some(BatchEvent::Header(h))) => header = Some(h),
                Ok(Some(BatchEvent::Chunk(chunk))) => {
                    assert!(!chunk.data.is_empty() && chunk.data.len() <= 256);
                    assert_eq!(
                        announced,
                        Some(
                            batch::chunk_prefix_len(chunk.slots, chunk.data.len() as u32)
                                + chunk.data.len()
                        ),
                        "next_record_len disagrees with the chunk decoded"
                    );
                    chunks.push(chunk);
                    let h = header.as_ref().expect("chunks follow the header");
                    let bytes: u64 = chunks.iter().map(|c| c.data.len() as u64).sum();
                    assert!(bytes <= h.total_bytes);
                }
                Ok(Some(BatchEvent::End)) | Ok(None) => break,
                Err(error) => {
                    outcome = Err(error);
                    break 'feed;
                }
            }
        }
    }
    let piecewise = outcome
        .and_then(|()| decoder.finish(buffer.len()))
        .map(|()| (header.expect("a finished batch has a header"), chunks));
    assert_eq!(piecewise.is_ok(), whole.is_ok(), "{piecewise:?} vs {whole:?}");
    if let (Ok(a), Ok(b)) = (&piecewise, &whole) {
        assert_eq!(a, b);
    }
});
