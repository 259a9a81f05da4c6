//! Per-peer latency, lateness and error estimates, and the ranking and plans built on them.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, RngCore};

use super::load::ContentLoad;
use super::plan::{Candidate, QuorumPlan};
use super::{QuorumConfig, QuorumError};

/// Settings of the peer ranking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreConfig {
    /// Weight of a new latency sample in the EWMA (RFC 6298 uses 1/8).
    pub alpha: f64,
    /// Weight of a new deviation sample (RFC 6298 uses 1/4).
    pub beta: f64,
    /// Weight of a new outcome in the error and lateness EWMAs.
    pub error_alpha: f64,
    /// Latency assumed for a peer never heard from when the transport knows no round trip to it.
    pub prior_latency: Duration,
    /// Score added for a peer that always fails.
    pub error_penalty: Duration,
    /// Probability that a plan asks one extra random peer to re-measure it.
    pub explore_probability: f64,
    /// Peers tracked at most; others are ranked with the prior.
    pub max_peers: usize,
    /// Extra requests (beyond a plan's first `fanout`) earned per request a plan needed: the
    /// budget that pays for asking uncertain peers in parallel and for hedges.
    pub extra_request_ratio: f64,
    /// Most extra requests saved up; the budget starts full, so a cold client can afford to
    /// discover its peers.
    pub extra_request_reserve: f64,
    /// Whether the object service probes each member once as its connection comes up (one
    /// version-and-hash request, scored as a read's request is), so that the first reads do not
    /// rank it as a stranger (`net/service/probe.rs`).
    pub probe_on_connect: bool,
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
            extra_request_ratio: 0.2,
            extra_request_reserve: 32.0,
            probe_on_connect: true,
        }
    }
}

/// What the transport knows of the path to a candidate, before any request to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathHint {
    /// Whether a connection to the peer is up (this node itself always is).
    pub reachable: bool,
    /// The connection's smoothed round-trip time, if known.
    pub rtt: Option<Duration>,
}

impl PathHint {
    /// A peer with a live connection of round trip `rtt`.
    pub fn connected(rtt: Duration) -> Self {
        Self {
            reachable: true,
            rtt: Some(rtt),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct PeerStats {
    srtt_ms: f64,
    rttvar_ms: f64,
    error: f64,
    /// EWMA of "not answered by its hedge delay": lateness, failures included.
    late: f64,
}

/// Per-peer latency, lateness and error estimates, the ranking built on them, and the budget of
/// extra requests plans share.
#[derive(Debug, Clone)]
pub struct PeerScores<P> {
    config: ScoreConfig,
    peers: HashMap<P, PeerStats>,
    extra_tokens: f64,
    /// When each request still out to a peer was sent (see [`PeerScores::on_request_sent`]).
    outstanding: HashMap<P, Vec<Instant>>,
    /// When each peer's lateness was last taken as news, and when the request that made it was
    /// sent (see [`PeerScores::lateness`]).
    late_noticed: HashMap<P, (Instant, Instant)>,
    /// Content asked of each peer and not yet received, and what each delivered per round trip.
    load: ContentLoad<P>,
}

/// What [`PeerScores::probe_verdict`] advises for one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Probe it now.
    Probe,
    /// Ask again once a probe out ends or falls due.
    Wait,
    /// Enough peers known faster than its round trip: a probe would change no ranking.
    Skip,
}

/// What a late outcome tells ([`PeerScores::lateness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lateness {
    /// A new episode: counted.
    News,
    /// The request whose lateness was the news, ending now: measured, not counted again.
    Counted,
    /// A request that waited behind the news: measured if it is answered, not counted.
    Queued,
}

/// Requests out to one peer that are tracked at most; only the oldest matter to the ranking.
const MAX_OUTSTANDING_TRACKED: usize = 1024;

impl<P: Copy + Eq + Hash + Ord> PeerScores<P> {
    /// An empty table.
    pub fn new(config: ScoreConfig) -> Self {
        Self {
            config,
            peers: HashMap::new(),
            extra_tokens: config.extra_request_reserve.max(0.0),
            outstanding: HashMap::new(),
            load: ContentLoad::new(config.max_peers),
            late_noticed: HashMap::new(),
        }
    }

