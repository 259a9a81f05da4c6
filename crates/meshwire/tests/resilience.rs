//! Restarts, reconnects and malformed input from peers.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshwire::proto::wire::Destination;
use meshwire::proto::wire::{EncodedMessage, Kind, Limits, MsgHeader, ProtocolId};
use meshwire::tls::{client_crypto, TlsIdentity};
use meshwire::{ConnectionEvent, Keypair, Node, PeerId, CLOSE_PROTOCOL_VIOLATION};
use support::*;

const CHAT: ProtocolId = ProtocolId(1);

/// Binds a node to `address`, retrying while the previous owner's socket is still being released.
async fn bind_again(seed: u8, address: SocketAddr) -> Node {
    for _ in 0..200 {
        match Node::bind(config(seed), address) {
            Ok(node) => return node,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("address {address} never became free");
}

#[tokio::test]
async fn a_restarted_peer_is_reconnected_within_the_backoff_bound() {
    let a = start(1);
    let b = start(2);
    let b_address = b.local_addr().unwrap();
    let b_id = b.peer_id();
    let mut events = a.events();
    a.add_peer(b_address, b_id).unwrap();
    until_connected(&a, b_id).await;

    b.close().await;
    drop(b);
    next_event(
        &mut events,
        |e| matches!(e, ConnectionEvent::Disconnected { peer, .. } if *peer == b_id),
    )
    .await;
    assert!(a.connected_peers().is_empty());

    let b = bind_again(2, b_address).await;
    let restarted = tokio::time::Instant::now();
    let mut inbox = b.subscribe(CHAT).unwrap();
    until_connected(&a, b_id).await;
    // The wait is bounded by one backoff cap plus one dial; nothing here depends on luck.
    let bound = a.config().backoff.cap + a.config().dial_timeout;
    assert!(
        restarted.elapsed() <= bound,
        "{:?} > {bound:?}",
        restarted.elapsed()
    );
    assert_eq!(a.metrics().reconnect_count(), 1);

    let message = round_trip_message(
        &a,
        b_id,
        CHAT,
        Bytes::from_static(b"after restart"),
        &mut inbox,
    )
    .await;
    assert_eq!(&message.payload[..], b"after restart");
}

#[tokio::test]
async fn a_configured_peer_that_moved_is_redialed_at_its_new_address() {
    let a = start(1);
    let b = start(2);
    let b_id = b.peer_id();
    let mut events = a.events();
    a.add_peer(b.local_addr().unwrap(), b_id).unwrap();
    until_connected(&a, b_id).await;

    b.close().await;
    drop(b);
    next_event(
        &mut events,
        |e| matches!(e, ConnectionEvent::Disconnected { peer, .. } if *peer == b_id),
    )
    .await;
    // The same identity comes back on another port (a rescheduled pod gets a new address).
    let b = start(2);
    let mut inbox = b.subscribe(CHAT).unwrap();
    a.add_peer(b.local_addr().unwrap(), b_id).unwrap();
    until_connected(&a, b_id).await;
    let message =
        round_trip_message(&a, b_id, CHAT, Bytes::from_static(b"moved"), &mut inbox).await;
    assert_eq!(&message.payload[..], b"moved");
}

/// A raw QUIC connection with a valid identity, for sending bytes a meshwire node would never send.
async fn raw_connection(seed: u8, target: &Node) -> quinn::Connection {
    let identity = TlsIdentity::new(&Keypair::from_seed([seed; 32])).unwrap();
    let (crypto, _) = client_crypto(&identity, target.peer_id()).unwrap();
    let endpoint = quinn::Endpoint::client(loopback()).unwrap();
    endpoint
        .connect_with(
            quinn::ClientConfig::new(crypto),
            target.local_addr().unwrap(),
            &target.peer_id().to_string(),
        )
        .unwrap()
        .await
        .unwrap()
}

fn frame(kind: Kind, dst: PeerId, payload: &'static [u8]) -> Vec<u8> {
    let header = MsgHeader {
        kind,
        flags: 0,
        protocol: CHAT,
        message_id: 1,
    };
    EncodedMessage::encode(&header, Bytes::from_static(payload), &Limits::default())
        .unwrap()
        .to_contiguous(&Destination::new(&dst))
        .to_vec()
}

#[tokio::test]
async fn malformed_frames_close_the_offending_connection_only() {
    let node = start(1);
    let good = start(2);
    let mut inbox = node.subscribe(CHAT).unwrap();
    connect(&good, &node).await;
    let node_id = node.peer_id();

    let mut oversized = frame(Kind::Message, node_id, b"x");
    oversized[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut truncated = frame(Kind::Message, node_id, b"0123456789");
    truncated.truncate(truncated.len() - 4);
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("bad_magic", b"GET / HTTP/1.1\r\n\r\n".to_vec(), false),
        ("too_large", oversized, false),
        ("truncated", truncated, false),
        (
            "wrong_destination",
            frame(Kind::Message, good.peer_id(), b"hi"),
            false,
        ),
        (
            "unexpected_kind",
            frame(Kind::Response, node_id, b"hi"),
            false,
        ),
        (
            "unknown_kind",
            {
                let mut f = frame(Kind::Message, node_id, b"hi");
                f[8] = 77;
                f
            },
            false,
        ),
        ("empty_request", Vec::new(), true),
    ];
    for (index, (reason, bytes, on_request_stream)) in cases.into_iter().enumerate() {
        let raw = raw_connection(50 + index as u8, &node).await;
        if on_request_stream {
            let (mut send, _recv) = raw.open_bi().await.unwrap();
            send.write_all(&bytes).await.unwrap();
            send.finish().unwrap();
        } else {
            let mut send = raw.open_uni().await.unwrap();
            send.write_all(&bytes).await.unwrap();
            send.finish().unwrap();
        }
        let closed = tokio::time::timeout(PATIENCE, raw.closed())
            .await
            .expect("never closed");
        match closed {
            quinn::ConnectionError::ApplicationClosed(close) => {
                assert_eq!(
                    close.error_code,
                    quinn::VarInt::from_u32(CLOSE_PROTOCOL_VIOLATION)
                );
                assert_eq!(close.reason.as_ref(), reason.as_bytes());
            }
            other => panic!("{reason}: unexpected close {other:?}"),
        }
        assert_eq!(node.metrics().frame_error_count(reason), 1, "{reason}");

        // The well-behaved peer is still served: messages and requests both.
        let payload = Bytes::from(reason.as_bytes().to_vec());
        let message = round_trip_message(&good, node_id, CHAT, payload, &mut inbox).await;
        assert_eq!(message.payload, reason.as_bytes());
        assert_eq!(message.from, good.peer_id());
    }
    assert_eq!(node.connected_peers(), vec![good.peer_id()]);
}

#[tokio::test]
async fn an_oversized_request_gets_a_too_large_answer() {
    let mut config = config(1);
    config.limits.max_payload_bytes = 16;
    let node = Node::bind(config, loopback()).unwrap();
    let raw = raw_connection(60, &node).await;
    let (mut send, mut recv) = raw.open_bi().await.unwrap();
    send.write_all(&frame(
        Kind::Request,
        node.peer_id(),
        b"this payload is longer than sixteen bytes",
    ))
    .await
    .unwrap();
    send.finish().unwrap();
    let answer = tokio::time::timeout(PATIENCE, recv.read_to_end(1024))
        .await
        .unwrap()
        .unwrap();
    let decoded = meshwire::proto::wire::decode(&Bytes::from(answer), &Limits::default()).unwrap();
    assert_eq!(decoded.header.kind, Kind::ErrorResponse);
    assert_eq!(
        decoded.payload[0],
        meshwire::proto::wire::ErrorCode::TooLarge as u8
    );
    assert_eq!(node.metrics().frame_error_count("too_large"), 1);
    assert!(raw.close_reason().is_none(), "the connection stays open");
}
