//! Name every protocol id in use: meshwire's own services, and the conventions of its cli and lab.
//!
//! A [`ProtocolId`] is a `u32` carried in every message, request and batch header (and, as a
//! varint, at the start of every datagram), and a node routes each to the one subscriber or
//! handler attached to its id (a second one is refused with
//! [`crate::SubscribeError::AlreadySubscribed`]). Reserved for meshwire's own services:
//!
//! | ids                          | use                                                             |
//! |------------------------------|-----------------------------------------------------------------|
//! | `0x0000_0040..=0x0000_007f`  | datagram services ([`RESERVED_DATAGRAM`]): a one-byte tag on every datagram |
//! | `0x4000_0000..=0xffff_ffff`  | message, request and batch services ([`RESERVED`]), each named by four ASCII-ish bytes |
//!
//! Every other id is free for applications ([`is_reserved`] is false). The cli and the lab use the
//! few below 64 named here; they may clash with an application's only on a node that runs them.

use std::ops::RangeInclusive;

use meshwire_proto::wire::ProtocolId;

/// Ids reserved for meshwire's datagram services: small, so their datagram tag is one byte.
pub const RESERVED_DATAGRAM: RangeInclusive<u32> = 0x0000_0040..=0x0000_007f;
/// Ids reserved for meshwire's message, request and batch services.
pub const RESERVED: RangeInclusive<u32> = 0x4000_0000..=0xffff_ffff;

/// Multipath session packets, one per datagram (`meshwire-session`).
pub const SESSION_DATAGRAM: ProtocolId = ProtocolId(0x40);
/// Recovery shards for the tail of a batch stream, addressed to the stream
/// ([`meshwire_proto::batch::repair`]); the node routes them itself, nobody subscribes.
pub const BATCH_REPAIR: ProtocolId = ProtocolId(0x41);

/// Gossip batches (`meshwire-gossip`), "GOSP".
pub const GOSSIP: ProtocolId = ProtocolId(0x474f_5350);
/// Requests to relay a multipath session's path through a third node (`meshwire-session`), "mwr\x01".
pub const SESSION_RELAY: ProtocolId = ProtocolId(0x6d77_7201);
/// Requests for an object's metadata or content (`meshwire-objects`), "ob\0\x01".
pub const OBJECT_FETCH: ProtocolId = ProtocolId(0x6f62_0001);
/// Requests to store a copy of an object (`meshwire-objects`), "ob\0\x02".
pub const OBJECT_STORE: ProtocolId = ProtocolId(0x6f62_0002);
/// Two-phase conditional writes of an object (`meshwire-objects`), "ob\0\x03".
pub const OBJECT_CAS: ProtocolId = ProtocolId(0x6f62_0003);
/// Anti-entropy digest exchanges between object replicas (`meshwire-objects`), "ob\0\x04".
pub const OBJECT_SYNC: ProtocolId = ProtocolId(0x6f62_0004);
/// Requests for the versions and hashes of several objects at once (`meshwire-objects`), "ob\0\x05".
pub const OBJECT_STAMPS: ProtocolId = ProtocolId(0x6f62_0005);
/// Batches of a [`crate::pipeline`], "PIPE".
pub const PIPELINE: ProtocolId = ProtocolId(0x5049_5045);
/// Round-trip probes of a [`crate::pipeline`], "PING".
pub const PIPELINE_PING: ProtocolId = ProtocolId(0x5049_4e47);

/// Requests answered with their own body: `meshwire node` and the lab's hosts serve it so any
/// peer can measure a round trip.
pub const ECHO: ProtocolId = ProtocolId(0);
/// Application messages of the cli demo's chat and the lab's calibration and fault workloads.
pub const DATA: ProtocolId = ProtocolId(1);
/// The cli demo's one-to-many bulk message.
pub const BULK: ProtocolId = ProtocolId(2);
/// The cli demo's bulk stream between two nodes.
pub const BULK_STREAM: ProtocolId = ProtocolId(3);
/// The lab's fan-out workload.
pub const FANOUT: ProtocolId = ProtocolId(40);
/// The lab's xx-team batches, one hop at a time.
pub const HOP: ProtocolId = ProtocolId(50);

/// Every protocol id meshwire's own services use (all in the reserved ranges).
pub const SERVICES: [ProtocolId; 10] = [
    SESSION_DATAGRAM,
    GOSSIP,
    SESSION_RELAY,
    OBJECT_FETCH,
    OBJECT_STORE,
    OBJECT_CAS,
    OBJECT_SYNC,
    OBJECT_STAMPS,
    PIPELINE,
    PIPELINE_PING,
];

/// Whether `protocol` is in a range reserved for meshwire's services.
pub fn is_reserved(protocol: ProtocolId) -> bool {
    RESERVED_DATAGRAM.contains(&protocol.0) || RESERVED.contains(&protocol.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_use_reserved_ids_and_conventions_use_application_ids() {
        let services = SERVICES;
        let conventions = [ECHO, DATA, BULK, BULK_STREAM, FANOUT, HOP];
        assert!(services.iter().all(|id| is_reserved(*id)));
        assert!(conventions.iter().all(|id| !is_reserved(*id)));
        let mut all: Vec<u32> = services.iter().chain(&conventions).map(|id| id.0).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(
            all.len(),
            services.len() + conventions.len(),
            "ids are distinct"
        );
    }
}
