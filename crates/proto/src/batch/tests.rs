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
        &[2, 0],
        &7u32.to_le_bytes(),
        &42u64.to_le_bytes(),
        &3u64.to_le_bytes(),
        &1u32.to_le_bytes(),
        &1u32.to_le_bytes(),
        &2u64.to_le_bytes(),
        &4u32.to_le_bytes(),
        b"meta",
        // Chunk: tag, one slot, two bytes (varints), the data.
        &[1, 1, 2],
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
    buffer.put_slice(&[TAG_CHUNK, 1, 100]);
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

/// A chunk prefix of `slots` slots and `len` bytes, encoded by hand.
fn prefix(slots: u32, len: u32) -> Vec<u8> {
    let mut out = vec![TAG_CHUNK];
    varint::put(&mut out, slots.into());
    varint::put(&mut out, len.into());
    out
}

#[test]
fn next_record_len_is_a_chunk_the_decoder_will_accept() {
    let limits = BatchLimits {
        max_chunk_bytes: 640,
        ..BatchLimits::default()
    };
    let (_, head) = BatchEncoder::new(header(1000, 1000), limits).unwrap();
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
    // One slot, 400 bytes: tag, one byte, two bytes.
    assert_eq!(prefix(1, 400).len(), 4);
    for cut in 0..4 {
        assert_eq!(
            decoder.next_record_len(&prefix(1, 400)[..cut]),
            None,
            "partial prefix of {cut} bytes"
        );
    }
    assert_eq!(decoder.next_record_len(&prefix(1, 400)), Some(4 + 400));
    let mut with_data = prefix(1, 400);
    with_data.extend_from_slice(&[7; 100]);
    assert_eq!(
        decoder.next_record_len(&with_data),
        Some(4 + 400),
        "the data so far does not change the record's length"
    );
    // 300 slots take two bytes.
    assert_eq!(decoder.next_record_len(&prefix(300, 40)), Some(4 + 40));
    assert_eq!(
        decoder.next_record_len(&prefix(1, 641)),
        None,
        "above max_chunk_bytes"
    );
    assert_eq!(
        decoder.next_record_len(&[TAG_CHUNK, 0x81, 0x00, 40]),
        None,
        "a padded varint"
    );
    buffer.put_slice(&prefix(1, 600));
    buffer.put_slice(&[0; 600]);
    assert!(matches!(
        decoder.poll(&mut buffer),
        Ok(Some(BatchEvent::Chunk(_)))
    ));
    assert_eq!(decoder.next_record_len(&prefix(2, 400)), Some(4 + 400));
    assert_eq!(
        decoder.next_record_len(&prefix(2, 401)),
        None,
        "more than the header still declares"
    );
    assert_eq!(decoder.next_record_len(&encode_end(1, 1, 600)), None);
}

/// The lab's ring sweep and the xx network's published case: 1000 payloads of 500 bytes, one
/// chunk each. Version 1 spent 9 bytes on each chunk's prefix.
#[test]
fn a_one_slot_500_byte_chunk_costs_4_bytes_of_prefix() {
    let (mut encoder, _) =
        BatchEncoder::new(header(1000, 500_000), BatchLimits::default()).unwrap();
    let prefix = encoder.chunk(1, 500).unwrap();
    assert_eq!(&prefix[..], &[TAG_CHUNK, 1, 0xf4, 0x03]);
    assert_eq!(chunk_prefix_len(1, 500), 4);
    let chunks: Vec<Chunk> = (0..1000)
        .map(|index| Chunk {
            slots: 1,
            data: Bytes::from(vec![index as u8; 500]),
        })
        .collect();
    let encoded = encode_all(header(1000, 500_000), &chunks, BatchLimits::default()).unwrap();
    assert_eq!(
        encoded.len(),
        HEADER_FIXED_LEN + b"meta".len() + 1000 * (4 + 500) + END_LEN
    );
    assert_eq!(
        decode_all(&encoded, BatchLimits::default()).unwrap(),
        (header(1000, 500_000), chunks)
    );
}

#[test]
fn other_versions_are_refused_version_1_included() {
    let encoded = encode_all(header(1, 2), &chunks(&[2]), BatchLimits::default()).unwrap();
    // A version-1 stream as a version-1 node wrote it: u32 slots and length.
    let v1: Vec<u8> = [
        &b"MB"[..],
        &[1, 0],
        &encoded[4..HEADER_FIXED_LEN + 4],
        &[1],
        &1u32.to_le_bytes(),
        &2u32.to_le_bytes(),
        &[0, 0],
        &encode_end(1, 1, 2),
    ]
    .concat();
    assert_eq!(
        decode_all(&v1, BatchLimits::default()),
        Err(BatchError::UnsupportedVersion(1))
    );
    let mut decoder = BatchDecoder::new(BatchLimits::default());
    let mut buffer = BytesMut::from(&v1[..]);
    let error = decoder.poll(&mut buffer).unwrap_err();
    assert_eq!(error, BatchError::UnsupportedVersion(1));
    assert_eq!(error.label(), "unsupported_version");
    for version in [0, 1, 3, 255] {
        let mut other = encoded.to_vec();
        other[2] = version;
        assert_eq!(
            decode_all(&other, BatchLimits::default()),
            Err(BatchError::UnsupportedVersion(version))
        );
    }
}