    /// What the lateness of the request to `peer` sent at `sent`, noticed at `now`, tells, and
    /// when it is news, remembers it. It is no news when the request was sent before the peer's
    /// last lateness was noticed: it then waited behind that late request, and its lateness is
    /// the same episode (TCP likewise reacts once to the losses of one window). A slow peer still
    /// sinks at its first late request; a peer whose answers queued for a moment (a cold
    /// connection's window, a burst of requests) is charged once for the burst, not once per
    /// request in it. The request that made the news is still measured when it ends.
    fn lateness(&mut self, peer: P, sent: Instant, now: Instant) -> Lateness {
        match self.late_noticed.get_mut(&peer) {
            Some((_, news_sent)) if sent == *news_sent => Lateness::Counted,
            Some((noticed, _)) if sent < *noticed => Lateness::Queued,
            Some(entry) => {
                *entry = (now, sent);
                Lateness::News
            }
            None => {
                if self.late_noticed.len() < self.config.max_peers {
                    self.late_noticed.insert(peer, (now, sent));
                }
                Lateness::News
            }
        }
    }

    /// A request to `peer` was sent at `sent`. Until [`PeerScores::on_request_done`] reports it,
    /// the time it has been out is a lower bound on what `peer` takes now, and [`Self::rank`]
    /// charges `peer` for it: answers on one connection leave in order, so a new request waits
    /// behind the ones still out. The driver reports every request it sent as done, however it
    /// ends (answered, failed, cancelled), or its peer stays charged.
    pub fn on_request_sent(&mut self, peer: P, sent: Instant) {
        let out = self.outstanding.entry(peer).or_default();
        if out.len() < MAX_OUTSTANDING_TRACKED {
            out.push(sent);
        }
    }

    /// The request to `peer` sent at `sent` is no longer out.
    pub fn on_request_done(&mut self, peer: P, sent: Instant) {
        if let Some(out) = self.outstanding.get_mut(&peer) {
            if let Some(index) = out.iter().position(|at| *at == sent) {
                out.swap_remove(index);
            }
            if out.is_empty() {
                self.outstanding.remove(&peer);
            }
        }
    }

    /// A request to `peer` that asks for the content was sent (besides
    /// [`Self::on_request_sent`]): until [`Self::on_content_done`], the ranking counts the round
    /// trips a new request to `peer` waits behind it (`load.rs`).
    pub fn on_content_sent(&mut self, peer: P) {
        self.load.on_sent(peer);
    }

    /// The content request to `peer` ended at `now`, with `received` bytes of content if it was
    /// answered with them; `round_trip` is the peer's connection's round trip, if known.
    pub fn on_content_done(
        &mut self,
        peer: P,
        received: Option<usize>,
        round_trip: Option<Duration>,
        now: Instant,
    ) {
        let round_trip = round_trip.unwrap_or_else(|| self.expected_latency(peer));
        self.load.on_done(peer, received, round_trip, now);
    }

    /// How long the oldest request still out to `peer` has been out at `now`.
    pub fn oldest_outstanding(&self, peer: P, now: Instant) -> Option<Duration> {
        let oldest = self.outstanding.get(&peer)?.iter().min()?;
        Some(now.saturating_duration_since(*oldest))
    }

    /// The ranking settings.
    pub fn config(&self) -> &ScoreConfig {
        &self.config
    }

    fn entry(&mut self, peer: P, sample_ms: f64) -> Option<&mut PeerStats> {
        if !self.peers.contains_key(&peer) && self.peers.len() >= self.config.max_peers {
            return None;
        }
        // As RFC 6298 initialises the RTT estimate with the first sample, the first outcome sets
        // the lateness and error estimates outright; the caller's EWMA step then leaves them there.
        Some(self.peers.entry(peer).or_insert(PeerStats {
            srtt_ms: sample_ms,
            rttvar_ms: sample_ms / 2.0,
            error: f64::NAN,
            late: f64::NAN,
        }))
    }

