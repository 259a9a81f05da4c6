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
//! pair, so they keep the same connection.
//!
//! Inbound messages are routed by [`ProtocolId`] to one bounded subscriber channel each. A full
//! channel stops reading the peer's stream, so QUIC flow control slows the sender instead of memory
//! growing; messages for a protocol nobody subscribed to are counted and dropped.
//!
//! A peer that sends a malformed frame (bad header, unknown kind, wrong destination, truncated,
//! oversized) has its connection closed with [`CLOSE_PROTOCOL_VIOLATION`]; the error is counted in
//! `meshwire_frame_errors_total{reason}` and the node goes on serving everyone else. An oversized
//! *request* is answered with a `TooLarge` error instead, since limits may legitimately differ.
//!
//! Everything here uses `tokio::time` and runs on a current-thread runtime, so the lab can drive it
//! in virtual time over an emulated socket.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use meshwire_proto::backoff::{Decision, Reconnect};
use meshwire_proto::wire::{
    self, Destination, EncodedMessage, ErrorCode, Kind, Limits, MsgHeader, ProtocolId, WireError,
};
use meshwire_proto::PeerId;
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::{broadcast, mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::{ConfigError, NodeConfig};
use crate::datagram::{self, DatagramError, DatagramInbox, InboundDatagram};
use crate::framing::{read_frame, read_frame_after, wire_error_label, ReadFrameError};
use crate::metrics::Metrics;
use crate::tls::{self, TlsError, TlsIdentity};

mod batch;

pub use batch::{
    split_into_chunks, BatchError, BatchSender, InboundBatch, RESET_BATCH_ABANDONED,
    STOP_BATCH_DISCARDED, STOP_BATCH_MALFORMED, STOP_BATCH_NO_SUBSCRIBER,
};

/// Connection close code: the node is shutting down.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// Connection close code: another connection to the same peer was kept.
pub const CLOSE_DUPLICATE: u32 = 1;
/// Connection close code: the peer sent a malformed frame.
pub const CLOSE_PROTOCOL_VIOLATION: u32 = 2;

/// Stream reset code: the request took too long to arrive.
const RESET_REQUEST_TIMEOUT: u32 = 1;

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
    Refused(String),
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

/// Why a message was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The peer is neither connected nor configured.
    #[error("unknown peer {0}")]
    UnknownPeer(PeerId),
    /// The peer's outbound queue is full (count or bytes); the message was not queued.
    #[error("outbound queue to {0} is full")]
    QueueFull(PeerId),
    /// The message exceeds the frame limits.
    #[error(transparent)]
    TooLarge(WireError),
    /// The node is shutting down.
    #[error("the node is shutting down")]
    Closed,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No connection to the peer.
    #[error("not connected to {0}")]
    NotConnected(PeerId),
    /// The whole exchange did not finish within the deadline; the streams were abandoned.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// The peer has no handler for the protocol.
    #[error("the peer refused the request: {0}")]
    Refused(String),
    /// The request or its response exceeds a frame limit (local or remote).
    #[error("too large: {0}")]
    TooLarge(String),
    /// The peer's handler returned an error.
    #[error("the peer's handler failed: {0}")]
    Remote(String),
    /// The connection or stream broke before the response arrived.
    #[error("peer gone: {0}")]
    PeerGone(String),
    /// The response was malformed; the connection was closed.
    #[error("malformed response: {0}")]
    Protocol(String),
}

impl RequestError {
    fn label(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "not_connected",
            Self::Timeout(_) => "timeout",
            Self::Refused(_) => "refused",
            Self::TooLarge(_) => "too_large",
            Self::Remote(_) => "remote_error",
            Self::PeerGone(_) => "peer_gone",
            Self::Protocol(_) => "protocol_error",
        }
    }
}

/// A second subscription to the same protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The protocol already has a live subscriber.
    #[error("protocol {0:?} already has a subscriber")]
    AlreadySubscribed(ProtocolId),
}

/// An error a request handler returns; its text reaches the caller as [`RequestError::Remote`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

/// Which side opened a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// This node dialed.
    Outbound,
    /// The peer dialed.
    Inbound,
}

