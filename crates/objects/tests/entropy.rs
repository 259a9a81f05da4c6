//! Anti-entropy on loopback daemons: a replica that missed writes, or became a replica when the
//! member list changed, converges without any read; malformed digest exchanges are refused,
//! counted, and close the sender's connection; one from another placement keeps it.
#![cfg(feature = "net")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_SYNC as SYNC};
use meshwire::{PeerId, RequestError};
use meshwire_objects::net::{Daemon, ObjectConfig};
use meshwire_objects::proto::entropy::{self, ExchangeLimits, Summary};
use meshwire_objects::proto::object::{self, FetchMode, Refusal, Stamp};

mod support;

use support::{mesh, reconnect_after_close};

const DEADLINE: Duration = Duration::from_secs(5);
/// How long convergence may take before a test fails (the rounds run every ~200 ms).
const PATIENCE: Duration = Duration::from_secs(30);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

fn config() -> ObjectConfig {
    ObjectConfig {
        anti_entropy_interval: Duration::from_millis(200),
        ..ObjectConfig::default()
    }
}

async fn start(dir: Option<&Path>, objects: ObjectConfig) -> Daemon {
    let mut builder = Daemon::builder(objects);
    if let Some(dir) = dir {
        builder = builder.data_dir(dir);
    }
    builder.bind(loopback(), |_| {}).await.unwrap()
}

fn set_members(daemons: &[&Daemon]) {
    let ids: Vec<PeerId> = daemons.iter().map(|d| d.node().peer_id()).collect();
    for daemon in daemons {
        daemon.service().set_members(ids.iter().copied());
    }
}

/// Every key and stamp in `daemon`'s store, read from its record headers.
fn stamps(daemon: &Daemon) -> BTreeMap<String, Stamp> {
    let mut out = BTreeMap::new();
    daemon
        .service()
        .store()
        .scan_stamps(|key, stamp, _| {
            out.insert(key.to_string(), stamp);
        })
        .unwrap();
    out
}

/// The value of the counter `name` (with `label`, such as `reason="x"`, or none) in `daemon`'s
/// metrics; 0 when absent.
fn counted(daemon: &Daemon, name: &str, label: &str) -> u64 {
    let text = daemon.node().metrics().encode_text();
    let prefix = if label.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{label}}} ")
    };
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `check` holds, polling; fails the test after [`PATIENCE`].
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_replica_that_missed_writes_converges_without_reads() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(Some(dirs[0].path()), config()).await;
    let b = start(Some(dirs[1].path()), config()).await;
    let c = start(Some(dirs[2].path()), config()).await;
    set_members(&[&a, &b, &c]);
    mesh(&[&a, &b, &c]).await;
    for i in 0..100 {
        a.service()
            .put(&format!("k{i}"), Bytes::from(format!("first {i}")))
            .await
            .unwrap();
    }
    let c_id = c.node().peer_id();
    c.shutdown().await.unwrap();
    // While C is down: 300 new keys and 50 rewrites, through both live members.
    for i in 50..400 {
        let through = if i % 2 == 0 { &a } else { &b };
        let outcome = through
            .service()
            .put(&format!("k{i}"), Bytes::from(format!("second {i}")))
            .await
            .unwrap();
        assert_eq!(outcome.acks, 2);
    }
    let c = start(Some(dirs[2].path()), config()).await;
    assert_eq!(c.node().peer_id(), c_id, "the identity persists");
    set_members(&[&a, &b, &c]);
    assert_eq!(stamps(&c).len(), 100, "C kept what it had");
    mesh(&[&a, &b, &c]).await;
    let expected = stamps(&a);
    assert_eq!(expected.len(), 400);
    assert_eq!(stamps(&b), expected);
    until("C converges", || stamps(&c) == expected).await;
    for i in [0, 49, 50, 399] {
        let held = c.service().get_local(&format!("k{i}")).unwrap();
        let first = if i < 50 { "first" } else { "second" };
        assert_eq!(held.content, format!("{first} {i}"));
    }
    // C pulls what it lacks and A and B push it: the 350 copies it missed are counted as
    // repaired once the exchanges in flight end.
    let repaired = || {
        let pulled = counted(
            &c,
            "meshwire_object_anti_entropy_repaired_keys_total",
            "direction=\"pulled\"",
        );
        let pushed: u64 = [&a, &b]
            .iter()
            .map(|d| {
                counted(
                    d,
                    "meshwire_object_anti_entropy_repaired_keys_total",
                    "direction=\"pushed\"",
                )
            })
            .sum();
        pulled + pushed
    };
    until("the repairs are counted", || repaired() >= 350).await;
    for daemon in [&a, &b, &c] {
        assert_eq!(
            counted(daemon, "meshwire_object_read_repairs_total", ""),
            0,
            "nothing was read"
        );
        assert!(counted(daemon, "meshwire_object_anti_entropy_rounds_total", "") > 0);
        assert!(counted(daemon, "meshwire_object_anti_entropy_sent_bytes_total", "") > 0);
    }
}

