//! Probes: one version-and-hash request to each member as its connection comes up, so that the
//! first reads rank it by what it takes rather than as a stranger.
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
//! Cost: one request per member per connection (again after a reconnect), never more than one
//! out to a peer; the `object_probe_requests` counter counts them. `ScoreConfig::probe_on_connect`
//! turns them off.

use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use meshwire::{PeerChange, PeerEvents, PeerId};

use crate::proto::object::{self, FetchMode};
use crate::proto::quorum::PathHint;

use super::{drive::now, lock, Inner, ObjectService, ReplicaError};

/// The key a probe asks for: any valid key does, a stored one included (version and hash only).
pub const PROBE_KEY: &str = "meshwire.probe";

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

async fn probe_loop(weak: Weak<Inner>, mut events: PeerEvents) {
    while let Some(change) = events.recv().await {
        let PeerChange::Up(peer) = change else {
            continue;
        };
        let Some(inner) = weak.upgrade() else { return };
        let service = ObjectService { inner };
        let me = service.inner.node.peer_id();
        let idle = lock(&service.inner.scores)
            .oldest_outstanding(peer, now())
            .is_none();
        if peer != me && service.is_member(peer) && idle {
            tokio::spawn(async move {
                if let Err(error) = service.probe(peer).await {
                    tracing::debug!(peer = %peer.short(), %error, "probe failed");
                }
            });
        }
    }
}
