//! Version requests gathered into one `OBJECT_STAMPS` request, on loopback daemons: concurrent
//! reads each get their own replica's answer, and a replica refuses a non-member's or an
//! oversized request with a typed, counted answer.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{OBJECT_STAMPS as STAMPS, OBJECT_STORE as STORE};
use meshwire::PeerId;
use meshwire_objects::net::{Daemon, ObjectConfig, PhysicalClock, SystemClock};
use meshwire_objects::proto::clock;
use meshwire_objects::proto::object::{self, content_hash, Refusal, Stamp};
use meshwire_objects::proto::quorum::QuorumConfig;
use meshwire_objects::proto::stamps::{self, MAX_STAMP_KEYS};

mod support;

use support::{members_meshed, mesh};

const DEADLINE: Duration = Duration::from_secs(5);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// A daemon that sends no probes and runs no anti-entropy, so the counts below are of the
/// requests the tests make.
async fn quiet() -> Daemon {
    let mut config = ObjectConfig {
        anti_entropy_interval: Duration::ZERO,
        ..ObjectConfig::default()
    };
    config.scores.probe_on_connect = false;
    Daemon::builder(config)
        .bind(loopback(), |_| {})
        .await
        .unwrap()
}

/// The value of the unlabelled counter `name`, or of its series with label `reason`.
fn counted(daemon: &Daemon, name: &str, reason: Option<&str>) -> u64 {
    let text = daemon.node().metrics().encode_text();
    let prefix = match reason {
        Some(reason) => format!("{name}{{reason=\"{reason}\"}} "),
        None => format!("{name} "),
    };
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Stores `content` at `version` on `replica`, sent by `from`.
async fn store(from: &Daemon, replica: &Daemon, key: &str, version: u64, content: &[u8]) {
    let stamp = Stamp {
        version,
        hash: content_hash(content),
    };
    let mut message = object::encode_store_header(from.service().clock(), key, &stamp);
    message.extend_from_slice(content);
    let reply = from
        .node()
        .request(replica.node().peer_id(), STORE, message.into(), DEADLINE)
        .await
        .unwrap();
    let answer = object::decode_stored(&reply).unwrap();
    assert!(answer.answer.is_ok(), "{:?}", answer.answer);
}

#[tokio::test]
async fn concurrent_reads_share_stamps_requests_and_each_gets_its_own_answer() {
    let nodes = [quiet().await, quiet().await, quiet().await, quiet().await];
    members_meshed(&nodes).await;
    let [reader, replicas @ ..] = &nodes;
    let candidates: Vec<PeerId> = replicas.iter().map(|d| d.node().peer_id()).collect();
    let now = || clock::timestamp(SystemClock.now_ms(), 0);
    // Key i holds content i at its own version; every fifth key is missing from the first
    // replica, so answers within one request differ.
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let mut versions = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let version = now() + i as u64;
        versions.push(version);
        for (r, replica) in replicas.iter().enumerate() {
            if r == 0 && i % 5 == 0 {
                continue;
            }
            store(reader, replica, key, version, key.as_bytes()).await;
        }
    }
    let before = counted(reader, "meshwire_object_stamp_requests_total", None);
    // All forty reads start in one poll, so their version requests to each replica wait for
    // the same sender.
    let reads = keys.iter().map(|key| {
        reader
            .service()
            .read_from(&candidates, key, QuorumConfig::hedged(3, DEADLINE))
    });
    let results = futures_util::future::join_all(reads).await;
    for ((key, version), read) in keys.iter().zip(&versions).zip(results) {
        let read = read.unwrap();
        assert!(read.outcome.reached(3), "{key}");
        let object = read.object.expect("the key is held");
        assert_eq!(object.content, key.as_bytes(), "{key}");
        assert_eq!(object.stamp.version, *version, "{key}");
    }
    let requests = counted(reader, "meshwire_object_stamp_requests_total", None) - before;
    let asked = counted(reader, "meshwire_object_stamp_request_keys_total", None);
    assert!(
        requests > 0 && asked > requests,
        "{asked} keys in {requests} requests"
    );

    // Twenty concurrent reads of one key: each replica is asked for it once per request, not
    // once per read, and every read gets the key's copy.
    let reads = (0..20).map(|_| {
        reader
            .service()
            .read_from(&candidates, &keys[1], QuorumConfig::hedged(3, DEADLINE))
    });
    for read in futures_util::future::join_all(reads).await {
        let object = read.unwrap().object.expect("the key is held");
        assert_eq!(object.content, keys[1].as_bytes());
        assert_eq!(object.stamp.version, versions[1]);
    }
    let asked_again = counted(reader, "meshwire_object_stamp_request_keys_total", None) - asked;
    assert!(
        asked_again < 20,
        "{asked_again} keys asked for 20 reads of one key"
    );
    for daemon in nodes {
        daemon.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_replica_answers_each_key_of_a_stamps_request_in_order() {
    let nodes = [quiet().await, quiet().await];
    members_meshed(&nodes).await;
    let [asker, replica] = &nodes;
    let version = clock::timestamp(SystemClock.now_ms(), 0);
    store(asker, replica, "b", version, b"bee").await;
    let request = stamps::encode_stamps_request(asker.service().clock(), &["a", "b", "c"]);
    let reply = asker
        .node()
        .request(replica.node().peer_id(), STAMPS, request.into(), DEADLINE)
        .await
        .unwrap();
    let answer = stamps::decode_stamps_answer(&reply, 3).unwrap();
    let expected = Stamp {
        version,
        hash: content_hash(b"bee"),
    };
    assert_eq!(answer.answer, Ok(vec![None, Some(expected), None]));
}

#[tokio::test]
async fn a_non_members_stamps_request_is_refused_and_counted() {
    let members = [quiet().await, quiet().await];
    members_meshed(&members).await;
    let intruder = quiet().await;
    mesh(&[&members[0], &intruder]).await;
    let request = stamps::encode_stamps_request(intruder.service().clock(), &["a", "b"]);
    let reply = intruder
        .node()
        .request(
            members[0].node().peer_id(),
            STAMPS,
            request.into(),
            DEADLINE,
        )
        .await
        .unwrap();
    let answer = stamps::decode_stamps_answer(&reply, 2).unwrap();
    assert_eq!(answer.answer, Err(Refusal::NotMember));
    assert_eq!(
        counted(
            &members[0],
            "meshwire_object_refused_requests_total",
            Some("not_member")
        ),
        1
    );
}

#[tokio::test]
async fn a_stamps_request_over_the_key_limit_is_refused_and_counted() {
    let nodes = [quiet().await, quiet().await];
    members_meshed(&nodes).await;
    let [asker, replica] = &nodes;
    let keys: Vec<String> = (0..=MAX_STAMP_KEYS).map(|i| format!("k{i}")).collect();
    let request = stamps::encode_stamps_request(asker.service().clock(), &keys);
    let result = asker
        .node()
        .request(
            replica.node().peer_id(),
            STAMPS,
            Bytes::from(request),
            DEADLINE,
        )
        .await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(
        counted(
            replica,
            "meshwire_object_refused_requests_total",
            Some("too_large")
        ),
        1
    );
    // A limit, not a broken protocol: the replica still answers on the same connection.
    let request = stamps::encode_stamps_request(asker.service().clock(), &keys[..2]);
    let reply = asker
        .node()
        .request(replica.node().peer_id(), STAMPS, request.into(), DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        stamps::decode_stamps_answer(&reply, 2).unwrap().answer,
        Ok(vec![None, None])
    );
}