#[tokio::test]
async fn a_new_member_receives_the_keys_placed_on_it() {
    let one_replica_less = ObjectConfig {
        replication: 2,
        write_quorum: 2,
        read_quorum: 1,
        ..config()
    };
    let a = start(None, one_replica_less).await;
    let b = start(None, one_replica_less).await;
    let c = start(None, one_replica_less).await;
    set_members(&[&a, &b, &c]);
    mesh(&[&a, &b, &c]).await;
    for i in 0..300 {
        a.service()
            .put(&format!("k{i}"), Bytes::from(format!("v{i}")))
            .await
            .unwrap();
    }
    let d = start(None, one_replica_less).await;
    mesh(&[&a, &b, &c, &d]).await;
    set_members(&[&a, &b, &c, &d]);
    let d_id = d.node().peer_id();
    let placed: Vec<String> = (0..300)
        .map(|i| format!("k{i}"))
        .filter(|key| d.service().replicas(key).contains(&d_id))
        .collect();
    assert!(placed.len() > 50, "rendezvous gives D about half the keys");
    until("D holds every key placed on it", || {
        placed.iter().all(|key| d.service().get_local(key).is_ok())
    })
    .await;
    for key in &placed {
        let i: usize = key[1..].parse().unwrap();
        assert_eq!(d.service().get_local(key).unwrap().content, format!("v{i}"));
    }
}

/// Sends a raw digest message from `from` to `to`.
async fn sync(from: &Daemon, to: &Daemon, body: Vec<u8>) -> Result<Bytes, RequestError> {
    from.node()
        .request(to.node().peer_id(), SYNC, Bytes::from(body), DEADLINE)
        .await
}

#[tokio::test]
async fn malformed_digest_exchanges_are_refused_counted_and_close_the_connection() {
    let quiet = ObjectConfig {
        anti_entropy_interval: Duration::ZERO,
        ..ObjectConfig::default()
    };
    let a = start(None, quiet).await;
    let b = start(None, quiet).await;
    let outsider = start(None, quiet).await;
    set_members(&[&a, &b]);
    mesh(&[&a, &b, &outsider]).await;
    let members: Vec<[u8; 32]> = a
        .service()
        .members()
        .iter()
        .map(|p| *p.as_bytes())
        .collect();
    let placement = entropy::placement_id(&members, 3);
    let good = entropy::encode_digests(
        a.service().clock(),
        &placement,
        Summary::new(8).unwrap().digests(),
    );
    // A well-formed exchange works: B holds nothing either, so nothing is listed.
    let reply = sync(&a, &b, good.clone()).await.unwrap();
    let listed = entropy::decode_entries(&reply, 8, ExchangeLimits::default()).unwrap();
    assert_eq!(listed.answer, Ok(Vec::new()));

    let mut three_buckets = good.clone();
    three_buckets[24..26].copy_from_slice(&3u16.to_le_bytes());
    let mut absurd = good.clone();
    absurd[24..26].copy_from_slice(&u16::MAX.to_le_bytes());
    let mut claims_more = good.clone();
    claims_more[24..26].copy_from_slice(&4096u16.to_le_bytes());
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0; 5]);
    let other_placement = entropy::encode_digests(
        a.service().clock(),
        &entropy::placement_id(&members, 2),
        Summary::new(8).unwrap().digests(),
    );
    let cases = [
        (three_buckets, "bucket_count"),
        (absurd, "bucket_count"),
        (claims_more, "truncated"),
        (trailing, "trailing"),
        (good[..12].to_vec(), "truncated"),
        (other_placement, "placement_mismatch"),
    ];
    for (body, reason) in cases {
        let before = counted(
            &b,
            "meshwire_object_anti_entropy_errors_total",
            &format!("reason=\"{reason}\""),
        );
        let error = sync(&a, &b, body).await.unwrap_err();
        // Another placement is a member list one side changed first: refused, connection kept.
        // Everything else broke the protocol: answered, then A's connection is closed.
        let expected = if reason == "placement_mismatch" {
            "placement differs"
        } else {
            "malformed"
        };
        assert!(
            matches!(error, RequestError::Remote(ref text) if text.contains(expected)),
            "{reason}: {error:?}"
        );
        if reason != "placement_mismatch" {
            reconnect_after_close(&a, &b).await;
        }
        assert_eq!(
            counted(
                &b,
                "meshwire_object_anti_entropy_errors_total",
                &format!("reason=\"{reason}\"")
            ),
            before + 1,
            "{reason} is counted"
        );
    }
    // A non-member is refused as for any object request.
    let reply = sync(&outsider, &b, good.clone()).await.unwrap();
    let refused = entropy::decode_entries(&reply, 8, ExchangeLimits::default()).unwrap();
    assert_eq!(refused.answer, Err(Refusal::NotMember));
    assert_eq!(
        counted(
            &b,
            "meshwire_object_refused_requests_total",
            "reason=\"not_member\""
        ),
        1
    );
    // The connection and the node are still there: A's next object request is answered.
    assert!(b.node().connected_peers().contains(&a.node().peer_id()));
    let fetch = object::encode_fetch(a.service().clock(), FetchMode::Metadata, "k");
    let reply = a
        .node()
        .request(b.node().peer_id(), FETCH, Bytes::from(fetch), DEADLINE)
        .await
        .unwrap();
    assert!(object::decode_fetched(FetchMode::Metadata, &reply, 0).is_ok());
}

