//! A reliable, ordered byte session between two nodes over several paths, direct or through relay
//! peers, carried in QUIC datagrams and driven by [`crate::proto::Endpoint`].
//!
//! A [`SessionHost`] owns a node's session datagrams. It routes each one by its
//! [`RouteHeader`] to a local [`Session`], or — for a path this node agreed to relay — forwards it
//! to the other end. A [`Session`] is `AsyncRead + AsyncWrite`; its paths are added and removed
//! while it runs ([`Session::add_direct_path`], [`Session::add_relay_path`],
//! [`Session::remove_path`], which sends the other end a close on the path). The end that
//! accepts a session learns its paths from the datagrams that arrive (never from a close) and
//! answers on the path each came from; a close from the other end makes it forget the path
//! ([`SessionStats::paths_closed_by_peer`]).
//!
//! The session's own windows govern what is in flight: every datagram the session hands to quinn
//! is either queued or refused ([`meshwire::DatagramError::BufferFull`]), and a refused one is handed
//! back to the session as a send error (meshwire's policy resends it, preferably on another path).
//! The session claims its windows on its connections ([`SessionSettings::claim_window`], on by
//! default; see the crate's `# Design`), which lifts quinn's congestion window to the session's,
//! once an RTT is measured, within a cap, and until the connection's controller sees congestion.
//!
//! Relays: a node forwards only (session, path) pairs it agreed to in a [`RelayRequest`], only
//! between the two ends named there, only to a peer it is already connected to, one datagram out
//! of the same length per datagram in (no amplification), within a per-path token bucket, for at
//! most [`RelayLimits::max_paths`] paths at once; an agreement idle for [`RelayLimits::idle`] is
//! forgotten. The sans-IO [`RelayTable`] makes those decisions; this driver reads the clock once
//! per event and moves the bytes. Everything refused is counted in [`HostStats`].

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

mod backlog;
mod driver;

