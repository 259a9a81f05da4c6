//! Helpers shared by the integration tests: seeded nodes on loopback and event waits.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use meshwire::{Backoff, ConnectionEvent, Keypair, Node, NodeConfig, PeerId};
use tokio::sync::broadcast;

/// A generous bound for things that happen in milliseconds on loopback; exceeding it is a hang.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A node config with a seeded identity and short backoff for tests.
pub fn config(seed: u8) -> NodeConfig {
    let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
    config.backoff = Backoff {
        floor: Duration::from_millis(20),
        cap: Duration::from_millis(300),
    };
    config.dial_timeout = Duration::from_secs(2);
    config.rng_seed = Some(u64::from(seed));
    config
}

pub fn start(seed: u8) -> Node {
    Node::bind(config(seed), loopback()).unwrap()
}

pub async fn connect(from: &Node, to: &Node) {
    from.connect(to.local_addr().unwrap(), to.peer_id())
        .await
        .unwrap();
}

/// Waits until `node` lists `peer` as connected.
pub async fn until_connected(node: &Node, peer: PeerId) {
    tokio::time::timeout(PATIENCE, async {
        while !node.connected_peers().contains(&peer) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("peer never connected");
}

/// Waits for the first event matching `predicate`.
pub async fn next_event(
    events: &mut broadcast::Receiver<ConnectionEvent>,
    predicate: impl Fn(&ConnectionEvent) -> bool,
) -> ConnectionEvent {
    tokio::time::timeout(PATIENCE, async {
        loop {
            match events.recv().await {
                Ok(event) if predicate(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => panic!("event stream closed"),
            }
        }
    })
    .await
    .expect("event never arrived")
}

/// Sends `payload` from `from` to `to` on `protocol` and returns what `inbox` (to's subscription)
/// receives next.
pub async fn round_trip_message(
    from: &Node,
    to: PeerId,
    protocol: meshwire::ProtocolId,
    payload: bytes::Bytes,
    inbox: &mut meshwire::Inbox,
) -> meshwire::InboundMessage {
    from.send(to, protocol, payload).await.unwrap();
    tokio::time::timeout(PATIENCE, inbox.recv())
        .await
        .expect("message never arrived")
        .expect("inbox closed")
}
