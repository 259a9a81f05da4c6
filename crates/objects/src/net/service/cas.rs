//! Conditional writes (compare-and-set) in two phases over the replicas; see [`crate::proto::cas`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use meshwire::protocols::OBJECT_CAS as CAS;
use meshwire::{HandlerError, PeerId, RequestBody};
use tokio::time::Instant;

use crate::net::store::{Store, StoreError, WrittenContent};
use crate::proto::cas::{self, CasAnswer, Phase, Precondition};
use crate::proto::object::{ObjectError, Refusal, Stamp};

use super::drive::{drive, Leftover};
use super::store_calls::blocking;
use super::streamed::Ready;
use super::write::Copy;
use super::{lock, ObjectService, ObjectServiceError, ReplicaError, WriteOutcome};

/// A prepared conditional write a replica holds until commit, abort or expiry.
#[derive(Debug)]
pub(super) struct Pending {
    /// The coordinator that prepared it: two coordinators can produce the same stamp (the same
    /// content in the same millisecond), and one must not commit or abort the other's write.
    owner: PeerId,
    stamp: Stamp,
    content: Prepared,
    precondition: Precondition,
    expires: Instant,
}

/// The content of a prepared conditional write.
#[derive(Debug)]
pub(super) enum Prepared {
    /// In memory: a prepare that arrived whole (counted in [`MAX_PENDING_BYTES`]).
    Held(Bytes),
    /// In a content file of its own: a large prepare written piece by piece as it arrived, or
    /// the coordinator's own streamed body (counted in [`MAX_PENDING_FILE_BYTES`]). The file is
    /// committed as it is, or removed when the write is dropped.
    Written(WrittenContent),
}

impl Prepared {
    fn memory_bytes(&self) -> usize {
        match self {
            Self::Held(content) => content.len(),
            Self::Written(_) => 0,
        }
    }

    fn file_bytes(&self) -> u64 {
        match self {
            Self::Held(_) => 0,
            Self::Written(content) => content.len(),
        }
    }

    /// Stores it under `key` with `stamp` if `precondition` holds, in one transaction (see
    /// [`Store::put_if`]).
    fn put_if(
        self,
        store: &Store,
        key: &str,
        stamp: Stamp,
        precondition: Precondition,
    ) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
        match self {
            Self::Held(content) => store.put_if(key, stamp, content, precondition),
            Self::Written(content) => store.put_written_if(key, stamp, content, precondition),
        }
    }
}

/// Most content bytes a node holds in prepared conditional writes; a prepare beyond it is
/// answered busy, so peers cannot grow this node's memory without bound.
const MAX_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// Most content bytes a node holds in the content files of prepared conditional writes; a
/// prepare beyond it is answered busy, so peers cannot fill this node's disk with writes they
/// never commit.
const MAX_PENDING_FILE_BYTES: u64 = 1024 * 1024 * 1024;

/// A commit or abort that found nothing prepared on this node: its prepare may still be on its
/// way (the phases travel on separate streams, so a commit can overtake its prepare).
#[derive(Debug, Clone)]
struct Decided {
    /// Committed (the write is to be applied when its prepare arrives) or aborted.
    commit: bool,
    expires: Instant,
}

/// Which write a [`Decided`] is about: its key, coordinator and stamp. Several writes to one key
/// can be decided while their prepares are on their way (a coordinator's commit of one write,
/// then its abort of the next that failed its precondition elsewhere): each keeps its own
/// decision, so a later one cannot make an earlier write's late prepare be held as if undecided
/// (it then blocked the key and kept its content file until it expired).
type DecidedWrite = (String, PeerId, Stamp);

/// Most commits and aborts a node remembers for prepares still on their way; beyond it they are
/// not remembered (a late prepare then waits for its expiry, as before there was this memory).
const MAX_DECIDED: usize = 4096;

/// The prepared conditional writes of one node, by key, and the decisions that arrived before
/// their prepares.
#[derive(Debug, Default)]
pub(super) struct PendingWrites {
    held: HashMap<String, Pending>,
    decided: HashMap<DecidedWrite, Decided>,
    /// Content bytes of large prepares still arriving into their content files (see
    /// [`Arriving`]).
    arriving_file_bytes: u64,
}

/// A large prepare's content arriving into its content file, reserved among the node's
/// [`MAX_PENDING_FILE_BYTES`] until it is held (or refused) and this drops.
pub(super) struct Arriving {
    service: ObjectService,
    len: u64,
}

