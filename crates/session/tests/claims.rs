//! `SessionSettings::claim_window`: a session that claims its window on its connection holds a
//! claim there while it sends (at least its startup burst) and withdraws it once everything it
//! wrote is acknowledged and it has been silent for its grace (a second); a session that does
//! not claims nothing. Two nodes on loopback.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

/// Waits until nothing is claimed on `cell`; returns what is still claimed at the deadline.
async fn withdrawn(cell: &meshwire::congestion::AllowanceCell) -> u64 {
    tokio::time::timeout(DEADLINE, async {
        while cell.bytes() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_or(cell.bytes(), |()| 0)
}

/// Sends `BYTES` from one node to another over one direct path and returns the largest claim
/// seen on the sender's connection while the stream was read, and the claim left once every
/// byte was acknowledged (the session still open).
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
        // The receive window may have grown, never past its bound.
        let (window, _) = session.receive_window();
        let config = settings.session;
        assert!(
            (config.receive_window_bytes..=config.max_receive_window_bytes).contains(&window),
            "receive window {window} B"
        );
        received.len()
    });
    let peer = receiver.peer_id();
    let cell = sender.datagram_allowance(peer).expect("connected");
    let most = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (cell, most) = (cell.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                most.fetch_max(cell.bytes(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    (&session).write_all(&vec![7u8; BYTES]).await.unwrap();
    (&session).shutdown().await.unwrap();
    let received = tokio::time::timeout(DEADLINE, reader)
        .await
        .expect("the stream was read in time")
        .unwrap();
    assert_eq!(received, BYTES);
    // Once every byte and the end are acknowledged the session has nothing to send: after its
    // grace it claims nothing, though it is still open.
    let left = withdrawn(&cell).await;
    watcher.abort();
    let most = most.load(Ordering::Relaxed);
    drop(session);
    receiver.close().await;
    (most, left)
}

#[tokio::test]
async fn a_claiming_session_claims_its_window_while_it_sends_and_withdraws_it() {
    let (most, left) = transfer(true).await;
    // At least the session's startup burst of 128 packets of about 1.1 kB.
    assert!(most >= 100_000, "claimed at most {most} bytes");
    assert_eq!(left, 0, "the claim outlived the data");
}

#[tokio::test]
async fn a_session_claims_nothing_by_default() {
    let (most, left) = transfer(false).await;
    assert_eq!((most, left), (0, 0));
}
