//! Reads at quorum on loopback daemons: the content travels once, and only the winner's.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::OBJECT_STORE as STORE;
use meshwire::PeerId;
use meshwire_objects::net::{Daemon, ObjectConfig, PhysicalClock, SystemClock};
use meshwire_objects::proto::clock;
use meshwire_objects::proto::object::{self, content_hash, Fetched, Stamp};
use meshwire_objects::proto::quorum::QuorumConfig;

mod support;

use support::mesh;

const DEADLINE: Duration = Duration::from_secs(5);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

async fn start() -> Daemon {
    Daemon::builder(ObjectConfig::default())
        .bind(loopback(), |_| {})
        .await
        .unwrap()
}

/// Four members: a reader and three replicas it reads from (the reader holds no copy).
async fn cluster() -> [Daemon; 4] {
    let nodes = [start().await, start().await, start().await, start().await];
    let members: Vec<PeerId> = nodes.iter().map(|d| d.node().peer_id()).collect();
    for daemon in &nodes {
        daemon.service().set_members(members.iter().copied());
    }
    mesh(&[&nodes[0], &nodes[1], &nodes[2], &nodes[3]]).await;
    nodes
}

/// Stores `content` at `version` on `replica`, sent by `from`.
async fn store(from: &Daemon, replica: &Daemon, key: &str, version: u64, content: &[u8]) -> Stamp {
    let stamp = Stamp {
        version,
        hash: content_hash(content),
    };
    let now = clock::timestamp(SystemClock.now_ms(), 0);
    let mut message = object::encode_store_header(now, key, &stamp);
    message.extend_from_slice(content);
    let reply = from
        .node()
        .request(
            replica.node().peer_id(),
            STORE,
            Bytes::from(message),
            DEADLINE,
        )
        .await
        .expect("the replica answers");
    let answer = object::decode_stored(&reply).expect("a well-formed answer");
    assert!(answer.answer.is_ok(), "{:?}", answer.answer);
    stamp
}

fn carried(copies: &[(PeerId, Fetched<Bytes>)]) -> usize {
    copies
        .iter()
        .filter(|(_, fetched)| {
            matches!(
                fetched,
                Fetched::Present {
                    content: Some(_),
                    ..
                }
            )
        })
        .count()
}

#[tokio::test]
async fn a_quorum_read_moves_the_content_once_not_once_per_replica() {
    let nodes = cluster().await;
    let [reader, replicas @ ..] = &nodes;
    let content = vec![7u8; 4096];
    let version = clock::timestamp(SystemClock.now_ms(), 1);
    for replica in replicas {
        store(reader, replica, "wallet", version, &content).await;
    }
    let candidates: Vec<PeerId> = replicas.iter().map(|d| d.node().peer_id()).collect();
    for _ in 0..20 {
        let read = reader
            .service()
            .read_from(&candidates, "wallet", QuorumConfig::hedged(3, DEADLINE))
            .await
            .unwrap();
        assert!(read.outcome.reached(3));
        let object = read.object.expect("every replica holds the key");
        assert_eq!(object.content, content);
        assert_eq!(object.stamp.version, version);
        // One request in every three asks for the content: three replicas asked (four when the
        // plan explores) carry it once or twice, never three times.
        let full = carried(&read.copies);
        assert!(
            full <= read.outcome.asked.div_ceil(3) && full < read.copies.len(),
            "{full} of {} answers carried the content",
            read.copies.len()
        );
    }
    for daemon in nodes {
        daemon.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_stale_replicas_content_is_never_served_in_place_of_the_winner() {
    let nodes = cluster().await;
    let [reader, b, c, d] = &nodes;
    let old = clock::timestamp(SystemClock.now_ms(), 1);
    let new = clock::timestamp(SystemClock.now_ms(), 2);
    for replica in [b, c] {
        store(reader, replica, "k", new, b"the newer copy").await;
    }
    store(reader, d, "k", old, b"the older copy").await;
    let candidates: Vec<PeerId> = [b, c, d].iter().map(|n| n.node().peer_id()).collect();
    // The replica asked for the content is drawn at random: over many reads the stale one is.
    let stale = d.node().peer_id();
    for _ in 0..30 {
        let read = reader
            .service()
            .read_from(&candidates, "k", QuorumConfig::hedged(3, DEADLINE))
            .await
            .unwrap();
        let object = read.object.expect("the quorum holds the key");
        assert_eq!(object.stamp.version, new);
        assert_eq!(&object.content[..], b"the newer copy");
        let seen = read.copies.iter().find(|(peer, _)| *peer == stale);
        assert!(
            matches!(seen, Some((_, Fetched::Present { stamp, .. })) if stamp.version == old),
            "the quorum of three includes the stale copy"
        );
    }
    for daemon in nodes {
        daemon.shutdown().await.unwrap();
    }
}
