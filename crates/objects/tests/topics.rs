//! Topics over HTTP on real nodes on loopback: a publish on one node reaches the subscribers on
//! the others, a subscriber that stops reading is dropped (and its connection cut) while the
//! others keep receiving, bad requests get JSON errors, a peer's bad messages are rejected,
//! streams hold no request slot, shutdown ends the streams.
#![cfg(feature = "net")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshwire::{Keypair, Node, NodeConfig};
use meshwire_gossip::proto::{ClassPolicy, GossipConfig, Relay};
use meshwire_gossip::{GossipService, GossipSettings};
use meshwire_objects::net::{
    Daemon, DaemonError, EndReason, HttpAuth, HttpLimits, ObjectConfig, SubscriptionItem,
    TopicPolicy, TopicsConfig, TopicsError,
};
use meshwire_objects::proto::topic::{class_of, Envelope, TopicName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Longest a test waits for something the nodes do on their own.
const PATIENCE: Duration = Duration::from_secs(30);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

fn single() -> ObjectConfig {
    ObjectConfig {
        replication: 1,
        write_quorum: 1,
        read_quorum: 1,
        ..ObjectConfig::default()
    }
}

/// Topics `news` (relayed by all, 1 KiB bodies) and `bulk` (origin only, 64 KiB bodies, never
/// pushed whole), `buffer` events per subscriber, at most `subscribers`.
fn topics(buffer: usize, subscribers: usize) -> TopicsConfig {
    let news = TopicPolicy {
        max_bytes: 1024,
        ..TopicPolicy::default()
    };
    let bulk = TopicPolicy {
        relay: Relay::Origin,
        max_bytes: 64 * 1024,
        push_whole_max_bytes: 0,
        ..TopicPolicy::default()
    };
    TopicsConfig {
        topics: [("news".to_string(), news), ("bulk".to_string(), bulk)].into(),
        subscriber_buffer: buffer,
        max_subscribers: subscribers,
    }
}

async fn start(config: TopicsConfig, limits: HttpLimits, auth: HttpAuth) -> Daemon {
    Daemon::builder(single())
        .http(loopback())
        .http_limits(limits)
        .http_auth(auth)
        .topics(config)
        .bind(loopback(), |_| {})
        .await
        .expect("the daemon starts")
}

/// An answer read whole from a connection the server closes.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        assert!(
            self.head
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "not JSON: {}",
            self.head
        );
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

async fn exchange(address: SocketAddr, request: Vec<u8>) -> Answer {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(&request).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
        .await
        .expect("the server answers and closes")
        .unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut dechunked = Dechunker {
            raw: body,
            ..Dechunker::default()
        };
        dechunked.run();
        body = dechunked.body;
    }
    Answer { status, head, body }
}

