//! Replicate versioned objects over a node's peers: writes to R replicas that succeed at W acks,
//! reads that return at quorum, merge copies, and repair stale replicas in the background.
//!
//! # Design
//!
//! Replicas of a key are the R heaviest of this node and its known peers under rendezvous hashing
//! ([`crate::proto::object::replicas_for`]). This node may be one of them; it then answers itself
//! from its store, through the same plan as the remote replicas.
//!
//! - **Write** (`put`): the version is a hybrid clock, `max(held version + 1, Unix time in ms)`, so
//!   a later write through any node wins and a rewrite through the same node always advances. All R
//!   replicas are asked at once; the write succeeds as soon as W of them hold the version (or a
//!   newer one). Requests still in flight then finish in the background, so every live replica
//!   ends up with the copy.
//! - **Read** (`get`): a [`QuorumPlan`](crate::proto::quorum::QuorumPlan) (policy from the configuration, hedged by default) asks
//!   replicas for *metadata* (version and hash) and returns at quorum. The copies are merged
//!   ([`merge`]: version, then trust = 1 − error rate, then holders). The content comes from this
//!   node's store when it holds the winner, else from one of the winner's holders (and the hash is
//!   checked). Replicas that answered with an older copy or none are repaired in the background.
//!
//! Each request has a deadline covering the whole exchange; no read ever waits on a peer beyond it.
//! The node-to-node messages are in [`crate::proto::object`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::proto::object::{
    self, content_hash, decode_fetched, decode_stored, merge, FetchMode, Fetched, ObjectError,
    Stamp, Vote,
};
use crate::proto::quorum::{Outcome, PeerScores, Policy, QuorumConfig, QuorumError, ScoreConfig};
use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_STORE as STORE};
use meshwire::{HandlerError, Node, PeerId, SubscribeError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::store::{Store, StoreError, StoredObject};

mod drive;

pub use drive::ReplicaError;
use drive::{drive, now, Leftover};

/// Settings of the object service.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObjectConfig {
    /// Replicas per key (R).
    pub replication: usize,
    /// Acks a write needs (W).
    pub write_quorum: usize,
    /// Answers a read needs.
    pub read_quorum: usize,
    /// How reads are spread over replicas.
    pub read_policy: Policy,
    /// Deadline of a whole read or write.
    pub deadline: Duration,
    /// How long a sequential read waits for one replica.
    pub attempt_timeout: Duration,
    /// Largest object content, in bytes.
    pub max_object_bytes: usize,
    /// Peer ranking settings.
    pub scores: ScoreConfig,
}

impl Default for ObjectConfig {
    fn default() -> Self {
        Self {
            replication: 3,
            write_quorum: 2,
            read_quorum: 2,
            read_policy: Policy::Hedged,
            deadline: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(2),
            max_object_bytes: 8 * 1024 * 1024,
            scores: ScoreConfig::default(),
        }
    }
}

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectServiceError {
    /// The key is not valid.
    #[error(transparent)]
    InvalidKey(ObjectError),
    /// The content exceeds the maximum.
    #[error("object of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The content length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No replica holds the key.
    #[error("no such object")]
    NotFound,
    /// Fewer replicas answered than the quorum needs.
    #[error("quorum not reached: {reached} of {needed} needed ({asked} replicas asked)")]
    QuorumNotReached {
        /// Answers or acks needed.
        needed: usize,
        /// Answers or acks received.
        reached: usize,
        /// Replicas asked.
        asked: usize,
    },
    /// The quorum agreed on a copy but none of its holders delivered its content in time.
    #[error("no holder of the winning copy delivered it")]
    ContentUnavailable,
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The settings cannot work.
    #[error(transparent)]
    Config(#[from] QuorumError),
    /// Another service already handles the object protocols on this node.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// `max_object_bytes` does not fit in one node message: a PUT of that size could never be
    /// replicated.
    #[error(
        "max_object_bytes = {max_object_bytes} does not fit in one message: the node's frame \
         limit is {max_payload_bytes} bytes, of which {overhead} are the object header; \
         use at most {largest}"
    )]
    ObjectLimit {
        /// The configured largest object.
        max_object_bytes: usize,
        /// The node's largest message payload (`Limits::max_payload_bytes`).
        max_payload_bytes: u32,
        /// Bytes of the largest object message header.
        overhead: usize,
        /// The largest `max_object_bytes` that fits.
        largest: usize,
    },
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// The version and hash written.
    pub stamp: Stamp,
    /// Replicas that acknowledged before the write returned.
    pub acks: usize,
    /// Replicas asked.
    pub replicas: usize,
}