fn large(seed: usize, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| ((i * 7 + seed) % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn content_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("objects.content"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

/// A daemon whose store is on disk in `dir` with its caches off: every copy of 64 KiB or more is
/// in a content file and read from it, so its transfers go piece by piece from and to files.
async fn start_uncached(dir: &Path, objects: ObjectConfig) -> Daemon {
    Daemon::builder(objects)
        .data_dir(dir)
        .store_memory_bytes(0)
        .bind(loopback(), |_| {})
        .await
        .unwrap()
}

/// Three members with uncached stores on disk ([`start_uncached`]); `key` is written with a
/// large copy that all three hold, then the third is shut down (its store stays in its
/// directory, the last of `dirs`); returns the directories and the first two.
async fn trio_whose_third_holds(
    key: &str,
    objects: ObjectConfig,
) -> (Vec<tempfile::TempDir>, Daemon, Daemon) {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut daemons = Vec::new();
    for dir in &dirs {
        daemons.push(start_uncached(dir.path(), objects).await);
    }
    let [a, b, c] = <[Daemon; 3]>::try_from(daemons).ok().unwrap();
    set_members(&[&a, &b, &c]);
    mesh(&[&a, &b, &c]).await;
    a.service().put(key, large(0, 300_000)).await.unwrap();
    until("C holds the first copy", || {
        c.service().get_local(key).is_ok()
    })
    .await;
    c.shutdown().await.unwrap();
    (dirs, a, b)
}

#[tokio::test]
async fn large_copies_missed_by_a_replica_are_pulled_into_content_files() {
    let (dirs, a, b) = trio_whose_third_holds("old", config()).await;
    // While C is down: two new large keys and a rewrite of the one C holds.
    let written = [
        ("new", 1, 1 << 20),
        ("bigger", 2, 3 << 20),
        ("old", 3, 500_000),
    ];
    for (key, seed, len) in written {
        assert_eq!(
            a.service().put(key, large(seed, len)).await.unwrap().acks,
            2
        );
    }
    let c = start_uncached(dirs[2].path(), config()).await;
    set_members(&[&a, &b, &c]);
    mesh(&[&a, &b, &c]).await;
    let expected = stamps(&a);
    until("C converges", || stamps(&c) == expected).await;
    for (key, seed, len) in written {
        assert!(
            c.service().get_local(key).unwrap().content == large(seed, len),
            "C's copy of {key} differs"
        );
    }
    // One content file per object: the replaced copy's file is removed, and no transfer left
    // one behind.
    until("C holds one content file per object", || {
        content_files(dirs[2].path()) == 3
    })
    .await;
    // A pusher counts its push when the acknowledgement reaches it, which may be after C
    // already holds the copy: the counts are polled, not read once.
    let repaired = || -> u64 {
        [&a, &b, &c]
            .iter()
            .flat_map(|daemon| {
                ["pulled", "pushed"].map(|direction| {
                    counted(
                        daemon,
                        "meshwire_object_anti_entropy_repaired_keys_total",
                        &format!("direction=\"{direction}\""),
                    )
                })
            })
            .sum()
    };
    until("three repairs counted", || repaired() >= 3).await;
}

#[tokio::test]
async fn read_repair_sends_a_large_copy_from_its_content_file() {
    // Anti-entropy off, reads from every replica: a stale replica is repaired by reads alone.
    let quiet = ObjectConfig {
        anti_entropy_interval: Duration::ZERO,
        read_quorum: 3,
        ..ObjectConfig::default()
    };
    let (dirs, a, b) = trio_whose_third_holds("deed", quiet).await;
    a.service().put("deed", large(1, 700_000)).await.unwrap();
    let c = start_uncached(dirs[2].path(), quiet).await;
    set_members(&[&a, &b, &c]);
    mesh(&[&a, &b, &c]).await;
    let winner = stamps(&a)["deed"];
    assert_ne!(stamps(&c)["deed"], winner, "C missed the rewrite");
    // A streamed read through A, which holds the winner in its content file.
    let read = a.service().get_body("deed", true).await.unwrap();
    assert_eq!(read.stamp, winner);
    assert_eq!(read.repairs, 1, "the read found C stale");
    until("C is repaired", || stamps(&c)["deed"] == winner).await;
    assert!(c.service().get_local("deed").unwrap().content == large(1, 700_000));
    assert_eq!(counted(&a, "meshwire_object_read_repairs_total", ""), 1);
    until("C's replaced file is removed", || {
        content_files(dirs[2].path()) == 1
    })
    .await;
    drop(b);
}
