//! One quorum request in progress: whom to ask next, when to wake, when it is done.

use std::hash::Hash;
use std::time::{Duration, Instant};

use super::policy::Spread;
use super::{PeerScores, QuorumConfig, QuorumError};

/// A peer a plan may ask, with how long to wait for it before hedging.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<P> {
    /// The peer.
    pub peer: P,
    /// The hedge delay: ask another peer if this one has not answered by then.
    pub hedge_after: Duration,
    /// The probability that it answers by its hedge delay.
    pub timely: f64,
    /// Whether the transport can reach it now.
    pub reachable: bool,
    /// Whether a request to it is already out past its hedge delay: a new one would queue
    /// behind that and cannot answer in time either.
    pub overdue: bool,
}

impl<P> Candidate<P> {
    /// A reachable peer, hedged after `hedge_after`, with nothing known of its timeliness.
    pub fn new(peer: P, hedge_after: Duration) -> Self {
        Self {
            peer,
            hedge_after,
            timely: 0.5,
            reachable: true,
            overdue: false,
        }
    }
}

/// Where one candidate's attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    /// Not asked yet.
    Waiting,
    /// Asked at `sent`; `hedged` once another peer was asked because this one is late.
    InFlight { sent: Instant, hedged: bool },
    /// Answered.
    Answered,
    /// Failed, or given up on.
    Failed,
}

/// A plan's attempts, apart from who the peers are: what its policy decides on.
#[derive(Debug, Clone)]
pub(super) struct Slots {
    /// The request's settings.
    pub(super) config: QuorumConfig,
    /// Each candidate's hedge delay.
    pub(super) hedge_after: Vec<Duration>,
    /// Each candidate's probability of answering by its hedge delay.
    pub(super) timely: Vec<f64>,
    /// Candidates with no chance of answering in time: overdue on a request already out, or
    /// unreachable. (A timeliness of 0 from the lateness history alone is not that: one late
    /// answer is no proof the next one is late too.)
    pub(super) hopeless: Vec<bool>,
    /// Extra first asks (beyond `fanout`) the plan may still make for uncertain peers.
    pub(super) spare: usize,
    /// Candidates that became late since the driver last collected them.
    pub(super) newly_late: Vec<usize>,
    /// Each candidate's attempt.
    pub(super) states: Vec<SlotState>,
    /// The candidate asked at the start beyond the first choices, if any.
    pub(super) explore: Option<usize>,
    /// Answers counted.
    pub(super) answers: usize,
    /// Failures counted.
    pub(super) failed: usize,
}

impl Slots {
    /// Attempts in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.states
            .iter()
            .filter(|state| matches!(state, SlotState::InFlight { .. }))
            .count()
    }

    /// Attempts in flight that are not late.
    pub(super) fn live(&self) -> usize {
        self.states
            .iter()
            .filter(|state| matches!(state, SlotState::InFlight { hedged: false, .. }))
            .count()
    }

    /// The first candidate not asked yet.
    pub(super) fn next_waiting(&self) -> Option<usize> {
        self.states
            .iter()
            .position(|state| *state == SlotState::Waiting)
    }

    /// The first candidate not asked yet with some chance of answering in time.
    pub(super) fn next_waiting_with_chance(&self) -> Option<usize> {
        self.states
            .iter()
            .zip(&self.hopeless)
            .position(|(state, hopeless)| *state == SlotState::Waiting && !*hopeless)
    }

    /// The probability that at least `needed` of the attempts in flight and not yet late answer
    /// in time, each independently with its candidate's timeliness (a Poisson-binomial tail).
    pub(super) fn chance_of_quorum(&self, needed: usize) -> f64 {
        if needed == 0 {
            return 1.0;
        }
        // at_least[k]: probability of at least k timely answers among the attempts seen so far,
        // for k < needed; at_least[needed] folds in "needed or more".
        let mut exactly = vec![0.0; needed + 1];
        exactly[0] = 1.0;
        for (index, state) in self.states.iter().enumerate() {
            if !matches!(state, SlotState::InFlight { hedged: false, .. }) {
                continue;
            }
            let p = self.timely[index].clamp(0.0, 1.0);
            for k in (0..=needed).rev() {
                let stay = exactly[k] * (1.0 - p);
                let from_below = if k > 0 { exactly[k - 1] * p } else { 0.0 };
                // The top bucket keeps everything that reached it.
                exactly[k] = if k == needed {
                    exactly[k] + from_below
                } else {
                    stay + from_below
                };
            }
        }
        exactly[needed]
    }
}

