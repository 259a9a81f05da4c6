//! Read at quorum: ask replicas for version and hash (one in every quorum for the content too),
//! merge, take the winner's content, repair the stale.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_STORE as STORE};
use meshwire::PeerId;

use crate::net::store::{Body, StoredObject};
use crate::proto::object::{
    self, decode_fetched, decode_stored, merge, FetchMode, Fetched, Stamp, Stored, Vote,
};
use crate::proto::quorum::QuorumConfig;

use super::{
    lock, stamp_of, BodyRead, Modes, ObjectService, ObjectServiceError, OutcomeLabel, QuorumRead,
    ReadBody, ReadOutcome, ReplicaError,
};

impl ObjectService {
    /// Reads `key` at quorum from its replicas, merges the copies and repairs stale replicas.
    pub async fn get(&self, key: &str) -> Result<ReadOutcome, ObjectServiceError> {
        let read = self.get_body(key, false).await?;
        let content = self.held_read(read.body).await?;
        Ok(ReadOutcome {
            object: StoredObject {
                stamp: read.stamp,
                content,
            },
            answers: read.answers,
            asked: read.asked,
            repairs: read.repairs,
        })
    }

    /// [`Self::get`] with the winner's content as a [`Body`]: when this node holds the winner in
    /// a content file, the file open for reading (checked as it is read) instead of its content
    /// in memory, so a large object's reader holds a chunk at a time (the HTTP API's `GET`).
    /// With `stream` false the content is always held.
    pub async fn get_body(&self, key: &str, stream: bool) -> Result<BodyRead, ObjectServiceError> {
        let started = tokio::time::Instant::now();
        let result = self.get_inner(key, stream).await;
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

    async fn get_inner(&self, key: &str, stream: bool) -> Result<BodyRead, ObjectServiceError> {
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
        let (read, modes, winner) = self.vote(&replicas, key, plan_config, stream).await?;
        if !read.outcome.reached(quorum) {
            return Err(ObjectServiceError::QuorumNotReached {
                needed: quorum,
                reached: read.outcome.answers,
                asked: read.outcome.asked,
            });
        }
        let winner = winner.ok_or(ObjectServiceError::NotFound)?;
        let requests = AtomicUsize::new(0);
        let (stamp, body) = self
            .winner_content(key, winner, &read.copies, &modes, stream, &requests)
            .await?;
        let stale: Vec<PeerId> = read
            .copies
            .iter()
            .filter(|(_, fetched)| stamp_of(fetched) != Some(stamp))
            .map(|(peer, _)| *peer)
            .collect();
        let repairs = stale.len();
        // The stale replicas get the winner from this node: held, or from its content file. A
        // winner streamed from another replica passed through to the reader and is not kept, so
        // its stale replicas (this node among them) are left to anti-entropy.
        let source = match &body {
            ReadBody::Local(Body::Held(content)) => Some(Some(StoredObject {
                stamp,
                content: content.clone(),
            })),
            ReadBody::Local(Body::File(_)) => Some(None),
            ReadBody::Remote(_) => None,
        };
        if let (true, Some(held)) = (repairs > 0, source) {
            self.inner.metrics.repairs.inc_by(repairs as u64);
            tokio::spawn(self.clone().repair(key.to_string(), stamp, held, stale));
        }
        Ok(BodyRead {
            stamp,
            body,
            answers: read.outcome.answers,
            asked: read.outcome.asked,
            repairs,
        })
    }

    /// Reads `key` from `candidates` under `config`: the plan's requests ask for the version and
    /// hash, except one in every `quorum` of them (the first of them by turns below `quorum`,
    /// read after read, so that the replicas ranked first share the content evenly), which ask
    /// for the content too, as does a later request (a hedge for a late one) while no content
    /// has arrived, and a request to a replica that owes this node no answer while the replicas
    /// asked for the content may well all be late (the first reads, when every replica is a
    /// stranger); none when this node is a candidate (it holds its own copy). The copies are
    /// merged, and the winner's content comes from an answer that carried it; only when none did
    /// (those replicas were late, failed or held another version) is it fetched afterwards, from
    /// this node's store or one of the winner's holders, raced against the content requests
    /// still in flight.
    ///
    /// A replica that sends only version and hash answers in one small packet, so a read moves
    /// about one copy of the object whatever the quorum: asking every replica for the content
    /// made each of them owe a copy per read, and a replica's new connection, whose congestion
    /// window starts at ten packets, queued its answers for seconds (the quorum sweep,
    /// `docs/scenarios.md`). One in every `quorum` rather than one in all: a plan that asks more
    /// replicas than its quorum expects some of them not to answer in time, and the content
    /// should not wait on one of those. By turns rather than at random: a random draw puts runs
    /// of reads' content on one replica (the quorum sweep's worst case at seed 1 drew the same
    /// replica for the first four reads), more than its new connection's first window lets out,
    /// and its version-and-hash answers to the next reads then wait a round trip behind them.
    /// Used by [`Self::get`], and by the lab.
    ///
    /// `object` is `None` when the quorum was not reached or no replica holds `key`.
    pub async fn read_from(
        &self,
        candidates: &[PeerId],
        key: &str,
        config: QuorumConfig,
    ) -> Result<QuorumRead, ObjectServiceError> {
        let (mut read, modes, winner) = self.vote(candidates, key, config, false).await?;
        let Some(winner) = winner.filter(|_| read.outcome.reached(config.quorum)) else {
            return Ok(read);
        };
        let requests = AtomicUsize::new(0);
        let (stamp, body) = self
            .winner_content(key, winner, &read.copies, &modes, false, &requests)
            .await?;
        read.content_requests = requests.into_inner();
        read.object = Some(StoredObject {
            stamp,
            content: self.held_read(body).await?,
        });
        Ok(read)
    }

    /// The quorum fetch of a read (see [`Self::read_from`]) and the merged winner's stamp, if the
    /// quorum was reached and some replica holds `key`; `object` is left `None`.
    async fn vote(
        &self,
        candidates: &[PeerId],
        key: &str,
        config: QuorumConfig,
        stream: bool,
    ) -> Result<(QuorumRead, Arc<Modes>, Option<Stamp>), ObjectServiceError> {
        let me = self.inner.node.peer_id();
        let quorum = config.quorum.max(1);
        let full_at = if candidates.contains(&me) {
            usize::MAX
        } else {
            self.inner.content_turn.fetch_add(1, Ordering::Relaxed) % quorum
        };
        let modes = Arc::new(Modes::one_full(full_at, quorum, candidates.len(), stream));
        let result = self
            .fetch_in(candidates, key, modes.clone(), config)
            .await?;
        let read = QuorumRead {
            object: None,
            copies: result.copies,
            outcome: result.outcome,
            content_requests: 0,
        };
        if !read.outcome.reached(config.quorum) {
            return Ok((read, modes, None));
        }
        let votes: Vec<Vote> = {
            let scores = lock(&self.inner.scores);
            read.copies
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
        let winner = merge(&votes);
        Ok((read, modes, winner))
    }

    /// The content of the quorum's `winner`: from an answer that carried it, else from this
    /// node's store or one of its holders, raced against the content requests the plan left in
    /// flight. With `stream`, this node's copy in a content file comes as the open file.
    async fn winner_content(
        &self,
        key: &str,
        winner: Stamp,
        copies: &[(PeerId, Fetched<Bytes>)],
        modes: &Modes,
        stream: bool,
        requests: &AtomicUsize,
    ) -> Result<(Stamp, ReadBody), ObjectServiceError> {
        let carried = copies.iter().find_map(|(_, fetched)| match fetched {
            Fetched::Present {
                stamp,
                content: Some(content),
            } if *stamp == winner => Some((*stamp, Body::Held(content.clone()).into())),
            _ => None,
        });
        if let Some(carried) = carried {
            return Ok(carried);
        }
        tokio::select! {
            object = modes.carried(winner) => Ok((object.stamp, Body::Held(object.content).into())),
            fetched = self.content_of(key, winner, copies, stream, requests) => fetched,
        }
    }

    /// The winner's content from this node's store or one of its holders; counts in `requests`
    /// each request it makes. With `stream`, this node's copy comes as a [`Body`] that may be a
    /// content file open for reading.
    async fn content_of(
        &self,
        key: &str,
        winner: Stamp,
        copies: &[(PeerId, Fetched<Bytes>)],
        stream: bool,
        requests: &AtomicUsize,
    ) -> Result<(Stamp, ReadBody), ObjectServiceError> {
        // A copy that wins over the quorum's winner was written (acknowledged or not) after the
        // quorum answered: serving it is as good as serving the winner, and better than a 502.
        let current =
            |stamp: Stamp| stamp == winner || crate::proto::entropy::wins(&stamp, &winner);
        let local = if stream {
            self.local_body(key).await?
        } else {
            self.local_copy(key)
                .await?
                .map(|object| (object.stamp, Body::Held(object.content)))
        };
        if let Some((stamp, body)) = local {
            if current(stamp) {
                return Ok((stamp, body.into()));
            }
        }
        let me = self.inner.node.peer_id();
        let clock = self.tick().map_err(ObjectServiceError::Clock)?;
        let request = Bytes::from(object::encode_fetch(clock, FetchMode::Full, key));
        for (peer, fetched) in copies {
            if *peer == me || stamp_of(fetched) != Some(winner) {
                continue;
            }
            requests.fetch_add(1, Ordering::Relaxed);
            if stream {
                // Streamed from the holder's content file into the reader's response: neither
                // node holds a large copy whole.
                let limit = self.inner.config.max_object_bytes as u64;
                match self.remote_content(*peer, key, current, limit, false).await {
                    Some(content) => return Ok(content),
                    None => continue,
                }
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
                    return Ok((stamp, Body::Held(reply.slice(range)).into()));
                }
            }
        }
        Err(ObjectServiceError::ContentUnavailable)
    }

    /// Sends the `stale` replicas of `key` the copy stamped `stamp`: `held`, or (when the read
    /// streamed it from this node's content file) this node's copy if it still has that stamp,
    /// sent from the file piece by piece.
    async fn repair(
        self,
        key: String,
        stamp: Stamp,
        held: Option<StoredObject>,
        stale: Vec<PeerId>,
    ) {
        let me = self.inner.node.peer_id();
        let header = match &held {
            Some(_) => match self.tick() {
                Ok(clock) => Bytes::from(object::encode_store_header(clock, &key, &stamp)),
                Err(_) => return,
            },
            None => Bytes::new(),
        };
        for peer in stale {
            let result: Result<(), ReplicaError> = match &held {
                Some(object) if peer == me => {
                    let (key, object) = (key.clone(), object.clone());
                    self.on_store(move |store| store.put(&key, object.stamp, object.content))
                        .await
                        .and_then(|held| held)
                        .map(|_| ())
                        .map_err(ReplicaError::from)
                }
                Some(object) => {
                    self.repair_one(peer, header.clone(), object.content.clone())
                        .await
                }
                // This node holds the winner (it streamed it), so it is not stale.
                None if peer == me => Ok(()),
                None => match self.send_local_copy(peer, &key, Some(stamp)).await {
                    Ok(Some(copy)) => match copy.stored {
                        Stored::Holds => Ok(()),
                        Stored::Superseded(held) => Err(ReplicaError::Superseded { held }),
                    },
                    // This node no longer holds that copy: a newer write replaced it.
                    Ok(None) => Ok(()),
                    Err(error) => Err(error),
                },
            };
            if let Err(error) = result {
                tracing::debug!(peer = %peer.short(), %key, %error, "read repair failed");
            }
        }
    }

    /// Sends one stale replica the winning copy; a refusal or a newer copy there is its answer.
    async fn repair_one(
        &self,
        peer: PeerId,
        header: Bytes,
        content: Bytes,
    ) -> Result<(), ReplicaError> {
        match self.store_at(peer, header, content).await? {
            Stored::Holds => Ok(()),
            Stored::Superseded(held) => Err(ReplicaError::Superseded { held }),
        }
    }

    /// Sends the replica `peer` a store request (`header`, then `content` from its own buffer) and
    /// checks its answer: its clock is accepted, and a refusal is counted and returned as that
    /// replica's failure.
    pub(super) async fn store_at(
        &self,
        peer: PeerId,
        header: Bytes,
        content: Bytes,
    ) -> Result<Stored, ReplicaError> {
        let reply = self.request_replica(peer, STORE, header, content).await?;
        self.stored_answer(peer, &reply)
    }

    /// Decodes a replica's answer to a store request.
    pub(super) fn stored_answer(&self, peer: PeerId, reply: &[u8]) -> Result<Stored, ReplicaError> {
        let answer = decode_stored(reply)?;
        self.accept_answer(peer, answer.clock, None)?;
        answer.answer.map_err(|reason| self.refused_answer(reason))
    }
}
