//! Objects you can trust, on loopback daemons: only members place, store and serve; a clock from
//! the future cannot freeze a key; acks, 201 and 503 say what happened; a quorum read moves the
//! content once and only the winner's.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_STORE as STORE};
use meshwire::PeerId;
use meshwire_objects::net::{Daemon, ObjectConfig, ObjectServiceError, PhysicalClock, SystemClock};
use meshwire_objects::proto::clock;
use meshwire_objects::proto::object::{
    self, content_hash, Answer, FetchMode, Fetched, Refusal, Stamp,
};
use meshwire_objects::proto::quorum::QuorumConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

use support::mesh;

const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// The system clock, shifted by a fixed offset: a node whose clock is wrong.
#[derive(Debug)]
struct ShiftedClock(u64);

impl PhysicalClock for ShiftedClock {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0
    }
}

async fn start(clock: Option<Arc<dyn PhysicalClock>>) -> Daemon {
    let mut builder = Daemon::builder(ObjectConfig::default()).http(loopback());
    if let Some(clock) = clock {
        builder = builder.physical_clock(clock);
    }
    builder.bind(loopback(), |_| {}).await.unwrap()
}

fn ids(daemons: &[&Daemon]) -> Vec<PeerId> {
    daemons.iter().map(|d| d.node().peer_id()).collect()
}

