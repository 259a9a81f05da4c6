//! Run anti-entropy: every interval (jittered), exchange bucket digests with each connected member, then pull and push the copies that differ.
//!
//! # Design
//!
//! The comparison is the sans-IO [`crate::proto::entropy`]; this module scans the store, sends,
//! awaits and counts. A round runs one exchange with each connected member in turn (so at most
//! one peer's listing is in memory), and starts:
//!
//! - every `anti_entropy_interval`, jittered uniformly by ±50% so members do not fall into step
//!   (`0` disables anti-entropy, the loop never starts);
//! - 250 ms after a member connects (a restarted or newly reachable replica catches up at once);
//! - right away after a round that repaired keys and was cut by its bounds, so a replica that
//!   missed many writes converges at the speed of the transfers, not of the interval.
//!
//! Bounds per exchange: one answer of at most [`ExchangeLimits`] (4096 entries, 1 MiB), at most
//! [`MAX_TRANSFER_BYTES`] of content pulled and as much pushed (and no more keys pushed than an
//! answer lists), [`IN_FLIGHT`] pulls or pushes at once, pulled copies stored [`PULL_BATCH`] to a
//! transaction. Memory per exchange: one summary (4096
//! buckets × 28 bytes), one listing, and this node's entries in the listed buckets, at most
//! twice an answer's entries (the buckets beyond wait for a later exchange).
//!
//! Who moves what: a replica pulls every copy it lacks or holds older from each member it
//! exchanges with, stored in batches. A copy is pushed only to a peer that listed an older copy
//! of the key, and only by the key's heaviest other replica (rendezvous order, the peer left
//! out); a key the peer lacks is left to the peer's own pulls. Pushes are per-key `STORE`s, each
//! a durable commit on the peer: when restarted replicas were also pushed every key they lacked,
//! `bench/anti-entropy.sh` took 7.8 s to converge 10,000 missed writes (4,807 pushed, 8,012
//! pulled, 1.33× the content in bytes) where pulls alone took 2.5 s (1.04×). So a member with
//! anti-entropy disabled receives newer versions of the keys it holds, not keys it lacks.
//!
//! Digests come from a scan of the store's record headers ([`Store::scan_stamps`]), one per
//! exchange on each side, each key's replicas computed afresh (so a member-list change applies
//! at once); nothing is persisted for them. `bench/anti-entropy.sh` reports the scan time
//! (`meshwire_object_anti_entropy_scan_seconds`) beside the convergence time.
//!
//! Pulls are ordinary `FETCH` requests (the answer's clock and version pass the same checks as a
//! read's, and the content its hash check) and pushes ordinary `STORE` requests (the peer admits
//! them as any write), so the store's rule decides: a copy replaces another only if it wins.
//! A copy large enough for a content file (64 KiB) moves piece by piece and is never held
//! whole: a pull writes it to a content file as it arrives (hashed on the way) and commits that
//! file on its own, and a push sends it from the pusher's content file.
//!
//! Metrics: `meshwire_object_anti_entropy_rounds_total`,
//! `meshwire_object_anti_entropy_exchanges_total{outcome}` (`in_sync`, `repaired`, `unrepaired`,
//! `failed`), `meshwire_object_anti_entropy_repaired_keys_total{direction}` (`pulled`,
//! `pushed`), `meshwire_object_anti_entropy_sent_bytes_total` and `..._received_bytes_total`
//! (payloads of the exchanges this node started: the digests, pull and push requests it sent,
//! the listings and answers it received; summed over the nodes they count every byte once), and
//! `meshwire_object_anti_entropy_errors_total{reason}` (digest exchanges refused as malformed,
//! either side), and `meshwire_object_anti_entropy_scan_seconds` (one summary scan of the store).
//!
//! [`Store::scan_stamps`]: crate::net::store::Store::scan_stamps

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_SYNC as SYNC};
use meshwire::{HandlerError, PeerChange, PeerId};
use rand::Rng;

