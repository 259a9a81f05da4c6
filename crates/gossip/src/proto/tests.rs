//! Gossip state machine tests: small networks on the shared test network, in virtual time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire_proto::testnet::{Link, TestNet};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

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

/// Every node of a `count`-node full mesh publishes `shares` shares (pushed whole) and node
/// `round % count` a block (advertised) per round; returns what was published, with its origin.
fn publish_rounds(
    net: &mut Net,
    nodes: impl Iterator<Item = usize> + Clone,
    rounds: std::ops::Range<u8>,
    shares: u8,
) -> Vec<(usize, ArtifactId)> {
    let mut published = Vec::new();
    for round in rounds {
        for node in nodes.clone() {
            let now = net.wire.now();
            for share in 0..shares {
                let body = payload(round.wrapping_mul(7).wrapping_add(share), 256);
                let mut body = body.to_vec();
                body.extend_from_slice(&[node as u8, round, share]);
                let id = net.nodes[node].publish(SHARE, body.into(), now).unwrap();
                published.push((node, id));
            }
        }
        let maker = nodes
            .clone()
            .nth(round as usize % nodes.clone().count())
            .unwrap();
        let mut block = payload(round, 3000).to_vec();
        block.push(round);
        let id = net.nodes[maker]
            .publish(BLOCK, block.into(), net.wire.now())
            .unwrap();
        published.push((maker, id));
        net.run(Duration::from_millis(700));
    }
    published
}

#[test]
fn every_relayed_artifact_reaches_every_node_once_as_a_payload_in_a_32_node_mesh() {
    const NODES: usize = 32;
    let mut net = Net::full_mesh(NODES);
    // The connections come up and every node announces its peers before the first publish
    // (until a node has its peers' lists, it sends an ihave to every peer it relays to).
    net.run(Duration::from_millis(100));
    let published = publish_rounds(&mut net, 0..NODES, 0..4, 3);
    net.run(Duration::from_secs(2));
    let artifacts = published.len() as u64;
    for index in 0..NODES {
        let mut payloads = 0;
        let mut adverts = 0;
        for class in [SHARE, BLOCK] {
            let stats = net.stats(index, class);
            assert_eq!(
                stats.duplicate_artifacts, 0,
                "node {index} {class:?}: {stats:?}"
            );
            payloads += stats.pushes_received + stats.pulls_received;
            adverts += stats.adverts_received;
        }
        let own = published
            .iter()
            .filter(|(origin, _)| *origin == index)
            .count() as u64;
        assert_eq!(
            payloads,
            artifacts - own,
            "node {index}: one payload per artifact"
        );
        for (_, id) in &published {
            assert!(net.nodes[index].has(id), "node {index} lacks {id:?}");
        }
        // Adverts stay bounded: the block's advert from its maker, `lazy_fanout` ihaves per
        // artifact, the first eager adverts of each upstream before its prune, and about
        // `repair_window / repair_interval` repair ihaves per artifact (one more for a repair
        // tick's phase).
        let config = config();
        let repairs =
            (config.repair_window.as_millis() / config.repair_interval.as_millis()) as u64;
        let bound = artifacts * (1 + config.lazy_fanout as u64 + repairs + 1)
            + (NODES as u64 - 1) * config.eager_fanout as u64 * 4;
        assert!(
            adverts <= bound,
            "node {index}: {adverts} adverts, bound {bound}"
        );
    }
}

/// Whole batches are lost here (the test network drops 10% of them), which a retransmitting
/// transport never does: a node whose copy and every ihave were lost hears of the artifact again
/// only from periodic repair, and a lost request is sent again. With the defaults no node missed
/// an artifact at any of seeds 0-19; with repair off, at 2 of 20; before repair, the second try
/// of a request and the neighbours announcements, at 9 of seeds 1-9.
#[test]
fn relayed_artifacts_arrive_under_10_percent_loss_and_after_a_healed_partition() {
    for seed in 0..4 {
        lossy_partition_run(seed);
    }
}