/// A change in a peer's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// A connection to `peer` is up.
    Connected {
        /// The peer.
        peer: PeerId,
        /// Its address.
        address: SocketAddr,
        /// Who dialed.
        direction: Direction,
    },
    /// The connection to `peer` is gone.
    Disconnected {
        /// The peer.
        peer: PeerId,
        /// Why, as quinn reported it.
        reason: String,
    },
    /// A configured peer will be dialed again after `delay`.
    Reconnecting {
        /// The peer.
        peer: PeerId,
        /// Failed attempts so far.
        attempt: u32,
        /// Wait before the next dial.
        delay: Duration,
    },
}

/// A message received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMessage {
    /// The sender.
    pub from: PeerId,
    /// The protocol it was sent on.
    pub protocol: ProtocolId,
    /// The sender's message id.
    pub message_id: u64,
    /// The payload, sliced from the receive buffer.
    pub payload: Bytes,
}

/// What `send_many` did for each destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendManyReport {
    /// Destinations whose queue took the message.
    pub queued: usize,
    /// Destinations that refused it, and why.
    pub failed: Vec<(PeerId, SendError)>,
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

type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, HandlerError>> + Send>>;
type Handler = Arc<dyn Fn(PeerId, Bytes) -> HandlerFuture + Send + Sync>;

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
}

impl Current {
    fn is_alive(&self) -> bool {
        self.connection.close_reason().is_none()
    }
}

struct Outbound {
    chunks: [Bytes; 3],
    len: u64,
    _permit: OwnedSemaphorePermit,
}

impl Outbound {
    fn new(message: &EncodedMessage, dst: &Destination, permit: OwnedSemaphorePermit) -> Self {
        Self {
            chunks: message.chunks_for(dst),
            len: message.frame_len() as u64,
            _permit: permit,
        }
    }
}

#[derive(Clone)]
struct OutboundQueue {
    tx: mpsc::Sender<Outbound>,
    bytes: Arc<Semaphore>,
}

impl OutboundQueue {
    fn try_push(
        &self,
        peer: PeerId,
        message: &EncodedMessage,
        dst: &Destination,
    ) -> Result<(), SendError> {
        let len = message.frame_len() as u32;
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(len)
            .map_err(|_| SendError::QueueFull(peer))?;
        let item = Outbound::new(message, dst, permit);
        self.tx.try_send(item).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => SendError::QueueFull(peer),
            mpsc::error::TrySendError::Closed(_) => SendError::UnknownPeer(peer),
        })
    }

    async fn push(
        &self,
        peer: PeerId,
        message: &EncodedMessage,
        dst: &Destination,
    ) -> Result<(), SendError> {
        let len = message.frame_len() as u32;
        let permit = self
            .bytes
            .clone()
            .acquire_many_owned(len)
            .await
            .map_err(|_| SendError::UnknownPeer(peer))?;
        let item = Outbound::new(message, dst, permit);
        self.tx
            .send(item)
            .await
            .map_err(|_| SendError::UnknownPeer(peer))
    }
}

struct Peer {
    current: watch::Sender<Option<Current>>,
    queue: OutboundQueue,
    dst: Destination,
    address: Option<SocketAddr>,
    configured: bool,
}

struct Inner {
    endpoint: quinn::Endpoint,
    local_id: PeerId,
    tls: TlsIdentity,
    transport: Arc<quinn::TransportConfig>,
    config: NodeConfig,
    allowlist: Option<Arc<HashSet<PeerId>>>,
    peers: Mutex<HashMap<PeerId, Peer>>,
    handlers: RwLock<HashMap<ProtocolId, Handler>>,
    subscribers: RwLock<HashMap<ProtocolId, mpsc::Sender<InboundMessage>>>,
    events: broadcast::Sender<ConnectionEvent>,
    metrics: Arc<Metrics>,
    next_message_id: AtomicU64,
    shutdown: watch::Sender<bool>,
    rng: Mutex<SmallRng>,
    batches: batch::BatchService,
    datagrams: Arc<DatagramInbox>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
    pub fn bind(config: NodeConfig, address: SocketAddr) -> Result<Self, NodeError> {
        let socket = std::net::UdpSocket::bind(address)?;
        let socket = quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, socket)?;
        Self::with_socket(config, socket)
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
            Some(server_config),
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
            allowlist,
            peers: Mutex::new(HashMap::new()),
            handlers: RwLock::new(HashMap::new()),
            subscribers: RwLock::new(HashMap::new()),
            events,
            metrics,
            next_message_id: AtomicU64::new(0),
            shutdown: watch::Sender::new(false),
            rng: Mutex::new(rng),
            batches,
            datagrams: Arc::default(),
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