/// Why a plan finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Enough answers (for `parallel-all`: every candidate resolved with a quorum among them).
    Quorum,
    /// Every candidate answered or failed without reaching quorum.
    Exhausted,
    /// The deadline passed.
    Deadline,
    /// Fewer than the quorum were reachable at the start: failed at once.
    Unreachable,
}

/// The chance a hedged plan aims for that its first asks alone reach quorum in time: the
/// requests' own p99, so that the 99th percentile of latency is set by answers, not by hedges.
pub const CONFIDENCE: f64 = 0.99;

/// How a finished plan went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Why it finished.
    pub finish: Finish,
    /// Answers received.
    pub answers: usize,
    /// Peers asked.
    pub asked: usize,
    /// Peers that failed or timed out.
    pub failed: usize,
    /// Peers the plan could reach when it started.
    pub reachable: usize,
}

impl Outcome {
    /// Whether at least the quorum answered.
    pub fn reached(&self, quorum: usize) -> bool {
        self.answers >= quorum
    }
}

/// One quorum request in progress. See the module docs for the protocol.
#[derive(Debug, Clone)]
pub struct QuorumPlan<P> {
    spread: &'static dyn Spread,
    started: Instant,
    peers: Vec<P>,
    slots: Slots,
    /// When each candidate was asked; kept after it resolves, for the latency of a late reply.
    asked_at: Vec<Option<Instant>>,
    asked: usize,
    reachable: usize,
    finished: Option<Finish>,
}

impl<P: Copy + Eq> QuorumPlan<P> {
    /// A plan over `candidates` in the order to try them; `explore` is the index of a peer a hedged
    /// plan asks at the start in addition to the first `fanout`. When fewer than `quorum`
    /// candidates are reachable the plan is done at once ([`Finish::Unreachable`]): no answer can
    /// make it, so nobody waits for the deadline.
    pub fn new(
        config: QuorumConfig,
        candidates: Vec<Candidate<P>>,
        explore: Option<usize>,
        now: Instant,
    ) -> Result<Self, QuorumError> {
        config.validate()?;
        let spread = config.policy.spread();
        let count = candidates.len();
        let explore = explore.filter(|index| spread.explores() && *index < count);
        let reachable = candidates.iter().filter(|c| c.reachable).count();
        let timely = candidates.iter().map(|c| c.timely).collect();
        let hopeless = candidates
            .iter()
            .map(|c| c.overdue || !c.reachable)
            .collect();
        let (peers, hedge_after) = candidates
            .into_iter()
            .map(|candidate| (candidate.peer, candidate.hedge_after))
            .unzip();
        let mut plan = Self {
            spread,
            started: now,
            peers,
            slots: Slots {
                config,
                hedge_after,
                timely,
                hopeless,
                spare: 0,
                newly_late: Vec::new(),
                states: vec![SlotState::Waiting; count],
                explore,
                answers: 0,
                failed: 0,
            },
            asked_at: vec![None; count],
            asked: 0,
            reachable,
            finished: None,
        };
        if reachable < config.quorum {
            plan.finished = Some(Finish::Unreachable);
        }
        plan.check_done(now);
        Ok(plan)
    }