use crate::net::store::StoreError;
use crate::proto::entropy::{
    self, bucket_of, buckets_for, in_window, reconcile, select_buckets, BucketEntries,
    EntropyError, Entry, ExchangeLimits, Summary, MAX_BUCKETS,
};
use crate::proto::object::{self, decode_fetched, FetchMode, Fetched, Stamp, Stored};

use super::store_calls::offload;
use super::{lock, DirectionLabel, Inner, ObjectService, OutcomeLabel, ReasonLabel, ReplicaError};

/// Most content bytes one exchange pulls, and most it pushes.
pub const MAX_TRANSFER_BYTES: u64 = 64 * 1024 * 1024;
/// Pulls or pushes one exchange keeps in flight.
pub const IN_FLIGHT: usize = 32;
/// Pulled copies stored per transaction (each commit is durable: one per copy cost a disk sync
/// each, and bounded a restarted replica's catch-up at the disk's sync rate).
pub const PULL_BATCH: usize = 128;
/// This node's entries read per exchange, in answers' worth of entries.
const OWN_ENTRIES_PER_ANSWER: usize = 2;
/// Delay of the round that follows a member's connection.
const AFTER_CONNECT: Duration = Duration::from_millis(250);

/// What one anti-entropy round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Members exchanged with.
    pub exchanges: usize,
    /// Exchanges that failed (the peer unreachable, refusing, or answering malformed).
    pub failed: usize,
    /// Copies pulled from peers and stored here.
    pub pulled: usize,
    /// Copies pushed to peers that now hold them.
    pub pushed: usize,
    /// Whether an exchange repaired keys and may have left more (its bounds cut it).
    pub more: bool,
}