fn lossy_partition_run(seed: u64) {
    use meshwire_proto::testnet::Loss;
    const NODES: usize = 32;
    let mut links = Vec::new();
    for a in 0..NODES {
        for b in a + 1..NODES {
            links.push((a, b, Link::new(LATENCY).with_loss(Loss::Random(0.1))));
        }
    }
    let validators = (0..NODES).map(|_| accept_all()).collect();
    let mut net = Net::with_config(validators, links, config(), seed);
    let mut published = publish_rounds(&mut net, 0..NODES, 0..3, 3);
    // Partition: the halves lose their connections to each other and keep publishing.
    const HALF: usize = NODES / 2;
    let half = HALF;
    let cross = |a: usize, b: usize| (a < HALF) != (b < HALF);
    let now = net.wire.now();
    for a in 0..NODES {
        for b in 0..NODES {
            if cross(a, b) {
                net.nodes[a].handle_peer_down(peer(b), now);
            }
        }
    }
    net.drop_batch = Box::new(move |from, to, _| cross(from, to));
    published.extend(publish_rounds(&mut net, 0..half, 3..5, 3));
    published.extend(publish_rounds(&mut net, half..NODES, 5..7, 3));
    // Heal: connections come back up, and catch-up adverts bring each side the other's.
    net.drop_batch = Box::new(|_, _, _| false);
    let now = net.wire.now();
    for a in 0..NODES {
        for b in 0..NODES {
            if cross(a, b) {
                net.nodes[a].handle_peer_up(peer(b), now);
            }
        }
    }
    net.run(Duration::from_secs(20));
    for index in 0..NODES {
        let missing: Vec<_> = published
            .iter()
            .filter(|(_, id)| !net.nodes[index].has(id))
            .collect();
        assert!(
            missing.is_empty(),
            "seed {seed}: node {index} lacks {missing:?}"
        );
    }
    // Some shares missed their publisher's copy and came by a pull after an ihave.
    let pulled: u64 = (0..NODES).map(|i| net.stats(i, SHARE).pulls_received).sum();
    assert!(pulled > 0);
}