    /// Lets a hedged plan ask up to `spare` peers beyond its `fanout` at the start, while the
    /// chance that the first asks reach quorum in time is below [`CONFIDENCE`].
    pub fn with_spare(mut self, spare: usize) -> Self {
        self.slots.spare = spare;
        self
    }

    /// Peers asked so far.
    pub fn asked(&self) -> usize {
        self.asked
    }

    /// The settings.
    pub fn config(&self) -> &QuorumConfig {
        &self.slots.config
    }

    /// When the plan started.
    pub fn started(&self) -> Instant {
        self.started
    }

    fn index_of(&self, peer: P) -> Option<usize> {
        self.peers.iter().position(|p| *p == peer)
    }

    /// Peers asked and not yet resolved (the driver cancels them when the plan is done).
    pub fn pending(&self) -> impl Iterator<Item = (P, Instant)> + '_ {
        self.peers
            .iter()
            .zip(&self.slots.states)
            .filter_map(|(peer, state)| match state {
                SlotState::InFlight { sent, .. } => Some((*peer, *sent)),
                _ => None,
            })
    }

    /// `peer` answered. Answers from peers not in flight are ignored.
    pub fn handle_answer(&mut self, peer: P, now: Instant) {
        self.resolve(peer, SlotState::Answered, now);
    }

    /// `peer` failed (an error, a refusal, a broken connection).
    pub fn handle_failure(&mut self, peer: P, now: Instant) {
        self.resolve(peer, SlotState::Failed, now);
    }

    fn resolve(&mut self, peer: P, to: SlotState, now: Instant) {
        if self.finished.is_some() {
            return;
        }
        let Some(index) = self.index_of(peer) else {
            return;
        };
        if !matches!(self.slots.states[index], SlotState::InFlight { .. }) {
            return;
        }
        self.slots.states[index] = to;
        match to {
            SlotState::Answered => self.slots.answers += 1,
            _ => self.slots.failed += 1,
        }
        self.check_done(now);
    }

    fn deadline(&self) -> Instant {
        self.started + self.slots.config.deadline
    }

    fn check_done(&mut self, now: Instant) {
        if self.finished.is_some() {
            return;
        }
        let slots = &self.slots;
        let unresolved = slots
            .states
            .iter()
            .filter(|state| matches!(state, SlotState::Waiting | SlotState::InFlight { .. }))
            .count();
        let reached = slots.answers >= slots.config.quorum;
        self.finished = if self.spread.ends_at_quorum() && reached {
            Some(Finish::Quorum)
        } else if unresolved == 0 {
            Some(if reached {
                Finish::Quorum
            } else {
                Finish::Exhausted
            })
        } else if now >= self.deadline() {
            Some(Finish::Deadline)
        } else {
            None
        };
    }

    /// Applies timeouts due at `now` (sequential attempts, the deadline).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.spread.expire(&mut self.slots, now);
        self.check_done(now);
    }

    fn ask(&mut self, index: usize, now: Instant) -> P {
        self.slots.states[index] = SlotState::InFlight {
            sent: now,
            hedged: false,
        };
        self.asked_at[index] = Some(now);
        self.asked += 1;
        self.peers[index]
    }

    /// The next peer to ask now, if any. Call until `None` after every event.
    pub fn poll_ask(&mut self, now: Instant) -> Option<P> {
        self.handle_timeout(now);
        if self.finished.is_some() {
            return None;
        }
        let index = self.spread.next(&mut self.slots, now)?;
        Some(self.ask(index, now))
    }

    /// When the driver must call [`Self::poll_ask`] again if nothing else happens.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished.is_some() {
            return None;
        }
        let wake = self
            .slots
            .states
            .iter()
            .enumerate()
            .filter_map(|(index, state)| match *state {
                SlotState::InFlight { sent, hedged } => {
                    self.spread.attention_at(&self.slots, index, sent, hedged)
                }
                _ => None,
            })
            .fold(self.deadline(), Instant::min);
        Some(wake)
    }

    /// How the plan ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        self.finished.map(|finish| Outcome {
            finish,
            answers: self.slots.answers,
            asked: self.asked,
            failed: self.slots.failed,
            reachable: self.reachable,
        })
    }
}

