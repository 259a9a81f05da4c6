//! Probes: one version-and-hash request to each member as its connection comes up, so that the
//! first reads rank it by what it takes rather than as a stranger; none to a member farther than
//! enough known fast ones.
//!
//! A read ranks a replica it never asked as a stranger: expected at its connection's round trip
//! plus the typical service time, with even odds of being late. When most replicas are slow, the
//! reads of the first round trip all ask strangers, most of them slow, and wait a hedge delay
//! before asking others; at 50 reads per second that is every read of the first few hundred
//! milliseconds, and the p99 of a few hundred reads is made of them (the quorum sweep, see
//! `crates/lab/src/experiments/quorum_reads.rs`). A probe is the request a read would make (for
//! a key nobody needs to hold, version and hash only: one small packet each way), sent when the
//! connection comes up, usually long before the first read. It is scored as a read's request
//! is: while it is out, the ranking charges its peer for its age (past its hedge delay the peer
//! counts as late), and its answer or failure is a latency sample. A peer that answers late is
//! known as slow before any read waits on it.
//!
//! Only members that could still enter a ranking are probed. No answer from a member comes back
//! before its connection's round trip, so once [`PROBES_PER_QUORUM`] × the read quorum other
//! members are known to answer in time within that round trip (at their tail estimates), every
//! read ranks those first and a probe of the farther member is a request no read needs; it stays
//! a stranger (ranked behind the known fast members, measured if a read explores it). Members are
//! taken nearest first; while probes still out (not yet past their hedge delay) to nearer members
//! could make up the number, a member waits for them. In the quorum sweep (hedged, seeds 1–8, 80
//! cases) probing every member cost up to 0.32 requests per read over 200 reads (56 members,
//! quorum 1); with the rule the cases over 1.25× the quorum went from 8 to 3 and the p90 of
//! requests over the quorum from 1.206 to 1.135, the p99 ratios' median and p90 unchanged.
//!
//! Cost: at most one request per member per connection (again after a reconnect), never more
//! than one out to a peer; `object_probe_requests` counts them, `object_probes_skipped` the
//! members passed over. `ScoreConfig::probe_on_connect` turns them off.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire::{PeerChange, PeerEvents, PeerId};

use crate::proto::object::{self, FetchMode};
use tokio::sync::mpsc;

use crate::proto::quorum::{PathHint, ProbeVerdict};

use super::{drive::now, lock, Inner, ObjectService, ReplicaError};

/// The key a probe asks for: any valid key does, a stored one included (version and hash only).
pub const PROBE_KEY: &str = "meshwire.probe";

/// A member is probed unless this many times the read quorum of other members are known to
/// answer in time within its round trip: a read asks `quorum` of them first and hedges to the
/// next-best, so those peers settle every ranking a farther member could enter.
pub const PROBES_PER_QUORUM: usize = 2;

impl ObjectService {
    /// Starts probing members as their connections come up (see the module docs); `None` when
    /// `probe_on_connect` is off. The loop ends when the service is dropped or the task aborted.
    pub fn spawn_probes(&self) -> Option<tokio::task::JoinHandle<()>> {
        if !self.inner.config.scores.probe_on_connect {
            return None;
        }
        let weak = std::sync::Arc::downgrade(&self.inner);
        let events = self.inner.node.peer_events();
        Some(tokio::spawn(probe_loop(weak, events)))
    }

    /// Probes sent since the service started.
    pub fn probes_sent(&self) -> u64 {
        self.inner.metrics.probe_requests.get()
    }

    /// Asks `peer` for the version and hash of [`PROBE_KEY`] and scores its answer as a read's
    /// request is scored. Returns how long the answer took.
    pub async fn probe(&self, peer: PeerId) -> Result<Duration, ReplicaError> {
        let hint = PathHint {
            reachable: true,
            rtt: self.inner.node.rtt_to(peer),
        };
        let sent = now();
        let due = {
            let mut scores = lock(&self.inner.scores);
            scores.on_request_sent(peer, sent);
            scores.hedge_delay(peer, hint)
        };
        self.inner.metrics.probe_requests.inc();
        let result = self.ask_probe(peer).await;
        let latency = now().saturating_duration_since(sent);
        let mut scores = lock(&self.inner.scores);
        scores.on_request_done(peer, sent);
        match &result {
            Ok(()) if latency <= due => scores.record_success(peer, latency),
            Ok(()) => scores.record_late_success(peer, sent, latency),
            Err(_) => scores.record_failure(peer, latency),
        }
        result.map(|()| latency)
    }

