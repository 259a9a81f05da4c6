//! Zold's policy: one peer at a time in the given order, the next when the current one resolves or times out.

use std::time::Instant;

use super::Spread;
use crate::proto::quorum::plan::{SlotState, Slots};

/// One peer after another; an attempt is given up after `attempt_timeout`.
#[derive(Debug, Clone, Copy)]
pub(in crate::proto::quorum) struct Sequential;

impl Spread for Sequential {
    fn ranks_by_score(&self) -> bool {
        false
    }

    fn explores(&self) -> bool {
        false
    }

    fn ends_at_quorum(&self) -> bool {
        true
    }

    fn expire(&self, slots: &mut Slots, now: Instant) {
        let timeout = slots.config.attempt_timeout;
        for state in &mut slots.states {
            if let SlotState::InFlight { sent, .. } = *state {
                if now >= sent + timeout {
                    *state = SlotState::Failed;
                    slots.failed += 1;
                }
            }
        }
    }

    fn next(&self, slots: &mut Slots, _now: Instant) -> Option<usize> {
        if slots.in_flight() > 0 {
            return None;
        }
        slots.next_waiting()
    }

    fn attention_at(
        &self,
        slots: &Slots,
        _index: usize,
        sent: Instant,
        _hedged: bool,
    ) -> Option<Instant> {
        Some(sent + slots.config.attempt_timeout)
    }
}
