//! Fuzz the parsers for the HTTP request headers the object API reads from clients:
//! `If-Match` / `If-None-Match` (`proto::cas::parse_precondition`), `Accept` on `/metrics`
//! (`proto::headers::prefers_openmetrics`) and `Authorization` (`proto::headers::bearer_matches`).
//!
//! Input layout: the whole input is one header value, given to every parser.
//!
//! Invariants checked (a panic here is a bug):
//! * no parser panics;
//! * both precondition headers at once are always refused; `If-None-Match` is accepted only as
//!   `*`; an accepted `If-Match` entity tag is the one `cas::etag` prints for the same stamp;
//! * `Accept` prefers OpenMetrics only when it names `application/openmetrics-text`;
//! * the bearer check admits exactly `Bearer <token>`, byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshwire_objects::proto::cas::{etag, parse_precondition, Precondition, PreconditionError};
use meshwire_objects::proto::headers::{bearer_matches, prefers_openmetrics};

const TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fuzz_target!(|data: &[u8]| {
    assert_eq!(
        parse_precondition(Some(data), Some(data)),
        Err(PreconditionError::Both)
    );
    match parse_precondition(None, Some(data)) {
        Ok(Some(Precondition::Absent)) => assert_eq!(data.trim_ascii(), b"*"),
        Ok(other) => panic!("If-None-Match parsed to {other:?}"),
        Err(error) => assert_eq!(error, PreconditionError::NotAStar),
    }
    match parse_precondition(Some(data), None) {
        Ok(Some(Precondition::Matches(stamp))) => {
            let printed = etag(&stamp);
            assert_eq!(
                parse_precondition(Some(printed.as_bytes()), None),
                Ok(Some(Precondition::Matches(stamp)))
            );
        }
        Ok(other) => panic!("If-Match parsed to {other:?}"),
        Err(error) => assert_eq!(error, PreconditionError::NotAnEtag),
    }
    if let Ok(accept) = std::str::from_utf8(data) {
        if prefers_openmetrics(accept) {
            assert!(accept
                .to_ascii_lowercase()
                .contains("application/openmetrics-text"));
        }
    }
    let exact =
        data.len() == 7 + TOKEN.len() && data.starts_with(b"Bearer ") && data.ends_with(TOKEN);
    assert_eq!(bearer_matches(data, TOKEN), exact);
    // The same check against the token the input itself presents, so matches are reached too.
    if let Some(presented) = data.strip_prefix(b"Bearer ") {
        assert!(bearer_matches(data, presented));
    }
});
