//! Run a ring of nodes as a pipeline: each node transforms each chunk and forwards it while later
//! chunks still arrive, with up to K batches in flight, and a ping travels the ring.
//!
//! # Design
//!
//! Every node of the ring runs a [`Pipeline`] with the same ordered list of [`PeerId`]s. The first
//! node submits batches; each node, the first included, applies the transform to every chunk and
//! sends it on to its successor as a batch ([`crate::Node::open_batch`]) that keeps the batch id;
//! the batch comes back to the first node after `ring.len()` transforms. Chunks are forwarded one by
//! one, so a node starts on a batch as soon as its first chunk arrives and all nodes work at once
//! when K > 1 (the xx network's pipelining, `docs/lessons.md`).
//!
//! The first node keeps a [`Window`] of at most K unreleased batches, each with a deadline, and
//! hands outcomes back in submission order through [`Pipeline::next_result`]: every submitted
//! batch yields exactly one result, completed or a typed [`PipelineError`], never silence.
//! Failures travel both ways: a relay whose inbound batch fails abandons its outbound one (the
//! successor sees a reset, and so on to the first node); a relay whose outbound batch fails
//! discards its inbound one (the predecessor sees a stop). A link that goes silent (partition)
//! fails the batch at its deadline. A batch that comes back after its deadline is discarded.
//! Later batches go out over the node's reconnected links, so the pipeline carries on once the
//! configured peers' backoff has redialed.
//!
//! The ring ping: every `ping_interval` the first node sends a small message round the ring
//! (relays forward it unchanged) and measures the round trip. The latest value is the gauge
//! `meshwire_ring_ping_seconds`, all values the histogram `meshwire_ring_ping_duration_seconds`,
//! and [`Pipeline::status`] reports it.

pub mod window;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use meshwire_proto::batch::{BatchHeader, Chunk};
use meshwire_proto::wire::ProtocolId;
use meshwire_proto::PeerId;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use window::{Outcome, Window};

use crate::node::{BatchError, InboundBatch, Node, SubscribeError};

/// Ring-ping round trips remembered while their ping is out; older ones count as lost.
const PINGS_REMEMBERED: usize = 16;
/// Results waiting for [`Pipeline::next_result`] beyond the window.
const RESULT_QUEUE: usize = 64;

/// A chunk transform: the batch's header and one chunk in, the chunk to forward out.
pub type Transform =
    Arc<dyn Fn(&BatchHeader, Chunk) -> Pin<Box<dyn Future<Output = Chunk> + Send>> + Send + Sync>;

/// How a pipeline runs; the same on every node of the ring.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// The ring in order; the first entry submits batches and sees them complete.
    pub ring: Vec<PeerId>,
    /// The batch protocol the pipeline's batches travel on.
    pub protocol: ProtocolId,
    /// The message protocol of the ring ping.
    pub ping_protocol: ProtocolId,
    /// Batches in flight at once (K).
    pub in_flight: usize,
    /// How long a batch may take around the whole ring before it fails.
    pub batch_deadline: Duration,
    /// Interval between ring pings; `None` turns the ping off.
    pub ping_interval: Option<Duration>,
}

impl PipelineConfig {
    /// Defaults for `ring`: K = 5, a 10 s batch deadline, a ping every second.
    pub fn new(ring: Vec<PeerId>) -> Self {
        Self {
            ring,
            protocol: crate::protocols::PIPELINE,
            ping_protocol: crate::protocols::PIPELINE_PING,
            in_flight: 5,
            batch_deadline: Duration::from_secs(10),
            ping_interval: Some(Duration::from_secs(1)),
        }
    }
}

/// Why a pipeline could not start, or why a batch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The node is not in the ring, or the ring is shorter than two nodes or has duplicates.
    #[error("invalid ring: {0}")]
    InvalidRing(&'static str),
    /// Another subscriber holds the pipeline's protocols.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// Only the first node of the ring submits batches.
    #[error("only the first node of the ring submits batches")]
    NotFirst,
    /// Sending the batch to the next node failed.
    #[error("sending to the next node failed: {0}")]
    Send(BatchError),
    /// Receiving the batch back from the last node failed (a reset here means a node on the way
    /// gave it up).
    #[error("receiving the batch back failed: {0}")]
    Receive(BatchError),
    /// The batch did not come back within the deadline.
    #[error("batch did not come back within {0:?}")]
    Timeout(Duration),
    /// The pipeline was shut down.
    #[error("the pipeline is closed")]
    Closed,
}

