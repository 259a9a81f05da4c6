//! Fuzz the object-message decoders in `meshwire_objects::proto::object` with bytes a hostile peer could send.
//!
//! Input layout: `[max_content][message...]`; `max_content` (0..=255) keeps the size limit reachable.
//!
//! Invariants checked (a panic here is a bug in the codec):
//! * no decoder panics;
//! * a decoded full copy or store request has content within the limit that matches its hash;
//! * a decoded store request re-encodes to exactly the bytes it was decoded from;
//! * a decoded fetch request re-encodes to exactly its bytes;
//! * a decoded stamps request names at most `MAX_STAMP_KEYS` keys, a decoded stamps answer holds
//!   exactly the entries asked for, and both re-encode to exactly their bytes;
//! * a decoded store response or refusal re-encodes to exactly its bytes;
//! * a decoded conditional-write request or answer re-encodes to exactly its bytes;
//! * a decoded anti-entropy digest message or listing re-encodes to exactly its bytes, and a
//!   listing stays within the limits it was decoded under;
//! * the hybrid clock never panics or wraps on the clocks and versions a message carries.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use meshwire_objects::proto::cas::{self, decode_cas, decode_cas_answer};
use meshwire_objects::proto::clock::{HybridClock, MAX_TIMESTAMP};
use meshwire_objects::proto::entropy::{self, ExchangeLimits};
use meshwire_objects::proto::object::{
    self, content_hash, decode_fetch, decode_fetched, decode_store, decode_stored, FetchMode,
    Fetched,
};
use meshwire_objects::proto::stamps;

fuzz_target!(|data: &[u8]| {
    let Some((&max, message)) = data.split_first() else {
        return;
    };
    let max = usize::from(max);
    let mut clock = HybridClock::new(Duration::from_secs(5));
    let now_ms = 1_760_000_000_000;
    if let Ok(request) = decode_fetch(message) {
        assert_eq!(
            object::encode_fetch(request.clock, request.mode, request.key),
            message
        );
        let _ = clock.observe(request.clock, now_ms);
    }
    for mode in [FetchMode::Metadata, FetchMode::Full, FetchMode::FullIfSmall] {
        if let Ok(answer) = decode_fetched(mode, message, max) {
            match answer.answer {
                Ok(Fetched::Present { stamp, content: Some(range) }) => {
                    assert!(range.len() <= max);
                    assert!(mode != FetchMode::FullIfSmall || range.len() <= object::CARRY_MAX_BYTES);
                    assert_eq!(content_hash(&message[range]), stamp.hash);
                }
                Ok(Fetched::Present { stamp, content: None }) if mode == FetchMode::FullIfSmall => {
                    let not_carried = object::encode_fetched_not_carried(answer.clock, &stamp);
                    let with_stamp = object::encode_fetched_header(answer.clock, Some(&stamp));
                    assert!(message == not_carried || message == with_stamp);
                }
                Err(reason) => assert_eq!(object::encode_refusal(answer.clock, reason), message),
                Ok(_) => {}
            }
        }
    }
    if let Ok(request) = stamps::decode_stamps_request(message) {
        assert!(!request.keys.is_empty() && request.keys.len() <= stamps::MAX_STAMP_KEYS);
        assert_eq!(stamps::encode_stamps_request(request.clock, &request.keys), message);
    }
    let keys = max % (stamps::MAX_STAMP_KEYS + 1);
    if let Ok(answer) = stamps::decode_stamps_answer(message, keys) {
        let again = match answer.answer {
            Ok(stamps_held) => {
                assert_eq!(stamps_held.len(), keys);
                stamps::encode_stamps_answer(answer.clock, &stamps_held)
            }
            Err(reason) => object::encode_refusal(answer.clock, reason),
        };
        assert_eq!(again, message);
    }
    // The head of a full fetch's answer read as a stream.
    if let Ok(Some((answer_clock, stamp))) = object::decode_fetched_head(message) {
        let head = object::encode_fetched_header(answer_clock, Some(&stamp));
        assert_eq!(head[..], message[..object::FETCHED_HEAD_LEN]);
    }
    if let Ok(request) = decode_store(message, max) {
        assert!(request.content.len() <= max);
        let mut again = object::encode_store_header(request.clock, request.key, &request.stamp);
        again.extend_from_slice(&message[request.content.clone()]);
        assert_eq!(again, message);
        let accepted = clock.observe(request.stamp.version, now_ms).is_ok();
        assert!(!accepted || request.stamp.version != MAX_TIMESTAMP);
    }
    if let Ok(answer) = decode_stored(message) {
        let again = match answer.answer {
            Ok(stored) => object::encode_stored(answer.clock, stored),
            Err(reason) => object::encode_refusal(answer.clock, reason),
        };
        assert_eq!(again, message);
    }
    if let Ok(request) = decode_cas(message, max) {
        assert!(request.content.len() <= max);
        let mut again = cas::encode_cas_header(request.clock, request.phase, request.key, &request.stamp);
        again.extend_from_slice(&message[request.content.clone()]);
        assert_eq!(again, message);
    }
    // A streamed reader takes the head in steps (fixed part, key and tag, precondition); those
    // steps must find exactly the head `decode_cas_head` decodes.
    if let Ok(request) = cas::decode_cas_head(message) {
        let (prepare, key_and_tag) = cas::cas_key_and_tag_len(message).unwrap();
        assert_eq!(prepare, matches!(request.phase, cas::Phase::Prepare(_)));
        let mut head = cas::CAS_FIXED_LEN + key_and_tag;
        if prepare {
            head += cas::precondition_len(message[head - 1]).unwrap();
        }
        assert_eq!(head, request.content.start);
    }
    if let Ok((answer_clock, answer)) = decode_cas_answer(message) {
        assert_eq!(cas::encode_cas_answer(answer_clock, answer), message);
    }
    if let Ok(request) = entropy::decode_digests(message) {
        assert_eq!(
            entropy::encode_digests(request.clock, &request.placement, &request.digests),
            message
        );
    }
    // `max` doubles as the entry limit and picks the bucket count, so both limits are reachable.
    let limits = ExchangeLimits { max_entries: max, max_bytes: 4096 };
    let buckets = 1usize << (max % 13);
    if let Ok(answer) = entropy::decode_entries(message, buckets, limits) {
        let again = match answer.answer {
            Ok(listed) => {
                assert!(listed.iter().map(|b| b.entries.len()).sum::<usize>() <= max);
                entropy::encode_entries(answer.clock, &listed, limits)
            }
            Err(reason) => entropy::encode_entries_refusal(answer.clock, reason),
        };
        assert_eq!(again, message);
    }
    if let Ok(tick) = clock.tick(now_ms) {
        assert!(tick < MAX_TIMESTAMP);
    }
});
