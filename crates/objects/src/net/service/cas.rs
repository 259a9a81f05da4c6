//! Conditional writes (compare-and-set) in two phases over the replicas; see [`crate::proto::cas`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use meshwire::protocols::OBJECT_CAS as CAS;
use meshwire::{HandlerError, PeerId};
use tokio::time::Instant;

use crate::net::store::StoreError;
use crate::proto::cas::{self, CasAnswer, Phase, Precondition};
use crate::proto::object::{Refusal, Stamp};

use super::drive::{drive, Leftover};
use super::{lock, ObjectService, ObjectServiceError, ReplicaError, WriteOutcome};

/// A prepared conditional write a replica holds until commit, abort or expiry.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The coordinator that prepared it: two coordinators can produce the same stamp (the same
    /// content in the same millisecond), and one must not commit or abort the other's write.
    owner: PeerId,
    stamp: Stamp,
    content: Bytes,
    precondition: Precondition,
    expires: Instant,
}

/// Most content bytes a node holds in prepared conditional writes; a prepare beyond it is
/// answered busy, so peers cannot grow this node's memory without bound.
const MAX_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// A commit or abort that found nothing prepared on this node: its prepare may still be on its
/// way (the phases travel on separate streams, so a commit can overtake its prepare).
#[derive(Debug, Clone)]
struct Decided {
    owner: PeerId,
    stamp: Stamp,
    /// Committed (the write is to be applied when its prepare arrives) or aborted.
    commit: bool,
    expires: Instant,
}

/// Most commits and aborts a node remembers for prepares still on their way; beyond it they are
/// not remembered (a late prepare then waits for its expiry, as before there was this memory).
const MAX_DECIDED: usize = 4096;

/// The prepared conditional writes of one node, by key, and the decisions that arrived before
/// their prepares.
#[derive(Debug, Default)]
pub(super) struct PendingWrites {
    held: HashMap<String, Pending>,
    decided: HashMap<String, Decided>,
}

/// How the replicas answered one phase: mismatches (with the newest current copy seen) and busy.
#[derive(Debug, Default)]
struct Tally {
    mismatches: AtomicUsize,
    busy: AtomicUsize,
    current: std::sync::Mutex<Option<Stamp>>,
}

impl ObjectService {
    /// Answers `peer`'s conditional-write request, or refuses it.
    pub fn serve_cas(&self, peer: PeerId, body: Bytes) -> Result<Bytes, HandlerError> {
        let request = cas::decode_cas(&body, self.inner.config.max_object_bytes)
            .map_err(|error| self.malformed(peer, error))?;
        let stamp = matches!(request.phase, Phase::Prepare(_)).then_some(request.stamp);
        let answer = match self.admit(peer, request.clock, stamp) {
            Err(reason) => {
                self.count_refused_request(peer, request.key, reason);
                Err(reason)
            }
            Ok(()) => Ok(self
                .cas_local(
                    peer,
                    request.phase,
                    request.key,
                    request.stamp,
                    body.slice(request.content.clone()),
                )
                .map_err(|error| HandlerError::Failed(Box::new(error)))?),
        };
        let clock = self
            .tick()
            .map_err(|error| HandlerError::Failed(Box::new(error)))?;
        Ok(Bytes::from(cas::encode_cas_answer(clock, answer)))
    }

