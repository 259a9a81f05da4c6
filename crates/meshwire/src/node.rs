//! Run a node: dial and accept authenticated peers, send messages and fan-outs, make and serve
//! requests, and reconnect to configured peers.
//!
//! # Design
//!
//! One QUIC connection per peer pair. A node keeps, per known peer, the current connection (a
//! `watch` channel), a bounded outbound queue (message count and frame bytes) and one writer task
//! that drains the queue onto a long-lived unidirectional stream, so messages to a peer arrive in
//! the order they were queued. Requests each take a fresh bidirectional stream; the caller's
//! deadline covers opening it, writing the request and reading the whole response.
//!
//! When both sides dial at once, two connections exist for a moment. The rule that keeps one:
//! between two live connections of opposite direction that were established within the dial
//! timeout of each other, keep the one dialed by the smaller [`PeerId`]; otherwise keep the newer
//! (the older one belongs to a peer that restarted). Both sides apply the same rule to the same
//! pair, so they keep the same connection. A dial whose handshake is still under way when the
//! peer's own connection to this node comes up is given up, so a dial that started while the
//! peer was down and completes late never replaces the connection already in use.
//!
//! Inbound messages are routed by [`ProtocolId`] to one bounded subscriber channel each. A full
//! channel stops reading the peer's stream, so QUIC flow control slows the sender instead of memory
//! growing; messages for a protocol nobody subscribed to are counted and dropped. A one-way stream
//! that completes no frame within [`NodeConfig::inbound_stream_timeout`] is stopped with
//! [`STOP_STREAM_TIMEOUT`] and counted (`meshwire_frame_errors_total{reason="stream_timeout"}`),
//! so unfinished streams cannot hold the per-connection places (`max_concurrent_uni_streams`)
//! until the connection closes; the writer finishes its stream after half that time idle.
//!
//! A peer that sends a malformed frame (bad header, unknown kind, wrong destination, truncated,
//! oversized) has its connection closed with [`CLOSE_PROTOCOL_VIOLATION`]; the error is counted in
//! `meshwire_frame_errors_total{reason}` and the node goes on serving everyone else. An oversized
//! *request* is answered with a `TooLarge` error instead, since limits may legitimately differ.
//! A request's body is read only once room for it is taken from the node's request budget
//! ([`NodeConfig::inbound_request_bytes`]); without room it is answered `busy` at once and counted
//! (`meshwire_dropped_total{reason="request_budget"}`), never left waiting in the connection's
//! receive window where it would hold back the requests being read.
//!
//! Everything here uses `tokio::time` and runs on a current-thread runtime, so the lab can drive it
//! in virtual time over an emulated socket.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use meshwire_proto::wire::{Destination, ProtocolId};
use meshwire_proto::PeerId;
use quinn::{Connection, VarInt};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::{broadcast, mpsc, watch, Semaphore};
use tokio::time::Instant;

use crate::config::{ConfigError, NodeConfig};
use crate::datagram::{self, DatagramError, DatagramInbox, InboundDatagram};
use crate::metrics::Metrics;
use crate::tls::{self, TlsError, TlsIdentity};

mod batch;
mod dial;
mod events;
mod inbound;
mod outbound;
mod registry;
mod request;
mod serve;
mod streamed;
mod tiebreak;

pub use batch::{
    split_into_chunks, BatchError, BatchSender, InboundBatch, RESET_BATCH_ABANDONED,
    STOP_BATCH_DISCARDED, STOP_BATCH_MALFORMED, STOP_BATCH_NO_SUBSCRIBER, STOP_BATCH_REPAIRED,
};
pub use dial::DialError;
use events::PeerWatchers;
pub use events::{ConnectionEvent, PeerChange, PeerEvents};
pub use inbound::{InboundMessage, Inbox, STOP_STREAM_TIMEOUT};
use outbound::OutboundQueue;
pub use outbound::{SendError, SendManyReport};
pub(crate) use registry::Registry;
pub use registry::SubscribeError;
pub use request::RequestError;
use serve::Handler;
pub use serve::{HandlerError, ServiceError};
pub use streamed::{
    AnswerBody, BodyError, BodySource, RequestBody, StreamedAnswer, STREAMED_PIECE_BYTES,
};

