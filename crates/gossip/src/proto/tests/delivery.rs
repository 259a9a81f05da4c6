//! Delivery across whole networks: full meshes at scale, whole-batch loss with a partition,
//! churn, any connected network, sparse networks (the neighbours cover), refused sends and
//! lost requests.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use meshwire_proto::testnet::Link;
use proptest::prelude::*;

use super::*;

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
    assert_every_node_holds(&net, &published, &format!("seed {seed}: "));
    // Some shares missed their publisher's copy and came by a pull after an ihave.
    let pulled: u64 = (0..NODES).map(|i| net.stats(i, SHARE).pulls_received).sum();
    assert!(pulled > 0);
}

/// Every node of `net` holds every artifact of `published`.
fn assert_every_node_holds(net: &Net, published: &[(usize, ArtifactId)], context: &str) {
    for index in 0..net.nodes.len() {
        let missing: Vec<_> = published
            .iter()
            .filter(|(_, id)| !net.nodes[index].has(id))
            .collect();
        assert!(
            missing.is_empty(),
            "{context}node {index} lacks {missing:?}"
        );
    }
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
    assert_every_node_holds(&net, &published, "");
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
