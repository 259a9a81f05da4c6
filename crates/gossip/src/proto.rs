//! The gossip state machine: pools, adverts, pulls, pushes and purges, fed events and `now`.

pub mod codec;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

pub use codec::{decode_batch, encode_batch, BatchLimits, CodecError, Item};
use meshwire_proto::PeerId;

/// An artifact's content id: SHA-256 of its class byte followed by its payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactId(pub [u8; 32]);

impl ArtifactId {
    /// The id of `payload` in `class`.
    pub fn of(class: ClassId, payload: &[u8]) -> Self {
        Self(meshwire_proto::hash::sha256(&[&[class.0], payload]))
    }

    /// The first eight bytes in hex, for logs.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for ArtifactId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArtifactId({})", self.short())
    }
}

/// An artifact class, chosen by the application (ingress, block, share, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u8);

/// Who disseminates an artifact of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {
    /// Every node that receives and validates it re-disseminates it to all its peers.
    All,
    /// Only the node that published it; receivers keep it to themselves.
    Origin,
}

/// How a class of artifacts travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPolicy {
    /// Who re-disseminates.
    pub relay: Relay,
    /// Artifacts of at most this many bytes are pushed whole instead of advertised (0: never).
    pub push_whole_max_bytes: u32,
    /// Push whole whatever the size, and flush at once instead of at the next flush tick.
    pub latency_sensitive: bool,
    /// How long an artifact stays in the pool.
    pub expiry: Duration,
}

impl ClassPolicy {
    /// Advertise-only policy with the given relay and expiry.
    pub fn advertise(relay: Relay, expiry: Duration) -> Self {
        Self {
            relay,
            push_whole_max_bytes: 0,
            latency_sensitive: false,
            expiry,
        }
    }

    fn pushes(&self, size: usize) -> bool {
        self.latency_sensitive || size <= self.push_whole_max_bytes as usize
    }
}

/// Limits and timers of a gossip instance.
#[derive(Debug, Clone, PartialEq)]
pub struct GossipConfig {
    /// The classes this node speaks; items of other classes are ignored and counted.
    pub classes: BTreeMap<ClassId, ClassPolicy>,
    /// Largest artifact payload published, advertised or accepted.
    pub max_artifact_bytes: u32,
    /// Most artifacts in the pool.
    pub max_pool_artifacts: usize,
    /// Most payload bytes in the pool.
    pub max_pool_bytes: u64,
    /// Advert slots per peer: pending artifacts it advertised plus responses queued for it.
    pub max_pending_per_peer: usize,
    /// Advertised bytes per peer that may be pending at once.
    pub max_pending_bytes_per_peer: u64,
    /// Advertisers remembered per pending artifact (fallbacks after a timeout).
    pub max_advertisers: usize,
    /// How long to wait for a requested artifact before asking the next advertiser.
    pub request_timeout: Duration,
    /// Queued items wait at most this long before a batch goes out.
    pub flush_interval: Duration,
    /// Most items per batch, on both sides.
    pub max_batch_items: usize,
    /// Most ids remembered after they left the pool.
    pub max_tombstones: usize,
}

impl Default for GossipConfig {
    fn default() -> Self {
        Self {
            classes: BTreeMap::new(),
            max_artifact_bytes: 4 * 1024 * 1024,
            max_pool_artifacts: 65_536,
            max_pool_bytes: 256 * 1024 * 1024,
            max_pending_per_peer: 4096,
            max_pending_bytes_per_peer: 64 * 1024 * 1024,
            max_advertisers: 4,
            request_timeout: Duration::from_secs(1),
            flush_interval: Duration::from_millis(20),
            max_batch_items: 4096,
            max_tombstones: 65_536,
        }
    }
}

impl GossipConfig {
    /// The decoder limits these settings imply.
    pub fn batch_limits(&self) -> BatchLimits {
        BatchLimits {
            max_items: self.max_batch_items,
            max_artifact_bytes: self.max_artifact_bytes,
        }
    }