pub use crate::proto::relay::RelayLimits;
use crate::proto::relay::{RelayError, RelayTable};
use crate::proto::route::{
    RelayOp, RelayReply, RelayRequest, Route, RouteError, RouteHeader, RELAYED_HEADER_LEN,
};
use crate::proto::{Endpoint, PathId, Policy, SessionConfig, SessionError};
use bytes::Bytes;
use meshwire_proto::PeerId;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use meshwire::congestion::DatagramAllowance;
use meshwire::InboundDatagram;
use meshwire::{protocols, HandlerError, Node, RequestError, SubscribeError};

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionHostError {
    /// A datagram's route header is malformed.
    #[error("malformed route header: {0}")]
    Route(#[from] RouteError),
    /// A session rejected the packet behind the header.
    #[error("session rejected the packet: {0}")]
    Session(#[from] SessionError),
    /// A relay datagram for a path this node does not relay, or from a peer not in the agreement.
    #[error("relay datagram from {from} refused: {cause}")]
    NotRelayed {
        /// Sender.
        from: PeerId,
        /// Why.
        #[source]
        cause: RelayError,
    },
    /// A datagram for a session this node does not know and does not accept.
    #[error("unknown session {0:#x}")]
    UnknownSession(u64),
    /// The relay refused to relay the path.
    #[error("relay refused: {0:?}")]
    RelayRefused(RelayReply),
    /// The relay request failed.
    #[error("relay request failed: {0}")]
    Request(#[from] RequestError),
    /// The path id is already in use.
    #[error("path {0:?} already exists")]
    PathExists(PathId),
    /// The host has as many sessions as it allows.
    #[error("too many sessions")]
    TooManySessions,
    /// The node's datagrams or the relay protocol already have another subscriber.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
}

/// Settings of a node's sessions.
#[derive(Debug, Clone, Copy)]
pub struct SessionSettings {
    /// The sans-IO session's settings; meshwire's window policy by default.
    pub session: SessionConfig,
    /// Sessions open at once (opened and accepted).
    pub max_sessions: usize,
    /// Datagrams queued for one session before arrivals are dropped (and counted).
    pub session_queue: usize,
    /// Datagrams queued for the host's router.
    pub inbound_queue: usize,
    /// Accepted sessions waiting for [`SessionHost::incoming`].
    pub accept_queue: usize,
    /// What this node relays for others.
    pub relay: RelayLimits,
    /// How long a dropped session keeps delivering what was written before it gives up.
    pub linger: Duration,
    /// Whether each path claims the session's window on its connection while the session has
    /// data to send and for a second after its last datagram either way
    /// ([`meshwire::Node::datagram_allowance`]), so that under meshwire's
    /// controller the connection's congestion window, once an RTT is measured and within the
    /// configured bandwidth over the path's minimum RTT, does not hold back what the session's
    /// window lets out: the session's window policy then governs its datagrams. The claim
    /// raises the window of the whole connection, so other traffic to that peer shares it
    /// meanwhile. meshwire's controller stops honouring claims at the connection's first
    /// congestion verdict made once it knows the path's loss floor, since the session's policy
    /// does not back off on loss; see the crate's `# Design`. On by default; off, quinn's
    /// window (slow start, CUBIC) sits under the session's.
    pub claim_window: bool,
}

impl Default for SessionSettings {
    fn default() -> Self {
        let mut session = SessionConfig::new(Policy::Meshwire);
        // Route header (≤ 45 B) + data header (18 B) + 1024 B fit the lab's 1200-byte QUIC MTU.
        session.mtu_bytes = 1024;
        Self {
            session,
            max_sessions: 256,
            session_queue: 4096,
            inbound_queue: 8192,
            accept_queue: 16,
            relay: RelayLimits::default(),
            linger: Duration::from_secs(10),
            claim_window: true,
        }
    }
}

/// Counters of a host: what it routed, relayed and refused.
#[derive(Debug, Default)]
pub struct HostStats {
    /// Datagrams with a malformed route header (each closes its sender's connection).
    pub malformed: AtomicU64,
    /// Datagrams for sessions this node neither has nor accepts.
    pub unknown_session: AtomicU64,
    /// Datagrams dropped because a session's queue was full.
    pub session_queue_full: AtomicU64,
    /// Datagrams forwarded as a relay.
    pub relayed_datagrams: AtomicU64,
    /// Bytes forwarded as a relay (equal to the bytes received for forwarding).
    pub relayed_bytes: AtomicU64,
    /// Relay datagrams refused: no agreement, or a sender outside it.
    pub relay_refused: AtomicU64,
    /// Relay requests refused: the relay was full (in total or for the asking peer), the other
    /// end unreachable, or the path relayed between other ends.
    pub relay_requests_refused: AtomicU64,
    /// Relay requests that do not decode (answered with an error, then the connection closes).
    pub relay_requests_malformed: AtomicU64,
    /// Relay datagrams dropped by the per-path token bucket.
    pub relay_rate_limited: AtomicU64,
    /// Relay datagrams the onward connection did not take.
    pub relay_send_failed: AtomicU64,
}

/// A snapshot of one session's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Datagrams handed to quinn.
    pub datagrams_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Received packets the session rejected (malformed or out of bounds).
    pub rejected: u64,
    /// Datagrams quinn refused because its datagram buffer was full.
    pub send_buffer_full: u64,
    /// Datagrams that could not be sent for another reason (no connection, no relay).
    pub send_failed: u64,
    /// Datagrams that arrived on a path this end removed.
    pub unknown_path: u64,
    /// Paths the other end closed (a valid close; refused ones count in `rejected`).
    pub paths_closed_by_peer: u64,
}

/// How a path reaches the other end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A direct connection.
    Direct,
    /// Through this relay peer.
    Relay(PeerId),
}

struct Arrival {
    path: PathId,
    via: Via,
    packet: Bytes,
}

struct HostInner {
    node: Node,
    settings: SessionSettings,
    sessions: Mutex<HashMap<(PeerId, u64), mpsc::Sender<Arrival>>>,
    relays: Mutex<RelayTable>,
    accept_tx: Mutex<Option<mpsc::Sender<Session>>>,
    rng: Mutex<SmallRng>,
    stats: HostStats,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A node's sessions and relays. Subscribes to the node's session datagrams.
#[derive(Clone)]
pub struct SessionHost {
    inner: Arc<HostInner>,
}

impl std::fmt::Debug for SessionHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHost")
            .field("node", &self.inner.node.peer_id())
            .finish()
    }
}

