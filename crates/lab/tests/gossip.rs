//! Gossip in the lab: `All` artifacts reach every node exactly once as a payload on a loss-free
//! full mesh, and still reach every node under heavy loss and after a partition heals.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire_gossip::proto::{ArtifactId, ClassId, ClassPolicy, ClassStats, GossipConfig, Relay};
use meshwire_gossip::{GossipService, GossipSettings};
use meshwire_lab::lab::{clock, wan_link};
use meshwire_lab::{Lab, LabEvent, LinkSpec};

const SHARE: ClassId = ClassId(1);
const BLOCK: ClassId = ClassId(2);

fn settings() -> GossipSettings {
    let expiry = Duration::from_secs(120);
    let mut config = GossipConfig::default();
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
        .classes
        .insert(BLOCK, ClassPolicy::advertise(Relay::All, expiry));
    GossipSettings::new(config)
}

/// Per node, each artifact it holds and when it got it.
type Held = Rc<RefCell<Vec<BTreeMap<ArtifactId, Duration>>>>;

/// What a run left: whether every node held every artifact before the limit, what each node
/// held, every id published, and each node's gossip counters a second after the last arrival.
struct Outcome {
    finished: bool,
    held: Vec<BTreeMap<ArtifactId, Duration>>,
    published: BTreeSet<ArtifactId>,
    stats: Vec<BTreeMap<ClassId, ClassStats>>,
}