/// A batch for the first node to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInput {
    /// Application round.
    pub round: u64,
    /// Application phase.
    pub phase: u32,
    /// Opaque metadata carried round the ring.
    pub metadata: Bytes,
    /// The chunks.
    pub chunks: Vec<Chunk>,
}

/// One batch's outcome on the first node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// The id the first node gave the batch.
    pub batch_id: u64,
    /// The chunks as they came back (transformed by every node), or why not.
    pub outcome: Result<Vec<Chunk>, PipelineError>,
}

/// A snapshot of a pipeline on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineStatus {
    /// This node's place in the ring (0 = first).
    pub position: usize,
    /// Nodes in the ring.
    pub ring_len: usize,
    /// Batches submitted and not yet released (first node only).
    pub in_flight: usize,
    /// Batches that came back whole (first node) or were forwarded whole (relays).
    pub completed: u64,
    /// Batches that failed on this node.
    pub failed: u64,
    /// The latest ring-ping round trip (first node only).
    pub last_ring_ping: Option<Duration>,
}

#[derive(Default)]
struct Counts {
    completed: u64,
    failed: u64,
    last_ring_ping: Option<Duration>,
}

struct Head {
    window: Window<Vec<Chunk>, PipelineError>,
    results: mpsc::Sender<BatchResult>,
}

struct Shared {
    node: Node,
    config: PipelineConfig,
    position: usize,
    successor: PeerId,
    transform: Transform,
    counts: Mutex<Counts>,
    head: Mutex<Option<Head>>,
    changed: Notify,
    ping_latest: Gauge<f64, std::sync::atomic::AtomicU64>,
    ping_histogram: Histogram,
}

