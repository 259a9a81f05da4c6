//! Assemble an object node once (node, store, object service, optional HTTP API) with one shutdown.
//!
//! # Design
//!
//! `meshwire node`, `meshwire demo` and the lab all run the same assembly through
//! [`Daemon::builder`]:
//!
//! - [`DaemonBuilder::bind`] loads the identity from the data directory (or generates one when
//!   there is none), binds a node and starts the rest on it; [`DaemonBuilder::start`] adopts a
//!   node that is already running (the lab's nodes sit on emulated sockets).
//! - The store is `objects.redb` in the data directory, with the content files of large objects
//!   in `objects.content/` beside it, or in memory without one.
//! - The HTTP API is served only when [`DaemonBuilder::http`] gave it an address, under
//!   [`HttpLimits`] ([`DaemonBuilder::http_limits`]) and the token policy of [`HttpAuth`]
//!   ([`DaemonBuilder::http_auth`]); the token lives in `http-token` in the data directory (in
//!   memory only without one). A non-loopback address served without a token is refused here,
//!   before anything listens.
//!
//! - Topics (publish/subscribe, [`super::topics`]) run only when [`DaemonBuilder::topics`] asked
//!   for them: they take the node's gossip protocol. Their subscriber cap must stay below the
//!   HTTP connection cap, checked here too.
//!
//! [`Daemon::shutdown`] ends every topic subscription, stops accepting HTTP connections, lets
//! requests in flight finish within [`HttpLimits::shutdown_grace`] (then cuts them), flushes the store and closes the node's
//! connections with a reason. Dropping a daemon without it also stops the HTTP API, but leaves
//! the node to its other handles.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meshwire::{IdentityError, Keypair, Node, NodeConfig, NodeError, PeerId};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::http::auth::{AuthError, HttpAuth, Token};
use super::http::limits::{HttpLimits, LimitsError};
use super::http::serve::HttpMetrics;
use super::ring::{Ring, RingConfig, RingError};
use super::service::store_calls::blocking;
use super::service::{
    ObjectConfig, ObjectService, ObjectServiceError, PhysicalClock, ServiceOptions,
};
use super::store::{Store, StoreError, DEFAULT_MEMORY_BYTES};
use super::topics::{Topics, TopicsConfig, TopicsError};

/// The store's file in a data directory.
pub const STORE_FILE: &str = "objects.redb";

