//! Connections, identities, messages, fan-out and requests between nodes on loopback.

mod support;

use std::time::Duration;

use bytes::Bytes;
use meshwire::{
    ConnectionEvent, DialError, Direction, HandlerError, Keypair, Node, NodeConfig, ProtocolId,
    QueueLimits, RequestError, SendError,
};
use support::*;

const CHAT: ProtocolId = ProtocolId(1);
const ECHO: ProtocolId = ProtocolId(2);

#[tokio::test]
async fn both_sides_learn_each_others_peer_id() {
    let a = start(1);
    let b = start(2);
    let mut b_events = b.events();
    connect(&a, &b).await;
    assert_eq!(a.connected_peers(), vec![b.peer_id()]);
    let event = next_event(&mut b_events, |e| {
        matches!(e, ConnectionEvent::Connected { .. })
    })
    .await;
    assert_eq!(
        event,
        ConnectionEvent::Connected {
            peer: a.peer_id(),
            address: a.local_addr().unwrap(),
            direction: Direction::Inbound,
        }
    );
    until_connected(&b, a.peer_id()).await;
    // Connecting again reuses the connection.
    connect(&a, &b).await;
    assert_eq!(a.peers().len(), 1);
}

#[tokio::test]
async fn dialing_the_wrong_identity_is_a_typed_error() {
    let a = start(1);
    let b = start(2);
    let impostor_expected = start(3).peer_id();
    let error = a
        .connect(b.local_addr().unwrap(), impostor_expected)
        .await
        .unwrap_err();
    match error {
        DialError::UnexpectedPeer { expected, actual } => {
            assert_eq!(expected, impostor_expected);
            assert_eq!(actual, b.peer_id());
        }
        other => panic!("expected UnexpectedPeer, got {other:?}"),
    }
    assert!(a.connected_peers().is_empty());
    assert!(matches!(
        a.connect(a.local_addr().unwrap(), a.peer_id()).await,
        Err(DialError::SelfDial)
    ));
}

#[tokio::test]
async fn peers_outside_the_allowlist_are_refused() {
    let a = start(1);
    let c = start(3);
    let mut config = config(2);
    config.allowlist = Some([c.peer_id()].into_iter().collect());
    let b = Node::bind(config, loopback()).unwrap();

    let error = a
        .connect(b.local_addr().unwrap(), b.peer_id())
        .await
        .unwrap_err();
    assert!(matches!(error, DialError::Refused(_)), "{error:?}");
    assert_eq!(b.metrics().handshakes_refused_count(), 1);
    assert!(b.connected_peers().is_empty());
    assert!(a.connected_peers().is_empty());

    // The allowed peer gets in, and b will not dial outside its list either.
    connect(&c, &b).await;
    until_connected(&b, c.peer_id()).await;
    assert!(matches!(
        b.connect(a.local_addr().unwrap(), a.peer_id()).await,
        Err(DialError::NotAllowed(_))
    ));
}

#[tokio::test]
async fn ten_thousand_messages_arrive_complete_and_in_order() {
    let a = start(1);
    let b = start(2);
    let mut inbox = b.subscribe(CHAT).unwrap();
    connect(&a, &b).await;
    const COUNT: u32 = 10_000;
    let sender = {
        let a = a.clone();
        let to = b.peer_id();
        tokio::spawn(async move {
            for i in 0..COUNT {
                let mut payload = i.to_le_bytes().to_vec();
                payload.resize(4 + (i as usize % 200), (i % 251) as u8);
                a.send(to, CHAT, Bytes::from(payload)).await.unwrap();
            }
        })
    };
    for i in 0..COUNT {
        let message = tokio::time::timeout(PATIENCE, inbox.recv())
            .await
            .expect("message never arrived")
            .expect("inbox closed");
        assert_eq!(message.from, a.peer_id());
        assert_eq!(message.protocol, CHAT);
        assert_eq!(message.payload.len(), 4 + (i as usize % 200));
        assert_eq!(&message.payload[..4], &i.to_le_bytes());
        assert!(message.payload[4..]
            .iter()
            .all(|&byte| byte == (i % 251) as u8));
    }
    sender.await.unwrap();
    assert_eq!(b.metrics().dropped_count("no_subscriber"), 0);
}