/// A pipeline on one node of the ring. Clones share it.
#[derive(Clone)]
pub struct Pipeline {
    shared: Arc<Shared>,
    results: Arc<tokio::sync::Mutex<mpsc::Receiver<BatchResult>>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("position", &self.shared.position)
            .field("ring_len", &self.shared.config.ring.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pipeline {
    /// Joins the ring on `node`: relays forward batches and pings; the first node also collects
    /// batches coming back and sends pings. The node must be connected to, or configured with, its
    /// successor (`ring[position + 1]`, wrapping). Must run inside a tokio runtime.
    pub fn start(
        node: &Node,
        config: PipelineConfig,
        transform: Transform,
    ) -> Result<Self, PipelineError> {
        let ring = &config.ring;
        if ring.len() < 2 {
            return Err(PipelineError::InvalidRing("fewer than two nodes"));
        }
        let mut sorted = ring.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != ring.len() {
            return Err(PipelineError::InvalidRing("a node appears twice"));
        }
        let position = ring
            .iter()
            .position(|peer| *peer == node.peer_id())
            .ok_or(PipelineError::InvalidRing("this node is not in the ring"))?;
        let successor = ring[(position + 1) % ring.len()];
        let batches = node.subscribe_batches(config.protocol)?;
        let pings = node.subscribe(config.ping_protocol)?;

        let ping_latest = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let ping_histogram = Histogram::new(exponential_buckets(0.001, 1.5, 20));
        if position == 0 {
            node.metrics().register_with(|registry| {
                registry.register(
                    "ring_ping_seconds",
                    "Latest round trip of the ping around the pipeline ring",
                    ping_latest.clone(),
                );
                registry.register(
                    "ring_ping_duration_seconds",
                    "Round trips of the ping around the pipeline ring",
                    ping_histogram.clone(),
                );
            });
        }
        let (results_tx, results_rx) = mpsc::channel(RESULT_QUEUE.max(config.in_flight));
        let head = (position == 0).then(|| Head {
            window: Window::new(config.in_flight, config.batch_deadline, 0),
            results: results_tx,
        });
        let shared = Arc::new(Shared {
            node: node.clone(),
            position,
            successor,
            transform,
            counts: Mutex::new(Counts::default()),
            head: Mutex::new(head),
            changed: Notify::new(),
            ping_latest,
            ping_histogram,
            config,
        });
        tokio::spawn(shared.clone().inbound_loop(batches));
        tokio::spawn(shared.clone().ping_loop(pings));
        if position == 0 {
            tokio::spawn(shared.clone().deadline_loop());
        }
        Ok(Self {
            shared,
            results: Arc::new(tokio::sync::Mutex::new(results_rx)),
        })
    }

    /// Submits a batch (first node only), waiting while K batches are in flight. Returns its id;
    /// its outcome comes from [`Pipeline::next_result`].
    pub async fn submit(&self, input: BatchInput) -> Result<u64, PipelineError> {
        let shared = &self.shared;
        if shared.position != 0 {
            return Err(PipelineError::NotFirst);
        }
        let batch_id = loop {
            let notified = shared.changed.notified();
            {
                let mut head = lock(&shared.head);
                let head = head.as_mut().ok_or(PipelineError::Closed)?;
                if let Some(id) = head.window.try_start(Instant::now().into_std()) {
                    break id;
                }
            }
            notified.await;
        };
        shared.changed.notify_waiters();
        let header = BatchHeader {
            protocol: shared.config.protocol.0,
            batch_id,
            round: input.round,
            phase: input.phase,
            slot_count: input.chunks.iter().map(|c| c.slots).sum(),
            total_bytes: input.chunks.iter().map(|c| c.data.len() as u64).sum(),
            metadata: input.metadata,
        };
        let task = shared.clone();
        tokio::spawn(async move {
            if let Err(error) = task.send_stream(header, input.chunks.into_iter()).await {
                task.settle(batch_id, Err(PipelineError::Send(error)));
            }
        });
        Ok(batch_id)
    }

    /// The next batch outcome in submission order (first node only); `None` once closed.
    pub async fn next_result(&self) -> Option<BatchResult> {
        self.results.lock().await.recv().await
    }

    /// A snapshot of the pipeline on this node.
    pub fn status(&self) -> PipelineStatus {
        let shared = &self.shared;
        let in_flight = lock(&shared.head)
            .as_ref()
            .map_or(0, |head| head.window.len());
        let counts = lock(&shared.counts);
        PipelineStatus {
            position: shared.position,
            ring_len: shared.config.ring.len(),
            in_flight,
            completed: counts.completed,
            failed: counts.failed,
            last_ring_ping: counts.last_ring_ping,
        }
    }
}

impl Shared {
    /// Transforms chunks one by one as they come and sends them to the successor as `header`.
    async fn send_stream<S>(&self, header: BatchHeader, mut chunks: S) -> Result<(), BatchError>
    where
        S: ChunkSource,
    {
        let mut sender = self.node.open_batch(self.successor, header.clone()).await?;
        while let Some(chunk) = chunks.next().await? {
            let chunk = (self.transform)(&header, chunk).await;
            sender.send_chunk(chunk).await?;
        }
        sender.finish().await
    }

    /// Batches arriving from the predecessor: relays forward them; the first node collects them.
    async fn inbound_loop(self: Arc<Self>, mut batches: mpsc::Receiver<InboundBatch>) {
        let predecessor =
            self.config.ring[(self.position + self.config.ring.len() - 1) % self.config.ring.len()];
        while let Some(batch) = batches.recv().await {
            if batch.from() != predecessor {
                batch.discard();
                continue;
            }
            let task = self.clone();
            if self.position == 0 {
                tokio::spawn(async move { task.collect(batch).await });
            } else {
                tokio::spawn(async move { task.relay(batch).await });
            }
        }
    }

    async fn relay(self: Arc<Self>, mut batch: InboundBatch) {
        let header = batch.header().clone();
        let batch_id = header.batch_id;
        let result = self.send_stream(header, &mut batch).await;
        let mut counts = lock(&self.counts);
        match result {
            Ok(()) => counts.completed += 1,
            Err(error) => {
                counts.failed += 1;
                // At warn: the first node only learns that a relay gave the batch up (a reset);
                // why is said here.
                tracing::warn!(batch_id, %error, "pipeline relay failed a batch");
                // Dropping the inbound batch unfinished stops it: the predecessor learns.
                drop(counts);
                batch.discard();
            }
        }
    }

    async fn collect(self: Arc<Self>, batch: InboundBatch) {
        let batch_id = batch.header().batch_id;
        let pending = lock(&self.head)
            .as_ref()
            .is_some_and(|head| head.window.is_pending(batch_id));
        if !pending {
            // It timed out earlier, or was never ours.
            batch.discard();
            return;
        }
        let outcome = batch
            .collect()
            .await
            .map(|(_, chunks)| chunks)
            .map_err(PipelineError::Receive);
        self.settle(batch_id, outcome);
    }

    /// Records a batch's outcome on the first node and releases what is now in order.
    fn settle(&self, batch_id: u64, outcome: Result<Vec<Chunk>, PipelineError>) {
        {
            let mut head = lock(&self.head);
            let Some(head) = head.as_mut() else { return };
            match outcome {
                Ok(chunks) => head.window.complete(batch_id, chunks),
                Err(error) => head.window.fail(batch_id, error),
            };
        }
        self.release();
    }

    fn release(&self) {
        let mut head = lock(&self.head);
        let Some(head) = head.as_mut() else { return };
        let mut counts = lock(&self.counts);
        while let Ok(permit) = head.results.try_reserve() {
            let Some((batch_id, outcome)) = head.window.poll_released() else {
                break;
            };
            let outcome = match outcome {
                Outcome::Completed(chunks) => {
                    counts.completed += 1;
                    Ok(chunks)
                }
                Outcome::Failed(error) => {
                    counts.failed += 1;
                    Err(error)
                }
                Outcome::TimedOut => {
                    counts.failed += 1;
                    Err(PipelineError::Timeout(self.config.batch_deadline))
                }
            };
            permit.send(BatchResult { batch_id, outcome });
        }
        drop(counts);
        self.changed.notify_waiters();
    }

    /// Fails overdue batches at their deadlines (first node).
    async fn deadline_loop(self: Arc<Self>) {
        loop {
            let notified = self.changed.notified();
            let next = lock(&self.head)
                .as_ref()
                .and_then(|head| head.window.poll_timeout());
            match next {
                Some(deadline) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(Instant::from_std(deadline)) => {}
                        _ = notified => continue,
                    }
                    if let Some(head) = lock(&self.head).as_mut() {
                        head.window.handle_timeout(Instant::now().into_std());
                    }
                    self.release();
                }
                None => notified.await,
            }
        }
    }

