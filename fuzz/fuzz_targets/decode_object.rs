//! Fuzz the object-message decoders in `meshwire_objects::proto::object` with bytes a hostile peer could send.
//!
//! Input layout: `[max_content][message...]`; `max_content` (0..=255) keeps the size limit reachable.
//!
//! Invariants checked (a panic here is a bug in the codec):
//! * no decoder panics;
//! * a decoded full copy or store request has content within the limit that matches its hash;
//! * a decoded store request re-encodes to exactly the bytes it was decoded from;
//! * a decoded fetch request re-encodes to exactly its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshwire_objects::proto::object::{
    self, content_hash, decode_fetch, decode_fetched, decode_store, decode_stored, FetchMode,
    Fetched,
};

fuzz_target!(|data: &[u8]| {
    let Some((&max, message)) = data.split_first() else {
        return;
    };
    let max = usize::from(max);
    if let Ok((mode, key)) = decode_fetch(message) {
        assert_eq!(object::encode_fetch(mode, key), message);
    }
    for mode in [FetchMode::Metadata, FetchMode::Full] {
        if let Ok(Fetched::Present { stamp, content: Some(range) }) = decode_fetched(mode, message, max) {
            assert!(range.len() <= max);
            assert_eq!(content_hash(&message[range]), stamp.hash);
        }
    }
    if let Ok(request) = decode_store(message, max) {
        assert!(request.content.len() <= max);
        let mut again = object::encode_store_header(request.key, &request.stamp);
        again.extend_from_slice(&message[request.content.clone()]);
        assert_eq!(again, message);
    }
    let _ = decode_stored(message);
});
