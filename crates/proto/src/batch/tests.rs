//! Tests of the batch framing.

use super::*;
use proptest::prelude::*;

fn header(slot_count: u32, total_bytes: u64) -> BatchHeader {
    BatchHeader {
        protocol: 7,
        batch_id: 42,
        round: 3,
        phase: 1,
        slot_count,
        total_bytes,
        metadata: Bytes::from_static(b"meta"),
    }
}

fn chunks(sizes: &[usize]) -> Vec<Chunk> {
    sizes
        .iter()
        .enumerate()
        .map(|(index, size)| Chunk {
            slots: 1,
            data: Bytes::from(vec![index as u8; *size]),
        })
        .collect()
}

#[test]
fn golden_vector() {
    let encoded = encode_all(header(1, 2), &chunks(&[2]), BatchLimits::default()).unwrap();
    let expected: Vec<u8> = [
        &b"MB"[..],
        &[1, 0],
        &7u32.to_le_bytes(),
        &42u64.to_le_bytes(),
        &3u64.to_le_bytes(),
        &1u32.to_le_bytes(),
        &1u32.to_le_bytes(),
        &2u64.to_le_bytes(),
        &4u32.to_le_bytes(),
        b"meta",
        &[1],
        &1u32.to_le_bytes(),
        &2u32.to_le_bytes(),
        &[0, 0],
        &[2],
        &1u32.to_le_bytes(),
        &1u32.to_le_bytes(),
        &2u64.to_le_bytes(),
    ]
    .concat();
    assert_eq!(&encoded[..], &expected[..]);
}

#[test]
fn encoder_refuses_overrun_and_short_batches() {
    let (mut encoder, _) = BatchEncoder::new(header(2, 10), BatchLimits::default()).unwrap();
    encoder.chunk(1, 6).unwrap();
    assert_eq!(
        encoder.chunk(1, 5),
        Err(BatchError::Overrun {
            what: "bytes",
            declared: 10,
            actual: 11
        })
    );
    assert!(matches!(encoder.end(), Err(BatchError::Short { .. })));
    encoder.chunk(1, 4).unwrap();
    encoder.end().unwrap();
    assert_eq!(encoder.chunk(0, 1), Err(BatchError::AlreadyEnded));
}

#[test]
fn truncated_streams_are_errors() {
    let encoded = encode_all(
        header(3, 30),
        &chunks(&[10, 10, 10]),
        BatchLimits::default(),
    )
    .unwrap();
    for cut in 0..encoded.len() {
        let result = decode_all(&encoded[..cut], BatchLimits::default());
        assert!(
            matches!(result, Err(BatchError::Truncated { .. })),
            "cut at {cut}: {result:?}"
        );
    }
    assert!(decode_all(&encoded, BatchLimits::default()).is_ok());
}

#[test]
fn lying_end_record_is_an_error() {
    let mut forged = BytesMut::new();
    let (mut encoder, head) = BatchEncoder::new(header(2, 4), BatchLimits::default()).unwrap();
    forged.put_slice(&head);
    for _ in 0..2 {
        forged.put_slice(&encoder.chunk(1, 2).unwrap());
        forged.put_slice(b"xy");
    }
    forged.put_slice(&encode_end(3, 2, 4));
    assert_eq!(
        decode_all(&forged, BatchLimits::default()),
        Err(BatchError::EndMismatch {
            what: "chunks",
            claimed: 3,
            actual: 2
        })
    );
}

#[test]
fn oversized_chunk_is_refused_before_its_data_arrives() {
    let limits = BatchLimits {
        max_chunk_bytes: 8,
        ..BatchLimits::default()
    };
    let (_, head) = BatchEncoder::new(header(1, 100), limits).unwrap();
    let mut buffer = BytesMut::from(&head[..]);
    buffer.put_u8(TAG_CHUNK);
    buffer.put_u32_le(1);
    buffer.put_u32_le(100);
    let mut decoder = BatchDecoder::new(limits);
    assert!(matches!(
        decoder.poll(&mut buffer),
        Ok(Some(BatchEvent::Header(_)))
    ));
    assert!(matches!(
        decoder.poll(&mut buffer),
        Err(BatchError::TooLarge { what: "chunk", .. })
    ));
}

