//! Relaying `Relay::All` artifacts on per-upstream trees: eager copies to a few peers, lazy adverts
//! to a few others, prune on duplicate, graft on request (Plumtree, adapted to bounded fanouts).
//!
//! A node that publishes an artifact sends it to every peer (one hop). A node that receives a
//! `Relay::All` artifact from peer `U` relays it eagerly to its eager set for `U`, and lazily (an
//! ihave) to `lazy_fanout` other peers: the ones after it on the artifact's ring. The eager set
//! for `U` starts as `eager_fanout` tentative peers, which get an eager advert; a peer that
//! requests an artifact that came from `U` (it lacked it when an advert arrived) joins the set
//! confirmed (a graft), and confirmed peers get small artifacts pushed whole. A peer that gets an
//! eager copy or advert of something it already held answers with a prune and leaves the set.
//! In a full mesh every eager set empties after the first artifact from each upstream, and what
//! remains is the publisher's direct copy plus `lazy_fanout` ihaves per relay. Peers the
//! upstream does not reach itself (by the neighbours announcements) get an ihave as well, so no
//! node is left out on a sparse network (`neighbours`).

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::Bytes;
use meshwire_proto::PeerId;

use super::{codec, ArtifactId, ClassId, ClassPolicy, Gossip, Item, Relay, Validator};

/// A stable pseudo-random rank of `peer` for `key`, salted per node.
pub(super) fn rank(salt: &[u8; 32], key: &[u8], peer: &PeerId) -> [u8; 32] {
    meshwire_proto::hash::sha256(&[salt, key, peer.as_bytes()])
}

impl<V: Validator> Gossip<V> {
    /// The first `count` peers other than `skip` in the order `rank` gives for `key`.
    fn choose(&self, key: &[u8], count: usize, skip: impl Fn(&PeerId) -> bool) -> Vec<PeerId> {
        if count == 0 {
            return Vec::new();
        }
        let mut ranked: Vec<([u8; 32], PeerId)> = self
            .peers
            .keys()
            .filter(|peer| !skip(peer))
            .map(|peer| (rank(&self.salt, key, peer), *peer))
            .collect();
        ranked.sort_unstable();
        ranked
            .into_iter()
            .take(count)
            .map(|(_, peer)| peer)
            .collect()
    }

    /// The lazy targets of `id`: the `count` peers that follow this node on the artifact's ring
    /// (every node and peer ordered by the unsalted hash of the id and its peer id), other than
    /// `skip`. In a full mesh every node computes the same ring, so every node is the target of
    /// the `count` nodes before it: each gets `count` ihaves, none is left out.
    fn ring_successors(
        &self,
        id: &ArtifactId,
        count: usize,
        skip: impl Fn(&PeerId) -> bool,
    ) -> Vec<PeerId> {
        if count == 0 {
            return Vec::new();
        }
        let me = rank(&[0; 32], &id.0, &PeerId::from_bytes(self.salt));
        let mut ranked: Vec<([u8; 32], PeerId)> = self
            .peers
            .keys()
            .map(|peer| (rank(&[0; 32], &id.0, peer), *peer))
            .collect();
        ranked.sort_unstable();
        let start = ranked.partition_point(|(position, _)| *position <= me);
        ranked[start..]
            .iter()
            .chain(&ranked[..start])
            .map(|(_, peer)| *peer)
            .filter(|peer| !skip(peer))
            .take(count)
            .collect()
    }

    /// The eager set for `upstream`, created on first use with `eager_fanout` tentative peers
    /// (they get eager adverts, not payloads, until they request one).
    fn eager_set(&mut self, upstream: PeerId) -> &mut BTreeMap<PeerId, bool> {
        if !self.trees.contains_key(&upstream) {
            let initial = self
                .choose(upstream.as_bytes(), self.config.eager_fanout, |peer| {
                    *peer == upstream
                })
                .into_iter()
                .map(|peer| (peer, false))
                .collect();
            self.trees.insert(upstream, initial);
        }
        self.trees.entry(upstream).or_default()
    }