impl SessionHost {
    /// Starts routing `node`'s datagrams and answering relay requests. Must run inside a tokio
    /// runtime. Refused if the node's datagrams or the relay protocol have another subscriber.
    pub fn new(node: &Node, settings: SessionSettings) -> Result<Self, SessionHostError> {
        let datagrams =
            node.subscribe_datagrams(protocols::SESSION_DATAGRAM, settings.inbound_queue)?;
        let rng = match node.config().rng_seed {
            Some(seed) => SmallRng::seed_from_u64(seed ^ 0x5e55_1011),
            None => SmallRng::from_os_rng(),
        };
        let inner = Arc::new(HostInner {
            node: node.clone(),
            settings,
            sessions: Mutex::default(),
            relays: Mutex::new(RelayTable::new(settings.relay)),
            accept_tx: Mutex::default(),
            rng: Mutex::new(rng),
            stats: HostStats::default(),
        });
        let weak = Arc::downgrade(&inner);
        node.handle(protocols::SESSION_RELAY, move |from, body| {
            let host = weak.upgrade();
            async move {
                let host = host.ok_or(HandlerError::Stopped)?;
                let request = RelayRequest::decode(&body).map_err(|error| {
                    host.stats
                        .relay_requests_malformed
                        .fetch_add(1, Ordering::Relaxed);
                    HandlerError::refused(error.breaks_protocol(), error)
                })?;
                Ok(host.relay_request(from, &request).encode())
            }
        })?;
        tokio::spawn(route_loop(Arc::downgrade(&inner), datagrams));
        Ok(Self { inner })
    }

    /// The counters.
    pub fn stats(&self) -> &HostStats {
        &self.inner.stats
    }

    /// Relay agreements in force.
    pub fn relayed_paths(&self) -> usize {
        lock(&self.inner.relays).len()
    }

    /// Opens a session to `peer` with no paths yet; add them with the `add_*_path` methods.
    pub fn open(&self, peer: PeerId) -> Result<Session, SessionHostError> {
        let id = lock(&self.inner.rng).random::<u64>();
        self.inner.start_session(peer, id, false)
    }

    /// Starts accepting sessions other nodes open to this one and returns the queue they arrive
    /// on (replacing an earlier queue). Until then, datagrams of unknown sessions are refused.
    pub fn incoming(&self) -> mpsc::Receiver<Session> {
        let (tx, rx) = mpsc::channel(self.inner.settings.accept_queue.max(1));
        *lock(&self.inner.accept_tx) = Some(tx);
        rx
    }

    /// Routes one datagram from `from` as if it had arrived on the node; returns why it was
    /// refused (the refusal is also counted in [`HostStats`]).
    pub fn handle_datagram(&self, from: PeerId, payload: Bytes) -> Result<(), SessionHostError> {
        self.inner.route(from, payload, Instant::now())
    }
}

async fn route_loop(host: Weak<HostInner>, mut datagrams: mpsc::Receiver<InboundDatagram>) {
    while let Some(datagram) = datagrams.recv().await {
        let Some(host) = host.upgrade() else {
            return;
        };
        if let Err(error) = host.route(datagram.from, datagram.payload, Instant::now()) {
            tracing::debug!(from = %datagram.from.short(), %error, "session datagram refused");
        }
    }
}