    /// Feeds a latency sample, an outcome to the error EWMA and, unless `late` is `None` (the
    /// request's lateness was counted already), one to the lateness EWMA.
    fn observe(&mut self, peer: P, sample: Duration, failed: bool, late: Option<bool>) {
        let (alpha, beta, error_alpha) =
            (self.config.alpha, self.config.beta, self.config.error_alpha);
        let sample_ms = sample.as_secs_f64() * 1e3;
        if let Some(stats) = self.entry(peer, sample_ms) {
            stats.rttvar_ms =
                (1.0 - beta) * stats.rttvar_ms + beta * (stats.srtt_ms - sample_ms).abs();
            stats.srtt_ms = (1.0 - alpha) * stats.srtt_ms + alpha * sample_ms;
            stats.error = ewma(stats.error, error_alpha, failed);
            if let Some(late) = late {
                stats.late = ewma(stats.late, error_alpha, failed || late);
            } else if stats.late.is_nan() {
                stats.late = 1.0;
            }
        }
    }

    /// `peer` answered after `latency`, before its hedge delay.
    pub fn record_success(&mut self, peer: P, latency: Duration) {
        self.observe(peer, latency, false, Some(false));
    }

    /// `peer` answered the request sent at `sent` after `latency`, later than its hedge delay:
    /// the answer counts, and so does its latency, but the peer was late only if that is news
    /// (see `Self::lateness`). A request that waited behind the news still measured what `peer`
    /// takes: leaving its latency out as well kept a steadily slow peer's estimate at the censored
    /// lower bounds of its late requests. In the quorum sweep (seed 3, case 4: replicas answering
    /// after 2.75 s, asked 50 times a second) every answer came after a newer lateness had been
    /// noticed, none was measured, and the estimate stayed at 1.0–1.7 s for the whole run.
    pub fn record_late_success(&mut self, peer: P, sent: Instant, latency: Duration) {
        match self.lateness(peer, sent, sent + latency) {
            Lateness::News => self.observe(peer, latency, false, Some(true)),
            Lateness::Counted | Lateness::Queued => self.observe(peer, latency, false, None),
        }
    }

    /// `peer` failed after `elapsed` (an error or a timeout).
    pub fn record_failure(&mut self, peer: P, elapsed: Duration) {
        self.observe(peer, elapsed, true, Some(true));
    }

    /// `peer` had not answered after `elapsed`, either when a plan passed its hedge delay
    /// (`late`) or when its request was cancelled. Its true latency is at least `elapsed`, so the
    /// estimate is raised to that lower bound at once (a censored sample), rather than averaged
    /// in: a peer that stops answering sinks in the ranking after one late request, not eight.
    pub fn record_unanswered(&mut self, peer: P, sent: Instant, elapsed: Duration, late: bool) {
        let sample_ms = elapsed.as_secs_f64() * 1e3;
        let known = self.peers.contains_key(&peer);
        if !known && !late {
            // Cancelled before it was due: nothing is known of it yet.
            return;
        }
        let counted = late && {
            match self.lateness(peer, sent, sent + elapsed) {
                Lateness::Queued => return,
                Lateness::Counted => false,
                Lateness::News => true,
            }
        };
        let error_alpha = self.config.error_alpha;
        if let Some(stats) = self.entry(peer, sample_ms) {
            if sample_ms > stats.srtt_ms {
                stats.rttvar_ms = stats.rttvar_ms.max((sample_ms - stats.srtt_ms) / 2.0);
                stats.srtt_ms = sample_ms;
            }
            if counted || (late && stats.late.is_nan()) {
                stats.late = ewma(stats.late, error_alpha, true);
            }
            if stats.error.is_nan() {
                stats.error = 0.0;
            }
        }
    }

    /// The outcome of a request followed up after its plan was done: answered at `answered`
    /// (`true` if it succeeded; `None`: nothing heard), sent at `sent`, due at `due`. An answer
    /// by then is a timely sample, a later one a late sample, silence a late one censored at
    /// `due`, an error a failure.
    pub fn record_follow_up(
        &mut self,
        peer: P,
        sent: Instant,
        due: Instant,
        answered: Option<(Instant, bool)>,
    ) {
        match answered {
            Some((at, true)) if at <= due => {
                self.record_success(peer, at.saturating_duration_since(sent))
            }
            Some((at, true)) => {
                self.record_late_success(peer, sent, at.saturating_duration_since(sent))
            }
            Some((at, false)) => self.record_failure(peer, at.saturating_duration_since(sent)),
            None => self.record_unanswered(peer, sent, due.saturating_duration_since(sent), true),
        }
    }