/// Each end asks the other, by an ACK_FREQUENCY frame, to acknowledge within
/// `meshwire::MAX_ACK_DELAY` rather than quinn's 25 ms, so a lost tail is probed about a round
/// trip after it was sent, and at the latest every `meshwire::ACK_ELICITING_THRESHOLD + 1`
/// packets.
#[tokio::test]
async fn each_end_asks_its_peer_for_prompt_acknowledgements() {
    let a = start(1);
    let b = start(2);
    let mut inbox = b.subscribe(CHAT).unwrap();
    connect(&a, &b).await;
    a.send(b.peer_id(), CHAT, Bytes::from_static(b"hello"))
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, inbox.recv())
        .await
        .expect("message never arrived")
        .expect("inbox closed");
    let frames = |node: &Node, peer| {
        let stats = node.connection_stats(peer).unwrap();
        (stats.frame_tx.ack_frequency, stats.frame_rx.ack_frequency)
    };
    tokio::time::timeout(PATIENCE, async {
        while frames(&a, b.peer_id()).0 == 0 || frames(&b, a.peer_id()).1 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("no ACK_FREQUENCY frame was exchanged");
    assert!(frames(&a, b.peer_id()).0 >= 1, "a asked b");
    assert!(frames(&b, a.peer_id()).1 >= 1, "b heard a's request");
}

#[tokio::test]
async fn send_many_delivers_identical_payloads_to_every_peer() {
    let sender = start(10);
    let receivers: Vec<Node> = (11..15).map(start).collect();
    let mut inboxes = Vec::new();
    for receiver in &receivers {
        inboxes.push(receiver.subscribe(CHAT).unwrap());
        connect(&sender, receiver).await;
    }
    let payload: Bytes = (0..256 * 1024u32).map(|i| (i * 7 % 256) as u8).collect();
    let ids: Vec<_> = receivers.iter().map(Node::peer_id).collect();
    let report = sender.send_many(&ids, CHAT, payload.clone()).unwrap();
    assert_eq!(report.queued, 4);
    assert!(report.failed.is_empty());
    for inbox in &mut inboxes {
        let message = tokio::time::timeout(PATIENCE, inbox.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.from, sender.peer_id());
        assert_eq!(message.payload, payload);
    }
    // Unknown destinations are reported, not fatal.
    let stranger = start(20).peer_id();
    let report = sender
        .send_many(&[ids[0], stranger], CHAT, Bytes::from_static(b"x"))
        .unwrap();
    assert_eq!(report.queued, 1);
    assert_eq!(
        report.failed,
        vec![(
            stranger,
            SendError::UnknownPeer {
                peer: stranger,
                payload: Bytes::from_static(b"x")
            }
        )]
    );
}

#[tokio::test]
async fn requests_get_responses_remote_errors_and_refusals() {
    let a = start(1);
    let b = start(2);
    b.handle(ECHO, |from, body: Bytes| async move {
        if body.as_ref() == b"fail" {
            return Err(HandlerError::Failed(
                format!("refusing {}", from.short()).into(),
            ));
        }
        Ok(body)
    })
    .unwrap();
    connect(&a, &b).await;
    let deadline = Duration::from_secs(5);
    let echoed = a
        .request(b.peer_id(), ECHO, Bytes::from_static(b"ping"), deadline)
        .await
        .unwrap();
    assert_eq!(&echoed[..], b"ping");

    let error = a
        .request(b.peer_id(), ECHO, Bytes::from_static(b"fail"), deadline)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        RequestError::Remote(format!("refusing {}", a.peer_id().short()))
    );

    let error = a
        .request(b.peer_id(), ProtocolId(99), Bytes::new(), deadline)
        .await
        .unwrap_err();
    assert!(matches!(error, RequestError::Refused(_)), "{error:?}");

    let stranger = start(3).peer_id();
    assert_eq!(
        a.request(stranger, ECHO, Bytes::new(), deadline).await,
        Err(RequestError::NotConnected(stranger))
    );
}

#[tokio::test]
async fn requests_read_whole_stop_no_stream() {
    // Each end reads a frame whose stream's end has arrived with it; neither asks the other to
    // stop sending on such a stream (a STOP_SENDING frame per request each way, before).
    let a = start(1);
    let b = start(2);
    b.handle(ECHO, |_, body: Bytes| async move { Ok(body) })
        .unwrap();
    connect(&a, &b).await;
    for index in 0..100u32 {
        let body = Bytes::from(index.to_le_bytes().to_vec());
        let echoed = a
            .request(b.peer_id(), ECHO, body.clone(), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(echoed, body);
    }
    let sent = |node: &Node, peer| node.connection_stats(peer).unwrap().frame_tx.stop_sending;
    assert_eq!(sent(&a, b.peer_id()), 0);
    assert_eq!(sent(&b, a.peer_id()), 0);
}

#[tokio::test]
async fn a_request_past_its_deadline_times_out() {
    let a = start(1);
    let b = start(2);
    b.handle(ECHO, |_, body| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(body)
    })
    .unwrap();
    connect(&a, &b).await;
    let deadline = Duration::from_millis(200);
    let result = a
        .request(b.peer_id(), ECHO, Bytes::from_static(b"slow"), deadline)
        .await;
    assert_eq!(result, Err(RequestError::Timeout(deadline)));
    // The connection is still good for other requests.
    b.handle(ProtocolId(3), |_, body| async move { Ok(body) })
        .unwrap();
    let fast = a
        .request(
            b.peer_id(),
            ProtocolId(3),
            Bytes::from_static(b"ok"),
            deadline * 10,
        )
        .await
        .unwrap();
    assert_eq!(&fast[..], b"ok");
}

