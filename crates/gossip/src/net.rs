//! Gossip artifacts over a node: publish, receive what peers spread, purge; batches go out with `send_many`.
//!
//! The protocol is the sans-IO [`crate::proto`] state machine; this module is its driver.
//! A [`GossipService`] subscribes to one protocol id on a [`Node`], feeds the state machine every
//! inbound batch, connection change and timer, and hands every outgoing batch to
//! [`Node::send_many`] with all of its recipients, so a push or an advert batch is encoded once
//! for every peer that gets it. Delivered artifacts arrive on a bounded channel; a reader that
//! falls behind slows the driver down, which stops it reading from peers (QUIC flow control then
//! slows them) instead of dropping artifacts.
//!
//! Per-class counters (`meshwire_gossip_*_total{class, direction}`) are registered in the node's
//! registry and updated after every step of the state machine.
//!
//! A [`Processor`] in the settings is the CPU the items run on: after each inbound batch the
//! driver hands it the [`Work`] the batch made (adverts, requests, artifact copies, validations)
//! and waits until it is done before the batch's replies leave and its deliveries reach the
//! application. The driver handles one batch at a time, so batches that arrive meanwhile wait
//! in the node's inbox. The lab's hosts use it to give every item a measured cost in virtual
//! time (`meshwire-lab`'s `cpu` module); without one, handling takes no time beyond its own.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::proto::{self as gossip, ArtifactId, ClassId, ClassStats, Event, GossipConfig};
use bytes::Bytes;
use meshwire_proto::wire::ProtocolId;
use meshwire_proto::PeerId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use meshwire::{protocols, Node, PeerChange, PeerEvents, SubscribeError};

/// Why a gossip call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GossipServiceError {
    /// The protocol id already has a subscriber on this node.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// The state machine refused the call.
    #[error(transparent)]
    Gossip(#[from] gossip::GossipError),
}

/// How a gossip service runs.
#[derive(Debug, Clone)]
pub struct GossipSettings {
    /// The protocol id batches travel on.
    pub protocol: ProtocolId,
    /// Classes, limits and timers of the state machine.
    pub config: GossipConfig,
    /// Delivered artifacts buffered for the application.
    pub delivered_queue: usize,
    /// The CPU inbound items are charged to; `None`: no charge.
    pub processor: Option<Arc<dyn Processor>>,
}

/// What one inbound batch made the node do, from the state machine's counters (every class).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// Adverts and lazy adverts received.
    pub adverts: u64,
    /// Requests received for artifacts held.
    pub requests: u64,
    /// Artifact copies received, pushed or pulled, duplicates included (each is hashed into
    /// its id).
    pub artifacts: u64,
    /// Their payload bytes.
    pub artifact_bytes: u64,
    /// Artifacts handed to the validator (new ones, accepted or rejected).
    pub validations: u64,
}

impl Work {
    /// The work between two snapshots of the per-class counters.
    pub fn between(
        before: &BTreeMap<ClassId, ClassStats>,
        after: &BTreeMap<ClassId, ClassStats>,
    ) -> Self {
        let mut work = Work::default();
        for (class, now) in after {
            let was = before.get(class).copied().unwrap_or_default();
            work.adverts += now.adverts_received - was.adverts_received;
            work.requests += now.requests_received - was.requests_received;
            work.artifacts += (now.pushes_received + now.pulls_received)
                - (was.pushes_received + was.pulls_received);
            work.artifact_bytes += now.payload_bytes_received - was.payload_bytes_received;
            work.validations += (now.delivered + now.rejected) - (was.delivered + was.rejected);
        }
        work
    }

    /// Whether the batch made no countable work.
    pub fn is_empty(&self) -> bool {
        *self == Work::default()
    }
}

/// The CPU a gossip service's inbound items run on. `process` resolves when `work` is done;
/// the driver waits for it before it sends the batch's replies and delivers its artifacts, so
/// work queues behind the processor.
pub trait Processor: std::fmt::Debug + Send + Sync {
    /// Runs `work`.
    fn process(&self, work: Work) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

impl GossipSettings {
    /// Settings around `config` on [`protocols::GOSSIP`].
    pub fn new(config: GossipConfig) -> Self {
        Self {
            protocol: protocols::GOSSIP,
            config,
            delivered_queue: 1024,
            processor: None,
        }
    }
}

/// An artifact a peer spread to this node, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// Its content id.
    pub id: ArtifactId,
    /// Its class.
    pub class: ClassId,
    /// Its payload.
    pub payload: Bytes,
    /// The peer it came from.
    pub from: PeerId,
}