    /// The smoothed latency of `peer`, or the prior.
    pub fn expected_latency(&self, peer: P) -> Duration {
        self.peers
            .get(&peer)
            .map_or(self.config.prior_latency, |stats| millis(stats.srtt_ms))
    }

    /// The tail estimate of `peer`: `srtt + max(4·rttvar, srtt/4, 1 ms)`, or the prior for a
    /// stranger. As RFC 6298 keeps the RTO at least a clock granularity above SRTT, the tail
    /// stays a quarter above the mean: a steady peer's deviation decays towards zero, and without
    /// the floor any answer a few milliseconds slower than usual (another key, another disk read)
    /// would count as late. On sub-millisecond paths (a cluster on one host or one rack) a
    /// quarter is tens of microseconds, less than one scheduling delay, so the slack is also at
    /// least [`GRANULARITY`], as RFC 9002's probe timeout is at least its `kGranularity` above
    /// the smoothed RTT.
    pub fn tail_latency(&self, peer: P) -> Duration {
        let granularity_ms = GRANULARITY.as_secs_f64() * 1e3;
        self.peers
            .get(&peer)
            .map_or(self.config.prior_latency, |stats| {
                let slack = (4.0 * stats.rttvar_ms)
                    .max(stats.srtt_ms / 4.0)
                    .max(granularity_ms);
                millis(stats.srtt_ms + slack)
            })
    }

    /// The error EWMA of `peer` in `[0, 1]`.
    pub fn error_rate(&self, peer: P) -> f64 {
        self.peers.get(&peer).map_or(0.0, |stats| stats.error)
    }

    /// The probability that `peer` answers by its hedge delay: one minus its lateness EWMA, or
    /// even odds for a stranger. (The share of timely peers among those measured so far would be
    /// a biased guess: fast peers are measured first, slow ones only once they are due.)
    pub fn timely(&self, peer: P) -> f64 {
        self.peers
            .get(&peer)
            .map_or(STRANGER_TIMELY, |stats| 1.0 - stats.late)
    }

    /// Extra requests the budget allows now.
    pub fn extra_budget(&self) -> usize {
        self.extra_tokens.max(0.0).floor() as usize
    }

    /// Pays for `extra` requests a plan made beyond its first `fanout`, as it makes them (the
    /// retry budget of gRPC and Finagle): plans running at the same time see what the others
    /// spent. Paid only when a plan finished, the budget let every plan started before the
    /// first one ended ask as if it were full: in the quorum sweep (hedged, seed 3 case 4, reads
    /// taking 2.7 s at 50 a second) 137 of 200 reads asked all 11 reachable replicas for a
    /// quorum of 5, 2.27× the quorum; paid as made, 1.21× (seeds 1–8: the most over the quorum
    /// of any case 2.271 → 1.212; seed 3 case 6's p99 ratio 1.271 → 1.003, every other within
    /// 0.01 of what it was).
    pub fn spend(&mut self, extra: usize) {
        self.add_tokens(-(extra as f64));
    }

    /// Settles a finished plan with the budget: its first `fanout` requests earn their share
    /// (what it asked beyond them was paid with [`Self::spend`]).
    pub fn settle(&mut self, fanout: usize) {
        self.add_tokens(self.config.extra_request_ratio.max(0.0) * fanout as f64);
    }

    /// Moves the budget by `delta`, within `extra_request_reserve` either way.
    fn add_tokens(&mut self, delta: f64) {
        let reserve = self.config.extra_request_reserve.max(0.0);
        self.extra_tokens = (self.extra_tokens + delta).clamp(-reserve, reserve);
    }