#[tokio::test]
async fn oversized_messages_and_requests_are_refused_locally() {
    let mut config = config(1);
    config.limits.max_payload_bytes = 1024;
    let a = Node::bind(config, loopback()).unwrap();
    let b = start(2);
    connect(&a, &b).await;
    let big = Bytes::from(vec![0u8; 1025]);
    assert!(matches!(
        a.try_send(b.peer_id(), CHAT, big.clone()),
        Err(SendError::TooLarge { .. })
    ));
    assert!(matches!(
        a.request(b.peer_id(), ECHO, big, Duration::from_secs(1))
            .await,
        Err(RequestError::TooLarge(_))
    ));
}

#[tokio::test]
async fn a_slow_receiver_fills_only_its_own_bounded_queue() {
    let mut config = config(1);
    config.queue = QueueLimits {
        max_messages: 64,
        max_bytes: 20 * 1024 * 1024,
    };
    config.transport.bandwidth_bits_per_sec = 8_000_000; // small windows: the stall shows fast
    config.transport.max_rtt = Duration::from_millis(10);
    let a = Node::bind(config.clone(), loopback()).unwrap();
    let mut slow_config = support::config(2);
    slow_config.inbound_queue_messages = 1;
    slow_config.transport = config.transport.clone();
    let slow = Node::bind(slow_config, loopback()).unwrap();
    let _never_read = slow.subscribe(CHAT).unwrap();
    connect(&a, &slow).await;

    let payload = Bytes::from(vec![1u8; 16 * 1024]);
    let mut refused = None;
    for attempt in 0..10_000 {
        match a.try_send(slow.peer_id(), CHAT, payload.clone()) {
            Ok(()) => tokio::task::yield_now().await,
            Err(error) => {
                refused = Some((attempt, error));
                break;
            }
        }
    }
    let (attempt, error) = refused.expect("the queue never filled");
    // The refused payload comes back to the caller, the same bytes, not a copy.
    assert_eq!(
        error,
        SendError::QueueFull {
            peer: slow.peer_id(),
            payload: payload.clone()
        }
    );
    assert_eq!(error.into_payload().as_ptr(), payload.as_ptr());
    assert!(attempt < 10_000);
    let status = &a.peers()[0];
    assert!(status.queued_messages <= 64);
    assert!(status.queued_bytes <= 20 * 1024 * 1024);
    assert!(
        a.send_many(&[slow.peer_id()], CHAT, payload)
            .unwrap()
            .failed
            .len()
            == 1
    );
}

