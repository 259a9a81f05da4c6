//! A peer flooding a relay with relay requests: the relay's heap stays bounded, it agrees to at
//! most `max_paths_per_peer` paths for that peer, counts every refused request, and an honest peer
//! still gets a path relayed. A malformed relay request is answered, counted, and closes the
//! sender's connection, and so does a datagram whose route header does not decode; the honest
//! peer's stays.
//!
//! The relay (node and session host) runs on its own runtime, whose thread is the counting
//! allocator's tracked context. `MESHWIRE_FLOOD_MESSAGES` sets the flood size (default 20,000).
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{SESSION_DATAGRAM, SESSION_RELAY};
use meshwire::{Keypair, Node, NodeConfig, RequestError};
use meshwire_alloc_count::{
    clear_tracker, mark_thread, reset_tracked_peak, track_marked_threads, tracked_live_and_peak,
    CountingAllocator,
};
use meshwire_session::net::{SessionHost, SessionSettings};
use meshwire_session::proto::route::{RelayOp, RelayReply, RelayRequest};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const MIB: f64 = 1024.0 * 1024.0;
const DEADLINE: Duration = Duration::from_secs(20);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

fn node_config(seed: u8) -> NodeConfig {
    let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
    config.rng_seed = Some(u64::from(seed));
    config
}

fn flood_messages() -> usize {
    std::env::var("MESHWIRE_FLOOD_MESSAGES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20_000)
}

#[test]
fn a_peer_flooding_relay_requests_gets_its_share_and_no_more() {
    track_marked_threads();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_thread = std::thread::spawn(move || {
        mark_thread(true);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let node = Node::bind(node_config(1), loopback()).unwrap();
            let host = SessionHost::new(&node, SessionSettings::default()).unwrap();
            ready_tx.send((node.clone(), host.clone())).unwrap();
            let _ = stopped.await;
            drop(host);
            node.close().await;
        });
    });
    let (relay, host) = ready_rx.recv().unwrap();
    let limits = SessionSettings::default().relay;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let messages = flood_messages();
    rt.block_on(async {
        let flooder = Node::bind(node_config(2), loopback()).unwrap();
        let honest = Node::bind(node_config(3), loopback()).unwrap();
        let other_end = Node::bind(node_config(4), loopback()).unwrap();
        for node in [&flooder, &honest, &other_end] {
            node.connect(relay.local_addr().unwrap(), relay.peer_id())
                .await
                .unwrap();
        }
        // The relay must see the other end connected before it agrees to relay to it.
        while !relay.connected_peers().contains(&other_end.peer_id()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let open = |session: u64| RelayRequest {
            op: RelayOp::Open,
            session,
            path: 0,
            peer: other_end.peer_id(),
        };
        let ask = |node: &Node, body: Bytes| {
            let node = node.clone();
            let relay = relay.peer_id();
            async move { node.request(relay, SESSION_RELAY, body, DEADLINE).await }
        };
        let honest_is_served = |session: u64| {
            let reply = ask(&honest, open(session).encode());
            async move {
                let reply = reply
                    .await
                    .expect("the honest peer's request was not answered");
                assert_eq!(RelayReply::decode(&reply).unwrap(), RelayReply::Accepted);
            }
        };
        honest_is_served(1_000_000_000).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = tracked_live_and_peak().0;
        reset_tracked_peak();
        let (mut accepted, mut full) = (0usize, 0usize);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..messages {
            if tasks.len() >= 512 {
                let (i, result) = tasks.join_next().await.unwrap().unwrap();
                tally(i, result, &mut accepted, &mut full);
            }
            let request = ask(&flooder, open(i as u64).encode());
            tasks.spawn(async move { (i, request.await) });
        }
        while let Some(done) = tasks.join_next().await {
            let (i, result) = done.unwrap();
            tally(i, result, &mut accepted, &mut full);
        }
        honest_is_served(1_000_000_001).await;
        let peak = tracked_live_and_peak().1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = tracked_live_and_peak().0;
        let stats = host.stats();
        eprintln!(
            "flood relay requests: {messages} sent, {accepted} accepted, {full} refused as full, \
             relay heap before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
            before as f64 / MIB,
            peak as f64 / MIB,
            after as f64 / MIB
        );
        assert_eq!(accepted, limits.max_paths_per_peer);
        assert_eq!(accepted + full, messages);
        assert_eq!(
            stats.relay_requests_refused.load(Ordering::Relaxed),
            full as u64
        );
        assert!(relay.connected_peers().contains(&flooder.peer_id()));
        // The bound of a bare node's floods (twice its connection window, as much again in
        // requests, 8 MiB of per-stream state); the table itself holds at most 64 agreements.
        let window = 2 * relay.config().transport.bdp_bytes() as i64;
        assert!(
            peak - before <= 2 * window + (8 << 20),
            "heap grew by {}",
            peak - before
        );
        assert!(
            (after - before) as f64 <= 0.1 * before as f64,
            "the relay's heap did not come back within 10%: {before} -> {after}"
        );

        let flooder_is_closed = |what: &'static str| {
            let (relay, flooder) = (relay.clone(), flooder.peer_id());
            async move {
                let closed = tokio::time::timeout(DEADLINE, async {
                    while relay.connected_peers().contains(&flooder) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                });
                closed
                    .await
                    .unwrap_or_else(|_| panic!("{what} sender is still connected"));
            }
        };
        // One byte short: the reason comes back, it is counted, and the connection closes.
        let body = open(messages as u64).encode();
        match ask(&flooder, body.slice(..body.len() - 1)).await {
            Err(RequestError::Remote(text)) => assert!(text.contains("malformed"), "{text}"),
            other => panic!("a malformed relay request: {other:?}"),
        }
        assert_eq!(stats.relay_requests_malformed.load(Ordering::Relaxed), 1);
        flooder_is_closed("the malformed request's").await;
        honest_is_served(1_000_000_002).await;

        // A datagram whose route header does not decode: counted, and the connection closes.
        flooder
            .connect(relay.local_addr().unwrap(), relay.peer_id())
            .await
            .unwrap();
        while !relay.connected_peers().contains(&flooder.peer_id()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        flooder
            .send_datagram(
                relay.peer_id(),
                SESSION_DATAGRAM,
                // A direct-route header cut short (an unknown kind would only be dropped).
                Bytes::from_static(&[1, 0, 0]),
            )
            .unwrap();
        flooder_is_closed("a malformed datagram's").await;
        assert_eq!(stats.malformed.load(Ordering::Relaxed), 1);
        assert_eq!(relay.metrics().frame_error_count("malformed_route"), 1);
        honest_is_served(1_000_000_003).await;
        for node in [flooder, honest, other_end] {
            node.close().await;
        }
    });
    let _ = stop.send(());
    relay_thread.join().unwrap();
    clear_tracker();
}

fn tally(i: usize, result: Result<Bytes, RequestError>, accepted: &mut usize, full: &mut usize) {
    match result {
        Ok(reply) => match RelayReply::decode(&reply).unwrap() {
            RelayReply::Accepted => *accepted += 1,
            RelayReply::Full => *full += 1,
            other => panic!("request {i}: {other:?}"),
        },
        Err(error) => panic!("request {i}: {error}"),
    }
}
