//! One peer floods a gossip node with a million adverts, ihaves, prunes and requests each; the
//! node's heap, measured with the counting allocator, stays within its configured memory bound.

use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire_alloc_count::{
    is_installed, mark_thread, reset_tracked, track_marked_threads, tracked_live_and_peak,
    untracked, CountingAllocator,
};
use meshwire_gossip::proto::{
    encode_batch, ArtifactId, ClassId, ClassPolicy, Gossip, GossipConfig, Item, Relay,
};
use meshwire_proto::PeerId;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const BLOCK: ClassId = ClassId(2);
const SHARE: ClassId = ClassId(3);

fn peer(index: u8) -> PeerId {
    PeerId::from_bytes([index + 1; 32])
}

#[test]
fn a_flooding_peer_leaves_the_heap_within_the_configured_bound() {
    assert!(is_installed());
    let expiry = Duration::from_secs(30);
    let mut config = GossipConfig {
        max_pool_artifacts: 1000,
        max_pool_bytes: 1 << 20,
        max_pending_per_peer: 1000,
        max_pending_bytes_per_peer: 1 << 20,
        max_tombstones: 1000,
        ..GossipConfig::default()
    };
    config
        .classes
        .insert(BLOCK, ClassPolicy::advertise(Relay::All, expiry));
    config.classes.insert(
        SHARE,
        ClassPolicy {
            relay: Relay::All,
            push_whole_max_bytes: 1024,
            latency_sensitive: false,
            expiry,
        },
    );
    let peers: Vec<PeerId> = (1..9).map(peer).collect();
    let attacker = peers[0];
    let bound = config.memory_bound_bytes(peers.len());

    mark_thread(true);
    track_marked_threads();
    reset_tracked();
    let mut now = Instant::now();
    let mut gossip = Gossip::new(config, |_: ClassId, _: &Bytes| true);
    gossip.set_local_id(peer(0));
    for p in &peers {
        gossip.handle_peer_up(*p, now);
    }
    // Shares the victim holds and relays, from honest upstreams. (Their payloads are slices of
    // batch buffers allocated untracked: 64 × 209 B the measurement leaves out.)
    let mut held = Vec::new();
    for seed in 0..64u8 {
        let share: Bytes = (0..200).map(|i| seed.wrapping_add(i as u8)).collect();
        held.push(ArtifactId::of(SHARE, &share));
        let batch = untracked(|| {
            encode_batch(&[Item::Artifact {
                class: SHARE,
                payload: share,
            }])
        });
        gossip
            .handle_batch(peers[1 + seed as usize % 7], &batch, now)
            .unwrap();
        untracked(|| drop(batch));
    }
    let mut rng = SmallRng::seed_from_u64(3);
    let mut peak_accounted = 0;
    for kind in 0..4 {
        for _ in 0..1000 {
            // The attacker's encoding is its own memory, not the victim's.
            let batch = untracked(|| {
                let items: Vec<Item> = (0..1000)
                    .map(|_| {
                        let id = if rng.random::<bool>() {
                            held[rng.random_range(0..held.len())]
                        } else {
                            ArtifactId(rng.random())
                        };
                        let size = rng.random_range(1..4096);
                        match kind {
                            0 => Item::Advert {
                                class: BLOCK,
                                id,
                                size,
                            },
                            1 => Item::IHave {
                                class: BLOCK,
                                id,
                                size,
                            },
                            2 => Item::Prune(id),
                            _ => Item::Request(id),
                        }
                    })
                    .collect();
                encode_batch(&items)
            });
            gossip.handle_batch(attacker, &batch, now).unwrap();
            // Its buffer was allocated untracked: free it untracked too, so live bytes stay exact.
            untracked(|| drop(batch));
            peak_accounted = peak_accounted.max(gossip.memory_bytes());
            now += Duration::from_millis(2);
            gossip.handle_timeout(now);
            while gossip.poll_transmit().is_some() {}
        }
    }
    let (live, peak) = tracked_live_and_peak();
    mark_thread(false);
    assert!(peak_accounted <= bound);
    assert!(
        live >= 0,
        "live bytes {live}: a free was attributed to the victim wrongly"
    );
    assert!(
        peak > 0 && (peak as u64) <= bound,
        "heap peak {peak} B (live {live} B) over the bound {bound} B"
    );
    let stats = gossip.stats()[&BLOCK];
    assert_eq!(stats.adverts_received, 2_000_000);
    assert_eq!(stats.ihaves_received, 1_000_000);
    println!(
        "heap peak {peak} B, live {live} B, accounted peak {peak_accounted} B, bound {bound} B"
    );
}