/// What a read returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutcome {
    /// The winning copy.
    pub object: StoredObject,
    /// Replicas that answered.
    pub answers: usize,
    /// Replicas asked.
    pub asked: usize,
    /// Replicas being repaired in the background.
    pub repairs: usize,
}

/// The answers a quorum fetch collected.
#[derive(Debug, Clone)]
pub struct FetchResult {
    /// Each answering peer's copy.
    pub copies: Vec<(PeerId, Fetched<Bytes>)>,
    /// How the plan ended.
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Default)]
struct ObjectMetrics {
    reads: Family<OutcomeLabel, Counter>,
    writes: Family<OutcomeLabel, Counter>,
    repairs: Counter,
    requests_per_read: Counter,
}

/// The object service of one node. Clones share it.
#[derive(Debug, Clone)]
pub struct ObjectService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: Node,
    store: Arc<Store>,
    config: ObjectConfig,
    scores: Mutex<PeerScores<PeerId>>,
    rng: Mutex<SmallRng>,
    metrics: ObjectMetrics,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl ObjectService {
    /// Serves objects from `store` on `node` and registers the fetch and store handlers and the
    /// object metrics. `seed` seeds the exploration RNG (`None`: from the OS).
    pub fn new(
        node: Node,
        store: Store,
        config: ObjectConfig,
        seed: Option<u64>,
    ) -> Result<Self, ObjectServiceError> {
        QuorumConfig {
            policy: config.read_policy,
            ..QuorumConfig::hedged(config.read_quorum, config.deadline)
        }
        .validate()?;
        if config.write_quorum == 0
            || config.write_quorum > config.replication
            || config.read_quorum > config.replication
        {
            return Err(QuorumError::Invalid("need 1 <= W, read quorum <= R").into());
        }
        let max_payload_bytes = node.config().limits.max_payload_bytes;
        let overhead = crate::proto::object::MAX_MESSAGE_OVERHEAD;
        let largest = (max_payload_bytes as usize).saturating_sub(overhead);
        if config.max_object_bytes > largest {
            return Err(ObjectServiceError::ObjectLimit {
                max_object_bytes: config.max_object_bytes,
                max_payload_bytes,
                overhead,
                largest,
            });
        }
        let rng = match seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        let service = Self {
            inner: Arc::new(Inner {
                node: node.clone(),
                store: Arc::new(store),
                config,
                scores: Mutex::new(PeerScores::new(config.scores)),
                rng: Mutex::new(rng),
                metrics: ObjectMetrics::default(),
            }),
        };
        let metrics = &service.inner.metrics;
        node.metrics().register_with(|registry| {
            registry.register(
                "object_reads",
                "Quorum reads by outcome",
                metrics.reads.clone(),
            );
            registry.register(
                "object_writes",
                "Quorum writes by outcome",
                metrics.writes.clone(),
            );
            registry.register(
                "object_read_repairs",
                "Stale replicas sent the winning copy after a read",
                metrics.repairs.clone(),
            );
            registry.register(
                "object_read_requests",
                "Replica requests made by quorum reads",
                metrics.requests_per_read.clone(),
            );
        });
        // The handlers live in the node; a weak reference keeps them from keeping the node alive.
        let weak = Arc::downgrade(&service.inner);
        node.handle(FETCH, move |_, body| {
            let result = upgrade(&weak).and_then(|service| service.serve_fetch(&body));
            async move { result }
        })?;
        let weak = Arc::downgrade(&service.inner);
        node.handle(STORE, move |_, body| {
            let result = upgrade(&weak).and_then(|service| service.serve_store(body));
            async move { result }
        })?;
        Ok(service)
    }

    /// The node underneath.
    pub fn node(&self) -> &Node {
        &self.inner.node
    }

    /// The local store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The settings.
    pub fn config(&self) -> &ObjectConfig {
        &self.inner.config
    }

    /// A snapshot of the latency estimate, tail estimate and error rate of `peer`.
    pub fn peer_score(&self, peer: PeerId) -> (Duration, Duration, f64) {
        let scores = lock(&self.inner.scores);
        (
            scores.expected_latency(peer),
            scores.tail_latency(peer),
            scores.error_rate(peer),
        )
    }

    /// Answers a fetch request from the local store.
    pub fn serve_fetch(&self, body: &[u8]) -> Result<Bytes, HandlerError> {
        let (mode, key) = object::decode_fetch(body).map_err(malformed)?;
        let held = self.inner.store.get(key).map_err(handler_error)?;
        Ok(encode_fetched(mode, held.as_ref()))
    }

    /// Stores a copy sent by a peer if it wins over the local one; answers the version held.
    pub fn serve_store(&self, body: Bytes) -> Result<Bytes, HandlerError> {
        let request =
            object::decode_store(&body, self.inner.config.max_object_bytes).map_err(malformed)?;
        let held = self
            .inner
            .store
            .put(
                request.key,
                request.stamp,
                body.slice(request.content.clone()),
            )
            .map_err(handler_error)?;
        Ok(Bytes::copy_from_slice(&object::encode_stored(held.version)))
    }

    /// This node and its known peers, the population replicas are chosen from.
    pub fn population(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self.inner.node.peers().iter().map(|p| p.peer).collect();
        peers.push(self.inner.node.peer_id());
        peers
    }

    /// The replicas of `key`, heaviest first.
    pub fn replicas(&self, key: &str) -> Vec<PeerId> {
        let population: Vec<[u8; 32]> = self.population().iter().map(|p| *p.as_bytes()).collect();
        object::replicas_for(key, &population, self.inner.config.replication)
            .into_iter()
            .map(PeerId::from_bytes)
            .collect()
    }

    /// The local copy of `key`, without asking anyone.
    pub fn get_local(&self, key: &str) -> Result<StoredObject, ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        self.inner
            .store
            .get(key)?
            .ok_or(ObjectServiceError::NotFound)
    }

    /// Writes `content` under `key` to its replicas; returns once W hold it.
    pub async fn put(&self, key: &str, content: Bytes) -> Result<WriteOutcome, ObjectServiceError> {
        let result = self.put_inner(key, content).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(ObjectServiceError::QuorumNotReached { .. }) => "quorum_not_reached",
            Err(_) => "error",
        };
        self.inner
            .metrics
            .writes
            .get_or_create(&OutcomeLabel { outcome: label })
            .inc();
        result
    }

    async fn put_inner(
        &self,
        key: &str,
        content: Bytes,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        let max = self.inner.config.max_object_bytes;
        if content.len() > max {
            return Err(ObjectServiceError::TooLarge {
                len: content.len(),
                max,
            });
        }
        let held = self.inner.store.stamp(key).unwrap_or(None);
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let stamp = Stamp {
            version: held.map_or(0, |s| s.version + 1).max(unix_ms),
            hash: content_hash(&content),
        };
        let replicas = self.replicas(key);
        let config = QuorumConfig {
            policy: Policy::Hedged,
            quorum: self.inner.config.write_quorum,
            fanout: replicas.len().max(self.inner.config.write_quorum),
            max_in_flight: replicas.len().max(self.inner.config.write_quorum),
            deadline: self.inner.config.deadline,
            attempt_timeout: self.inner.config.deadline,
        };
        let mut header = object::encode_store_header(key, &stamp);
        header.extend_from_slice(&content);
        let message = Bytes::from(header);
        let me = self.inner.node.peer_id();
        let service = self.clone();
        let key_owned = key.to_string();
        let ask = move |peer: PeerId| {
            let service = service.clone();
            let message = message.clone();
            let content = content.clone();
            let key = key_owned.clone();
            async move {
                let held = if peer == me {
                    service.inner.store.put(&key, stamp, content)?.version
                } else {
                    let reply = service
                        .inner
                        .node
                        .request(peer, STORE, message, service.inner.config.deadline)
                        .await?;
                    decode_stored(&reply)?
                };
                if held >= stamp.version {
                    Ok(())
                } else {
                    Err(ReplicaError::Stale { held })
                }
            }
        };
        let plan = {
            let scores = lock(&self.inner.scores);
            let mut rng = lock(&self.inner.rng);
            // fanout = R: every replica is asked at once; the plan ends at W acks.
            scores.plan(config, &replicas, now(), &mut *rng)?
        };
        let (acks, outcome) = drive(&self.inner.scores, plan, ask, Leftover::Finish).await;
        if !outcome.reached(self.inner.config.write_quorum) {
            return Err(ObjectServiceError::QuorumNotReached {
                needed: self.inner.config.write_quorum,
                reached: outcome.answers,
                asked: outcome.asked,
            });
        }
        Ok(WriteOutcome {
            stamp,
            acks: acks.len(),
            replicas: replicas.len(),
        })
    }

    /// Asks `candidates` for `key` under `config` and returns what the quorum answered. Used by
    /// reads, and by the lab to compare policies over the same code path.
    pub async fn fetch_from(
        &self,
        candidates: &[PeerId],
        key: &str,
        mode: FetchMode,
        config: QuorumConfig,
    ) -> Result<FetchResult, ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        let plan = {
            let scores = lock(&self.inner.scores);
            let mut rng = lock(&self.inner.rng);
            scores.plan(config, candidates, now(), &mut *rng)?
        };
        let request = Bytes::from(object::encode_fetch(mode, key));
        let me = self.inner.node.peer_id();
        let service = self.clone();
        let max = self.inner.config.max_object_bytes;
        let attempt_deadline = config.deadline;
        let key_owned = key.to_string();
        let ask = move |peer: PeerId| {
            let service = service.clone();
            let request = request.clone();
            let key = key_owned.clone();
            async move {
                let reply = if peer == me {
                    encode_fetched(mode, service.inner.store.get(&key)?.as_ref())
                } else {
                    service
                        .inner
                        .node
                        .request(peer, FETCH, request, attempt_deadline)
                        .await?
                };
                let fetched = decode_fetched(mode, &reply, max)?;
                Ok(match fetched {
                    Fetched::Absent => Fetched::Absent,
                    Fetched::Present { stamp, content } => Fetched::Present {
                        stamp,
                        content: content.map(|range| reply.slice(range)),
                    },
                })
            }
        };
        let (copies, outcome) = drive(&self.inner.scores, plan, ask, Leftover::Cancel).await;
        self.inner
            .metrics
            .requests_per_read
            .inc_by(outcome.asked as u64);
        Ok(FetchResult { copies, outcome })
    }

    /// Reads `key` at quorum from its replicas, merges the copies and repairs stale replicas.
    pub async fn get(&self, key: &str) -> Result<ReadOutcome, ObjectServiceError> {
        let result = self.get_inner(key).await;
        let label = match &result {
            Ok(_) => "ok",
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
        if let Some(local) = self.inner.store.get(key)? {
            if local.stamp == winner {
                return Ok(local);
            }
        }
        let me = self.inner.node.peer_id();
        let request = Bytes::from(object::encode_fetch(FetchMode::Full, key));
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
            if let Ok(Fetched::Present {
                stamp,
                content: Some(range),
            }) = decode_fetched(FetchMode::Full, &reply, self.inner.config.max_object_bytes)
            {
                if stamp == winner {
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
        let mut message = object::encode_store_header(&key, &object.stamp);
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
                self.inner
                    .node
                    .request(peer, STORE, message.clone(), self.inner.config.deadline)
                    .await
                    .map(|_| ())
                    .map_err(ReplicaError::from)
            };
            if let Err(error) = result {
                tracing::debug!(peer = %peer.short(), %key, %error, "read repair failed");
            }
        }
    }
}

fn stamp_of<B>(fetched: &Fetched<B>) -> Option<Stamp> {
    match fetched {
        Fetched::Absent => None,
        Fetched::Present { stamp, .. } => Some(*stamp),
    }
}

fn encode_fetched(mode: FetchMode, held: Option<&StoredObject>) -> Bytes {
    let mut out = object::encode_fetched_header(held.map(|o| &o.stamp));
    if let (FetchMode::Full, Some(object)) = (mode, held) {
        out.extend_from_slice(&object.content);
    }
    Bytes::from(out)
}

fn upgrade(weak: &std::sync::Weak<Inner>) -> Result<ObjectService, HandlerError> {
    weak.upgrade()
        .map(|inner| ObjectService { inner })
        .ok_or(HandlerError::Stopped)
}

fn malformed(error: impl std::error::Error + Send + Sync + 'static) -> HandlerError {
    HandlerError::Malformed(Box::new(error))
}

fn handler_error(error: impl std::error::Error + Send + Sync + 'static) -> HandlerError {
    HandlerError::Failed(Box::new(error))
}
