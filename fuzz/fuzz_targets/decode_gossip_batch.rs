//! Fuzz the gossip batch decoder and the gossip state machine with bytes a hostile peer could send.
//!
//! Input layout: `[max_items][stream...]`. `max_items` (0..=255) is the decoder's item limit; the
//! artifact limit is 512 bytes, so both limits are easy to reach.
//!
//! Invariants checked (a panic here is a bug):
//! * `decode_batch` never panics and never returns more items than the limit;
//! * whatever decodes re-encodes (`encode_batch`) to exactly the input bytes;
//! * a gossip instance fed the batch from a peer never panics, and the peer's budget stays within
//!   its configured slot and byte limits.
#![no_main]

use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use meshwire_gossip::proto::{
    decode_batch, encode_batch, BatchLimits, ClassId, ClassPolicy, Gossip, GossipConfig, Relay,
};
use meshwire_proto::PeerId;

fuzz_target!(|data: &[u8]| {
    let [max_items, stream @ ..] = data else {
        return;
    };
    let limits = BatchLimits {
        max_items: usize::from(*max_items),
        max_artifact_bytes: 512,
    };
    let bytes = Bytes::copy_from_slice(stream);
    if let Ok(items) = decode_batch(&bytes, &limits) {
        assert!(items.len() <= limits.max_items);
        assert_eq!(encode_batch(&items), bytes, "re-encoded batch differs");
    }

    let mut config = GossipConfig {
        max_artifact_bytes: 512,
        max_batch_items: usize::from(*max_items),
        max_pending_per_peer: 8,
        max_pending_bytes_per_peer: 2048,
        ..GossipConfig::default()
    };
    for (class, relay) in [(0, Relay::All), (1, Relay::Origin)] {
        config.classes.insert(
            ClassId(class),
            ClassPolicy::advertise(relay, Duration::from_secs(10)),
        );
    }
    let mut gossip = Gossip::new(config.clone(), |_: ClassId, p: &Bytes| p.len() % 2 == 0);
    let now = Instant::now();
    let peer = PeerId::from_bytes([1; 32]);
    gossip.handle_peer_up(peer, now);
    let _ = gossip.handle_batch(peer, &bytes, now);
    gossip.handle_timeout(now + Duration::from_secs(1));
    while gossip.poll_transmit().is_some() {}
    while gossip.poll_event().is_some() {}
    let (slots, budget_bytes) = gossip.peer_budget_used(&peer).unwrap_or_default();
    assert!(slots <= config.max_pending_per_peer);
    assert!(budget_bytes <= config.max_pending_bytes_per_peer);
    assert!(gossip.memory_bytes() <= config.memory_bound_bytes(1));
});