impl HostInner {
    fn route(
        self: &Arc<Self>,
        from: PeerId,
        payload: Bytes,
        now: Instant,
    ) -> Result<(), SessionHostError> {
        let (header, packet) = RouteHeader::decode(payload.clone()).inspect_err(|error| {
            // QUIC authenticates every datagram: a route header that does not decode was sent
            // so by the peer (an unknown kind may be a newer version's: dropped, counted).
            self.stats.malformed.fetch_add(1, Ordering::Relaxed);
            if error.breaks_protocol() {
                self.node.close_for_violation(from, "malformed_route");
            }
        })?;
        let (peer, via) = match header.route {
            Route::Direct => (from, Via::Direct),
            Route::FromRelay { source } => (source, Via::Relay(from)),
            Route::ToRelay { destination } => {
                return self.forward(from, destination, header, packet, now)
            }
        };
        let arrival = Arrival {
            path: PathId(header.path),
            via,
            packet,
        };
        let key = (peer, header.session);
        let existing = lock(&self.sessions).get(&key).cloned();
        let tx = match existing {
            Some(tx) => tx,
            None => self.accept_new(peer, header.session)?,
        };
        if tx.try_send(arrival).is_err() {
            self.stats
                .session_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn accept_new(
        self: &Arc<Self>,
        peer: PeerId,
        id: u64,
    ) -> Result<mpsc::Sender<Arrival>, SessionHostError> {
        let unknown = || {
            self.stats.unknown_session.fetch_add(1, Ordering::Relaxed);
            SessionHostError::UnknownSession(id)
        };
        let accept_tx = lock(&self.accept_tx).clone().ok_or_else(unknown)?;
        let permit = accept_tx.try_reserve().map_err(|_| unknown())?;
        let session = self.start_session(peer, id, true).map_err(|_| unknown())?;
        let tx = session.arrivals.clone();
        permit.send(session);
        Ok(tx)
    }

    fn start_session(
        self: &Arc<Self>,
        peer: PeerId,
        id: u64,
        learns_paths: bool,
    ) -> Result<Session, SessionHostError> {
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, tx| !tx.is_closed());
        if sessions.len() >= self.settings.max_sessions {
            return Err(SessionHostError::TooManySessions);
        }
        let (tx, rx) = mpsc::channel(self.settings.session_queue.max(1));
        sessions.insert((peer, id), tx.clone());
        drop(sessions);
        let shared = Arc::new(Mutex::new(Shared {
            endpoint: Endpoint::new(self.settings.session),
            paths: BTreeMap::new(),
            learns_paths,
            read_waker: None,
            write_wakers: Vec::new(),
            stats: SessionStats::default(),
            finished: false,
            dropped: false,
            claims: HashMap::new(),
            last_activity: None,
        }));
        let wake = Arc::new(Notify::new());
        tokio::spawn(driver::drive(
            self.clone(),
            peer,
            id,
            shared.clone(),
            wake.clone(),
            rx,
        ));
        Ok(Session {
            host: self.clone(),
            peer,
            id,
            shared,
            wake,
            arrivals: tx,
        })
    }

    fn relay_request(&self, from: PeerId, request: &RelayRequest) -> RelayReply {
        let now = Instant::now().into_std();
        let peer_connected = request.op == RelayOp::Open
            && from != request.peer
            && self.node.connected_peers().contains(&request.peer);
        let reply = lock(&self.relays).handle_request(from, request, peer_connected, now);
        if reply != RelayReply::Accepted {
            self.stats
                .relay_requests_refused
                .fetch_add(1, Ordering::Relaxed);
        }
        reply
    }

    fn forward(
        &self,
        from: PeerId,
        destination: PeerId,
        header: RouteHeader,
        packet: Bytes,
        now: Instant,
    ) -> Result<(), SessionHostError> {
        let len = RELAYED_HEADER_LEN + packet.len();
        let admitted = lock(&self.relays).admit(
            header.session,
            header.path,
            from,
            destination,
            len,
            now.into_std(),
        );
        match admitted {
            Ok(()) => {}
            Err(RelayError::RateLimited { .. }) => {
                self.stats
                    .relay_rate_limited
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(cause) => {
                self.stats.relay_refused.fetch_add(1, Ordering::Relaxed);
                return Err(SessionHostError::NotRelayed { from, cause });
            }
        }
        let onward = RouteHeader {
            route: Route::FromRelay { source: from },
            ..header
        };
        match self.node.send_datagram(
            destination,
            protocols::SESSION_DATAGRAM,
            onward.encode_with(&packet),
        ) {
            Ok(()) => {
                self.stats.relayed_datagrams.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .relayed_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.relay_send_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

struct Shared {
    endpoint: Endpoint,
    paths: BTreeMap<PathId, Via>,
    learns_paths: bool,
    read_waker: Option<Waker>,
    write_wakers: Vec<Waker>,
    stats: SessionStats,
    finished: bool,
    dropped: bool,
    /// Each path's claim on its connection's congestion window: the session's own window on
    /// the path (see the module's `# Design`).
    claims: HashMap<PathId, DatagramAllowance>,
    /// When the session last sent or received a datagram.
    last_activity: Option<std::time::Instant>,
}

impl Shared {
    fn wake_all(&mut self) {
        if let Some(waker) = self.read_waker.take() {
            waker.wake();
        }
        for waker in self.write_wakers.drain(..) {
            waker.wake();
        }
    }
}

/// A reliable, ordered byte stream to one peer over any number of paths.
pub struct Session {
    host: Arc<HostInner>,
    peer: PeerId,
    id: u64,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
    arrivals: mpsc::Sender<Arrival>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("peer", &self.peer)
            .field("id", &format_args!("{:#x}", self.id))
            .finish()
    }
}

impl Session {
    /// The other end.
    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// The session id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Counters.
    pub fn stats(&self) -> SessionStats {
        lock(&self.shared).stats
    }

    /// The sending side's counters: data packets sent, retransmissions, losses, copies.
    pub fn sender_stats(&self) -> crate::proto::SenderStats {
        lock(&self.shared).endpoint.sender.stats()
    }

    /// The receiving side's window now, in bytes, and how many times it doubled (it grows
    /// while the other end says the window stops it and this end's reader keeps up; see the
    /// crate's `# Design`).
    pub fn receive_window(&self) -> (usize, u64) {
        let shared = lock(&self.shared);
        let receiver = &shared.endpoint.receiver;
        let segments = usize::try_from(receiver.window_segments()).unwrap_or(usize::MAX);
        (
            segments.saturating_mul(self.host.settings.session.mtu_bytes),
            receiver.window_growths(),
        )
    }

    /// The paths and how each travels.
    pub fn paths(&self) -> Vec<(PathId, Via)> {
        lock(&self.shared)
            .paths
            .iter()
            .map(|(&id, &via)| (id, via))
            .collect()
    }

    /// What the sans-IO sender knows about each path (window, RTT, rate, state).
    pub fn path_stats(&self) -> Vec<(PathId, crate::proto::PathStats)> {
        lock(&self.shared).endpoint.sender.paths().collect()
    }

    fn insert_path(&self, path: PathId, via: Via) -> Result<(), SessionHostError> {
        let mut shared = lock(&self.shared);
        if shared.paths.contains_key(&path) {
            return Err(SessionHostError::PathExists(path));
        }
        shared.paths.insert(path, via);
        shared.endpoint.add_path(path);
        drop(shared);
        self.wake.notify_one();
        Ok(())
    }

    /// Adds a path over the node's direct connection to the peer (which must be connected).
    pub fn add_direct_path(&self, path: PathId) -> Result<(), SessionHostError> {
        self.insert_path(path, Via::Direct)
    }

    /// Asks `relay` (a connected peer, itself connected to the other end) to relay a new path,
    /// then adds it.
    pub async fn add_relay_path(
        &self,
        path: PathId,
        relay: PeerId,
    ) -> Result<(), SessionHostError> {
        if lock(&self.shared).paths.contains_key(&path) {
            return Err(SessionHostError::PathExists(path));
        }
        self.relay_op(RelayOp::Open, path, relay).await?;
        self.insert_path(path, Via::Relay(relay))
    }

    async fn relay_op(
        &self,
        op: RelayOp,
        path: PathId,
        relay: PeerId,
    ) -> Result<(), SessionHostError> {
        let request = RelayRequest {
            op,
            session: self.id,
            path: path.0,
            peer: self.peer,
        };
        let reply = self
            .host
            .node
            .request(
                relay,
                protocols::SESSION_RELAY,
                request.encode(),
                Duration::from_secs(5),
            )
            .await?;
        match RelayReply::decode(&reply)? {
            RelayReply::Accepted => Ok(()),
            refused => Err(SessionHostError::RelayRefused(refused)),
        }
    }

    /// Removes a path: what it carried goes again on the others, the other end is told to stop
    /// sending and probing on it (a close on the path itself), and a relay is told to stop (one
    /// round trip to it later, so the close passes first).
    pub async fn remove_path(&self, path: PathId) -> Result<(), SessionHostError> {
        let via = {
            let mut shared = lock(&self.shared);
            let close = shared.endpoint.close_path(path);
            let via = shared.paths.remove(&path);
            if let (Some(close), Some(via)) = (close, via) {
                driver::send_close(
                    &self.host.node,
                    self.peer,
                    self.id,
                    &mut shared,
                    &close,
                    via,
                );
            }
            via
        };
        self.wake.notify_one();
        if let Some(Via::Relay(relay)) = via {
            // The relay takes datagrams and requests on separate queues, so a close sent just
            // before the request can still be forwarded after the agreement is gone (and the
            // other end then probes the path until its RTO). A round trip to the relay first
            // lets the close through.
            if let Some(rtt) = self.host.node.rtt_to(relay) {
                tokio::time::sleep(rtt).await;
            }
            self.relay_op(RelayOp::Close, path, relay).await?;
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        lock(&self.shared).dropped = true;
        self.wake.notify_one();
    }
}

impl Session {
    fn read_into(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut shared = lock(&self.shared);
        let read = shared.endpoint.receiver.read(buf.initialize_unfilled());
        if read > 0 {
            buf.advance(read);
            drop(shared);
            // Reading may owe the peer a window update.
            self.wake.notify_one();
            return Poll::Ready(Ok(()));
        }
        if shared.endpoint.receiver.is_finished() || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        shared.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn write_from(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut shared = lock(&self.shared);
        let written = shared.endpoint.sender.write(buf);
        if written == 0 && !buf.is_empty() {
            shared.write_wakers.push(cx.waker().clone());
            return Poll::Pending;
        }
        drop(shared);
        self.wake.notify_one();
        Poll::Ready(Ok(written))
    }

    fn finish(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut shared = lock(&self.shared);
        if !shared.finished {
            // The end of the stream is news for the driver once; later polls only wait.
            shared.finished = true;
            shared.endpoint.sender.finish();
            self.wake.notify_one();
        }
        if shared.endpoint.sender.is_idle() {
            return Poll::Ready(Ok(()));
        }
        shared.write_wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

/// Implements the tokio io traits for `Session` and `&Session` (so paths can be changed while a
/// write is in progress). `poll_flush` is immediate: written bytes are the session's to deliver.
/// `poll_shutdown` ends the stream and is ready once the peer acknowledged every byte and the end.
macro_rules! session_io {
    ($($target:ty),*) => {$(
        impl AsyncRead for $target {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.read_into(cx, buf)
            }
        }

        impl AsyncWrite for $target {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.write_from(cx, buf)
            }

            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.finish(cx)
            }
        }
    )*};
}

session_io!(Session, &Session);
