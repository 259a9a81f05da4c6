//! Write at quorum: stamp the content, send it to every replica at once, succeed at W acks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::PeerId;

use super::drive::{drive, Leftover};
use super::metrics::OutcomeLabel;
use super::streamed::Outgoing;
use super::{ObjectService, ObjectServiceError, ReplicaError, WriteOutcome};
use crate::proto::object::{self, Stamp, Stored};
use crate::proto::quorum::{Policy, QuorumConfig};

/// The first pause before a request a replica refused as busy is sent again; each later pause
/// doubles, up to [`BUSY_PAUSE_MAX`].
const BUSY_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two sends of a request a replica refused as busy.
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(160);

/// The content a write sends its replicas.
#[derive(Clone)]
pub(super) enum Copy {
    /// In memory, shared by every send.
    Held(Bytes),
    /// In a content file, read piece by piece for each replica ([`super::streamed`]).
    Written(Arc<Outgoing>),
}

impl ObjectService {
    /// Sends `peer` a request of `header` then `content` (from its own buffer) on `protocol`, and
    /// sends it again, after a pause that doubles each time, while the replica refuses it as busy
    /// (its request budget was full, so it read none of it), all within the configured deadline.
    /// Concurrent large writes through one node can fill a replica's budget for a moment: with 8
    /// writes of 8 MiB at a time through one node of `bench/http.sh`'s cluster, the replicas
    /// refused 11 stores as busy (default 64 MiB budget) and 4 of 64 writes lost their quorum
    /// while busy was taken as a failure.
    pub(super) async fn request_replica(
        &self,
        peer: PeerId,
        protocol: meshwire::ProtocolId,
        header: Bytes,
        content: Bytes,
    ) -> Result<Bytes, meshwire::RequestError> {
        let node = self.inner.node.clone();
        self.retry_busy(|left| {
            let (node, header, content) = (node.clone(), header.clone(), content.clone());
            async move {
                node.request_parts(peer, protocol, header, content, left)
                    .await
            }
        })
        .await
    }

