//! Fuzz the object-key validation the HTTP API runs on `/objects/{key}` (after axum has
//! percent-decoded the path), and the wire encodings a valid key is then sent to replicas in.
//!
//! Input layout: the whole input is the key (not necessarily UTF-8: a path that is not UTF-8 is
//! refused before validation, so only UTF-8 reaches `validate_key`).
//!
//! Invariants checked (a panic here is a bug):
//! * `validate_key` never panics;
//! * it accepts exactly the keys of 1..=`MAX_KEY_LEN` bytes of ASCII letters, digits, `.`, `_` and
//!   `-`, other than `.` and `..` (checked against an independent spelling of the rule);
//! * every key it accepts goes through a fetch request and a store request and decodes back to
//!   the same key, so anything the HTTP API takes can be sent to a replica.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshwire_objects::proto::object::{
    self, content_hash, decode_fetch, decode_store, validate_key, FetchMode, Stamp, MAX_KEY_LEN,
};

fuzz_target!(|data: &[u8]| {
    let Ok(key) = std::str::from_utf8(data) else {
        return;
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    let expected = (1..=MAX_KEY_LEN).contains(&key.len())
        && key != "."
        && key != ".."
        && key.chars().all(allowed);
    let valid = validate_key(key).is_ok();
    assert_eq!(valid, expected, "validate_key({key:?})");
    if !valid {
        return;
    }
    for mode in [FetchMode::Metadata, FetchMode::Full, FetchMode::FullIfSmall] {
        let message = object::encode_fetch(7, mode, key);
        let request = decode_fetch(&message).expect("a valid key's fetch request decodes");
        assert_eq!(request.key, key);
        assert_eq!(request.mode, mode);
    }
    let content = b"content";
    let stamp = Stamp {
        version: 1,
        hash: content_hash(content),
    };
    let mut message = object::encode_store_header(7, key, &stamp);
    message.extend_from_slice(content);
    let request = decode_store(&message, content.len()).expect("a valid key's store decodes");
    assert_eq!(request.key, key);
    assert_eq!(&message[request.content], content);
});
