//! How a plan spreads a request over its candidates: one implementation per [`Policy`](super::Policy).

use std::fmt::Debug;
use std::time::Instant;

use super::plan::Slots;

mod hedged;
mod parallel_all;
mod sequential;

pub(super) use hedged::Hedged;
pub(super) use parallel_all::ParallelAll;
pub(super) use sequential::Sequential;

/// The rules of one policy, applied by a [`QuorumPlan`](super::QuorumPlan) to its attempts.
pub(super) trait Spread: Debug + Send + Sync {
    /// Whether candidates are ranked by score (else tried in the order given).
    fn ranks_by_score(&self) -> bool;

    /// Whether a plan may ask one exploration peer beyond its first choices.
    fn explores(&self) -> bool;

    /// Whether the plan ends as soon as the quorum answered (else once every candidate resolved).
    fn ends_at_quorum(&self) -> bool;

    /// Gives up on attempts that are due at `now`, counting them as failed.
    fn expire(&self, slots: &mut Slots, now: Instant);

    /// The candidate to ask now, if any.
    fn next(&self, slots: &mut Slots, now: Instant) -> Option<usize>;

    /// When the attempt on candidate `index`, sent at `sent`, next needs the plan's attention.
    fn attention_at(
        &self,
        slots: &Slots,
        index: usize,
        sent: Instant,
        hedged: bool,
    ) -> Option<Instant>;
}
