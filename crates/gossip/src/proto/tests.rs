//! Gossip state machine tests: small networks on the shared test network, in virtual time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire_proto::testnet::{Link, TestNet};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

mod delivery;

const INGRESS: ClassId = ClassId(1);
const BLOCK: ClassId = ClassId(2);
const SHARE: ClassId = ClassId(3);

type Check = Box<dyn FnMut(ClassId, &Bytes) -> bool>;
type DropRule = Box<dyn FnMut(usize, usize, &Bytes) -> bool>;

fn config() -> GossipConfig {
    let expiry = Duration::from_secs(30);
    let mut config = GossipConfig::default();
    config
        .classes
        .insert(INGRESS, ClassPolicy::advertise(Relay::Origin, expiry));
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
    config
}

fn peer(index: usize) -> PeerId {
    PeerId::from_bytes([index as u8 + 1; 32])
}

fn accept_all() -> Check {
    Box::new(|_, _| true)
}

/// One-way latency of every link.
const LATENCY: Duration = Duration::from_millis(20);

/// Gossip nodes on the shared test network; batches on a link may be dropped by `drop_batch`.
struct Net {
    nodes: Vec<Gossip<Check>>,
    wire: TestNet<usize, Bytes>,
    delivered: Vec<Vec<(ArtifactId, ClassId)>>,
    drop_batch: DropRule,
    /// Whether a dropped batch is reported to its sender as refused (as the driver reports a
    /// peer's full send queue).
    report_drops: bool,
}

impl Net {
    /// Nodes joined by links of [`LATENCY`] both ways.
    fn new(validators: Vec<Check>, links: &[(usize, usize)]) -> Self {
        let links = links.iter().map(|&(a, b)| (a, b, Link::new(LATENCY)));
        Self::with_links(validators, links.collect())
    }

    /// Nodes joined by the given links, the same both ways.
    fn with_links(validators: Vec<Check>, links: Vec<(usize, usize, Link)>) -> Self {
        Self::with_config(validators, links, config(), 0)
    }

    /// Nodes with `config`, joined by `links`, on a wire whose random draws (loss, jitter)
    /// come from `seed`.
    fn with_config(
        validators: Vec<Check>,
        links: Vec<(usize, usize, Link)>,
        config: GossipConfig,
        seed: u64,
    ) -> Self {
        let mut wire = TestNet::new(Instant::now(), seed);
        let now = wire.now();
        let count = validators.len();
        let mut nodes: Vec<_> = validators
            .into_iter()
            .enumerate()
            .map(|(index, v)| {
                let mut node = Gossip::new(config.clone(), v);
                node.set_local_id(peer(index));
                node
            })
            .collect();
        for (a, b, link) in links {
            wire.connect(a, b, link).unwrap();
            nodes[a].handle_peer_up(peer(b), now);
            nodes[b].handle_peer_up(peer(a), now);
        }
        Self {
            nodes,
            wire,
            delivered: vec![Vec::new(); count],
            drop_batch: Box::new(|_, _, _| false),
            report_drops: false,
        }
    }

    fn full_mesh(count: usize) -> Self {
        let mut links = Vec::new();
        for a in 0..count {
            for b in a + 1..count {
                links.push((a, b));
            }
        }
        Self::new((0..count).map(|_| accept_all()).collect(), &links)
    }

    fn index_of(peer_id: &PeerId) -> usize {
        peer_id.as_bytes()[0] as usize - 1
    }

    fn drain(&mut self) {
        for index in 0..self.nodes.len() {
            while let Some(transmit) = self.nodes[index].poll_transmit() {
                for to in transmit.peers {
                    let to = Self::index_of(&to);
                    if !(self.drop_batch)(index, to, &transmit.batch) {
                        self.wire
                            .send(index, to, transmit.batch.clone())
                            .expect("sent over a link");
                    } else if self.report_drops {
                        let now = self.wire.now();
                        self.nodes[index].handle_send_refused(peer(to), now);
                    }
                }
            }
            while let Some(event) = self.nodes[index].poll_event() {
                if let Event::Delivered { id, class, .. } = event {
                    self.delivered[index].push((id, class));
                }
            }
        }
    }

