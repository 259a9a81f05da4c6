//! Build an emulated network of meshwire nodes, schedule faults, and run it in virtual time.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use meshwire::{Keypair, Metrics, Node, NodeConfig, PeerId};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cpu::Cpu;
use crate::link::{LinkSpec, Rate};
use crate::placement::{Control, Placement, SharedLog};
use crate::socket::{Carrier, DownlinkStats, LabSocket, Network, SocketStats};

/// UDP port every lab node listens on.
pub const NODE_PORT: u16 = 7000;
/// Length of one turmoil step: 1 ms keeps millisecond latencies exact.
pub const TICK: Duration = Duration::from_millis(1);
/// The MTU lab nodes pin (Ethernet's 1500 less IPv4 and UDP headers), with discovery off.
pub const LAB_MTU: u16 = 1472;

/// Why a lab run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// turmoil stopped the run because a host's software returned an error or panicked. turmoil
    /// hands over an untyped, non-`Send` `Box<dyn Error>`, so its message is what is kept.
    #[error("simulation failed: {0}")]
    Simulation(String),
    /// A real-time client's software returned an error (host software errors are untyped
    /// `Box<dyn Error>`s, so the message is kept).
    #[error("host {host} failed: {reason}")]
    HostFailed {
        /// The host.
        host: String,
        /// What its software returned.
        reason: String,
    },
    /// A real-time client's task panicked or was cancelled.
    #[error("host {host} did not finish")]
    HostAborted {
        /// The host.
        host: String,
        /// What tokio said.
        source: tokio::task::JoinError,
    },
    /// The real-time runtime could not be built.
    #[error("cannot start the real-time runtime")]
    Runtime(#[source] std::io::Error),
    /// The control socket of a placed lab could not be bound.
    #[error("cannot bind the control socket in {dir}")]
    Control {
        /// The control directory.
        dir: std::path::PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A placed lab could not bind its host's node socket.
    #[error("cannot bind {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A name that is not a host of this lab.
    #[error("unknown host {0:?}")]
    UnknownHost(String),
    /// The event or setting cannot be done in this lab's mode.
    #[error("not supported here: {0}")]
    Unsupported(String),
}

/// Something that happens to the network at a scheduled virtual time.
#[derive(Debug, Clone, PartialEq)]
pub enum LabEvent {
    /// Cut both directions between two hosts.
    Partition(String, String),
    /// Cut one direction: datagrams from the first host to the second are lost.
    PartitionOneway(String, String),
    /// Restore both directions.
    Repair(String, String),
    /// Stop a host's software; its sockets and tasks are gone.
    Crash(String),
    /// Start a host's software again (after a crash, or as a reboot).
    Restart(String),
    /// Change a directed link's spec.
    SetLink(String, String, LinkSpec),
}

/// What a host's software gets: its name, address, identity and the emulated network.
#[derive(Debug, Clone)]
pub struct HostContext {
    /// The host's name.
    pub name: String,
    /// The host's address in the emulated network.
    pub ip: IpAddr,
    /// The host's node identity, derived from the scenario seed and its name.
    pub keypair: Keypair,
    /// The scenario seed.
    pub seed: u64,
    network: Arc<Network>,
    metrics: MetricsBoard,
    realtime: bool,
    prebound: Prebound,
    cpu: Arc<Cpu>,
}

/// A placed lab's node socket, bound before the run starts (see [`Lab::placed`]).
type Prebound = Rc<RefCell<Option<Arc<LabSocket>>>>;

/// The metrics of every node the lab started, by host name (the latest incarnation's).
type MetricsBoard = Rc<RefCell<BTreeMap<String, Arc<Metrics>>>>;

impl HostContext {
    /// The host's one CPU ([`crate::cpu`]), new each time its software starts.
    pub fn cpu(&self) -> &Arc<Cpu> {
        &self.cpu
    }

    /// A node config for this host: its identity, seeded jitter, the lab's pinned MTU.
    pub fn node_config(&self) -> NodeConfig {
        let mut config = NodeConfig::new(self.keypair.clone());
        config.rng_seed = Some(derive_seed(self.seed, &self.name, 1));
        config.transport.initial_mtu = LAB_MTU;
        config.transport.mtu_discovery = false;
        config
    }

    /// Binds an emulated socket on [`NODE_PORT`] and starts a node on it.
    pub async fn start_node(
        &self,
        config: NodeConfig,
    ) -> Result<(Node, Arc<SocketStats>), Box<dyn std::error::Error>> {
        let socket = self.bind(NODE_PORT).await?;
        let stats = socket.stats();
        let node = Node::with_socket(config, socket)?;
        self.metrics
            .borrow_mut()
            .insert(self.name.clone(), node.shared_metrics());
        Ok((node, stats))
    }

    /// Binds a raw emulated socket on `port` (for calibrating the emulator without QUIC). In a
    /// placed lab the host's node socket was bound before the run: the first bind of [`NODE_PORT`]
    /// returns it.
    pub async fn bind(&self, port: u16) -> std::io::Result<Arc<LabSocket>> {
        if port == NODE_PORT {
            if let Some(socket) = self.prebound.borrow_mut().take() {
                return Ok(socket);
            }
        }
        let seed = derive_seed(self.seed, &self.name, u64::from(port));
        if self.realtime {
            let address = SocketAddr::new(self.ip, port);
            LabSocket::bind_real(address, self.network.clone(), seed).await
        } else {
            LabSocket::bind_simulated(self.ip, port, self.network.clone(), seed).await
        }
    }
}

thread_local! {
    static REALTIME_EPOCH: std::cell::Cell<Option<tokio::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// Time since the run started, the same on every host: turmoil's simulation clock in virtual time
/// (each host's tokio `Instant`s have their own origin, so instants from two hosts must not be
/// compared), the wall clock in a real-time run. Zero outside a run.
pub fn clock() -> Duration {
    turmoil::sim_elapsed()
        .or_else(|| {
            REALTIME_EPOCH
                .with(|epoch| epoch.get())
                .map(|start| start.elapsed())
        })
        .unwrap_or_default()
}

/// A stable 64-bit seed for `name` under the scenario seed (FNV-1a, then a SplitMix64 finish).
pub fn derive_seed(seed: u64, name: &str, salt: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for byte in name.bytes().chain(salt.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The identity of host `name` under `seed`.
pub fn host_keypair(seed: u64, name: &str) -> Keypair {
    let mut secret = [0u8; 32];
    for (index, chunk) in secret.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&derive_seed(seed, name, 100 + index as u64).to_le_bytes());
    }
    Keypair::from_seed(secret)
}

type LocalFuture = Pin<Box<dyn Future<Output = Result<(), Box<dyn std::error::Error>>>>>;

/// Where the hosts run: turmoil in virtual time, or tasks on real sockets in real time.
enum Backend {
    Simulated(Box<turmoil::Sim<'static>>),
    Realtime {
        hosts: Vec<(String, Box<dyn Fn() -> LocalFuture>)>,
        clients: Vec<(String, LocalFuture)>,
        ips: BTreeMap<String, IpAddr>,
        /// When this process runs one host of the lab: which, and the channel to the others.
        placed: Option<Placed>,
    },
}

/// A lab's part when its hosts run as separate processes.
struct Placed {
    placement: Placement,
    control: Rc<Control>,
    /// Clients that run in other processes.
    remote_clients: Vec<String>,
}

/// An emulated network under construction or running.
pub struct Lab {
    backend: Backend,
    network: Arc<Network>,
    seed: u64,
    hosts: Vec<String>,
    clients: usize,
    metrics: MetricsBoard,
    prebound: Prebound,
    schedule: Vec<(Duration, LabEvent)>,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab")
            .field("seed", &self.seed)
            .field("hosts", &self.hosts)
            .field("realtime", &self.is_realtime())
            .finish_non_exhaustive()
    }
}

impl Lab {
    /// A lab in virtual time whose links follow `default` until set otherwise, running at most
    /// `limit` of virtual time.
    pub fn new(seed: u64, default: LinkSpec, limit: Duration) -> Self {
        Self::simulated(seed, default, limit, false)
    }

    /// [`Lab::new`], but in every tick turmoil runs the hosts in a random order drawn from the
    /// seed rather than in the order they were added. Hosts sending to a shared downlink need it
    /// ([`Lab::downlink`]): what they send in one tick reaches the queue host by host, so in a
    /// fixed order the first host would always find the free space.
    pub fn new_random_order(seed: u64, default: LinkSpec, limit: Duration) -> Self {
        Self::simulated(seed, default, limit, true)
    }

    fn simulated(seed: u64, default: LinkSpec, limit: Duration, random_order: bool) -> Self {
        let mut builder = turmoil::Builder::new();
        if random_order {
            builder.enable_random_order();
        }
        let sim = builder
            .tick_duration(TICK)
            .simulation_duration(limit)
            .min_message_latency(Duration::ZERO)
            .max_message_latency(Duration::ZERO)
            .udp_capacity(1 << 16)
            // turmoil TCP (the gRPC baselines) lets a socket have only this many writes in flight;
            // its default of 64 would throttle a 0.5 MB batch below any real link.
            .tcp_capacity(1 << 16)
            .rng_seed(seed)
            .build();
        Self::with_backend(
            Backend::Simulated(Box::new(sim)),
            seed,
            Network::new(default, Carrier::Turmoil),
        )
    }

    /// A lab in real time: every host gets its own loopback address (127.0.0.2, 127.0.0.3, ...)
    /// and real UDP sockets; the emulated socket applies each link's delay, rate and loss itself.
    /// Partitions are applied by the emulated sockets; crashes and restarts are not supported.
    pub fn realtime(seed: u64, default: LinkSpec) -> Self {
        let backend = Backend::Realtime {
            hosts: Vec::new(),
            clients: Vec::new(),
            ips: BTreeMap::new(),
            placed: None,
        };
        Self::with_backend(backend, seed, Network::new(default, Carrier::Loopback))
    }

    /// A lab in real time of which this process runs only `placement.host`, at its address; the
    /// other hosts run in other processes at theirs (see [`crate::placement`]). The sockets pace
    /// bit-rate links themselves unless `placement.kernel_rate` says the kernel does.
    ///
    /// Every process binds its host's node socket, then waits until every other process has
    /// too, and only then starts its host at `placement.start` (clients a millisecond later, so the
    /// hosts of other processes have bound whatever else they bind): a first datagram that found
    /// its peer not yet listening would be a loss, and QUIC counts a lost Initial as congestion.
    pub fn placed(seed: u64, default: LinkSpec, placement: Placement) -> Self {
        let carrier = if placement.kernel_rate {
            Carrier::KernelRate
        } else {
            Carrier::Loopback
        };
        let backend = Backend::Realtime {
            hosts: Vec::new(),
            clients: Vec::new(),
            ips: placement.addresses.clone(),
            placed: Some(Placed {
                control: Rc::new(Control::new(&placement)),
                placement,
                remote_clients: Vec::new(),
            }),
        };
        Self::with_backend(backend, seed, Network::new(default, carrier))
    }

    fn with_backend(backend: Backend, seed: u64, network: Arc<Network>) -> Self {
        Self {
            backend,
            network,
            seed,
            hosts: Vec::new(),
            clients: 0,
            metrics: Rc::default(),
            prebound: Rc::default(),
            schedule: Vec::new(),
        }
    }

    /// Whether this lab runs on real sockets in real time.
    pub fn is_realtime(&self) -> bool {
        matches!(self.backend, Backend::Realtime { .. })
    }

    /// The emulated network's link table.
    pub fn network(&self) -> &Arc<Network> {
        &self.network
    }

    /// Adds a host that runs `software`, restarted from scratch after each restart. The software
    /// returns when it is done; a host meant to run forever awaits a future that never resolves.
    pub fn host<F, Fut>(&mut self, name: &str, software: F)
    where
        F: Fn(HostContext) -> Fut + 'static,
        Fut: Future<Output = Result<(), Box<dyn std::error::Error>>> + 'static,
    {
        let context = self.context_template(name);
        match &mut self.backend {
            Backend::Simulated(sim) => sim.host(name, move || {
                let mut context = context.clone();
                context.ip = turmoil::lookup(context.name.as_str());
                // A restarted host's tokio clock starts again: so does its CPU.
                context.cpu = Arc::default();
                software(context)
            }),
            Backend::Realtime { hosts, placed, .. } => {
                // A placed lab runs only its own host; the others run elsewhere.
                if placed
                    .as_ref()
                    .is_none_or(|placed| placed.placement.host == name)
                {
                    let context = context.clone();
                    hosts.push((
                        name.to_string(),
                        Box::new(move || Box::pin(software(context.clone())) as LocalFuture),
                    ));
                }
            }
        }
        self.register(name);
    }

    /// Adds a client host: the run ends when every client's `software` has returned.
    pub fn client<F, Fut>(&mut self, name: &str, software: F)
    where
        F: FnOnce(HostContext) -> Fut + 'static,
        Fut: Future<Output = Result<(), Box<dyn std::error::Error>>> + 'static,
    {
        let mut context = self.context_template(name);
        match &mut self.backend {
            Backend::Simulated(sim) => sim.client(name, async move {
                context.ip = turmoil::lookup(context.name.as_str());
                software(context).await
            }),
            Backend::Realtime {
                clients, placed, ..
            } => match placed {
                Some(placed) if placed.placement.host != name => {
                    placed.remote_clients.push(name.to_string());
                }
                _ => clients.push((name.to_string(), Box::pin(software(context)))),
            },
        }
        self.clients += 1;
        self.register(name);
    }

    fn context_template(&mut self, name: &str) -> HostContext {
        let ip = match &mut self.backend {
            Backend::Simulated(_) => IpAddr::from([0, 0, 0, 0]),
            // Placed: the placement's address (a host it does not name fails the run).
            Backend::Realtime {
                ips,
                placed: Some(_),
                ..
            } => ips.get(name).copied().unwrap_or(IpAddr::from([0, 0, 0, 0])),
            Backend::Realtime { ips, .. } => {
                let index = ips.len() as u32 + 2;
                let ip = IpAddr::from(std::net::Ipv4Addr::from(0x7f00_0000 + index));
                *ips.entry(name.to_string()).or_insert(ip)
            }
        };
        HostContext {
            name: name.to_string(),
            ip,
            keypair: host_keypair(self.seed, name),
            seed: self.seed,
            network: self.network.clone(),
            metrics: self.metrics.clone(),
            prebound: self.prebound.clone(),
            realtime: self.is_realtime(),
            cpu: Arc::default(),
        }
    }

    /// A new log that hosts of this lab share: one host appends, any host reads. Within one
    /// process it is shared memory; across the processes of a placed lab its entries are sent to
    /// every process. `name` must be unique in the lab.
    pub fn shared_log<T: Serialize + DeserializeOwned + 'static>(
        &self,
        name: &str,
    ) -> SharedLog<T> {
        let control = match &self.backend {
            Backend::Realtime {
                placed: Some(placed),
                ..
            } => Some(placed.control.clone()),
            _ => None,
        };
        SharedLog::new(name, control)
    }

    /// The metrics of every node started so far, by host name (after a restart, the new node's).
    pub fn node_metrics(&self) -> BTreeMap<String, Arc<Metrics>> {
        self.metrics.borrow().clone()
    }

    fn register(&mut self, name: &str) {
        self.hosts.push(name.to_string());
        // Latency is applied between every pair as soon as both exist.
        for other in self.hosts.clone() {
            if other != name {
                self.sync_latency(&other, name);
            }
        }
    }

    fn sync_latency(&self, a: &str, b: &str) {
        let Backend::Simulated(sim) = &self.backend else {
            return;
        };
        let (ip_a, ip_b) = (sim.lookup(a), sim.lookup(b));
        // turmoil hands a datagram over one tick after its configured latency has passed, so the
        // configured latency is one tick short (calibration's `rtt` case checks the result).
        let latency = self
            .network
            .transport_latency(ip_a, ip_b)
            .saturating_sub(TICK);
        sim.set_link_latency(a, b, latency);
    }

    /// The address of host `name`.
    pub fn ip(&self, name: &str) -> Result<IpAddr, LabError> {
        if !self.hosts.iter().any(|host| host == name) {
            return Err(LabError::UnknownHost(name.to_string()));
        }
        match &self.backend {
            Backend::Simulated(sim) => Ok(sim.lookup(name)),
            Backend::Realtime { ips, .. } => ips
                .get(name)
                .copied()
                .ok_or_else(|| LabError::UnknownHost(name.to_string())),
        }
    }

    /// The node address of host `name` (ip and [`NODE_PORT`]).
    pub fn node_address(&self, name: &str) -> Result<SocketAddr, LabError> {
        Ok(SocketAddr::new(self.ip(name)?, NODE_PORT))
    }

    /// The identity of host `name` (available before the host exists).
    pub fn peer_id(&self, name: &str) -> PeerId {
        host_keypair(self.seed, name).peer_id()
    }

    /// Sets the directed link `from -> to`. Call after both hosts exist.
    pub fn link(&mut self, from: &str, to: &str, spec: LinkSpec) -> Result<(), LabError> {
        let (ip_from, ip_to) = (self.ip(from)?, self.ip(to)?);
        self.network.set_link(ip_from, ip_to, spec);
        self.sync_latency(from, to);
        Ok(())
    }

    /// Sets both directions between `a` and `b`.
    pub fn link_both(&mut self, a: &str, b: &str, spec: LinkSpec) -> Result<(), LabError> {
        self.link(a, b, spec)?;
        self.link(b, a, spec)
    }

    /// Gives host `name` an uplink that all its egress passes first.
    pub fn uplink(&mut self, name: &str, spec: LinkSpec) -> Result<(), LabError> {
        let ip = self.ip(name)?;
        self.network.set_uplink(ip, spec);
        Ok(())
    }

    /// Gives host `name` a downlink that all traffic to it passes, from whichever host, after the
    /// sender's link: one rate and drop-tail queue (`spec`'s latency, jitter and loss do not
    /// apply), so senders to `name` share a bottleneck. Admission is in send order, at the time a
    /// datagram leaves its sender's link, before propagation: exact when the senders' latencies to
    /// `name` are equal (see [`crate::socket`]). Virtual-time labs whose senders share a downlink
    /// should be built with [`Lab::new_random_order`]. A lab placed across processes refuses it
    /// ([`LabError::Unsupported`]): the queue is shared by senders in other processes.
    pub fn downlink(&mut self, name: &str, spec: LinkSpec) -> Result<(), LabError> {
        if matches!(
            self.backend,
            Backend::Realtime {
                placed: Some(_),
                ..
            }
        ) {
            return Err(LabError::Unsupported(format!(
                "a downlink of {name}: its queue is shared by senders that a placed lab runs in \
                 other processes"
            )));
        }
        let ip = self.ip(name)?;
        self.network.set_downlink(ip, spec);
        Ok(())
    }

    /// What the downlink of host `name` has done so far; `None` if it has none.
    pub fn downlink_stats(&self, name: &str) -> Result<Option<DownlinkStats>, LabError> {
        Ok(self.network.downlink_stats(self.ip(name)?))
    }

    /// Schedules `event` at time `at` from the start of the run.
    pub fn at(&mut self, at: Duration, event: LabEvent) {
        self.schedule.push((at, event));
        self.schedule.sort_by_key(|(time, _)| *time);
    }

    /// Runs until every client has returned (if there are clients) or `duration` has passed,
    /// applying scheduled events on time. Returns whether the clients finished. `progress` is
    /// called about every 100 ms of lab time with the elapsed time.
    pub fn run(
        &mut self,
        duration: Duration,
        progress: impl FnMut(Duration),
    ) -> Result<bool, LabError> {
        if self.is_realtime() {
            self.run_realtime(duration, progress)
        } else {
            self.run_simulated(duration, progress)
        }
    }

    fn run_simulated(
        &mut self,
        duration: Duration,
        mut progress: impl FnMut(Duration),
    ) -> Result<bool, LabError> {
        let elapsed = |lab: &Self| match &lab.backend {
            Backend::Simulated(sim) => sim.elapsed(),
            Backend::Realtime { .. } => Duration::ZERO,
        };
        let end = elapsed(self) + duration;
        let mut next_report = Duration::ZERO;
        loop {
            let now = elapsed(self);
            while self.schedule.first().is_some_and(|(at, _)| *at <= now) {
                let (_, event) = self.schedule.remove(0);
                self.apply(event)?;
            }
            if now >= end {
                return Ok(false);
            }
            if now >= next_report {
                progress(now);
                next_report = now + Duration::from_millis(100);
            }
            let Backend::Simulated(sim) = &mut self.backend else {
                return Ok(false);
            };
            let finished = sim
                .step()
                .map_err(|error| LabError::Simulation(error.to_string()))?;
            // turmoil reports "finished" when no client is running, which is always true in a lab
            // without clients: such a lab runs for the whole duration.
            if finished && self.clients > 0 {
                return Ok(true);
            }
        }
    }

    fn run_realtime(
        &mut self,
        duration: Duration,
        mut progress: impl FnMut(Duration),
    ) -> Result<bool, LabError> {
        let names = self.hosts.clone();
        let Backend::Realtime {
            hosts,
            clients,
            placed,
            ..
        } = &mut self.backend
        else {
            return Ok(false);
        };
        let hosts = std::mem::take(hosts);
        let clients = std::mem::take(clients);
        // A placed lab: its channel to the other processes, their clients, its placement.
        let placed = placed.as_ref().map(|placed| {
            (
                placed.control.clone(),
                placed.remote_clients.clone(),
                placed.placement.clone(),
            )
        });
        if let Some((_, _, placement)) = &placed {
            if let Some(missing) = names
                .iter()
                .find(|name| !placement.addresses.contains_key(*name))
            {
                return Err(LabError::UnknownHost(missing.clone()));
            }
        }
        let mut schedule = std::mem::take(&mut self.schedule);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(LabError::Runtime)?;
        let local = tokio::task::LocalSet::new();
        let result = local.block_on(&runtime, async {
            let start = match &placed {
                Some((control, _, placement)) => {
                    self.prepare_placed(control, placement, &names, duration)
                        .await?
                }
                None => Some(tokio::time::Instant::now()),
            };
            let Some(start) = start else {
                return Ok(false);
            };
            REALTIME_EPOCH.with(|epoch| epoch.set(Some(start)));
            for (name, software) in &hosts {
                let future = software();
                let name = name.clone();
                tokio::task::spawn_local(async move {
                    if let Err(error) = future.await {
                        tracing::warn!(host = %name, %error, "host software failed");
                    }
                });
            }
            if placed.is_some() && !clients.is_empty() {
                tokio::time::sleep_until(start + TICK).await;
            }
            let announce_finished = || {
                if let Some((control, _, _)) = &placed {
                    control.announce_finished();
                }
            };
            let mut running: Vec<_> = clients
                .into_iter()
                .map(|(name, future)| (name, tokio::task::spawn_local(future)))
                .collect();
            let mut next_report = Duration::ZERO;
            loop {
                let now = start.elapsed();
                while schedule.first().is_some_and(|(at, _)| *at <= now) {
                    let (_, event) = schedule.remove(0);
                    self.apply(event)?;
                }
                let mut index = 0;
                while index < running.len() {
                    if running[index].1.is_finished() {
                        let (name, handle) = running.remove(index);
                        let outcome = handle.await;
                        if running.is_empty() {
                            announce_finished();
                        }
                        match outcome {
                            Ok(Ok(())) => {}
                            Ok(Err(error)) => {
                                return Err(LabError::HostFailed {
                                    host: name,
                                    reason: error.to_string(),
                                })
                            }
                            Err(source) => {
                                return Err(LabError::HostAborted { host: name, source })
                            }
                        }
                    } else {
                        index += 1;
                    }
                }
                let elsewhere_done = placed
                    .as_ref()
                    .is_none_or(|(control, remote, _)| control.finished(remote));
                if self.clients > 0 && running.is_empty() && elsewhere_done {
                    return Ok(true);
                }
                if now >= duration {
                    return Ok(false);
                }
                if now >= next_report {
                    progress(now);
                    next_report = now + Duration::from_millis(100);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        if let Some((control, _, _)) = &placed {
            // Deliver what is still queued (a finished client, the last log entries) while the
            // other processes are there to take it.
            local.block_on(&runtime, async {
                for _ in 0..2000 {
                    control.flush();
                    if control.idle() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
        }
        REALTIME_EPOCH.with(|epoch| epoch.set(None));
        result
    }

    /// A placed lab's start: binds the control socket and the host's node socket, waits until
    /// every other process has bound its own, then until the common start. Returns the start on
    /// this process's clock, or `None` if the others did not come within `duration`.
    async fn prepare_placed(
        &self,
        control: &Rc<Control>,
        placement: &Placement,
        names: &[String],
        duration: Duration,
    ) -> Result<Option<tokio::time::Instant>, LabError> {
        let now = tokio::time::Instant::now();
        let start = match placement.start.duration_since(std::time::SystemTime::now()) {
            Ok(ahead) => now + ahead,
            Err(late) => now.checked_sub(late.duration()).unwrap_or(now),
        };
        let peers = names
            .iter()
            .filter(|name| **name != placement.host)
            .cloned()
            .collect();
        control.bind(peers).map_err(|source| LabError::Control {
            dir: placement.control_dir.clone(),
            source,
        })?;
        tokio::task::spawn_local(control.clone().serve());
        let address = self.node_address(&placement.host)?;
        let seed = derive_seed(self.seed, &placement.host, u64::from(NODE_PORT));
        let socket = LabSocket::bind_real(address, self.network.clone(), seed)
            .await
            .map_err(|source| LabError::Bind { address, source })?;
        *self.prebound.borrow_mut() = Some(socket);
        control.announce_ready();
        while !control.all_ready() {
            if start.elapsed() >= duration {
                return Ok(None);
            }
            tokio::time::sleep(TICK).await;
        }
        tokio::time::sleep_until(start).await;
        Ok(Some(start))
    }

    fn apply(&mut self, event: LabEvent) -> Result<(), LabError> {
        tracing::debug!(?event, "lab event");
        let both = |lab: &Self, a: &str, b: &str| -> Result<(IpAddr, IpAddr), LabError> {
            Ok((lab.ip(a)?, lab.ip(b)?))
        };
        match (&mut self.backend, event) {
            (Backend::Simulated(sim), LabEvent::Partition(a, b)) => {
                sim.partition(a.as_str(), b.as_str())
            }
            (Backend::Simulated(sim), LabEvent::PartitionOneway(from, to)) => {
                sim.partition_oneway(from.as_str(), to.as_str())
            }
            (Backend::Simulated(sim), LabEvent::Repair(a, b)) => sim.repair(a.as_str(), b.as_str()),
            (Backend::Simulated(sim), LabEvent::Crash(host)) => sim.crash(host.as_str()),
            (Backend::Simulated(sim), LabEvent::Restart(host)) => sim.bounce(host.as_str()),
            (Backend::Realtime { .. }, LabEvent::Partition(a, b)) => {
                let (a, b) = both(self, &a, &b)?;
                self.network.set_blocked(a, b, true);
                self.network.set_blocked(b, a, true);
            }
            (Backend::Realtime { .. }, LabEvent::PartitionOneway(from, to)) => {
                let (from, to) = both(self, &from, &to)?;
                self.network.set_blocked(from, to, true);
            }
            (Backend::Realtime { .. }, LabEvent::Repair(a, b)) => {
                let (a, b) = both(self, &a, &b)?;
                self.network.set_blocked(a, b, false);
                self.network.set_blocked(b, a, false);
            }
            (Backend::Realtime { .. }, LabEvent::Crash(host) | LabEvent::Restart(host)) => {
                return Err(LabError::Unsupported(format!(
                    "crash and restart of {host} need virtual time"
                )))
            }
            (_, LabEvent::SetLink(from, to, spec)) => self.link(&from, &to, spec)?,
        }
        Ok(())
    }
}

/// A link spec with the given one-way latency and bit rate, a queue of one bandwidth-delay
/// product (at least 64 KiB), no loss.
pub fn wan_link(latency: Duration, bits_per_sec: u64) -> LinkSpec {
    let bdp = (u128::from(bits_per_sec) * latency.as_micros() * 2 / 8_000_000) as usize;
    LinkSpec {
        latency,
        rate: Rate::BitsPerSec(bits_per_sec),
        queue_bytes: bdp.max(64 * 1024),
        loss: 0.0,
        jitter: Duration::ZERO,
    }
}
