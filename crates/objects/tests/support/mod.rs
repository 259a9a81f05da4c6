//! What the object tests share: connecting daemons into a full mesh, members of one cluster.

use std::time::Duration;

use meshwire_objects::net::Daemon;

/// How long the daemons may take to connect.
const PATIENCE: Duration = Duration::from_secs(20);

/// Connects every pair of `daemons` and waits until they are all connected.
pub async fn mesh(daemons: &[&Daemon]) {
    for (index, daemon) in daemons.iter().enumerate() {
        for other in &daemons[index + 1..] {
            let address = other.node().local_addr().unwrap();
            daemon
                .node()
                .connect(address, other.node().peer_id())
                .await
                .unwrap();
        }
    }
    tokio::time::timeout(PATIENCE, async {
        while daemons
            .iter()
            .any(|daemon| daemon.node().connected_peers().len() < daemons.len() - 1)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the daemons connect");
}

/// Makes `daemons` the members of one cluster and connects every pair.
#[allow(dead_code)] // Not every test crate forms a cluster.
pub async fn members_meshed(daemons: &[Daemon]) {
    let ids: Vec<_> = daemons.iter().map(|d| d.node().peer_id()).collect();
    for daemon in daemons {
        daemon.service().set_members(ids.iter().copied());
    }
    mesh(&daemons.iter().collect::<Vec<_>>()).await;
}

/// Waits for `to` to close `from`'s connection (as it does after a malformed request), then
/// dials it again.
#[allow(dead_code)] // each test file compiles this module; not all of them use this
pub async fn reconnect_after_close(from: &Daemon, to: &Daemon) {
    let (from_id, to_id) = (from.node().peer_id(), to.node().peer_id());
    tokio::time::timeout(PATIENCE, async {
        while to.node().connected_peers().contains(&from_id) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        while from.node().connected_peers().contains(&to_id) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a malformed exchange's sender is still connected");
    let address = to.node().local_addr().unwrap();
    from.node().connect(address, to_id).await.unwrap();
    tokio::time::timeout(PATIENCE, async {
        while !to.node().connected_peers().contains(&from_id) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the sender could not dial again");
}
