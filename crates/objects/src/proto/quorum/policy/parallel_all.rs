//! Every candidate at once; the plan waits for all of them or the deadline.

use std::time::Instant;

use super::Spread;
use crate::proto::quorum::plan::Slots;

/// Every candidate asked at once; done when all resolved or at the deadline.
#[derive(Debug, Clone, Copy)]
pub(in crate::proto::quorum) struct ParallelAll;

impl Spread for ParallelAll {
    fn ranks_by_score(&self) -> bool {
        false
    }

    fn explores(&self) -> bool {
        false
    }

    fn ends_at_quorum(&self) -> bool {
        false
    }

    fn expire(&self, _slots: &mut Slots, _now: Instant) {}

    fn next(&self, slots: &mut Slots, _now: Instant) -> Option<usize> {
        slots.next_waiting()
    }

    fn attention_at(
        &self,
        _slots: &Slots,
        _index: usize,
        _sent: Instant,
        _hedged: bool,
    ) -> Option<Instant> {
        None
    }
}
