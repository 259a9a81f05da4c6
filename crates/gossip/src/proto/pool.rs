//! The pool of held artifacts and the tombstones of those that left it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire_proto::PeerId;

use super::{ArtifactId, ClassId, ClassPolicy, Gossip, Timer, Validator};

pub(super) struct Held {
    pub(super) class: ClassId,
    pub(super) payload: Bytes,
    pub(super) expires_at: Instant,
    /// We advertised it, so peers may request it from us (and a purge must tell them).
    pub(super) advertised: bool,
    /// This node published it.
    pub(super) local: bool,
    /// The peer it first came from (its upstream in the relay tree); `None` if published here.
    pub(super) from: Option<PeerId>,
}

impl<V: Validator> Gossip<V> {
    pub(super) fn pool_has_room(&self, len: usize) -> bool {
        self.pool.len() < self.config.max_pool_artifacts
            && self.pool_bytes + len as u64 <= self.config.max_pool_bytes
    }

    pub(super) fn store(
        &mut self,
        id: ArtifactId,
        class: ClassId,
        payload: Bytes,
        policy: ClassPolicy,
        now: Instant,
    ) {
        let expires_at = now + policy.expiry;
        self.note_for_repair(id, policy.relay, now);
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
                from: None,
            },
        );
    }

    pub(super) fn pool_expire(&mut self, id: ArtifactId, at: Instant, now: Instant) {
        if self.pool.get(&id).is_some_and(|held| held.expires_at == at) {
            self.remove_held(&id, now);
        }
    }

    pub(super) fn remove_held(&mut self, id: &ArtifactId, now: Instant) -> Option<Held> {
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

    pub(super) fn tombstone(&mut self, id: ArtifactId, until: Instant) {
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

    pub(super) fn is_tombstoned(&self, id: &ArtifactId, now: Instant) -> bool {
        self.tombstones.get(id).is_some_and(|until| *until > now)
    }
}