    /// Forwards pings (relays), or sends them and measures their round trip (first node).
    async fn ping_loop(self: Arc<Self>, mut pings: crate::node::Inbox) {
        let protocol = self.config.ping_protocol;
        if self.position != 0 {
            while let Some(ping) = pings.recv().await {
                let _ = self.node.try_send(self.successor, protocol, ping.payload);
            }
            return;
        }
        let Some(interval) = self.config.ping_interval else {
            return;
        };
        let last = *self.config.ring.last().unwrap_or(&self.successor);
        let mut sent: BTreeMap<u64, Instant> = BTreeMap::new();
        let mut sequence = 0u64;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    let payload = Bytes::copy_from_slice(&sequence.to_le_bytes());
                    if self.node.try_send(self.successor, protocol, payload).is_ok() {
                        sent.insert(sequence, Instant::now());
                        while sent.len() > PINGS_REMEMBERED {
                            sent.pop_first();
                        }
                    }
                    sequence += 1;
                }
                ping = pings.recv() => {
                    let Some(ping) = ping else { return };
                    let Ok(bytes) = <[u8; 8]>::try_from(&ping.payload[..]) else { continue };
                    if ping.from != last {
                        continue;
                    }
                    if let Some(at) = sent.remove(&u64::from_le_bytes(bytes)) {
                        let round_trip = at.elapsed();
                        self.ping_latest.set(round_trip.as_secs_f64());
                        self.ping_histogram.observe(round_trip.as_secs_f64());
                        lock(&self.counts).last_ring_ping = Some(round_trip);
                    }
                }
            }
        }
    }
}

/// Where a forwarded batch's chunks come from: the submitted list, or an inbound batch.
trait ChunkSource {
    fn next(&mut self) -> impl Future<Output = Result<Option<Chunk>, BatchError>> + Send;
}

impl ChunkSource for &mut InboundBatch {
    async fn next(&mut self) -> Result<Option<Chunk>, BatchError> {
        self.next_chunk().await
    }
}

impl ChunkSource for std::vec::IntoIter<Chunk> {
    async fn next(&mut self) -> Result<Option<Chunk>, BatchError> {
        Ok(Iterator::next(self))
    }
}

/// A transform from a synchronous function.
pub fn transform_fn(
    function: impl Fn(&BatchHeader, Chunk) -> Chunk + Send + Sync + 'static,
) -> Transform {
    Arc::new(move |header, chunk| {
        let out = function(header, chunk);
        Box::pin(async move { out })
    })
}