    /// Runs one phase of a conditional write on this node's store. Blocks (store reads and a
    /// durable commit): the handler and the coordinator call it on the blocking pool.
    ///
    /// A commit or abort that finds nothing prepared is remembered (up to [`MAX_DECIDED`], for
    /// twice the deadline): when its prepare arrives late, a committed write is applied at once
    /// (its precondition checked in the store's transaction) and an aborted one is not held, so
    /// a late prepare never leaves the key blocked for other conditional writes.
    fn cas_local(
        &self,
        owner: PeerId,
        phase: Phase,
        key: &str,
        stamp: Stamp,
        content: Bytes,
    ) -> Result<CasAnswer, StoreError> {
        let mut state = lock(&self.inner.pending);
        let at = Instant::now();
        state.held.retain(|_, held| held.expires > at);
        state.decided.retain(|_, decided| decided.expires > at);
        let expires = at + 2 * self.inner.config.deadline;
        let store = &self.inner.store;
        match phase {
            Phase::Prepare(precondition) => {
                if let Some(held) = state.held.get(key) {
                    return Ok(if held.owner == owner && held.stamp == stamp {
                        CasAnswer::Done
                    } else {
                        CasAnswer::Busy
                    });
                }
                let decided = state
                    .decided
                    .get(key)
                    .filter(|decided| decided.owner == owner && decided.stamp == stamp)
                    .map(|decided| decided.commit);
                if let Some(commit) = decided {
                    state.decided.remove(key);
                    if !commit {
                        // Aborted already: nothing to hold.
                        return Ok(CasAnswer::Done);
                    }
                    return Ok(match store.put_if(key, stamp, content, precondition)? {
                        Ok(_) => CasAnswer::Done,
                        Err(current) => committed_or_mismatch(stamp, current),
                    });
                }
                let held_bytes: usize = state.held.values().map(|held| held.content.len()).sum();
                if held_bytes + content.len() > MAX_PENDING_BYTES {
                    return Ok(CasAnswer::Busy);
                }
                let current = store.checked_stamp(key)?;
                if !precondition.holds(current.as_ref()) {
                    return Ok(CasAnswer::Mismatch(current));
                }
                // A prepared write outlives its coordinator's deadline, so a commit sent in time
                // always finds it; a coordinator that vanished blocks the key for this long.
                state.held.insert(
                    key.to_string(),
                    Pending {
                        owner,
                        stamp,
                        content,
                        precondition,
                        expires,
                    },
                );
                Ok(CasAnswer::Done)
            }
            Phase::Commit => match state.held.remove(key) {
                Some(held) if held.owner == owner && held.stamp == stamp => {
                    // The store checks the precondition again in the write's own transaction:
                    // an unconditional write may have landed since the prepare.
                    let applied = store.put_if(key, held.stamp, held.content, held.precondition)?;
                    Ok(match applied {
                        Ok(_) => CasAnswer::Done,
                        Err(current) => committed_or_mismatch(stamp, current),
                    })
                }
                other => {
                    // Another coordinator's pending write stays; this commit finds nothing to apply.
                    if let Some(theirs) = other {
                        state.held.insert(key.to_string(), theirs);
                    }
                    let answer = committed_or_mismatch(stamp, store.checked_stamp(key)?);
                    if answer != CasAnswer::Done {
                        state.remember(key, owner, stamp, true, expires);
                    }
                    Ok(answer)
                }
            },
            Phase::Abort => {
                if state
                    .held
                    .get(key)
                    .is_some_and(|held| held.owner == owner && held.stamp == stamp)
                {
                    state.held.remove(key);
                } else {
                    state.remember(key, owner, stamp, false, expires);
                }
                Ok(CasAnswer::Done)
            }
        }
    }

    /// Writes `content` under `key` only if the current copy satisfies `precondition`: prepared
    /// on W replicas, then committed on W. See [`crate::proto::cas`].
    pub async fn put_if(
        &self,
        key: &str,
        content: Bytes,
        precondition: Precondition,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        let started = tokio::time::Instant::now();
        let result = self.put_if_inner(key, content, precondition).await;
        let label = match &result {
            Ok(_) => {
                self.observe_write(started.elapsed());
                "ok"
            }
            Err(ObjectServiceError::PreconditionFailed { .. }) => "precondition_failed",
            Err(ObjectServiceError::Conflict { .. }) => "conflict",
            Err(
                ObjectServiceError::WriteUnconfirmed { .. } | ObjectServiceError::NotApplied { .. },
            ) => "quorum_not_reached",
            Err(_) => "error",
        };
        self.count_write(label);
        result
    }

    async fn put_if_inner(
        &self,
        key: &str,
        content: Bytes,
        precondition: Precondition,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        self.check_write(key, &content)?;
        let after = match precondition {
            Precondition::Matches(stamp) => Some(stamp.version),
            Precondition::Absent => None,
        };
        let stamp = self.next_stamp(key, &content, after).await?;
        let replicas = self.replicas(key);
        let quorum = self.inner.config.write_quorum.min(replicas.len()).max(1);
        let prepare = Phase::Prepare(precondition);
        let prepared = Arc::new(Tally::default());
        // Lock ordering: every coordinator prepares the first reachable replica in placement order
        // (the same for all of them) before the others, so that of two conditional writes racing
        // on a key one gets through, instead of each holding some replicas and all failing with
        // 409 (each coordinator's own replica answers it first). Only if that replica cannot be
        // asked are all prepared at once.
        let connected = self.inner.node.connected_peers();
        let me = self.inner.node.peer_id();
        let first = replicas
            .iter()
            .copied()
            .find(|peer| *peer == me || connected.contains(peer));
        let acks = match first {
            Some(first) => {
                let locked = self
                    .cas_phase(key, stamp, prepare, content.clone(), &[first], 1, &prepared)
                    .await?;
                let contended = prepared.busy.load(Ordering::Relaxed) > 0
                    || prepared.mismatches.load(Ordering::Relaxed) > 0;
                if contended {
                    0
                } else {
                    let rest: Vec<PeerId> = replicas
                        .iter()
                        .copied()
                        .filter(|peer| locked == 0 || *peer != first)
                        .collect();
                    let needed = quorum - locked;
                    locked
                        + self
                            .cas_phase(key, stamp, prepare, content, &rest, needed, &prepared)
                            .await?
                }
            }
            None => {
                self.cas_phase(key, stamp, prepare, content, &replicas, quorum, &prepared)
                    .await?
            }
        };
        if acks < quorum {
            // Nothing was applied anywhere: release whatever was prepared.
            let service = self.clone();
            let (key, all) = (key.to_string(), replicas.clone());
            tokio::spawn(async move {
                let ignored = Arc::new(Tally::default());
                let _ = service
                    .cas_phase(
                        &key,
                        stamp,
                        Phase::Abort,
                        Bytes::new(),
                        &all,
                        all.len(),
                        &ignored,
                    )
                    .await;
            });
            let current = *lock(&prepared.current);
            return Err(if prepared.mismatches.load(Ordering::Relaxed) > 0 {
                ObjectServiceError::PreconditionFailed { current }
            } else if prepared.busy.load(Ordering::Relaxed) > 0 {
                ObjectServiceError::Conflict {
                    needed: quorum,
                    prepared: acks,
                }
            } else {
                ObjectServiceError::NotApplied {
                    needed: quorum,
                    prepared: acks,
                    asked: replicas.len(),
                }
            });
        }
        let committed = Arc::new(Tally::default());
        let acks = self
            .cas_phase(
                key,
                stamp,
                Phase::Commit,
                Bytes::new(),
                &replicas,
                quorum,
                &committed,
            )
            .await?;
        if acks < quorum {
            return Err(ObjectServiceError::WriteUnconfirmed {
                needed: quorum,
                acks,
                asked: replicas.len(),
                superseded: committed.mismatches.load(Ordering::Relaxed),
            });
        }
        Ok(WriteOutcome {
            stamp,
            acks,
            replicas: replicas.len(),
        })
    }