    /// Whether a probe of `peer`, whose connection's round trip is `rtt`, can still change a
    /// ranking, given that `pending` probes are out, not yet due, to peers at most that far.
    /// No answer from `peer` can come back before its round trip, so once `needed` other peers
    /// are known to answer in time within that round trip even at their tail estimates, every
    /// read ranks those first and a probe of `peer` would be a request no read needs (it stays a
    /// stranger, measured if a read explores it). While the probes out may still make up the
    /// difference, the verdict is to wait for them.
    pub fn probe_verdict(
        &self,
        peer: P,
        rtt: Option<Duration>,
        needed: usize,
        pending: usize,
    ) -> ProbeVerdict {
        let Some(rtt) = rtt else {
            return ProbeVerdict::Probe;
        };
        let faster = self
            .peers
            .iter()
            .filter(|(other, stats)| {
                **other != peer && stats.late < 0.5 && stats.error < 0.5 && {
                    let other = **other;
                    self.tail_latency(other) <= rtt
                }
            })
            .take(needed)
            .count();
        if faster >= needed {
            ProbeVerdict::Skip
        } else if faster + pending >= needed {
            ProbeVerdict::Wait
        } else {
            ProbeVerdict::Probe
        }
    }

    /// The ranking key of `peer` in milliseconds: lower is better.
    pub fn score_ms(&self, peer: P) -> f64 {
        let penalty_ms = self.config.error_penalty.as_secs_f64() * 1e3;
        match self.peers.get(&peer) {
            Some(stats) => stats.srtt_ms + stats.rttvar_ms + penalty_ms * stats.error,
            None => self.config.prior_latency.as_secs_f64() * 1e3,
        }
    }

    /// The typical time a known peer takes beyond its path's round trip (the lower median of
    /// `srtt − rtt` over the candidates with both), zero when none is known.
    fn service_ms(&self, candidates: &[(P, PathHint)]) -> f64 {
        let mut service: Vec<f64> = candidates
            .iter()
            .filter_map(|(peer, hint)| {
                let stats = self.peers.get(peer)?;
                let rtt_ms = hint.rtt?.as_secs_f64() * 1e3;
                (stats.late < 0.5).then_some((stats.srtt_ms - rtt_ms).max(0.0))
            })
            .collect();
        if service.is_empty() {
            return 0.0;
        }
        service.sort_by(f64::total_cmp);
        service[(service.len() - 1) / 2]
    }

    /// How long a request to `peer` may take before it is late: its tail estimate, or for a
    /// stranger the transport knows a round trip to, twice that round trip (as [`Self::rank`]
    /// hedges a stranger, with no service time known), or the prior.
    pub fn hedge_delay(&self, peer: P, hint: PathHint) -> Duration {
        match (self.peers.contains_key(&peer), hint.rtt) {
            (false, Some(rtt)) => stranger_expected(rtt, 0.0).1,
            _ => self.tail_latency(peer),
        }
    }

