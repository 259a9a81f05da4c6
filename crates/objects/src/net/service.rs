//! Replicate versioned objects over the members of a cluster: writes to R replicas that succeed
//! at W acks, reads that return at quorum, merge copies, and repair stale replicas in the background.
//!
//! # Design
//!
//! **Members.** The cluster is the configured member list plus this node (a node is always a member
//! of its own cluster; with no members configured it is a cluster of one, and `meshwire node` says
//! so at start).
//! Replicas of a key are the R heaviest members under rendezvous hashing
//! ([`crate::proto::object::replicas_for`]), connected or not, so placement changes only when the
//! member list does ([`ObjectService::set_members`]), never when a connection comes or goes. A
//! connected non-member never enters placement, and its object requests are refused (see
//! `service/serve.rs`). This node may be a replica; it then answers itself from its store, through
//! the same plan as the remote replicas.
//!
//! **Quorums.** A key has `min(R, cluster size)` replicas; the write quorum W and the read quorum
//! are both clamped to that number, the same way, so a cluster of one writes and reads with a
//! quorum of one (`201` with `acks: 1, replicas: 1`).
//!
//! - **Write** (`put`): the version is a tick of this node's hybrid logical clock
//!   ([`crate::proto::clock`]), after it observed the version it holds, so a later write through
//!   any member wins and a rewrite through the same node always advances. All replicas are asked
//!   at once; an ack means the replica now holds exactly this version and hash. A replica holding
//!   a winning copy answers *superseded*, which is not an ack. The write succeeds as soon as W
//!   replicas acked, each after a durable commit: `201` means durable on W replicas. Requests
//!   still in flight then finish in the background, so every live replica ends up with the copy.
//!   Fewer than W acks by the deadline is [`ObjectServiceError::WriteUnconfirmed`]: the outcome is
//!   unknown, since the replicas that got the copy keep it and a later read may return it. If
//!   replicas holding a newer copy leave fewer than W that could ack, the write lost to a newer
//!   one ([`ObjectServiceError::Superseded`]): it will not be read.
//! - **Read** (`get`, [`ObjectService::read_from`]): a [`QuorumPlan`] (policy from the
//!   configuration, hedged by default) asks replicas in parallel and returns at quorum. Most
//!   requests ask for *metadata* (version and hash) only; one in every `quorum` requests, the
//!   first of them taken by turns from read to read, asks for the content too (none when this
//!   node is a replica: it answers itself, version and hash, its content checked through a small
//!   buffer), and so does a hedge sent while no content has arrived. A replica answers a
//!   metadata request the same way, without reading the content into memory.
//!   A read then moves about one copy of the object, not one per replica: when every replica
//!   sent its copy, each owed a copy per read, and a replica's new connection (a congestion
//!   window of ten packets) queued them for seconds (`docs/scenarios.md`, the quorum sweep). An
//!   answer whose clock or version is beyond the accepted skew counts as that replica's
//!   failure, never as a copy. The copies are merged ([`merge`](crate::proto::object::merge):
//!   version, then trust = 1 − error rate, then holders). The content comes from an answer that
//!   carried the winner's, else from this node's store when it holds the winner, else from one
//!   of the winner's holders, raced against any content request the plan left in flight (the
//!   hash is checked either way). [`ObjectService::get_body`] (the HTTP API's `GET`) takes this
//!   node's copy as its content file open for reading, streamed and checked again as it is
//!   read. Replicas that answered with an older copy or none are
//!   repaired in the background.
//!
//! Each request has a deadline covering the whole exchange; no read ever waits on a peer beyond it.
//! The node-to-node messages are in [`crate::proto::object`].

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::proto::clock::{ClockError, HybridClock};
use crate::proto::object::{self, decode_fetched, FetchMode, Fetched, Stamp};
use crate::proto::quorum::{
    Outcome, PathHint, PeerScores, Policy, QuorumConfig, QuorumError, QuorumPlan, ScoreConfig,
};
use bytes::Bytes;
use meshwire::protocols::{
    OBJECT_CAS as CAS, OBJECT_FETCH as FETCH, OBJECT_STAMPS as STAMPS, OBJECT_STORE as STORE,
    OBJECT_SYNC as SYNC,
};
use meshwire::{HandlerError, Node, PeerId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::store::{Body, Store, StoredObject};

mod cas;
mod drive;
mod entropy;
mod error;
mod metrics;
mod modes;
mod probe;
mod read;
mod serve;
mod stamps;
pub(crate) mod store_calls;
mod streamed;
mod warn_limit;
mod write;

pub use drive::ReplicaError;
use drive::{drive, now, Leftover};
pub use entropy::{RoundReport, IN_FLIGHT, MAX_TRANSFER_BYTES, PULL_BATCH};
pub use error::ObjectServiceError;
use metrics::{DirectionLabel, ObjectMetrics, OutcomeLabel, ReasonLabel};
use modes::{Modes, Odds};
pub use probe::PROBE_KEY;
pub use streamed::{ObjectWriter, ReadBody, RemoteContent, RemoteContentError, PIECE_BYTES};

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
    /// How far ahead of this node's clock a peer's clock or version may be before it is refused.
    pub max_clock_skew: Duration,
    /// Peer ranking settings.
    pub scores: ScoreConfig,
    /// Mean time between anti-entropy rounds (jittered ±50%; zero disables anti-entropy). See
    /// `service/entropy.rs`.
    pub anti_entropy_interval: Duration,
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
            max_clock_skew: Duration::from_secs(5),
            scores: ScoreConfig::default(),
            anti_entropy_interval: Duration::from_secs(5),
        }
    }
}