#[test]
fn malformed_chunk_varints_are_typed_errors() {
    let limits = BatchLimits {
        max_slots: u32::MAX,
        ..BatchLimits::default()
    };
    let (_, head) = BatchEncoder::new(header(u32::MAX, 100), limits).unwrap();
    let poll = |prefix: &[u8]| {
        let mut decoder = BatchDecoder::new(limits);
        let mut buffer = BytesMut::from(&head[..]);
        assert!(matches!(
            decoder.poll(&mut buffer),
            Ok(Some(BatchEvent::Header(_)))
        ));
        buffer.put_slice(prefix);
        let announced = decoder.next_record_len(&buffer);
        (decoder.poll(&mut buffer), announced)
    };
    let bad = |what| (Err(BatchError::BadVarint(what)), None);
    // Padded: longer than the value needs.
    assert_eq!(poll(&[TAG_CHUNK, 0x81, 0x00, 2, 0, 0]), bad("slots"));
    assert_eq!(poll(&[TAG_CHUNK, 1, 0x82, 0x00, 0, 0]), bad("length"));
    assert_eq!(poll(&[TAG_CHUNK, 0x80, 0x00, 2, 0, 0]), bad("slots"));
    // Longer than a u32 takes: refused at the fifth byte, before any more arrive.
    assert_eq!(
        poll(&[TAG_CHUNK, 0x80, 0x80, 0x80, 0x80, 0x80]),
        bad("slots")
    );
    assert_eq!(
        poll(&[TAG_CHUNK, 1, 0xff, 0xff, 0xff, 0xff, 0xff]),
        bad("length")
    );
    // Above u32::MAX.
    assert_eq!(
        poll(&[TAG_CHUNK, 0xff, 0xff, 0xff, 0xff, 0x1f, 2]),
        bad("slots")
    );
    assert_eq!(
        poll(&[TAG_CHUNK, 1, 0x80, 0x80, 0x80, 0x80, 0x10]),
        bad("length")
    );
    assert_eq!(BatchError::BadVarint("slots").label(), "bad_varint");
    // The largest well-formed prefix is fine, and refused only for its size.
    assert_eq!(
        poll(&[TAG_CHUNK, 0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0xff, 0xff, 0x0f]).0,
        Err(BatchError::TooLarge {
            what: "chunk",
            len: u32::MAX.into(),
            max: BatchLimits::default().max_chunk_bytes.into()
        })
    );
    // A prefix cut short waits for more bytes, and ends as a truncated batch.
    for cut in [
        &[TAG_CHUNK][..],
        &[TAG_CHUNK, 0x80],
        &[TAG_CHUNK, 1],
        &[TAG_CHUNK, 1, 0xe4],
    ] {
        assert_eq!(poll(cut), (Ok(None), None), "{cut:02x?}");
        let mut stream = head.to_vec();
        stream.extend_from_slice(cut);
        assert_eq!(
            decode_all(&stream, limits),
            Err(BatchError::Truncated {
                received: 0,
                declared: 100
            })
        );
    }
}

proptest! {
    #[test]
    fn chunk_prefixes_round_trip_at_any_size(slots in any::<u32>(), len in 1u32..) {
        let limits = BatchLimits {
            max_metadata_bytes: 64,
            max_chunk_bytes: u32::MAX,
            max_batch_bytes: u64::MAX,
            max_slots: u32::MAX,
        };
        let (mut encoder, head) = BatchEncoder::new(header(slots, len.into()), limits).unwrap();
        let encoded = encoder.chunk(slots, len as usize).unwrap();
        prop_assert_eq!(&encoded[..], &prefix(slots, len)[..]);
        prop_assert_eq!(encoded.len(), chunk_prefix_len(slots, len));
        prop_assert!(encoded.len() <= MAX_CHUNK_PREFIX_LEN);
        let mut decoder = BatchDecoder::new(limits);
        let mut buffer = BytesMut::from(&head[..]);
        prop_assert!(matches!(decoder.poll(&mut buffer), Ok(Some(BatchEvent::Header(_)))));
        for cut in 0..encoded.len() {
            prop_assert_eq!(decoder.next_record_len(&encoded[..cut]), None);
            let mut partial = BytesMut::from(&encoded[..cut]);
            prop_assert_eq!(decoder.poll(&mut partial), Ok(None));
            prop_assert_eq!(&partial[..], &encoded[..cut]);
        }
        prop_assert_eq!(
            decoder.next_record_len(&encoded),
            Some(encoded.len() + len as usize)
        );
        let mut whole = BytesMut::from(&encoded[..]);
        prop_assert_eq!(decoder.poll(&mut whole), Ok(None), "waits for the data");
    }
}

fn arb_batch() -> impl Strategy<Value = (BatchHeader, Vec<Chunk>)> {
    // Slot counts and lengths across the varints' one-, two- and three-byte forms (a length of
    // 16,384 takes three bytes).
    let slots = prop_oneof![4 => 0u32..4, 1 => 100u32..200, 1 => 10_000u32..1 << 20];
    let len = prop_oneof![8 => 1usize..300, 1 => 16_000usize..17_000];
    (
        proptest::collection::vec((slots, len), 0..12),
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