/// Why a daemon could not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// The identity in the data directory could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The data directory could not be created.
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The node could not be started.
    #[error("cannot start a node on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        source: NodeError,
    },
    /// The store file could not be opened.
    #[error("cannot open the object store {}: {source}", path.display())]
    Store {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: StoreError,
    },
    /// The in-memory store could not be created.
    #[error("cannot create the in-memory object store: {0}")]
    MemoryStore(#[source] StoreError),
    /// The object service refused its settings.
    #[error(transparent)]
    Service(#[from] ObjectServiceError),
    /// The HTTP API could not listen.
    #[error("cannot listen for HTTP on {address}: {source}")]
    HttpListen {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP limits cannot work.
    #[error(transparent)]
    HttpLimits(#[from] LimitsError),
    /// The HTTP token could not be set up, or would be missing off loopback.
    #[error(transparent)]
    HttpAuth(#[from] AuthError),
    /// The topics are misconfigured, or gossip could not start.
    #[error(transparent)]
    Topics(#[from] TopicsError),
    /// The ring pipeline is misconfigured, or this node is not in its ring.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// More topic subscribers allowed than HTTP connections.
    #[error(
        "[gossip] max_subscribers ({subscribers}) must be below [http] max_connections ({connections})"
    )]
    SubscribersOverConnections {
        /// The subscriber cap.
        subscribers: usize,
        /// The connection cap.
        connections: usize,
    },
    /// The HTTP API's task panicked.
    #[error("the HTTP API task failed: {0}")]
    HttpTask(#[from] tokio::task::JoinError),
}

/// How to assemble a [`Daemon`]. Without further settings: a fresh identity, an in-memory store,
/// no HTTP API, no other members (a cluster of one), the system clock, an exploration RNG seeded
/// from the OS.
#[derive(Debug, Clone)]
pub struct DaemonBuilder {
    objects: ObjectConfig,
    data_dir: Option<PathBuf>,
    memory_bytes: usize,
    http: Option<SocketAddr>,
    options: ServiceOptions,
    http_limits: HttpLimits,
    http_auth: HttpAuth,
    topics: Option<TopicsConfig>,
    ring: Option<RingConfig>,
}

impl DaemonBuilder {
    /// The other members of the object cluster (see [`ObjectService::set_members`]); without
    /// any, the daemon is a cluster of one.
    pub fn members(mut self, members: impl IntoIterator<Item = PeerId>) -> Self {
        self.options.members = members.into_iter().collect();
        self
    }

    /// The physical clock versions are built on (default: the system's wall clock).
    pub fn physical_clock(mut self, clock: Arc<dyn PhysicalClock>) -> Self {
        self.options.clock = clock;
        self
    }

    /// Keep the identity (when binding) and the store (`objects.redb`) in `dir`, created if needed.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// The store's memory budget: half for redb's page cache, half for the cache of hot objects
    /// (default [`DEFAULT_MEMORY_BYTES`]; 0 turns both caches off).
    pub fn store_memory_bytes(mut self, bytes: usize) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// Serve the HTTP API on `address` (port 0: any free port, see [`Daemon::http_address`]).
    pub fn http(mut self, address: SocketAddr) -> Self {
        self.http = Some(address);
        self
    }

    /// Limits of the HTTP API (default [`HttpLimits::default`]).
    pub fn http_limits(mut self, limits: HttpLimits) -> Self {
        self.http_limits = limits;
        self
    }

    /// Who may use the HTTP API (default: the token is required off loopback only).
    pub fn http_auth(mut self, auth: HttpAuth) -> Self {
        self.http_auth = auth;
        self
    }

    /// Run publish/subscribe topics over gossip on the node (and their routes on the HTTP API).
    pub fn topics(mut self, topics: TopicsConfig) -> Self {
        self.topics = Some(topics);
        self
    }

    /// Join a batch pipeline round `ring` (and serve its routes on the HTTP API).
    pub fn ring(mut self, ring: RingConfig) -> Self {
        self.ring = Some(ring);
        self
    }

    /// Run the store's calls on the calling task instead of tokio's blocking pool, for a
    /// simulation in virtual time (see [`ServiceOptions::inline_store`]).
    pub fn inline_store(mut self, inline: bool) -> Self {
        self.options.inline_store = inline;
        self
    }

    /// Seed the object service's exploration RNG, so runs repeat exactly.
    pub fn seed(mut self, seed: u64) -> Self {
        self.options.seed = Some(seed);
        self
    }

    /// Binds a node on `listen` with the data directory's identity (a generated one without a
    /// data directory), after `configure` has adjusted its settings, and starts the daemon on it.
    pub async fn bind(
        self,
        listen: SocketAddr,
        configure: impl FnOnce(&mut NodeConfig),
    ) -> Result<Daemon, DaemonError> {
        self.check_http()?;
        let keypair = match &self.data_dir {
            Some(dir) => Keypair::load_or_create(dir)?,
            None => Keypair::generate(),
        };
        let mut config = NodeConfig::new(keypair);
        configure(&mut config);
        let node = Node::bind(config, listen).map_err(|source| DaemonError::Bind {
            address: listen,
            source,
        })?;
        match self.start(node.clone()).await {
            Ok(daemon) => Ok(daemon),
            Err(error) => {
                node.close().await;
                Err(error)
            }
        }
    }

    /// Checks the HTTP settings before anything is opened or listens.
    fn check_http(&self) -> Result<(), DaemonError> {
        self.http_limits
            .validate_for(self.objects.max_object_bytes)?;
        if let Some(address) = self.http {
            self.http_auth.check(address)?;
        }
        if let Some(topics) = &self.topics {
            topics.resolve()?;
            if topics.max_subscribers >= self.http_limits.max_connections {
                return Err(DaemonError::SubscribersOverConnections {
                    subscribers: topics.max_subscribers,
                    connections: self.http_limits.max_connections,
                });
            }
        }
        Ok(())
    }

    /// Starts the store, the object service and the HTTP API (if asked for) on `node`, which
    /// keeps its own identity: a data directory holds only the store then.
    pub async fn start(self, node: Node) -> Result<Daemon, DaemonError> {
        self.check_http()?;
        let token = match (self.http, &self.data_dir) {
            (None, _) => None,
            (Some(_), Some(dir)) => {
                std::fs::create_dir_all(dir).map_err(|source| DaemonError::DataDir {
                    path: dir.clone(),
                    source,
                })?;
                Some(Token::load_or_create(dir)?)
            }
            (Some(_), None) => Some(Token::ephemeral()?),
        };
        let store = match &self.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| DaemonError::DataDir {
                    path: dir.clone(),
                    source,
                })?;
                let path = dir.join(STORE_FILE);
                // Opening reads and checks the whole file: off the async workers.
                let (opened, memory) = (path.clone(), self.memory_bytes);
                let open = move || Store::open(&opened, memory);
                // `None`: cancelled, the runtime is shutting down.
                let store = blocking(self.options.inline_store, open)
                    .await
                    .unwrap_or(Err(StoreError::Stopped));
                store.map_err(|source| DaemonError::Store { path, source })?
            }
            None => Store::in_memory(self.memory_bytes).map_err(DaemonError::MemoryStore)?,
        };
        let service = ObjectService::new(node, store, self.objects, self.options)?;
        register_start_time(service.node());
        let anti_entropy = service.spawn_anti_entropy().map(AbortOnDrop);
        let probes = service.spawn_probes().map(AbortOnDrop);
        let checkpoints = service.spawn_checkpoints().map(AbortOnDrop);
        let topics = match &self.topics {
            Some(config) => Some(Topics::start(service.node(), config)?),
            None => None,
        };
        let ring = match self.ring {
            Some(config) => Some(Ring::start(service.node(), config)?),
            None => None,
        };
        let http = match (self.http, token) {
            (Some(address), Some(token)) => Some(
                HttpServer::start(
                    address,
                    service.clone(),
                    topics.clone(),
                    ring.clone(),
                    self.http_limits,
                    &self.http_auth,
                    token,
                )
                .await?,
            ),
            _ => None,
        };
        Ok(Daemon {
            service,
            topics,
            ring,
            http,
            anti_entropy,
            probes,
            checkpoints,
        })
    }
}

/// Stops a task when dropped (the daemon's anti-entropy loop dies with the daemon).
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Registers `meshwire_start_time_seconds`: when this daemon started, in seconds since the Unix
/// epoch (what the dashboard and `meshwire status` compute uptime from).
fn register_start_time(node: &Node) {
    let started = Gauge::<f64, AtomicU64>::default();
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    started.set(since_epoch.as_secs_f64());
    node.metrics().register_with(|registry| {
        registry.register(
            "start_time_seconds",
            "When this node's daemon started, in seconds since the Unix epoch",
            started,
        );
    });
}

#[derive(Debug)]
struct HttpServer {
    address: SocketAddr,
    token: Token,
    token_required: bool,
    metrics: HttpMetrics,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl HttpServer {
    async fn start(
        address: SocketAddr,
        service: ObjectService,
        topics: Option<Topics>,
        ring: Option<Ring>,
        limits: HttpLimits,
        auth: &HttpAuth,
        token: Token,
    ) -> Result<Self, DaemonError> {
        let metrics = HttpMetrics::register(service.node());
        let gate = auth.gate(address, &token, metrics.clone())?;
        let token_required = gate.required();
        let listen_error = |source| DaemonError::HttpListen { address, source };
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        let router = super::http::router(service, topics, ring, gate, &limits);
        // Dropping the sender (with the daemon) stops the server as sending does.
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(super::http::serve::serve(
            listener,
            router,
            Arc::new(limits),
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            address: bound,
            token,
            token_required,
            metrics,
            stop,
            task,
        })
    }

    async fn stop(self) -> Result<(), DaemonError> {
        let _ = self.stop.send(());
        // The server bounds its own shutdown by the grace period.
        self.task.await?;
        Ok(())
    }
}

/// A running object node: its node, store, object service and optional HTTP API.
#[derive(Debug)]
pub struct Daemon {
    service: ObjectService,
    topics: Option<Topics>,
    ring: Option<Ring>,
    http: Option<HttpServer>,
    anti_entropy: Option<AbortOnDrop>,
    /// The loop probing members as they connect (`None`: probes are off).
    probes: Option<AbortOnDrop>,
    /// The loop saving the store's allocator state once it falls idle (`None`: in memory).
    checkpoints: Option<AbortOnDrop>,
}

impl Daemon {
    /// Settings for a daemon serving objects under `objects`.
    pub fn builder(objects: ObjectConfig) -> DaemonBuilder {
        DaemonBuilder {
            objects,
            data_dir: None,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            http: None,
            options: ServiceOptions::default(),
            http_limits: HttpLimits::default(),
            http_auth: HttpAuth::default(),
            topics: None,
            ring: None,
        }
    }

    /// The node underneath.
    pub fn node(&self) -> &Node {
        self.service.node()
    }

    /// The object service (its store is [`ObjectService::store`]).
    pub fn service(&self) -> &ObjectService {
        &self.service
    }

    /// The topics, if they run.
    pub fn topics(&self) -> Option<&Topics> {
        self.topics.as_ref()
    }

    /// The ring pipeline, if it runs.
    pub fn ring(&self) -> Option<&Ring> {
        self.ring.as_ref()
    }

    /// Where the HTTP API listens, if it runs.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|http| http.address)
    }

    /// The HTTP API's token (`None` without an HTTP API).
    pub fn http_token(&self) -> Option<&Token> {
        self.http.as_ref().map(|http| &http.token)
    }

    /// Whether every HTTP request needs the token.
    pub fn http_token_required(&self) -> bool {
        self.http.as_ref().is_some_and(|http| http.token_required)
    }

    /// The HTTP API's refusal counters (`None` without an HTTP API).
    pub fn http_metrics(&self) -> Option<&HttpMetrics> {
        self.http.as_ref().map(|http| &http.metrics)
    }

    /// Ends every topic subscription (its stream's last event says `shutdown`), stops
    /// anti-entropy and accepting HTTP connections, lets requests in flight finish (bounded by
    /// [`HttpLimits::shutdown_grace`]), then closes the node's connections with a reason and
    /// waits for the endpoint to go idle. The store is flushed: every write was committed
    /// durably when it was acknowledged, and its file is closed when the last handle drops.
    /// Last, a store file occupying much more disk than its content is compacted
    /// ([`Store::compact`]); a failure there is logged, never lost data (each compaction step
    /// commits atomically).
    pub async fn shutdown(self) -> Result<(), DaemonError> {
        drop(self.anti_entropy);
        drop(self.probes);
        drop(self.checkpoints);
        if let Some(topics) = &self.topics {
            topics.close();
        }
        if let Some(ring) = &self.ring {
            ring.close();
        }
        let http = match self.http {
            Some(http) => http.stop().await,
            None => Ok(()),
        };
        self.service.node().close().await;
        compact_store(&self.service).await;
        http
    }
}

/// Compacts the store on the blocking pool, logging what it did. The node is closed by now;
/// a store call still running holds compaction back (it takes the store's write lock).
async fn compact_store(service: &ObjectService) {
    let service = service.clone();
    let outcome = tokio::task::spawn_blocking(move || service.store().compact()).await;
    match outcome {
        Ok(Ok(Some(done))) => tracing::info!(
            content_bytes = done.content_bytes,
            before_bytes = done.before_bytes,
            after_bytes = done.after_bytes,
            took_ms = done.took.as_millis() as u64,
            "compacted the object store"
        ),
        Ok(Ok(None)) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "object store compaction failed; the store is intact")
        }
        Err(error) => tracing::warn!(%error, "object store compaction did not run"),
    }
}