#[test]
fn relayed_artifacts_reach_nodes_that_leave_and_rejoin() {
    const NODES: usize = 16;
    let mut net = Net::full_mesh(NODES);
    let mut published = publish_rounds(&mut net, 0..NODES, 0..2, 3);
    // Churn: nodes 3, 7 and 11 leave one after another, each missing a round, and rejoin.
    for leaving in [3usize, 7, 11] {
        let now = net.wire.now();
        for other in (0..NODES).filter(|other| *other != leaving) {
            net.nodes[other].handle_peer_down(peer(leaving), now);
            net.nodes[leaving].handle_peer_down(peer(other), now);
        }
        net.drop_batch = Box::new(move |from, to, _| from == leaving || to == leaving);
        let staying = (0..NODES).filter(move |node| *node != leaving);
        let round = leaving as u8 + 10;
        published.extend(publish_rounds(&mut net, staying, round..round + 1, 3));
        net.drop_batch = Box::new(|_, _, _| false);
        let now = net.wire.now();
        for other in (0..NODES).filter(|other| *other != leaving) {
            net.nodes[other].handle_peer_up(peer(leaving), now);
            net.nodes[leaving].handle_peer_up(peer(other), now);
        }
    }
    net.run(Duration::from_secs(5));
    for index in 0..NODES {
        let missing: Vec<_> = published
            .iter()
            .filter(|(_, id)| !net.nodes[index].has(id))
            .collect();
        assert!(missing.is_empty(), "node {index} lacks {missing:?}");
    }
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

/// A connected graph: node i > 0 links to one node before it, plus extra links; each link has a
/// latency of 1-80 ms and a jitter of up to 20 ms (which reorders batches).
fn arb_network() -> impl Strategy<Value = (usize, Vec<(usize, usize, Link)>)> {
    (2usize..7).prop_flat_map(|count| {
        let tree: Vec<_> = (1..count).map(|node| 0..node).collect();
        let extra = proptest::collection::vec((0..count, 0..count), 0..count);
        let delays = proptest::collection::vec((1u64..80, 0u64..20), 2 * count);
        (Just(count), tree, extra, delays).prop_map(|(count, tree, extra, delays)| {
            let mut pairs = BTreeSet::new();
            for (index, parent) in tree.into_iter().enumerate() {
                pairs.insert((parent, index + 1));
            }
            for (a, b) in extra {
                if a != b {
                    pairs.insert((a.min(b), a.max(b)));
                }
            }
            let links = pairs
                .into_iter()
                .zip(delays.into_iter().cycle())
                .map(|((a, b), (latency, jitter))| {
                    let link = Link::new(Duration::from_millis(latency))
                        .with_jitter(Duration::from_millis(jitter));
                    (a, b, link)
                })
                .collect();
            (count, links)
        })
    })
}

proptest! {
    // A fixed seed, so that a run is reproducible. Random seeds found sparse networks where a
    // relayed share missed a leaf (fixed by the neighbours announcements; the case is
    // `a_leaf_behind_a_well_connected_node_hears_of_every_relayed_artifact`); 20,000 cases
    // at each of several other seeds pass.
    #![proptest_config(ProptestConfig {
        cases: 128,
        rng_seed: proptest::test_runner::RngSeed::Fixed(1),
        ..ProptestConfig::default()
    })]

    /// On any connected network with reordering links, every relayed artifact (advertised or
    /// pushed) reaches every node and an origin-only one reaches exactly the publisher's
    /// neighbours; each is delivered once per node, and nothing stays pending or charged.
    #[test]
    fn artifacts_reach_every_node_of_any_connected_network(
        (count, links) in arb_network(),
        publishes in proptest::collection::vec((0usize..7, 0usize..3, 1usize..6000, 0u64..300), 1..12),
    ) {
        let neighbours: BTreeSet<(usize, usize)> = links
            .iter()
            .flat_map(|(a, b, _)| [(*a, *b), (*b, *a)])
            .collect();
        let mut net = Net::with_links((0..count).map(|_| accept_all()).collect(), links);
        let mut published = Vec::new();
        for (seed, (node, class, len, wait_ms)) in publishes.into_iter().enumerate() {
            net.run(Duration::from_millis(wait_ms));
            let node = node % count;
            let (class, len) = match class {
                0 => (INGRESS, len),
                1 => (BLOCK, len),
                _ => (SHARE, 1 + len % 1024),
            };
            let id = net.nodes[node]
                .publish(class, payload(seed as u8, len), net.wire.now())
                .unwrap();
            published.push((node, class, id));
        }
        net.run(Duration::from_secs(10));
        for index in 0..count {
            let mut expected: Vec<(ArtifactId, ClassId)> = published
                .iter()
                .filter(|(origin, class, _)| {
                    *origin != index
                        && (*class != INGRESS || neighbours.contains(&(*origin, index)))
                })
                .map(|&(_, class, id)| (id, class))
                .collect();
            expected.sort();
            let mut delivered = net.delivered[index].clone();
            delivered.sort();
            prop_assert_eq!(delivered, expected, "node {}", index);
            for &(origin, class, id) in &published {
                let reached =
                    class != INGRESS || origin == index || neighbours.contains(&(origin, index));
                prop_assert_eq!(net.nodes[index].has(&id), reached, "node {} {:?}", index, id);
            }
            prop_assert_eq!(net.nodes[index].pending_len(), 0);
            for other in 0..count {
                if neighbours.contains(&(index, other)) {
                    prop_assert_eq!(net.nodes[index].peer_budget_used(&peer(other)), Some((0, 0)));
                }
            }
        }
    }
}