    /// Relays an artifact received from `upstream`: eager copies to its eager set, ihaves to
    /// `lazy_fanout` peers outside it.
    pub(super) fn relay(
        &mut self,
        id: ArtifactId,
        class: ClassId,
        payload: Bytes,
        policy: ClassPolicy,
        upstream: PeerId,
        now: Instant,
    ) {
        let eager: Vec<(PeerId, bool)> = self
            .eager_set(upstream)
            .iter()
            .map(|(peer, confirmed)| (*peer, *confirmed))
            .filter(|(peer, _)| *peer != upstream)
            .collect();
        let mut lazy = self.ring_successors(&id, self.config.lazy_fanout, |peer| {
            *peer == upstream || eager.iter().any(|(eager, _)| eager == peer)
        });
        // Every other peer the upstream does not reach itself gets an ihave too (see
        // `neighbours`): on a sparse network it may hear of the artifact from no one else.
        let ring = lazy.len();
        let uncovered: Vec<PeerId> = self
            .peers
            .keys()
            .filter(|peer| {
                **peer != upstream
                    && !eager.iter().any(|(eager, _)| eager == *peer)
                    && !lazy[..ring].contains(peer)
                    && !self.reaches(&upstream, peer)
            })
            .copied()
            .collect();
        lazy.extend(uncovered);
        let size = payload.len() as u32;
        let push = policy.pushes(payload.len());
        let (mut pushed, mut advertised) = (0u64, 0u64);
        for (peer, confirmed) in eager {
            // Payloads go only to peers that asked for one from this upstream (grafted): a
            // tentative peer that already holds the artifact costs an advert, not a copy.
            let item = if push && confirmed {
                Item::Artifact {
                    class,
                    payload: payload.clone(),
                }
            } else {
                Item::Advert { class, id, size }
            };
            let is_push = matches!(item, Item::Artifact { .. });
            if self.queue_relay(peer, class, item) {
                if is_push {
                    pushed += 1;
                } else {
                    advertised += 1;
                }
            }
        }
        let (mut lazy_sent, mut cover_sent) = (0u64, 0u64);
        for (index, peer) in lazy.iter().enumerate() {
            let sent = u64::from(self.queue_relay(*peer, class, Item::IHave { class, id, size }));
            lazy_sent += sent;
            if index >= ring {
                cover_sent += sent;
            }
        }
        if advertised + lazy_sent > 0 {
            if let Some(held) = self.pool.get_mut(&id) {
                held.advertised = true;
            }
        }
        let stats = self.stats.entry(class).or_default();
        stats.pushes_sent += pushed;
        stats.adverts_sent += advertised + lazy_sent;
        stats.ihaves_sent += lazy_sent;
        stats.cover_ihaves_sent += cover_sent;
        stats.bytes_sent += pushed * (codec::ARTIFACT_HEADER_LEN as u64 + u64::from(size))
            + (advertised + lazy_sent) * codec::ADVERT_LEN as u64;
        if pushed + advertised + lazy_sent > 0 {
            self.schedule_flush(now, policy.latency_sensitive);
        }
    }

    /// Queues `item` on `peer`'s relay queue; false (and counted) if the queue is full or the
    /// peer is gone.
    pub(super) fn queue_relay(&mut self, peer: PeerId, class: ClassId, item: Item) -> bool {
        let max = self.config.max_pending_per_peer;
        match self.peers.get_mut(&peer) {
            Some(state) if state.relay.len() < max => {
                state.relay.push(item);
                true
            }
            Some(_) => {
                self.stats.entry(class).or_default().relays_dropped += 1;
                false
            }
            None => false,
        }
    }

    /// Answers an eager copy of `id` (already held) from `from` with a prune.
    pub(super) fn send_prune(
        &mut self,
        from: PeerId,
        class: ClassId,
        id: ArtifactId,
        now: Instant,
    ) {
        if self.config.relay_to_all {
            // Relaying to every peer, this node would ignore prunes; it sends none either.
            return;
        }
        if self.queue_relay(from, class, Item::Prune(id)) {
            let stats = self.stats.entry(class).or_default();
            stats.prunes_sent += 1;
            stats.bytes_sent += codec::ID_ITEM_LEN as u64;
            self.schedule_flush(now, false);
        }
    }

    /// `from` already held `id` when our eager copy came: it leaves the eager set of the
    /// upstream `id` came from. Artifacts published here always go to every peer.
    pub(super) fn handle_prune(&mut self, from: PeerId, id: ArtifactId) {
        let Some(held) = self.pool.get(&id) else {
            self.unmatched_prunes += 1;
            return;
        };
        let (class, upstream) = (held.class, held.from);
        let stats = self.stats.entry(class).or_default();
        stats.prunes_received += 1;
        stats.bytes_received += codec::ID_ITEM_LEN as u64;
        if let Some(eager) = upstream.and_then(|upstream| self.trees.get_mut(&upstream)) {
            eager.remove(&from);
        }
    }

    /// `from` requested an artifact that came from `upstream`: it lacked it, so it joins the
    /// eager set for `upstream` (a graft).
    pub(super) fn graft(&mut self, from: PeerId, upstream: Option<PeerId>, class: ClassId) {
        let Some(upstream) = upstream else {
            return;
        };
        let relays = self.config.classes.get(&class).map(|policy| policy.relay) == Some(Relay::All);
        if !relays || upstream == from || !self.peers.contains_key(&from) {
            return;
        }
        if self.eager_set(upstream).insert(from, true) != Some(true) {
            self.stats.entry(class).or_default().grafts += 1;
        }
    }

    /// `peer` is gone: its tree and its place in every other tree go with it.
    pub(super) fn tree_peer_down(&mut self, peer: &PeerId) {
        self.trees.remove(peer);
        for eager in self.trees.values_mut() {
            eager.remove(peer);
        }
    }
}
