//! Neighbours announcements: each node tells its peers who its peers are, so that a relay can
//! tell the peers its upstream reaches itself from those only it can reach.
//!
//! A relay of a `Relay::All` artifact goes eagerly to the eager set and lazily to `lazy_fanout`
//! ring successors. In a full mesh that covers everyone: every peer is also the upstream's peer
//! and got its copy from it. On a sparse network it does not: a node whose neighbours all have
//! empty eager sets for the artifact's upstream and more than `lazy_fanout` other peers is left
//! out whenever it is not among any neighbour's ring successors (a leaf behind a well-connected
//! node missed relayed shares this way). So a relay also sends an ihave to every peer the
//! upstream does not reach itself: a peer `V` is skipped only when the upstream `U` lists `V`
//! and `V` lists `U`. Then a node `V` that lacks an artifact a neighbour `W` holds was skipped by
//! `W` only because `W`'s upstream is `V`'s neighbour too and holds it; following upstreams back
//! ends at the publisher, which sends to every peer, so `V` hears of every artifact. A peer that
//! has not announced yet, or that lists its peers only in part, counts as not reached, which
//! costs an ihave (38 B) and never an artifact. Both lists must agree, so one peer claiming a
//! neighbour it does not have cannot make this node skip that neighbour.
//!
//! The announcements tell every peer who this node's other peers are. Where that is private,
//! `announce_neighbours = false` keeps them to the node; its peers then count it as reached by
//! no one and send it an ihave of every artifact they relay.

use std::collections::BTreeSet;

use meshwire_proto::PeerId;

use super::{codec, Gossip, Item, Validator};

/// Counters of neighbours announcements, sent and received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NeighbourStats {
    /// Announcements sent, counted once per recipient.
    pub sent: u64,
    /// Item bytes of the announcements sent, per recipient.
    pub bytes_sent: u64,
    /// Announcements received.
    pub received: u64,
    /// Item bytes of the announcements received.
    pub bytes_received: u64,
    /// Announcements received with a sequence number no newer than one already held (ignored).
    pub stale: u64,
}

impl<V: Validator> Gossip<V> {
    /// Whether this node announces its peers.
    pub(super) fn announces(&self) -> bool {
        self.config.announce_neighbours && !self.config.relay_to_all
    }

    /// Queues this node's peer list for every peer if it changed since the last announcement
    /// (called at each flush, so a burst of connections costs one announcement per flush).
    pub(super) fn queue_announcement(&mut self) {
        if !std::mem::take(&mut self.announce_due) || self.peers.is_empty() {
            return;
        }
        self.announce_seq += 1;
        let limit = self.config.max_neighbours.min(self.config.max_batch_items);
        let peers: Vec<PeerId> = self.peers.keys().take(limit).copied().collect();
        let len = (codec::NEIGHBOURS_HEADER_LEN + 32 * peers.len()) as u64;
        let recipients = self.peers.len() as u64;
        self.neighbour_stats.sent += recipients;
        self.neighbour_stats.bytes_sent += recipients * len;
        self.broadcast.push(Item::Neighbours {
            seq: self.announce_seq,
            peers,
        });
    }

    /// `from` announced its peers: the newest announcement replaces the one held.
    pub(super) fn handle_neighbours(&mut self, from: PeerId, seq: u64, peers: Vec<PeerId>) {
        let stats = &mut self.neighbour_stats;
        stats.received += 1;
        stats.bytes_received += (codec::NEIGHBOURS_HEADER_LEN + 32 * peers.len()) as u64;
        let max = self.config.max_neighbours;
        let Some(state) = self.peers.get_mut(&from) else {
            return;
        };
        if state
            .neighbours
            .as_ref()
            .is_some_and(|(held, _)| *held >= seq)
        {
            stats.stale += 1;
            return;
        }
        let listed: BTreeSet<PeerId> = peers.into_iter().take(max).collect();
        state.neighbours = Some((seq, listed));
    }

    /// Whether `upstream` reaches `peer` itself: each lists the other as a neighbour.
    pub(super) fn reaches(&self, upstream: &PeerId, peer: &PeerId) -> bool {
        let lists = |a: &PeerId, b: &PeerId| {
            self.peers
                .get(a)
                .and_then(|state| state.neighbours.as_ref())
                .is_some_and(|(_, listed)| listed.contains(b))
        };
        lists(upstream, peer) && lists(peer, upstream)
    }
}