/// The application's validator: true accepts an artifact received from a peer.
pub type GossipValidator = Box<dyn FnMut(ClassId, &Bytes) -> bool + Send>;

type Machine = gossip::Gossip<GossipValidator>;

/// Label of a per-class gossip counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// The class number.
    pub class: u8,
    /// `sent` or `received`.
    pub direction: &'static str,
}

#[derive(Debug, Default)]
struct GossipMetrics {
    adverts: Family<ClassLabel, Counter>,
    requests: Family<ClassLabel, Counter>,
    pushes: Family<ClassLabel, Counter>,
    pulls: Family<ClassLabel, Counter>,
    duplicates: Family<ClassLabel, Counter>,
    prunes: Family<ClassLabel, Counter>,
    rejected: Family<ClassLabel, Counter>,
    bytes: Family<ClassLabel, Counter>,
}

impl GossipMetrics {
    fn register(node: &Node) -> Self {
        let metrics = Self::default();
        node.metrics().register_with(|registry| {
            // meshwire_gossip_bytes_total, with its unit in OpenMetrics' `# UNIT` line.
            registry.register_with_unit(
                "gossip",
                "Gossip item bytes",
                prometheus_client::registry::Unit::Bytes,
                metrics.bytes.clone(),
            );
            let registry = registry.sub_registry_with_prefix("gossip");
            let families = [
                ("adverts", "Adverts, counted per peer", &metrics.adverts),
                ("requests", "Artifact requests", &metrics.requests),
                (
                    "pushes",
                    "Artifacts pushed whole, counted per peer",
                    &metrics.pushes,
                ),
                ("pulls", "Requested artifacts", &metrics.pulls),
                (
                    "duplicates",
                    "Adverts and artifacts already held",
                    &metrics.duplicates,
                ),
                (
                    "prunes",
                    "Prunes: answers to an eager copy of an artifact already held",
                    &metrics.prunes,
                ),
                (
                    "rejected",
                    "Artifacts the validator rejected",
                    &metrics.rejected,
                ),
            ];
            for (name, help, family) in families {
                registry.register(name, help, family.clone());
            }
        });
        metrics
    }

    /// Adds what changed between `before` and `after` to the counters.
    fn add(&self, before: &BTreeMap<ClassId, ClassStats>, after: &BTreeMap<ClassId, ClassStats>) {
        for (class, now) in after {
            let was = before.get(class).copied().unwrap_or_default();
            let counters = [
                (&self.adverts, "sent", now.adverts_sent - was.adverts_sent),
                (
                    &self.adverts,
                    "received",
                    now.adverts_received - was.adverts_received,
                ),
                (
                    &self.requests,
                    "sent",
                    now.requests_sent - was.requests_sent,
                ),
                (
                    &self.requests,
                    "received",
                    now.requests_received - was.requests_received,
                ),
                (&self.pushes, "sent", now.pushes_sent - was.pushes_sent),
                (
                    &self.pushes,
                    "received",
                    now.pushes_received - was.pushes_received,
                ),
                (&self.pulls, "sent", now.pulls_sent - was.pulls_sent),
                (
                    &self.pulls,
                    "received",
                    now.pulls_received - was.pulls_received,
                ),
                (
                    &self.duplicates,
                    "received",
                    now.duplicates - was.duplicates,
                ),
                (&self.prunes, "sent", now.prunes_sent - was.prunes_sent),
                (
                    &self.prunes,
                    "received",
                    now.prunes_received - was.prunes_received,
                ),
                (&self.rejected, "received", now.rejected - was.rejected),
                (&self.bytes, "sent", now.bytes_sent - was.bytes_sent),
                (
                    &self.bytes,
                    "received",
                    now.bytes_received - was.bytes_received,
                ),
            ];
            for (family, direction, delta) in counters {
                if delta > 0 {
                    family
                        .get_or_create(&ClassLabel {
                            class: class.0,
                            direction,
                        })
                        .inc_by(delta);
                }
            }
        }
    }
}

/// The state machine and what the driver last reported of it.
struct State {
    machine: Machine,
    reported: BTreeMap<ClassId, ClassStats>,
    metrics: GossipMetrics,
}

