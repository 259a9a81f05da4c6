//! The gossip state machine: pools, adverts, pulls, pushes and purges, fed events and `now`.

pub mod codec;
mod config;
mod neighbours;
mod pool;
mod pull;
mod repair;
mod stats;
mod tree;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;

pub use codec::{decode_batch, encode_batch, BatchLimits, CodecError, Item};
pub use config::{ClassPolicy, GossipConfig, Relay};
use config::{
    EAGER_ENTRY_BYTES, HELD_ENTRY_BYTES, NEIGHBOUR_ENTRY_BYTES, PEER_BYTES, PENDING_ENTRY_BYTES,
    REPAIR_ENTRY_BYTES, REQUEST_BYTES, TOMBSTONE_BYTES, TREE_BYTES,
};
use meshwire_proto::PeerId;
pub use neighbours::NeighbourStats;
use pool::Held;
use pull::Pending;
pub use stats::ClassStats;

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

#[derive(Default)]
struct PeerState {
    /// Pending (artifact, this advertiser) pairs plus queued responses.
    slots: usize,
    /// Advertised bytes of its pending pairs.
    bytes: u64,
    /// Requests, responses and catch-up adverts waiting for the next flush.
    queued: Vec<Item>,
    /// Relayed items (eager copies, lazy adverts, prunes) waiting for the next flush, at most
    /// `max_pending_per_peer`.
    relay: Vec<Item>,
    /// Artifacts from this peer the validator rejected.
    rejected: u64,
    /// The newest neighbours announcement from this peer: its sequence number and up to
    /// `max_neighbours` of the peers it listed.
    neighbours: Option<(u64, BTreeSet<PeerId>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Expiry,
    Request,
    Repair,
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
    /// Per upstream peer, the peers this node relays `Relay::All` artifacts from it to eagerly.
    /// (true: confirmed by a graft, gets payloads; false: tentative, gets adverts).
    trees: HashMap<PeerId, BTreeMap<PeerId, bool>>,
    /// Mixed into relay-peer choices so nodes spread their relays differently.
    salt: [u8; 32],
    /// Prunes for artifacts this node does not hold (expired, or never sent).
    unmatched_prunes: u64,
    /// The peer set changed since this node last announced it.
    announce_due: bool,
    /// Sequence number of this node's last neighbours announcement.
    announce_seq: u64,
    /// Recent `Relay::All` artifacts, for periodic repair.
    repair: repair::Repair,
    /// Counters of neighbours announcements (no class: they describe connections).
    neighbour_stats: NeighbourStats,
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
            trees: HashMap::new(),
            salt: [0; 32],
            unmatched_prunes: 0,
            announce_due: false,
            announce_seq: 0,
            repair: repair::Repair::default(),
            neighbour_stats: NeighbourStats::default(),
        }
    }

    /// Tells the state machine its own peer id. It seeds the choice of relay peers, so that
    /// nodes with the same peers choose different ones; without it every node uses the same seed.
    pub fn set_local_id(&mut self, local: PeerId) {
        self.salt = *local.as_bytes();
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
            // Lazy: a peer that already holds it answers nothing.
            state.queued.push(Item::IHave {
                class: held.class,
                id: *id,
                size: held.payload.len() as u32,
            });
        }
        let has_items = !state.queued.is_empty();
        self.peers.insert(peer, state);
        self.announce_due = self.announces();
        if has_items || self.announce_due {
            self.schedule_flush(now, false);
        }
    }

    /// The connection to `peer` is gone: its pending requests move to other advertisers.
    pub fn handle_peer_down(&mut self, peer: PeerId, now: Instant) {
        if self.peers.remove(&peer).is_none() {
            return;
        }
        if self.announces() && !self.peers.is_empty() {
            self.announce_due = true;
            self.schedule_flush(now, false);
        }
        self.tree_peer_down(&peer);
        self.repair_peer_down(&peer);
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
            Item::Advert { class, id, size } => {
                self.handle_advert(from, class, id, size, false, now)
            }
            Item::IHave { class, id, size } => self.handle_advert(from, class, id, size, true, now),
            Item::Prune(id) => self.handle_prune(from, id),
            Item::Neighbours { seq, peers } => self.handle_neighbours(from, seq, peers),
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

    fn handle_request(&mut self, from: PeerId, id: ArtifactId, now: Instant) {
        let Some(held) = self.pool.get(&id) else {
            return;
        };
        let class = held.class;
        let payload = held.payload.clone();
        let upstream = held.from;
        self.graft(from, upstream, class);
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
        stats.payload_bytes_received += payload.len() as u64;
        if requested {
            stats.pulls_received += 1;
        } else {
            stats.pushes_received += 1;
        }
        if self.pool.contains_key(&id) || self.is_tombstoned(&id, now) {
            let stats = self.stats.entry(class).or_default();
            stats.duplicates += 1;
            stats.duplicate_artifacts += 1;
            if !requested && policy.relay == Relay::All {
                // An eager copy of what reached us another way: leave its sender's eager set.
                self.send_prune(from, class, id, now);
            }
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
        if let Some(held) = self.pool.get_mut(&id) {
            held.from = Some(from);
        }
        self.stats.entry(class).or_default().delivered += 1;
        self.events.push_back(Event::Delivered {
            id,
            class,
            payload: payload.clone(),
            from,
        });
        if policy.relay == Relay::All {
            if self.config.relay_to_all {
                self.disseminate(id, class, payload, policy, now);
            } else {
                self.relay(id, class, payload, policy, from, now);
            }
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
                Timer::Repair => self.repair_tick(now),
                Timer::Request => {
                    let Some(pending) = self.pending.get_mut(&id) else {
                        continue;
                    };
                    let Some((peer, _)) = pending.requested.take() else {
                        continue;
                    };
                    self.request_timed_out(id, peer, now);
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

    /// Prunes received for artifacts this node does not hold.
    pub fn unmatched_prunes(&self) -> u64 {
        self.unmatched_prunes
    }

    /// Counters of neighbours announcements.
    pub fn neighbour_stats(&self) -> NeighbourStats {
        self.neighbour_stats
    }

    /// The peers `peer` last announced as its neighbours (at most `max_neighbours`).
    pub fn neighbours_of(&self, peer: &PeerId) -> Option<&BTreeSet<PeerId>> {
        self.peers
            .get(peer)?
            .neighbours
            .as_ref()
            .map(|(_, set)| set)
    }

    /// The peers this node relays `Relay::All` artifacts received from `upstream` to eagerly,
    /// if it has relayed or been grafted for one yet.
    pub fn eager_peers(&self, upstream: &PeerId) -> Option<BTreeSet<PeerId>> {
        self.trees
            .get(upstream)
            .map(|eager| eager.keys().copied().collect())
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
            .map(|p| {
                let neighbours = p.neighbours.as_ref().map_or(0, |(_, set)| set.len());
                PEER_BYTES
                    + REQUEST_BYTES * (p.queued.len() + p.relay.len()) as u64
                    + NEIGHBOUR_ENTRY_BYTES * neighbours as u64
            })
            .sum();
        let trees: u64 = self
            .trees
            .values()
            .map(|eager| TREE_BYTES + EAGER_ENTRY_BYTES * eager.len() as u64)
            .sum();
        self.pool_bytes
            + HELD_ENTRY_BYTES * self.pool.len() as u64
            + REPAIR_ENTRY_BYTES * self.repair.len() as u64
            + pending
            + queued
            + TOMBSTONE_BYTES * self.tombstones.len() as u64
            + trees
    }

    /// Queues a published `id` for every peer: pushed whole or advertised, as its class says.
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

    /// Turns queued items into batches: the broadcast items go to every peer; a peer with its own
    /// items (requests, responses, catch-up adverts, relayed items) gets them in the same batch.
    /// Peers with the same items share one encoding.
    fn flush(&mut self) {
        self.next_flush = None;
        self.queue_announcement();
        let broadcast = std::mem::take(&mut self.broadcast);
        let mut shared: Vec<PeerId> = Vec::new();
        let max_items = self.config.max_batch_items.max(1);
        let max_bytes = self.config.max_batch_bytes;
        for (peer, state) in self.peers.iter_mut() {
            if state.queued.is_empty() && state.relay.is_empty() {
                shared.push(*peer);
                continue;
            }
            let own = std::mem::take(&mut state.queued);
            let relayed = std::mem::take(&mut state.relay);
            // Responses held a slot each until now.
            let responses = own
                .iter()
                .filter(|item| matches!(item, Item::Artifact { .. }))
                .count();
            state.slots = state.slots.saturating_sub(responses);
            let items: Vec<Item> = broadcast
                .iter()
                .cloned()
                .chain(relayed)
                .chain(own)
                .collect();
            for batch in batches(&items, max_items, max_bytes) {
                self.transmits.push_back(Transmit {
                    peers: vec![*peer],
                    batch,
                });
            }
        }
        if !shared.is_empty() {
            for batch in batches(&broadcast, max_items, max_bytes) {
                self.transmits.push_back(Transmit {
                    peers: shared.clone(),
                    batch,
                });
            }
        }
    }
}

/// Encodes `items` as batches of at most `max_items` items and `max_bytes` bytes each, in order
/// (an item larger than `max_bytes` on its own goes alone), so no batch outgrows a node frame.
fn batches(items: &[Item], max_items: usize, max_bytes: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let mut end = start;
        let mut bytes = codec::BATCH_HEADER_LEN;
        while end < items.len() && end - start < max_items {
            let len = items[end].wire_len();
            if end > start && bytes + len > max_bytes {
                break;
            }
            bytes += len;
            end += 1;
        }
        out.push(encode_batch(&items[start..end]));
        start = end;
    }
    out
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod batch_split {
    use super::*;

    #[test]
    fn a_burst_of_large_artifacts_is_split_into_batches_within_the_byte_bound() {
        // 16 artifacts of 1 MiB were one 16 MiB batch, over the node's frame limit, and lost.
        let items: Vec<Item> = (0..16u8)
            .map(|i| Item::Artifact {
                class: ClassId(1),
                payload: Bytes::from(vec![i; 1 << 20]),
            })
            .chain(std::iter::once(Item::Request(ArtifactId([9; 32]))))
            .collect();
        let limit = 4 << 20;
        let out = batches(&items, 4096, limit);
        assert!(out.len() >= 5);
        let limits = BatchLimits {
            max_items: 4096,
            max_artifact_bytes: 2 << 20,
        };
        let mut decoded = Vec::new();
        for batch in &out {
            assert!(batch.len() <= limit, "batch of {} bytes", batch.len());
            decoded.extend(decode_batch(batch, &limits).unwrap());
        }
        assert_eq!(decoded, items, "every item once, in order");
        // An item over the bound goes alone; the item count bound still holds.
        assert_eq!(batches(&items[..2], 4096, 1000).len(), 2);
        assert_eq!(
            batches(&vec![Item::Request(ArtifactId([1; 32])); 10], 3, limit).len(),
            4
        );
    }
}
