//! How services attach to a node: one per protocol, a refused second, and lossless peer changes.

mod support;

use bytes::Bytes;
use meshwire::{Node, PeerChange, ProtocolId, RequestError, SendError, SubscribeError};
use support::*;

const CHAT: ProtocolId = ProtocolId(1);
const ECHO: ProtocolId = ProtocolId(2);

#[tokio::test]
async fn a_second_subscriber_to_a_protocol_is_refused_until_the_first_lets_go() {
    let node = start(1);
    let inbox = node.subscribe(CHAT).unwrap();
    assert_eq!(
        node.subscribe(CHAT).unwrap_err(),
        SubscribeError::AlreadySubscribed(CHAT)
    );
    drop(inbox);
    node.subscribe(CHAT).unwrap();

    let batches = node.subscribe_batches(CHAT).unwrap();
    assert_eq!(
        node.subscribe_batches(CHAT).unwrap_err(),
        SubscribeError::AlreadySubscribed(CHAT)
    );
    drop(batches);
    node.subscribe_batches(CHAT).unwrap();

    let datagrams = node.subscribe_datagrams(CHAT, 8).unwrap();
    assert_eq!(
        node.subscribe_datagrams(CHAT, 8).unwrap_err(),
        SubscribeError::AlreadySubscribed(CHAT)
    );
    drop(datagrams);
    node.subscribe_datagrams(CHAT, 8).unwrap();
}

#[tokio::test]
async fn a_second_handler_is_refused_and_the_first_keeps_serving() {
    let a = start(1);
    let b = start(2);
    b.handle(ECHO, |_, body| async move { Ok(body) }).unwrap();
    assert_eq!(
        b.handle(
            ECHO,
            |_, _| async move { Ok(Bytes::from_static(b"second")) }
        )
        .unwrap_err(),
        SubscribeError::AlreadySubscribed(ECHO)
    );
    connect(&a, &b).await;
    let answer = a
        .request(b.peer_id(), ECHO, Bytes::from_static(b"first"), PATIENCE)
        .await
        .unwrap();
    assert_eq!(&answer[..], b"first");

    // Removing the handler frees the protocol for another.
    assert!(b.stop_handling(ECHO));
    assert!(!b.stop_handling(ECHO));
    b.handle(
        ECHO,
        |_, _| async move { Ok(Bytes::from_static(b"second")) },
    )
    .unwrap();
    let answer = a
        .request(b.peer_id(), ECHO, Bytes::from_static(b"first"), PATIENCE)
        .await
        .unwrap();
    assert_eq!(&answer[..], b"second");
}

#[tokio::test]
async fn a_refused_send_hands_the_payload_back() {
    let a = start(1);
    let stranger = start(2).peer_id();
    let payload = Bytes::from(vec![9u8; 4096]);
    let error = a.send(stranger, CHAT, payload.clone()).await.unwrap_err();
    assert!(matches!(error, SendError::UnknownPeer { peer, .. } if peer == stranger));
    let returned = error.into_payload();
    assert_eq!(returned, payload);
    assert_eq!(
        returned.as_ptr(),
        payload.as_ptr(),
        "the same bytes, not a copy"
    );

    let mut config = config(3);
    config.limits.max_payload_bytes = 1024;
    let small = Node::bind(config, loopback()).unwrap();
    let big = Bytes::from(vec![1u8; 1025]);
    let error = small.try_send(stranger, CHAT, big.clone()).unwrap_err();
    assert!(matches!(error, SendError::TooLarge { .. }));
    assert_eq!(error.payload().as_ptr(), big.as_ptr());
}

