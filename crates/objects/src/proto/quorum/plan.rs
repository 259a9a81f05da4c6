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
}

impl<P> Candidate<P> {
    /// A reachable peer, hedged after `hedge_after`, with nothing known of its timeliness.
    pub fn new(peer: P, hedge_after: Duration) -> Self {
        Self {
            peer,
            hedge_after,
            timely: 0.5,
            reachable: true,
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
            scores.record_late_success(peer, latency);
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
                scores.record_unanswered(self.peers[index], elapsed, late);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::quorum::{Policy, ScoreConfig};
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn candidates(n: u32, hedge_after: Duration) -> Vec<Candidate<u32>> {
        (0..n)
            .map(|peer| Candidate::new(peer, hedge_after))
            .collect()
    }

    fn config(policy: Policy) -> QuorumConfig {
        QuorumConfig {
            policy,
            quorum: 3,
            fanout: 3,
            max_in_flight: 6,
            deadline: ms(1000),
            attempt_timeout: ms(300),
        }
    }

    fn drain(plan: &mut QuorumPlan<u32>, now: Instant) -> Vec<u32> {
        std::iter::from_fn(|| plan.poll_ask(now)).collect()
    }

    #[test]
    fn sequential_asks_one_peer_at_a_time() {
        let t0 = Instant::now();
        let mut plan =
            QuorumPlan::new(config(Policy::Sequential), candidates(5, ms(50)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0]);
        plan.handle_answer(0, t0 + ms(10));
        assert_eq!(drain(&mut plan, t0 + ms(10)), vec![1]);
        // Peer 1 hangs: it is given up after the attempt timeout, not before.
        assert_eq!(plan.poll_timeout(), Some(t0 + ms(310)));
        assert!(drain(&mut plan, t0 + ms(300)).is_empty());
        assert_eq!(drain(&mut plan, t0 + ms(310)), vec![2]);
        plan.handle_answer(2, t0 + ms(320));
        assert_eq!(drain(&mut plan, t0 + ms(320)), vec![3]);
        plan.handle_answer(3, t0 + ms(330));
        let outcome = plan.outcome().unwrap();
        assert_eq!(outcome.finish, Finish::Quorum);
        assert_eq!((outcome.answers, outcome.asked, outcome.failed), (3, 4, 1));
    }

    #[test]
    fn parallel_all_waits_for_everyone() {
        let t0 = Instant::now();
        let mut plan =
            QuorumPlan::new(config(Policy::ParallelAll), candidates(4, ms(50)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0, 1, 2, 3]);
        for peer in 0..3 {
            plan.handle_answer(peer, t0 + ms(10));
        }
        assert!(
            plan.outcome().is_none(),
            "quorum alone does not end parallel-all"
        );
        plan.handle_timeout(t0 + ms(1000));
        let outcome = plan.outcome().unwrap();
        assert_eq!(outcome.finish, Finish::Deadline);
        assert!(outcome.reached(3));
    }

    #[test]
    fn hedged_asks_the_next_peer_when_one_is_late() {
        let t0 = Instant::now();
        let mut plan =
            QuorumPlan::new(config(Policy::Hedged), candidates(6, ms(50)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
        plan.handle_answer(0, t0 + ms(20));
        plan.handle_answer(1, t0 + ms(30));
        assert!(drain(&mut plan, t0 + ms(30)).is_empty());
        assert_eq!(plan.poll_timeout(), Some(t0 + ms(50)));
        assert_eq!(drain(&mut plan, t0 + ms(50)), vec![3]);
        plan.handle_answer(3, t0 + ms(70));
        let outcome = plan.outcome().unwrap();
        assert_eq!(outcome.finish, Finish::Quorum);
        assert_eq!(outcome.asked, 4);
        assert_eq!(
            plan.pending().map(|(peer, _)| peer).collect::<Vec<_>>(),
            vec![2]
        );
    }

    #[test]
    fn hedged_replaces_failures_at_once() {
        let t0 = Instant::now();
        let mut plan =
            QuorumPlan::new(config(Policy::Hedged), candidates(5, ms(500)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
        plan.handle_failure(1, t0 + ms(5));
        assert_eq!(drain(&mut plan, t0 + ms(5)), vec![3]);
        plan.handle_failure(3, t0 + ms(6));
        plan.handle_failure(0, t0 + ms(6));
        assert_eq!(drain(&mut plan, t0 + ms(6)), vec![4]);
        plan.handle_failure(2, t0 + ms(7));
        assert!(plan.outcome().is_none(), "peer 4 is still in flight");
        plan.handle_failure(4, t0 + ms(8));
        let outcome = plan.outcome().unwrap();
        assert_eq!(outcome.finish, Finish::Exhausted);
        assert!(!outcome.reached(3));
    }

    #[test]
    fn fewer_reachable_than_the_quorum_fails_at_once() {
        let t0 = Instant::now();
        let mut list = candidates(5, ms(50));
        for candidate in &mut list[2..] {
            candidate.reachable = false;
        }
        let mut plan = QuorumPlan::new(config(Policy::Hedged), list, None, t0).unwrap();
        assert!(drain(&mut plan, t0).is_empty());
        let outcome = plan.outcome().unwrap();
        assert_eq!(outcome.finish, Finish::Unreachable);
        assert_eq!((outcome.asked, outcome.reachable), (0, 2));
        assert_eq!(plan.poll_timeout(), None);
    }

    #[test]
    fn hedged_keeps_asking_when_every_attempt_out_is_late() {
        let t0 = Instant::now();
        let tight = QuorumConfig {
            quorum: 1,
            fanout: 1,
            max_in_flight: 1,
            ..config(Policy::Hedged)
        };
        let mut plan = QuorumPlan::new(tight, candidates(4, ms(50)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0]);
        assert_eq!(drain(&mut plan, t0 + ms(50)), vec![1]);
        assert_eq!(drain(&mut plan, t0 + ms(100)), vec![2]);
        // A late attempt's answer still counts.
        plan.handle_answer(0, t0 + ms(120));
        assert_eq!(plan.outcome().unwrap().finish, Finish::Quorum);
    }

    #[test]
    fn late_peers_are_reported_once_as_they_pass_their_hedge_delay() {
        let mut scores = PeerScores::new(ScoreConfig::default());
        let t0 = Instant::now();
        let mut plan =
            QuorumPlan::new(config(Policy::Hedged), candidates(6, ms(50)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
        plan.handle_answer(1, t0 + ms(10));
        assert_eq!(drain(&mut plan, t0 + ms(60)), vec![3, 4]);
        plan.report_late(t0 + ms(60), &mut scores);
        assert_eq!(scores.expected_latency(0), ms(60));
        assert!(scores.timely(0) < 0.5);
        plan.report_late(t0 + ms(70), &mut scores);
        assert_eq!(scores.expected_latency(0), ms(60), "reported once");
    }

    #[test]
    fn bad_settings_are_refused() {
        let t0 = Instant::now();
        let mut bad = config(Policy::Hedged);
        bad.fanout = 2;
        assert!(QuorumPlan::new(bad, candidates(3, MS), None, t0).is_err());
        assert!("fastest".parse::<Policy>().is_err());
        assert_eq!("parallel-all".parse::<Policy>(), Ok(Policy::ParallelAll));
    }

    fn snapshot(scores: &PeerScores<u32>, peers: u32) -> Vec<(Duration, Duration, f64)> {
        (0..peers)
            .map(|peer| {
                (
                    scores.expected_latency(peer),
                    scores.tail_latency(peer),
                    scores.error_rate(peer),
                )
            })
            .collect()
    }

    #[test]
    fn replies_score_the_time_since_the_peer_was_asked() {
        let prior = ScoreConfig::default().prior_latency;
        let mut scores = PeerScores::new(ScoreConfig::default());
        let t0 = Instant::now();
        let mut plan = QuorumPlan::new(
            QuorumConfig {
                quorum: 2,
                fanout: 3,
                ..config(Policy::Hedged)
            },
            candidates(5, ms(500)),
            None,
            t0,
        )
        .unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
        assert!(!plan.on_answer(4, t0 + ms(5), &mut scores), "never asked");
        assert_eq!(scores.expected_latency(4), prior);
        assert!(plan.on_answer(0, t0 + ms(20), &mut scores));
        assert_eq!(scores.expected_latency(0), ms(20));
        assert_eq!(scores.error_rate(0), 0.0);
        plan.on_failure(1, t0 + ms(30), &mut scores);
        assert_eq!(scores.expected_latency(1), ms(30));
        assert!(scores.error_rate(1) > 0.0);
        // Peer 2 still counts as live until its hedge delay; then peer 3 is asked in its place.
        assert!(drain(&mut plan, t0 + ms(30)).is_empty());
        assert_eq!(drain(&mut plan, t0 + ms(500)), vec![3]);
        assert!(plan.on_answer(3, t0 + ms(530), &mut scores));
        assert_eq!(scores.expected_latency(3), ms(30), "asked at 500 ms");
        assert_eq!(plan.outcome().map(|o| o.finish), Some(Finish::Quorum));
        // Peer 2 is still out: dropping it at 600 ms, later than the prior, is news.
        plan.cancel_pending(t0 + ms(600), &mut scores);
        assert_eq!(scores.expected_latency(2), ms(600));
        // Replies after the plan is done are not the driver's any more.
        let before = snapshot(&scores, 5);
        assert!(!plan.on_answer(2, t0 + ms(610), &mut scores));
        plan.on_failure(2, t0 + ms(620), &mut scores);
        assert_eq!(snapshot(&scores, 5), before);
    }

    #[test]
    fn a_reply_after_a_sequential_timeout_is_scored_but_not_counted() {
        let mut scores = PeerScores::new(ScoreConfig::default());
        let t0 = Instant::now();
        let mut plan =
            QuorumPlan::new(config(Policy::Sequential), candidates(5, ms(50)), None, t0).unwrap();
        assert_eq!(drain(&mut plan, t0), vec![0]);
        assert_eq!(drain(&mut plan, t0 + ms(300)), vec![1]);
        assert!(plan.on_answer(0, t0 + ms(350), &mut scores));
        assert_eq!(scores.expected_latency(0), ms(350));
        assert_eq!(plan.outcome(), None);
        assert_eq!(
            plan.pending().map(|(peer, _)| peer).collect::<Vec<_>>(),
            vec![1],
            "peer 0 was given up; only peer 1 is awaited"
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Advance(u16),
        Answer(u8),
        Fail(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u16..400).prop_map(Step::Advance),
            (0u8..12).prop_map(Step::Answer),
            (0u8..12).prop_map(Step::Fail),
        ]
    }

    fn policy() -> impl Strategy<Value = Policy> {
        prop_oneof![
            Just(Policy::Sequential),
            Just(Policy::ParallelAll),
            Just(Policy::Hedged)
        ]
    }

    proptest! {
        /// Whatever peers do: each is asked at most once, bounds hold, and the plan is done by
        /// the deadline with an outcome that matches what happened.
        #[test]
        fn plans_are_bounded_and_end_by_the_deadline(
            policy in policy(),
            n in 0u32..12,
            quorum in 1usize..5,
            extra_fanout in 0usize..3,
            hedge_ms in 1u64..300,
            explore in proptest::option::of(0usize..12),
            steps in proptest::collection::vec(step(), 0..60),
        ) {
            let config = QuorumConfig {
                policy,
                quorum,
                fanout: quorum + extra_fanout,
                max_in_flight: 2 * (quorum + extra_fanout),
                deadline: ms(1000),
                attempt_timeout: ms(200),
            };
            let t0 = Instant::now();
            let mut now = t0;
            let explore = explore.filter(|index| *index >= config.fanout);
            let mut plan = QuorumPlan::new(config, candidates(n, ms(hedge_ms)), explore, t0).unwrap();
            let mut asked = std::collections::HashSet::new();
            let mut answered = 0;
            for step in steps.into_iter().chain(std::iter::once(Step::Advance(1000))) {
                while let Some(peer) = plan.poll_ask(now) {
                    prop_assert!(asked.insert(peer), "peer {} asked twice", peer);
                    prop_assert!(now < t0 + config.deadline);
                }
                let in_flight = plan.pending().count();
                match policy {
                    Policy::Sequential => prop_assert!(in_flight <= 1),
                    Policy::Hedged => prop_assert!(plan.slots.live() <= config.max_in_flight),
                    Policy::ParallelAll => {}
                }
                if let Some(wake) = plan.poll_timeout() {
                    prop_assert!(wake <= t0 + config.deadline);
                }
                match step {
                    Step::Advance(step_ms) => now += ms(u64::from(step_ms)),
                    Step::Answer(peer) => {
                        let peer = u32::from(peer);
                        if plan.outcome().is_none() && plan.pending().any(|(p, _)| p == peer) {
                            answered += 1;
                        }
                        plan.handle_answer(peer, now);
                    }
                    Step::Fail(peer) => plan.handle_failure(u32::from(peer), now),
                }
            }
            plan.handle_timeout(now);
            let outcome = plan.outcome();
            prop_assert!(outcome.is_some(), "not done after the deadline");
            let outcome = outcome.unwrap();
            prop_assert_eq!(outcome.answers, answered);
            prop_assert_eq!(outcome.asked, asked.len());
            prop_assert!(outcome.answers + outcome.failed <= outcome.asked);
            if outcome.finish == Finish::Quorum {
                prop_assert!(outcome.reached(quorum));
            }
            if policy != Policy::ParallelAll && outcome.reached(quorum) {
                prop_assert_eq!(outcome.finish, Finish::Quorum);
                prop_assert_eq!(outcome.answers, quorum);
            }
        }

        /// The chance of quorum is the Poisson-binomial tail: checked against every outcome.
        #[test]
        fn chance_of_quorum_counts_every_outcome(
            timely in proptest::collection::vec(0.0f64..=1.0, 0..8),
            needed in 0usize..5,
        ) {
            let t0 = Instant::now();
            let list: Vec<Candidate<u32>> = timely
                .iter()
                .enumerate()
                .map(|(peer, p)| Candidate { timely: *p, ..Candidate::new(peer as u32, ms(50)) })
                .collect();
            let n = list.len();
            let open = QuorumConfig {
                quorum: 1,
                fanout: n.max(1),
                max_in_flight: n.max(1),
                ..config(Policy::ParallelAll)
            };
            let mut plan = QuorumPlan::new(open, list, None, t0).unwrap();
            drain(&mut plan, t0);
            let mut brute = 0.0;
            for mask in 0u32..(1 << n) {
                let mut p = 1.0;
                for (i, t) in timely.iter().enumerate() {
                    p *= if mask & (1 << i) != 0 { *t } else { 1.0 - t };
                }
                if mask.count_ones() as usize >= needed {
                    brute += p;
                }
            }
            let chance = plan.slots.chance_of_quorum(needed);
            prop_assert!((chance - brute).abs() < 1e-9, "{} vs {}", chance, brute);
        }

        /// When every asked peer answers at once, a hedged plan asks only the quorum (plus the
        /// exploration peer) and sequential asks exactly the quorum.
        #[test]
        fn fast_peers_cost_no_extra_requests(n in 3u32..12, quorum in 1usize..4, explore in any::<bool>()) {
            for policy in [Policy::Hedged, Policy::Sequential] {
                let config = QuorumConfig { policy, ..QuorumConfig::hedged(quorum, ms(1000)) };
                let t0 = Instant::now();
                let explore_index = (explore && (n as usize) > quorum).then_some(n as usize - 1);
                let mut plan = QuorumPlan::new(config, candidates(n, ms(50)), explore_index, t0).unwrap();
                while plan.outcome().is_none() {
                    let asked = drain(&mut plan, t0);
                    prop_assert!(!asked.is_empty());
                    for peer in asked {
                        plan.handle_answer(peer, t0 + MS);
                    }
                }
                let outcome = plan.outcome().unwrap();
                let extra = usize::from(policy == Policy::Hedged && explore_index.is_some());
                prop_assert!(outcome.asked <= quorum + extra);
                prop_assert!(outcome.reached(quorum));
            }
        }
        /// Whatever peers do, the scores hear only about peers the plan asked, only while it
        /// runs, and failures raise a peer's error rate while answers never do.
        #[test]
        fn scores_follow_replies_of_asked_peers_while_the_plan_runs(
            policy in policy(),
            n in 1u32..10,
            quorum in 1usize..4,
            steps in proptest::collection::vec(step(), 0..60),
        ) {
            let config = QuorumConfig { policy, ..QuorumConfig::hedged(quorum, ms(1000)) };
            let mut scores = PeerScores::new(ScoreConfig::default());
            let t0 = Instant::now();
            let mut now = t0;
            let mut plan = QuorumPlan::new(config, candidates(n, ms(50)), None, t0).unwrap();
            let mut asked = std::collections::HashSet::new();
            let mut failed = std::collections::HashSet::new();
            let mut kept = 0;
            for step in steps {
                asked.extend(std::iter::from_fn(|| plan.poll_ask(now)));
                let before = snapshot(&scores, 12);
                let done = plan.outcome().is_some();
                match step {
                    Step::Advance(step_ms) => now += ms(u64::from(step_ms)),
                    Step::Answer(peer) => {
                        let peer = u32::from(peer);
                        let keep = plan.on_answer(peer, now, &mut scores);
                        prop_assert_eq!(keep, !done && asked.contains(&peer));
                        kept += usize::from(keep);
                    }
                    Step::Fail(peer) => {
                        let peer = u32::from(peer);
                        plan.on_failure(peer, now, &mut scores);
                        if !done && asked.contains(&peer) {
                            failed.insert(peer);
                            prop_assert!(scores.error_rate(peer) > 0.0);
                        }
                    }
                }
                if done {
                    prop_assert_eq!(snapshot(&scores, 12), before);
                }
            }
            plan.handle_timeout(now + ms(1000));
            plan.cancel_pending(now + ms(1000), &mut scores);
            let prior = ScoreConfig::default().prior_latency;
            for peer in 0..12u32 {
                if !asked.contains(&peer) {
                    prop_assert_eq!(scores.expected_latency(peer), prior);
                    prop_assert_eq!(scores.error_rate(peer), 0.0);
                }
                if !failed.contains(&peer) {
                    prop_assert_eq!(scores.error_rate(peer), 0.0);
                }
            }
            let outcome = plan.outcome().unwrap();
            prop_assert!(outcome.answers <= kept);
        }
    }
}