/// `nodes` hosts in a full mesh run gossip; each of `publishers` publishes `artifacts`
/// (alternating small pushed shares and 20 KB advertised blocks) from `publish_at` on, one every
/// 50 ms.
fn run(
    link: LinkSpec,
    nodes: usize,
    publishers: &[usize],
    artifacts: usize,
    publish_at: Duration,
    events: Vec<(Duration, LabEvent)>,
    limit: Duration,
) -> Outcome {
    let mut lab = Lab::new(11, link, limit + Duration::from_secs(2));
    let names: Vec<String> = (0..nodes).map(|i| format!("g{i}")).collect();
    let ids: Vec<_> = names.iter().map(|name| lab.peer_id(name)).collect();
    let held: Held = Rc::new(RefCell::new(vec![BTreeMap::new(); nodes]));
    let published: Rc<RefCell<BTreeSet<ArtifactId>>> = Rc::default();
    let stats: Rc<RefCell<Vec<BTreeMap<ClassId, ClassStats>>>> =
        Rc::new(RefCell::new(vec![BTreeMap::new(); nodes]));
    let total = artifacts * publishers.len();
    let directory: Rc<RefCell<Vec<std::net::SocketAddr>>> = Rc::default();
    for (index, name) in names.iter().enumerate() {
        let publishes = publishers.contains(&index);
        let (held, published, stats, directory, ids) = (
            held.clone(),
            published.clone(),
            stats.clone(),
            directory.clone(),
            ids.clone(),
        );
        lab.host(name, move |context| {
            let (held, published, stats, directory, ids) = (
                held.clone(),
                published.clone(),
                stats.clone(),
                directory.clone(),
                ids.clone(),
            );
            async move {
                let (node, _) = context.start_node(context.node_config()).await?;
                let (gossip, mut delivered) =
                    GossipService::spawn(&node, settings(), Box::new(|_, _| true))?;
                let addresses = directory.borrow().clone();
                for (peer, address) in ids.iter().zip(&addresses).take(index) {
                    node.add_peer(*address, *peer)?;
                }
                {
                    let (gossip, stats) = (gossip.clone(), stats.clone());
                    tokio::task::spawn_local(async move {
                        loop {
                            stats.borrow_mut()[index] = gossip.stats();
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    });
                }
                if publishes {
                    tokio::time::sleep(publish_at.saturating_sub(clock())).await;
                    for n in 0..artifacts {
                        let (class, len) = if n % 2 == 0 {
                            (SHARE, 300)
                        } else {
                            (BLOCK, 20_000)
                        };
                        let payload: Bytes =
                            (0..len).map(|i| (i * 7 + n + 13 * index) as u8).collect();
                        let id = gossip.publish(class, payload)?;
                        published.borrow_mut().insert(id);
                        held.borrow_mut()[index].insert(id, clock());
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                while let Some(artifact) = delivered.recv().await {
                    held.borrow_mut()[index].insert(artifact.id, clock());
                }
                Ok(())
            }
        });
    }
    *directory.borrow_mut() = names
        .iter()
        .map(|name| lab.node_address(name))
        .collect::<Result<_, _>>()
        .unwrap();
    {
        let (held, published) = (held.clone(), published.clone());
        lab.client("observer", move |_| async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let complete = {
                    let published = published.borrow();
                    published.len() == total
                        && held
                            .borrow()
                            .iter()
                            .all(|set| published.iter().all(|id| set.contains_key(id)))
                };
                if complete {
                    // Time for any late copy to arrive and be counted.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return Ok(());
                }
            }
        });
    }
    for (at, event) in events {
        lab.at(at, event);
    }
    let finished = lab.run(limit + Duration::from_secs(1), |_| {}).unwrap();
    let held = held.borrow().clone();
    let published = published.borrow().clone();
    let stats = stats.borrow().clone();
    Outcome {
        finished,
        held,
        published,
        stats,
    }
}

/// 32 nodes, a full mesh without loss, three publishers: every node gets every `All` artifact
/// published by another node exactly once as a payload (the relay trees send the rest as adverts
/// and ihaves), and delivers each once.
#[test]
fn every_node_receives_each_artifact_once_as_a_payload_on_a_loss_free_mesh() {
    let link = wan_link(Duration::from_millis(20), 100_000_000);
    let publishers = [0, 13, 31];
    let artifacts = 6;
    let outcome = run(
        link,
        32,
        &publishers,
        artifacts,
        Duration::from_secs(3),
        Vec::new(),
        Duration::from_secs(20),
    );
    assert_eq!(outcome.published.len(), publishers.len() * artifacts);
    assert_everyone_holds(&outcome.held, &outcome.published);
    assert!(outcome.finished);
    for (index, stats) in outcome.stats.iter().enumerate() {
        let others = if publishers.contains(&index) {
            publishers.len() - 1
        } else {
            publishers.len()
        };
        for class in [SHARE, BLOCK] {
            let class_stats = &stats[&class];
            let payloads = class_stats.pushes_received + class_stats.pulls_received;
            let expected = (others * artifacts / 2) as u64;
            assert_eq!(
                (
                    payloads,
                    class_stats.delivered,
                    class_stats.duplicate_artifacts
                ),
                (expected, expected, 0),
                "node {index}, class {class:?}: payloads, delivered, duplicate payloads"
            );
        }
    }
}

#[test]
fn all_artifacts_reach_every_node_under_ten_percent_loss() {
    let mut link = wan_link(Duration::from_millis(20), 100_000_000);
    link.loss = 0.1;
    let outcome = run(
        link,
        5,
        &[0],
        20,
        Duration::from_secs(2),
        Vec::new(),
        Duration::from_secs(30),
    );
    assert_eq!(outcome.published.len(), 20);
    assert_everyone_holds(&outcome.held, &outcome.published);
    assert!(outcome.finished);
}

#[test]
fn all_artifacts_reach_every_node_after_a_healed_partition() {
    let link = wan_link(Duration::from_millis(20), 100_000_000);
    // g3 is cut off from everyone for 30 s, longer than the 20 s idle timeout: its connections
    // die, the artifacts published meanwhile cannot reach it, and it must catch up after the
    // partition heals and the nodes redial.
    let mut events = Vec::new();
    for other in ["g0", "g1", "g2"] {
        events.push((
            Duration::from_secs(1),
            LabEvent::Partition("g3".into(), other.into()),
        ));
        events.push((
            Duration::from_secs(31),
            LabEvent::Repair("g3".into(), other.into()),
        ));
    }
    let outcome = run(
        link,
        4,
        &[0],
        10,
        Duration::from_secs(3),
        events,
        Duration::from_secs(70),
    );
    assert_eq!(outcome.published.len(), 10);
    assert_everyone_holds(&outcome.held, &outcome.published);
    // g3 got nothing while cut off: everything arrived after the repair.
    let first = outcome.held[3].values().min().copied().unwrap();
    assert!(
        first >= Duration::from_secs(31),
        "g3 got an artifact at {first:?}"
    );
    assert!(outcome.finished);
}

fn assert_everyone_holds(
    held: &[BTreeMap<ArtifactId, Duration>],
    published: &BTreeSet<ArtifactId>,
) {
    for (index, set) in held.iter().enumerate() {
        let count = published.iter().filter(|id| set.contains_key(id)).count();
        assert_eq!(
            count,
            published.len(),
            "node {index} holds {count} of {}",
            published.len()
        );
    }
}