/// The value of the counter `name` with label `reason` in `daemon`'s metrics (0 when absent).
fn counted(daemon: &Daemon, name: &str, reason: &str) -> u64 {
    let text = daemon.node().metrics().encode_text();
    let prefix = format!("{name}{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Sends a raw store request from `from` to `to` and decodes the answer.
async fn raw_store(
    from: &Daemon,
    to: &Daemon,
    clock: u64,
    key: &str,
    version: u64,
    content: &[u8],
) -> Answer<object::Stored> {
    let stamp = Stamp {
        version,
        hash: content_hash(content),
    };
    let mut message = object::encode_store_header(clock, key, &stamp);
    message.extend_from_slice(content);
    let reply = from
        .node()
        .request(
            to.node().peer_id(),
            STORE,
            Bytes::from(message),
            REQUEST_DEADLINE,
        )
        .await
        .expect("the replica answers");
    object::decode_stored(&reply).expect("a well-formed answer")
}

/// One HTTP/1.1 exchange with `Connection: close`: the status and the body.
async fn http(address: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = std::str::from_utf8(&raw[..split])
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    (status, raw[split + 4..].to_vec())
}

#[tokio::test]
async fn an_unlisted_node_cannot_change_a_members_copy_or_enter_placement() {
    let members = [start(None).await, start(None).await, start(None).await];
    // The intruder runs no anti-entropy and sends no probes: its digest requests and probes
    // would be refused as `not_member` too, at times of their own, and the counts below are of
    // the requests this test sends.
    let mut quiet = ObjectConfig {
        anti_entropy_interval: std::time::Duration::ZERO,
        ..ObjectConfig::default()
    };
    quiet.scores.probe_on_connect = false;
    let intruder = Daemon::builder(quiet)
        .http(loopback())
        .bind(loopback(), |_| {})
        .await
        .unwrap();
    let member_refs: Vec<&Daemon> = members.iter().collect();
    let member_ids = ids(&member_refs);
    for member in &members {
        member.service().set_members(member_ids.iter().copied());
    }
    // The intruder believes it belongs: it places keys on the members and on itself.
    let intruder_id = intruder.node().peer_id();
    intruder
        .service()
        .set_members(member_ids.iter().copied().chain([intruder_id]));
    mesh(&[&members[0], &members[1], &members[2], &intruder]).await;

    // Connected, yet never a replica in any member's placement.
    for key in 0..200 {
        let replicas = members[0].service().replicas(&format!("k{key}"));
        assert_eq!(replicas.len(), 3);
        assert!(!replicas.contains(&intruder_id));
    }
    let written = members[0]
        .service()
        .put("wallet", Bytes::from_static(b"the owner's"))
        .await
        .unwrap();
    assert_eq!((written.acks, written.replicas), (2, 3));

    // Its overwrite, newer by any measure, is refused by every member with a typed answer.
    for member in &members {
        let answer = raw_store(
            &intruder,
            member,
            intruder.service().clock(),
            "wallet",
            written.stamp.version + 1000,
            b"the intruder's",
        )
        .await;
        assert_eq!(answer.answer, Err(Refusal::NotMember));
        assert_eq!(
            counted(
                member,
                "meshwire_object_refused_requests_total",
                "not_member"
            ),
            1
        );
    }
    // Its fetches are refused too.
    let fetch = object::encode_fetch(1, FetchMode::Full, "wallet");
    let reply = intruder
        .node()
        .request(
            members[1].node().peer_id(),
            FETCH,
            Bytes::from(fetch),
            REQUEST_DEADLINE,
        )
        .await
        .unwrap();
    let answer = object::decode_fetched(FetchMode::Full, &reply, 1 << 20).unwrap();
    assert_eq!(answer.answer, Err(Refusal::NotMember));
    // A write through the intruder reaches no member: it cannot get its quorum.
    let through_intruder = intruder
        .service()
        .put("wallet", Bytes::from_static(b"the intruder's"))
        .await;
    assert!(
        matches!(
            through_intruder,
            Err(ObjectServiceError::WriteUnconfirmed { .. })
        ),
        "{through_intruder:?}"
    );

    // With the intruder connected, every PUT through a member is durable on the members, and
    // stays readable after the intruder leaves.
    for index in 0..40 {
        let put = members[index % 3]
            .service()
            .put(
                &format!("key-{index}"),
                Bytes::from(format!("value {index}")),
            )
            .await
            .unwrap();
        assert!(put.acks >= 2);
    }
    intruder.shutdown().await.unwrap();
    for member in &members {
        assert_eq!(
            member.service().get_local("wallet").unwrap().content,
            "the owner's",
            "a member's copy changed"
        );
    }
    for index in 0..40 {
        let read = members[(index + 1) % 3]
            .service()
            .get(&format!("key-{index}"))
            .await
            .unwrap();
        assert_eq!(read.object.content, format!("value {index}"));
    }
    for member in members {
        member.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_member_whose_clock_is_a_year_ahead_cannot_freeze_a_key() {
    let good = [start(None).await, start(None).await];
    let skewed = start(Some(Arc::new(ShiftedClock(YEAR_MS)))).await;
    let all = [&good[0], &good[1], &skewed];
    let members = ids(&all);
    for daemon in all {
        daemon.service().set_members(members.iter().copied());
    }
    mesh(&all).await;

    // Its write is refused by the members whose clocks are right: no quorum, no frozen key.
    let frozen = skewed
        .service()
        .put("ledger", Bytes::from_static(b"from the future"))
        .await;
    assert!(
        matches!(
            frozen,
            Err(ObjectServiceError::WriteUnconfirmed { acks: 1, .. })
        ),
        "{frozen:?}"
    );
    for daemon in &good {
        assert!(
            counted(
                daemon,
                "meshwire_object_refused_requests_total",
                "clock_skew"
            ) >= 1
        );
        assert!(matches!(
            daemon.service().get_local("ledger"),
            Err(ObjectServiceError::NotFound)
        ));
    }
    // Later writes through the other members win, and reads through them return the latest.
    for round in 0..2 {
        let content = format!("round {round}");
        let put = good[round]
            .service()
            .put("ledger", Bytes::from(content.clone()))
            .await
            .unwrap();
        assert!(put.acks >= 2);
        for daemon in &good {
            let read = daemon.service().get("ledger").await.unwrap();
            assert_eq!(read.object.content, content);
        }
    }
    // The skewed member's answers were refused, not merged: counted on the readers' side.
    let refused: u64 = good
        .iter()
        .map(|d| counted(d, "meshwire_object_refused_answers_total", "clock_skew"))
        .sum();
    assert!(refused >= 1);
    // A correct member's clock was never pulled ahead.
    for daemon in &good {
        let ahead =
            clock::physical_ms(daemon.service().clock()).saturating_sub(SystemClock.now_ms());
        assert!(ahead < 5_000, "clock pulled {ahead} ms ahead");
    }
    for daemon in good.into_iter().chain([skewed]) {
        daemon.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn stamps_from_the_future_and_at_the_limit_get_typed_refusals_and_are_counted() {
    let daemons = [start(None).await, start(None).await];
    let members = ids(&[&daemons[0], &daemons[1]]);
    for daemon in &daemons {
        daemon.service().set_members(members.iter().copied());
    }
    mesh(&[&daemons[0], &daemons[1]]).await;
    let now = clock::timestamp(SystemClock.now_ms(), 0);
    let future = clock::timestamp(SystemClock.now_ms() + YEAR_MS, 0);
    let (from, to) = (&daemons[0], &daemons[1]);

    // A version from the future, a message clock from the future, a version at the limit.
    let cases = [
        (now, future, Refusal::ClockSkew),
        (future, now, Refusal::ClockSkew),
        (now, u64::MAX, Refusal::VersionLimit),
    ];
    for (message_clock, version, reason) in cases {
        let answer = raw_store(from, to, message_clock, "k", version, b"x").await;
        assert_eq!(answer.answer, Err(reason));
    }
    assert_eq!(
        counted(to, "meshwire_object_refused_requests_total", "clock_skew"),
        2
    );
    assert_eq!(
        counted(
            to,
            "meshwire_object_refused_requests_total",
            "version_limit"
        ),
        1
    );
    assert!(matches!(
        to.service().get_local("k"),
        Err(ObjectServiceError::NotFound)
    ));
    let ahead = clock::physical_ms(to.service().clock()).saturating_sub(SystemClock.now_ms());
    assert!(ahead < 5_000, "a refused stamp moved the clock {ahead} ms");

    // An ack means exactly this version and hash: a replica holding a newer copy says so.
    let newer = raw_store(from, to, now, "k", now + 10, b"newer").await;
    assert_eq!(newer.answer, Ok(object::Stored::Holds));
    let older = raw_store(from, to, now, "k", now + 5, b"older").await;
    assert_eq!(
        older.answer,
        Ok(object::Stored::Superseded(Stamp {
            version: now + 10,
            hash: content_hash(b"newer")
        }))
    );
    for daemon in daemons {
        daemon.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_single_default_node_accepts_a_put_and_reads_it_back() {
    let daemon = start(None).await;
    assert_eq!(*daemon.service().members(), vec![daemon.node().peer_id()]);
    let address = daemon.http_address().unwrap();
    let (status, body) = http(address, "PUT", "/objects/alone", b"one node").await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let written: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (written["acks"].as_u64(), written["replicas"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        http(address, "GET", "/objects/alone", b"").await,
        (200, b"one node".to_vec())
    );
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn changing_the_member_list_reshuffles_placement() {
    let daemon = start(None).await;
    let me = daemon.node().peer_id();
    let others: Vec<PeerId> = (1..=5u8).map(|i| PeerId::from_bytes([i; 32])).collect();
    daemon.service().set_members(others[..2].iter().copied());
    let before: Vec<Vec<PeerId>> = (0..50)
        .map(|k| daemon.service().replicas(&format!("k{k}")))
        .collect();
    assert!(before.iter().all(|r| r.len() == 3 && r.contains(&me)));
    daemon.service().set_members(others.iter().copied());
    let after: Vec<Vec<PeerId>> = (0..50)
        .map(|k| daemon.service().replicas(&format!("k{k}")))
        .collect();
    assert!(
        before != after,
        "six members place keys differently from three"
    );
    assert!(after
        .iter()
        .flatten()
        .all(|peer| *peer == me || others.contains(peer)));
    assert!(daemon.service().is_member(others[4]));
    daemon.service().set_members([]);
    assert!(!daemon.service().is_member(others[4]));
    assert_eq!(daemon.service().replicas("k0"), vec![me]);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_write_that_lost_to_a_newer_one_on_the_replicas_is_superseded_not_unknown() {
    let nodes = [start(None).await, start(None).await, start(None).await];
    let all = [&nodes[0], &nodes[1], &nodes[2]];
    let members = ids(&all);
    for daemon in all {
        daemon.service().set_members(members.iter().copied());
    }
    mesh(&all).await;
    let [coordinator, b, c] = &nodes;

    // A newer write of the key (a second ahead, within the accepted skew) reached two of the
    // three replicas, but not yet the coordinator. (Their answers carry their clocks, so the
    // coordinator's next write of any key would be newer still: one write is judged.)
    let newer = clock::timestamp(SystemClock.now_ms() + 1_000, 0);
    for replica in [b, c] {
        let answer = raw_store(coordinator, replica, newer, "h", newer, b"newer").await;
        assert!(answer.answer.is_ok(), "{:?}", answer.answer);
    }

    let (status, body) = http(
        coordinator.http_address().unwrap(),
        "PUT",
        "/objects/h",
        b"older",
    )
    .await;
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "superseded");
    assert_eq!(body["outcome"], "superseded");
    assert_eq!(body["superseded"], 2);
    let metrics = coordinator.node().metrics().encode_text();
    assert!(
        metrics
            .lines()
            .any(|line| line == "meshwire_object_writes_total{outcome=\"superseded\"} 1"),
        "{metrics}"
    );

    // Reads through the coordinator return the newer copy.
    let read = coordinator.service().get("h").await.unwrap();
    assert_eq!(read.object.content, "newer");
}

/// Four members: a reader and three replicas it reads from (the reader holds no copy).
async fn reader_and_replicas() -> [Daemon; 4] {
    let nodes = [
        start(None).await,
        start(None).await,
        start(None).await,
        start(None).await,
    ];
    let all = [&nodes[0], &nodes[1], &nodes[2], &nodes[3]];
    let members = ids(&all);
    for daemon in all {
        daemon.service().set_members(members.iter().copied());
    }
    mesh(&all).await;
    nodes
}

/// Stores `content` at `version` on `replica`, sent by `from`, and checks it was taken.
async fn stored(from: &Daemon, replica: &Daemon, key: &str, version: u64, content: &[u8]) {
    let now = clock::timestamp(SystemClock.now_ms(), 0);
    let answer = raw_store(from, replica, now, key, version, content).await;
    assert!(answer.answer.is_ok(), "{:?}", answer.answer);
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
    let nodes = reader_and_replicas().await;
    let [reader, replicas @ ..] = &nodes;
    let content = vec![7u8; 4096];
    let version = clock::timestamp(SystemClock.now_ms(), 1);
    for replica in replicas {
        stored(reader, replica, "wallet", version, &content).await;
    }
    let candidates: Vec<PeerId> = replicas.iter().map(|d| d.node().peer_id()).collect();
    for _ in 0..20 {
        let read = reader
            .service()
            .read_from(
                &candidates,
                "wallet",
                QuorumConfig::hedged(3, REQUEST_DEADLINE),
            )
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
    let nodes = reader_and_replicas().await;
    let [reader, b, c, d] = &nodes;
    let old = clock::timestamp(SystemClock.now_ms(), 1);
    let new = clock::timestamp(SystemClock.now_ms(), 2);
    for replica in [b, c] {
        stored(reader, replica, "k", new, b"the newer copy").await;
    }
    stored(reader, d, "k", old, b"the older copy").await;
    let candidates = ids(&[b, c, d]);
    // The replica asked for the content is drawn at random: over many reads the stale one is.
    let stale = d.node().peer_id();
    for _ in 0..30 {
        let read = reader
            .service()
            .read_from(&candidates, "k", QuorumConfig::hedged(3, REQUEST_DEADLINE))
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