impl ObjectConfig {
    /// Checks what [`ObjectService::new`] checks, before any node exists: the quorums fit the
    /// replication and the largest object fits a node message of `max_payload_bytes`.
    pub fn validate_for(&self, max_payload_bytes: u32) -> Result<(), ObjectServiceError> {
        QuorumConfig {
            policy: self.read_policy,
            ..QuorumConfig::hedged(self.read_quorum, self.deadline)
        }
        .validate()?;
        if self.write_quorum == 0
            || self.write_quorum > self.replication
            || self.read_quorum > self.replication
        {
            return Err(QuorumError::Invalid("need 1 <= W, read quorum <= R").into());
        }
        let overhead = crate::proto::object::MAX_MESSAGE_OVERHEAD;
        let largest = (max_payload_bytes as usize).saturating_sub(overhead);
        if self.max_object_bytes > largest {
            return Err(ObjectServiceError::ObjectLimit {
                max_object_bytes: self.max_object_bytes,
                max_payload_bytes,
                overhead,
                largest,
            });
        }
        Ok(())
    }
}

/// The physical clock versions are built on: Unix time in milliseconds.
pub trait PhysicalClock: std::fmt::Debug + Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl PhysicalClock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
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

/// What a read returned, its content as a [`Body`] ([`ObjectService::get_body`]).
#[derive(Debug)]
pub struct BodyRead {
    /// The winning copy's version and hash.
    pub stamp: Stamp,
    /// Its content: held, this node's content file open for reading, or arriving from a
    /// replica that holds it.
    pub body: ReadBody,
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

/// What a read at quorum found ([`ObjectService::read_from`]).
#[derive(Debug, Clone)]
pub struct QuorumRead {
    /// The winning copy; `None` when the quorum was not reached or no replica holds the key.
    pub object: Option<StoredObject>,
    /// Each answering replica's copy (with its content only where it was asked for).
    pub copies: Vec<(PeerId, Fetched<Bytes>)>,
    /// How the plan ended.
    pub outcome: Outcome,
    /// Requests made after the plan ended for the winner's content: 0 when an answer in the plan
    /// carried it or this node held it.
    pub content_requests: usize,
}

/// How a service is started besides its [`ObjectConfig`].
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// The other members of the cluster (this node is always one; listing it changes nothing).
    pub members: Vec<PeerId>,
    /// Seeds the exploration RNG (`None`: from the OS).
    pub seed: Option<u64>,
    /// The physical clock versions are built on.
    pub clock: Arc<dyn PhysicalClock>,
    /// Run store calls and hashing on the calling task instead of tokio's blocking pool (default
    /// `false`). Each call then stalls its runtime thread; it is for a simulation in virtual time
    /// (the lab), where the blocking pool's threads would make the order of events depend on
    /// the operating system's scheduling, so that a seed repeats a run exactly.
    pub inline_store: bool,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            seed: None,
            clock: Arc::new(SystemClock),
            inline_store: false,
        }
    }
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
    /// The cluster: the configured members and this node, sorted.
    members: RwLock<Arc<Vec<PeerId>>>,
    clock: Mutex<HybridClock>,
    physical: Arc<dyn PhysicalClock>,
    /// See [`ServiceOptions::inline_store`].
    inline_store: bool,
    pending: Mutex<cas::PendingWrites>,
    scores: Arc<Mutex<PeerScores<PeerId>>>,
    rng: Mutex<SmallRng>,
    /// Which of the first `quorum` requests of the next read asks for the content (taken modulo
    /// the quorum): reads take turns, so the replicas ranked first share the content evenly.
    content_turn: AtomicUsize,
    metrics: ObjectMetrics,
    /// Per peer, the bucket count its last anti-entropy answer called for (raised when a bucket
    /// was too large to list whole).
    entropy_buckets: Mutex<HashMap<PeerId, usize>>,
    /// When a refused request from a peer was last logged at warn ([`warn_limit`]).
    refusal_warnings: Mutex<warn_limit::WarnLimit<(PeerId, &'static str)>>,
    /// Version requests waiting to be sent, per replica ([`stamps`]).
    stamp_queues: Mutex<stamps::StampQueues>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl ObjectService {
    /// Serves objects from `store` on `node` among the members in `options`, and registers the
    /// fetch and store handlers and the object metrics.
    pub fn new(
        node: Node,
        store: Store,
        config: ObjectConfig,
        options: ServiceOptions,
    ) -> Result<Self, ObjectServiceError> {
        config.validate_for(node.config().limits.max_payload_bytes)?;
        let mut rng = match options.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        let content_turn = AtomicUsize::new(rng.random::<u32>() as usize);
        let service = Self {
            inner: Arc::new(Inner {
                node: node.clone(),
                store: Arc::new(store),
                config,
                members: RwLock::new(Arc::new(Vec::new())),
                clock: Mutex::new(HybridClock::new(config.max_clock_skew)),
                physical: options.clock,
                inline_store: options.inline_store,
                pending: Mutex::new(cas::PendingWrites::default()),
                scores: Arc::new(Mutex::new(PeerScores::new(config.scores))),
                rng: Mutex::new(rng),
                content_turn,
                metrics: ObjectMetrics::default(),
                entropy_buckets: Mutex::new(HashMap::new()),
                refusal_warnings: Mutex::new(warn_limit::WarnLimit::default()),
                stamp_queues: Mutex::new(stamps::StampQueues::default()),
            }),
        };
        service.set_members(options.members);
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
                "object_read_duration_seconds",
                "Latency of successful quorum reads, from the request to the merged answer",
                metrics.read_seconds.clone(),
            );
            registry.register(
                "object_write_duration_seconds",
                "Latency of successful quorum writes, from the request to W acknowledgements",
                metrics.write_seconds.clone(),
            );
            let counts = service.inner.store.commit_counts();
            registry.register(
                "object_store_commits",
                "Durable write transactions of the local store (concurrent writes share one)",
                counts.commits.clone(),
            );
            registry.register(
                "object_store_committed_writes",
                "Objects written by those transactions",
                counts.writes.clone(),
            );
            registry.register(
                "object_store_checkpoints",
                "Empty commits that saved the store's allocator state once it fell idle after \
                 commits that did not (a crash then reopens it without a rebuild)",
                counts.checkpoints.clone(),
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
            registry.register(
                "object_probe_requests",
                "Version-and-hash probes sent to members as their connections came up",
                metrics.probe_requests.clone(),
            );
            registry.register(
                "object_probes_skipped",
                "Members not probed: enough others known to answer in time within their round trip",
                metrics.probes_skipped.clone(),
            );
            registry.register(
                "object_stamp_requests",
                "Version requests sent to replicas, one per request message: a lone metadata fetch or a gathered stamps request",
                metrics.stamp_requests.clone(),
            );
            registry.register(
                "object_stamp_request_keys",
                "Keys asked in those requests (over object_stamp_requests_total: keys per request)",
                metrics.stamp_request_keys.clone(),
            );
            registry.register(
                "object_refused_requests",
                "Object requests from peers refused, by reason",
                metrics.refused_requests.clone(),
            );
            registry.register(
                "object_refused_answers",
                "Replica answers this node refused or was refused with, by reason",
                metrics.refused_answers.clone(),
            );
            registry.register(
                "object_anti_entropy_rounds",
                "Anti-entropy rounds run",
                metrics.entropy_rounds.clone(),
            );
            registry.register(
                "object_anti_entropy_exchanges",
                "Anti-entropy exchanges with one member, by outcome",
                metrics.entropy_exchanges.clone(),
            );
            registry.register(
                "object_anti_entropy_repaired_keys",
                "Copies anti-entropy pulled here or pushed to a member, by direction",
                metrics.entropy_repaired.clone(),
            );
            registry.register_with_unit(
                "object_anti_entropy_sent",
                "Payload bytes of the anti-entropy exchanges this node started, sent (digests, pull and push requests)",
                prometheus_client::registry::Unit::Bytes,
                metrics.entropy_sent_bytes.clone(),
            );
            registry.register_with_unit(
                "object_anti_entropy_received",
                "Payload bytes of the anti-entropy exchanges this node started, received (listings, pulled copies, answers)",
                prometheus_client::registry::Unit::Bytes,
                metrics.entropy_received_bytes.clone(),
            );
            registry.register(
                "object_anti_entropy_errors",
                "Digest exchanges refused as malformed or from another placement, by reason",
                metrics.entropy_errors.clone(),
            );
            registry.register(
                "object_anti_entropy_scan_seconds",
                "Time of one anti-entropy scan of the store's record headers",
                metrics.entropy_scan_seconds.clone(),
            );
        });
        // The handlers live in the node; a weak reference keeps them from keeping the node alive.
        let weak = Arc::downgrade(&service.inner);
        // FETCH, STORE and CAS touch the store: they run on the blocking pool (FETCH only when
        // the object cache does not hold the object).
        node.handle_streamed_answers(FETCH, move |peer, body| {
            let service = upgrade(&weak);
            async move { service?.serve_fetch_offloaded(peer, body).await }
        })?;
        let weak = Arc::downgrade(&service.inner);
        if service.streamed_min_bytes().is_some() {
            // Copies read as they arrive, large ones written to their content file piece by piece.
            node.handle_streamed(STORE, move |peer, body| {
                let service = upgrade(&weak);
                async move { service?.serve_store_streamed(peer, body).await }
            })?;
        } else {
            node.handle(STORE, move |peer, body| {
                let service = upgrade(&weak);
                async move {
                    service?
                        .serve_blocking(move |s| s.serve_store(peer, body))
                        .await
                }
            })?;
        }
        let weak = Arc::downgrade(&service.inner);
        node.handle(STAMPS, move |peer, body| {
            let service = upgrade(&weak);
            async move { service?.serve_stamps(peer, body).await }
        })?;
        let weak = Arc::downgrade(&service.inner);
        node.handle(SYNC, move |peer, body| {
            let service = upgrade(&weak);
            async move { service?.serve_sync(peer, body).await }
        })?;
        let weak = Arc::downgrade(&service.inner);
        if service.streamed_min_bytes().is_some() {
            // Large prepares written to their content file as they arrive, as large copies are.
            node.handle_streamed(CAS, move |peer, body| {
                let service = upgrade(&weak);
                async move { service?.serve_cas_streamed(peer, body).await }
            })?;
        } else {
            node.handle(CAS, move |peer, body| {
                let service = upgrade(&weak);
                async move {
                    service?
                        .serve_blocking(move |s| s.serve_cas(peer, body))
                        .await
                }
            })?;
        }
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

    /// Replaces the member list: placement follows the new cluster (`members` plus this node) at
    /// once, and requests from peers outside it are refused from now on. With no members, this
    /// node is a cluster of one (`meshwire node` says so at start).
    pub fn set_members(&self, members: impl IntoIterator<Item = PeerId>) {
        let me = self.inner.node.peer_id();
        let cluster: BTreeSet<PeerId> = members.into_iter().chain(std::iter::once(me)).collect();
        tracing::debug!(members = cluster.len(), "object cluster members set");
        let cluster = Arc::new(cluster.into_iter().collect());
        *self
            .inner
            .members
            .write()
            .unwrap_or_else(|e| e.into_inner()) = cluster;
    }

    /// The cluster: the configured members and this node, sorted. Replicas are chosen from it.
    pub fn members(&self) -> Arc<Vec<PeerId>> {
        self.inner
            .members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether `peer` is a member of this node's cluster.
    pub fn is_member(&self, peer: PeerId) -> bool {
        self.members().binary_search(&peer).is_ok()
    }

    /// The replicas of `key` among the members, heaviest first.
    pub fn replicas(&self, key: &str) -> Vec<PeerId> {
        let population: Vec<[u8; 32]> = self.members().iter().map(|p| *p.as_bytes()).collect();
        object::replicas_for(key, &population, self.inner.config.replication)
            .into_iter()
            .map(PeerId::from_bytes)
            .collect()
    }

    /// The latest timestamp of this node's hybrid clock.
    pub fn clock(&self) -> u64 {
        lock(&self.inner.clock).last()
    }

    /// A new timestamp of this node's hybrid clock.
    fn tick(&self) -> Result<u64, ClockError> {
        let now_ms = self.inner.physical.now_ms();
        lock(&self.inner.clock).tick(now_ms)
    }

    /// Accepts the clock of a replica's answer and the version it carries (if any), or counts
    /// and reports why not.
    fn accept_answer(
        &self,
        peer: PeerId,
        clock: u64,
        version: Option<u64>,
    ) -> Result<(), ReplicaError> {
        let now_ms = self.inner.physical.now_ms();
        let result = {
            let mut hybrid = lock(&self.inner.clock);
            hybrid
                .check(clock, now_ms)
                .and_then(|()| version.map_or(Ok(()), |v| hybrid.check(v, now_ms)))
                .and_then(|()| version.map_or(Ok(()), |v| hybrid.observe(v, now_ms)))
                .and_then(|()| hybrid.observe(clock, now_ms))
        };
        result.map_err(|error| {
            let reason = serve::refusal_of(error);
            self.count_refused_answer(reason);
            tracing::warn!(%peer, reason = reason.name(), %error, "replica answer refused");
            ReplicaError::Clock(error)
        })
    }

    /// A replica's refusal as the replica's error, counted.
    fn refused_answer(&self, reason: object::Refusal) -> ReplicaError {
        self.count_refused_answer(reason);
        ReplicaError::Refused(reason)
    }

    fn count_refused_answer(&self, reason: object::Refusal) {
        self.inner
            .metrics
            .refused_answers
            .get_or_create(&ReasonLabel {
                reason: reason.name(),
            })
            .inc();
    }

    /// The local copy of `key`, without asking anyone. Reads the store on the calling thread
    /// (in async code, use [`Self::get_local_body`], as the HTTP API does).
    pub fn get_local(&self, key: &str) -> Result<StoredObject, ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        self.inner
            .store
            .get(key)?
            .ok_or(ObjectServiceError::NotFound)
    }

    /// The local copy of `key` as a [`Body`] (see [`Store::get_body`]), without asking anyone;
    /// the store is read on the blocking pool.
    pub async fn get_local_body(&self, key: &str) -> Result<(Stamp, Body), ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        self.local_body(key)
            .await?
            .ok_or(ObjectServiceError::NotFound)
    }

    /// A plan over `candidates`, ranked by their scores and by what the transport knows of each
    /// path: this node is reachable at no distance; a peer is reachable while its connection is
    /// up, at the connection's round trip.
    pub(super) fn plan(
        &self,
        config: QuorumConfig,
        candidates: &[PeerId],
    ) -> Result<QuorumPlan<PeerId>, QuorumError> {
        let me = self.inner.node.peer_id();
        let hinted: Vec<(PeerId, PathHint)> = candidates
            .iter()
            .map(|peer| {
                let hint = if *peer == me {
                    PathHint::connected(Duration::ZERO)
                } else {
                    self.inner
                        .node
                        .rtt_to(*peer)
                        .map(PathHint::connected)
                        .unwrap_or_default()
                };
                (*peer, hint)
            })
            .collect();
        let scores = lock(&self.inner.scores);
        let mut rng = lock(&self.inner.rng);
        scores.plan(config, &hinted, now(), &mut *rng)
    }

    /// Asks `candidates` for `key` under `config` and returns what the quorum answered. Used by
    /// reads, and by the lab to compare policies over the same code path. A copy whose version is
    /// beyond the accepted clock skew (this node's own included) counts as its holder's failure.
    pub async fn fetch_from(
        &self,
        candidates: &[PeerId],
        key: &str,
        mode: FetchMode,
        config: QuorumConfig,
    ) -> Result<FetchResult, ObjectServiceError> {
        self.fetch_in(candidates, key, Arc::new(Modes::All(mode)), config)
            .await
    }

    /// [`Self::fetch_from`] with each request's mode chosen by `modes`.
    async fn fetch_in(
        &self,
        candidates: &[PeerId],
        key: &str,
        modes: Arc<Modes>,
        config: QuorumConfig,
    ) -> Result<FetchResult, ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        let plan = self.plan(config, candidates)?;
        let clock = self.tick().map_err(ObjectServiceError::Clock)?;
        let me = self.inner.node.peer_id();
        let service = self.clone();
        let attempt_deadline = config.deadline;
        let key_owned = key.to_string();
        let ask = move |peer: PeerId| {
            let service = service.clone();
            let mode = modes.next(peer == me, || {
                let scores = lock(&service.inner.scores);
                Odds {
                    timely: scores.timely(peer),
                    idle: scores.oldest_outstanding(peer, drive::now()).is_none(),
                }
            });
            let modes = modes.clone();
            let key = key_owned.clone();
            // Counted before the next peer is ranked, so reads starting now see it.
            let mut content_out = (peer != me && mode != FetchMode::Metadata).then(|| {
                let round_trip = service.inner.node.rtt_to(peer);
                drive::ContentOut::new(&service.inner.scores, peer, round_trip)
            });
            async move {
                let fetched = if peer == me {
                    // This node's own copy, shared with its cache (never copied into an answer
                    // buffer: 250 readers of one 5 MB object share one copy), under the same
                    // clock and version checks as a replica's answer. Version and hash only are
                    // checked without holding the content (a read streams it afterwards).
                    let held = match mode {
                        FetchMode::Full | FetchMode::FullIfSmall => service
                            .local_copy(&key)
                            .await?
                            .map(|object| (object.stamp, Some(object.content))),
                        // A read's own copy in the object cache comes with its content, which
                        // costs nothing (a shared buffer) and spares the read a second lookup
                        // once the quorum's winner is known.
                        FetchMode::Metadata => match service.inner.store.cached(&key) {
                            Some(object) if modes.reads_local_content() => {
                                Some((object.stamp, Some(object.content)))
                            }
                            _ => service.local_stamp(&key).await?.map(|stamp| (stamp, None)),
                        },
                    };
                    let version = held.as_ref().map(|(stamp, _)| stamp.version);
                    service.accept_answer(peer, service.tick()?, version)?;
                    match held {
                        None => Fetched::Absent,
                        Some((stamp, content)) => Fetched::Present { stamp, content },
                    }
                } else if mode == FetchMode::Metadata {
                    service.fetch_stamp(peer, &key, attempt_deadline).await?
                } else {
                    // A content request: version requests went to `fetch_stamp` above.
                    let request = Bytes::from(object::encode_fetch(clock, mode, &key));
                    service
                        .fetch_remote(peer, mode, request, attempt_deadline)
                        .await?
                };
                if let Fetched::Present {
                    stamp,
                    content: Some(content),
                } = &fetched
                {
                    if let Some(out) = content_out.as_mut() {
                        out.received = Some(content.len());
                    }
                    modes.content_received(StoredObject {
                        stamp: *stamp,
                        content: content.clone(),
                    });
                }
                Ok(fetched)
            }
        };
        let (copies, outcome) = drive(&self.inner.scores, plan, ask, Leftover::FollowUp).await;
        self.inner
            .metrics
            .requests_per_read
            .inc_by(outcome.asked as u64);
        Ok(FetchResult { copies, outcome })
    }
}

