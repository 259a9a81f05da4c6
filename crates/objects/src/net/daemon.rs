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
//! - The store is `objects.redb` in the data directory, or in memory without one.
//! - The HTTP API is served only when [`DaemonBuilder::http`] gave it an address.
//!
//! [`Daemon::shutdown`] stops the HTTP API (connections get [`HTTP_SHUTDOWN_GRACE`] to finish,
//! then are cut) and closes the node. Dropping a daemon without it also stops the HTTP API, but
//! leaves the node to its other handles.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use meshwire::{IdentityError, Keypair, Node, NodeConfig, NodeError, PeerId};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::service::{
    ObjectConfig, ObjectService, ObjectServiceError, PhysicalClock, ServiceOptions,
};
use super::store::{Store, StoreError, DEFAULT_CACHE_BYTES};

/// The store's file in a data directory.
pub const STORE_FILE: &str = "objects.redb";

/// How long a shutdown lets open HTTP connections finish before cutting them.
pub const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

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
    /// The HTTP API stopped with an error.
    #[error("the HTTP API failed: {0}")]
    Http(#[source] std::io::Error),
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
    cache_bytes: usize,
    http: Option<SocketAddr>,
    options: ServiceOptions,
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

    /// Bound of the store's in-memory cache of hot objects (default [`DEFAULT_CACHE_BYTES`]).
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Serve the HTTP API on `address` (port 0: any free port, see [`Daemon::http_address`]).
    pub fn http(mut self, address: SocketAddr) -> Self {
        self.http = Some(address);
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

    /// Starts the store, the object service and the HTTP API (if asked for) on `node`, which
    /// keeps its own identity: a data directory holds only the store then.
    pub async fn start(self, node: Node) -> Result<Daemon, DaemonError> {
        let store = match &self.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| DaemonError::DataDir {
                    path: dir.clone(),
                    source,
                })?;
                let path = dir.join(STORE_FILE);
                Store::open(&path, self.cache_bytes)
                    .map_err(|source| DaemonError::Store { path, source })?
            }
            None => Store::in_memory(self.cache_bytes).map_err(DaemonError::MemoryStore)?,
        };
        let service = ObjectService::new(node, store, self.objects, self.options)?;
        let http = match self.http {
            Some(address) => Some(HttpServer::start(address, service.clone()).await?),
            None => None,
        };
        Ok(Daemon { service, http })
    }
}

#[derive(Debug)]
struct HttpServer {
    address: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl HttpServer {
    async fn start(address: SocketAddr, service: ObjectService) -> Result<Self, DaemonError> {
        let listen_error = |source| DaemonError::HttpListen { address, source };
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        // Dropping the sender (with the daemon) stops the server as sending does.
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(super::http::serve(listener, service, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            address: bound,
            stop,
            task,
        })
    }

    async fn stop(self) -> Result<(), DaemonError> {
        let _ = self.stop.send(());
        let abort = self.task.abort_handle();
        match tokio::time::timeout(HTTP_SHUTDOWN_GRACE, self.task).await {
            Ok(joined) => joined?.map_err(DaemonError::Http),
            Err(_) => {
                // Connections still open after the grace period are cut.
                abort.abort();
                Ok(())
            }
        }
    }
}

/// A running object node: its node, store, object service and optional HTTP API.
#[derive(Debug)]
pub struct Daemon {
    service: ObjectService,
    http: Option<HttpServer>,
}

impl Daemon {
    /// Settings for a daemon serving objects under `objects`.
    pub fn builder(objects: ObjectConfig) -> DaemonBuilder {
        DaemonBuilder {
            objects,
            data_dir: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
            http: None,
            options: ServiceOptions::default(),
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

    /// Where the HTTP API listens, if it runs.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|http| http.address)
    }

    /// Stops the HTTP API, then closes the node. Reports an HTTP API that had failed.
    pub async fn shutdown(self) -> Result<(), DaemonError> {
        let http = match self.http {
            Some(http) => http.stop().await,
            None => Ok(()),
        };
        self.service.node().close().await;
        http
    }
}
