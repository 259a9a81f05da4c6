//! Pulling advertised artifacts: pending entries, advertiser budgets, requests and their fallbacks.

use std::time::Instant;

use meshwire_proto::PeerId;

use super::{codec, ArtifactId, ClassId, Gossip, Item, Relay, Timer, Validator};

pub(super) struct Pending {
    pub(super) class: ClassId,
    /// Each advertiser with the size it announced (and charged to its budget).
    pub(super) advertisers: Vec<(PeerId, u32)>,
    /// The advertiser asked, and when we give up on it.
    pub(super) requested: Option<(PeerId, Instant)>,
    /// Requests sent for it so far.
    pub(super) asked: usize,
}

impl<V: Validator> Gossip<V> {
    pub(super) fn handle_advert(
        &mut self,
        from: PeerId,
        class: ClassId,
        id: ArtifactId,
        size: u32,
        lazy: bool,
        now: Instant,
    ) {
        let Some(relay) = self.config.classes.get(&class).map(|policy| policy.relay) else {
            self.unknown_class += 1;
            return;
        };
        let duplicate = self.pool.contains_key(&id) || self.is_tombstoned(&id, now);
        let stats = self.stats.entry(class).or_default();
        stats.adverts_received += 1;
        stats.ihaves_received += u64::from(lazy);
        stats.bytes_received += codec::ADVERT_LEN as u64;
        if duplicate {
            stats.duplicates += 1;
            if !lazy && relay == Relay::All {
                // An eager advert of what reached us another way: leave its sender's eager set.
                self.send_prune(from, class, id, now);
            }
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
                        asked: 0,
                    },
                );
                self.request_next(id, now);
            }
        }
    }

    /// Asks the next advertiser of `id`, or drops the entry if none is left.
    pub(super) fn request_next(&mut self, id: ArtifactId, now: Instant) {
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
        pending.asked += 1;
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

    /// `peer` did not answer the request for `id` in time: the request or its answer may have
    /// been lost (a refused send, a dropped connection). Each advertiser gets two tries on
    /// average: until the entry has sent twice as many requests as it has advertisers, `peer`
    /// goes to the back of the list and the next is asked (`peer` again if it is the only
    /// one); after that `peer` is forgotten.
    pub(super) fn request_timed_out(&mut self, id: ArtifactId, peer: PeerId, now: Instant) {
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        if pending.asked >= 2 * pending.advertisers.len() {
            self.forget_advertiser(id, peer, now);
            return;
        }
        if let Some(index) = pending.advertisers.iter().position(|(p, _)| *p == peer) {
            let advertiser = pending.advertisers.remove(index);
            pending.advertisers.push(advertiser);
        }
        self.request_next(id, now);
    }

    /// Removes `peer` as an advertiser of `id`, releasing its budget; if it was the one asked,
    /// asks the next.
    pub(super) fn forget_advertiser(&mut self, id: ArtifactId, peer: PeerId, now: Instant) {
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
    pub(super) fn drop_pending(&mut self, id: &ArtifactId) {
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
}