    /// Sends one phase to every replica in `replicas` at once; returns the `Done` answers counted
    /// before `needed` of them arrived or the deadline passed (the rest finish in the background).
    #[allow(clippy::too_many_arguments)]
    async fn cas_phase(
        &self,
        key: &str,
        stamp: Stamp,
        phase: Phase,
        content: Bytes,
        replicas: &[PeerId],
        needed: usize,
        tally: &Arc<Tally>,
    ) -> Result<usize, ObjectServiceError> {
        let mut config = self.write_plan(replicas.len());
        config.quorum = needed.clamp(1, replicas.len().max(1));
        let clock = self.tick().map_err(ObjectServiceError::Clock)?;
        // The content follows the header from its own buffer (never copied to join them).
        let header = Bytes::from(cas::encode_cas_header(clock, phase, key, &stamp));
        let me = self.inner.node.peer_id();
        let service = self.clone();
        let key = key.to_string();
        let shared = tally.clone();
        let ask = move |peer: PeerId| {
            let (service, header, content, key) = (
                service.clone(),
                header.clone(),
                content.clone(),
                key.clone(),
            );
            let tally = shared.clone();
            async move {
                let answer = if peer == me {
                    let local = service.clone();
                    super::store_calls::blocking(service.inner.inline_store, move || {
                        local.cas_local(me, phase, &key, stamp, content)
                    })
                    .await
                    .ok_or(StoreError::Stopped)??
                } else {
                    let reply = service.request_replica(peer, CAS, header, content).await?;
                    let (clock, answer) = cas::decode_cas_answer(&reply)?;
                    service.accept_answer(peer, clock, None)?;
                    answer.map_err(|reason: Refusal| {
                        service.count_refused_answer(reason);
                        ReplicaError::Refused(reason)
                    })?
                };
                match answer {
                    CasAnswer::Done => Ok(()),
                    CasAnswer::Busy => {
                        tally.busy.fetch_add(1, Ordering::Relaxed);
                        Err(ReplicaError::Busy)
                    }
                    CasAnswer::Mismatch(current) => {
                        tally.mismatches.fetch_add(1, Ordering::Relaxed);
                        let mut newest = lock(&tally.current);
                        if current > *newest {
                            *newest = current;
                        }
                        Err(ReplicaError::Mismatch { current })
                    }
                }
            }
        };
        let plan = self.plan(config, replicas)?;
        let (done, _) = drive(&self.inner.scores, plan, ask, Leftover::Finish).await;
        Ok(done.len())
    }
}

/// A commit's answer when it could not apply its pending copy: `Done` if the store already holds
/// exactly this write (read repair or anti-entropy brought it from a replica that committed
/// first, so this replica holds what the commit asks), else the mismatch with what it holds.
fn committed_or_mismatch(stamp: Stamp, current: Option<Stamp>) -> CasAnswer {
    if current == Some(stamp) {
        CasAnswer::Done
    } else {
        CasAnswer::Mismatch(current)
    }
}

impl PendingWrites {
    /// Remembers a commit or abort that found nothing prepared, unless [`MAX_DECIDED`] are.
    fn remember(&mut self, key: &str, owner: PeerId, stamp: Stamp, commit: bool, expires: Instant) {
        if self.decided.len() < MAX_DECIDED || self.decided.contains_key(key) {
            self.decided.insert(
                key.to_string(),
                Decided {
                    owner,
                    stamp,
                    commit,
                    expires,
                },
            );
        }
    }
}