    async fn ask_probe(&self, peer: PeerId) -> Result<(), ReplicaError> {
        let clock = self.tick()?;
        let request = Bytes::from(object::encode_fetch(clock, FetchMode::Metadata, PROBE_KEY));
        self.fetch_remote(
            peer,
            FetchMode::Metadata,
            request,
            self.inner.config.attempt_timeout,
        )
        .await
        .map(drop)
    }
}

/// A probe out: its peer's round trip and when the probe falls due (its hedge delay).
struct Out {
    rtt: Option<Duration>,
    due: Instant,
}

async fn probe_loop(weak: Weak<Inner>, mut events: PeerEvents) {
    // Members connected and not probed yet, and the probes out.
    let mut waiting: Vec<PeerId> = Vec::new();
    let mut out: HashMap<PeerId, Out> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<PeerId>();
    loop {
        let next_due = out
            .values()
            .map(|probe| probe.due)
            .filter(|due| *due > now())
            .min();
        tokio::select! {
            change = events.recv() => match change {
                None => return,
                Some(PeerChange::Up(peer)) => {
                    if !waiting.contains(&peer) && !out.contains_key(&peer) {
                        waiting.push(peer);
                    }
                }
                Some(PeerChange::Down(peer)) => waiting.retain(|other| *other != peer),
            },
            Some(peer) = done_rx.recv() => {
                out.remove(&peer);
            }
            () = sleep_until(next_due) => {}
        }
        let Some(inner) = weak.upgrade() else { return };
        let service = ObjectService { inner };
        service.decide_probes(&mut waiting, &mut out, &done_tx);
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

impl ObjectService {
    /// Probes, skips or keeps waiting each member in `waiting`, nearest first (see
    /// [`PeerScores::probe_verdict`]): a probe needs [`PROBES_PER_QUORUM`] × the read quorum
    /// peers known to be faster than the member's round trip before it is skipped.
    fn decide_probes(
        &self,
        waiting: &mut Vec<PeerId>,
        out: &mut HashMap<PeerId, Out>,
        done: &mpsc::UnboundedSender<PeerId>,
    ) {
        let me = self.inner.node.peer_id();
        let needed = PROBES_PER_QUORUM * self.inner.config.read_quorum.max(1);
        let mut by_rtt: Vec<(Option<Duration>, PeerId)> = waiting
            .drain(..)
            .map(|peer| (self.inner.node.rtt_to(peer), peer))
            .collect();
        by_rtt.sort_by_key(|(rtt, _)| rtt.unwrap_or(Duration::MAX));
        let at = now();
        for (rtt, peer) in by_rtt {
            if peer == me || !self.is_member(peer) {
                continue;
            }
            let verdict = {
                let scores = lock(&self.inner.scores);
                if scores.oldest_outstanding(peer, at).is_some() {
                    // A read's request is out to it already: that measures it.
                    continue;
                }
                let pending = out
                    .values()
                    .filter(|probe| probe.due > at && probe.rtt <= rtt)
                    .count();
                scores.probe_verdict(peer, rtt, needed, pending)
            };
            match verdict {
                ProbeVerdict::Skip => {
                    self.inner.metrics.probes_skipped.inc();
                }
                ProbeVerdict::Wait => waiting.push(peer),
                ProbeVerdict::Probe => {
                    let hint = PathHint {
                        reachable: true,
                        rtt,
                    };
                    let due = at + lock(&self.inner.scores).hedge_delay(peer, hint);
                    out.insert(peer, Out { rtt, due });
                    let (service, done) = (self.clone(), done.clone());
                    tokio::spawn(async move {
                        if let Err(error) = service.probe(peer).await {
                            tracing::debug!(peer = %peer.short(), %error, "probe failed");
                        }
                        let _ = done.send(peer);
                    });
                }
            }
        }
    }
}