    /// Runs for `duration` of simulated time, from wake-up to wake-up: batch arrivals and the
    /// nodes' timers.
    fn run(&mut self, duration: Duration) {
        let end = self.wire.now() + duration;
        loop {
            self.drain();
            let timers = self.nodes.iter().map(|node| node.poll_timeout());
            if !self.wire.step_until(timers, end) {
                break;
            }
            let now = self.wire.now();
            while let Some(arrival) = self.wire.poll_arrival() {
                self.nodes[arrival.to]
                    .handle_batch(peer(arrival.from), &arrival.message, now)
                    .unwrap();
            }
            for node in &mut self.nodes {
                if node.poll_timeout().is_some_and(|at| at <= now) {
                    node.handle_timeout(now);
                }
            }
        }
    }

    fn stats(&self, index: usize, class: ClassId) -> ClassStats {
        self.nodes[index]
            .stats()
            .get(&class)
            .copied()
            .unwrap_or_default()
    }
}

fn payload(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[test]
fn ids_are_content_hashes_per_class() {
    let a = ArtifactId::of(INGRESS, b"x");
    assert_eq!(a, ArtifactId::of(INGRESS, b"x"));
    assert_ne!(a, ArtifactId::of(BLOCK, b"x"));
    assert_ne!(a, ArtifactId::of(INGRESS, b"y"));
}

#[test]
fn all_artifacts_are_pulled_and_relayed_across_a_line() {
    // 0 - 1 - 2: node 2 hears of the block only through node 1's relay.
    let mut net = Net::new(
        vec![accept_all(), accept_all(), accept_all()],
        &[(0, 1), (1, 2)],
    );
    let id = net.nodes[0]
        .publish(BLOCK, payload(1, 5000), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(500));
    assert!(net.nodes[1].has(&id) && net.nodes[2].has(&id));
    assert_eq!(net.delivered[2], vec![(id, BLOCK)]);
    assert_eq!(net.stats(1, BLOCK).pulls_received, 1);
    // Node 1 relays to its only other peer (its eager set), not back to its upstream.
    assert_eq!(net.stats(1, BLOCK).adverts_sent, 1);
    assert_eq!(net.stats(2, BLOCK).pulls_received, 1);
}

#[test]
fn origin_artifacts_are_never_re_advertised_by_a_receiver() {
    let mut net = Net::full_mesh(4);
    let mut ids = Vec::new();
    for seed in 0..10 {
        ids.push(
            net.nodes[0]
                .publish(INGRESS, payload(seed, 1000), net.wire.now())
                .unwrap(),
        );
    }
    net.run(Duration::from_millis(500));
    for receiver in 1..4 {
        for id in &ids {
            assert!(net.nodes[receiver].has(id));
        }
        let stats = net.stats(receiver, INGRESS);
        assert_eq!(stats.adverts_sent, 0, "node {receiver} re-advertised");
        assert_eq!(stats.pushes_sent, 0, "node {receiver} re-pushed");
        assert_eq!(stats.pulls_received, 10);
    }
    assert_eq!(net.stats(0, INGRESS).adverts_sent, 30);
}

#[test]
fn small_artifacts_are_pushed_whole_and_relays_are_pruned() {
    let mut net = Net::full_mesh(3);
    let id = net.nodes[0]
        .publish(SHARE, payload(7, 200), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(200));
    assert_eq!(net.stats(0, SHARE).pushes_sent, 2);
    for index in 1..3 {
        assert!(net.nodes[index].has(&id));
        let stats = net.stats(index, SHARE);
        assert_eq!(stats.pushes_received, 1, "one payload");
        assert_eq!(stats.requests_sent, 0);
        // The other receiver is this relay's tentative eager peer: it gets an eager advert,
        // already holds the share and prunes.
        assert_eq!(stats.pushes_sent, 0);
        assert_eq!(stats.adverts_sent, 1);
        assert_eq!(stats.prunes_sent, 1);
        assert_eq!(stats.prunes_received, 1);
        assert_eq!(
            net.nodes[index].eager_peers(&peer(0)),
            Some(BTreeSet::new()),
            "pruned"
        );
    }
    // A later share still goes from its publisher to every peer.
    net.nodes[0]
        .publish(SHARE, payload(8, 200), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(200));
    assert_eq!(net.stats(0, SHARE).pushes_sent, 4);
    // Node 2 left node 1's eager set, so it now gets a lazy advert, which asks no answer.
    let relay = net.stats(1, SHARE);
    assert_eq!((relay.pushes_sent, relay.ihaves_sent), (0, 1));
    assert_eq!(net.stats(2, SHARE).prunes_sent, 1);
    assert_eq!(net.stats(2, SHARE).duplicate_artifacts, 0);
}

#[test]
fn relay_to_all_relays_every_artifact_to_every_peer_without_prunes() {
    let mut net = Net::full_mesh(3);
    for node in &mut net.nodes {
        node.config.relay_to_all = true;
    }
    let id = net.nodes[0]
        .publish(SHARE, payload(9, 200), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(200));
    for index in 1..3 {
        assert!(net.nodes[index].has(&id));
        let stats = net.stats(index, SHARE);
        assert_eq!(stats.pushes_sent, 2, "to both peers, upstream included");
        assert_eq!(stats.prunes_sent, 0);
        assert!(stats.duplicate_artifacts >= 1);
    }
}

#[test]
fn a_rejected_artifact_is_not_relayed_and_its_sender_is_counted() {
    let reject: Check = Box::new(|_, _| false);
    let mut net = Net::new(vec![accept_all(), reject, accept_all()], &[(0, 1), (1, 2)]);
    let block = net.nodes[0]
        .publish(BLOCK, payload(1, 5000), net.wire.now())
        .unwrap();
    let share = net.nodes[0]
        .publish(SHARE, payload(2, 100), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(500));
    assert!(!net.nodes[1].has(&block) && !net.nodes[1].has(&share));
    assert!(!net.nodes[2].has(&block) && !net.nodes[2].has(&share));
    assert_eq!(net.nodes[1].rejected_from(&peer(0)), 2);
    for class in [BLOCK, SHARE] {
        assert_eq!(net.stats(1, class).rejected, 1);
        assert_eq!(net.stats(1, class).adverts_sent, 0);
        assert_eq!(net.stats(1, class).pushes_sent, 0);
        assert_eq!(net.stats(2, class), ClassStats::default());
    }
    // A second advert of the rejected block is a duplicate, not a second fetch.
    net.nodes[0].handle_peer_down(peer(1), net.wire.now());
    net.nodes[0].handle_peer_up(peer(1), net.wire.now());
    net.run(Duration::from_millis(200));
    assert_eq!(net.stats(1, BLOCK).requests_sent, 1);
    assert!(net.stats(1, BLOCK).duplicates >= 1);
}

#[test]
fn a_silent_advertiser_is_replaced_after_the_request_timeout() {
    // Nodes 0 and 2 both hold the block; 0 never answers 1's requests.
    let mut net = Net::new(
        vec![accept_all(), accept_all(), accept_all()],
        &[(0, 1), (1, 2), (0, 2)],
    );
    net.drop_batch = Box::new(|from, to, batch| {
        let items = decode_batch(batch, &config().batch_limits()).unwrap();
        from == 0 && to == 1 && items.iter().any(|i| matches!(i, Item::Artifact { .. }))
    });
    let block = net.nodes[0]
        .publish(BLOCK, payload(3, 5000), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(300));
    assert!(net.nodes[2].has(&block));
    assert!(!net.nodes[1].has(&block), "1 asked 0 first");
    net.run(Duration::from_millis(1000));
    assert!(net.nodes[1].has(&block), "1 fell back to 2");
    assert_eq!(net.stats(1, BLOCK).requests_sent, 2);
    assert_eq!(net.nodes[1].peer_budget_used(&peer(0)), Some((0, 0)));
    assert_eq!(net.nodes[1].pending_len(), 0);
}

#[test]
fn a_reconnected_peer_catches_up_on_all_artifacts() {
    let mut net = Net::full_mesh(2);
    net.nodes[0].handle_peer_down(peer(1), net.wire.now());
    net.nodes[1].handle_peer_down(peer(0), net.wire.now());
    let block = net.nodes[0]
        .publish(BLOCK, payload(4, 3000), net.wire.now())
        .unwrap();
    let ingress = net.nodes[0]
        .publish(INGRESS, payload(5, 1000), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(100));
    assert!(!net.nodes[1].has(&block));
    net.nodes[0].handle_peer_up(peer(1), net.wire.now());
    net.nodes[1].handle_peer_up(peer(0), net.wire.now());
    net.run(Duration::from_millis(200));
    assert!(net.nodes[1].has(&block) && net.nodes[1].has(&ingress));
}

#[test]
fn expiry_and_purge_remove_artifacts_and_late_adverts_are_duplicates() {
    let mut net = Net::full_mesh(2);
    let block = net.nodes[0]
        .publish(BLOCK, payload(6, 3000), net.wire.now())
        .unwrap();
    net.run(Duration::from_millis(200));
    assert!(net.nodes[1].has(&block));
    net.nodes[1].purge(block, net.wire.now());
    assert!(!net.nodes[1].has(&block));
    assert_eq!(net.nodes[1].pool_len(), 0);
    net.run(Duration::from_secs(31));
    assert_eq!(net.nodes[0].pool_len(), 0, "expired");
    // A late advert of an expired id is not fetched again while its tombstone lasts.
    net.nodes[0]
        .handle_batch(
            peer(1),
            &encode_batch(&[Item::Advert {
                class: BLOCK,
                id: block,
                size: 3000,
            }]),
            net.wire.now(),
        )
        .unwrap();
    assert_eq!(net.nodes[0].pending_len(), 0);
}

#[test]
fn a_purge_from_an_advertiser_moves_the_request_on() {
    let mut gossip = Gossip::new(config(), accept_all());
    let now = Instant::now();
    gossip.handle_peer_up(peer(1), now);
    gossip.handle_peer_up(peer(2), now);
    let id = ArtifactId([9; 32]);
    let advert = encode_batch(&[Item::Advert {
        class: BLOCK,
        id,
        size: 100,
    }]);
    gossip.handle_batch(peer(1), &advert, now).unwrap();
    gossip.handle_batch(peer(2), &advert, now).unwrap();
    gossip
        .handle_batch(peer(1), &encode_batch(&[Item::Purge(id)]), now)
        .unwrap();
    assert_eq!(gossip.peer_budget_used(&peer(1)), Some((0, 0)));
    assert_eq!(gossip.peer_budget_used(&peer(2)), Some((1, 100)));
    gossip.handle_timeout(now + Duration::from_millis(50));
    let requests: Vec<_> = std::iter::from_fn(|| gossip.poll_transmit())
        .flat_map(|t| {
            let items: Vec<Item> = decode_batch(&t.batch, &config().batch_limits())
                .unwrap()
                .into_iter()
                .filter(|item| !matches!(item, Item::Neighbours { .. }))
                .collect();
            t.peers.into_iter().map(move |p| (p, items.clone()))
        })
        .collect();
    assert_eq!(
        requests,
        vec![
            (peer(1), vec![Item::Request(id)]),
            (peer(2), vec![Item::Request(id)])
        ]
    );
}

#[test]
fn a_peer_flooding_a_million_adverts_stays_within_the_memory_bound() {
    let mut config = config();
    config.max_pending_per_peer = 1000;
    config.max_pending_bytes_per_peer = 1 << 20;
    config.max_tombstones = 1000;
    let mut gossip = Gossip::new(config.clone(), accept_all());
    let mut now = Instant::now();
    let attacker = peer(1);
    let honest = peer(2);
    gossip.handle_peer_up(attacker, now);
    gossip.handle_peer_up(honest, now);
    let bound = config.memory_bound_bytes(2);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut peak = 0;
    for _ in 0..1000 {
        let items: Vec<Item> = (0..1000)
            .map(|_| Item::Advert {
                class: BLOCK,
                id: ArtifactId(rng.random()),
                size: rng.random_range(1..4096),
            })
            .collect();
        gossip
            .handle_batch(attacker, &encode_batch(&items), now)
            .unwrap();
        now += Duration::from_millis(2);
        gossip.handle_timeout(now);
        while gossip.poll_transmit().is_some() {}
        let (slots, bytes) = gossip.peer_budget_used(&attacker).unwrap();
        assert!(slots <= config.max_pending_per_peer);
        assert!(bytes <= config.max_pending_bytes_per_peer);
        assert!(gossip.pending_len() <= config.max_pending_per_peer);
        peak = peak.max(gossip.memory_bytes());
    }
    assert!(peak <= bound, "peak {peak} over bound {bound}");
    let stats = gossip.stats()[&BLOCK];
    assert_eq!(stats.adverts_received, 1_000_000);
    assert!(stats.adverts_refused > 990_000, "{stats:?}");
    // The honest peer's budget is untouched: its advert is still taken and requested.
    let id = ArtifactId::of(BLOCK, b"honest");
    let advert = encode_batch(&[Item::Advert {
        class: BLOCK,
        id,
        size: 6,
    }]);
    gossip.handle_batch(honest, &advert, now).unwrap();
    assert_eq!(gossip.peer_budget_used(&honest), Some((1, 6)));
}

#[test]
fn a_peer_flooding_a_million_ihaves_prunes_or_grafts_stays_within_the_memory_bound() {
    let mut config = config();
    config.max_pending_per_peer = 1000;
    config.max_pending_bytes_per_peer = 1 << 20;
    config.max_tombstones = 1000;
    let mut gossip = Gossip::new(config.clone(), accept_all());
    gossip.set_local_id(peer(0));
    let mut now = Instant::now();
    let attacker = peer(1);
    let peers: Vec<PeerId> = (1..9).map(peer).collect();
    for p in &peers {
        gossip.handle_peer_up(*p, now);
    }
    // Artifacts the victim holds and relays, each from an honest upstream.
    let mut held = Vec::new();
    for seed in 0..64u8 {
        let share = payload(seed, 200);
        let id = ArtifactId::of(SHARE, &share);
        let batch = encode_batch(&[Item::Artifact {
            class: SHARE,
            payload: share,
        }]);
        gossip
            .handle_batch(peers[1 + seed as usize % 7], &batch, now)
            .unwrap();
        held.push(id);
    }
    let bound = config.memory_bound_bytes(peers.len());
    let mut rng = SmallRng::seed_from_u64(2);
    let mut peak = 0;
    for kind in 0..3 {
        for _ in 0..1000 {
            let items: Vec<Item> = (0..1000)
                .map(|_| {
                    let id = if rng.random::<bool>() {
                        held[rng.random_range(0..held.len())]
                    } else {
                        ArtifactId(rng.random())
                    };
                    match kind {
                        0 => Item::IHave {
                            class: SHARE,
                            id,
                            size: rng.random_range(1..4096),
                        },
                        1 => Item::Prune(id),
                        _ => Item::Request(id),
                    }
                })
                .collect();
            gossip
                .handle_batch(attacker, &encode_batch(&items), now)
                .unwrap();
            let (slots, bytes) = gossip.peer_budget_used(&attacker).unwrap();
            assert!(slots <= config.max_pending_per_peer);
            assert!(bytes <= config.max_pending_bytes_per_peer);
            peak = peak.max(gossip.memory_bytes());
            now += Duration::from_millis(2);
            gossip.handle_timeout(now);
            while gossip.poll_transmit().is_some() {}
            peak = peak.max(gossip.memory_bytes());
        }
    }
    assert!(peak <= bound, "peak {peak} over bound {bound}");
    let stats = gossip.stats()[&SHARE];
    assert_eq!(stats.ihaves_received, 1_000_000);
    assert!(stats.prunes_received > 400_000, "{stats:?}");
    assert!(gossip.unmatched_prunes() > 400_000);
    assert!(stats.requests_received > 400_000, "{stats:?}");
    // A graft adds the attacker once per upstream, whatever the number of requests.
    assert!(stats.grafts <= 7, "{stats:?}");
    for upstream in &peers {
        let eager = gossip.eager_peers(upstream).unwrap_or_default();
        assert!(eager.len() <= peers.len());
    }
    // Honest peers are unaffected: one's advert is still taken and requested.
    let id = ArtifactId::of(BLOCK, b"honest");
    let advert = encode_batch(&[Item::Advert {
        class: BLOCK,
        id,
        size: 6,
    }]);
    gossip.handle_batch(peers[2], &advert, now).unwrap();
    assert_eq!(gossip.peer_budget_used(&peers[2]), Some((1, 6)));
}

#[test]
fn local_calls_are_checked() {
    let mut config = config();
    config.max_pool_artifacts = 1;
    config.max_artifact_bytes = 10;
    let mut gossip = Gossip::new(config, accept_all());
    let now = Instant::now();
    assert_eq!(
        gossip.publish(ClassId(99), Bytes::new(), now),
        Err(GossipError::UnknownClass(ClassId(99)))
    );
    assert_eq!(
        gossip.publish(BLOCK, payload(0, 11), now),
        Err(GossipError::TooLarge { len: 11, max: 10 })
    );
    let id = gossip.publish(BLOCK, payload(0, 5), now).unwrap();
    assert_eq!(gossip.publish(BLOCK, payload(0, 5), now), Ok(id));
    assert_eq!(
        gossip.publish(BLOCK, payload(1, 5), now),
        Err(GossipError::PoolFull)
    );
    assert!(matches!(
        gossip.handle_batch(peer(1), &Bytes::from_static(&[7]), now),
        Err(GossipError::Codec(CodecError::UnsupportedVersion(7)))
    ));
}

fn arb_item() -> impl Strategy<Value = Item> {
    // Few ids and classes, so adverts, requests and artifacts collide with each other.
    let id = (0u8..8).prop_map(|b| ArtifactId([b; 32]));
    prop_oneof![
        (0u8..5, id.clone(), 0u32..5000).prop_map(|(c, id, size)| Item::Advert {
            class: ClassId(c),
            id,
            size
        }),
        id.clone().prop_map(Item::Request),
        (0u8..5, 0u8..8).prop_map(|(c, p)| Item::Artifact {
            class: ClassId(c),
            payload: payload(p, 64),
        }),
        id.clone().prop_map(Item::Purge),
        (0u8..5, id.clone(), 0u32..5000).prop_map(|(c, id, size)| Item::IHave {
            class: ClassId(c),
            id,
            size
        }),
        id.prop_map(Item::Prune),
    ]
}

proptest! {
    /// Whatever peers send, in any order, budgets stay within limits and are fully released once
    /// everything pending has timed out.
    #[test]
    fn budgets_hold_for_any_peer_input(
        steps in proptest::collection::vec((0usize..3, proptest::collection::vec(arb_item(), 0..12), 0u64..400), 1..60)
    ) {
        let mut config = config();
        config.max_pending_per_peer = 4;
        config.max_pending_bytes_per_peer = 8000;
        config.max_advertisers = 2;
        let mut gossip = Gossip::new(config.clone(), |_: ClassId, p: &Bytes| p[0] % 2 == 0);
        let mut now = Instant::now();
        for index in 0..3 {
            gossip.handle_peer_up(peer(index), now);
        }
        let mut delivered = BTreeMap::new();
        for (from, items, advance_ms) in steps {
            gossip.handle_batch(peer(from), &encode_batch(&items), now).unwrap();
            now += Duration::from_millis(advance_ms);
            gossip.handle_timeout(now);
            while gossip.poll_transmit().is_some() {}
            while let Some(event) = gossip.poll_event() {
                if let Event::Delivered { id, payload, .. } = event {
                    prop_assert_eq!(payload[0] % 2, 0, "a rejected payload was delivered");
                    prop_assert!(delivered.insert(id, ()).is_none(), "delivered twice");
                }
            }
            for index in 0..3 {
                let (slots, bytes) = gossip.peer_budget_used(&peer(index)).unwrap();
                prop_assert!(slots <= config.max_pending_per_peer);
                prop_assert!(bytes <= config.max_pending_bytes_per_peer);
            }
            prop_assert!(gossip.memory_bytes() <= config.memory_bound_bytes(3));
        }
        // Every pending entry is dropped after at most 2 × max_advertisers requests (each
        // advertiser is asked twice on average), one request timeout apart.
        for _ in 0..=2 * config.max_advertisers {
            now += config.request_timeout;
            gossip.handle_timeout(now);
        }
        prop_assert_eq!(gossip.pending_len(), 0);
        for index in 0..3 {
            prop_assert_eq!(gossip.peer_budget_used(&peer(index)), Some((0, 0)));
        }
    }
}