/// A leaf (node 5) hangs off node 1, whose other peers all reach each publisher themselves, so
/// node 1's eager sets empty and its two ring ihaves went elsewhere: before the neighbours
/// announcements node 5 never heard of the last share (a case proptest found).
#[test]
fn a_leaf_behind_a_well_connected_node_hears_of_every_relayed_artifact() {
    let link = |a: usize, b: usize, latency: u64, jitter: u64| {
        let link =
            Link::new(Duration::from_millis(latency)).with_jitter(Duration::from_millis(jitter));
        (a, b, link)
    };
    let links = vec![
        link(0, 1, 7, 1),
        link(0, 2, 5, 6),
        link(0, 4, 67, 1),
        link(1, 2, 37, 4),
        link(1, 4, 1, 0),
        link(1, 5, 27, 5),
        link(2, 3, 11, 7),
        link(2, 4, 5, 11),
    ];
    let mut net = Net::with_links((0..6).map(|_| accept_all()).collect(), links);
    let publishes = [
        (1, BLOCK, 1, 0),
        (4, SHARE, 2, 9),
        (2, INGRESS, 1, 65),
        (0, INGRESS, 1, 85),
        (2, BLOCK, 1, 0),
        (2, SHARE, 453, 165),
    ];
    let mut relayed = Vec::new();
    for (seed, (node, class, len, wait_ms)) in publishes.into_iter().enumerate() {
        net.run(Duration::from_millis(wait_ms));
        let id = net.nodes[node]
            .publish(class, payload(seed as u8, len), net.wire.now())
            .unwrap();
        if class != INGRESS {
            relayed.push(id);
        }
    }
    net.run(Duration::from_secs(10));
    for id in &relayed {
        assert!(net.nodes[5].has(id), "the leaf lacks {id:?}");
    }
    // The leaf's list and node 1's are known to each other; node 1 sent it cover ihaves.
    assert!(net.nodes[1]
        .neighbours_of(&peer(5))
        .is_some_and(|n| n.contains(&peer(1))));
    assert!(net.nodes[1]
        .stats()
        .values()
        .any(|s| s.cover_ihaves_sent > 0));
}

/// A peer is skipped only when the artifact's upstream and the peer list each other: a peer
/// that claims a neighbour does not make this node skip it, and a stale announcement is
/// ignored.
#[test]
fn neighbours_announcements_must_agree_and_be_newer() {
    let mut gossip = Gossip::new(config(), accept_all());
    let now = Instant::now();
    for index in 1..=3 {
        gossip.handle_peer_up(peer(index), now);
    }
    let announce = |seq: u64, peers: &[usize]| {
        encode_batch(&[Item::Neighbours {
            seq,
            peers: peers.iter().map(|index| peer(*index)).collect(),
        }])
    };
    // Peer 1 claims peers 2 and 3; only peer 2 lists peer 1 back.
    gossip
        .handle_batch(peer(1), &announce(5, &[0, 2, 3]), now)
        .unwrap();
    gossip
        .handle_batch(peer(2), &announce(1, &[0, 1]), now)
        .unwrap();
    gossip
        .handle_batch(peer(3), &announce(1, &[0]), now)
        .unwrap();
    assert!(gossip.reaches(&peer(1), &peer(2)));
    assert!(!gossip.reaches(&peer(1), &peer(3)), "a one-sided claim");
    // An older announcement from peer 1 changes nothing.
    gossip
        .handle_batch(peer(1), &announce(4, &[0]), now)
        .unwrap();
    assert!(gossip.reaches(&peer(1), &peer(2)));
    assert_eq!(gossip.neighbour_stats().stale, 1);
    // A share relayed from peer 1 goes to peer 3 (not reached) and not to peer 2 beyond the
    // eager set and ring (peer 2 is reached by peer 1).
    gossip
        .handle_batch(
            peer(1),
            &encode_batch(&[Item::Artifact {
                class: SHARE,
                payload: payload(3, 100),
            }]),
            now,
        )
        .unwrap();
    gossip.handle_timeout(now + Duration::from_secs(1));
    let mut to_three = false;
    while let Some(transmit) = gossip.poll_transmit() {
        let items = decode_batch(&transmit.batch, &config().batch_limits()).unwrap();
        let relays = items
            .iter()
            .any(|item| matches!(item, Item::IHave { .. } | Item::Advert { .. }));
        to_three |= relays && transmit.peers.contains(&peer(3));
    }
    assert!(to_three, "peer 3 heard of the share");
    // A peer that goes away takes its list with it.
    gossip.handle_peer_down(peer(1), now);
    assert!(gossip.neighbours_of(&peer(1)).is_none());
}