    /// Upper bound of [`Gossip::memory_bytes`] with `peers` peers.
    pub fn memory_bound_bytes(&self, peers: usize) -> u64 {
        let per_peer = self.max_pending_per_peer as u64 * (PENDING_ENTRY_BYTES + REQUEST_BYTES);
        self.max_pool_bytes
            + self.max_pool_artifacts as u64 * HELD_ENTRY_BYTES
            + self.max_tombstones as u64 * TOMBSTONE_BYTES
            + peers as u64 * (per_peer + PEER_BYTES)
    }
}

// Accounted sizes of the state's entries (map slot, deadline entry, advertiser list).
const HELD_ENTRY_BYTES: u64 = 160;
const PENDING_ENTRY_BYTES: u64 = 224;
const REQUEST_BYTES: u64 = 40;
const TOMBSTONE_BYTES: u64 = 96;
const PEER_BYTES: u64 = 160;

/// A local call the state machine refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GossipError {
    /// The class is not configured.
    #[error("unknown artifact class {0:?}")]
    UnknownClass(ClassId),
    /// The artifact exceeds `max_artifact_bytes`.
    #[error("artifact of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The pool is at its artifact or byte limit.
    #[error("the artifact pool is full")]
    PoolFull,
    /// A peer's batch could not be decoded (the whole batch was dropped).
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Decides whether an artifact received from a peer is valid.
pub trait Validator {
    /// True to accept `payload` of `class`.
    fn validate(&mut self, class: ClassId, payload: &Bytes) -> bool;
}

impl<F: FnMut(ClassId, &Bytes) -> bool> Validator for F {
    fn validate(&mut self, class: ClassId, payload: &Bytes) -> bool {
        self(class, payload)
    }
}

/// One batch for one or more peers: send `batch` to each of `peers` (encoded once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The recipients.
    pub peers: Vec<PeerId>,
    /// The encoded batch.
    pub batch: Bytes,
}

/// What the application hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new valid artifact arrived from a peer.
    Delivered {
        /// Its id.
        id: ArtifactId,
        /// Its class.
        class: ClassId,
        /// Its payload.
        payload: Bytes,
        /// The peer it came from.
        from: PeerId,
    },
    /// The validator rejected an artifact from `from`.
    Rejected {
        /// Its id.
        id: ArtifactId,
        /// Its class.
        class: ClassId,
        /// The peer that sent it.
        from: PeerId,
    },
}

/// Counters of one class. "Sent" counts each recipient: an advert to 55 peers is 55 adverts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Adverts sent.
    pub adverts_sent: u64,
    /// Adverts received.
    pub adverts_received: u64,
    /// Adverts (and requests) refused because the peer's budget was spent.
    pub adverts_refused: u64,
    /// Requests sent.
    pub requests_sent: u64,
    /// Requests received.
    pub requests_received: u64,
    /// Artifacts pushed whole (unrequested), sent.
    pub pushes_sent: u64,
    /// Artifacts pushed whole, received.
    pub pushes_received: u64,
    /// Requested artifacts sent.
    pub pulls_sent: u64,
    /// Requested artifacts received.
    pub pulls_received: u64,
    /// Adverts and artifacts received for ids already held or tombstoned.
    pub duplicates: u64,
    /// Artifacts the validator rejected.
    pub rejected: u64,
    /// Artifacts dropped because the pool was full.
    pub pool_full: u64,
    /// Item bytes sent (batch headers excluded).
    pub bytes_sent: u64,
    /// Item bytes received (batch headers excluded).
    pub bytes_received: u64,
}

struct Held {
    class: ClassId,
    payload: Bytes,
    expires_at: Instant,
    /// We advertised it, so peers may request it from us (and a purge must tell them).
    advertised: bool,
    /// This node published it.
    local: bool,
}

struct Pending {
    class: ClassId,
    /// Each advertiser with the size it announced (and charged to its budget).
    advertisers: Vec<(PeerId, u32)>,
    /// The advertiser asked, and when we give up on it.
    requested: Option<(PeerId, Instant)>,
}