/// A subscriber that falls behind holds at most `inbound_queue_bytes` of payload, however many
/// messages the count bound would allow; nothing is dropped, and once it reads, every message
/// arrives in order.
#[tokio::test]
async fn an_unread_inbox_is_bounded_in_bytes_and_loses_nothing() {
    const MESSAGE_BYTES: usize = 200 * 1024;
    const MESSAGES: usize = 40;
    let a = start(40);
    let mut config = support::config(41);
    config.limits.max_payload_bytes = 256 * 1024;
    config.inbound_queue_bytes = 1024 * 1024;
    config.inbound_queue_messages = 1024;
    let b = Node::bind(config, loopback()).unwrap();
    let mut inbox = b.subscribe(CHAT).unwrap();
    connect(&a, &b).await;
    for index in 0..MESSAGES {
        a.send(
            b.peer_id(),
            CHAT,
            Bytes::from(vec![index as u8; MESSAGE_BYTES]),
        )
        .await
        .unwrap();
    }
    // Five messages of 200 KiB fill the 1 MiB budget; a sixth waits for room.
    let fits = 1024 * 1024 / MESSAGE_BYTES;
    tokio::time::timeout(support::PATIENCE, async {
        while inbox.len() < fits {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the inbox never filled");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        inbox.len(),
        fits,
        "the byte budget holds while nobody reads"
    );
    for index in 0..MESSAGES {
        let message = tokio::time::timeout(support::PATIENCE, inbox.recv())
            .await
            .expect("every message arrives once read")
            .unwrap();
        assert_eq!(message.payload.len(), MESSAGE_BYTES);
        assert!(message.payload.iter().all(|byte| *byte == index as u8));
    }
    assert!(inbox.is_empty());
}

#[tokio::test]
async fn simultaneous_dials_settle_on_one_connection() {
    for round in 0..3u8 {
        let a = start(30 + round * 2);
        let b = start(31 + round * 2);
        let (ab, ba) = tokio::join!(
            a.connect(b.local_addr().unwrap(), b.peer_id()),
            b.connect(a.local_addr().unwrap(), a.peer_id()),
        );
        ab.unwrap();
        ba.unwrap();
        until_connected(&a, b.peer_id()).await;
        until_connected(&b, a.peer_id()).await;
        // Let the losing connection's close reach both sides.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let a_view = a.peers();
        let b_view = b.peers();
        assert_eq!(a_view.len(), 1);
        assert_eq!(b_view.len(), 1);
        assert!(a_view[0].connected && b_view[0].connected);
        // Both sides kept the same connection: one sees it outbound, the other inbound, and the
        // kept one was dialed by the smaller identity.
        assert_ne!(a_view[0].direction, b_view[0].direction);
        let smaller_dialed = if a.peer_id() < b.peer_id() {
            a_view[0].direction == Some(Direction::Outbound)
        } else {
            b_view[0].direction == Some(Direction::Outbound)
        };
        assert!(smaller_dialed);
        assert!(a.metrics().encode_text().contains("meshwire_connections 1"));
        assert!(b.metrics().encode_text().contains("meshwire_connections 1"));
    }
}

/// A node asking for more kernel buffer than the kernel allows still starts, says what it got,
/// and exports both figures.
#[tokio::test]
async fn capped_socket_buffers_are_reported_not_fatal() {
    let mut config = NodeConfig::new(Keypair::generate());
    // 100 Gbit/s x 200 ms: 2.5 GB of bandwidth-delay product, asked for as 256 MiB per direction.
    config.transport.bandwidth_bits_per_sec = 100_000_000_000;
    let node = Node::bind(config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let buffers = node
        .socket_buffers()
        .expect("a bound node knows its buffers");
    assert_eq!(buffers.requested, 256 << 20);
    assert!(buffers.receive > 0 && buffers.send > 0);
    let text = node.metrics().encode_text();
    assert!(
        text.contains(&format!(
            "meshwire_udp_receive_buffer_bytes {}",
            buffers.receive
        )),
        "{text}"
    );
    if cfg!(target_os = "linux") {
        assert!(
            text.contains("meshwire_udp_receive_drops_total 0"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_departed_peer_leaves_no_metric_series() {
    let a = start(1);
    let b = start(2);
    connect(&a, &b).await;
    until_connected(&b, a.peer_id()).await;
    let series = |node: &Node| {
        node.metrics()
            .encode_text()
            .lines()
            .filter(|line| line.starts_with("meshwire_peer_rtt_seconds{"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let short = a.peer_id().short();
    assert!(
        series(&b).iter().any(|line| line.contains(&short)),
        "{:?}",
        series(&b)
    );
    // a only dialed b: b forgets a once the connection is gone, and its series with it.
    a.close().await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while series(&b).iter().any(|line| line.contains(&short)) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a's RTT series is removed");
}

/// A writer finishes its one-way stream after half the stream timeout idle, so the receiver
/// never stops a stream the writer still uses: messages sent after long pauses all arrive, and
/// the receiver counts no `stream_timeout`.
#[tokio::test]
async fn an_idle_writer_finishes_its_stream_before_the_receivers_timeout() {
    let short = |seed| {
        let mut config = config(seed);
        config.inbound_stream_timeout = Duration::from_millis(400);
        Node::bind(config, loopback()).unwrap()
    };
    let (a, b) = (short(1), short(2));
    connect(&a, &b).await;
    let mut inbox = b.subscribe(CHAT).unwrap();
    for round in 0..3u8 {
        a.send(b.peer_id(), CHAT, Bytes::from(vec![round]))
            .await
            .unwrap();
        let message = tokio::time::timeout(PATIENCE, inbox.recv())
            .await
            .expect("a message after a pause never arrived")
            .unwrap();
        assert_eq!(message.payload, Bytes::from(vec![round]));
        // Longer than the receiver's stream timeout.
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(b.metrics().frame_error_count("stream_timeout"), 0);
}