fn post(path: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\nContent-Length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

async fn publish(address: SocketAddr, topic: &str, body: &[u8]) -> serde_json::Value {
    let answer = exchange(address, post(&format!("/topics/{topic}"), body, "")).await;
    assert_eq!(answer.status, 202, "{} {:?}", answer.head, answer.json());
    answer.json()
}

/// Turns a chunked body into its content as it arrives.
#[derive(Debug, Default)]
struct Dechunker {
    raw: Vec<u8>,
    body: Vec<u8>,
    ended: bool,
}

impl Dechunker {
    /// Moves every complete chunk from `raw` to `body`.
    fn run(&mut self) {
        while let Some(line_end) = self.raw.windows(2).position(|w| w == b"\r\n") {
            let size = std::str::from_utf8(&self.raw[..line_end])
                .ok()
                .and_then(|size| usize::from_str_radix(size.trim(), 16).ok())
                .expect("a chunk size line");
            if size == 0 {
                self.ended = true;
                return;
            }
            if self.raw.len() < line_end + 2 + size + 2 {
                return;
            }
            self.body
                .extend_from_slice(&self.raw[line_end + 2..line_end + 2 + size]);
            self.raw.drain(..line_end + 2 + size + 2);
        }
    }
}

/// One server-sent event.
#[derive(Debug)]
struct SseEvent {
    event: String,
    id: Option<String>,
    data: serde_json::Value,
}

/// A subscriber reading `GET /topics/{name}/events` over a raw connection.
#[derive(Debug)]
struct Subscriber {
    stream: TcpStream,
    chunks: Dechunker,
}

impl Subscriber {
    /// Opens the stream; the subscription exists once this returns.
    async fn open(address: SocketAddr, topic: &str) -> Self {
        Self::open_on(TcpStream::connect(address).await.unwrap(), topic).await
    }

    async fn open_on(mut stream: TcpStream, topic: &str) -> Self {
        let request = format!("GET /topics/{topic}/events HTTP/1.1\r\nHost: node\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        let split = tokio::time::timeout(PATIENCE, async {
            loop {
                let mut buffer = [0u8; 4096];
                let read = stream.read(&mut buffer).await.unwrap();
                assert!(read > 0, "closed before the head");
                raw.extend_from_slice(&buffer[..read]);
                if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                    return split;
                }
            }
        })
        .await
        .expect("the head arrives");
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        let chunks = Dechunker {
            raw: raw[split + 4..].to_vec(),
            ..Dechunker::default()
        };
        Self { stream, chunks }
    }

    /// The next event (keep-alive comments skipped); `None` when the stream or connection ends.
    async fn next(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(PATIENCE, async {
            loop {
                self.chunks.run();
                if let Some(end) = self.chunks.body.windows(2).position(|w| w == b"\n\n") {
                    let block: Vec<u8> = self.chunks.body.drain(..end + 2).collect();
                    let text = String::from_utf8(block).expect("UTF-8 events");
                    let mut event = String::from("message");
                    let mut id = None;
                    let mut data = None;
                    for line in text.lines() {
                        if let Some(value) = line.strip_prefix("event:") {
                            event = value.trim().to_string();
                        } else if let Some(value) = line.strip_prefix("id:") {
                            id = Some(value.trim().to_string());
                        } else if let Some(value) = line.strip_prefix("data:") {
                            data = Some(serde_json::from_str(value.trim()).expect("JSON data"));
                        }
                    }
                    if let Some(data) = data {
                        return Some(SseEvent { event, id, data });
                    }
                    continue;
                }
                if self.chunks.ended {
                    return None;
                }
                let mut buffer = [0u8; 16 * 1024];
                match self.stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return None,
                    Ok(read) => self.chunks.raw.extend_from_slice(&buffer[..read]),
                }
            }
        })
        .await
        .expect("an event or the end arrives")
    }

    async fn next_message(&mut self) -> serde_json::Value {
        let event = self.next().await.expect("a message");
        assert_eq!(event.event, "message", "{event:?}");
        assert_eq!(event.id.as_deref(), event.data["id"].as_str());
        event.data
    }
}

fn decode_base64(text: &str) -> Vec<u8> {
    data_encoding::BASE64
        .decode(text.as_bytes())
        .expect("base64")
}