struct Shared {
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    node: Node,
    protocol: ProtocolId,
    task: tokio::task::AbortHandle,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A running gossip service. Clones share it; dropping the last clone stops it.
#[derive(Clone)]
pub struct GossipService {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for GossipService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipService")
            .field("protocol", &self.shared.protocol)
            .finish_non_exhaustive()
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // The state machine holds plain data; a panic elsewhere does not invalidate it.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

impl GossipService {
    /// Starts gossip on `node`: subscribes to the settings' protocol and runs the driver task.
    /// Returns the service and the stream of artifacts peers deliver. Must run inside a tokio
    /// runtime.
    pub fn spawn(
        node: &Node,
        settings: GossipSettings,
        validator: GossipValidator,
    ) -> Result<(Self, mpsc::Receiver<Delivered>), GossipServiceError> {
        let inbox = node.subscribe(settings.protocol)?;
        let mut events = node.peer_events();
        let mut machine = gossip::Gossip::new(settings.config, validator);
        machine.set_local_id(node.peer_id());
        let started = now();
        // The stream starts with every peer up now: take those at once, before any publish.
        let mut peers = BTreeSet::new();
        while let Some(change) = events.try_recv() {
            match change {
                PeerChange::Up(peer) if peers.insert(peer) => machine.handle_peer_up(peer, started),
                PeerChange::Down(peer) if peers.remove(&peer) => {
                    machine.handle_peer_down(peer, started)
                }
                _ => {}
            }
        }
        let state = Arc::new(Mutex::new(State {
            machine,
            reported: BTreeMap::new(),
            metrics: GossipMetrics::register(node),
        }));
        let wake = Arc::new(Notify::new());
        let (delivered_tx, delivered) = mpsc::channel(settings.delivered_queue.max(1));
        let driver = Driver {
            node: node.clone(),
            protocol: settings.protocol,
            state: state.clone(),
            wake: wake.clone(),
            delivered: delivered_tx,
            processor: settings.processor,
        };
        let task = tokio::spawn(driver.run(inbox, events, peers)).abort_handle();
        let shared = Arc::new(Shared {
            state,
            wake,
            node: node.clone(),
            protocol: settings.protocol,
            task,
        });
        Ok((Self { shared }, delivered))
    }

    /// Publishes `payload` in `class` to every peer; returns its content id.
    pub fn publish(
        &self,
        class: ClassId,
        payload: Bytes,
    ) -> Result<ArtifactId, GossipServiceError> {
        let id = self.step(|machine| machine.publish(class, payload, now()))?;
        Ok(id)
    }

    /// Drops `id` from this node's pool; peers that might request it from here are told.
    pub fn purge(&self, id: ArtifactId) {
        self.step(|machine| machine.purge(id, now()));
    }

    /// Whether this node holds `id`.
    pub fn has(&self, id: &ArtifactId) -> bool {
        lock(&self.shared.state).machine.has(id)
    }

    /// Per-class counters since the service started.
    pub fn stats(&self) -> BTreeMap<ClassId, ClassStats> {
        lock(&self.shared.state).machine.stats().clone()
    }

    /// Counters of the neighbours announcements sent and received since the service started.
    pub fn neighbour_stats(&self) -> crate::proto::NeighbourStats {
        lock(&self.shared.state).machine.neighbour_stats()
    }

    /// Artifacts from `peer` the validator rejected.
    pub fn rejected_from(&self, peer: &PeerId) -> u64 {
        lock(&self.shared.state).machine.rejected_from(peer)
    }