/// Connection close code: the node is shutting down.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// Connection close code: another connection to the same peer was kept.
pub const CLOSE_DUPLICATE: u32 = 1;
/// Connection close code: the peer sent a malformed frame.
pub const CLOSE_PROTOCOL_VIOLATION: u32 = 2;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The configuration is inconsistent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS identity could not be built.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Binding the socket failed.
    #[error("cannot bind the node's socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Which side opened a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// This node dialed.
    Outbound,
    /// The peer dialed.
    Inbound,
}

/// A snapshot of one known peer.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerStatus {
    /// The peer.
    pub peer: PeerId,
    /// Whether a connection is up.
    pub connected: bool,
    /// Who dialed the current connection.
    pub direction: Option<Direction>,
    /// The remote address of the current connection, else the configured one.
    pub address: Option<SocketAddr>,
    /// Smoothed RTT of the current connection.
    pub rtt: Option<Duration>,
    /// Messages waiting in the outbound queue.
    pub queued_messages: usize,
    /// Frame bytes waiting in the outbound queue.
    pub queued_bytes: usize,
    /// Whether the node redials this peer when the connection drops.
    pub configured: bool,
}

/// Datagrams waiting in quinn's send buffer for one peer ([`Node::datagram_backlog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramBacklog {
    /// Bytes of datagrams queued and not yet sent.
    pub queued_bytes: usize,
    /// The connection's congestion window.
    pub window_bytes: u64,
    /// The connection's smoothed RTT.
    pub rtt: Duration,
}

/// A running meshwire node. Clones share the node; dropping the last clone shuts it down.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
    _guard: Arc<ShutdownGuard>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("peer_id", &self.inner.local_id)
            .field("address", &self.local_addr().ok())
            .finish()
    }
}

struct ShutdownGuard(Arc<Inner>);

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        self.0.begin_shutdown();
    }
}

#[derive(Clone)]
struct Current {
    connection: Connection,
    direction: Direction,
    since: Instant,
    /// What senders with their own windows claimed of this connection's congestion window
    /// (read by meshwire's controller; no effect under the others).
    allowance: crate::congestion::AllowanceCell,
}

impl Current {
    fn is_alive(&self) -> bool {
        self.connection.close_reason().is_none()
    }
}

struct Peer {
    current: watch::Sender<Option<Current>>,
    queue: OutboundQueue,
    dst: Destination,
    address: Option<SocketAddr>,
    configured: bool,
    /// Whether peer-change subscribers were last told this peer is up.
    up: bool,
}

/// Remote addresses whose path estimate a node remembers for careful resume; past it, an
/// arbitrary one is forgotten (a connection to a forgotten address starts cold).
const MAX_REMEMBERED_PATHS: usize = 4096;

struct Inner {
    endpoint: quinn::Endpoint,
    local_id: PeerId,
    tls: TlsIdentity,
    transport: Arc<quinn::TransportConfig>,
    /// The endpoint's server config; an accepted connection gets a copy with its own transport
    /// (careful resume from what the last connection with its address measured).
    server_config: quinn::ServerConfig,
    config: NodeConfig,
    allowlist: Option<Arc<HashSet<PeerId>>>,
    peers: Mutex<HashMap<PeerId, Peer>>,
    /// What the last connection with each remote address (dialed or accepted) measured of the
    /// path (careful resume), kept after the peer's connection and entry are gone; at most
    /// [`MAX_REMEMBERED_PATHS`]. Keyed by address, not peer: the estimate belongs to the path,
    /// and a peer that moved is on another path (it starts cold, the safe side).
    paths: Mutex<HashMap<SocketAddr, crate::congestion::PathSlot>>,
    handlers: Registry<Handler>,
    subscribers: Registry<inbound::InboxSender>,
    events: broadcast::Sender<ConnectionEvent>,
    peer_watchers: PeerWatchers,
    metrics: Arc<Metrics>,
    next_message_id: AtomicU64,
    shutdown: watch::Sender<bool>,
    rng: Mutex<SmallRng>,
    batches: batch::BatchService,
    datagrams: Arc<DatagramInbox>,
    /// Body bytes of inbound requests being read or served, from `inbound_request_bytes`.
    request_bytes: Arc<Semaphore>,
    /// The kernel buffers of the node's real UDP socket (unset on a lab socket).
    socket_buffers: std::sync::OnceLock<crate::SocketBuffers>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep serving.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Node {
    /// Starts a node on a real UDP socket bound to `address`. Must run inside a tokio runtime.
    ///
    /// The socket's kernel buffers are sized from the configured bandwidth-delay product
    /// ([`TransportSettings::socket_buffer_bytes`](crate::TransportSettings::socket_buffer_bytes));
    /// a kernel that grants less is warned about, not fatal ([`Node::socket_buffers`]).
    pub fn bind(config: NodeConfig, address: SocketAddr) -> Result<Self, NodeError> {
        let (socket, buffers) = crate::udp::bind(address, config.transport.socket_buffer_bytes())?;
        let local = socket.local_addr()?;
        let socket = quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, socket)?;
        tracing::debug!(
            %local,
            receive_buffer = buffers.receive,
            send_buffer = buffers.send,
            gso_segments = socket.max_transmit_segments(),
            gro_segments = socket.max_receive_segments(),
            "udp socket"
        );
        let node = Self::with_socket(config, socket)?;
        node.inner.metrics.register_udp(local, buffers);
        let _ = node.inner.socket_buffers.set(buffers);
        Ok(node)
    }

