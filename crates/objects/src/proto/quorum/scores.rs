//! Per-peer latency and error estimates, and the ranking and plans built on them.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, RngCore};

use super::plan::{Candidate, QuorumPlan};
use super::{QuorumConfig, QuorumError};

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
        let spread = config.policy.spread();
        let ordered = if spread.ranks_by_score() {
            self.rank(candidates, rng)
        } else {
            let mut seen = std::collections::HashSet::new();
            candidates
                .iter()
                .filter(|peer| seen.insert(**peer))
                .map(|peer| Candidate {
                    peer: *peer,
                    hedge_after: self.tail_latency(*peer),
                })
                .collect()
        };
        let explore = spread.explores()
            && ordered.len() > config.fanout
            && rng.random_bool(self.config.explore_probability.clamp(0.0, 1.0));
        let explore_index = explore.then(|| rng.random_range(config.fanout..ordered.len()));
        QuorumPlan::new(config, ordered, explore_index, now)
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_secs_f64((ms.max(0.0) / 1e3).min(1e9))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::quorum::Policy;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
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
            policy: Policy::Hedged,
            quorum: 2,
            fanout: 2,
            max_in_flight: 6,
            deadline: ms(1000),
            attempt_timeout: ms(300),
        };
        let t0 = Instant::now();
        let mut plan = scores.plan(config, &[0, 1, 2, 3, 4], t0, &mut rng).unwrap();
        let asked: Vec<u32> = std::iter::from_fn(|| plan.poll_ask(t0)).collect();
        assert_eq!(asked.len(), 3, "two best plus one exploration: {asked:?}");
        assert!(asked.contains(&1) && asked.contains(&4));
        // A recovered peer climbs back once measured again.
        for _ in 0..40 {
            scores.record_success(2, ms(10));
        }
        assert_eq!(scores.rank(&[0, 1, 2], &mut rng)[0].peer, 2);
    }
}