/// Why one exchange failed.
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Entropy(#[from] EntropyError),
    #[error("the store scan task failed: {0}")]
    Scan(#[from] tokio::task::JoinError),
}

#[derive(Debug, Default)]
struct Exchanged {
    pulled: usize,
    pushed: usize,
    listed: bool,
}

impl ObjectService {
    /// The limits of one digest exchange on this node: the defaults, within one node message.
    fn exchange_limits(&self) -> ExchangeLimits {
        let limits = ExchangeLimits::default();
        let payload = self.inner.node.config().limits.max_payload_bytes as usize;
        ExchangeLimits {
            max_bytes: limits.max_bytes.min(payload),
            ..limits
        }
    }

    /// The placement id of this node's cluster.
    fn placement(&self) -> [u8; entropy::DIGEST_LEN] {
        let members: Vec<[u8; 32]> = self.members().iter().map(|p| *p.as_bytes()).collect();
        entropy::placement_id(&members, self.inner.config.replication)
    }

    /// Starts the anti-entropy loop (see the module docs); `None` when the interval is zero. The
    /// loop ends when the service is dropped or the task is aborted.
    pub fn spawn_anti_entropy(&self) -> Option<tokio::task::JoinHandle<()>> {
        let interval = self.inner.config.anti_entropy_interval;
        if interval.is_zero() {
            return None;
        }
        let weak = Arc::downgrade(&self.inner);
        let events = self.inner.node.peer_events();
        Some(tokio::spawn(anti_entropy_loop(weak, events, interval)))
    }

    /// Runs one anti-entropy round now: one exchange with each connected member.
    pub async fn anti_entropy_round(&self) -> RoundReport {
        self.inner.metrics.entropy_rounds.inc();
        let me = self.inner.node.peer_id();
        let connected = self.inner.node.connected_peers();
        let peers: Vec<PeerId> = self
            .members()
            .iter()
            .copied()
            .filter(|peer| *peer != me && connected.contains(peer))
            .collect();
        let mut report = RoundReport::default();
        for peer in peers {
            report.exchanges += 1;
            let outcome = match self.exchange(peer).await {
                Ok(done) => {
                    report.pulled += done.pulled;
                    report.pushed += done.pushed;
                    let repaired = done.pulled + done.pushed > 0;
                    report.more |= repaired;
                    match (done.listed, repaired) {
                        (false, _) => "in_sync",
                        (true, true) => "repaired",
                        (true, false) => "unrepaired",
                    }
                }
                Err(error) => {
                    report.failed += 1;
                    tracing::debug!(peer = %peer.short(), %error, "anti-entropy exchange failed");
                    "failed"
                }
            };
            self.inner
                .metrics
                .entropy_exchanges
                .get_or_create(&OutcomeLabel { outcome })
                .inc();
        }
        report
    }

    /// The summary of the range this node shares with `peer`, in `buckets` buckets (`None`:
    /// as many as the range's size calls for, or what the last exchange with the peer needed).
    async fn summary_with(
        &self,
        peer: PeerId,
        buckets: Option<usize>,
    ) -> Result<Summary, ExchangeError> {
        let service = self.clone();
        let inline = self.inner.inline_store;
        let remembered = lock(&self.inner.entropy_buckets)
            .get(&peer)
            .copied()
            .unwrap_or(1);
        offload(inline, move || {
            let filter = service.shared_filter(peer);
            let mut summary = Summary::new(MAX_BUCKETS)?;
            // Real time on purpose: the scan blocks this thread, whatever clock the node runs on.
            let started = std::time::Instant::now();
            service.inner.store.scan_stamps(|key, stamp, _| {
                if filter(key) {
                    summary.add(key, &stamp);
                }
            })?;
            service
                .inner
                .metrics
                .entropy_scan_seconds
                .observe(started.elapsed().as_secs_f64());
            let buckets = buckets.unwrap_or_else(|| buckets_for(summary.total()).max(remembered));
            Ok(summary.fold(buckets)?)
        })
        .await?
    }

    /// Whether a key is in the range this node shares with `peer` (both among its replicas).
    fn shared_filter(&self, peer: PeerId) -> impl Fn(&str) -> bool {
        let members: Vec<[u8; 32]> = self.members().iter().map(|p| *p.as_bytes()).collect();
        let replication = self.inner.config.replication;
        let (me, peer) = (*self.inner.node.peer_id().as_bytes(), *peer.as_bytes());
        move |key| entropy::shared(key, &members, replication, &me, &peer)
    }

    /// This node's entries in `buckets` (of `count`) of the range shared with `peer`, a window
    /// of at most `window` entries of each from `offset`.
    async fn entries_with(
        &self,
        peer: PeerId,
        count: usize,
        buckets: Vec<usize>,
        sizes: Vec<usize>,
        offset: usize,
        window: usize,
    ) -> Result<Vec<BucketEntries>, ExchangeError> {
        let service = self.clone();
        let inline = self.inner.inline_store;
        offload(inline, move || {
            let filter = service.shared_filter(peer);
            let slot: HashMap<usize, usize> =
                buckets.iter().enumerate().map(|(i, b)| (*b, i)).collect();
            let mut seen = vec![0usize; buckets.len()];
            let mut out: Vec<BucketEntries> = buckets
                .iter()
                .zip(&sizes)
                .map(|(bucket, size)| BucketEntries {
                    bucket: *bucket,
                    complete: *size <= window,
                    entries: Vec::new(),
                })
                .collect();
            service.inner.store.scan_stamps(|key, stamp, len| {
                let Some(&i) = slot.get(&bucket_of(key, count)) else {
                    return;
                };
                if !filter(key) {
                    return;
                }
                let index = seen[i];
                seen[i] += 1;
                if in_window(index, sizes[i], offset, window) && out[i].entries.len() < window {
                    out[i].entries.push(Entry {
                        key: key.to_string(),
                        stamp,
                        len: u32::try_from(len).unwrap_or(u32::MAX),
                    });
                }
            })?;
            Ok(out)
        })
        .await?
    }

    /// One exchange with `peer`: send digests, read the listing, pull and push what differs.
    async fn exchange(&self, peer: PeerId) -> Result<Exchanged, ExchangeError> {
        let limits = self.exchange_limits();
        let summary = self.summary_with(peer, None).await?;
        let buckets = summary.buckets();
        let clock = self.tick().map_err(ReplicaError::Clock)?;
        let request = Bytes::from(entropy::encode_digests(
            clock,
            &self.placement(),
            summary.digests(),
        ));
        self.count_sent(request.len() as u64);
        let reply = self
            .inner
            .node
            .request(peer, SYNC, request, self.inner.config.deadline)
            .await
            .map_err(ReplicaError::from)?;
        self.count_received(reply.len() as u64);
        let answer = entropy::decode_entries(&reply, buckets, limits).inspect_err(|error| {
            self.count_entropy_error(peer, error);
        })?;
        let listed = match answer.answer {
            Ok(listed) => listed,
            Err(reason) => return Err(self.refused_answer(reason).into()),
        };
        self.accept_answer(peer, answer.clock, None)?;
        if listed.iter().any(|bucket| !bucket.complete) {
            // A bucket over the window: split the range finer next time.
            lock(&self.inner.entropy_buckets).insert(peer, (buckets * 2).min(MAX_BUCKETS));
        }
        if listed.is_empty() {
            return Ok(Exchanged::default());
        }
        // This node's side of the listed buckets is read into memory: keep it within a few
        // answers' worth (a peer that holds little lists many buckets); the rest waits.
        let cap = OWN_ENTRIES_PER_ANSWER * limits.max_entries;
        let mut kept = 0usize;
        let listed: Vec<BucketEntries> = listed
            .into_iter()
            .filter(|bucket| {
                let own = summary.count(bucket.bucket);
                let keep = kept == 0 || kept + own <= cap;
                if keep {
                    kept += own.max(1);
                }
                keep
            })
            .collect();
        let mine = self.own_entries(peer, buckets, &listed).await?;
        let repairs = reconcile(&listed, &mine);
        let pulled = self.pull(peer, repairs.pull).await;
        let me = self.inner.node.peer_id();
        let stale: std::collections::HashSet<&str> = listed
            .iter()
            .flat_map(|bucket| bucket.entries.iter().map(|entry| entry.key.as_str()))
            .collect();
        let pushes: Vec<(String, Stamp)> = repairs
            .push
            .into_iter()
            .filter(|(key, _)| {
                stale.contains(key.as_str())
                    && self
                        .replicas(key)
                        .into_iter()
                        .find(|replica| *replica != peer)
                        == Some(me)
            })
            .take(limits.max_entries)
            .collect();
        let pushed = self.push(peer, pushes).await;
        Ok(Exchanged {
            pulled,
            pushed,
            listed: true,
        })
    }

    /// This node's entries in the listed buckets: all of a complete bucket's, and the listed
    /// keys of one cut short.
    async fn own_entries(
        &self,
        peer: PeerId,
        buckets: usize,
        listed: &[BucketEntries],
    ) -> Result<BTreeMap<usize, Vec<(String, Stamp)>>, ExchangeError> {
        let complete: Vec<usize> = listed
            .iter()
            .filter(|bucket| bucket.complete)
            .map(|bucket| bucket.bucket)
            .collect();
        let sizes = vec![0; complete.len()];
        let scanned = self
            .entries_with(peer, buckets, complete, sizes, 0, usize::MAX)
            .await?;
        let mut mine: BTreeMap<usize, Vec<(String, Stamp)>> = scanned
            .into_iter()
            .map(|bucket| {
                let entries = bucket
                    .entries
                    .into_iter()
                    .map(|e| (e.key, e.stamp))
                    .collect();
                (bucket.bucket, entries)
            })
            .collect();
        let wanted: Vec<(usize, String)> = listed
            .iter()
            .filter(|bucket| !bucket.complete)
            .flat_map(|bucket| {
                bucket
                    .entries
                    .iter()
                    .map(|e| (bucket.bucket, e.key.clone()))
            })
            .collect();
        let held = self
            .on_store(move |store| {
                wanted
                    .into_iter()
                    .filter_map(|(bucket, key)| match store.header(&key) {
                        Ok(Some((stamp, _))) => Some(Ok((bucket, key, stamp))),
                        Ok(None) => None,
                        Err(error) => Some(Err(error)),
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })
            .await??;
        for bucket in listed.iter().filter(|bucket| !bucket.complete) {
            mine.entry(bucket.bucket).or_default();
        }
        for (bucket, key, stamp) in held {
            mine.entry(bucket).or_default().push((key, stamp));
        }
        Ok(mine)
    }

    /// Pulls the listed copies from `peer` (within [`MAX_TRANSFER_BYTES`]) and stores them in
    /// batches of [`PULL_BATCH`], one transaction each; returns how many this node now holds.
    async fn pull(&self, peer: PeerId, entries: Vec<Entry>) -> usize {
        let mut budget = MAX_TRANSFER_BYTES;
        let chosen: Vec<Entry> = entries
            .into_iter()
            .take_while(|entry| {
                let fits = budget >= u64::from(entry.len);
                budget = budget.saturating_sub(u64::from(entry.len));
                fits
            })
            .collect();
        // Copies large enough for a content file are written to one as they arrive and stored
        // one by one; smaller ones are stored in batches.
        let min_file = self.streamed_min_bytes().map_or(u64::MAX, |min| min as u64);
        let mut fetched = stream::iter(chosen)
            .map(|entry| async move {
                let result = if u64::from(entry.len) >= min_file {
                    self.pull_large(peer, &entry.key, u64::from(entry.len))
                        .await
                } else {
                    self.fetch_copy(peer, &entry.key).await.map(|copy| {
                        copy.map_or(Pulled::Nothing, |(stamp, content)| {
                            Pulled::Held(stamp, content)
                        })
                    })
                };
                (entry.key, result)
            })
            .buffer_unordered(IN_FLIGHT);
        let mut batch = Vec::new();
        let mut pulled = 0;
        while let Some((key, result)) = fetched.next().await {
            match result {
                Ok(Pulled::Held(stamp, content)) => batch.push((key, stamp, content)),
                Ok(Pulled::Stored) => pulled += 1,
                Ok(Pulled::Nothing) => {}
                Err(error) => {
                    tracing::debug!(peer = %peer.short(), %key, %error, "anti-entropy pull failed");
                }
            }
            if batch.len() == PULL_BATCH {
                pulled += self.store_pulled(std::mem::take(&mut batch)).await;
            }
        }
        pulled + self.store_pulled(batch).await
    }

    /// Stores pulled copies in one transaction; returns how many the store now holds as pulled.
    async fn store_pulled(&self, batch: Vec<(String, Stamp, Bytes)>) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let copies = batch.len();
        let stored = self
            .on_store(move |store| store.put_batch(&batch).map(|held| (held, batch)))
            .await
            .and_then(|stored| stored);
        match stored {
            Ok((held, batch)) => {
                let stored = batch
                    .iter()
                    .zip(&held)
                    .filter(|((_, stamp, _), now)| stamp == *now)
                    .count();
                self.inner
                    .metrics
                    .entropy_repaired
                    .get_or_create(&DirectionLabel {
                        direction: "pulled",
                    })
                    .inc_by(stored as u64);
                stored
            }
            Err(error) => {
                tracing::warn!(%error, copies, "anti-entropy could not store pulled copies");
                0
            }
        }
    }

    /// Pulls `key`'s copy from `peer`, at most `listed` bytes, into a content file (see
    /// [`Self::pull_written`]).
    async fn pull_large(
        &self,
        peer: PeerId,
        key: &str,
        listed: u64,
    ) -> Result<Pulled, ReplicaError> {
        self.count_sent(object::fetch_len(key) as u64);
        let Some(pulled) = self.pull_written(peer, key, listed).await? else {
            return Ok(Pulled::Nothing);
        };
        self.count_received(pulled.received);
        Ok(if pulled.holds {
            self.count_repaired("pulled");
            Pulled::Stored
        } else {
            Pulled::Nothing
        })
    }

    /// Fetches `key`'s copy from `peer`, its clock, version and hash checked (`None`: the peer
    /// no longer holds it).
    async fn fetch_copy(
        &self,
        peer: PeerId,
        key: &str,
    ) -> Result<Option<(Stamp, Bytes)>, ReplicaError> {
        let clock = self.tick()?;
        let request = Bytes::from(object::encode_fetch(clock, FetchMode::Full, key));
        self.count_sent(request.len() as u64);
        let reply = self
            .inner
            .node
            .request(peer, FETCH, request, self.inner.config.deadline)
            .await?;
        self.count_received(reply.len() as u64);
        let answer = decode_fetched(FetchMode::Full, &reply, self.inner.config.max_object_bytes)?;
        let fetched = answer
            .answer
            .map_err(|reason| self.refused_answer(reason))?;
        let Fetched::Present {
            stamp,
            content: Some(range),
        } = fetched
        else {
            return Ok(None);
        };
        self.accept_answer(peer, answer.clock, Some(stamp.version))?;
        Ok(Some((stamp, reply.slice(range))))
    }

    /// Pushes this node's copies of `keys` to `peer` (within [`MAX_TRANSFER_BYTES`]); returns how
    /// many it acknowledged.
    async fn push(&self, peer: PeerId, keys: Vec<(String, Stamp)>) -> usize {
        let mut budget = MAX_TRANSFER_BYTES;
        let chosen: Vec<(String, Stamp)> = keys
            .into_iter()
            .take_while(|(key, _)| {
                let len = self
                    .inner
                    .store
                    .header(key)
                    .ok()
                    .flatten()
                    .map_or(0, |(_, len)| len as u64);
                let fits = budget >= len;
                budget = budget.saturating_sub(len);
                fits
            })
            .collect();
        let pushed = stream::iter(chosen)
            .map(|(key, _)| async move {
                let result = self.push_one(peer, &key).await;
                if let Err(error) = &result {
                    tracing::debug!(peer = %peer.short(), %key, %error, "anti-entropy push failed");
                }
                let held = result.unwrap_or(false);
                if held {
                    self.count_repaired("pushed");
                }
                held
            })
            .buffer_unordered(IN_FLIGHT)
            .filter(|held| std::future::ready(*held))
            .count()
            .await;
        pushed
    }

    /// Sends `peer` this node's current copy of `key`; `Ok(true)` when it acknowledged holding it.
    async fn push_one(&self, peer: PeerId, key: &str) -> Result<bool, ReplicaError> {
        let Some(copy) = self.send_local_copy(peer, key, None).await? else {
            return Ok(false);
        };
        self.count_sent(copy.sent);
        self.count_received(copy.received);
        match copy.stored {
            Stored::Holds => Ok(true),
            Stored::Superseded(held) => Err(ReplicaError::Superseded { held }),
        }
    }

    /// Answers `peer`'s digests with the entries of the buckets that differ, or refuses them. A
    /// malformed exchange or one from another placement is an error: counted, and the request's
    /// stream ends with it; after a malformed one the connection closes too.
    pub async fn serve_sync(&self, peer: PeerId, body: Bytes) -> Result<Bytes, HandlerError> {
        let request = match entropy::decode_digests(&body) {
            Ok(request) => request,
            Err(error) => return Err(self.entropy_error(peer, error)),
        };
        if let Err(reason) = self.admit(peer, request.clock, None) {
            self.count_refused_request(peer, "(anti-entropy)", reason);
            let clock = self.tick().map_err(|e| HandlerError::Failed(Box::new(e)))?;
            return Ok(Bytes::from(entropy::encode_entries_refusal(clock, reason)));
        }
        if request.placement != self.placement() {
            return Err(self.entropy_error(peer, EntropyError::PlacementMismatch));
        }
        let buckets = request.digests.len();
        let limits = self.exchange_limits();
        let failed = |error: ExchangeError| HandlerError::Failed(Box::new(error));
        let summary = self
            .summary_with(peer, Some(buckets))
            .await
            .map_err(failed)?;
        let start = lock(&self.inner.rng).random_range(0..buckets);
        let (chosen, _) = select_buckets(&summary, &request.digests, start, limits)
            .map_err(|error| self.entropy_error(peer, error))?;
        let sizes = chosen.iter().map(|b| summary.count(*b)).collect();
        let offset = lock(&self.inner.rng).random_range(0..usize::from(u16::MAX));
        let listing = self
            .entries_with(peer, buckets, chosen, sizes, offset, limits.window())
            .await
            .map_err(failed)?;
        let clock = self.tick().map_err(|e| HandlerError::Failed(Box::new(e)))?;
        Ok(Bytes::from(entropy::encode_entries(
            clock, &listing, limits,
        )))
    }

    /// Counts a refused exchange; one that broke the protocol ([`EntropyError::breaks_protocol`])
    /// is answered and then closes the connection.
    fn entropy_error(&self, peer: PeerId, error: EntropyError) -> HandlerError {
        self.count_entropy_error(peer, &error);
        HandlerError::refused(error.breaks_protocol(), error)
    }

    fn count_entropy_error(&self, peer: PeerId, error: &EntropyError) {
        let reason = error.reason();
        self.inner
            .metrics
            .entropy_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
        tracing::warn!(%peer, reason, %error, "anti-entropy exchange refused");
    }

    fn count_repaired(&self, direction: &'static str) {
        self.inner
            .metrics
            .entropy_repaired
            .get_or_create(&DirectionLabel { direction })
            .inc();
    }

    fn count_sent(&self, bytes: u64) {
        self.inner.metrics.entropy_sent_bytes.inc_by(bytes);
    }

    fn count_received(&self, bytes: u64) {
        self.inner.metrics.entropy_received_bytes.inc_by(bytes);
    }
}

/// A pulled copy: held, to be stored with others in one batch; stored already (from a content
/// file it was written to as it arrived); or none.
enum Pulled {
    Held(Stamp, Bytes),
    Stored,
    Nothing,
}

/// The anti-entropy loop of the service behind `weak` (see the module docs).
async fn anti_entropy_loop(
    weak: Weak<Inner>,
    mut events: meshwire::PeerEvents,
    interval: Duration,
) {
    let jittered = |inner: &Inner| {
        let factor = lock(&inner.rng).random_range(0.5..1.5);
        interval.mul_f64(factor)
    };
    let Some(inner) = weak.upgrade() else { return };
    let mut next = tokio::time::Instant::now() + jittered(&inner);
    drop(inner);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            change = events.recv() => {
                match change {
                    None => return,
                    Some(PeerChange::Up(peer)) => {
                        let Some(inner) = weak.upgrade() else { return };
                        let service = ObjectService { inner };
                        if service.is_member(peer) {
                            next = next.min(tokio::time::Instant::now() + AFTER_CONNECT);
                        }
                    }
                    Some(PeerChange::Down(_)) => {}
                }
                continue;
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        let service = ObjectService { inner };
        let report = service.anti_entropy_round().await;
        if report.pulled + report.pushed > 0 {
            tracing::debug!(?report, "anti-entropy round");
        }
        next = if report.more {
            tokio::time::Instant::now()
        } else {
            tokio::time::Instant::now() + jittered(&service.inner)
        };
    }
}
