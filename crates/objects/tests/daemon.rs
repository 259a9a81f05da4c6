//! Daemons assembled on loopback: replication through the HTTP API, refusals, restarts, shutdown.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_STORE as STORE};
use meshwire::RequestError;
use meshwire_objects::net::{Daemon, DaemonError, ObjectConfig, ObjectServiceError};
use meshwire_objects::net::{PhysicalClock as _, SystemClock};
use meshwire_objects::proto::clock;
use meshwire_objects::proto::object::{self, content_hash, Stamp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a test waits for a mesh to form before it gives up.
mod support;

const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

async fn start(objects: ObjectConfig, data_dir: Option<&Path>) -> Result<Daemon, DaemonError> {
    let mut builder = Daemon::builder(objects).http(loopback());
    if let Some(dir) = data_dir {
        builder = builder.data_dir(dir);
    }
    builder.bind(loopback(), |_| {}).await
}

/// Three daemons with the default settings (R = 3, W = 2, read quorum 2), members of one
/// cluster, every pair connected.
async fn cluster() -> Vec<Daemon> {
    let mut daemons = Vec::new();
    for _ in 0..3 {
        daemons.push(start(ObjectConfig::default(), None).await.unwrap());
    }
    support::members_meshed(&daemons).await;
    daemons
}

async fn shutdown(daemons: Vec<Daemon>) {
    for daemon in daemons {
        daemon.shutdown().await.unwrap();
    }
}

/// One HTTP/1.1 exchange with `Connection: close`: the status and the body.
async fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let status = std::str::from_utf8(&raw[..split])
        .ok()
        .and_then(|head| head.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    Ok((status, raw[split + 4..].to_vec()))
}

fn error_code(body: &[u8]) -> String {
    let json: serde_json::Value = serde_json::from_slice(body).expect("a JSON error body");
    json["error"].as_str().unwrap_or_default().to_string()
}

fn wallet(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn a_put_through_one_daemon_is_read_through_another() {
    let daemons = cluster().await;
    let content = wallet(10_000);
    let put = http(
        daemons[0].http_address().unwrap(),
        "PUT",
        "/objects/wallet-1",
        &content,
    )
    .await
    .unwrap();
    assert_eq!(put.0, 201, "{}", String::from_utf8_lossy(&put.1));
    let got = http(
        daemons[2].http_address().unwrap(),
        "GET",
        "/objects/wallet-1",
        b"",
    )
    .await
    .unwrap();
    assert_eq!(got, (200, content.clone()));
    // The service API of a third daemon agrees with the HTTP API.
    let read = daemons[1].service().get("wallet-1").await.unwrap();
    assert_eq!(read.object.content, content);
    assert!(read.answers >= 2);
    shutdown(daemons).await;
}

#[tokio::test]
async fn malformed_requests_are_refused_with_typed_errors() {
    let daemons = cluster().await;
    let service = daemons[0].service();
    assert!(matches!(
        service.put("bad key!", Bytes::from_static(b"x")).await,
        Err(ObjectServiceError::InvalidKey(_))
    ));
    let max = service.config().max_object_bytes;
    assert!(matches!(
        service.put("big", Bytes::from(vec![0u8; max + 1])).await,
        Err(ObjectServiceError::TooLarge { len, max: limit }) if len == max + 1 && limit == max
    ));
    let (status, body) = http(
        daemons[0].http_address().unwrap(),
        "GET",
        "/objects/bad%20key!",
        b"",
    )
    .await
    .unwrap();
    assert_eq!((status, error_code(&body).as_str()), (400, "invalid_key"));

    // Node-to-node: a garbage fetch, and a copy whose content does not match its hash.
    let target = daemons[1].node().peer_id();
    let asker = daemons[0].node();
    let garbage = asker
        .request(
            target,
            FETCH,
            Bytes::from_static(&[0xff, 0, 1]),
            REQUEST_DEADLINE,
        )
        .await;
    assert!(
        matches!(garbage, Err(RequestError::Remote(_))),
        "{garbage:?}"
    );
    // Each closes the asker's connection: it dials again.
    support::reconnect_after_close(&daemons[0], &daemons[1]).await;
    let forged = Stamp {
        version: 7,
        hash: content_hash(b"the real content"),
    };
    let mut message = object::encode_store_header(1, "forged", &forged);
    message.extend_from_slice(b"something else");
    let refused = asker
        .request(target, STORE, Bytes::from(message), REQUEST_DEADLINE)
        .await;
    assert!(
        matches!(refused, Err(RequestError::Remote(_))),
        "{refused:?}"
    );
    support::reconnect_after_close(&daemons[0], &daemons[1]).await;
    assert!(matches!(
        daemons[1].service().get_local("forged"),
        Err(ObjectServiceError::NotFound)
    ));
    // The refusals left the daemons serving.
    daemons[0]
        .service()
        .put("after", Bytes::from_static(b"fine"))
        .await
        .unwrap();
    assert_eq!(
        daemons[2]
            .service()
            .get("after")
            .await
            .unwrap()
            .object
            .content,
        "fine"
    );
    shutdown(daemons).await;
}

#[tokio::test]
async fn the_store_and_identity_survive_a_restart_with_the_same_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let alone = ObjectConfig {
        replication: 1,
        write_quorum: 1,
        read_quorum: 1,
        ..ObjectConfig::default()
    };
    let daemon = start(alone, Some(dir.path())).await.unwrap();
    let peer_id = daemon.node().peer_id();
    let written = daemon
        .service()
        .put("ledger", Bytes::from(wallet(5000)))
        .await
        .unwrap();
    // A second daemon on the same data directory is refused while the first holds the store.
    let second = Daemon::builder(alone)
        .data_dir(dir.path())
        .start(daemon.node().clone())
        .await;
    assert!(
        matches!(second, Err(DaemonError::Store { .. })),
        "{second:?}"
    );
    daemon.shutdown().await.unwrap();

    let restarted = start(alone, Some(dir.path())).await.unwrap();
    assert_eq!(restarted.node().peer_id(), peer_id);
    let held = restarted.service().get_local("ledger").unwrap();
    assert_eq!(held.stamp, written.stamp);
    assert_eq!(held.content, wallet(5000));
    let (status, body) = http(
        restarted.http_address().unwrap(),
        "GET",
        "/objects/ledger",
        b"",
    )
    .await
    .unwrap();
    assert_eq!((status, body), (200, wallet(5000)));
    restarted.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_stops_the_http_api_and_the_node() {
    let daemon = start(ObjectConfig::default(), None).await.unwrap();
    let address = daemon.http_address().unwrap();
    let node = daemon.node().clone();
    assert_eq!(
        http(address, "GET", "/status", b"").await.unwrap().0,
        200,
        "serving before the shutdown"
    );
    daemon.shutdown().await.unwrap();
    assert!(
        http(address, "GET", "/status", b"").await.is_err(),
        "nothing answers HTTP after the shutdown"
    );
    let other = start(ObjectConfig::default(), None).await.unwrap();
    let dial = node
        .connect(other.node().local_addr().unwrap(), other.node().peer_id())
        .await;
    assert!(dial.is_err(), "a closed node dials no one: {dial:?}");
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_an_http_address_no_api_is_served() {
    let daemon = Daemon::builder(ObjectConfig::default())
        .bind(loopback(), |_| {})
        .await
        .unwrap();
    assert_eq!(daemon.http_address(), None);
    let local = daemon.service().get_local("nothing");
    assert!(matches!(local, Err(ObjectServiceError::NotFound)));
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_graceful_shutdown_compacts_a_store_whose_content_shrank() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(ObjectConfig::default(), Some(dir.path()))
        .await
        .unwrap();
    let piece = |key: u32, len: usize| -> Bytes {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(key + 3) as u8)
            .collect::<Vec<u8>>()
            .into()
    };
    let store = daemon.service().store();
    // Objects under the content-file threshold, so their content is in redb's file: 820 of
    // 50 KiB (41 MiB), then each replaced by 800 bytes. Batches keep the commits few.
    let objects = 820;
    let write = |version: u64, len: usize| {
        let copies: Vec<(String, Stamp, Bytes)> = (0..objects)
            .map(|key| {
                let content = piece(key + 100 * version as u32, len);
                let stamp = Stamp {
                    version,
                    hash: content_hash(&content),
                };
                (format!("k{key}"), stamp, content)
            })
            .collect();
        for batch in copies.chunks(40) {
            store.put_batch(batch).unwrap();
        }
    };
    write(1, 50 << 10);
    write(2, 800);
    let file = dir.path().join("objects.redb");
    let disk = |path: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    };
    let before = disk(&file);
    assert!(
        before > 40 << 20,
        "40 MiB were written: {before} bytes on disk"
    );
    daemon.shutdown().await.unwrap();
    let after = disk(&file);
    assert!(
        after < 8 << 20,
        "656 KB of content left: {after} bytes on disk"
    );
    // Everything written last is there after a restart.
    let restarted = start(ObjectConfig::default(), Some(dir.path()))
        .await
        .unwrap();
    for key in 0..objects {
        let object = restarted.service().store().get(&format!("k{key}")).unwrap();
        assert_eq!(object.unwrap().content, piece(key + 200, 800));
    }
    restarted.shutdown().await.unwrap();
}

#[tokio::test]
async fn writes_a_busy_replica_refused_are_sent_again_and_acknowledged() {
    // Replica B has room for one store request at a time (its request budget holds one largest
    // frame); eight concurrent writes through A all need B's ack (W = R = 2).
    let objects = ObjectConfig {
        replication: 2,
        write_quorum: 2,
        read_quorum: 1,
        max_object_bytes: 1 << 19 | 1 << 18 | 1 << 17,
        ..ObjectConfig::default()
    };
    let a = start(objects, None).await.unwrap();
    let b = Daemon::builder(objects)
        .bind(loopback(), |config| {
            config.limits.max_payload_bytes = 1 << 20;
            config.inbound_request_bytes = (1 << 20) + 4096;
        })
        .await
        .unwrap();
    let ids = [a.node().peer_id(), b.node().peer_id()];
    for daemon in [&a, &b] {
        daemon.service().set_members(ids);
    }
    support::mesh(&[&a, &b]).await;
    let writes = (0..8).map(|i| {
        let service = a.service().clone();
        async move {
            let content = Bytes::from(vec![i as u8; 700 << 10]);
            service.put(&format!("large-{i}"), content).await
        }
    });
    for (i, outcome) in futures_util::future::join_all(writes)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(outcome.unwrap().acks, 2, "large-{i}");
    }
    assert!(
        b.node().metrics().dropped_count("request_budget") > 0,
        "no store found B's budget full: the test did not exercise a busy replica"
    );
    for i in 0..8 {
        let held = b.service().get_local(&format!("large-{i}")).unwrap();
        assert_eq!(held.content, vec![i as u8; 700 << 10]);
    }
    shutdown(vec![a, b]).await;
}