impl ObjectService {
    /// Sends `peer` the fetch `request` (in `mode`) and checks its answer: a refusal is counted
    /// and returned, the answer's clock and version must be within the accepted skew.
    async fn fetch_remote(
        &self,
        peer: PeerId,
        mode: FetchMode,
        request: Bytes,
        timeout: Duration,
    ) -> Result<Fetched<Bytes>, ReplicaError> {
        let reply = self
            .inner
            .node
            .request(peer, FETCH, request, timeout)
            .await?;
        let answer = decode_fetched(mode, &reply, self.inner.config.max_object_bytes)?;
        let fetched = answer
            .answer
            .map_err(|reason| self.refused_answer(reason))?;
        let version = stamp_of(&fetched).map(|stamp| stamp.version);
        self.accept_answer(peer, answer.clock, version)?;
        Ok(match fetched {
            Fetched::Absent => Fetched::Absent,
            Fetched::Present { stamp, content } => Fetched::Present {
                stamp,
                content: content.map(|range| reply.slice(range)),
            },
        })
    }
}

/// The stamp of a fetched copy, if there is one.
fn stamp_of<B>(fetched: &Fetched<B>) -> Option<Stamp> {
    match fetched {
        Fetched::Absent => None,
        Fetched::Present { stamp, .. } => Some(*stamp),
    }
}

fn upgrade(weak: &std::sync::Weak<Inner>) -> Result<ObjectService, HandlerError> {
    weak.upgrade()
        .map(|inner| ObjectService { inner })
        .ok_or(HandlerError::Stopped)
}