/// Waits until `node` lists no connected peer.
async fn until_alone(node: &Node) {
    tokio::time::timeout(PATIENCE, async {
        while !node.connected_peers().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the peer never went away");
}

#[tokio::test]
async fn a_reader_that_reads_late_still_sees_the_peer_go_down_and_come_back() {
    let a = start(1);
    let mut changes = a.peer_events();
    let b = start(2);
    let b_id = b.peer_id();
    connect(&b, &a).await;
    until_connected(&a, b_id).await;
    assert_eq!(changes.recv().await, Some(PeerChange::Up(b_id)));
    // From here on the reader is slow: it reads nothing until the peer is back.
    b.close().await;
    drop(b);
    until_alone(&a).await;
    // The same identity comes back on a new socket.
    let b = start(2);
    connect(&b, &a).await;
    until_connected(&a, b_id).await;

    // Nothing was read since the peer came up; the bounce is still there, in order.
    let mut seen = Vec::new();
    while let Some(change) = changes.try_recv() {
        seen.push(change);
    }
    assert_eq!(seen, [PeerChange::Down(b_id), PeerChange::Up(b_id)]);

    // A subscriber that starts now first learns who is up.
    let mut late = a.peer_events();
    assert_eq!(late.recv().await, Some(PeerChange::Up(b_id)));
    assert_eq!(late.try_recv(), None);
}

#[tokio::test]
async fn datagrams_reach_only_the_subscriber_of_their_protocol() {
    let a = start(1);
    let b = start(2);
    let mut chat = b.subscribe_datagrams(CHAT, 64).unwrap();
    let mut echo = b.subscribe_datagrams(ECHO, 64).unwrap();
    connect(&a, &b).await;
    until_connected(&b, a.peer_id()).await;
    let unheard = ProtocolId(0x1234_5678);
    // Datagrams may be lost even on loopback: send until one of each has arrived (the unheard
    // one is counted as dropped). A connection's datagrams are routed in order by one task.
    let arrived = tokio::time::timeout(PATIENCE, async {
        let mut arrived = None;
        while arrived.is_none() || b.datagrams_dropped() == 0 {
            a.send_datagram(b.peer_id(), unheard, Bytes::from_static(b"nobody"))
                .unwrap();
            a.send_datagram(b.peer_id(), CHAT, Bytes::from_static(b"hello"))
                .unwrap();
            tokio::select! {
                Some(datagram) = chat.recv() => arrived = arrived.or(Some(datagram)),
                _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            }
        }
        arrived
    })
    .await
    .expect("the datagrams never arrived")
    .expect("one arrived");
    assert_eq!(arrived.from, a.peer_id());
    assert_eq!(arrived.protocol, CHAT);
    assert_eq!(&arrived.payload[..], b"hello");
    assert!(
        echo.try_recv().is_err(),
        "another protocol's subscriber got nothing"
    );
    assert!(
        b.datagrams_dropped() >= 1,
        "the unheard protocol's datagrams were dropped"
    );
}

#[tokio::test]
async fn requests_and_answers_in_two_pieces_arrive_whole() {
    let a = start(1);
    let b = start(2);
    // The answer is the request's last byte, then the whole request: two pieces.
    b.handle_parts(ECHO, |_, body| async move {
        let last = body.slice(body.len().saturating_sub(1)..);
        Ok((last, body))
    })
    .unwrap();
    connect(&a, &b).await;
    let content = Bytes::from(vec![7u8; 300_000]);
    for (head, body) in [
        (Bytes::from_static(b"head:"), content.clone()),
        (Bytes::new(), Bytes::from_static(b"body only")),
        (Bytes::from_static(b"head only"), Bytes::new()),
    ] {
        let answer = a
            .request_parts(b.peer_id(), ECHO, head.clone(), body.clone(), PATIENCE)
            .await
            .unwrap();
        let sent = [head, body].concat();
        assert_eq!(answer[0], *sent.last().unwrap());
        assert_eq!(answer[1..], sent[..]);
    }
}

#[tokio::test]
async fn a_request_that_finds_the_responders_budget_full_is_refused_as_busy() {
    let a = start(1);
    let mut small = config(2);
    small.limits.max_payload_bytes = 64 * 1024;
    small.inbound_request_bytes = 100 * 1024;
    let b = Node::bind(small, loopback()).unwrap();
    // The handler holds each request until released: the first holds 60 KiB of the budget.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let arrived = std::sync::Arc::new(tokio::sync::Notify::new());
    let (held, seen) = (release.clone(), arrived.clone());
    b.handle(ECHO, move |_, body| {
        let (held, seen) = (held.clone(), seen.clone());
        async move {
            seen.notify_one();
            held.notified().await;
            Ok(body)
        }
    })
    .unwrap();
    connect(&a, &b).await;
    let payload = Bytes::from(vec![1u8; 60 * 1024]);
    let first = tokio::spawn({
        let (a, b, payload) = (a.clone(), b.peer_id(), payload.clone());
        async move { a.request(b, ECHO, payload, PATIENCE).await }
    });
    arrived.notified().await;
    let second = a
        .request(b.peer_id(), ECHO, payload.clone(), PATIENCE)
        .await;
    assert!(matches!(second, Err(RequestError::Busy(_))), "{second:?}");
    assert_eq!(b.metrics().dropped_count("request_budget"), 1);
    release.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), payload);
}

