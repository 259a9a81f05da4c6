//! Fuzz the session route header and the relay request/reply decoders.
//!
//! Invariants checked (a panic here is a bug): no decoder panics, and whatever one accepts
//! re-encodes to exactly the input (the formats have one encoding per value).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use meshwire_session::proto::route::{RelayReply, RelayRequest, RouteHeader};

fuzz_target!(|data: &[u8]| {
    if let Ok((header, packet)) = RouteHeader::decode(Bytes::copy_from_slice(data)) {
        assert_eq!(header.encode_with(&packet).as_ref(), data);
    }
    if let Ok(request) = RelayRequest::decode(data) {
        assert_eq!(request.encode().as_ref(), data);
    }
    if let Ok(reply) = RelayReply::decode(data) {
        assert_eq!(reply.encode().as_ref(), data);
    }
});
