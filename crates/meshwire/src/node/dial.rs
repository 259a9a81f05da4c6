//! Dial and accept peers, keep one connection per peer, and redial configured peers with backoff.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use meshwire_proto::backoff::{Decision, Reconnect};
use meshwire_proto::PeerId;
use quinn::{Connection, ConnectionError, VarInt};
use tokio::time::Instant;

use super::tiebreak::{self, Keep};
use super::{
    lock, ConnectionEvent, Current, Direction, Inner, Node, CLOSE_DUPLICATE,
    CLOSE_PROTOCOL_VIOLATION, CLOSE_SHUTDOWN,
};
use crate::metrics::ReasonLabel;
use crate::tls::{self, TlsError};
use crate::Congestion;

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DialError {
    /// A node cannot dial itself.
    #[error("a node cannot dial itself")]
    SelfDial,
    /// The peer is not in this node's allowlist.
    #[error("peer {0} is not in the allowlist")]
    NotAllowed(PeerId),
    /// The remote presented another identity than the one dialed.
    #[error("dialed {expected} but the remote is {actual}")]
    UnexpectedPeer {
        /// The identity dialed.
        expected: PeerId,
        /// The identity the remote presented.
        actual: PeerId,
    },
    /// The remote refused this node during the handshake (for example, its allowlist).
    #[error("refused by the remote: {0}")]
    Refused(#[source] ConnectionError),
    /// The dial did not complete in time.
    #[error("dial timed out after {0:?}")]
    Timeout(Duration),
    /// quinn could not start the dial.
    #[error("cannot start the dial: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The handshake failed.
    #[error("handshake failed: {0}")]
    Handshake(ConnectionError),
    /// The TLS configuration for the dial could not be built.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The node is shutting down.
    #[error("the node is shutting down")]
    Closed,
}

impl Node {
    /// Dials `peer` at `address` once. Returns when the connection is up and the peer has
    /// confirmed the handshake (so a peer that refuses this node is an error here, not a
    /// connection that dies a moment later). Succeeds at once if already connected.
    pub async fn connect(&self, address: SocketAddr, peer: PeerId) -> Result<(), DialError> {
        self.inner.clone().dial(address, peer).await
    }

    /// Adds a configured peer: the node dials it now and redials it, with backoff, whenever the
    /// connection drops, until the node shuts down. Called again for a configured peer, it changes
    /// the address the next dials use (a peer that moved, found again by its DNS name).
    pub fn add_peer(&self, address: SocketAddr, peer: PeerId) -> Result<(), DialError> {
        self.inner.check_dialable(peer)?;
        {
            let mut peers = lock(&self.inner.peers);
            let entry = self.inner.peer_entry(&mut peers, peer);
            entry.address = Some(address);
            if entry.configured {
                return Ok(());
            }
            entry.configured = true;
        }
        tokio::spawn(self.inner.clone().redial_loop(address, peer));
        Ok(())
    }
}

impl Inner {
    pub(super) fn check_dialable(&self, peer: PeerId) -> Result<(), DialError> {
        if peer == self.local_id {
            return Err(DialError::SelfDial);
        }
        if let Some(allowlist) = &self.allowlist {
            if !allowlist.contains(&peer) {
                return Err(DialError::NotAllowed(peer));
            }
        }
        if self.is_shutting_down() {
            return Err(DialError::Closed);
        }
        Ok(())
    }

    /// Makes `connection` the current one for `remote`, unless the tie-break keeps an existing
    /// connection, in which case `connection` is closed. Returns whether it was kept.
    pub(super) fn register(
        self: &Arc<Self>,
        connection: Connection,
        remote: PeerId,
        direction: Direction,
        allowance: crate::congestion::AllowanceCell,
    ) -> bool {
        if self.is_shutting_down() {
            connection.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
            return false;
        }
        let now = Instant::now();
        {
            let mut peers = lock(&self.peers);
            let entry = self.peer_entry(&mut peers, remote);
            let previous = entry.current.borrow().clone();
            if entry.up && previous.as_ref().is_some_and(|c| !c.is_alive()) {
                // The previous connection closed and its close has not been handled yet: the
                // peer went down before this connection came up.
                self.peer_watchers.announce(remote, false);
                entry.up = false;
            }
            if let Some(existing) = previous.filter(Current::is_alive) {
                let keep = tiebreak::Duplicate {
                    local: self.local_id,
                    remote,
                    existing: existing.direction,
                    new: direction,
                    existing_age: now.saturating_duration_since(existing.since),
                    window: self.config.dial_timeout,
                }
                .resolve();
                let loser = match keep {
                    Keep::New => &existing.connection,
                    Keep::Existing => &connection,
                };
                loser.close(VarInt::from_u32(CLOSE_DUPLICATE), b"duplicate connection");
                if keep == Keep::Existing {
                    return false;
                }
            }
            entry.current.send_replace(Some(Current {
                connection: connection.clone(),
                direction,
                since: now,
                allowance,
            }));
            if !entry.up {
                self.peer_watchers.announce(remote, true);
                entry.up = true;
            }
        }
        self.metrics.connections.inc();
        self.metrics.observe_rtt(&remote, connection.rtt());
        tracing::debug!(peer = %remote.short(), ?direction, "connected");
        self.emit(ConnectionEvent::Connected {
            peer: remote,
            address: connection.remote_address(),
            direction,
        });
        tokio::spawn(
            self.datagrams
                .clone()
                .receive_loop(connection.clone(), remote),
        );
        tokio::spawn(self.clone().connection_loop(connection, remote));
        true
    }

    pub(super) fn on_connection_closed(
        &self,
        remote: PeerId,
        connection: &Connection,
        reason: ConnectionError,
    ) {
        self.metrics.connections.dec();
        let mut peers = lock(&self.peers);
        let Some(entry) = peers.get_mut(&remote) else {
            return;
        };
        let is_current = entry
            .current
            .borrow()
            .as_ref()
            .is_some_and(|c| c.connection.stable_id() == connection.stable_id());
        if !is_current {
            return;
        }
        entry.current.send_replace(None);
        if entry.up {
            self.peer_watchers.announce(remote, false);
            entry.up = false;
        }
        if !entry.configured {
            // A peer we only know from its own dial: forget it (its queued messages are counted
            // as dropped by the writer).
            peers.remove(&remote);
            self.metrics.forget_peer(&remote);
        }
        drop(peers);
        tracing::debug!(peer = %remote.short(), %reason, "disconnected");
        self.emit(ConnectionEvent::Disconnected {
            peer: remote,
            reason,
        });
    }

    pub(super) async fn accept_loop(self: Arc<Self>) {
        loop {
            let incoming = tokio::select! {
                incoming = self.endpoint.accept() => incoming,
                _ = self.shutdown_signal() => return,
            };
            let Some(incoming) = incoming else { return };
            tokio::spawn(self.clone().accept_one(incoming));
        }
    }

    async fn accept_one(self: Arc<Self>, incoming: quinn::Incoming) {
        // An accepted connection resumes from what the last connection with this address
        // measured, as a dialed one does: a node that mostly answers (or is dialed by the peer
        // it sends batches to) starts its sends at the path's rate too.
        let address = incoming.remote_address();
        let slot = self.path_slot(address);
        let allowance = crate::congestion::AllowanceCell::default();
        let mut server_config = self.server_config.clone();
        server_config.transport_config(self.transport_with(&slot, &allowance));
        let connecting = match incoming.accept_with(Arc::new(server_config)) {
            Ok(connecting) => connecting,
            Err(error) => {
                tracing::debug!(%error, "incoming connection failed");
                return;
            }
        };
        let connection = match tokio::time::timeout(self.config.dial_timeout, connecting).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => {
                tracing::debug!(%error, "inbound handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("inbound handshake timed out");
                return;
            }
        };
        let Some(remote) = peer_id_of(&connection) else {
            connection.close(VarInt::from_u32(CLOSE_PROTOCOL_VIOLATION), b"no identity");
            return;
        };
        self.remember_path(address, slot);
        self.register(connection, remote, Direction::Inbound, allowance);
    }

    async fn dial(self: Arc<Self>, address: SocketAddr, peer: PeerId) -> Result<(), DialError> {
        self.check_dialable(peer)?;
        if self.current(peer).is_some() {
            return Ok(());
        }
        let (crypto, seen) = tls::client_crypto(&self.tls, peer)?;
        let mut client_config = quinn::ClientConfig::new(crypto);
        let slot = self.path_slot(address);
        let allowance = crate::congestion::AllowanceCell::default();
        client_config.transport_config(self.transport_with(&slot, &allowance));
        let timeout = self.config.dial_timeout;
        let attempt = async {
            let connecting =
                self.endpoint
                    .connect_with(client_config, address, &peer.to_string())?;
            // A dial still in its handshake when the peer connects to this node is given up:
            // a dial started while the peer was down can complete seconds later (a retransmitted
            // Initial), and as a second connection the tie-break could then close the one
            // already in use (a batch on it failed in `scripts/netns-cluster.sh` after a
            // restart). Given up before this side finished its handshake, the peer can never
            // complete it either, so no second connection appears; a handshake already complete
            // here is kept (`biased`) and the tie-break decides as for any simultaneous dial.
            let connection = tokio::select! {
                biased;
                result = connecting => result.map_err(DialError::Handshake)?,
                () = self.until_connected(peer) => return Ok(None),
            };
            // The client finishes its half of the handshake before the server has checked the
            // client's certificate; wait for HANDSHAKE_DONE so a refusal surfaces here.
            tokio::select! {
                reason = connection.closed() => {
                    if is_duplicate(&reason) {
                        // The peer kept the connection it dialed at the same moment.
                        self.until_connected(peer).await;
                        Ok(None)
                    } else {
                        Err(DialError::Handshake(reason))
                    }
                }
                () = handshake_confirmed(&connection) => Ok(Some(connection)),
            }
        };
        let result = tokio::time::timeout(timeout, attempt).await;
        let connection = match result {
            Ok(Ok(Some(connection))) => connection,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(error)) => {
                let actual = *lock(&seen);
                return Err(match (actual, error) {
                    (Some(actual), _) if actual != peer => DialError::UnexpectedPeer {
                        expected: peer,
                        actual,
                    },
                    (_, DialError::Handshake(reason)) if is_refusal(&reason) => {
                        DialError::Refused(reason)
                    }
                    (_, error) => error,
                });
            }
            Err(_) => return Err(DialError::Timeout(timeout)),
        };
        self.remember_path(address, slot);
        self.register(connection, peer, Direction::Outbound, allowance);
        Ok(())
    }

    /// The transport of a connection on the path `slot` remembers (dialed or accepted): under
    /// meshwire's controller it starts from what the last connection on it measured (careful
    /// resume) and records what this one measures. An estimate no real path gives is counted,
    /// forgotten and not used. Its controller also honours what senders claim on `allowance`
    /// ([`crate::Node::datagram_allowance`]).
    fn transport_with(
        self: &Arc<Self>,
        slot: &crate::congestion::PathSlot,
        allowance: &crate::congestion::AllowanceCell,
    ) -> Arc<quinn::TransportConfig> {
        let settings = &self.config.transport;
        if settings.congestion != Congestion::Meshwire {
            return self.transport.clone();
        }
        let remembered = *lock(slot);
        let estimate = remembered.filter(|estimate| {
            match estimate.check(settings.bandwidth_bits_per_sec / 8) {
                Ok(()) => true,
                Err(reason) => {
                    self.metrics
                        .path_estimates_ignored
                        .get_or_create(&ReasonLabel {
                            reason: reason.label(),
                        })
                        .inc();
                    *lock(slot) = None;
                    false
                }
            }
        });
        // The same settings built the node's transport at start, so this succeeds; were it to
        // fail, the shared transport (no resume) is the safe choice.
        settings
            .to_quinn_resuming(Some((estimate, slot.clone())), Some(allowance.clone()))
            .map(Arc::new)
            .unwrap_or_else(|_| self.transport.clone())
    }

    /// Waits until `peer` has a live connection (or is forgotten).
    async fn until_connected(self: &Arc<Self>, peer: PeerId) {
        let mut current = {
            let mut peers = lock(&self.peers);
            self.peer_entry(&mut peers, peer).current.subscribe()
        };
        let _ = current
            .wait_for(|c| c.as_ref().is_some_and(Current::is_alive))
            .await;
    }

    async fn redial_loop(self: Arc<Self>, address: SocketAddr, peer: PeerId) {
        let mut reconnect = Reconnect::configured(self.config.backoff);
        let mut current = {
            let peers = lock(&self.peers);
            match peers.get(&peer) {
                Some(entry) => entry.current.subscribe(),
                None => return,
            }
        };
        let mut ever_connected = false;
        loop {
            // Wait until there is no live connection (or the peer entry is gone).
            let wait = current.wait_for(|c| !c.as_ref().is_some_and(Current::is_alive));
            let gone = tokio::select! {
                result = wait => result.is_err(),
                _ = self.shutdown_signal() => true,
            };
            if gone {
                return;
            }
            if ever_connected && !self.backoff(&mut reconnect, peer).await {
                return;
            }
            loop {
                // The latest configured address: `add_peer` may have moved the peer since.
                let address = lock(&self.peers)
                    .get(&peer)
                    .and_then(|entry| entry.address)
                    .unwrap_or(address);
                let dialed = tokio::select! {
                    result = self.clone().dial(address, peer) => result,
                    _ = self.shutdown_signal() => return,
                };
                match dialed {
                    Ok(()) => {
                        if ever_connected {
                            self.metrics.reconnects.inc();
                        }
                        ever_connected = true;
                        reconnect.on_connected();
                        break;
                    }
                    Err(DialError::Closed) => return,
                    Err(DialError::UnexpectedPeer { expected, actual }) => {
                        // A wrong key at a configured address is an operator's problem (a
                        // stale peer id, an address reused by another node): say so loudly.
                        tracing::warn!(
                            %address,
                            expected = %expected,
                            actual = %actual,
                            "dial refused: the remote's key is not the expected peer id"
                        );
                        if !self.backoff(&mut reconnect, peer).await {
                            return;
                        }
                    }
                    Err(error @ DialError::Refused(_)) => {
                        tracing::warn!(peer = %peer, %address, %error, "dial refused by the remote");
                        if !self.backoff(&mut reconnect, peer).await {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(peer = %peer.short(), %error, "dial failed");
                        if !self.backoff(&mut reconnect, peer).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Sleeps the backoff delay; false if the peer should no longer be dialed.
    async fn backoff(&self, reconnect: &mut Reconnect, peer: PeerId) -> bool {
        let decision = {
            let mut rng = lock(&self.rng);
            reconnect.on_failure(Instant::now().into_std(), &mut *rng)
        };
        let Decision::RetryAfter(delay) = decision else {
            return false;
        };
        self.emit(ConnectionEvent::Reconnecting {
            peer,
            attempt: reconnect.attempt(),
            delay,
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = self.shutdown_signal() => false,
        }
    }
}

/// The identity a connected peer proved in its handshake.
fn peer_id_of(connection: &Connection) -> Option<PeerId> {
    let identity = connection.peer_identity()?;
    let certificates = identity
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    let first = certificates.first()?;
    tls::peer_id_from_certificate(first).ok()
}

/// Resolves once the peer's HANDSHAKE_DONE frame arrived, i.e. the server accepted this client.
async fn handshake_confirmed(connection: &Connection) {
    let mut interval = Duration::from_millis(1);
    while connection.stats().frame_rx.handshake_done == 0 {
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(20));
    }
}

/// Whether the remote closed the connection because it kept another one to this node.
fn is_duplicate(reason: &ConnectionError) -> bool {
    matches!(reason, ConnectionError::ApplicationClosed(close)
        if close.error_code == VarInt::from_u32(CLOSE_DUPLICATE))
}

/// Whether the remote closed the handshake with a TLS alert (it refused our certificate).
fn is_refusal(reason: &ConnectionError) -> bool {
    match reason {
        ConnectionError::ConnectionClosed(close) => {
            let code = u64::from(close.error_code);
            (0x100..0x200).contains(&code)
        }
        ConnectionError::TransportError(error) => {
            let code = u64::from(error.code);
            (0x100..0x200).contains(&code)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::congestion::resume::PathEstimate;
    use crate::{Keypair, NodeConfig, ProtocolId};

    fn node(seed: u8) -> Node {
        let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
        config.rng_seed = Some(seed.into());
        Node::bind(config, "127.0.0.1:0".parse().unwrap()).unwrap()
    }

    fn slot(node: &Node, address: SocketAddr) -> crate::congestion::PathSlot {
        node.inner.path_slot(address)
    }

    fn remembers(node: &Node, address: SocketAddr) -> bool {
        lock(&node.inner.paths).contains_key(&address)
    }

    async fn measured(slot: &crate::congestion::PathSlot) -> PathEstimate {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(estimate) = *lock(slot) {
                    return estimate;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the path was never measured")
    }

    /// A dialed connection records what it measured of the path for the next one.
    #[tokio::test]
    async fn a_dialed_connection_remembers_its_path() {
        let (a, b) = (node(1), node(2));
        let mut inbox = b.subscribe(ProtocolId(3)).unwrap();
        a.connect(b.local_addr().unwrap(), b.peer_id())
            .await
            .unwrap();
        for _ in 0..20 {
            a.send(b.peer_id(), ProtocolId(3), vec![7u8; 4000].into())
                .await
                .unwrap();
            inbox.recv().await.unwrap();
        }
        assert!(remembers(&a, b.local_addr().unwrap()));
        let estimate = measured(&slot(&a, b.local_addr().unwrap())).await;
        assert!(!estimate.min_rtt.is_zero());
        assert!(estimate.delivery_rate_bytes_per_sec > 0);
    }

    /// An accepted connection records its path under the dialer's address too, and a connection
    /// accepted later from that address (here a restarted peer) measures into the same slot.
    #[tokio::test]
    async fn an_accepted_connection_remembers_its_path() {
        let b = node(6);
        let mut dialer = None;
        let mut remembered = None;
        for seed in [5, 15] {
            let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
            config.rng_seed = Some(seed.into());
            let at = dialer.unwrap_or("127.0.0.1:0".parse().unwrap());
            // The closed node's socket is released once its tasks end: retry meanwhile.
            let mut bound = Node::bind(config.clone(), at);
            for _ in 0..200 {
                if bound.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                bound = Node::bind(config.clone(), at);
            }
            let a = bound.unwrap();
            let address = a.local_addr().unwrap();
            dialer = Some(address);
            let mut inbox = a.subscribe(ProtocolId(3)).unwrap();
            a.connect(b.local_addr().unwrap(), b.peer_id())
                .await
                .unwrap();
            assert!(remembers(&b, address));
            let slot = slot(&b, address);
            if let Some(remembered) = &remembered {
                assert!(std::sync::Arc::ptr_eq(remembered, &slot));
                *lock(&slot) = None;
            }
            for _ in 0..20 {
                b.send(a.peer_id(), ProtocolId(3), vec![7u8; 4000].into())
                    .await
                    .unwrap();
                inbox.recv().await.unwrap();
            }
            let estimate = measured(&slot).await;
            assert!(!estimate.min_rtt.is_zero());
            assert!(estimate.delivery_rate_bytes_per_sec > 0);
            remembered = Some(slot);
            a.close().await;
        }
    }

    /// A handshake that fails leaves no remembered path on either end, so refused or failed
    /// connections cannot displace the paths a node remembers.
    #[tokio::test]
    async fn a_refused_handshake_remembers_no_path() {
        let a = node(7);
        let mut config = NodeConfig::new(Keypair::from_seed([8; 32]));
        config.allowlist = Some([Keypair::from_seed([9; 32]).peer_id()].into());
        let b = Node::bind(config, "127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(a
            .connect(b.local_addr().unwrap(), b.peer_id())
            .await
            .is_err());
        assert!(!remembers(&a, b.local_addr().unwrap()));
        assert!(!remembers(&b, a.local_addr().unwrap()));
    }

    /// A remembered estimate no real path gives is not used, counted by reason, and forgotten.
    #[tokio::test]
    async fn an_absurd_estimate_is_ignored_and_counted() {
        let (a, b) = (node(3), node(4));
        let cap = a.inner.config.transport.bandwidth_bits_per_sec / 8;
        let cases = [
            (Duration::ZERO, 1_000_000, "zero_rtt"),
            (Duration::from_millis(20), 0, "zero_rate"),
            (Duration::from_millis(20), cap + 1, "rate_above_cap"),
        ];
        for (min_rtt, rate, reason) in cases {
            let slot = slot(&a, b.local_addr().unwrap());
            *lock(&slot) = Some(PathEstimate {
                delivery_rate_bytes_per_sec: rate,
                min_rtt,
            });
            let before = a.metrics().path_estimates_ignored_count(reason);
            a.inner
                .transport_with(&slot, &crate::congestion::AllowanceCell::default());
            assert_eq!(a.metrics().path_estimates_ignored_count(reason), before + 1);
            assert_eq!(*lock(&slot), None, "{reason}");
        }
        // The dial still works, from a cold start.
        a.connect(b.local_addr().unwrap(), b.peer_id())
            .await
            .unwrap();
    }
}
