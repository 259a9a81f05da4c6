//! Probes on loopback daemons: each member is asked once as its connection comes up, so a slow
//! member is known as slow before any read waits on it; with probes off, nothing is sent.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::OBJECT_FETCH as FETCH;
use meshwire_objects::net::{Daemon, ObjectConfig};

mod support;

use support::members_meshed;

/// How long the slow member takes to answer any fetch.
const SLOW: Duration = Duration::from_millis(800);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

async fn start(probe: bool) -> Daemon {
    let mut config = ObjectConfig::default();
    config.scores.probe_on_connect = probe;
    Daemon::builder(config)
        .bind(loopback(), |_| {})
        .await
        .unwrap()
}

/// Makes `daemon` answer every fetch after [`SLOW`].
fn make_slow(daemon: &Daemon) {
    let node = daemon.node();
    node.stop_handling(FETCH);
    let service = daemon.service().clone();
    node.handle(FETCH, move |peer, body: Bytes| {
        let service = service.clone();
        async move {
            tokio::time::sleep(SLOW).await;
            service.serve_fetch(peer, &body)
        }
    })
    .unwrap();
}

#[tokio::test]
async fn a_slow_member_is_known_as_slow_before_the_first_read() {
    let daemons = vec![start(true).await, start(true).await, start(true).await];
    make_slow(&daemons[2]);
    members_meshed(&daemons).await;
    let (front, fast, slow) = (
        daemons[0].service(),
        daemons[1].node().peer_id(),
        daemons[2].node().peer_id(),
    );
    tokio::time::timeout(Duration::from_secs(10), async {
        while front.peer_score(slow).0 < SLOW {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the slow member's probe is answered and scored");
    // One probe per member, and none of them was a read.
    assert_eq!(front.probes_sent(), 2);
    let (fast_latency, _, fast_errors) = front.peer_score(fast);
    assert!(fast_latency < SLOW / 4, "fast member at {fast_latency:?}");
    assert_eq!(fast_errors, 0.0);
}

#[tokio::test]
async fn no_probe_is_sent_when_probes_are_off() {
    let daemons = vec![start(false).await, start(false).await];
    members_meshed(&daemons).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for daemon in &daemons {
        assert_eq!(daemon.service().probes_sent(), 0);
    }
}