    fn step<T>(&self, call: impl FnOnce(&mut Machine) -> T) -> T {
        let (result, transmits) = {
            let mut state = lock(&self.shared.state);
            let result = call(&mut state.machine);
            (result, drain(&mut state))
        };
        let refused = send(&self.shared.node, self.shared.protocol, transmits);
        report_refused(&self.shared.state, refused);
        // The driver recomputes its timer (a flush may now be due sooner).
        self.shared.wake.notify_one();
        result
    }
}

/// Takes the state machine's outgoing batches and brings the metrics up to date.
fn drain(state: &mut State) -> Vec<gossip::Transmit> {
    let transmits = std::iter::from_fn(|| state.machine.poll_transmit()).collect();
    let stats = state.machine.stats();
    if *stats != state.reported {
        state.metrics.add(&state.reported, stats);
        state.reported = stats.clone();
    }
    transmits
}

/// Hands the batches to the node; returns the peers whose queue refused one (full, or gone).
fn send(node: &Node, protocol: ProtocolId, transmits: Vec<gossip::Transmit>) -> Vec<PeerId> {
    let mut refused = Vec::new();
    for transmit in transmits {
        // A refused peer is counted by the node as `send_refused`; the state machine sends it
        // the next repair (ihaves of recent `All` artifacts), and a peer that reconnects
        // catches up through fresh adverts.
        match node.send_many(&transmit.peers, protocol, transmit.batch) {
            Ok(report) => refused.extend(report.failed.into_iter().map(|(peer, _)| peer)),
            Err(error) => tracing::debug!(%error, "gossip batch not sent"),
        }
    }
    refused
}

/// Tells the state machine which peers a batch did not reach.
fn report_refused(state: &Mutex<State>, refused: Vec<PeerId>) {
    if refused.is_empty() {
        return;
    }
    let mut state = lock(state);
    let now = now();
    for peer in refused {
        state.machine.handle_send_refused(peer, now);
    }
}

struct Driver {
    node: Node,
    protocol: ProtocolId,
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    delivered: mpsc::Sender<Delivered>,
    processor: Option<Arc<dyn Processor>>,
}

impl Driver {
    async fn run(
        self,
        mut inbox: meshwire::Inbox,
        mut events: PeerEvents,
        mut peers: BTreeSet<PeerId>,
    ) {
        loop {
            let deadline = lock(&self.state)
                .machine
                .poll_timeout()
                .map(Instant::from_std);
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = inbox.recv() => {
                    let Some(message) = message else { return };
                    let from = message.from;
                    let payload = message.payload;
                    let mut malformed = None;
                    self.step(|machine, now| {
                        malformed = machine.handle_batch(from, &payload, now).err();
                    }).await;
                    if let Some(error) = malformed {
                        // What a peer sends must decode: a malformed batch ends its connection.
                        tracing::debug!(peer = %from.short(), %error, "malformed gossip batch; closing the connection");
                        self.node.close_for_violation(from, "malformed_gossip");
                    }
                }
                change = events.recv() => match change {
                    Some(PeerChange::Up(peer)) => {
                        if peers.insert(peer) {
                            self.step(|machine, now| machine.handle_peer_up(peer, now)).await;
                        }
                    }
                    Some(PeerChange::Down(peer)) => {
                        if peers.remove(&peer) {
                            self.step(|machine, now| machine.handle_peer_down(peer, now)).await;
                        }
                    }
                    None => return,
                },
                _ = sleep => {
                    self.step(|machine, now| machine.handle_timeout(now)).await;
                }
                _ = self.wake.notified() => {}
            }
        }
    }

    /// Runs one input through the state machine, waits for the processor to do the work it
    /// made, sends its batches and hands its deliveries to the application (waiting while the
    /// application's queue is full).
    async fn step(&self, input: impl FnOnce(&mut Machine, std::time::Instant)) {
        let (transmits, events, work) = {
            let mut state = lock(&self.state);
            // The counters are copied only when something charges for the work.
            let before = self
                .processor
                .is_some()
                .then(|| state.machine.stats().clone());
            input(&mut state.machine, now());
            let events: Vec<Event> = std::iter::from_fn(|| state.machine.poll_event()).collect();
            let work = before.map(|before| Work::between(&before, state.machine.stats()));
            (drain(&mut state), events, work)
        };
        if let (Some(processor), Some(work)) = (&self.processor, work) {
            if !work.is_empty() {
                processor.process(work).await;
            }
        }
        let refused = send(&self.node, self.protocol, transmits);
        report_refused(&self.state, refused);
        for event in events {
            match event {
                Event::Delivered {
                    id,
                    class,
                    payload,
                    from,
                } => {
                    let delivered = Delivered {
                        id,
                        class,
                        payload,
                        from,
                    };
                    // No reader: the application dropped the stream and wants no deliveries.
                    let _ = self.delivered.send(delivered).await;
                }
                Event::Rejected { id, from, .. } => {
                    tracing::debug!(peer = %from.short(), id = %id.short(), "artifact rejected");
                }
            }
        }
    }
}
