//! The daemon's batch pipeline round a ring of three nodes, driven over HTTP: a batch comes back
//! intact, only the first node submits, an oversized body is refused.
#![cfg(feature = "net")]

mod support;

use std::net::SocketAddr;

use meshwire::{Keypair, Node, NodeConfig};
use meshwire_objects::net::ring::RingConfig;
use meshwire_objects::net::{Daemon, ObjectConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// One HTTP/1.1 request with `Connection: close`: the status and the JSON body.
async fn request(
    daemon: &Daemon,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let address = daemon.http_address().unwrap();
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&raw[..split])
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    (status, serde_json::from_slice(&raw[split + 4..]).unwrap())
}

#[tokio::test]
async fn a_batch_goes_round_the_ring_and_comes_back_intact() {
    let keys: Vec<Keypair> = (1..=3u8)
        .map(|seed| Keypair::from_seed([seed; 32]))
        .collect();
    let mut ring = RingConfig::new(keys.iter().map(Keypair::peer_id).collect());
    ring.chunk_bytes = 64 * 1024;
    ring.max_batch_bytes = 1 << 20;
    let mut daemons = Vec::new();
    for key in keys {
        let node = Node::bind(NodeConfig::new(key), loopback()).unwrap();
        let daemon = Daemon::builder(ObjectConfig::default())
            .http(loopback())
            .ring(ring.clone())
            .start(node)
            .await
            .expect("the daemon starts");
        daemons.push(daemon);
    }
    support::mesh(&daemons.iter().collect::<Vec<_>>()).await;

    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (status, answer) = request(&daemons[0], "POST", "/pipeline/batches", &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["intact"], true);
    assert_eq!(answer["bytes"], 300_000);
    assert_eq!(answer["chunks"], 5);
    // A relay counts a batch once its successor has acknowledged the stream's end, which can be
    // a moment after the first node has read the last byte: wait for each count to settle.
    for (index, daemon) in daemons.iter().enumerate() {
        let state = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                let (status, state) = request(daemon, "GET", "/pipeline", b"").await;
                assert_eq!(status, 200);
                if state["completed"] != 0 || state["failed"] != 0 {
                    return state;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("node {index} never counted the batch"));
        assert_eq!(state["position"], index);
        assert_eq!(state["completed"], 1, "node {index}: {state}");
        assert_eq!(state["failed"], 0, "node {index}: {state}");
    }

    // Only the first node submits.
    let (status, answer) = request(&daemons[1], "POST", "/pipeline/batches", b"x").await;
    assert_eq!(status, 409);
    assert_eq!(answer["error"], "not_first");
    // A body over the limit is refused before it is read.
    let (status, answer) = request(
        &daemons[0],
        "POST",
        "/pipeline/batches",
        &vec![0u8; (1 << 20) + 1],
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(answer["error"], "too_large");
    assert_eq!(answer["max_bytes"], 1 << 20);
    // An empty batch goes round too.
    let (status, answer) = request(&daemons[0], "POST", "/pipeline/batches", b"").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["intact"], true);
}

#[tokio::test]
async fn a_node_outside_its_ring_refuses_to_start() {
    let outsider = Keypair::from_seed([9; 32]);
    let ring = RingConfig::new(vec![
        Keypair::from_seed([1; 32]).peer_id(),
        Keypair::from_seed([2; 32]).peer_id(),
    ]);
    let node = Node::bind(NodeConfig::new(outsider), loopback()).unwrap();
    let error = Daemon::builder(ObjectConfig::default())
        .ring(ring)
        .start(node)
        .await
        .expect_err("a node outside the ring must not start");
    assert!(error.to_string().contains("not in the ring"), "{error}");
}