/// The content files in a daemon's data directory.
fn content_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("objects.content"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_large_put_is_streamed_into_every_replicas_content_file() {
    // Three members with stores on disk (R = 3, W = 2): a large body goes to a content file on
    // the node it reaches, and from that file to the other two, piece by piece.
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut daemons = Vec::new();
    for dir in &dirs {
        daemons.push(
            start(ObjectConfig::default(), Some(dir.path()))
                .await
                .unwrap(),
        );
    }
    support::members_meshed(&daemons).await;
    let content = wallet(3 << 20 | 12_345);
    let address = daemons[0].http_address().unwrap();
    let put = http(address, "PUT", "/objects/large", &content)
        .await
        .unwrap();
    assert_eq!(put.0, 201, "{}", String::from_utf8_lossy(&put.1));
    // Every replica comes to hold it in one content file of its own (the third after W acks).
    for (daemon, dir) in daemons.iter().zip(&dirs) {
        let held = held_eventually(daemon, "large").await;
        assert!(held == content, "a replica's copy differs");
        assert_eq!(content_files(dir.path()), 1);
    }
    let got = http(
        daemons[2].http_address().unwrap(),
        "GET",
        "/objects/large",
        b"",
    )
    .await
    .unwrap();
    assert!(
        got.0 == 200 && got.1 == content,
        "GET through another member"
    );

    // A member that sends a large copy whose content does not match its stamp's hash is refused
    // as malformed (checked as it arrives), and the replica keeps no file of it.
    let (a, b) = (&daemons[0], &daemons[1]);
    let now = clock::timestamp(SystemClock.now_ms(), 0);
    let stamp = Stamp {
        version: now,
        hash: content_hash(b"something else"),
    };
    let header = Bytes::from(object::encode_store_header(now, "forged", &stamp));
    let forged = Bytes::from(wallet(200_000));
    let refused = a
        .node()
        .request_parts(b.node().peer_id(), STORE, header, forged, REQUEST_DEADLINE)
        .await;
    assert!(
        matches!(&refused, Err(RequestError::Remote(reason)) if reason.contains("does not match its hash")),
        "{refused:?}"
    );
    assert_eq!(content_files(dirs[1].path()), 1);
    assert!(b.service().get_local("forged").is_err());
    // A large copy from a node outside the cluster is refused before its content is read.
    let intruder = start(ObjectConfig::default(), None).await.unwrap();
    support::mesh(&[&intruder, b]).await;
    let content = wallet(200_000);
    let stamp = Stamp {
        version: now,
        hash: content_hash(&content),
    };
    let header = Bytes::from(object::encode_store_header(now, "intruded", &stamp));
    let reply = intruder
        .node()
        .request_parts(
            b.node().peer_id(),
            STORE,
            header,
            Bytes::from(content),
            REQUEST_DEADLINE,
        )
        .await
        .unwrap();
    let answer = object::decode_stored(&reply).unwrap();
    assert_eq!(answer.answer, Err(object::Refusal::NotMember));
    assert_eq!(content_files(dirs[1].path()), 1);
    intruder.shutdown().await.unwrap();

    // A short body of unknown length (chunked) is stored in the store's pages, not in a file;
    // one over the size limit is refused once it passes the limit, and leaves no file.
    let short = wallet(1_000);
    let put = chunked_put(address, "/objects/short", &short, 1).await;
    assert!(
        put.starts_with(b"HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&put)
    );
    // W = 2 of 3: the coordinator's own copy may be the one that comes after the answer.
    assert_eq!(held_eventually(&daemons[0], "short").await, short);
    let max = ObjectConfig::default().max_object_bytes;
    let huge = chunked_put(
        address,
        "/objects/huge",
        &[7u8; 1 << 20],
        max / (1 << 20) + 1,
    )
    .await;
    assert!(
        huge.starts_with(b"HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&huge[..huge.len().min(200)])
    );
    assert_eq!(content_files(dirs[0].path()), 1);
    shutdown(daemons).await;
}

/// `daemon`'s own copy of `key` once it holds one (a write answers at W acks; the other
/// replicas follow).
async fn held_eventually(daemon: &Daemon, key: &str) -> Bytes {
    for _ in 0..100 {
        if let Ok(held) = daemon.service().get_local(key) {
            return held.content;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{key} never reached this replica");
}

/// A `PUT` of `piece` repeated `times`, sent chunked (no `Content-Length`); stops sending when
/// the node cuts the connection. Returns the raw answer.
async fn chunked_put(address: SocketAddr, path: &str, piece: &[u8], times: usize) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..times {
        let size = format!("{:x}\r\n", piece.len());
        let written = async {
            stream.write_all(size.as_bytes()).await?;
            stream.write_all(piece).await?;
            stream.write_all(b"\r\n").await
        };
        if written.await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    raw
}

#[tokio::test]
async fn a_large_object_is_streamed_to_a_reader_through_a_node_that_does_not_hold_it() {
    // Three members with stores on disk, two replicas per key: a GET through the third streams
    // the content from a replica's file into its response. Small objects ride in the vote.
    let objects = ObjectConfig {
        replication: 2,
        write_quorum: 2,
        read_quorum: 2,
        ..ObjectConfig::default()
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut daemons = Vec::new();
    for dir in &dirs {
        daemons.push(start(objects, Some(dir.path())).await.unwrap());
    }
    support::members_meshed(&daemons).await;
    for (key, len) in [("large", 2 << 20 | 777), ("small", 10_000)] {
        let replicas = daemons[0].service().replicas(key);
        let outsider = daemons
            .iter()
            .find(|d| !replicas.contains(&d.node().peer_id()))
            .unwrap();
        let content = wallet(len);
        let path = format!("/objects/{key}");
        let writer = daemons[0].http_address().unwrap();
        let put = http(writer, "PUT", &path, &content).await.unwrap();
        assert_eq!(put.0, 201, "{}", String::from_utf8_lossy(&put.1));
        let got = http(outsider.http_address().unwrap(), "GET", &path, b"")
            .await
            .unwrap();
        assert!(
            got.0 == 200 && got.1 == content,
            "GET {key} through a non-replica"
        );
        assert!(outsider.service().get_local(key).is_err());
        // The service's own read (whole) agrees.
        let read = outsider.service().get(key).await.unwrap();
        assert!(read.object.content == content);
    }
    shutdown(daemons).await;
}
