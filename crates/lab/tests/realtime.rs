//! The emulated socket over real UDP on loopback: delay and loss are applied in user space.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{DATA, ECHO};
use meshwire::{Keypair, Node, NodeConfig};
use meshwire_lab::lab::wan_link;
use meshwire_lab::{Carrier, LabSocket, LinkSpec, Network, SocketStats};

async fn node(
    seed: u8,
    address: &str,
    network: &std::sync::Arc<Network>,
) -> (Node, std::sync::Arc<SocketStats>) {
    let address: SocketAddr = address.parse().unwrap();
    let socket = LabSocket::bind_real(address, network.clone(), u64::from(seed))
        .await
        .unwrap();
    let stats = socket.stats();
    let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
    config.transport.initial_mtu = meshwire_lab::lab::LAB_MTU;
    config.transport.mtu_discovery = false;
    (Node::with_socket(config, socket).unwrap(), stats)
}

#[tokio::test]
async fn real_sockets_get_the_emulated_delay_and_survive_its_loss() {
    let link = LinkSpec {
        loss: 0.05,
        ..wan_link(Duration::from_millis(20), 100_000_000)
    };
    let network = Network::new(link, Carrier::Loopback);
    let (a, a_stats) = node(1, "127.0.0.1:0", &network).await;
    let (b, _) = node(2, "127.0.0.2:0", &network).await;
    b.handle(ECHO, |_, body: Bytes| async move { Ok(body) })
        .unwrap();
    let mut inbox = b.subscribe(DATA).unwrap();
    a.connect(b.local_addr().unwrap(), b.peer_id())
        .await
        .unwrap();

    // Each round trip crosses the 20 ms link twice, 40 ms. A receiving delay line wakes ahead of its
    // next datagram and releases what is due within its lead (at most 2 ms, steered so datagrams
    // leave on time on average), so a datagram may come out up to 2 ms early at each end; loopback
    // alone takes well under a millisecond.
    for _ in 0..5 {
        let started = tokio::time::Instant::now();
        a.request(
            b.peer_id(),
            ECHO,
            Bytes::from_static(b"ping"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(36),
            "{:?}",
            started.elapsed()
        );
    }

    // 5% loss each way: QUIC retransmits, every message arrives, in order.
    for i in 0..500u32 {
        let mut payload = vec![7u8; 1024];
        payload[..4].copy_from_slice(&i.to_le_bytes());
        a.send(b.peer_id(), DATA, Bytes::from(payload))
            .await
            .unwrap();
    }
    for i in 0..500u32 {
        let message = tokio::time::timeout(Duration::from_secs(30), inbox.recv())
            .await
            .expect("message lost")
            .unwrap();
        assert_eq!(&message.payload[..4], &i.to_le_bytes());
        assert_eq!(message.payload.len(), 1024);
    }
    // The loss really was applied, and recovered from.
    assert!(SocketStats::get(&a_stats.lost) > 0);
}
