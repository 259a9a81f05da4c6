//! Fuzz the topic envelope a peer's gossip artifact carries (`Envelope::decode`) and the topic
//! name rule the HTTP API checks on `/topics/{name}`.
//!
//! Input layout: the whole input is an artifact payload; the same bytes, when UTF-8, are also
//! tried as a topic name.
//!
//! Invariants checked (a panic here is a bug):
//! * `Envelope::decode` never panics and, when it accepts, re-encodes to exactly its input;
//! * `TopicName::new` accepts exactly `[A-Za-z0-9._-]{1,64}` (checked against an independent
//!   spelling of the rule).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use meshwire_objects::proto::topic::{Envelope, TopicName};

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(envelope) = Envelope::decode(&payload) {
        assert_eq!(envelope.encode(), payload, "an accepted envelope re-encodes to its input");
    }
    if let Ok(name) = std::str::from_utf8(data) {
        let expected = (1..=64).contains(&name.len())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        assert_eq!(TopicName::new(name).is_ok(), expected, "TopicName::new({name:?})");
    }
});
