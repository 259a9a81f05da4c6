//! Gossip in the lab: `All` artifacts reach every node under heavy loss and after a partition heals.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire_gossip::proto::{ArtifactId, ClassId, ClassPolicy, GossipConfig, Relay};
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

/// `nodes` hosts in a full mesh run gossip; `publisher` publishes `artifacts` (alternating small
/// pushed shares and 20 KB advertised blocks) from `publish_at` on. Returns whether every node
/// held every artifact before `limit`, and what each node held.
fn run(
    link: LinkSpec,
    nodes: usize,
    artifacts: usize,
    publish_at: Duration,
    events: Vec<(Duration, LabEvent)>,
    limit: Duration,
) -> (
    bool,
    Vec<BTreeMap<ArtifactId, Duration>>,
    BTreeSet<ArtifactId>,
) {
    let mut lab = Lab::new(11, link, limit + Duration::from_secs(1));
    let names: Vec<String> = (0..nodes).map(|i| format!("g{i}")).collect();
    let ids: Vec<_> = names.iter().map(|name| lab.peer_id(name)).collect();
    let held: Held = Rc::new(RefCell::new(vec![BTreeMap::new(); nodes]));
    let published: Rc<RefCell<BTreeSet<ArtifactId>>> = Rc::default();
    let directory: Rc<RefCell<Vec<std::net::SocketAddr>>> = Rc::default();
    for (index, name) in names.iter().enumerate() {
        let (held, published, directory, ids) = (
            held.clone(),
            published.clone(),
            directory.clone(),
            ids.clone(),
        );
        lab.host(name, move |context| {
            let (held, published, directory, ids) = (
                held.clone(),
                published.clone(),
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
                if index == 0 {
                    tokio::time::sleep(publish_at.saturating_sub(clock())).await;
                    for n in 0..artifacts {
                        let (class, len) = if n % 2 == 0 {
                            (SHARE, 300)
                        } else {
                            (BLOCK, 20_000)
                        };
                        let payload: Bytes = (0..len).map(|i| (i * 7 + n) as u8).collect();
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
                let published = published.borrow();
                let complete = published.len() == artifacts
                    && held
                        .borrow()
                        .iter()
                        .all(|set| published.iter().all(|id| set.contains_key(id)));
                if complete {
                    return Ok(());
                }
            }
        });
    }
    for (at, event) in events {
        lab.at(at, event);
    }
    let finished = lab.run(limit, |_| {}).unwrap();
    let held = held.borrow().clone();
    let published = published.borrow().clone();
    (finished, held, published)
}

#[test]
fn all_artifacts_reach_every_node_under_ten_percent_loss() {
    let mut link = wan_link(Duration::from_millis(20), 100_000_000);
    link.loss = 0.1;
    let (finished, held, published) = run(
        link,
        5,
        20,
        Duration::from_secs(2),
        Vec::new(),
        Duration::from_secs(30),
    );
    assert_eq!(published.len(), 20);
    assert_everyone_holds(&held, &published);
    assert!(finished);
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
    let (finished, held, published) = run(
        link,
        4,
        10,
        Duration::from_secs(3),
        events,
        Duration::from_secs(70),
    );
    assert_eq!(published.len(), 10);
    assert_everyone_holds(&held, &published);
    // g3 got nothing while cut off: everything arrived after the repair.
    let first = held[3].values().min().copied().unwrap();
    assert!(
        first >= Duration::from_secs(31),
        "g3 got an artifact at {first:?}"
    );
    assert!(finished);
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