/// A body source that hands out `pieces` one by one, then fails if `fail` is set.
struct Pieces {
    pieces: std::collections::VecDeque<Bytes>,
    fail: bool,
}

impl meshwire::BodySource for Pieces {
    async fn next_piece(&mut self) -> std::io::Result<Option<Bytes>> {
        match self.pieces.pop_front() {
            Some(piece) => Ok(Some(piece)),
            None if self.fail => Err(std::io::Error::other("disk gone")),
            None => Ok(None),
        }
    }
}

fn pieces(sizes: &[usize], fail: bool) -> (u64, Pieces) {
    let pieces: std::collections::VecDeque<Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| Bytes::from(vec![i as u8; n]))
        .collect();
    let len = pieces.iter().map(|p| p.len() as u64).sum();
    (len, Pieces { pieces, fail })
}

/// The handler reads a 5-byte head, then the rest piece by piece, and answers with the head,
/// the number of pieces and a digest of what it read (its length and byte sum).
fn serve_streamed(node: &Node) {
    node.handle_streamed(ECHO, |_, mut body| async move {
        let fail = |e: meshwire::BodyError| meshwire::HandlerError::Failed(Box::new(e));
        let head = body.read_exact(5).await.map_err(fail)?;
        let (mut pieces, mut len, mut sum) = (0u64, 0u64, 0u64);
        while let Some(piece) = body.next_piece().await.map_err(fail)? {
            assert!(piece.len() <= meshwire::STREAMED_PIECE_BYTES);
            pieces += 1;
            len += piece.len() as u64;
            sum += piece.iter().map(|&b| u64::from(b)).sum::<u64>();
        }
        Ok(Bytes::from(format!(
            "{} {pieces} {len} {sum}",
            String::from_utf8_lossy(&head)
        )))
    })
    .unwrap();
}

#[tokio::test]
async fn a_streamed_request_arrives_whole_in_pieces_and_holds_one_piece_of_budget() {
    let a = start(1);
    let mut small = config(2);
    small.limits.max_payload_bytes = 1536 * 1024;
    small.inbound_request_bytes = 1536 * 1024 + 1024;
    let b = Node::bind(small, loopback()).unwrap();
    serve_streamed(&b);
    // A whole request held by its handler takes 1 MiB of the 1.5 MiB budget.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let arrived = std::sync::Arc::new(tokio::sync::Notify::new());
    let (held, seen) = (release.clone(), arrived.clone());
    b.handle(CHAT, move |_, body| {
        let (held, seen) = (held.clone(), seen.clone());
        async move {
            seen.notify_one();
            held.notified().await;
            Ok(body.slice(..5))
        }
    })
    .unwrap();
    connect(&a, &b).await;
    let holder = tokio::spawn({
        let (a, b) = (a.clone(), b.peer_id());
        async move {
            a.request(b, CHAT, Bytes::from(vec![9u8; 1 << 20]), PATIENCE)
                .await
        }
    });
    arrived.notified().await;
    // 1.25 MiB streamed fits beside it: it reserves one piece, not its whole payload.
    let sizes = [1, 700_000, 3, 600_000];
    let (len, source) = pieces(&sizes, false);
    let answer = a
        .request_streamed(
            b.peer_id(),
            ECHO,
            Bytes::from_static(b"head:"),
            (len, source),
            PATIENCE,
        )
        .await
        .unwrap();
    let sum: u64 = sizes.iter().enumerate().map(|(i, &n)| (i * n) as u64).sum();
    let expected_pieces = len.div_ceil(meshwire::STREAMED_PIECE_BYTES as u64);
    assert_eq!(
        String::from_utf8_lossy(&answer),
        format!("head: {expected_pieces} {len} {sum}")
    );
    // The same payload sent whole does not fit.
    let whole = a
        .request(
            b.peer_id(),
            CHAT,
            Bytes::from(vec![1u8; len as usize]),
            PATIENCE,
        )
        .await;
    assert!(matches!(whole, Err(RequestError::Busy(_))), "{whole:?}");
    release.notify_one();
    assert_eq!(&holder.await.unwrap().unwrap()[..], &[9u8; 5]);
}

