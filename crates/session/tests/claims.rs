//! `SessionSettings::claim_window`: a session that claims its window on its connection holds a
//! claim there while it sends and withdraws it when it ends; a session that does not claims
//! nothing. Two nodes on loopback.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::time::Duration;

use meshwire::{Keypair, Node, NodeConfig};
use meshwire_session::net::{SessionHost, SessionSettings};
use meshwire_session::proto::PathId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(20);
const BYTES: usize = 4 << 20;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

fn node(seed: u8) -> Node {
    let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
    config.rng_seed = Some(u64::from(seed));
    Node::bind(config, loopback()).expect("bind on loopback")
}

/// Sends `BYTES` from one node to another over one direct path and returns the largest claim
/// seen on the sender's connection while the stream was read, and the claim left once the
/// sending session has ended.
async fn transfer(claim_window: bool) -> (u64, u64) {
    let settings = SessionSettings {
        claim_window,
        ..SessionSettings::default()
    };
    let (sender, receiver) = (node(1), node(2));
    sender
        .connect(receiver.local_addr().unwrap(), receiver.peer_id())
        .await
        .unwrap();
    let sending = SessionHost::new(&sender, settings).unwrap();
    let receiving = SessionHost::new(&receiver, settings).unwrap();
    let session = sending.open(receiver.peer_id()).unwrap();
    session.add_direct_path(PathId(0)).unwrap();
    let reader = tokio::spawn(async move {
        let mut incoming = receiving.incoming();
        let mut session = incoming.recv().await.expect("a session");
        let mut received = Vec::new();
        session.read_to_end(&mut received).await.unwrap();
        received.len()
    });
    let peer = receiver.peer_id();
    let watcher = {
        let sender = sender.clone();
        tokio::spawn(async move {
            let mut most = 0;
            while let Some(cell) = sender.datagram_allowance(peer) {
                most = most.max(cell.bytes());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            most
        })
    };
    (&session).write_all(&vec![7u8; BYTES]).await.unwrap();
    (&session).shutdown().await.unwrap();
    let received = tokio::time::timeout(DEADLINE, reader)
        .await
        .expect("the stream was read in time")
        .unwrap();
    assert_eq!(received, BYTES);
    drop(session);
    // The driver ends once what was written is acknowledged; then the claim is withdrawn.
    let cell = sender.datagram_allowance(peer).expect("still connected");
    let left = tokio::time::timeout(DEADLINE, async {
        while cell.bytes() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_or(cell.bytes(), |()| 0);
    receiver.close().await;
    let most = watcher.await.unwrap();
    (most, left)
}

#[tokio::test]
async fn a_claiming_session_claims_its_window_while_it_sends_and_withdraws_it() {
    let (most, left) = transfer(true).await;
    assert!(most > 0, "no claim was made");
    assert_eq!(left, 0, "the claim outlived the session");
}

#[tokio::test]
async fn a_session_claims_nothing_by_default() {
    let (most, left) = transfer(false).await;
    assert_eq!((most, left), (0, 0));
}
