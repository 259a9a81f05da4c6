//! A batch pipeline round a ring of nodes, run by the daemon and driven over HTTP.
//!
//! # Design
//!
//! Every node of the ring runs a [`meshwire::pipeline::Pipeline`] with the same ordered list of
//! PeerIds ([`RingConfig::ring`]). The built-in transform forwards every chunk unchanged: the
//! ring exercises the transport (chunks forwarded while later ones arrive, up to `in_flight`
//! batches at once, the ring ping) and an application that embeds meshwire brings its own
//! transform. The first node of the ring accepts batches (`POST /pipeline/batches`): the body is
//! cut into chunks of [`RingConfig::chunk_bytes`], submitted, and the answer waits for the batch
//! to come back round the ring, then says whether every byte came back as sent. The other nodes
//! relay and refuse submissions (`409 not_first`).
//!
//! A dispatcher task reads the pipeline's outcomes in submission order and hands each to the
//! request waiting for it; an outcome that arrives before its request registered waits in a map
//! bounded by the in-flight window, and a request that went away (client gone) leaves nothing
//! behind once its outcome arrives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire::pipeline::{
    transform_fn, BatchInput, BatchResult, Pipeline, PipelineConfig, PipelineError, PipelineStatus,
};
use meshwire::{Chunk, Node, PeerId};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How the node's ring pipeline runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RingConfig {
    /// The ring in order; the first submits batches. Every node of the ring has the same list.
    pub ring: Vec<PeerId>,
    /// Batches in flight at once (K).
    pub in_flight: usize,
    /// How long a batch may take round the whole ring before it fails.
    pub batch_deadline: Duration,
    /// Bytes per chunk the first node cuts a submitted body into.
    pub chunk_bytes: usize,
    /// The largest body `POST /pipeline/batches` accepts.
    pub max_batch_bytes: usize,
}

impl RingConfig {
    /// Defaults for `ring`: K = 5, a 10 s deadline, 256 KiB chunks, batches up to 16 MiB.
    pub fn new(ring: Vec<PeerId>) -> Self {
        Self {
            ring,
            in_flight: 5,
            batch_deadline: Duration::from_secs(10),
            chunk_bytes: 256 * 1024,
            max_batch_bytes: 16 * 1024 * 1024,
        }
    }

    /// Checks the settings (the ring itself is checked when the pipeline starts).
    pub fn validate(&self) -> Result<(), RingError> {
        if self.in_flight == 0 || self.chunk_bytes == 0 || self.max_batch_bytes == 0 {
            return Err(RingError::Invalid(
                "in_flight, chunk_bytes and max_batch_bytes must be positive",
            ));
        }
        if self.batch_deadline.is_zero() {
            return Err(RingError::Invalid("batch_deadline must be positive"));
        }
        Ok(())
    }
}

/// Why the ring pipeline could not start or run a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// A setting is out of range.
    #[error("invalid [pipeline] settings: {0}")]
    Invalid(&'static str),
    /// The pipeline refused to start, or the batch failed on its way round the ring.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The body is larger than `max_batch_bytes`.
    #[error("a batch of {bytes} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The body's size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
}

/// One batch's trip round the ring, as the first node saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingRun {
    /// The batch id the pipeline gave it.
    pub batch_id: u64,
    /// Bytes submitted.
    pub bytes: usize,
    /// Chunks they were cut into.
    pub chunks: usize,
    /// Whether exactly the submitted bytes came back, in order.
    pub intact: bool,
    /// From submission to the batch's return.
    pub elapsed: Duration,
}

type Outcome = Result<Vec<Chunk>, PipelineError>;

#[derive(Default)]
struct Waiting {
    requests: HashMap<u64, oneshot::Sender<Outcome>>,
    early: HashMap<u64, Outcome>,
}

struct Inner {
    pipeline: Pipeline,
    config: RingConfig,
    waiting: Mutex<Waiting>,
    dispatcher: Mutex<Option<JoinHandle<()>>>,
}