    /// Runs `request` (given the time left) and runs it again, after a pause that doubles each
    /// time, while the replica refuses it as busy, all within the configured deadline.
    pub(super) async fn retry_busy<F, Fut>(
        &self,
        mut request: F,
    ) -> Result<Bytes, meshwire::RequestError>
    where
        F: FnMut(Duration) -> Fut,
        Fut: std::future::Future<Output = Result<Bytes, meshwire::RequestError>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.config.deadline;
        let mut pause = BUSY_PAUSE;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match request(left).await {
                Err(meshwire::RequestError::Busy(_))
                    if tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(BUSY_PAUSE_MAX);
                }
                other => return other,
            }
        }
    }

    /// The plan of a write to `replicas` replicas: ask them all at once (hedged), succeed at the
    /// write quorum (clamped to the replicas there are), all under one deadline.
    pub(crate) fn write_plan(&self, replicas: usize) -> QuorumConfig {
        let quorum = self.inner.config.write_quorum.min(replicas).max(1);
        QuorumConfig {
            policy: Policy::Hedged,
            quorum,
            fanout: replicas.max(quorum),
            max_in_flight: replicas.max(quorum),
            deadline: self.inner.config.deadline,
            attempt_timeout: self.inner.config.deadline,
        }
    }
    /// Writes `content` under `key` to its replicas; returns once W hold it.
    pub async fn put(&self, key: &str, content: Bytes) -> Result<WriteOutcome, ObjectServiceError> {
        let started = tokio::time::Instant::now();
        let result = self.put_inner(key, content).await;
        self.count_put(started, &result);
        result
    }

    /// Counts a write begun at `started` by its outcome (and its time, if it succeeded).
    pub(super) fn count_put(
        &self,
        started: tokio::time::Instant,
        result: &Result<WriteOutcome, ObjectServiceError>,
    ) {
        let label = match result {
            Ok(_) => {
                self.observe_write(started.elapsed());
                "ok"
            }
            Err(ObjectServiceError::WriteUnconfirmed { .. }) => "quorum_not_reached",
            Err(ObjectServiceError::Superseded { .. }) => "superseded",
            Err(_) => "error",
        };
        self.count_write(label);
    }

    pub(super) fn observe_write(&self, elapsed: Duration) {
        self.inner
            .metrics
            .write_seconds
            .observe(elapsed.as_secs_f64());
    }

    pub(super) fn count_write(&self, outcome: &'static str) {
        self.inner
            .metrics
            .writes
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Checks a write's key and size.
    pub(super) fn check_write(&self, key: &str, content: &Bytes) -> Result<(), ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        let max = self.inner.config.max_object_bytes;
        if content.len() > max {
            return Err(ObjectServiceError::TooLarge {
                len: content.len(),
                max,
            });
        }
        Ok(())
    }

    pub(super) async fn put_inner(
        &self,
        key: &str,
        content: Bytes,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        self.check_write(key, &content)?;
        let stamp = self.next_stamp(key, &content, None).await?;
        self.write_copies(key, stamp, Copy::Held(content)).await
    }

    /// Writes `copy` under `key` with `stamp` to the key's replicas at once; succeeds at W acks.
    pub(super) async fn write_copies(
        &self,
        key: &str,
        stamp: Stamp,
        copy: Copy,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        let replicas = self.replicas(key);
        let config = self.write_plan(replicas.len());
        let quorum = config.quorum;
        // The version is this node's latest tick, so it is also the message's clock. The content
        // follows the header on the wire from its own buffer or file (never copied to join them).
        let header = Bytes::from(object::encode_store_header(stamp.version, key, &stamp));
        let me = self.inner.node.peer_id();
        let service = self.clone();
        let key_owned = key.to_string();
        let superseded = Arc::new(AtomicUsize::new(0));
        let superseded_count = superseded.clone();
        let ask = move |peer: PeerId| {
            let service = service.clone();
            let header = header.clone();
            let copy = copy.clone();
            let key = key_owned.clone();
            let superseded = superseded_count.clone();
            async move {
                let stored = match (peer == me, copy) {
                    (true, copy) => {
                        let held = match copy {
                            Copy::Held(content) => {
                                service
                                    .on_store(move |store| store.put(&key, stamp, content))
                                    .await??
                            }
                            Copy::Written(outgoing) => {
                                service.store_written_here(key, stamp, &outgoing).await?
                            }
                        };
                        if held == stamp {
                            Stored::Holds
                        } else {
                            Stored::Superseded(held)
                        }
                    }
                    (false, Copy::Held(content)) => service.store_at(peer, header, content).await?,
                    (false, Copy::Written(outgoing)) => {
                        service.store_written_at(peer, header, &outgoing).await?
                    }
                };
                match stored {
                    Stored::Holds => Ok(()),
                    Stored::Superseded(held) => {
                        superseded.fetch_add(1, Ordering::Relaxed);
                        Err(ReplicaError::Superseded { held })
                    }
                }
            }
        };
        let plan = {
            // fanout = R: every replica is asked at once; the plan ends at W acks.
            self.plan(config, &replicas)?
        };
        let (acks, outcome) = drive(&self.inner.scores, plan, ask, Leftover::Finish).await;
        if !outcome.reached(quorum) {
            let superseded = superseded.load(Ordering::Relaxed);
            let (needed, acks, asked) = (quorum, outcome.answers, outcome.asked);
            // Only the replicas that did not answer superseded could still have acked.
            return Err(if replicas.len().saturating_sub(superseded) < quorum {
                ObjectServiceError::Superseded {
                    needed,
                    acks,
                    asked,
                    superseded,
                }
            } else {
                ObjectServiceError::WriteUnconfirmed {
                    needed,
                    acks,
                    asked,
                    superseded,
                }
            });
        }
        Ok(WriteOutcome {
            stamp,
            acks: acks.len(),
            replicas: replicas.len(),
        })
    }
}