impl Drop for Arriving {
    fn drop(&mut self) {
        let mut state = lock(&self.service.inner.pending);
        state.arriving_file_bytes = state.arriving_file_bytes.saturating_sub(self.len);
    }
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
        if let Err(reason) = self.admit_cas(peer, &request) {
            return self.cas_reply(Err(reason));
        }
        let content = Prepared::Held(body.slice(request.content.clone()));
        let answer = self
            .cas_local(peer, request.phase, request.key, request.stamp, content)
            .map_err(failed)?;
        self.cas_reply(Ok(answer))
    }

    /// Passes a conditional-write request through the gate every object request passes (see
    /// [`Self::admit`]); a refusal is counted.
    fn admit_cas(&self, peer: PeerId, request: &cas::CasRequest<'_>) -> Result<(), Refusal> {
        let stamp = matches!(request.phase, Phase::Prepare(_)).then_some(request.stamp);
        self.admit(peer, request.clock, stamp)
            .inspect_err(|reason| {
                self.count_refused_request(peer, request.key, *reason);
            })
    }

    /// The encoded answer to a conditional-write request, stamped with this node's clock.
    fn cas_reply(&self, answer: Result<CasAnswer, Refusal>) -> Result<Bytes, HandlerError> {
        let clock = self.tick().map_err(failed)?;
        Ok(Bytes::from(cas::encode_cas_answer(clock, answer)))
    }

    /// Answers a conditional-write request arriving piece by piece, as [`Self::serve_cas`]
    /// answers one read whole. A prepare whose content is large enough for a content file has
    /// it written to one of its own as it arrives (checked against its hash) and held there
    /// until commit, abort or expiry; one that would be busy or fail its precondition is
    /// answered before its content is read. Smaller requests are read whole. Serves CAS on a
    /// node whose store keeps content files.
    pub(super) async fn serve_cas_streamed(
        &self,
        peer: PeerId,
        mut body: RequestBody,
    ) -> Result<Bytes, HandlerError> {
        let malformed = |error| self.malformed(peer, error);
        let read_failed = HandlerError::from_body;
        let fixed = body
            .read_exact(cas::CAS_FIXED_LEN)
            .await
            .map_err(read_failed)?;
        let (prepare, key_and_tag) = cas::cas_key_and_tag_len(&fixed).map_err(malformed)?;
        let key_and_tag = body.read_exact(key_and_tag).await.map_err(read_failed)?;
        let precondition = match (prepare, key_and_tag.last()) {
            (true, Some(&tag)) => {
                let len = cas::precondition_len(tag).map_err(malformed)?;
                body.read_exact(len).await.map_err(read_failed)?
            }
            _ => Bytes::new(),
        };
        let len = body.remaining();
        if !prepare && len > 0 {
            // A commit or an abort carries no content; its body is not read (the request holds
            // one piece of the node's budget, not its length).
            return Err(malformed(ObjectError::Trailing(
                usize::try_from(len).unwrap_or(usize::MAX),
            )));
        }
        if self.streamed_min_bytes().is_none_or(|min| len < min as u64) {
            let whole = Self::read_whole(&[&fixed, &key_and_tag, &precondition], &mut body).await?;
            return self
                .clone()
                .serve_blocking(move |service| service.serve_cas(peer, whole))
                .await;
        }
        let head = [&fixed[..], &key_and_tag, &precondition].concat();
        let request = cas::decode_cas_head(&head).map_err(malformed)?;
        let max = self.inner.config.max_object_bytes;
        if len > max as u64 {
            return Err(malformed(ObjectError::TooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max,
            }));
        }
        let Phase::Prepare(precondition) = request.phase else {
            return Err(malformed(ObjectError::Trailing(len as usize)));
        };
        if let Err(reason) = self.admit_cas(peer, &request) {
            return self.cas_reply(Err(reason));
        }
        let (key, stamp) = (request.key.to_string(), request.stamp);
        let service = self.clone();
        let early = {
            let key = key.clone();
            blocking(self.inner.inline_store, move || {
                service.cas_precheck(peer, &key, stamp, precondition, len)
            })
            .await
            .ok_or(HandlerError::Stopped)?
            .map_err(failed)?
        };
        let reserved = match early {
            Ok(reserved) => reserved,
            Err(answer) => return self.cas_reply(Ok(answer)),
        };
        let written = self.write_body(peer, &mut body, stamp.hash).await?;
        let service = self.clone();
        let answer = blocking(self.inner.inline_store, move || {
            let content = Prepared::Written(written);
            let answer =
                service.cas_local(peer, Phase::Prepare(precondition), &key, stamp, content);
            // Held now (or refused): no longer arriving.
            drop(reserved);
            answer
        })
        .await
        .ok_or(HandlerError::Stopped)?
        .map_err(failed)?;
        self.cas_reply(Ok(answer))
    }

    /// The answer a prepare of `stamp` by `owner` with `len` bytes of content gets before its
    /// content arrives, if that is known already: busy while another conditional write is
    /// pending on the key or the content files of prepared and arriving writes would pass
    /// [`MAX_PENDING_FILE_BYTES`], a mismatch when the stored copy's header fails the
    /// precondition. Else the content is to be read (and the prepare checks again with it),
    /// and its length stays reserved among the arriving bytes until the returned guard drops.
    /// Blocks (a store read).
    fn cas_precheck(
        &self,
        owner: PeerId,
        key: &str,
        stamp: Stamp,
        precondition: Precondition,
        len: u64,
    ) -> Result<Result<Arriving, CasAnswer>, StoreError> {
        // The checks of `cas_local`'s prepare, in its order, from the stored copy's header.
        let mut state = lock(&self.inner.pending);
        let at = Instant::now();
        state.retain_unexpired(at);
        if let Some(held) = state.held.get(key) {
            return Ok(Err(if held.owner == owner && held.stamp == stamp {
                CasAnswer::Done
            } else {
                CasAnswer::Busy
            }));
        }
        if state.decided.contains_key(&(key.to_string(), owner, stamp)) {
            // Committed or aborted before it arrived: `cas_local` decides with the content.
            return Ok(Ok(Arriving {
                service: self.clone(),
                len: 0,
            }));
        }
        let current = self.inner.store.header(key)?.map(|(stamp, _)| stamp);
        if !precondition.holds(current.as_ref()) {
            return Ok(Err(CasAnswer::Mismatch(current)));
        }
        let files: u64 = state
            .held
            .values()
            .map(|held| held.content.file_bytes())
            .sum();
        if files + state.arriving_file_bytes + len > MAX_PENDING_FILE_BYTES {
            return Ok(Err(CasAnswer::Busy));
        }
        state.arriving_file_bytes += len;
        Ok(Ok(Arriving {
            service: self.clone(),
            len,
        }))
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
        mut content: Prepared,
    ) -> Result<CasAnswer, StoreError> {
        if let (Phase::Prepare(_), Prepared::Written(written)) = (&phase, &mut content) {
            // Flushed and closed before it is held: a held prepare keeps no file open.
            written.sync()?;
        }
        let mut state = lock(&self.inner.pending);
        let at = Instant::now();
        state.retain_unexpired(at);
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
                    .remove(&(key.to_string(), owner, stamp))
                    .map(|decided| decided.commit);
                if let Some(commit) = decided {
                    if !commit {
                        // Aborted already: nothing to hold.
                        return Ok(CasAnswer::Done);
                    }
                    return Ok(match content.put_if(store, key, stamp, precondition)? {
                        Ok(_) => CasAnswer::Done,
                        Err(current) => committed_or_mismatch(stamp, current),
                    });
                }
                let (memory, files) = state.held.values().fold((0, 0), |(memory, files), held| {
                    (
                        memory + held.content.memory_bytes(),
                        files + held.content.file_bytes(),
                    )
                });
                if memory + content.memory_bytes() > MAX_PENDING_BYTES
                    || files + content.file_bytes() > MAX_PENDING_FILE_BYTES
                {
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
                    let applied = held
                        .content
                        .put_if(store, key, held.stamp, held.precondition)?;
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
        self.count_put_if(started, &result);
        result
    }

    /// Writes the finished content file `content` under `key` only if the current copy
    /// satisfies `precondition`, as [`Self::put_if`] does with content in memory: the local
    /// replica holds the file itself while prepared, the others are sent it piece by piece.
    pub async fn put_written_if(
        &self,
        key: &str,
        content: WrittenContent,
        precondition: Precondition,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        let started = tokio::time::Instant::now();
        let after = precondition_version(precondition);
        let result = match self.ready_written(key, content, after).await {
            Ok(Ready::Small(content)) => self.put_if_inner(key, content, precondition).await,
            Ok(Ready::Large(stamp, outgoing)) => {
                self.cas_copies(key, stamp, Copy::Written(outgoing), precondition)
                    .await
            }
            Err(error) => Err(error),
        };
        self.count_put_if(started, &result);
        result
    }

    /// Counts a conditional write begun at `started` by its outcome (and its time, if it
    /// succeeded).
    fn count_put_if(
        &self,
        started: tokio::time::Instant,
        result: &Result<WriteOutcome, ObjectServiceError>,
    ) {
        let label = match result {
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
    }

    async fn put_if_inner(
        &self,
        key: &str,
        content: Bytes,
        precondition: Precondition,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        self.check_write(key, &content)?;
        let after = precondition_version(precondition);
        let stamp = self.next_stamp(key, &content, after).await?;
        self.cas_copies(key, stamp, Copy::Held(content), precondition)
            .await
    }

    /// Writes `copy` under `key` with `stamp` if the current copy satisfies `precondition`:
    /// prepared on W replicas, then committed on W.
    async fn cas_copies(
        &self,
        key: &str,
        stamp: Stamp,
        copy: Copy,
        precondition: Precondition,
    ) -> Result<WriteOutcome, ObjectServiceError> {
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
                    .cas_phase(key, stamp, prepare, copy.clone(), &[first], 1, &prepared)
                    .await?;
                let contended = prepared.busy.load(Ordering::Relaxed) > 0
                    || prepared.mismatches.load(Ordering::Relaxed) > 0;
                if contended {
                    0
                } else {
                    // The first replica is asked again only if it is another node that did not
                    // answer in time; this node's own prepare failed, and its copy may be a file
                    // that prepare took.
                    let rest: Vec<PeerId> = replicas
                        .iter()
                        .copied()
                        .filter(|peer| *peer != first || (locked == 0 && first != me))
                        .collect();
                    let needed = quorum - locked;
                    locked
                        + self
                            .cas_phase(key, stamp, prepare, copy, &rest, needed, &prepared)
                            .await?
                }
            }
            None => {
                self.cas_phase(key, stamp, prepare, copy, &replicas, quorum, &prepared)
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
                        Copy::Held(Bytes::new()),
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
                Copy::Held(Bytes::new()),
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
        copy: Copy,
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
            let (service, header, copy, key) =
                (service.clone(), header.clone(), copy.clone(), key.clone());
            let tally = shared.clone();
            async move {
                let answer = if peer == me {
                    let content = match copy {
                        Copy::Held(content) => Prepared::Held(content),
                        Copy::Written(outgoing) => Prepared::Written(outgoing.take_content()?),
                    };
                    let local = service.clone();
                    blocking(service.inner.inline_store, move || {
                        local.cas_local(me, phase, &key, stamp, content)
                    })
                    .await
                    .ok_or(StoreError::Stopped)??
                } else {
                    let reply = match copy {
                        Copy::Held(content) => {
                            service.request_replica(peer, CAS, header, content).await?
                        }
                        Copy::Written(outgoing) => {
                            service.send_written(peer, CAS, header, &outgoing).await?
                        }
                    };
                    let (clock, answer) = cas::decode_cas_answer(&reply)?;
                    service.accept_answer(peer, clock, None)?;
                    answer.map_err(|reason: Refusal| service.refused_answer(reason))?
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

/// The version a conditional write's stamp must follow: the one its precondition names.
fn precondition_version(precondition: Precondition) -> Option<u64> {
    match precondition {
        Precondition::Matches(stamp) => Some(stamp.version),
        Precondition::Absent => None,
    }
}

fn failed(error: impl std::error::Error + Send + Sync + 'static) -> HandlerError {
    HandlerError::Failed(Box::new(error))
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
    /// Drops the prepared writes and remembered decisions that expired by `at` (a prepared
    /// write's content file is removed with it).
    fn retain_unexpired(&mut self, at: Instant) {
        self.held.retain(|_, held| held.expires > at);
        self.decided.retain(|_, decided| decided.expires > at);
    }

    /// Remembers a commit or abort that found nothing prepared, unless [`MAX_DECIDED`] are.
    fn remember(&mut self, key: &str, owner: PeerId, stamp: Stamp, commit: bool, expires: Instant) {
        let write = (key.to_string(), owner, stamp);
        if self.decided.len() < MAX_DECIDED || self.decided.contains_key(&write) {
            self.decided.insert(write, Decided { commit, expires });
        }
    }
}
