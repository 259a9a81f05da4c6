//! Run a quorum plan over real requests: the plan decides, this sends, awaits and reads the clock.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use meshwire::{PeerId, RequestError};

use crate::net::store::StoreError;
use crate::proto::clock::ClockError;
use crate::proto::object::{ObjectError, Refusal, Stamp};
use crate::proto::quorum::{Outcome, PeerScores, QuorumPlan};

use super::lock;

/// Why one replica's part of a read or write failed; the plan counts it as that replica's failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The request to the replica failed (refused, timed out, broken connection, handler error).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// This node's own store failed, as a replica of the key.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The replica's answer is malformed or its content does not match its hash.
    #[error(transparent)]
    Malformed(#[from] ObjectError),
    /// The replica holds a copy that wins over the one written (a newer version, or the same
    /// version with a smaller hash): not an ack.
    #[error("superseded: the replica holds version {}", held.version)]
    Superseded {
        /// The copy it holds.
        held: Stamp,
    },
    /// A conditional write's precondition does not hold there: this is its current copy.
    #[error("precondition failed: the replica holds {}", current.map_or("nothing".to_string(), |s| s.version.to_string()))]
    Mismatch {
        /// Its current copy, if any.
        current: Option<Stamp>,
    },
    /// Another conditional write is pending on the key there.
    #[error("another conditional write is pending on the key")]
    Busy,
    /// The replica refused the request.
    #[error("the replica refused the request: {}", .0.name())]
    Refused(Refusal),
    /// The replica's clock or the version it answered is beyond the accepted skew or at the
    /// limit, or this node's own clock is exhausted.
    #[error(transparent)]
    Clock(#[from] ClockError),
    /// The replica's answer stopped arriving before its end (a copy streamed piece by piece).
    #[error("the replica's answer stopped arriving: {0}")]
    Body(#[from] meshwire::BodyError),
}

/// What happens to requests still in flight when a plan is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leftover {
    /// Follow them up in the background only until each is due (its hedge delay), to score its
    /// peer, then drop them (reads). Without this, only peers that answer before the quorum is
    /// reached would ever be scored, and the ranking would take slow peers for strangers.
    FollowUp,
    /// Let them finish in the background (writes), so every live replica gets the copy.
    Finish,
}

/// The clock, read from tokio so virtual time (the lab, paused tests) applies.
pub(super) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Runs `plan`, asking peers with `ask`, until it is done; replies update `scores` through the
/// plan. Returns the answers and the outcome.
pub(super) async fn drive<T, F, Fut>(
    scores: &Arc<Mutex<PeerScores<PeerId>>>,
    mut plan: QuorumPlan<PeerId>,
    ask: F,
    leftover: Leftover,
) -> (Vec<(PeerId, T)>, Outcome)
where
    T: Send + 'static,
    F: Fn(PeerId) -> Fut,
    Fut: Future<Output = Result<T, ReplicaError>> + Send + 'static,
{
    let mut in_flight = FuturesUnordered::new();
    let mut answers = Vec::new();
    let fanout = plan.config().fanout;
    loop {
        let at = now();
        while let Some(peer) = plan.poll_ask(at) {
            // Requests beyond the fanout are paid for as they are made.
            if plan.asked() > fanout {
                lock(scores).spend(1);
            }
            let request = ask(peer);
            let out = Outstanding::new(scores, peer, at);
            in_flight.push(async move {
                let result = request.await;
                drop(out);
                (peer, result)
            });
        }
        plan.report_late(at, &mut lock(scores));
        if let Some(outcome) = plan.outcome() {
            lock(scores).settle(fanout);
            match leftover {
                Leftover::FollowUp if !in_flight.is_empty() => {
                    let due = plan.pending_due();
                    let scores = scores.clone();
                    tokio::spawn(async move {
                        follow_up(&scores, in_flight, due).await;
                    });
                }
                Leftover::FollowUp => {}
                Leftover::Finish if !in_flight.is_empty() => {
                    tokio::spawn(async move { while in_flight.next().await.is_some() {} });
                }
                Leftover::Finish => {}
            }
            return (answers, outcome);
        }
        let wake = plan
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            Some((peer, result)) = in_flight.next() => {
                let at = now();
                let mut scores = lock(scores);
                match result {
                    Ok(value) => {
                        if plan.on_answer(peer, at, &mut scores) {
                            answers.push((peer, value));
                        }
                    }
                    Err(error) => {
                        tracing::debug!(peer = %peer.short(), %error, "replica request failed");
                        plan.on_failure(peer, at, &mut scores);
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// A request out to `peer` since `sent`, charged to the peer in the scores' ranking
/// ([`PeerScores::on_request_sent`]) until it ends, however it ends: answered, failed, or dropped
/// with its plan or follow-up.
struct Outstanding {
    scores: Arc<Mutex<PeerScores<PeerId>>>,
    peer: PeerId,
    sent: Instant,
}

impl Outstanding {
    fn new(scores: &Arc<Mutex<PeerScores<PeerId>>>, peer: PeerId, sent: Instant) -> Self {
        lock(scores).on_request_sent(peer, sent);
        Self {
            scores: scores.clone(),
            peer,
            sent,
        }
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        lock(&self.scores).on_request_done(self.peer, self.sent);
    }
}

/// A content request out to `peer`, counted in the scores' content load
/// ([`PeerScores::on_content_sent`]) until it ends, however it ends; `received` is set to the
/// content's size when an answer brings it.
pub(super) struct ContentOut {
    scores: Arc<Mutex<PeerScores<PeerId>>>,
    peer: PeerId,
    round_trip: Option<std::time::Duration>,
    pub(super) received: Option<usize>,
}

impl ContentOut {
    pub(super) fn new(
        scores: &Arc<Mutex<PeerScores<PeerId>>>,
        peer: PeerId,
        round_trip: Option<std::time::Duration>,
    ) -> Self {
        lock(scores).on_content_sent(peer);
        Self {
            scores: scores.clone(),
            peer,
            round_trip,
            received: None,
        }
    }
}

impl Drop for ContentOut {
    fn drop(&mut self) {
        lock(&self.scores).on_content_done(self.peer, self.received, self.round_trip, now());
    }
}

/// Awaits the requests a read left in flight until each is due, and scores each peer by what it
/// did by then; whatever is still out at the last due time is dropped.
async fn follow_up<T, Fut>(
    scores: &Mutex<PeerScores<PeerId>>,
    mut in_flight: FuturesUnordered<Fut>,
    mut due: Vec<(PeerId, Instant, Instant)>,
) where
    Fut: Future<Output = (PeerId, Result<T, ReplicaError>)>,
{
    let Some(last) = due.iter().map(|(_, _, at)| *at).max() else {
        return;
    };
    let stop = tokio::time::sleep_until(tokio::time::Instant::from_std(last));
    tokio::pin!(stop);
    while !due.is_empty() {
        tokio::select! {
            Some((peer, result)) = in_flight.next() => {
                let at = now();
                if let Some(index) = due.iter().position(|(p, _, _)| *p == peer) {
                    let (_, sent, until) = due.swap_remove(index);
                    lock(scores).record_follow_up(peer, sent, until, Some((at, result.is_ok())));
                }
            }
            _ = &mut stop => break,
        }
    }
    let mut scores = lock(scores);
    for (peer, sent, until) in due {
        scores.record_follow_up(peer, sent, until, None);
    }
}
