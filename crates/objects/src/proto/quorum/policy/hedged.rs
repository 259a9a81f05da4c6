//! The best peers at once, hedging to the next-best when one is late or fails; done at quorum.

use std::time::Instant;

use super::Spread;
use crate::proto::quorum::plan::{SlotState, Slots};

/// The best `fanout` peers (plus an exploration peer), the next-best asked for each late or failed
/// one, at most `max_in_flight` out.
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
        let in_flight = slots.in_flight();
        // A late peer is hedged once: from now on it no longer counts as a live attempt, so the
        // rule below asks the next-best peer in its place.
        for (index, state) in slots.states.iter_mut().enumerate() {
            if let SlotState::InFlight { sent, hedged } = state {
                if !*hedged && now >= *sent + slots.hedge_after[index] {
                    *hedged = true;
                }
            }
        }
        if in_flight >= slots.config.max_in_flight {
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
        let live = slots
            .states
            .iter()
            .filter(|state| matches!(state, SlotState::InFlight { hedged: false, .. }))
            .count();
        (live < slots.config.quorum.saturating_sub(slots.answers)).then_some(next)
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