    /// Connection events from now on. A receiver that falls more than 1024 events behind skips
    /// the oldest ones (it sees `RecvError::Lagged`).
    pub fn events(&self) -> broadcast::Receiver<ConnectionEvent> {
        self.inner.events.subscribe()
    }

    /// Dials `peer` at `address` once. Returns when the connection is up and the peer has
    /// confirmed the handshake (so a peer that refuses this node is an error here, not a
    /// connection that dies a moment later). Succeeds at once if already connected.
    pub async fn connect(&self, address: SocketAddr, peer: PeerId) -> Result<(), DialError> {
        self.inner.clone().dial(address, peer).await
    }

    /// Adds a configured peer: the node dials it now and redials it, with backoff, whenever the
    /// connection drops, until the node shuts down.
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

    /// Receives every message sent to this node on `protocol`. One subscriber per protocol; a
    /// subscriber that stops reading slows its senders down (nothing is dropped while it lives).
    pub fn subscribe(
        &self,
        protocol: ProtocolId,
    ) -> Result<mpsc::Receiver<InboundMessage>, SubscribeError> {
        let mut subscribers = write(&self.inner.subscribers);
        if subscribers.get(&protocol).is_some_and(|tx| !tx.is_closed()) {
            return Err(SubscribeError::AlreadySubscribed(protocol));
        }
        let (tx, rx) = mpsc::channel(self.inner.config.inbound_queue_messages);
        subscribers.insert(protocol, tx);
        Ok(rx)
    }