#[tokio::test]
async fn a_streamed_request_whose_source_fails_or_lies_is_cut_and_the_node_keeps_serving() {
    let a = start(1);
    let b = start(2);
    serve_streamed(&b);
    connect(&a, &b).await;
    let head = Bytes::from_static(b"head:");
    // The source fails after its pieces, produces more than announced, or fewer.
    let (len, failing) = pieces(&[100_000], true);
    let (_, long) = pieces(&[100_000, 10], false);
    let (_, short) = pieces(&[50_000], false);
    for (body, what) in [
        ((len, failing), "fails"),
        ((len, long), "too long"),
        ((len, short), "too short"),
    ] {
        let result = a
            .request_streamed(b.peer_id(), ECHO, head.clone(), body, PATIENCE)
            .await;
        assert!(
            matches!(result, Err(RequestError::Source(_))),
            "{what}: {result:?}"
        );
    }
    let (len, whole) = pieces(&[10, 20], false);
    let answer = a
        .request_streamed(b.peer_id(), ECHO, head, (len, whole), PATIENCE)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&answer), "head: 1 30 20");
}

#[tokio::test]
async fn a_streamed_answer_is_read_as_it_arrives_and_a_failing_source_fails_it() {
    let a = start(1);
    let b = start(2);
    // The request names the answer: "ok" streams 1 MB in pieces, "fail" fails after one piece.
    b.handle_streamed_answers(ECHO, |_, request| async move {
        let fail = &request[..] == b"fail";
        let (len, source) = pieces(&[1, 400_000, 600_000], fail);
        let len = if fail { len + 1 } else { len };
        Ok((
            Bytes::from_static(b"head:"),
            meshwire::AnswerBody::Streamed(meshwire::StreamedAnswer::new(len, source)),
        ))
    })
    .unwrap();
    connect(&a, &b).await;
    let mut answer = a
        .request_streamed_answer(b.peer_id(), ECHO, Bytes::from_static(b"ok"), PATIENCE)
        .await
        .unwrap();
    assert_eq!(answer.len(), 1_000_006);
    assert_eq!(&answer.read_exact(5).await.unwrap()[..], b"head:");
    let mut read = Vec::new();
    while let Some(piece) = answer.next_piece().await.unwrap() {
        read.extend_from_slice(&piece);
    }
    let expected: Vec<u8> = [vec![0u8; 1], vec![1u8; 400_000], vec![2u8; 600_000]].concat();
    assert!(read == expected, "the answer's body differs");

    // The reset may overtake the answer's head (then the request fails) or not (then reading
    // its body fails); it never ends cleanly.
    let failed = a
        .request_streamed_answer(b.peer_id(), ECHO, Bytes::from_static(b"fail"), PATIENCE)
        .await;
    if let Ok(mut failed) = failed {
        let mut outcome = Ok(Some(Bytes::new()));
        while let Ok(Some(_)) = outcome {
            outcome = failed.next_piece().await;
        }
        assert!(outcome.is_err(), "a failed source ended the answer cleanly");
    } else {
        assert!(
            matches!(failed, Err(RequestError::ReadFailed(_))),
            "{failed:?}"
        );
    }

    // An error answer is the request's error; an answer sent whole reads the same way.
    let refused = a
        .request_streamed_answer(b.peer_id(), CHAT, Bytes::new(), PATIENCE)
        .await;
    assert!(
        matches!(refused, Err(RequestError::Refused(_))),
        "{refused:?}"
    );
    b.handle(CHAT, |_, body| async move { Ok(body) }).unwrap();
    let mut whole = a
        .request_streamed_answer(b.peer_id(), CHAT, Bytes::from_static(b"whole"), PATIENCE)
        .await
        .unwrap();
    assert_eq!(&whole.read_exact(5).await.unwrap()[..], b"whole");
    assert_eq!(whole.next_piece().await.unwrap(), None);
}