/// A node that keeps its peer set private sends no announcements, and still hears of every
/// relayed artifact (its peers count it as reached by no one).
#[test]
fn a_node_that_does_not_announce_its_peers_still_hears_of_every_artifact() {
    let mut net = Net::new(
        (0..4).map(|_| accept_all()).collect(),
        &[(0, 1), (0, 2), (1, 2), (2, 3)],
    );
    let mut private = config();
    private.announce_neighbours = false;
    net.nodes[3] = Gossip::new(private, accept_all());
    net.nodes[3].set_local_id(peer(3));
    net.nodes[3].handle_peer_up(peer(2), net.wire.now());
    net.run(Duration::from_millis(100));
    let ids: Vec<_> = (0..6u8)
        .map(|seed| {
            net.nodes[usize::from(seed % 2)]
                .publish(SHARE, payload(seed, 300), net.wire.now())
                .unwrap()
        })
        .collect();
    net.run(Duration::from_secs(5));
    assert!(ids.iter().all(|id| net.nodes[3].has(id)));
    assert_eq!(net.nodes[3].neighbour_stats().sent, 0);
    assert!(net.nodes[2].neighbours_of(&peer(3)).is_none());
}

/// A hub's batch to one of its leaves is refused (a full send queue): reported, the leaf gets
/// the hub's next repair and the share; unreported, the tick's one random peer is another leaf
/// and the leaf never hears of it.
#[test]
fn a_peer_that_refused_a_batch_gets_the_next_repair() {
    for report in [true, false] {
        let links: Vec<(usize, usize)> = (1..9).map(|leaf| (0, leaf)).collect();
        let mut net = Net::new((0..9).map(|_| accept_all()).collect(), &links);
        net.run(Duration::from_millis(100));
        let mut dropped = false;
        net.drop_batch = Box::new(move |from, to, batch| {
            let share = decode_batch(batch, &config().batch_limits())
                .unwrap()
                .iter()
                .any(|item| matches!(item, Item::Artifact { .. }));
            let drop = from == 0 && to == 2 && share && !dropped;
            dropped |= drop;
            drop
        });
        net.report_drops = report;
        let id = net.nodes[0]
            .publish(SHARE, payload(1, 300), net.wire.now())
            .unwrap();
        net.run(Duration::from_secs(3));
        assert_eq!(net.nodes[0].send_refusals(), u64::from(report));
        assert_eq!(net.nodes[2].has(&id), report, "reported: {report}");
        for leaf in (1..9).filter(|leaf| *leaf != 2) {
            assert!(net.nodes[leaf].has(&id));
        }
    }
}

/// A request (or its answer) lost once does not lose the artifact when its only advertiser is
/// asked again after the request timeout; an advertiser that never answers is forgotten after
/// its second try and its budget released.
#[test]
fn a_lost_request_is_sent_again_to_the_only_advertiser() {
    let mut net = Net::new(vec![accept_all(), accept_all()], &[(0, 1)]);
    let mut dropped = 0;
    net.drop_batch = Box::new(move |from, _, batch| {
        let request = decode_batch(batch, &config().batch_limits())
            .unwrap()
            .iter()
            .any(|item| matches!(item, Item::Request(_)));
        let drop = from == 1 && request && dropped == 0;
        dropped += usize::from(drop);
        drop
    });
    let id = net.nodes[0]
        .publish(BLOCK, payload(4, 3000), net.wire.now())
        .unwrap();
    net.run(Duration::from_secs(3));
    assert!(net.nodes[1].has(&id));
    assert_eq!(net.stats(1, BLOCK).requests_sent, 2);

    // A silent advertiser: asked twice, then forgotten.
    let mut gossip = Gossip::new(config(), accept_all());
    let now = Instant::now();
    gossip.handle_peer_up(peer(1), now);
    let silent = ArtifactId([5; 32]);
    let advert = encode_batch(&[Item::Advert {
        class: BLOCK,
        id: silent,
        size: 10,
    }]);
    gossip.handle_batch(peer(1), &advert, now).unwrap();
    let timeout = config().request_timeout;
    gossip.handle_timeout(now + timeout);
    assert_eq!(gossip.pending_len(), 1, "asked again");
    gossip.handle_timeout(now + timeout * 2);
    assert_eq!(gossip.pending_len(), 0);
    assert_eq!(gossip.peer_budget_used(&peer(1)), Some((0, 0)));
    assert_eq!(gossip.stats()[&BLOCK].requests_sent, 2);
}
