//! Class policies and the limits and timers of a gossip instance, with the memory they account for.

use std::collections::BTreeMap;
use std::time::Duration;

use super::codec::BatchLimits;
use super::ClassId;

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

    pub(super) fn pushes(&self, size: usize) -> bool {
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
    /// Most bytes per batch a node sends: queued items beyond it go in further batches, so a
    /// burst of large artifacts never makes a batch larger than a node frame (16 MiB by default).
    /// At least `max_artifact_bytes` plus an item header, or that artifact goes alone.
    pub max_batch_bytes: usize,
    /// Most ids remembered after they left the pool.
    pub max_tombstones: usize,
    /// Peers a node relays a `Relay::All` artifact to eagerly (pushed whole or advertised, as
    /// its class says) per upstream peer, before any prune: the start of the relay tree. Peers
    /// that prune leave this set, peers that request (graft) join it.
    pub eager_fanout: usize,
    /// Peers outside the eager set a relay sends a lazy advert (ihave) of each `Relay::All`
    /// artifact: the repair path. Bounded, so adverts do not grow with the peer count.
    pub lazy_fanout: usize,
    /// Relay every `Relay::All` artifact to every peer instead of along relay trees, and send no
    /// prunes: gossip as it was before relay trees (and as the Internet Computer relays consensus
    /// artifacts), kept so the lab can measure it against them.
    pub relay_to_all: bool,
    /// Most peers kept of each peer's neighbours announcement (and sent in this node's own). A
    /// relay skips a peer only when the artifact's upstream and that peer list each other, so
    /// a list cut short costs extra lazy adverts, never a missed artifact.
    pub max_neighbours: usize,
    /// Announce this node's peers to its peers. Off, a node keeps its peer set to itself (for
    /// a network where who talks to whom is private); its peers then never skip it in a relay,
    /// which costs it an ihave per relayed artifact from each of them. Off with `relay_to_all`.
    pub announce_neighbours: bool,
    /// How often a node sends one peer (a different one each time, chosen pseudo-randomly) an
    /// ihave of every `Relay::All` artifact it stored in the last `repair_window`, so a node
    /// whose copy and ihaves were all lost hears of the artifact again. Each node then costs
    /// about `repair_window / repair_interval` ihaves per artifact. Zero turns repair off; it
    /// is off with `relay_to_all`.
    pub repair_interval: Duration,
    /// How far back periodic repair reaches.
    pub repair_window: Duration,
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
            max_batch_bytes: 8 * 1024 * 1024,
            max_tombstones: 65_536,
            eager_fanout: 2,
            lazy_fanout: 2,
            relay_to_all: false,
            max_neighbours: 1024,
            announce_neighbours: true,
            repair_interval: Duration::from_secs(1),
            repair_window: Duration::from_secs(2),
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

    /// Upper bound of [`Gossip::memory_bytes`](super::Gossip::memory_bytes) with `peers` peers.
    pub fn memory_bound_bytes(&self, peers: usize) -> u64 {
        // Pending pairs with their requests, and relayed items (pushes, adverts, prunes) queued
        // for the next flush, at most `max_pending_per_peer` of each.
        let per_peer = self.max_pending_per_peer as u64 * (PENDING_ENTRY_BYTES + 2 * REQUEST_BYTES);
        // One eager set per upstream peer, each holding at most every peer.
        let trees = peers as u64 * (TREE_BYTES + peers as u64 * EAGER_ENTRY_BYTES);
        self.max_pool_bytes
            + self.max_pool_artifacts as u64 * (HELD_ENTRY_BYTES + REPAIR_ENTRY_BYTES)
            + self.max_tombstones as u64 * TOMBSTONE_BYTES
            + peers as u64 * (per_peer + PEER_BYTES + REPAIR_ENTRY_BYTES)
            + peers as u64 * self.max_neighbours as u64 * NEIGHBOUR_ENTRY_BYTES
            + trees
    }
}

// Accounted sizes of the state's entries (map slot, deadline entry, advertiser list).
pub(super) const HELD_ENTRY_BYTES: u64 = 160;
pub(super) const PENDING_ENTRY_BYTES: u64 = 224;
pub(super) const REQUEST_BYTES: u64 = 40;
pub(super) const TOMBSTONE_BYTES: u64 = 96;
pub(super) const PEER_BYTES: u64 = 160;
pub(super) const TREE_BYTES: u64 = 96;
pub(super) const EAGER_ENTRY_BYTES: u64 = 48;
pub(super) const NEIGHBOUR_ENTRY_BYTES: u64 = 48;
pub(super) const REPAIR_ENTRY_BYTES: u64 = 48;
