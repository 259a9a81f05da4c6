//! Fuzz the session route header and the relay request/reply decoders, and the varint readers a
//! datagram's protocol tag (the bytes in front of every session datagram) is read with.
//!
//! Invariants checked (a panic here is a bug): no decoder panics, and whatever one accepts
//! re-encodes to exactly the input (the formats have one encoding per value). A varint reading
//! consumes 1 to its type's most bytes; a canonical one re-encodes to exactly what it consumed,
//! and any accepted `u32` reading agrees with the `u64` reading of the same bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use meshwire_proto::varint;
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
    let mut rest = data;
    if let Ok(value) = varint::get_u32(&mut rest) {
        let used = data.len() - rest.len();
        assert!((1..=varint::MAX_LEN_U32).contains(&used));
        let mut wide = data;
        assert_eq!(varint::get_u64(&mut wide), Ok(u64::from(value)));
        assert_eq!(wide.len(), rest.len());
    }
    let mut rest = data;
    if let Ok(value) = varint::get_canonical_u32(&mut rest) {
        let used = data.len() - rest.len();
        let mut out = Vec::new();
        varint::put(&mut out, value.into());
        assert_eq!(out, &data[..used]);
    }
});