    /// The kernel buffers of the node's UDP socket: asked for and granted. `None` for a node on
    /// a socket it did not bind itself ([`Node::with_socket`]).
    pub fn socket_buffers(&self) -> Option<crate::SocketBuffers> {
        self.inner.socket_buffers.get().copied()
    }

    /// Starts a node on any quinn socket: a real one, or the lab's emulated one. Must run inside a
    /// tokio runtime.
    pub fn with_socket(
        config: NodeConfig,
        socket: Arc<dyn quinn::AsyncUdpSocket>,
    ) -> Result<Self, NodeError> {
        config.validate()?;
        let metrics = Arc::new(Metrics::new());
        let tls = TlsIdentity::new(&config.keypair)?;
        let transport = Arc::new(config.transport.to_quinn()?);
        let allowlist = config.allowlist.clone().map(Arc::new);
        let server_crypto =
            tls::server_crypto(&tls, allowlist.clone(), metrics.handshakes_refused.clone())?;
        let mut server_config = quinn::ServerConfig::with_crypto(server_crypto);
        server_config.transport_config(transport.clone());
        // The stateless-reset key is derived from the identity, so a node that restarts answers
        // its peers' packets for the old connection with a valid reset: they learn at once that
        // the connection is gone instead of waiting out the idle timeout.
        let reset_key = config
            .keypair
            .derive_secret(b"meshwire stateless reset key v1");
        // The connection-id key is derived the same way: the restarted node must recognise its old
        // connection ids as its own, or it drops their packets instead of resetting them.
        let mut endpoint_config = quinn::EndpointConfig::new(Arc::new(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            &reset_key,
        )));
        let cid_secret = config
            .keypair
            .derive_secret(b"meshwire connection id key v1");
        let cid_key = u64::from_le_bytes(cid_secret[..8].try_into().unwrap_or([0; 8]));
        endpoint_config.cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
        });
        if let Some(seed) = config.rng_seed {
            // quinn draws connection ids and packet-number skips from this: seeded, a lab run
            // repeats exactly.
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&seed.to_le_bytes());
            endpoint_config.rng_seed(Some(bytes));
        }
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            endpoint_config,
            Some(server_config.clone()),
            socket,
            Arc::new(quinn::TokioRuntime),
        )?;
        let rng = match config.rng_seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        let (events, _) = broadcast::channel(1024);
        let batches = batch::BatchService::new(&metrics);
        let inner = Arc::new(Inner {
            endpoint,
            local_id: config.keypair.peer_id(),
            tls,
            transport,
            server_config,
            allowlist,
            peers: Mutex::new(HashMap::new()),
            paths: Mutex::new(HashMap::new()),
            handlers: Registry::default(),
            subscribers: Registry::default(),
            events,
            peer_watchers: PeerWatchers::default(),
            metrics,
            next_message_id: AtomicU64::new(0),
            shutdown: watch::Sender::new(false),
            rng: Mutex::new(rng),
            batches,
            datagrams: Arc::default(),
            request_bytes: Arc::new(Semaphore::new(config.inbound_request_bytes as usize)),
            socket_buffers: std::sync::OnceLock::new(),
            config,
        });
        tokio::spawn(inner.clone().accept_loop());
        Ok(Self {
            _guard: Arc::new(ShutdownGuard(inner.clone())),
            inner,
        })
    }

    /// This node's identity.
    pub fn peer_id(&self) -> PeerId {
        self.inner.local_id
    }

    /// The address the node's socket is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// A handle to the node's metrics that outlives the node (the lab reads a crashed host's).
    pub fn shared_metrics(&self) -> Arc<Metrics> {
        self.inner.metrics.clone()
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    /// Peers with a live connection.
    pub fn connected_peers(&self) -> Vec<PeerId> {
        let peers = lock(&self.inner.peers);
        let mut connected: Vec<PeerId> = peers
            .iter()
            .filter(|(_, peer)| {
                peer.current
                    .borrow()
                    .as_ref()
                    .is_some_and(Current::is_alive)
            })
            .map(|(id, _)| *id)
            .collect();
        connected.sort();
        connected
    }

    /// The round trip of the live connection to `peer`, `None` when not connected: one peer's
    /// [`PeerStatus::rtt`] without a snapshot of every peer (a quorum plan asks this of each
    /// candidate on every read).
    pub fn rtt_to(&self, peer: PeerId) -> Option<Duration> {
        let (connection, _) = self.inner.current(peer)?;
        Some(connection.rtt())
    }

    /// quinn's counters of the live connection to `peer` (packets, frames by type, bytes, path
    /// estimates), `None` when not connected.
    pub fn connection_stats(&self, peer: PeerId) -> Option<quinn::ConnectionStats> {
        let (connection, _) = self.inner.current(peer)?;
        Some(connection.stats())
    }

    /// A snapshot of every known peer, sorted by id.
    pub fn peers(&self) -> Vec<PeerStatus> {
        let peers = lock(&self.inner.peers);
        let queue = self.inner.config.queue;
        let mut out: Vec<PeerStatus> = peers
            .iter()
            .map(|(id, peer)| {
                let current = peer.current.borrow().clone().filter(Current::is_alive);
                PeerStatus {
                    peer: *id,
                    connected: current.is_some(),
                    direction: current.as_ref().map(|c| c.direction),
                    address: current
                        .as_ref()
                        .map(|c| c.connection.remote_address())
                        .or(peer.address),
                    rtt: current.as_ref().map(|c| c.connection.rtt()),
                    queued_messages: queue.max_messages - peer.queue.tx.capacity(),
                    queued_bytes: queue.max_bytes as usize - peer.queue.bytes.available_permits(),
                    configured: peer.configured,
                }
            })
            .collect();
        out.sort_by_key(|status| status.peer);
        out
    }

    /// Queues an unreliable QUIC datagram for `peer` on `protocol`. Refuses, rather than letting
    /// quinn drop an older queued datagram, when the connection's datagram buffer is full.
    pub fn send_datagram(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<(), DatagramError> {
        let (connection, _) = self
            .inner
            .current(peer)
            .ok_or(DatagramError::NotConnected(peer))?;
        datagram::send(&connection, protocol, &payload)
    }

    /// How many bytes of datagrams wait in quinn's send buffer for `peer`, beside the
    /// connection's congestion window and RTT (`None` when not connected). A sender that keeps
    /// its own windows (the multipath session) reads this to keep quinn's queue short: what
    /// waits there is delay the sender's own RTT samples would otherwise count as path delay.
    pub fn datagram_backlog(&self, peer: PeerId) -> Option<DatagramBacklog> {
        let (connection, _) = self.inner.current(peer)?;
        let buffer = self.inner.config.transport.datagram_buffer_bytes;
        Some(DatagramBacklog {
            queued_bytes: buffer.saturating_sub(connection.datagram_send_buffer_space()),
            window_bytes: connection.stats().path.cwnd,
            rtt: connection.rtt(),
        })
    }

    /// The cell where senders claim part of the congestion window of the current connection to
    /// `peer` for datagrams they keep in flight by windows of their own (`None` when not
    /// connected). Under [`crate::Congestion::Meshwire`] the connection's window is at least the
    /// sum of the live claims, within the configured bandwidth over the path's minimum RTT;
    /// under the other controllers claims change nothing. A claim is a
    /// [`crate::congestion::DatagramAllowance`]; one made on a connection that has since been
    /// replaced no longer counts (check with [`crate::congestion::AllowanceCell::holds`]).
    pub fn datagram_allowance(&self, peer: PeerId) -> Option<crate::congestion::AllowanceCell> {
        let peers = lock(&self.inner.peers);
        let current = peers
            .get(&peer)?
            .current
            .borrow()
            .clone()
            .filter(Current::is_alive)?;
        Some(current.allowance)
    }

    /// Receives every datagram peers send to this node on `protocol`. One subscriber per
    /// protocol: a second is refused while the first receiver lives. At most `capacity` wait;
    /// beyond that (or with no subscriber) arrivals are dropped and counted in
    /// [`Node::datagrams_dropped`].
    pub fn subscribe_datagrams(
        &self,
        protocol: ProtocolId,
        capacity: usize,
    ) -> Result<mpsc::Receiver<InboundDatagram>, SubscribeError> {
        self.inner.datagrams.subscribe(protocol, capacity)
    }

    /// Inbound datagrams dropped for want of a subscriber or of room in its queue.
    pub fn datagrams_dropped(&self) -> u64 {
        self.inner.datagrams.dropped()
    }

    /// Closes every connection, stops every task and waits (at most a second) for peers to
    /// acknowledge the close.
    pub async fn close(&self) {
        self.inner.begin_shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
    }
}

impl Inner {
    fn begin_shutdown(&self) {
        if self.shutdown.send_replace(true) {
            return;
        }
        self.endpoint
            .close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
        // Dropping the peers drops their queues and connection watches: writers and redialers end.
        lock(&self.peers).clear();
    }

    fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    async fn shutdown_signal(&self) {
        let mut receiver = self.shutdown.subscribe();
        let _ = receiver.wait_for(|closing| *closing).await;
    }

    fn next_id(&self) -> u64 {
        self.next_message_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The entry for `peer`, created (with its writer task) if new.
    fn peer_entry<'a>(
        self: &Arc<Self>,
        peers: &'a mut HashMap<PeerId, Peer>,
        peer: PeerId,
    ) -> &'a mut Peer {
        peers.entry(peer).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(self.config.queue.max_messages);
            let current = watch::Sender::new(None);
            tokio::spawn(self.clone().write_loop(peer, rx, current.subscribe()));
            Peer {
                current,
                queue: OutboundQueue {
                    tx,
                    bytes: Arc::new(Semaphore::new(self.config.queue.max_bytes as usize)),
                },
                dst: Destination::new(&peer),
                address: None,
                configured: false,
                up: false,
            }
        })
    }

    /// The slot holding what connections with `address` measured of the path: the remembered
    /// one, or a new one that [`Inner::remember_path`] keeps once its connection is up (so a
    /// handshake that fails, or a flood of them, never displaces a remembered path).
    fn path_slot(&self, address: SocketAddr) -> crate::congestion::PathSlot {
        lock(&self.paths).get(&address).cloned().unwrap_or_default()
    }

    /// Keeps `slot` as the path to `address` unless one is remembered already.
    fn remember_path(&self, address: SocketAddr, slot: crate::congestion::PathSlot) {
        let mut paths = lock(&self.paths);
        if !paths.contains_key(&address) && paths.len() >= MAX_REMEMBERED_PATHS {
            if let Some(evicted) = paths.keys().next().copied() {
                paths.remove(&evicted);
            }
        }
        paths.entry(address).or_insert(slot);
    }

    fn current(&self, peer: PeerId) -> Option<(Connection, Destination)> {
        let peers = lock(&self.peers);
        let entry = peers.get(&peer)?;
        let current = entry.current.borrow().clone().filter(Current::is_alive)?;
        Some((current.connection, entry.dst.clone()))
    }
}