impl<P: Copy + Eq + Hash + Ord> QuorumPlan<P> {
    fn asked_at_of(&self, peer: P) -> Option<Instant> {
        self.index_of(peer).and_then(|index| self.asked_at[index])
    }

    /// `peer` answered at `now`. While the plan runs, the time since the plan asked it goes into
    /// `scores` and the answer counts toward the quorum if the plan still waits for it (a
    /// sequential attempt past its timeout no longer counts, but its latency still informs the
    /// ranking). Returns whether the driver keeps the answer: not for a peer never asked, nor once
    /// the plan is done (the driver has stopped listening then).
    pub fn on_answer(&mut self, peer: P, now: Instant, scores: &mut PeerScores<P>) -> bool {
        if self.finished.is_some() {
            return false;
        }
        let Some(index) = self.index_of(peer) else {
            return false;
        };
        let Some(asked) = self.asked_at[index] else {
            return false;
        };
        let latency = now.saturating_duration_since(asked);
        if latency > self.slots.hedge_after[index] {
            scores.record_late_success(peer, asked, latency);
        } else {
            scores.record_success(peer, latency);
        }
        self.handle_answer(peer, now);
        true
    }

    /// `peer` failed at `now` (an error, a refusal, a broken connection). While the plan runs, the
    /// time since the plan asked it goes into `scores` as a failure, and the plan stops waiting for
    /// it. Replies of peers never asked, or after the plan is done, change nothing.
    pub fn on_failure(&mut self, peer: P, now: Instant, scores: &mut PeerScores<P>) {
        if self.finished.is_some() {
            return;
        }
        let Some(asked) = self.asked_at_of(peer) else {
            return;
        };
        scores.record_failure(peer, now.saturating_duration_since(asked));
        self.handle_failure(peer, now);
    }

    /// Tells `scores` at once about peers that passed their hedge delay since the last call, so
    /// that plans starting meanwhile rank them by what is known now. Call after every event.
    pub fn report_late(&mut self, now: Instant, scores: &mut PeerScores<P>) {
        for index in std::mem::take(&mut self.slots.newly_late) {
            if let Some(sent) = self.asked_at[index] {
                scores.record_unanswered(
                    self.peers[index],
                    sent,
                    now.saturating_duration_since(sent),
                    true,
                );
            }
        }
    }

    /// The requests still in flight, each with when it was sent and when it is due (its hedge
    /// delay after that): a driver that follows them up after the plan is done reports each
    /// with [`PeerScores::record_follow_up`], so every peer asked gets an outcome, not only the
    /// fast ones.
    pub fn pending_due(&self) -> Vec<(P, Instant, Instant)> {
        self.slots
            .states
            .iter()
            .enumerate()
            .filter_map(|(index, state)| match state {
                SlotState::InFlight { sent, .. } => Some((
                    self.peers[index],
                    *sent,
                    *sent + self.slots.hedge_after[index],
                )),
                _ => None,
            })
            .collect()
    }

    /// The driver drops the requests still in flight at `now`: each of those peers gets the time it
    /// had taken so far as a censored sample ([`PeerScores::record_unanswered`]), late if it had
    /// passed its hedge delay.
    pub fn cancel_pending(&self, now: Instant, scores: &mut PeerScores<P>) {
        for (index, state) in self.slots.states.iter().enumerate() {
            if let SlotState::InFlight { sent, .. } = state {
                let elapsed = now.saturating_duration_since(*sent);
                let late = elapsed > self.slots.hedge_after[index];
                scores.record_unanswered(self.peers[index], *sent, elapsed, late);
            }
        }
    }
}

#[cfg(test)]
mod tests;
