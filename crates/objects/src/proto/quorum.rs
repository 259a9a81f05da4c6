//! Plan a quorum read or write over candidate peers: whom to ask, when to hedge, when to stop.
//!
//! # Design
//!
//! Zold's client fetched a wallet by asking nodes one after another, and judged a node slow only
//! after its call had returned (`docs/lessons.md`): when most nodes were slow, every fetch waited
//! on them. This module never waits on a slow peer it can route around.
//!
//! Two pieces, both pure (time arrives as `now`, randomness as an injected [`rand::RngCore`]):
//!
//! - [`PeerScores`] keeps, per peer, an EWMA of answer latency (`srtt`), of its deviation
//!   (`rttvar`, as TCP's RTO estimator, RFC 6298 §2), of errors, and of lateness (not answering by
//!   its hedge delay). A peer's *tail estimate* is `srtt + max(4·rttvar, srtt/4, 1 ms)`; its *score* (lower is
//!   better) adds `error_penalty · error_ewma`; its *timeliness* is one minus its lateness. Peers
//!   are ordered by score, ties broken at random.
//!   A peer never heard from is ranked by what the transport knows ([`PathHint`]): expected at its
//!   connection's round trip plus the median service time of known peers, hedged at twice that,
//!   at even odds of answering in time. A candidate without a
//!   live connection comes last, with no chance of answering in time; with no round trip known, a
//!   stranger gets a configured prior.
//!   Lateness is news at once: when a plan passes a peer's hedge delay, and when it cancels a
//!   request still out, the time already taken is a lower bound on that peer's latency (a
//!   censored sample), so its estimate is raised to it rather than averaged in, and plans starting
//!   meanwhile route around it. A peer that stops answering sinks after one late request.
//!   A request still out is news too: the driver reports each request it sends and each that
//!   ends ([`PeerScores::on_request_sent`], [`PeerScores::on_request_done`]), and a peer whose
//!   oldest request has been out longer than its score is ranked at that age, since a new request
//!   to it queues behind the old one (answers on one connection leave in order); past its hedge
//!   delay it counts as late. Without this, every read starting in the round trips before an
//!   answer came back piled onto the same best-ranked peers: in the quorum sweep a cold
//!   connection's congestion window then held their answers for hundreds of milliseconds.
//!   Lateness is counted once per episode: a request sent before its peer's last lateness was
//!   noticed waited behind that late request, so its own lateness is no news and is not counted
//!   (TCP reacts once to the losses of one window); its latency, if it is answered, still goes
//!   into the estimate (a steadily slow peer is otherwise never measured). A slow peer still
//!   sinks at its first late request; a peer whose answers queued for a moment is not marked
//!   late by every request in the queue, which had kept healthy peers near the client ranked
//!   below strangers for the rest of the run.
//!   Content asked of a peer and not yet received counts too (`proto/quorum/load.rs`): a
//!   new request to it waits whole round trips behind that content once it exceeds what the
//!   peer's connection delivered in one round trip (twice its best so far, at least RFC 9002's
//!   initial window), and the ranking adds those round trips to its cost and hedge delay.
//!   Exploration: with probability `explore_probability` a plan also asks one random peer from
//!   outside the first choices, so a peer that recovered is measured again without delaying the read.
//!   Probes (`probe_on_connect`, on by default): the object service asks each member once for a
//!   version and hash as its connection comes up, scored as a read's request is (tracked while
//!   out, hedged after [`PeerScores::hedge_delay`]), so the reads of the first round trips rank a
//!   member by what it took rather than as a stranger (`net/service/probe.rs`).
//! - [`QuorumPlan`] runs one request. The driver polls [`QuorumPlan::poll_ask`] for peers to ask,
//!   reports each answer or failure, and wakes at [`QuorumPlan::poll_timeout`]. Policies (each
//!   one implementation of the plan's rules, in its own file under `quorum/policy/`):
//!   - [`Policy::Sequential`] (Zold): one peer at a time in the given order; the next is asked when
//!     the current one answers, fails, or exceeds `attempt_timeout`.
//!   - [`Policy::ParallelAll`]: every candidate at once; done when all have answered or failed, or at
//!     the deadline.
//!   - [`Policy::Hedged`]: the best `fanout` peers at once (plus an exploration peer); then, while
//!     the chance that the attempts out reach quorum in time (a Poisson-binomial tail over their
//!     timeliness) is below [`CONFIDENCE`] (0.99), the next-best too; when an attempt is later than
//!     its tail estimate, or fails, the next-best peer is asked in its place. At most
//!     `max_in_flight` attempts that are not late are out: a late attempt still counts if it
//!     answers but holds no place, so when most peers are slow the plan keeps routing around them
//!     instead of waiting. A peer with no chance of answering in time (overdue on a request
//!     already out, or unreachable) is asked only while fewer attempts are out than answers are
//!     still needed: once only such peers are left, asking more of them buys no earlier answer.
//!     A peer whose lateness history alone gives it a timeliness of 0 is not such a peer (one
//!     late answer is no proof that the next is late too): a rule keyed on that timeliness
//!     waited on a stopped replica's attempt instead of asking a healthy one. In the quorum
//!     sweep (hedged, seeds 1–8) the rule took seed 3 case 4 (14 replicas, 9 slow at 2.6 s, 3
//!     dead, quorum 5) from 1.21× to 1.11× the quorum, every p99 as it was. Done as soon as
//!     `quorum` peers answered.
//!
//! Extra requests are paid from a budget shared by all plans, as gRPC's and Finagle's retry
//! budgets: every plan's first `fanout` requests earn `extra_request_ratio` (0.2) each when it
//! ends, every request beyond them costs one as it is made (so plans running at once see what
//! the others spent), and at most `extra_request_reserve` (32) is saved up. The
//! budget starts full, so a client that knows nobody can ask several strangers at once; once it
//! knows who answers in time it asks the quorum alone. Hedges are paid from the same budget but
//! are never refused by it: a late peer is replaced while someone left can answer in time.
//!
//! A plan with fewer reachable candidates than its quorum is done at once
//! ([`Finish::Unreachable`]): no answer could make the quorum, so nobody waits for the deadline.
//!
//! Every policy is done by `deadline` after the start, whatever the peers do; the plan asks each
//! peer at most once, and the driver cancels whatever is still in flight when it is done.
//!
//! The plan also keeps the driver's bookkeeping, so a driver only sends requests, awaits them and
//! reads the clock: [`QuorumPlan::on_answer`] and [`QuorumPlan::on_failure`] feed each reply's
//! latency (since the plan asked that peer) into the [`PeerScores`], and
//! [`QuorumPlan::cancel_pending`] gives the peers still in flight their censored samples, or, as
//! meshwire's reads do, [`QuorumPlan::pending_due`] lists them so the driver can follow them up
//! until each is due and report each with [`PeerScores::record_follow_up`]: then every peer asked
//! gets an outcome, not only those faster than the quorum.

use std::time::Duration;

mod load;
mod plan;
mod policy;
mod scores;

pub use plan::{Candidate, Finish, Outcome, QuorumPlan, CONFIDENCE};
pub use scores::{PathHint, PeerScores, ProbeVerdict, ScoreConfig, GRANULARITY};

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
    /// The rules this policy stands for.
    fn spread(self) -> &'static dyn policy::Spread {
        match self {
            Self::Sequential => &policy::Sequential,
            Self::ParallelAll => &policy::ParallelAll,
            Self::Hedged => &policy::Hedged,
        }
    }

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
    /// Hedged defaults for `quorum` answers within `deadline`: the quorum asked first, and room
    /// for as many again plus eight more attempts that are not late, for uncertain peers (the
    /// budget in [`PeerScores`] decides how many are actually asked).
    pub fn hedged(quorum: usize, deadline: Duration) -> Self {
        Self {
            policy: Policy::Hedged,
            quorum,
            fanout: quorum,
            max_in_flight: quorum * 2 + 8,
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