#[tokio::test]
async fn a_publish_reaches_the_subscribers_of_every_node() {
    // A short header timeout must not end a stream: it only runs while a request head is awaited.
    let limits = HttpLimits {
        header_read_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    };
    let a = start(topics(16, 8), limits.clone(), HttpAuth::default()).await;
    let b = start(topics(16, 8), limits.clone(), HttpAuth::default()).await;
    let c = start(topics(16, 8), limits, HttpAuth::default()).await;
    support::mesh(&[&a, &b, &c]).await;
    let mut subscribers = Vec::new();
    for daemon in [&a, &b, &c] {
        subscribers.push(Subscriber::open(daemon.http_address().unwrap(), "news").await);
    }
    let mut bulk = Subscriber::open(c.http_address().unwrap(), "bulk").await;
    tokio::time::sleep(Duration::from_millis(800)).await;

    let published = publish(a.http_address().unwrap(), "news", b"hello").await;
    assert_eq!(published["topic"], "news");
    assert_eq!(published["bytes"], 5);
    let origin = a.node().peer_id().to_string();
    for (index, subscriber) in subscribers.iter_mut().enumerate() {
        let message = subscriber.next_message().await;
        if index == 0 {
            // A's own subscriber gets the local publish from A itself.
            assert_eq!(message["from"], origin);
        }
        assert_eq!(message["id"], published["id"]);
        assert_eq!(message["topic"], "news");
        assert_eq!(message["origin"], origin);
        assert_eq!(message["text"], "hello");
        assert_eq!(
            decode_base64(message["payload"].as_str().unwrap()),
            b"hello"
        );
        assert_eq!(message["sequence"], published["sequence"]);
    }
    // The same body again is a second message; a binary body has no text.
    let again = publish(b.http_address().unwrap(), "news", b"hello").await;
    assert_ne!(again["id"], published["id"]);
    let binary: Vec<u8> = (0..=255).collect();
    let big: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    publish(b.http_address().unwrap(), "bulk", &big).await;
    for subscriber in &mut subscribers {
        let message = subscriber.next_message().await;
        assert_eq!(message["id"], again["id"]);
        assert_eq!(message["origin"], b.node().peer_id().to_string());
    }
    let message = bulk.next_message().await;
    assert_eq!(message["topic"], "bulk");
    assert_eq!(message["from"], b.node().peer_id().to_string());
    assert!(message["text"].is_null());
    assert_eq!(decode_base64(message["payload"].as_str().unwrap()), big);
    let published = publish(c.http_address().unwrap(), "news", &binary[..200]).await;
    for subscriber in &mut subscribers {
        let message = subscriber.next_message().await;
        assert_eq!(message["id"], published["id"]);
        assert_eq!(
            decode_base64(message["payload"].as_str().unwrap()),
            &binary[..200]
        );
    }
    for daemon in [a, b, c] {
        daemon.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_subscriber_that_stops_reading_is_dropped_and_cut_while_another_keeps_receiving() {
    let a = start(topics(4, 8), HttpLimits::default(), HttpAuth::default()).await;
    let b = start(topics(4, 8), HttpLimits::default(), HttpAuth::default()).await;
    support::mesh(&[&a, &b]).await;
    let b_http = b.http_address().unwrap();
    // The stalled subscriber's socket takes little, so its node's queue fills sooner.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stalled = Subscriber::open_on(socket.connect(b_http).await.unwrap(), "bulk").await;
    let mut reader = Subscriber::open(b_http, "bulk").await;
    let topics_b = b.topics().unwrap().clone();
    assert_eq!(topics_b.subscriber_count("bulk"), 2);

    let body = vec![b'x'; 60 * 1024];
    let mut published = 0;
    while topics_b.dropped_count(EndReason::Lagged) == 0 {
        assert!(published < 2000, "the stalled subscriber was never dropped");
        // Publish on a and wait until the reading subscriber on b has it: it never lags.
        let mut body = body.clone();
        body[..8].copy_from_slice(&(published as u64).to_le_bytes());
        let sent = publish(a.http_address().unwrap(), "bulk", &body).await;
        let message = reader.next_message().await;
        assert_eq!(message["id"], sent["id"]);
        published += 1;
    }
    assert_eq!(topics_b.dropped_count(EndReason::Lagged), 1);
    assert_eq!(topics_b.subscriber_count("bulk"), 1);
    // The other subscriber keeps receiving.
    for _ in 0..3 {
        let sent = publish(a.http_address().unwrap(), "bulk", b"after").await;
        let message = reader.next_message().await;
        assert_eq!(message["id"], sent["id"]);
        assert_eq!(message["text"], "after");
    }
    // The stalled subscriber never reads its end, so its connection is cut.
    let http = b.http_metrics().unwrap().clone();
    tokio::time::timeout(PATIENCE, async {
        while http.refused_count("subscriber_cut") == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the stalled connection is cut");
    let mut stalled = stalled;
    let mut drained = 0;
    while stalled.next().await.is_some() {
        drained += 1;
        assert!(drained <= published, "the stalled stream does not end");
    }
    assert_eq!(topics_b.dropped_count(EndReason::Lagged), 1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_full_queue_ends_a_subscription_with_its_reason_after_what_was_queued() {
    let daemon = start(topics(3, 4), HttpLimits::default(), HttpAuth::default()).await;
    let topics = daemon.topics().unwrap().clone();
    let mut slow = topics.subscribe("news", None).unwrap();
    let mut fast = topics.subscribe("news", None).unwrap();
    let mut ids = Vec::new();
    for index in 0..5u8 {
        ids.push(topics.publish("news", Bytes::from(vec![index])).unwrap().id);
        // The fast subscriber reads each message at once.
        match fast.next().await {
            Some(SubscriptionItem::Event(event)) => assert_eq!(event.id, ids[index as usize]),
            other => panic!("expected a message, got {other:?}"),
        }
    }
    for id in &ids[..3] {
        match slow.next().await {
            Some(SubscriptionItem::Event(event)) => assert_eq!(&event.id, id),
            other => panic!("expected a message, got {other:?}"),
        }
    }
    assert!(matches!(
        slow.next().await,
        Some(SubscriptionItem::Ended(EndReason::Lagged))
    ));
    assert!(slow.next().await.is_none());
    assert_eq!(topics.dropped_count(EndReason::Lagged), 1);
    assert_eq!(topics.subscriber_count("news"), 1);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_names_oversize_bodies_and_missing_tokens_get_json_errors() {
    let auth = HttpAuth {
        require_token: Some(true),
        ..HttpAuth::default()
    };
    let daemon = start(topics(4, 1), HttpLimits::default(), auth).await;
    let address = daemon.http_address().unwrap();
    let token = format!(
        "Authorization: Bearer {}\r\n",
        daemon.http_token().unwrap().secret
    );
    let topics = daemon.topics().unwrap().clone();

    let missing = exchange(address, post("/topics/news", b"x", "")).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["error"], "unauthorized");
    let get = |path: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n{extra}\r\n")
            .into_bytes()
    };
    assert_eq!(
        exchange(address, get("/topics/news/events", ""))
            .await
            .status,
        401
    );

    let long = "x".repeat(65);
    for bad in ["a%20b", "a*b", "%C3%A9", long.as_str()] {
        let answer = exchange(address, post(&format!("/topics/{bad}"), b"x", &token)).await;
        assert_eq!(answer.status, 400, "{bad}");
        assert_eq!(answer.json()["error"], "invalid_topic", "{bad}");
        let answer = exchange(address, get(&format!("/topics/{bad}/events"), &token)).await;
        assert_eq!(answer.status, 400, "{bad}");
    }
    assert_eq!(topics.refused_count("invalid_name"), 8);

    let unknown = exchange(address, post("/topics/nothing", b"x", &token)).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"], "unknown_topic");
    let unknown = exchange(address, get("/topics/nothing/events", &token)).await;
    assert_eq!(unknown.json()["error"], "unknown_topic");
    assert_eq!(topics.refused_count("unknown_topic"), 2);

    let oversize = exchange(address, post("/topics/news", &[b'y'; 1025], &token)).await;
    assert_eq!(oversize.status, 413);
    assert_eq!(oversize.json()["error"], "too_large");
    assert_eq!(oversize.json()["max_bytes"], 1024);
    let mut chunked = format!(
        "POST /topics/news HTTP/1.1\r\nHost: node\r\nConnection: close\r\n{token}\
         Transfer-Encoding: chunked\r\n\r\n401\r\n"
    )
    .into_bytes();
    chunked.extend_from_slice(&[b'z'; 0x401]);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let oversize = exchange(address, chunked).await;
    assert_eq!(oversize.status, 413);
    assert_eq!(oversize.json()["max_bytes"], 1024);
    assert_eq!(topics.refused_count("too_large"), 2);

    // One subscriber slot: the second subscriber is refused while the first is open.
    let stream = TcpStream::connect(address).await.unwrap();
    let mut first = stream;
    first
        .write_all(
            format!("GET /topics/news/events HTTP/1.1\r\nHost: node\r\n{token}\r\n").as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, async {
        while topics.subscriber_count("news") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the first subscriber is registered");
    let second = exchange(address, get("/topics/news/events", &token)).await;
    assert_eq!(second.status, 503);
    assert_eq!(second.json()["error"], "too_many_subscribers");
    assert_eq!(topics.refused_count("subscriber_limit"), 1);

    let listed = exchange(address, get("/topics", &token)).await;
    let listed = listed.json();
    let names: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|topic| topic["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["bulk", "news"]);
    assert_eq!(listed[1]["subscribers"], 1);
    assert_eq!(listed[0]["relay"], "origin");
    drop(first);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_every_stream_with_a_last_event() {
    let limits = HttpLimits {
        shutdown_grace: Duration::from_secs(60),
        ..HttpLimits::default()
    };
    let daemon = start(topics(4, 4), limits, HttpAuth::default()).await;
    let mut subscriber = Subscriber::open(daemon.http_address().unwrap(), "news").await;
    let topics = daemon.topics().unwrap().clone();
    // The grace period is long: shutdown must not wait for it.
    tokio::time::timeout(PATIENCE, daemon.shutdown())
        .await
        .expect("shutdown does not wait for open streams")
        .unwrap();
    let last = subscriber.next().await.expect("a last event");
    assert_eq!(last.event, "end");
    assert_eq!(last.data["reason"], "shutdown");
    assert!(subscriber.next().await.is_none());
    assert_eq!(topics.dropped_count(EndReason::Shutdown), 1);
    assert!(matches!(
        topics.subscribe("news", None),
        Err(TopicsError::Closed)
    ));
}

#[tokio::test]
async fn bad_topic_settings_are_refused_at_start() {
    let mut colliding = topics(4, 4);
    let news = TopicName::new("news").unwrap();
    let pinned = TopicPolicy {
        class: Some(class_of(&news)),
        ..TopicPolicy::default()
    };
    colliding.topics.insert("other".into(), pinned);
    let error = Daemon::builder(single())
        .topics(colliding)
        .bind(loopback(), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            DaemonError::Topics(TopicsError::ClassCollision { .. })
        ),
        "{error}"
    );
    let mut bad_name = topics(4, 4);
    bad_name
        .topics
        .insert("no spaces".into(), TopicPolicy::default());
    let error = Daemon::builder(single())
        .topics(bad_name)
        .bind(loopback(), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(error, DaemonError::Topics(TopicsError::InvalidName(_))),
        "{error}"
    );
    let error = Daemon::builder(single())
        .topics(topics(4, 300))
        .http(loopback())
        .bind(loopback(), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(error, DaemonError::SubscribersOverConnections { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn messages_from_a_peer_with_a_wrong_envelope_are_rejected_and_never_delivered() {
    let daemon = start(topics(8, 4), HttpLimits::default(), HttpAuth::default()).await;
    let topics = daemon.topics().unwrap().clone();
    let class = topics.topics()["news"].class;
    let mut subscription = topics.subscribe("news", None).unwrap();
    // A peer that speaks gossip on the class of `news` and sends whatever it likes.
    let peer = Node::bind(NodeConfig::new(Keypair::generate()), loopback()).unwrap();
    let mut config = GossipConfig::default();
    config.classes.insert(
        class,
        ClassPolicy {
            relay: Relay::All,
            push_whole_max_bytes: 4096,
            latency_sensitive: true,
            expiry: Duration::from_secs(60),
        },
    );
    let (gossip, _delivered) =
        GossipService::spawn(&peer, GossipSettings::new(config), Box::new(|_, _| true)).unwrap();
    peer.connect(daemon.node().local_addr().unwrap(), daemon.node().peer_id())
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, async {
        while daemon.node().connected_peers().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the peer connects");
    let envelope = |topic: &str, body: Vec<u8>| {
        Envelope {
            topic: TopicName::new(topic).unwrap(),
            origin: peer.peer_id(),
            sequence: 1,
            body: Bytes::from(body),
        }
        .encode()
    };
    // Not an envelope; another node's topic that collides with `news` on its class; over the
    // 1 KiB limit of `news`; and one good message last.
    gossip
        .publish(class, Bytes::from_static(b"\x07garbage"))
        .unwrap();
    gossip
        .publish(class, envelope("other", b"x".to_vec()))
        .unwrap();
    gossip
        .publish(class, envelope("news", vec![0; 2000]))
        .unwrap();
    gossip
        .publish(class, envelope("news", b"fine".to_vec()))
        .unwrap();
    let delivered = tokio::time::timeout(PATIENCE, subscription.next())
        .await
        .expect("the good message arrives");
    match delivered {
        Some(SubscriptionItem::Event(event)) => {
            assert_eq!(&event.body[..], b"fine");
            assert_eq!(event.from, peer.peer_id());
            assert_eq!(event.origin, peer.peer_id());
        }
        other => panic!("expected the good message, got {other:?}"),
    }
    tokio::time::timeout(PATIENCE, async {
        while ["malformed", "unknown_topic", "too_large"]
            .iter()
            .any(|reason| topics.rejected_count(reason) == 0)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("each bad message is rejected");
    for reason in ["malformed", "unknown_topic", "too_large"] {
        assert_eq!(topics.rejected_count(reason), 1, "{reason}");
    }
    // Nothing else was delivered.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), subscription.next())
            .await
            .is_err()
    );
    peer.close().await;
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn streams_hold_no_request_slot() {
    let limits = HttpLimits {
        max_concurrent_requests: 2,
        ..HttpLimits::default()
    };
    let daemon = start(topics(4, 8), limits, HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(Subscriber::open(address, "news").await);
    }
    // Four open streams, two request slots: requests still get answers.
    let get = b"GET /status HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n".to_vec();
    assert_eq!(exchange(address, get).await.status, 200);
    let published = publish(address, "news", b"to all four").await;
    for stream in &mut streams {
        assert_eq!(stream.next_message().await["id"], published["id"]);
    }
    daemon.shutdown().await.unwrap();
}