    /// `candidates` best first at `now`, ties in random order, each with its hedge delay (tail
    /// estimate) and its timeliness. The order is by expected cost: the score, plus the hedge
    /// delay weighted by the chance of being late, so a known timely peer goes before a closer
    /// stranger that may well be slow. A stranger the transport knows a round trip to is expected at that
    /// round trip plus the typical service time of known peers, and hedged at twice that (a
    /// reply later than twice its path's expected time is late); an unreachable candidate
    /// comes last, with no chance of answering in time. A peer with a request out for longer
    /// than its score is expected at that age instead (a new request queues behind it), and one
    /// whose request is out past its hedge delay is taken to be late.
    pub fn rank(
        &self,
        candidates: &[(P, PathHint)],
        now: Instant,
        rng: &mut impl RngCore,
    ) -> Vec<Candidate<P>> {
        let mut ranked: Vec<(P, PathHint)> = candidates.to_vec();
        ranked.sort_by_key(|(peer, _)| *peer);
        ranked.dedup_by_key(|(peer, _)| *peer);
        ranked.shuffle(rng);
        let service_ms = self.service_ms(&ranked);
        let mut scored: Vec<(f64, Candidate<P>)> = ranked
            .into_iter()
            .map(|(peer, hint)| {
                let (score, hedge_after, timely) = match (self.peers.contains_key(&peer), hint.rtt)
                {
                    (false, Some(rtt)) => {
                        let (expected_ms, hedge_after) = stranger_expected(rtt, service_ms);
                        (expected_ms, hedge_after, STRANGER_TIMELY)
                    }
                    _ => (
                        self.score_ms(peer),
                        self.tail_latency(peer),
                        self.timely(peer),
                    ),
                };
                let (score, timely, overdue) = match self.oldest_outstanding(peer, now) {
                    Some(age) if age > hedge_after => {
                        (score.max(age.as_secs_f64() * 1e3), 0.0, true)
                    }
                    Some(age) => (score.max(age.as_secs_f64() * 1e3), timely, false),
                    None => (score, timely, false),
                };
                // What asking it is expected to cost: its latency, plus, with the chance that it
                // is late, the hedge delay spent waiting on it before someone else is asked.
                // Round trips it waits behind the content already asked of it.
                let round_trip_ms = hint
                    .rtt
                    .unwrap_or_else(|| self.expected_latency(peer))
                    .as_secs_f64()
                    * 1e3;
                let queue_ms = self.load.queue_rounds(peer) * round_trip_ms;
                // A wait the client's own requests cause is no lateness of the peer's.
                let hedge_after = hedge_after + millis(queue_ms);
                let cost = score + queue_ms + (1.0 - timely) * hedge_after.as_secs_f64() * 1e3;
                let candidate = Candidate {
                    peer,
                    hedge_after,
                    timely: if hint.reachable { timely } else { 0.0 },
                    reachable: hint.reachable,
                    overdue,
                };
                (if hint.reachable { cost } else { f64::INFINITY }, candidate)
            })
            .collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        scored.into_iter().map(|(_, candidate)| candidate).collect()
    }

    /// Builds the plan for one request: ranked candidates for a hedged plan (with an exploration
    /// peer drawn with `explore_probability`, and as many extra first asks as the budget allows),
    /// the given order for the others.
    pub fn plan(
        &self,
        config: QuorumConfig,
        candidates: &[(P, PathHint)],
        now: Instant,
        rng: &mut impl RngCore,
    ) -> Result<QuorumPlan<P>, QuorumError> {
        let spread = config.policy.spread();
        let ordered = if spread.ranks_by_score() {
            self.rank(candidates, now, rng)
        } else {
            let mut seen = std::collections::HashSet::new();
            candidates
                .iter()
                .filter(|(peer, _)| seen.insert(*peer))
                .map(|(peer, hint)| Candidate {
                    peer: *peer,
                    hedge_after: self.tail_latency(*peer),
                    timely: self.timely(*peer),
                    reachable: hint.reachable,
                    overdue: false,
                })
                .collect()
        };
        let explore = spread.explores()
            && ordered.len() > config.fanout
            && rng.random_bool(self.config.explore_probability.clamp(0.0, 1.0));
        let explore_index = explore.then(|| rng.random_range(config.fanout..ordered.len()));
        Ok(QuorumPlan::new(config, ordered, explore_index, now)?.with_spare(self.extra_budget()))
    }
}

/// What a stranger the transport knows a round trip `rtt` to is expected to take, in
/// milliseconds (the round trip plus `service_ms`), and when it is late: at twice that.
fn stranger_expected(rtt: Duration, service_ms: f64) -> (f64, Duration) {
    let expected_ms = rtt.as_secs_f64() * 1e3 + service_ms;
    (expected_ms, millis(2.0 * expected_ms))
}

/// The least slack of a tail estimate over the mean: RFC 9002's `kGranularity`, the timer
/// granularity below which a later answer is scheduling noise, not lateness.
pub const GRANULARITY: Duration = Duration::from_millis(1);

/// The chance that a peer never measured answers in time.
const STRANGER_TIMELY: f64 = 0.5;

/// One EWMA step towards `event`; a first sample (`NaN` before it) sets the average outright.
fn ewma(value: f64, alpha: f64, event: bool) -> f64 {
    let sample = if event { 1.0 } else { 0.0 };
    if value.is_nan() {
        sample
    } else {
        (1.0 - alpha) * value + alpha * sample
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_secs_f64((ms.max(0.0) / 1e3).min(1e9))
}

#[cfg(test)]
mod tests;
