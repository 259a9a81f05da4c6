//! Plan a quorum read or write over candidate peers: whom to ask, when to hedge, when to stop.
//!
//! # Design
//!
//! Zold's client fetched a wallet by asking nodes one after another, and judged a node slow only
//! after its call had returned (`seeds/002`): when most nodes were slow, every fetch waited on them.
//! This module never waits on a slow peer it can route around.
//!
//! Two pieces, both pure (time arrives as `now`, randomness as an injected [`RngCore`]):
//!
//! - [`PeerScores`] keeps, per peer, an EWMA of answer latency (`srtt`), of its deviation
//!   (`rttvar`, as TCP's RTO estimator, RFC 6298 §2) and of errors. A peer's *tail estimate* is
//!   `srtt + 4·rttvar`; its *score* (lower is better) adds `error_penalty · error_ewma`. Peers are
//!   ordered by score, ties broken at random. A peer never heard from gets a configured prior.
//!   A request cancelled at quorum leaves its peer a censored sample: the time it had already taken,
//!   if that is worse than its `srtt`, so peers that never answer in time sink in the ranking.
//!   Exploration: with probability `explore_probability` a plan also asks one random peer from
//!   outside the first choices, so a peer that recovered is measured again without delaying the read.
//! - [`QuorumPlan`] runs one request. The driver polls [`QuorumPlan::poll_ask`] for peers to ask,
//!   reports each answer or failure, and wakes at [`QuorumPlan::poll_timeout`]. Policies:
//!   - [`Policy::Sequential`] (Zold): one peer at a time in the given order; the next is asked when
//!     the current one answers, fails, or exceeds `attempt_timeout`.
//!   - [`Policy::ParallelAll`]: every candidate at once; done when all have answered or failed, or at
//!     the deadline.
//!   - [`Policy::Hedged`]: the best `fanout` peers at once (plus an exploration peer); when an
//!     in-flight peer is later than its tail estimate, or fails, the next-best peer is asked too,
//!     with at most `max_in_flight` requests out. Done as soon as `quorum` peers answered.
//!
//! Every policy is done by `deadline` after the start, whatever the peers do; the plan asks each
//! peer at most once, and the driver cancels whatever is still in flight when it is done.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, RngCore};

/// How a plan spreads a request over its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// One peer after another (Zold's behaviour).
    Sequential,
    /// Every candidate at once; wait for all of them or the deadline.
    ParallelAll,
    /// The best peers at once, hedging to the next-best when one is late; stop at quorum.
    Hedged,
}

impl Policy {
    /// The policy's name in scenario files and headers.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sequential => "sequential",
            Self::ParallelAll => "parallel-all",
            Self::Hedged => "hedged",
        }
    }
}

/// A policy name that is not one of `sequential`, `parallel-all`, `hedged`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuorumError {
    /// The policy name is unknown.
    #[error("unknown quorum policy {0:?} (sequential, parallel-all, hedged)")]
    UnknownPolicy(String),
    /// The settings cannot work.
    #[error("invalid quorum settings: {0}")]
    Invalid(&'static str),
}

impl std::str::FromStr for Policy {
    type Err = QuorumError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "sequential" => Ok(Self::Sequential),
            "parallel-all" => Ok(Self::ParallelAll),
            "hedged" => Ok(Self::Hedged),
            other => Err(QuorumError::UnknownPolicy(other.to_string())),
        }
    }
}

/// Settings of one quorum request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuorumConfig {
    /// How the request is spread.
    pub policy: Policy,
    /// Answers needed.
    pub quorum: usize,
    /// Peers asked at once when a hedged plan starts (at least `quorum`).
    pub fanout: usize,
    /// Most requests a hedged plan keeps in flight (at least `fanout`).
    pub max_in_flight: usize,
    /// The whole request, every attempt included, ends by then.
    pub deadline: Duration,
    /// How long a sequential plan waits for one peer before moving on.
    pub attempt_timeout: Duration,
}

