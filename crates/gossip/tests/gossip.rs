//! Gossip over real nodes on loopback: delivery per relay policy, validation and metrics.

#[path = "../../meshwire/tests/support/mod.rs"]
mod support;

use std::time::Duration;

use bytes::Bytes;
use meshwire::Node;
use meshwire_gossip::proto::{ClassId, ClassPolicy, GossipConfig, Relay};
use meshwire_gossip::{Delivered, GossipService, GossipSettings, GossipValidator};
use support::*;
use tokio::sync::mpsc;

const INGRESS: ClassId = ClassId(1);
const BLOCK: ClassId = ClassId(2);

fn settings() -> GossipSettings {
    let mut config = GossipConfig::default();
    let expiry = Duration::from_secs(60);
    config.classes.insert(
        INGRESS,
        ClassPolicy {
            relay: Relay::Origin,
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

fn accept() -> GossipValidator {
    Box::new(|_, _| true)
}

async fn next(inbox: &mut mpsc::Receiver<Delivered>) -> Delivered {
    tokio::time::timeout(PATIENCE, inbox.recv())
        .await
        .expect("nothing delivered")
        .expect("stream ended")
}

/// Nodes in a line: 0 - 1 - 2, each running gossip with the given validator.
async fn line(
    validators: Vec<GossipValidator>,
) -> (
    Vec<Node>,
    Vec<GossipService>,
    Vec<mpsc::Receiver<Delivered>>,
) {
    let nodes: Vec<Node> = (0..validators.len() as u8).map(|i| start(40 + i)).collect();
    for pair in nodes.windows(2) {
        connect(&pair[0], &pair[1]).await;
        until_connected(&pair[1], pair[0].peer_id()).await;
    }
    let mut services = Vec::new();
    let mut inboxes = Vec::new();
    for (node, validator) in nodes.iter().zip(validators) {
        let (service, inbox) = GossipService::spawn(node, settings(), validator).unwrap();
        services.push(service);
        inboxes.push(inbox);
    }
    (nodes, services, inboxes)
}

#[tokio::test]
async fn all_artifacts_cross_a_line_and_origin_artifacts_stop_at_the_first_hop() {
    let (nodes, services, mut inboxes) = line(vec![accept(), accept(), accept()]).await;
    let ingress = services[0]
        .publish(INGRESS, Bytes::from_static(b"transfer 5 tokens"))
        .unwrap();
    let block: Bytes = (0..20_000).map(|i| (i % 251) as u8).collect();
    let block_id = services[0].publish(BLOCK, block.clone()).unwrap();

    let first = next(&mut inboxes[1]).await;
    let second = next(&mut inboxes[1]).await;
    let mut at_one = [first.id, second.id];
    at_one.sort();
    let mut expected = [ingress, block_id];
    expected.sort();
    assert_eq!(at_one, expected);
    assert_eq!(first.from, nodes[0].peer_id());

    let relayed = next(&mut inboxes[2]).await;
    assert_eq!(relayed.id, block_id);
    assert_eq!(relayed.payload, block);
    assert_eq!(relayed.from, nodes[1].peer_id());
    // The ingress is never relayed by node 1, so node 2 never gets it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(inboxes[2].try_recv().is_err());
    assert!(!services[2].has(&ingress));
    let stats = services[1].stats();
    assert_eq!(stats[&INGRESS].pushes_received, 1);
    assert_eq!(
        stats[&INGRESS].pushes_sent + stats[&INGRESS].adverts_sent,
        0
    );
    // Relayed to node 2 only: never back to the peer it came from.
    assert_eq!(stats[&BLOCK].adverts_sent, 1);

    let text = nodes[1].metrics().encode_text();
    assert!(
        text.contains("meshwire_gossip_adverts_total{class=\"2\",direction=\"sent\"} 1"),
        "{text}"
    );
    // Bytes carry their unit: the name ends in _bytes_total, and OpenMetrics says # UNIT.
    assert!(text.contains("meshwire_gossip_bytes_total{"), "{text}");
    assert!(
        text.contains("# UNIT meshwire_gossip_bytes bytes"),
        "{text}"
    );
}

#[tokio::test]
async fn a_rejected_artifact_is_not_relayed_over_the_network() {
    let refuse: GossipValidator = Box::new(|class, _| class != BLOCK);
    let (nodes, services, mut inboxes) = line(vec![accept(), refuse, accept()]).await;
    let block: Bytes = (0..5000).map(|i| (i % 13) as u8).collect();
    let id = services[0].publish(BLOCK, block).unwrap();
    // A later artifact that node 1 accepts arrives; the rejected one never does.
    let marker = services[0]
        .publish(INGRESS, Bytes::from_static(b"marker"))
        .unwrap();
    assert_eq!(next(&mut inboxes[1]).await.id, marker);
    tokio::time::timeout(PATIENCE, async {
        while services[1].rejected_from(&nodes[0].peer_id()) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the block was never rejected");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!services[1].has(&id) && !services[2].has(&id));
    assert!(inboxes[2].try_recv().is_err());
    assert_eq!(services[1].stats()[&BLOCK].adverts_sent, 0);
}

#[tokio::test]
async fn a_malformed_gossip_batch_closes_the_senders_connection() {
    let (nodes, _services, _inboxes) = line(vec![accept(), accept()]).await;
    let mut events = nodes[1].events();
    nodes[0]
        .send(
            nodes[1].peer_id(),
            meshwire::protocols::GOSSIP,
            Bytes::from_static(b"\xffnot a gossip batch"),
        )
        .await
        .unwrap();
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(meshwire::ConnectionEvent::Disconnected { peer, .. }) = events.recv().await {
                break peer;
            }
        }
    })
    .await
    .expect("the connection stayed open");
    assert_eq!(closed, nodes[0].peer_id());
    assert_eq!(nodes[1].metrics().frame_error_count("malformed_gossip"), 1);
}
