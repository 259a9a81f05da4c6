//! Read at quorum: ask replicas for metadata, merge, fetch the winner's content, repair the stale.

use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_STORE as STORE};
use meshwire::PeerId;

use crate::net::store::StoredObject;
use crate::proto::object::{
    self, decode_fetched, decode_stored, merge, FetchMode, Fetched, Stamp, Stored, Vote,
};
use crate::proto::quorum::QuorumConfig;

use super::{
    lock, stamp_of, ObjectService, ObjectServiceError, OutcomeLabel, ReadOutcome, ReplicaError,
};

impl ObjectService {
    /// Reads `key` at quorum from its replicas, merges the copies and repairs stale replicas.
    pub async fn get(&self, key: &str) -> Result<ReadOutcome, ObjectServiceError> {
        let started = tokio::time::Instant::now();
        let result = self.get_inner(key).await;
        let label = match &result {
            Ok(_) => {
                self.inner
                    .metrics
                    .read_seconds
                    .observe(started.elapsed().as_secs_f64());
                "ok"
            }
            Err(ObjectServiceError::NotFound) => "not_found",
            Err(ObjectServiceError::QuorumNotReached { .. }) => "quorum_not_reached",
            Err(_) => "error",
        };
        self.inner
            .metrics
            .reads
            .get_or_create(&OutcomeLabel { outcome: label })
            .inc();
        result
    }

    async fn get_inner(&self, key: &str) -> Result<ReadOutcome, ObjectServiceError> {
        let config = self.inner.config;
        let replicas = self.replicas(key);
        let quorum = config.read_quorum.min(replicas.len()).max(1);
        let plan_config = QuorumConfig {
            policy: config.read_policy,
            quorum,
            fanout: quorum,
            max_in_flight: replicas.len().max(quorum),
            deadline: config.deadline,
            attempt_timeout: config.attempt_timeout,
        };
        let result = self
            .fetch_from(&replicas, key, FetchMode::Metadata, plan_config)
            .await?;
        if !result.outcome.reached(quorum) {
            return Err(ObjectServiceError::QuorumNotReached {
                needed: quorum,
                reached: result.outcome.answers,
                asked: result.outcome.asked,
            });
        }
        let me = self.inner.node.peer_id();
        let votes: Vec<Vote> = {
            let scores = lock(&self.inner.scores);
            result
                .copies
                .iter()
                .map(|(peer, fetched)| Vote {
                    stamp: stamp_of(fetched),
                    trust: if *peer == me {
                        1.0
                    } else {
                        1.0 - scores.error_rate(*peer)
                    },
                })
                .collect()
        };
        let winner = merge(&votes).ok_or(ObjectServiceError::NotFound)?;
        let object = self.content_of(key, winner, &result.copies).await?;
        let stale: Vec<PeerId> = result
            .copies
            .iter()
            .filter(|(_, fetched)| stamp_of(fetched) != Some(winner))
            .map(|(peer, _)| *peer)
            .collect();
        let repairs = stale.len();
        if repairs > 0 {
            self.inner.metrics.repairs.inc_by(repairs as u64);
            tokio::spawn(self.clone().repair(key.to_string(), object.clone(), stale));
        }
        Ok(ReadOutcome {
            object,
            answers: result.outcome.answers,
            asked: result.outcome.asked,
            repairs,
        })
    }

    async fn content_of(
        &self,
        key: &str,
        winner: Stamp,
        copies: &[(PeerId, Fetched<Bytes>)],
    ) -> Result<StoredObject, ObjectServiceError> {
        // A copy that wins over the quorum's winner was written (acknowledged or not) after the
        // quorum answered: serving it is as good as serving the winner, and better than a 502.
        let current =
            |stamp: Stamp| stamp == winner || crate::proto::entropy::wins(&stamp, &winner);
        if let Some(local) = self.local_copy(key).await? {
            if current(local.stamp) {
                return Ok(local);
            }
        }
        let me = self.inner.node.peer_id();
        let clock = self.tick().map_err(ObjectServiceError::Clock)?;
        let request = Bytes::from(object::encode_fetch(clock, FetchMode::Full, key));
        for (peer, fetched) in copies {
            if *peer == me || stamp_of(fetched) != Some(winner) {
                continue;
            }
            let Ok(reply) = self
                .inner
                .node
                .request(*peer, FETCH, request.clone(), self.inner.config.deadline)
                .await
            else {
                continue;
            };
            let Ok(answer) =
                decode_fetched(FetchMode::Full, &reply, self.inner.config.max_object_bytes)
            else {
                continue;
            };
            if let Ok(Fetched::Present {
                stamp,
                content: Some(range),
            }) = answer.answer
            {
                if current(stamp) && self.accept_answer(*peer, answer.clock, None).is_ok() {
                    return Ok(StoredObject {
                        stamp,
                        content: reply.slice(range),
                    });
                }
            }
        }
        Err(ObjectServiceError::ContentUnavailable)
    }

    async fn repair(self, key: String, object: StoredObject, stale: Vec<PeerId>) {
        let me = self.inner.node.peer_id();
        let Ok(clock) = self.tick() else {
            return;
        };
        let mut message = object::encode_store_header(clock, &key, &object.stamp);
        message.extend_from_slice(&object.content);
        let message = Bytes::from(message);
        for peer in stale {
            let result: Result<(), ReplicaError> = if peer == me {
                self.inner
                    .store
                    .put(&key, object.stamp, object.content.clone())
                    .map(|_| ())
                    .map_err(ReplicaError::from)
            } else {
                self.repair_one(peer, message.clone()).await
            };
            if let Err(error) = result {
                tracing::debug!(peer = %peer.short(), %key, %error, "read repair failed");
            }
        }
    }

    /// Sends one stale replica the winning copy; a refusal or a newer copy there is its answer.
    async fn repair_one(&self, peer: PeerId, message: Bytes) -> Result<(), ReplicaError> {
        match self.store_at(peer, message).await? {
            Stored::Holds => Ok(()),
            Stored::Superseded(held) => Err(ReplicaError::Superseded { held }),
        }
    }

    /// Sends `message` (a store request) to the replica `peer` and checks its answer: its clock
    /// is accepted, and a refusal is counted and returned as that replica's failure.
    pub(super) async fn store_at(
        &self,
        peer: PeerId,
        message: Bytes,
    ) -> Result<Stored, ReplicaError> {
        let reply = self
            .inner
            .node
            .request(peer, STORE, message, self.inner.config.deadline)
            .await?;
        let answer = decode_stored(&reply)?;
        self.accept_answer(peer, answer.clock, None)?;
        answer.answer.map_err(|reason| {
            self.count_refused_answer(reason);
            ReplicaError::Refused(reason)
        })
    }
}