#[test]
fn next_record_len_is_a_chunk_the_decoder_will_accept() {
    let limits = BatchLimits {
        max_chunk_bytes: 64,
        ..BatchLimits::default()
    };
    let (_, head) = BatchEncoder::new(header(3, 100), limits).unwrap();
    let mut decoder = BatchDecoder::new(limits);
    let mut buffer = BytesMut::from(&head[..]);
    assert_eq!(
        decoder.next_record_len(&buffer),
        None,
        "the header is no chunk"
    );
    assert!(matches!(
        decoder.poll(&mut buffer),
        Ok(Some(BatchEvent::Header(_)))
    ));
    let prefix = |len: u32| [&[TAG_CHUNK][..], &1u32.to_le_bytes(), &len.to_le_bytes()].concat();
    assert_eq!(
        decoder.next_record_len(&prefix(40)[..8]),
        None,
        "partial prefix"
    );
    assert_eq!(
        decoder.next_record_len(&prefix(40)),
        Some(CHUNK_PREFIX_LEN + 40)
    );
    assert_eq!(
        decoder.next_record_len(&prefix(65)),
        None,
        "above max_chunk_bytes"
    );
    buffer.put_slice(&prefix(60));
    buffer.put_slice(&[0; 60]);
    assert!(matches!(
        decoder.poll(&mut buffer),
        Ok(Some(BatchEvent::Chunk(_)))
    ));
    assert_eq!(
        decoder.next_record_len(&prefix(40)),
        Some(CHUNK_PREFIX_LEN + 40)
    );
    assert_eq!(
        decoder.next_record_len(&prefix(41)),
        None,
        "more than the header still declares"
    );
    assert_eq!(decoder.next_record_len(&encode_end(1, 1, 60)), None);
}

fn arb_batch() -> impl Strategy<Value = (BatchHeader, Vec<Chunk>)> {
    (
        proptest::collection::vec((0u32..4, 1usize..300), 0..12),
        proptest::collection::vec(any::<u8>(), 0..40),
        any::<u64>(),
    )
        .prop_map(|(parts, metadata, batch_id)| {
            let chunks: Vec<Chunk> = parts
                .iter()
                .enumerate()
                .map(|(index, (slots, len))| Chunk {
                    slots: *slots,
                    data: Bytes::from(vec![index as u8; *len]),
                })
                .collect();
            let header = BatchHeader {
                protocol: 1,
                batch_id,
                round: batch_id / 3,
                phase: 2,
                slot_count: chunks.iter().map(|c| c.slots).sum(),
                total_bytes: chunks.iter().map(|c| c.data.len() as u64).sum(),
                metadata: Bytes::from(metadata),
            };
            (header, chunks)
        })
}

proptest! {
    #[test]
    fn round_trips_fed_in_any_split((header, chunks) in arb_batch(), step in 1usize..64) {
        let encoded = encode_all(header.clone(), &chunks, BatchLimits::default()).unwrap();
        let mut decoder = BatchDecoder::new(BatchLimits::default());
        let mut buffer = BytesMut::new();
        let mut events = Vec::new();
        for piece in encoded.chunks(step) {
            buffer.extend_from_slice(piece);
            while let Some(event) = decoder.poll(&mut buffer).unwrap() {
                events.push(event);
            }
        }
        decoder.finish(buffer.len()).unwrap();
        let mut expected = vec![BatchEvent::Header(header)];
        expected.extend(chunks.into_iter().map(BatchEvent::Chunk));
        expected.push(BatchEvent::End);
        prop_assert_eq!(events, expected);
    }

    #[test]
    fn a_reader_that_reserves_the_next_record_never_moves_a_chunk(
        (header, chunks) in arb_batch(),
        step in 1usize..64,
    ) {
        let encoded = encode_all(header.clone(), &chunks, BatchLimits::default()).unwrap();
        let mut decoder = BatchDecoder::new(BatchLimits::default());
        let mut buffer = BytesMut::new();
        let mut events = Vec::new();
        let mut rest = &encoded[..];
        while !rest.is_empty() {
            // Room for the record at the front, and a read that stops at its end, as the
            // node's batch reader does.
            let mut take = step.min(rest.len());
            let reserved = decoder.next_record_len(&buffer).map(|len| {
                let missing = len - buffer.len();
                buffer.reserve(missing);
                take = take.min(missing);
                buffer.as_ptr()
            });
            buffer.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if let Some(start) = reserved {
                prop_assert_eq!(start, buffer.as_ptr(), "the chunk's bytes moved");
            }
            while let Some(event) = decoder.poll(&mut buffer).unwrap() {
                events.push(event);
            }
        }
        decoder.finish(buffer.len()).unwrap();
        let mut expected = vec![BatchEvent::Header(header)];
        expected.extend(chunks.into_iter().map(BatchEvent::Chunk));
        expected.push(BatchEvent::End);
        prop_assert_eq!(events, expected);
    }

    #[test]
    fn corrupted_batches_never_decode_as_the_original(
        (header, chunks) in arb_batch(),
        position in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let encoded = encode_all(header.clone(), &chunks, BatchLimits::default()).unwrap();
        let mut corrupted = encoded.to_vec();
        let index = position.index(corrupted.len());
        corrupted[index] ^= flip;
        // Either an error, or a batch that differs from the original (a flipped data byte or
        // metadata byte is not the codec's to detect; QUIC protects bytes in transit).
        if let Ok(decoded) = decode_all(&corrupted, BatchLimits::default()) {
            prop_assert_ne!(decoded, (header, chunks));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_all(&bytes, BatchLimits::default());
    }
}