impl QuorumConfig {
    /// Hedged defaults for `quorum` answers within `deadline`.
    pub fn hedged(quorum: usize, deadline: Duration) -> Self {
        Self {
            policy: Policy::Hedged,
            quorum,
            fanout: quorum,
            max_in_flight: quorum * 2,
            deadline,
            attempt_timeout: deadline,
        }
    }

    /// Checks that the settings fit together.
    pub fn validate(&self) -> Result<(), QuorumError> {
        if self.quorum == 0 {
            return Err(QuorumError::Invalid("quorum must be at least 1"));
        }
        if self.fanout < self.quorum || self.max_in_flight < self.fanout {
            return Err(QuorumError::Invalid(
                "need quorum <= fanout <= max_in_flight",
            ));
        }
        if self.deadline.is_zero() || self.attempt_timeout.is_zero() {
            return Err(QuorumError::Invalid("timeouts must be positive"));
        }
        Ok(())
    }
}

/// Settings of the peer ranking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreConfig {
    /// Weight of a new latency sample in the EWMA (RFC 6298 uses 1/8).
    pub alpha: f64,
    /// Weight of a new deviation sample (RFC 6298 uses 1/4).
    pub beta: f64,
    /// Weight of a new outcome in the error EWMA.
    pub error_alpha: f64,
    /// Latency assumed for a peer never heard from.
    pub prior_latency: Duration,
    /// Score added for a peer that always fails.
    pub error_penalty: Duration,
    /// Probability that a plan asks one extra random peer to re-measure it.
    pub explore_probability: f64,
    /// Peers tracked at most; others are ranked with the prior.
    pub max_peers: usize,
}

