//! The best peers at once, more of them while they are uncertain, hedging to the next-best when
//! one is late or fails; done at quorum.

use std::time::Instant;

use super::Spread;
use crate::proto::quorum::plan::{SlotState, Slots, CONFIDENCE};

/// The best `fanout` peers (plus an exploration peer), then, while the chance that the attempts in
/// flight reach quorum in time is below [`CONFIDENCE`], the next-best too (at most `spare` of
/// those); the next-best asked for each late or failed one; at most `max_in_flight` attempts out
/// that are not late. A late attempt still counts if it answers, but no longer holds a place:
/// when every attempt out is late, the plan keeps asking rather than wait on them, as long as
/// someone left can answer in time. Peers with no such chance (overdue on a request already out,
/// or unreachable) are asked only to keep the answers still needed out at all: asking more of
/// them than that buys no earlier answer, only requests.
#[derive(Debug, Clone, Copy)]
pub(in crate::proto::quorum) struct Hedged;

impl Spread for Hedged {
    fn ranks_by_score(&self) -> bool {
        true
    }

    fn explores(&self) -> bool {
        true
    }

    fn ends_at_quorum(&self) -> bool {
        true
    }

    fn expire(&self, _slots: &mut Slots, _now: Instant) {}

    fn next(&self, slots: &mut Slots, now: Instant) -> Option<usize> {
        // A late peer is hedged once: from now on it no longer counts as a live attempt, so the
        // rules below ask the next-best peer in its place.
        for (index, state) in slots.states.iter_mut().enumerate() {
            if let SlotState::InFlight { sent, hedged } = state {
                if !*hedged && now >= *sent + slots.hedge_after[index] {
                    *hedged = true;
                    slots.newly_late.push(index);
                }
            }
        }
        let live = slots.live();
        if live >= slots.config.max_in_flight {
            return None;
        }
        if let Some(index) = slots.explore {
            if slots.states[index] == SlotState::Waiting {
                return Some(index);
            }
        }
        let next = slots.next_waiting()?;
        if next < slots.config.fanout {
            return Some(next);
        }
        let needed = slots.config.quorum.saturating_sub(slots.answers);
        if live < needed {
            // A peer with no chance of answering in time (overdue on a request already out, or
            // unreachable) is no better than the late attempts out: it is asked only while
            // fewer than `needed` attempts are out at all, and a peer with a chance further
            // down the ranking goes first.
            if !slots.hopeless[next] || slots.in_flight() < needed {
                return Some(next);
            }
            return slots.next_waiting_with_chance();
        }
        if slots.spare > 0 && slots.chance_of_quorum(needed) < CONFIDENCE {
            // An extra first ask is there to raise that chance: only a peer that can answer in
            // time does.
            let extra = slots.next_waiting_with_chance()?;
            slots.spare -= 1;
            return Some(extra);
        }
        None
    }

    fn attention_at(
        &self,
        slots: &Slots,
        index: usize,
        sent: Instant,
        hedged: bool,
    ) -> Option<Instant> {
        (!hedged).then(|| sent + slots.hedge_after[index])
    }
}
