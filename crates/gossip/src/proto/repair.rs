//! Periodic repair: every `repair_interval` a node sends one peer, chosen afresh each time, an
//! ihave of every `Relay::All` artifact it stored in the last `repair_window`.
//!
//! A relayed artifact reaches a node by its publisher's copy, its eager relays and a few ihaves,
//! each sent once. The transport retransmits lost packets, but a batch can still be lost whole
//! (a full send queue, a connection that drops), and a node whose copy and every ihave were lost
//! would otherwise learn of the artifact only at its next reconnect. With repair it hears of it
//! again from about `repair_window / repair_interval` peers within the window, and pulls it. A
//! peer that holds an artifact answers its ihave with nothing, so repair costs each node about
//! `repair_window / repair_interval` ihaves (38 B) per artifact, whatever the peer count: 2 by
//! default. That is insurance sized for a transport that retransmits (QUIC), where a batch is
//! lost only rarely. It holds at 10% whole-batch loss too: with it (and a lost request sent
//! again) no node missed an artifact in 20 seeds of
//! `relayed_artifacts_arrive_under_10_percent_loss_and_after_a_healed_partition`; without it,
//! in 2 of 20.
//!
//! Where a batch was lost is sometimes known: the driver is told when a peer's send queue
//! refused one ([`Gossip::handle_send_refused`]). That peer then gets the next repair as well
//! as the tick's random peer.

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use meshwire_proto::PeerId;

use super::{codec, tree::rank, ArtifactId, ClassId, Gossip, Item, Relay, Timer, Validator};

/// The artifacts a node stored recently, oldest first, and when it next sends a repair.
#[derive(Default)]
pub(super) struct Repair {
    recent: VecDeque<(Instant, ArtifactId)>,
    turn: u64,
    armed: Option<Instant>,
    /// Peers that refused a batch since the last repair: they get the next one.
    refused: BTreeSet<PeerId>,
    /// Batches reported refused.
    refusals: u64,
}

impl Repair {
    pub(super) fn len(&self) -> usize {
        self.recent.len() + self.refused.len()
    }
}

/// The timer id of the repair tick (timers are keyed by an artifact id).
const REPAIR_TIMER_ID: ArtifactId = ArtifactId([0; 32]);

impl<V: Validator> Gossip<V> {
    fn repairs(&self) -> bool {
        !self.config.relay_to_all && !self.config.repair_interval.is_zero()
    }

    /// A batch for `peer` was not sent (its send queue refused it, or the connection was gone):
    /// `peer` gets the next repair, an ihave of every recent `Relay::All` artifact. Call it
    /// for each peer a [`Transmit`](super::Transmit) could not be handed to.
    pub fn handle_send_refused(&mut self, peer: PeerId, now: Instant) {
        self.repair.refusals += 1;
        if !self.repairs() || !self.peers.contains_key(&peer) {
            return;
        }
        self.repair.refused.insert(peer);
        self.arm_repair(now);
    }

    /// `peer` is gone: it waits for no repair.
    pub(super) fn repair_peer_down(&mut self, peer: &PeerId) {
        self.repair.refused.remove(peer);
    }

    /// Batches reported refused by [`Gossip::handle_send_refused`].
    pub fn send_refusals(&self) -> u64 {
        self.repair.refusals
    }

    fn arm_repair(&mut self, now: Instant) {
        if self.repair.armed.is_none() && !self.repair.recent.is_empty() {
            let at = now + self.config.repair_interval;
            self.repair.armed = Some(at);
            self.timers.insert((at, Timer::Repair, REPAIR_TIMER_ID));
        }
    }

    /// Remembers a stored `Relay::All` artifact for the repairs of the next `repair_window`.
    pub(super) fn note_for_repair(&mut self, id: ArtifactId, relay: Relay, now: Instant) {
        if relay != Relay::All || !self.repairs() {
            return;
        }
        let repair = &mut self.repair;
        repair.recent.push_back((now, id));
        while repair.recent.len() > self.config.max_pool_artifacts {
            repair.recent.pop_front();
        }
        self.arm_repair(now);
    }

    /// The repair tick: ihaves of the recent artifacts to one peer and to every peer that
    /// refused a batch since the last tick, then the next tick if any artifact is still recent.
    pub(super) fn repair_tick(&mut self, now: Instant) {
        self.repair.armed = None;
        let window = self.config.repair_window;
        while let Some(&(at, _)) = self.repair.recent.front() {
            if at + window > now {
                break;
            }
            self.repair.recent.pop_front();
        }
        let refused = std::mem::take(&mut self.repair.refused);
        if self.repair.recent.is_empty() {
            return;
        }
        self.repair.turn += 1;
        let turn = self.repair.turn.to_le_bytes();
        let target: Option<PeerId> = self
            .peers
            .keys()
            .min_by_key(|peer| rank(&self.salt, &turn, peer))
            .copied();
        let targets: BTreeSet<PeerId> = target.into_iter().chain(refused).collect();
        for peer in targets {
            // The peer it came from holds it.
            let offers: Vec<(ClassId, Item)> = self
                .repair
                .recent
                .iter()
                .filter_map(|(_, id)| self.pool.get(id).map(|held| (id, held)))
                .filter(|(_, held)| held.from != Some(peer))
                .map(|(id, held)| {
                    let size = held.payload.len() as u32;
                    let class = held.class;
                    (
                        class,
                        Item::IHave {
                            class,
                            id: *id,
                            size,
                        },
                    )
                })
                .collect();
            let mut sent = false;
            for (class, item) in offers {
                if self.queue_relay(peer, class, item) {
                    sent = true;
                    let stats = self.stats.entry(class).or_default();
                    stats.adverts_sent += 1;
                    stats.ihaves_sent += 1;
                    stats.repair_ihaves_sent += 1;
                    stats.bytes_sent += codec::ADVERT_LEN as u64;
                }
            }
            if sent {
                self.schedule_flush(now, false);
            }
        }
        let at = now + self.config.repair_interval;
        self.repair.armed = Some(at);
        self.timers.insert((at, Timer::Repair, REPAIR_TIMER_ID));
    }
}