impl Default for ScoreConfig {
    fn default() -> Self {
        Self {
            alpha: 0.125,
            beta: 0.25,
            error_alpha: 0.2,
            prior_latency: Duration::from_millis(200),
            error_penalty: Duration::from_secs(5),
            explore_probability: 0.05,
            max_peers: 4096,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct PeerStats {
    srtt_ms: f64,
    rttvar_ms: f64,
    error: f64,
}

/// Per-peer latency and error estimates, and the ranking built on them.
#[derive(Debug, Clone)]
pub struct PeerScores<P> {
    config: ScoreConfig,
    peers: HashMap<P, PeerStats>,
}

impl<P: Copy + Eq + Hash + Ord> PeerScores<P> {
    /// An empty table.
    pub fn new(config: ScoreConfig) -> Self {
        Self {
            config,
            peers: HashMap::new(),
        }
    }

    /// The ranking settings.
    pub fn config(&self) -> &ScoreConfig {
        &self.config
    }

    fn entry(&mut self, peer: P, sample_ms: f64) -> Option<&mut PeerStats> {
        if !self.peers.contains_key(&peer) && self.peers.len() >= self.config.max_peers {
            return None;
        }
        Some(self.peers.entry(peer).or_insert(PeerStats {
            srtt_ms: sample_ms,
            rttvar_ms: sample_ms / 2.0,
            error: 0.0,
        }))
    }

    fn observe(&mut self, peer: P, sample: Duration, failed: bool) {
        let (alpha, beta, error_alpha) =
            (self.config.alpha, self.config.beta, self.config.error_alpha);
        let sample_ms = sample.as_secs_f64() * 1e3;
        if let Some(stats) = self.entry(peer, sample_ms) {
            stats.rttvar_ms =
                (1.0 - beta) * stats.rttvar_ms + beta * (stats.srtt_ms - sample_ms).abs();
            stats.srtt_ms = (1.0 - alpha) * stats.srtt_ms + alpha * sample_ms;
            let outcome = if failed { 1.0 } else { 0.0 };
            stats.error = (1.0 - error_alpha) * stats.error + error_alpha * outcome;
        }
    }

    /// `peer` answered after `latency`.
    pub fn record_success(&mut self, peer: P, latency: Duration) {
        self.observe(peer, latency, false);
    }

    /// `peer` failed after `elapsed` (an error or a timeout).
    pub fn record_failure(&mut self, peer: P, elapsed: Duration) {
        self.observe(peer, elapsed, true);
    }

    /// `peer` had not answered after `elapsed` when its request was cancelled. Only a sample worse
    /// than its current estimate is news: the true latency is at least `elapsed`.
    pub fn record_unanswered(&mut self, peer: P, elapsed: Duration) {
        if elapsed > self.expected_latency(peer) {
            let sample_ms = elapsed.as_secs_f64() * 1e3;
            let alpha = self.config.alpha;
            if let Some(stats) = self.entry(peer, sample_ms) {
                stats.rttvar_ms =
                    (1.0 - alpha) * stats.rttvar_ms + alpha * (stats.srtt_ms - sample_ms).abs();
                stats.srtt_ms = (1.0 - alpha) * stats.srtt_ms + alpha * sample_ms;
            }
        }
    }

    /// The smoothed latency of `peer`, or the prior.
    pub fn expected_latency(&self, peer: P) -> Duration {
        self.peers
            .get(&peer)
            .map_or(self.config.prior_latency, |stats| millis(stats.srtt_ms))
    }

    /// The tail estimate of `peer`: `srtt + 4·rttvar`, or the prior for a stranger.
    pub fn tail_latency(&self, peer: P) -> Duration {
        self.peers
            .get(&peer)
            .map_or(self.config.prior_latency, |stats| {
                millis(stats.srtt_ms + 4.0 * stats.rttvar_ms)
            })
    }

    /// The error EWMA of `peer` in `[0, 1]`.
    pub fn error_rate(&self, peer: P) -> f64 {
        self.peers.get(&peer).map_or(0.0, |stats| stats.error)
    }

    /// The ranking key of `peer` in milliseconds: lower is better.
    pub fn score_ms(&self, peer: P) -> f64 {
        let penalty_ms = self.config.error_penalty.as_secs_f64() * 1e3;
        match self.peers.get(&peer) {
            Some(stats) => stats.srtt_ms + stats.rttvar_ms + penalty_ms * stats.error,
            None => self.config.prior_latency.as_secs_f64() * 1e3,
        }
    }

    /// `candidates` best first, ties in random order, each with its hedge delay (tail estimate).
    pub fn rank(&self, candidates: &[P], rng: &mut impl RngCore) -> Vec<Candidate<P>> {
        let mut ranked: Vec<P> = candidates.to_vec();
        ranked.sort();
        ranked.dedup();
        ranked.shuffle(rng);
        ranked.sort_by(|a, b| self.score_ms(*a).total_cmp(&self.score_ms(*b)));
        ranked
            .into_iter()
            .map(|peer| Candidate {
                peer,
                hedge_after: self.tail_latency(peer),
            })
            .collect()
    }

    /// Builds the plan for one request: ranked candidates for a hedged plan (with an exploration
    /// peer drawn with `explore_probability`), the given order for the others.
    pub fn plan(
        &self,
        config: QuorumConfig,
        candidates: &[P],
        now: Instant,
        rng: &mut impl RngCore,
    ) -> Result<QuorumPlan<P>, QuorumError> {
        let ordered = match config.policy {
            Policy::Hedged => self.rank(candidates, rng),
            Policy::Sequential | Policy::ParallelAll => {
                let mut seen = std::collections::HashSet::new();
                candidates
                    .iter()
                    .filter(|peer| seen.insert(**peer))
                    .map(|peer| Candidate {
                        peer: *peer,
                        hedge_after: self.tail_latency(*peer),
                    })
                    .collect()
            }
        };
        let explore = config.policy == Policy::Hedged
            && ordered.len() > config.fanout
            && rng.random_bool(self.config.explore_probability.clamp(0.0, 1.0));
        let explore_index = explore.then(|| rng.random_range(config.fanout..ordered.len()));
        QuorumPlan::new(config, ordered, explore_index, now)
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_secs_f64((ms.max(0.0) / 1e3).min(1e9))
}

/// A peer a plan may ask, with how long to wait for it before hedging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<P> {
    /// The peer.
    pub peer: P,
    /// The hedge delay: ask another peer if this one has not answered by then.
    pub hedge_after: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Waiting,
    InFlight { sent: Instant, hedged: bool },
    Answered,
    Failed,
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
}

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
    config: QuorumConfig,
    started: Instant,
    candidates: Vec<Candidate<P>>,
    states: Vec<SlotState>,
    explore: Option<usize>,
    answers: usize,
    failed: usize,
    asked: usize,
    finished: Option<Finish>,
}

impl<P: Copy + Eq> QuorumPlan<P> {
    /// A plan over `candidates` in the order to try them; `explore` is the index of a peer a hedged
    /// plan asks at the start in addition to the first `fanout`.
    pub fn new(
        config: QuorumConfig,
        candidates: Vec<Candidate<P>>,
        explore: Option<usize>,
        now: Instant,
    ) -> Result<Self, QuorumError> {
        config.validate()?;
        let states = vec![SlotState::Waiting; candidates.len()];
        let mut plan = Self {
            config,
            started: now,
            candidates,
            states,
            explore: explore.filter(|_| config.policy == Policy::Hedged),
            answers: 0,
            failed: 0,
            asked: 0,
            finished: None,
        };
        if plan
            .explore
            .is_some_and(|index| index >= plan.candidates.len())
        {
            plan.explore = None;
        }
        plan.check_done(now);
        Ok(plan)
    }

    /// The settings.
    pub fn config(&self) -> &QuorumConfig {
        &self.config
    }

    /// When the plan started.
    pub fn started(&self) -> Instant {
        self.started
    }

    fn index_of(&self, peer: P) -> Option<usize> {
        self.candidates.iter().position(|c| c.peer == peer)
    }

    fn in_flight(&self) -> usize {
        self.states
            .iter()
            .filter(|state| matches!(state, SlotState::InFlight { .. }))
            .count()
    }

    /// Peers asked and not yet resolved (the driver cancels them when the plan is done).
    pub fn pending(&self) -> impl Iterator<Item = (P, Instant)> + '_ {
        self.candidates
            .iter()
            .zip(&self.states)
            .filter_map(|(candidate, state)| match state {
                SlotState::InFlight { sent, .. } => Some((candidate.peer, *sent)),
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
        if !matches!(self.states[index], SlotState::InFlight { .. }) {
            return;
        }
        self.states[index] = to;
        match to {
            SlotState::Answered => self.answers += 1,
            _ => self.failed += 1,
        }
        self.check_done(now);
    }

    fn deadline(&self) -> Instant {
        self.started + self.config.deadline
    }

    fn check_done(&mut self, now: Instant) {
        if self.finished.is_some() {
            return;
        }
        let unresolved = self
            .states
            .iter()
            .filter(|state| matches!(state, SlotState::Waiting | SlotState::InFlight { .. }))
            .count();
        self.finished =
            if self.config.policy != Policy::ParallelAll && self.answers >= self.config.quorum {
                Some(Finish::Quorum)
            } else if unresolved == 0 {
                Some(if self.answers >= self.config.quorum {
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

    /// Applies timeouts due at `now` (sequential attempts, hedges, the deadline).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.config.policy == Policy::Sequential {
            let timeout = self.config.attempt_timeout;
            for state in &mut self.states {
                if let SlotState::InFlight { sent, .. } = *state {
                    if now >= sent + timeout {
                        *state = SlotState::Failed;
                        self.failed += 1;
                    }
                }
            }
        }
        self.check_done(now);
    }

    fn next_waiting(&self) -> Option<usize> {
        self.states
            .iter()
            .position(|state| *state == SlotState::Waiting)
    }

    fn ask(&mut self, index: usize, now: Instant) -> P {
        self.states[index] = SlotState::InFlight {
            sent: now,
            hedged: false,
        };
        self.asked += 1;
        self.candidates[index].peer
    }

    /// The next peer to ask now, if any. Call until `None` after every event.
    pub fn poll_ask(&mut self, now: Instant) -> Option<P> {
        self.handle_timeout(now);
        if self.finished.is_some() {
            return None;
        }
        let in_flight = self.in_flight();
        match self.config.policy {
            Policy::Sequential => {
                if in_flight > 0 {
                    return None;
                }
                let index = self.next_waiting()?;
                Some(self.ask(index, now))
            }
            Policy::ParallelAll => {
                let index = self.next_waiting()?;
                Some(self.ask(index, now))
            }
            Policy::Hedged => self.poll_hedged(in_flight, now),
        }
    }

    fn poll_hedged(&mut self, in_flight: usize, now: Instant) -> Option<P> {
        // A late peer is hedged once: from now on it no longer counts as a live attempt, so the
        // rule below asks the next-best peer in its place.
        for (index, state) in self.states.iter_mut().enumerate() {
            if let SlotState::InFlight { sent, hedged } = state {
                if !*hedged && now >= *sent + self.candidates[index].hedge_after {
                    *hedged = true;
                }
            }
        }
        if in_flight >= self.config.max_in_flight {
            return None;
        }
        if let Some(index) = self.explore {
            if self.states[index] == SlotState::Waiting {
                return Some(self.ask(index, now));
            }
        }
        let next = self.next_waiting()?;
        if next < self.config.fanout {
            return Some(self.ask(next, now));
        }
        let live = self
            .states
            .iter()
            .filter(|state| matches!(state, SlotState::InFlight { hedged: false, .. }))
            .count();
        if live < self.config.quorum.saturating_sub(self.answers) {
            return Some(self.ask(next, now));
        }
        None
    }

    /// When the driver must call [`Self::poll_ask`] again if nothing else happens.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished.is_some() {
            return None;
        }
        let mut wake = self.deadline();
        for (index, state) in self.states.iter().enumerate() {
            if let SlotState::InFlight { sent, hedged } = *state {
                match self.config.policy {
                    Policy::Sequential => wake = wake.min(sent + self.config.attempt_timeout),
                    Policy::Hedged if !hedged => {
                        wake = wake.min(sent + self.candidates[index].hedge_after)
                    }
                    _ => {}
                }
            }
        }
        Some(wake)
    }

    /// How the plan ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        self.finished.map(|finish| Outcome {
            finish,
            answers: self.answers,
            asked: self.asked,
            failed: self.failed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    const MS: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn candidates(n: u32, hedge_after: Duration) -> Vec<Candidate<u32>> {
        (0..n).map(|peer| Candidate { peer, hedge_after }).collect()
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
    fn ranking_learns_slow_and_failing_peers_and_explores() {
        let mut scores = PeerScores::new(ScoreConfig {
            explore_probability: 1.0,
            ..ScoreConfig::default()
        });
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..20 {
            scores.record_success(0u32, ms(100));
            scores.record_success(1, ms(40));
            scores.record_failure(2, ms(5));
            scores.record_unanswered(3, ms(1500));
            scores.record_success(4, ms(60));
        }
        let ranked: Vec<u32> = scores
            .rank(&[0, 1, 2, 3, 4], &mut rng)
            .iter()
            .map(|c| c.peer)
            .collect();
        assert_eq!(ranked, vec![1, 4, 0, 3, 2]);
        assert!(scores.tail_latency(1) >= scores.expected_latency(1));
        let config = QuorumConfig {
            quorum: 2,
            fanout: 2,
            ..config(Policy::Hedged)
        };
        let t0 = Instant::now();
        let mut plan = scores.plan(config, &[0, 1, 2, 3, 4], t0, &mut rng).unwrap();
        let asked = drain(&mut plan, t0);
        assert_eq!(asked.len(), 3, "two best plus one exploration: {asked:?}");
        assert!(asked.contains(&1) && asked.contains(&4));
        // A recovered peer climbs back once measured again.
        for _ in 0..40 {
            scores.record_success(2, ms(10));
        }
        assert_eq!(scores.rank(&[0, 1, 2], &mut rng)[0].peer, 2);
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
                    Policy::Hedged => prop_assert!(in_flight <= config.max_in_flight),
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
    }
}