#[derive(Default)]
struct PeerState {
    /// Pending (artifact, this advertiser) pairs plus queued responses.
    slots: usize,
    /// Advertised bytes of its pending pairs.
    bytes: u64,
    /// Requests and responses waiting for the next flush.
    queued: Vec<Item>,
    /// Artifacts from this peer the validator rejected.
    rejected: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Expiry,
    Request,
}

/// The gossip state machine of one node.
pub struct Gossip<V> {
    config: GossipConfig,
    validator: V,
    peers: BTreeMap<PeerId, PeerState>,
    pool: HashMap<ArtifactId, Held>,
    pool_bytes: u64,
    pending: HashMap<ArtifactId, Pending>,
    timers: BTreeSet<(Instant, Timer, ArtifactId)>,
    tombstones: HashMap<ArtifactId, Instant>,
    tombstone_order: VecDeque<ArtifactId>,
    /// Items for every peer, waiting for the next flush.
    broadcast: Vec<Item>,
    next_flush: Option<Instant>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: BTreeMap<ClassId, ClassStats>,
    unknown_class: u64,
}

impl<V> std::fmt::Debug for Gossip<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gossip")
            .field("peers", &self.peers.len())
            .field("pool", &self.pool.len())
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl<V: Validator> Gossip<V> {
    /// A gossip instance with no peers.
    pub fn new(config: GossipConfig, validator: V) -> Self {
        Self {
            config,
            validator,
            peers: BTreeMap::new(),
            pool: HashMap::new(),
            pool_bytes: 0,
            pending: HashMap::new(),
            timers: BTreeSet::new(),
            tombstones: HashMap::new(),
            tombstone_order: VecDeque::new(),
            broadcast: Vec::new(),
            next_flush: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: BTreeMap::new(),
            unknown_class: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &GossipConfig {
        &self.config
    }

    /// Publishes a local artifact: stores it and disseminates it to every peer.
    pub fn publish(
        &mut self,
        class: ClassId,
        payload: Bytes,
        now: Instant,
    ) -> Result<ArtifactId, GossipError> {
        let policy = *self
            .config
            .classes
            .get(&class)
            .ok_or(GossipError::UnknownClass(class))?;
        if payload.len() > self.config.max_artifact_bytes as usize {
            return Err(GossipError::TooLarge {
                len: payload.len(),
                max: self.config.max_artifact_bytes,
            });
        }
        let id = ArtifactId::of(class, &payload);
        if self.pool.contains_key(&id) {
            return Ok(id);
        }
        if !self.pool_has_room(payload.len()) {
            return Err(GossipError::PoolFull);
        }
        self.tombstones.remove(&id);
        self.drop_pending(&id);
        self.store(id, class, payload.clone(), policy, now);
        if let Some(held) = self.pool.get_mut(&id) {
            held.local = true;
        }
        self.disseminate(id, class, payload, policy, now);
        Ok(id)
    }

    /// Drops `id` from the pool and remembers it as gone. If this node advertised it, peers are
    /// told (with a purge) not to request it any more.
    pub fn purge(&mut self, id: ArtifactId, now: Instant) {
        self.drop_pending(&id);
        if let Some(held) = self.remove_held(&id, now) {
            if held.advertised && !self.peers.is_empty() {
                self.broadcast.push(Item::Purge(id));
                self.schedule_flush(now, false);
            }
        }
    }

    /// A connection to `peer` is up. Peers learn about held artifacts they may have missed: every
    /// `All` artifact, and every artifact this node published, is advertised to the new peer.
    pub fn handle_peer_up(&mut self, peer: PeerId, now: Instant) {
        if self.peers.contains_key(&peer) {
            return;
        }
        let mut state = PeerState::default();
        let mut catch_up: Vec<(&ArtifactId, &Held)> = self
            .pool
            .iter()
            .filter(|(_, held)| {
                self.config.classes.get(&held.class).map(|p| p.relay) == Some(Relay::All)
                    || held.local
            })
            .collect();
        // Deterministic order, oldest first.
        catch_up.sort_by_key(|(id, held)| (held.expires_at, **id));
        for (id, held) in catch_up {
            state.queued.push(Item::Advert {
                class: held.class,
                id: *id,
                size: held.payload.len() as u32,
            });
        }
        let has_items = !state.queued.is_empty();
        self.peers.insert(peer, state);
        if has_items {
            self.schedule_flush(now, false);
        }
    }

    /// The connection to `peer` is gone: its pending requests move to other advertisers.
    pub fn handle_peer_down(&mut self, peer: PeerId, now: Instant) {
        if self.peers.remove(&peer).is_none() {
            return;
        }
        let affected: Vec<ArtifactId> = self
            .pending
            .iter()
            .filter(|(_, pending)| pending.advertisers.iter().any(|(p, _)| *p == peer))
            .map(|(id, _)| *id)
            .collect();
        for id in affected {
            self.forget_advertiser(id, peer, now);
        }
    }

    /// A batch arrived from `from`. A batch that does not decode is dropped whole and reported.
    pub fn handle_batch(
        &mut self,
        from: PeerId,
        batch: &Bytes,
        now: Instant,
    ) -> Result<(), GossipError> {
        if !self.peers.contains_key(&from) {
            // A batch can overtake the connection event that introduces its sender.
            self.handle_peer_up(from, now);
        }
        let items = decode_batch(batch, &self.config.batch_limits())?;
        for item in items {
            self.handle_item(from, item, now);
        }
        Ok(())
    }

    fn handle_item(&mut self, from: PeerId, item: Item, now: Instant) {
        match item {
            Item::Advert { class, id, size } => self.handle_advert(from, class, id, size, now),
            Item::Request(id) => self.handle_request(from, id, now),
            Item::Artifact { class, payload } => self.handle_artifact(from, class, payload, now),
            Item::Purge(id) => {
                if self
                    .pending
                    .get(&id)
                    .is_some_and(|p| p.advertisers.iter().any(|(peer, _)| *peer == from))
                {
                    self.forget_advertiser(id, from, now);
                }
            }
        }
    }

    fn handle_advert(
        &mut self,
        from: PeerId,
        class: ClassId,
        id: ArtifactId,
        size: u32,
        now: Instant,
    ) {
        if !self.config.classes.contains_key(&class) {
            self.unknown_class += 1;
            return;
        }
        let duplicate = self.pool.contains_key(&id) || self.is_tombstoned(&id, now);
        let stats = self.stats.entry(class).or_default();
        stats.adverts_received += 1;
        stats.bytes_received += codec::ADVERT_LEN as u64;
        if duplicate {
            stats.duplicates += 1;
            return;
        }
        if size > self.config.max_artifact_bytes {
            stats.adverts_refused += 1;
            return;
        }
        if let Some(pending) = self.pending.get(&id) {
            if pending.advertisers.iter().any(|(peer, _)| *peer == from)
                || pending.advertisers.len() >= self.config.max_advertisers
            {
                return;
            }
        }
        let (max_slots, max_bytes) = (
            self.config.max_pending_per_peer,
            self.config.max_pending_bytes_per_peer,
        );
        let Some(peer) = self.peers.get_mut(&from) else {
            return;
        };
        if peer.slots >= max_slots || peer.bytes + u64::from(size) > max_bytes {
            self.stats.entry(class).or_default().adverts_refused += 1;
            return;
        }
        peer.slots += 1;
        peer.bytes += u64::from(size);
        match self.pending.get_mut(&id) {
            Some(pending) => pending.advertisers.push((from, size)),
            None => {
                self.pending.insert(
                    id,
                    Pending {
                        class,
                        advertisers: vec![(from, size)],
                        requested: None,
                    },
                );
                self.request_next(id, now);
            }
        }
    }

    fn handle_request(&mut self, from: PeerId, id: ArtifactId, now: Instant) {
        let Some(held) = self.pool.get(&id) else {
            return;
        };
        let class = held.class;
        let payload = held.payload.clone();
        let max_slots = self.config.max_pending_per_peer;
        let stats = self.stats.entry(class).or_default();
        stats.requests_received += 1;
        stats.bytes_received += codec::ID_ITEM_LEN as u64;
        let Some(peer) = self.peers.get_mut(&from) else {
            return;
        };
        if peer.slots >= max_slots {
            stats.adverts_refused += 1;
            return;
        }
        // The response holds a slot until it is flushed.
        peer.slots += 1;
        stats.pulls_sent += 1;
        stats.bytes_sent += (codec::ARTIFACT_HEADER_LEN + payload.len()) as u64;
        peer.queued.push(Item::Artifact { class, payload });
        self.schedule_flush(now, false);
    }

    fn handle_artifact(&mut self, from: PeerId, class: ClassId, payload: Bytes, now: Instant) {
        let Some(policy) = self.config.classes.get(&class).copied() else {
            self.unknown_class += 1;
            return;
        };
        let id = ArtifactId::of(class, &payload);
        let requested = self
            .pending
            .get(&id)
            .is_some_and(|p| p.requested.map(|(peer, _)| peer) == Some(from));
        let stats = self.stats.entry(class).or_default();
        stats.bytes_received += (codec::ARTIFACT_HEADER_LEN + payload.len()) as u64;
        if requested {
            stats.pulls_received += 1;
        } else {
            stats.pushes_received += 1;
        }
        if self.pool.contains_key(&id) || self.is_tombstoned(&id, now) {
            self.stats.entry(class).or_default().duplicates += 1;
            return;
        }
        if !self.validator.validate(class, &payload) {
            self.drop_pending(&id);
            self.stats.entry(class).or_default().rejected += 1;
            if let Some(peer) = self.peers.get_mut(&from) {
                peer.rejected += 1;
            }
            self.tombstone(id, now + policy.expiry);
            self.events.push_back(Event::Rejected { id, class, from });
            return;
        }
        if !self.pool_has_room(payload.len()) {
            // Not tombstoned: it may be fetched again once there is room.
            self.stats.entry(class).or_default().pool_full += 1;
            return;
        }
        self.drop_pending(&id);
        self.store(id, class, payload.clone(), policy, now);
        self.events.push_back(Event::Delivered {
            id,
            class,
            payload: payload.clone(),
            from,
        });
        if policy.relay == Relay::All {
            self.disseminate(id, class, payload, policy, now);
        }
    }

    /// Fires due timers (request fallbacks, expiry) and flushes queued items.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(at, timer, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            match timer {
                Timer::Expiry => {
                    self.pool_expire(id, at, now);
                }
                Timer::Request => {
                    let Some(pending) = self.pending.get_mut(&id) else {
                        continue;
                    };
                    let Some((peer, _)) = pending.requested.take() else {
                        continue;
                    };
                    self.forget_advertiser(id, peer, now);
                }
            }
        }
        while let Some(front) = self.tombstone_order.front() {
            let expired = self.tombstones.get(front).is_none_or(|until| *until <= now);
            if !expired {
                break;
            }
            if let Some(id) = self.tombstone_order.pop_front() {
                if self.tombstones.get(&id).is_some_and(|until| *until <= now) {
                    self.tombstones.remove(&id);
                }
            }
        }
        if self.next_flush.is_some_and(|at| at <= now) {
            self.flush();
        }
    }

    /// When [`Gossip::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timer = self.timers.first().map(|(at, _, _)| *at);
        match (timer, self.next_flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next batch to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Counters per class.
    pub fn stats(&self) -> &BTreeMap<ClassId, ClassStats> {
        &self.stats
    }

    /// Items received for classes this node does not know.
    pub fn unknown_class_items(&self) -> u64 {
        self.unknown_class
    }

    /// Artifacts from `peer` the validator rejected.
    pub fn rejected_from(&self, peer: &PeerId) -> u64 {
        self.peers.get(peer).map_or(0, |p| p.rejected)
    }

    /// Whether the pool holds `id`.
    pub fn has(&self, id: &ArtifactId) -> bool {
        self.pool.contains_key(id)
    }

    /// The payload of `id`, if held.
    pub fn get(&self, id: &ArtifactId) -> Option<&Bytes> {
        self.pool.get(id).map(|held| &held.payload)
    }

    /// Artifacts in the pool.
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// Artifacts advertised to this node and not yet fetched.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Slots and advertised bytes `peer` currently holds of its budget.
    pub fn peer_budget_used(&self, peer: &PeerId) -> Option<(usize, u64)> {
        self.peers.get(peer).map(|p| (p.slots, p.bytes))
    }

    /// Memory the state accounts for: pool payloads and entries, pending entries, queued items
    /// and tombstones. Never exceeds [`GossipConfig::memory_bound_bytes`] for the current peers.
    pub fn memory_bytes(&self) -> u64 {
        let pending: u64 = self
            .pending
            .values()
            .map(|p| PENDING_ENTRY_BYTES + 32 * p.advertisers.len() as u64)
            .sum();
        let queued: u64 = self
            .peers
            .values()
            .map(|p| PEER_BYTES + REQUEST_BYTES * p.queued.len() as u64)
            .sum();
        self.pool_bytes
            + HELD_ENTRY_BYTES * self.pool.len() as u64
            + pending
            + queued
            + TOMBSTONE_BYTES * self.tombstones.len() as u64
    }

    fn pool_has_room(&self, len: usize) -> bool {
        self.pool.len() < self.config.max_pool_artifacts
            && self.pool_bytes + len as u64 <= self.config.max_pool_bytes
    }

    fn store(
        &mut self,
        id: ArtifactId,
        class: ClassId,
        payload: Bytes,
        policy: ClassPolicy,
        now: Instant,
    ) {
        let expires_at = now + policy.expiry;
        self.pool_bytes += payload.len() as u64;
        self.timers.insert((expires_at, Timer::Expiry, id));
        self.pool.insert(
            id,
            Held {
                class,
                payload,
                expires_at,
                advertised: false,
                local: false,
            },
        );
    }

    fn pool_expire(&mut self, id: ArtifactId, at: Instant, now: Instant) {
        if self.pool.get(&id).is_some_and(|held| held.expires_at == at) {
            self.remove_held(&id, now);
        }
    }

    fn remove_held(&mut self, id: &ArtifactId, now: Instant) -> Option<Held> {
        let held = self.pool.remove(id)?;
        self.pool_bytes -= held.payload.len() as u64;
        self.timers.remove(&(held.expires_at, Timer::Expiry, *id));
        let expiry = self
            .config
            .classes
            .get(&held.class)
            .map_or(Duration::ZERO, |p| p.expiry);
        self.tombstone(*id, now + expiry);
        Some(held)
    }

    fn tombstone(&mut self, id: ArtifactId, until: Instant) {
        if self.tombstones.insert(id, until).is_none() {
            self.tombstone_order.push_back(id);
        }
        while self.tombstones.len() > self.config.max_tombstones {
            let Some(oldest) = self.tombstone_order.pop_front() else {
                break;
            };
            self.tombstones.remove(&oldest);
        }
    }

    fn is_tombstoned(&self, id: &ArtifactId, now: Instant) -> bool {
        self.tombstones.get(id).is_some_and(|until| *until > now)
    }

    /// Queues `id` for every peer: pushed whole or advertised, as its class says.
    fn disseminate(
        &mut self,
        id: ArtifactId,
        class: ClassId,
        payload: Bytes,
        policy: ClassPolicy,
        now: Instant,
    ) {
        let peers = self.peers.len() as u64;
        if peers == 0 {
            return;
        }
        let stats = self.stats.entry(class).or_default();
        if policy.pushes(payload.len()) {
            stats.pushes_sent += peers;
            stats.bytes_sent += peers * (codec::ARTIFACT_HEADER_LEN + payload.len()) as u64;
            self.broadcast.push(Item::Artifact { class, payload });
            self.schedule_flush(now, policy.latency_sensitive);
        } else {
            stats.adverts_sent += peers;
            stats.bytes_sent += peers * codec::ADVERT_LEN as u64;
            let size = payload.len() as u32;
            if let Some(held) = self.pool.get_mut(&id) {
                held.advertised = true;
            }
            self.broadcast.push(Item::Advert { class, id, size });
            self.schedule_flush(now, false);
        }
    }

    fn schedule_flush(&mut self, now: Instant, immediately: bool) {
        let at = if immediately {
            now
        } else {
            now + self.config.flush_interval
        };
        self.next_flush = Some(self.next_flush.map_or(at, |current| current.min(at)));
    }

    /// Asks the next advertiser of `id`, or drops the entry if none is left.
    fn request_next(&mut self, id: ArtifactId, now: Instant) {
        let timeout = self.config.request_timeout;
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        let Some(&(peer, _)) = pending.advertisers.first() else {
            self.pending.remove(&id);
            return;
        };
        let deadline = now + timeout;
        pending.requested = Some((peer, deadline));
        let class = pending.class;
        self.timers.insert((deadline, Timer::Request, id));
        if let Some(state) = self.peers.get_mut(&peer) {
            state.queued.push(Item::Request(id));
        }
        let stats = self.stats.entry(class).or_default();
        stats.requests_sent += 1;
        stats.bytes_sent += codec::ID_ITEM_LEN as u64;
        self.schedule_flush(now, false);
    }

    /// Removes `peer` as an advertiser of `id`, releasing its budget; if it was the one asked,
    /// asks the next.
    fn forget_advertiser(&mut self, id: ArtifactId, peer: PeerId, now: Instant) {
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        let Some(index) = pending.advertisers.iter().position(|(p, _)| *p == peer) else {
            return;
        };
        let (_, size) = pending.advertisers.remove(index);
        let size = u64::from(size);
        let was_asked = pending.requested.is_none_or(|(asked, _)| asked == peer);
        if let Some((asked, deadline)) = pending.requested {
            if asked == peer {
                pending.requested = None;
                self.timers.remove(&(deadline, Timer::Request, id));
            }
        }
        if let Some(state) = self.peers.get_mut(&peer) {
            state.slots = state.slots.saturating_sub(1);
            state.bytes = state.bytes.saturating_sub(size);
        }
        if was_asked {
            self.request_next(id, now);
        }
    }

    /// Drops the pending entry of `id` (it arrived, or is no longer wanted), releasing budgets.
    fn drop_pending(&mut self, id: &ArtifactId) {
        let Some(pending) = self.pending.remove(id) else {
            return;
        };
        if let Some((_, deadline)) = pending.requested {
            self.timers.remove(&(deadline, Timer::Request, *id));
        }
        for (peer, size) in pending.advertisers {
            if let Some(state) = self.peers.get_mut(&peer) {
                state.slots = state.slots.saturating_sub(1);
                state.bytes = state.bytes.saturating_sub(u64::from(size));
            }
        }
    }

    /// Turns queued items into batches: the broadcast items go to every peer; a peer with its own
    /// items (requests, responses, catch-up adverts) gets them in the same batch. Peers with the
    /// same items share one encoding.
    fn flush(&mut self) {
        self.next_flush = None;
        let broadcast = std::mem::take(&mut self.broadcast);
        let mut shared: Vec<PeerId> = Vec::new();
        let max_items = self.config.max_batch_items.max(1);
        for (peer, state) in self.peers.iter_mut() {
            if state.queued.is_empty() {
                shared.push(*peer);
                continue;
            }
            let own = std::mem::take(&mut state.queued);
            // Responses held a slot each until now.
            let responses = own
                .iter()
                .filter(|item| matches!(item, Item::Artifact { .. }))
                .count();
            state.slots = state.slots.saturating_sub(responses);
            let items: Vec<Item> = broadcast.iter().cloned().chain(own).collect();
            for chunk in items.chunks(max_items) {
                self.transmits.push_back(Transmit {
                    peers: vec![*peer],
                    batch: encode_batch(chunk),
                });
            }
        }
        if !shared.is_empty() {
            for chunk in broadcast.chunks(max_items) {
                self.transmits.push_back(Transmit {
                    peers: shared.clone(),
                    batch: encode_batch(chunk),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