/// The node's ring pipeline. Clones share it.
#[derive(Clone)]
pub struct Ring {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("pipeline", &self.inner.pipeline)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ring {
    /// Joins the ring on `node` (it must be in the ring). Must run inside a tokio runtime.
    pub fn start(node: &Node, config: RingConfig) -> Result<Self, RingError> {
        config.validate()?;
        let mut pipeline_config = PipelineConfig::new(config.ring.clone());
        pipeline_config.in_flight = config.in_flight;
        pipeline_config.batch_deadline = config.batch_deadline;
        let pipeline = Pipeline::start(node, pipeline_config, transform_fn(|_, chunk| chunk))?;
        let ring = Self {
            inner: Arc::new(Inner {
                pipeline,
                config,
                waiting: Mutex::new(Waiting::default()),
                dispatcher: Mutex::new(None),
            }),
        };
        if ring.is_first() {
            // The task holds the pipeline, not the ring, so dropping the ring can stop it.
            let pipeline = ring.inner.pipeline.clone();
            let weak = Arc::downgrade(&ring.inner);
            let task = tokio::spawn(async move {
                while let Some(BatchResult { batch_id, outcome }) = pipeline.next_result().await {
                    let Some(inner) = weak.upgrade() else { return };
                    let mut waiting = lock(&inner.waiting);
                    match waiting.requests.remove(&batch_id) {
                        // A request whose client went away drops the outcome here.
                        Some(request) => {
                            let _ = request.send(outcome);
                        }
                        None => {
                            waiting.early.insert(batch_id, outcome);
                        }
                    }
                }
            });
            *lock(&ring.inner.dispatcher) = Some(task);
        }
        Ok(ring)
    }

    /// Whether this node submits batches (the ring's first node).
    pub fn is_first(&self) -> bool {
        self.inner.pipeline.status().position == 0
    }

    /// The settings.
    pub fn config(&self) -> &RingConfig {
        &self.inner.config
    }

    /// The pipeline's state on this node (position, batches, the latest ring ping).
    pub fn status(&self) -> PipelineStatus {
        self.inner.pipeline.status()
    }

    /// Sends `data` round the ring in chunks and waits for it to come back (first node only).
    pub async fn run(&self, data: Bytes) -> Result<RingRun, RingError> {
        let max = self.inner.config.max_batch_bytes;
        if data.len() > max {
            return Err(RingError::TooLarge {
                bytes: data.len(),
                max,
            });
        }
        let size = self.inner.config.chunk_bytes;
        let chunks: Vec<Chunk> = (0..data.len())
            .step_by(size)
            .map(|start| Chunk {
                slots: 1,
                data: data.slice(start..(start + size).min(data.len())),
            })
            .collect();
        let count = chunks.len();
        let started = Instant::now();
        let batch_id = self
            .inner
            .pipeline
            .submit(BatchInput {
                round: 0,
                phase: 0,
                metadata: Bytes::new(),
                chunks,
            })
            .await?;
        let outcome = {
            let mut waiting = lock(&self.inner.waiting);
            match waiting.early.remove(&batch_id) {
                Some(outcome) => Ok(outcome),
                None => {
                    let (tx, rx) = oneshot::channel();
                    waiting.requests.insert(batch_id, tx);
                    Err(rx)
                }
            }
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(rx) => rx.await.unwrap_or(Err(PipelineError::Closed)),
        };
        let back = outcome?;
        let intact = back.iter().map(|chunk| chunk.data.len()).sum::<usize>() == data.len()
            && back
                .iter()
                .scan(0usize, |offset, chunk| {
                    let start = *offset;
                    *offset += chunk.data.len();
                    Some(data.get(start..*offset) == Some(&chunk.data[..]))
                })
                .all(|same| same);
        Ok(RingRun {
            batch_id,
            bytes: data.len(),
            chunks: count,
            intact,
            elapsed: started.elapsed(),
        })
    }

    /// Stops accepting results; waiting requests get `Closed`.
    pub fn close(&self) {
        if let Some(task) = lock(&self.inner.dispatcher).take() {
            task.abort();
        }
        let mut waiting = lock(&self.inner.waiting);
        for (_, request) in waiting.requests.drain() {
            let _ = request.send(Err(PipelineError::Closed));
        }
        waiting.early.clear();
    }
}