    /// Serves requests on `protocol` with `handler`, replacing any earlier handler.
    pub fn handle<F, Fut>(&self, protocol: ProtocolId, handler: F)
    where
        F: Fn(PeerId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, HandlerError>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |peer, body| Box::pin(handler(peer, body)));
        write(&self.inner.handlers).insert(protocol, handler);
    }

    /// Queues `payload` for `peer`, waiting while the peer's queue is full.
    pub async fn send(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let message = self.inner.encode_message(protocol, payload)?;
        let (queue, dst) = self.inner.queue_for(peer)?;
        queue.push(peer, &message, &dst).await
    }

    /// Queues `payload` for `peer`, or fails at once with [`SendError::QueueFull`].
    pub fn try_send(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let message = self.inner.encode_message(protocol, payload)?;
        let (queue, dst) = self.inner.queue_for(peer)?;
        queue.try_push(peer, &message, &dst)
    }

    /// Queues one message for many peers: encoded once, with only the destination written per
    /// peer and the payload shared by reference. A full or unknown peer is reported in the
    /// result and never delays the others.
    pub fn send_many(
        &self,
        peers: &[PeerId],
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<SendManyReport, SendError> {
        let message = self.inner.encode_message(protocol, payload)?;
        let mut report = SendManyReport::default();
        let known = lock(&self.inner.peers);
        for peer in peers {
            let result = match known.get(peer) {
                Some(entry) => entry.queue.try_push(*peer, &message, &entry.dst),
                None => Err(SendError::UnknownPeer(*peer)),
            };
            match result {
                Ok(()) => report.queued += 1,
                Err(error) => {
                    self.inner.metrics.drop_message("send_refused");
                    report.failed.push((*peer, error));
                }
            }
        }
        Ok(report)
    }

    /// Sends `body` to `peer` on `protocol` and waits for the response. `deadline` covers the whole
    /// exchange; on expiry the streams are abandoned and the peer told to stop.
    pub async fn request(
        &self,
        peer: PeerId,
        protocol: ProtocolId,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RequestError> {
        let started = Instant::now();
        let result = match tokio::time::timeout(
            deadline,
            self.inner.clone().request_once(peer, protocol, body),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(RequestError::Timeout(deadline)),
        };
        match &result {
            Ok(_) => {
                self.inner.metrics.request_outcome("ok");
                self.inner
                    .metrics
                    .request_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(error) => self.inner.metrics.request_outcome(error.label()),
        }
        result
    }

    /// Closes the connection to `peer` because it sent something a service above the node could
    /// not accept (a malformed payload of a well-formed frame). The connection closes with
    /// [`CLOSE_PROTOCOL_VIOLATION`] and `reason`, `meshwire_frame_errors_total{reason}` counts it,
    /// and a configured peer is redialed with backoff as after any loss. Returns whether a live
    /// connection was closed.
    pub fn close_for_violation(&self, peer: PeerId, reason: &'static str) -> bool {
        let Some((connection, _)) = self.inner.current(peer) else {
            return false;
        };
        self.inner.protocol_violation(&connection, peer, reason);
        true
    }

    /// Queues an unreliable QUIC datagram for `peer`. Refuses, rather than letting quinn drop an
    /// older queued datagram, when the connection's datagram buffer is full.
    pub fn send_datagram(&self, peer: PeerId, payload: Bytes) -> Result<(), DatagramError> {
        let (connection, _) = self
            .inner
            .current(peer)
            .ok_or(DatagramError::NotConnected(peer))?;
        datagram::send(&connection, payload)
    }

    /// Receives every datagram peers send to this node, replacing any earlier subscriber. At most
    /// `capacity` wait; beyond that (or with no subscriber) arrivals are dropped and counted in
    /// [`Node::datagrams_dropped`].
    pub fn subscribe_datagrams(&self, capacity: usize) -> mpsc::Receiver<InboundDatagram> {
        self.inner.datagrams.subscribe(capacity)
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

    fn emit(&self, event: ConnectionEvent) {
        // No receiver is fine: events are informational.
        let _ = self.events.send(event);
    }

    fn next_id(&self) -> u64 {
        self.next_message_id.fetch_add(1, Ordering::Relaxed)
    }

    fn check_dialable(&self, peer: PeerId) -> Result<(), DialError> {
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
            }
        })
    }

    fn current(&self, peer: PeerId) -> Option<(Connection, Destination)> {
        let peers = lock(&self.peers);
        let entry = peers.get(&peer)?;
        let current = entry.current.borrow().clone().filter(Current::is_alive)?;
        Some((current.connection, entry.dst.clone()))
    }

    fn encode_message(
        &self,
        protocol: ProtocolId,
        payload: Bytes,
    ) -> Result<EncodedMessage, SendError> {
        if self.is_shutting_down() {
            return Err(SendError::Closed);
        }
        let header = MsgHeader {
            kind: Kind::Message,
            flags: 0,
            protocol,
            message_id: self.next_id(),
        };
        EncodedMessage::encode(&header, payload, &self.config.limits).map_err(SendError::TooLarge)
    }

    fn queue_for(&self, peer: PeerId) -> Result<(OutboundQueue, Destination), SendError> {
        let peers = lock(&self.peers);
        let entry = peers.get(&peer).ok_or(SendError::UnknownPeer(peer))?;
        Ok((entry.queue.clone(), entry.dst.clone()))
    }

    fn preferred_direction(&self, remote: PeerId) -> Direction {
        // The connection dialed by the smaller identity wins a simultaneous dial.
        if self.local_id < remote {
            Direction::Outbound
        } else {
            Direction::Inbound
        }
    }

    /// Makes `connection` the current one for `remote`, unless the tie-break keeps an existing
    /// connection, in which case `connection` is closed. Returns whether it was kept.
    fn register(
        self: &Arc<Self>,
        connection: Connection,
        remote: PeerId,
        direction: Direction,
    ) -> bool {
        if self.is_shutting_down() {
            connection.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
            return false;
        }
        let now = Instant::now();
        {
            let mut peers = lock(&self.peers);
            let entry = self.peer_entry(&mut peers, remote);
            let existing = entry.current.borrow().clone().filter(Current::is_alive);
            if let Some(existing) = existing {
                let simultaneous = existing.direction != direction
                    && now.saturating_duration_since(existing.since) < self.config.dial_timeout;
                let keep_new = !simultaneous || direction == self.preferred_direction(remote);
                let loser = if keep_new {
                    &existing.connection
                } else {
                    &connection
                };
                loser.close(VarInt::from_u32(CLOSE_DUPLICATE), b"duplicate connection");
                if !keep_new {
                    return false;
                }
            }
            entry.current.send_replace(Some(Current {
                connection: connection.clone(),
                direction,
                since: now,
            }));
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

    fn on_connection_closed(
        &self,
        remote: PeerId,
        connection: &Connection,
        reason: ConnectionError,
    ) {
        self.metrics.connections.dec();
        let mut peers = lock(&self.peers);
        let Some(entry) = peers.get(&remote) else {
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
        if !entry.configured {
            // A peer we only know from its own dial: forget it (its queued messages are counted
            // as dropped by the writer).
            peers.remove(&remote);
        }
        drop(peers);
        tracing::debug!(peer = %remote.short(), %reason, "disconnected");
        self.emit(ConnectionEvent::Disconnected {
            peer: remote,
            reason: reason.to_string(),
        });
    }

    fn protocol_violation(&self, connection: &Connection, remote: PeerId, reason: &'static str) {
        self.metrics.frame_error(reason);
        tracing::warn!(peer = %remote.short(), reason, "malformed frame; closing the connection");
        connection.close(
            VarInt::from_u32(CLOSE_PROTOCOL_VIOLATION),
            reason.as_bytes(),
        );
    }

    /// Checks that an inbound frame has the kind this stream carries and is addressed to this
    /// node, and counts it. A frame that fails closes the connection; returns whether it passed.
    fn accept_frame(
        &self,
        connection: &Connection,
        remote: PeerId,
        frame: &wire::Frame,
        expected: Kind,
    ) -> bool {
        if frame.header.kind != expected {
            self.protocol_violation(connection, remote, "unexpected_kind");
            return false;
        }
        if frame.dst != self.local_id {
            self.protocol_violation(connection, remote, "wrong_destination");
            return false;
        }
        self.metrics.frames_received.inc();
        self.metrics
            .bytes_received
            .inc_by((frame.payload.len() + wire::FRAME_OVERHEAD) as u64);
        true
    }

    async fn accept_loop(self: Arc<Self>) {
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
        let connecting = match incoming.accept() {
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
        self.register(connection, remote, Direction::Inbound);
    }

    async fn dial(self: Arc<Self>, address: SocketAddr, peer: PeerId) -> Result<(), DialError> {
        self.check_dialable(peer)?;
        if self.current(peer).is_some() {
            return Ok(());
        }
        let (crypto, seen) = tls::client_crypto(&self.tls, peer)?;
        let mut client_config = quinn::ClientConfig::new(crypto);
        client_config.transport_config(self.transport.clone());
        let timeout = self.config.dial_timeout;
        let attempt = async {
            let connecting =
                self.endpoint
                    .connect_with(client_config, address, &peer.to_string())?;
            let connection = connecting.await.map_err(DialError::Handshake)?;
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
                        DialError::Refused(reason.to_string())
                    }
                    (_, error) => error,
                });
            }
            Err(_) => return Err(DialError::Timeout(timeout)),
        };
        self.register(connection, peer, Direction::Outbound);
        Ok(())
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

    async fn write_loop(
        self: Arc<Self>,
        peer: PeerId,
        mut queue: mpsc::Receiver<Outbound>,
        mut current: watch::Receiver<Option<Current>>,
    ) {
        // Looked up once: the writer updates it after every drained queue.
        let rtt_gauge = self.metrics.peer_rtt_gauge(&peer);
        let mut stream: Option<(usize, SendStream)> = None;
        while let Some(mut item) = queue.recv().await {
            let connection = loop {
                let live = current
                    .borrow_and_update()
                    .clone()
                    .filter(Current::is_alive);
                if let Some(live) = live {
                    break Some(live.connection);
                }
                if current.changed().await.is_err() {
                    break None;
                }
            };
            let Some(connection) = connection else {
                self.metrics.drop_message("peer_removed");
                break;
            };
            if stream.as_ref().map(|(id, _)| *id) != Some(connection.stable_id()) {
                stream = match connection.open_uni().await {
                    Ok(send) => Some((connection.stable_id(), send)),
                    Err(_) => {
                        self.metrics.drop_message("connection_lost");
                        continue;
                    }
                };
            }
            let Some((_, send)) = stream.as_mut() else {
                continue;
            };
            match send.write_all_chunks(&mut item.chunks).await {
                Ok(()) => {
                    self.metrics.frames_sent.inc();
                    self.metrics.bytes_sent.inc_by(item.len);
                    if queue.is_empty() {
                        rtt_gauge.set(connection.rtt().as_secs_f64());
                    }
                }
                Err(_) => {
                    self.metrics.drop_message("connection_lost");
                    stream = None;
                }
            }
        }
        // The peer was removed: count what was still queued.
        queue.close();
        while queue.try_recv().is_ok() {
            self.metrics.drop_message("peer_removed");
        }
    }

    async fn connection_loop(self: Arc<Self>, connection: Connection, remote: PeerId) {
        loop {
            tokio::select! {
                stream = connection.accept_uni() => match stream {
                    Ok(recv) => {
                        tokio::spawn(self.clone().read_messages(connection.clone(), remote, recv));
                    }
                    Err(_) => break,
                },
                stream = connection.accept_bi() => match stream {
                    Ok((send, recv)) => {
                        tokio::spawn(self.clone().serve_request(connection.clone(), remote, send, recv));
                    }
                    Err(_) => break,
                },
            }
        }
        let reason = connection.closed().await;
        self.on_connection_closed(remote, &connection, reason);
    }

    async fn read_messages(
        self: Arc<Self>,
        connection: Connection,
        remote: PeerId,
        mut recv: RecvStream,
    ) {
        // A stream's first two bytes say what it carries: message frames or one batch.
        let mut magic = [0u8; 2];
        match recv.read_exact(&mut magic).await {
            Ok(()) => {}
            Err(quinn::ReadExactError::FinishedEarly(1)) => {
                self.protocol_violation(&connection, remote, "truncated");
                return;
            }
            Err(_) => return,
        }
        if magic == batch::BATCH_MAGIC {
            self.accept_batch(remote, recv).await;
            return;
        }
        let mut prefix: &[u8] = &magic;
        loop {
            let read = read_frame_after(&mut recv, prefix, &self.config.limits).await;
            prefix = &[];
            let frame = match read {
                Ok(Some(frame)) => frame,
                Ok(None) | Err(ReadFrameError::Stream(_)) => return,
                Err(ReadFrameError::Wire(error)) => {
                    self.protocol_violation(&connection, remote, wire_error_label(&error));
                    return;
                }
            };
            if !self.accept_frame(&connection, remote, &frame, Kind::Message) {
                return;
            }
            self.deliver(InboundMessage {
                from: remote,
                protocol: frame.header.protocol,
                message_id: frame.header.message_id,
                payload: frame.payload,
            })
            .await;
        }
    }

    async fn deliver(&self, message: InboundMessage) {
        let subscriber = read(&self.subscribers).get(&message.protocol).cloned();
        let Some(subscriber) = subscriber else {
            self.metrics.drop_message("no_subscriber");
            return;
        };
        if subscriber.send(message).await.is_err() {
            self.metrics.drop_message("no_subscriber");
        }
    }

    async fn serve_request(
        self: Arc<Self>,
        connection: Connection,
        remote: PeerId,
        mut send: SendStream,
        mut recv: RecvStream,
    ) {
        let limits = self.config.limits;
        let arrival = tokio::time::timeout(
            self.config.inbound_request_timeout,
            read_frame(&mut recv, &limits),
        )
        .await;
        let frame = match arrival {
            Err(_) => {
                self.metrics.frame_error("request_timeout");
                let _ = send.reset(VarInt::from_u32(RESET_REQUEST_TIMEOUT));
                return;
            }
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => {
                self.protocol_violation(&connection, remote, "empty_request");
                return;
            }
            Ok(Err(ReadFrameError::Stream(_))) => return,
            Ok(Err(ReadFrameError::Wire(error @ WireError::PayloadTooLarge { .. }))) => {
                self.metrics.frame_error("too_large");
                let _ = recv.stop(VarInt::from_u32(0));
                let reply = wire::encode_error_payload(ErrorCode::TooLarge, &error.to_string());
                self.respond(
                    &mut send,
                    remote,
                    Kind::ErrorResponse,
                    ProtocolId(0),
                    0,
                    reply,
                    &limits,
                )
                .await;
                return;
            }
            Ok(Err(ReadFrameError::Wire(error))) => {
                self.protocol_violation(&connection, remote, wire_error_label(&error));
                return;
            }
        };
        if !self.accept_frame(&connection, remote, &frame, Kind::Request) {
            return;
        }
        let protocol = frame.header.protocol;
        let handler = read(&self.handlers).get(&protocol).cloned();
        let (kind, body) = match handler {
            None => (
                Kind::ErrorResponse,
                wire::encode_error_payload(
                    ErrorCode::NoHandler,
                    &format!("no handler for protocol {}", protocol.0),
                ),
            ),
            Some(handler) => match handler(remote, frame.payload).await {
                Ok(body) if body.len() as u64 > u64::from(limits.max_payload_bytes) => (
                    Kind::ErrorResponse,
                    wire::encode_error_payload(
                        ErrorCode::TooLarge,
                        &format!("response of {} bytes exceeds the limit", body.len()),
                    ),
                ),
                Ok(body) => (Kind::Response, body),
                Err(error) => (
                    Kind::ErrorResponse,
                    wire::encode_error_payload(ErrorCode::Handler, &error.0),
                ),
            },
        };
        self.respond(
            &mut send,
            remote,
            kind,
            protocol,
            frame.header.message_id,
            body,
            &limits,
        )
        .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn respond(
        &self,
        send: &mut SendStream,
        remote: PeerId,
        kind: Kind,
        protocol: ProtocolId,
        message_id: u64,
        body: Bytes,
        limits: &Limits,
    ) {
        let header = MsgHeader {
            kind,
            flags: 0,
            protocol,
            message_id,
        };
        let body = if kind == Kind::ErrorResponse {
            // An error reason is cut to fit the limit rather than lost.
            body.slice(..body.len().min(limits.max_payload_bytes as usize))
        } else {
            body
        };
        let Ok(message) = EncodedMessage::encode(&header, body, limits) else {
            return;
        };
        let dst = Destination::new(&remote);
        if send
            .write_all_chunks(&mut message.chunks_for(&dst))
            .await
            .is_ok()
        {
            self.metrics.frames_sent.inc();
            self.metrics.bytes_sent.inc_by(message.frame_len() as u64);
        }
        let _ = send.finish();
    }

    async fn request_once(
        self: Arc<Self>,
        peer: PeerId,
        protocol: ProtocolId,
        body: Bytes,
    ) -> Result<Bytes, RequestError> {
        let (connection, dst) = self.current(peer).ok_or(RequestError::NotConnected(peer))?;
        let message_id = self.next_id();
        let header = MsgHeader {
            kind: Kind::Request,
            flags: 0,
            protocol,
            message_id,
        };
        let message = EncodedMessage::encode(&header, body, &self.config.limits)
            .map_err(|error| RequestError::TooLarge(error.to_string()))?;
        let gone = |error: &dyn std::fmt::Display| RequestError::PeerGone(error.to_string());
        let (mut send, mut recv) = connection.open_bi().await.map_err(|e| gone(&e))?;
        send.write_all_chunks(&mut message.chunks_for(&dst))
            .await
            .map_err(|e| gone(&e))?;
        let _ = send.finish();
        self.metrics.frames_sent.inc();
        self.metrics.bytes_sent.inc_by(message.frame_len() as u64);
        let frame = match read_frame(&mut recv, &self.config.limits).await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                return Err(RequestError::PeerGone(
                    "stream ended without a response".to_string(),
                ))
            }
            Err(ReadFrameError::Stream(error)) => return Err(gone(&error)),
            Err(ReadFrameError::Wire(error)) => {
                self.protocol_violation(&connection, peer, wire_error_label(&error));
                return Err(RequestError::Protocol(error.to_string()));
            }
        };
        self.metrics.observe_rtt(&peer, connection.rtt());
        self.metrics.frames_received.inc();
        self.metrics
            .bytes_received
            .inc_by((frame.payload.len() + wire::FRAME_OVERHEAD) as u64);
        if frame.dst != self.local_id {
            self.protocol_violation(&connection, peer, "wrong_destination");
            return Err(RequestError::Protocol(
                "response to another node".to_string(),
            ));
        }
        match frame.header.kind {
            Kind::Response if frame.header.message_id == message_id => Ok(frame.payload),
            Kind::ErrorResponse => match wire::decode_error_payload(&frame.payload) {
                Ok((ErrorCode::Handler, reason)) => Err(RequestError::Remote(reason)),
                Ok((ErrorCode::NoHandler, reason)) => Err(RequestError::Refused(reason)),
                Ok((ErrorCode::TooLarge, reason)) => Err(RequestError::TooLarge(reason)),
                Ok((ErrorCode::Malformed, reason)) => Err(RequestError::Protocol(reason)),
                Err(error) => {
                    self.protocol_violation(&connection, peer, wire_error_label(&error));
                    Err(RequestError::Protocol(error.to_string()))
                }
            },
            _ => {
                self.protocol_violation(&connection, peer, "unexpected_kind");
                Err(RequestError::Protocol("unexpected response".to_string()))
            }
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
