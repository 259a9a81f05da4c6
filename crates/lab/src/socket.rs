//! Give quinn a UDP socket whose egress is paced, queued and lossy like a WAN link.
//!
//! # Design
//!
//! [`LabSocket`] implements [`quinn::AsyncUdpSocket`] over one of two transports: turmoil's
//! simulated UDP (virtual time) or a real UDP socket (real time). The [`Carrier`] of the
//! [`Network`] says what the layer underneath already does, and so what the socket emulates:
//!
//! - [`Carrier::Turmoil`]: turmoil adds each pair's propagation delay, partitions and crashes. On
//!   every transmit the socket passes the datagram through the host's optional uplink [`Pacer`]
//!   and the directed link's pacer (serialization at the link rate, bounded drop-tail queue), then
//!   draws i.i.d. loss from the scenario's seeded RNG (after serialization: a lost datagram has
//!   used its place on the link, so a link of rate r and loss p delivers r·(1 − p), as NKN's
//!   emulator and the lab's physical floors have it), adds the part of the latency turmoil does
//!   not add plus jitter, and sends it when that time comes.
//! - [`Carrier::Loopback`]: real sockets with nothing in between. The sender emulates the egress
//!   (uplink and link pacers, drop-tail queues) and the receiver the path: it drops i.i.d. losses
//!   and holds every datagram for the link's latency plus jitter before quinn sees it.
//! - [`Carrier::KernelRate`]: real sockets whose kernel serializes bit-rate links itself (`tc tbf`
//!   on the veths between network namespaces, see `scripts/netns-lab.sh`). The sender paces only
//!   packet-rate links and uplinks (tbf counts bytes); the receiver emulates the path as above.
//!
//! A host may also have a **downlink** ([`Network::set_downlink`]): one rate and drop-tail queue
//! that every datagram *to* it passes, whichever host sent it, so senders to one receiver share a
//! bottleneck. It lives in the shared [`Network`], keyed by the receiver's address, and the send
//! path applies it after the sender's link (and, over turmoil, after the link's loss: a datagram
//! lost on the way never reaches the receiver's queue), before the propagation delay. This is an
//! approximation: a datagram is admitted when the sender sends it, at the time it leaves the
//! sender's link, in send order, rather than when it arrives at the receiver's end of the path.
//! It is exact when every sender's latency to the receiver is the same (the arrivals are then the
//! departures shifted by one constant); with unequal latencies the queue sees the datagrams in the
//! wrong order. Over turmoil the hosts run one after another in each 1 ms tick, so what two hosts
//! send in the same tick reaches the queue host by host: a lab whose senders share a downlink should
//! shuffle that order ([`crate::Lab::new_random_order`]), or the host that runs first always finds
//! the free space. The queue keeps the lab's clock ([`crate::lab::clock`]) because each turmoil
//! host's tokio clock has its own origin. On real sockets the same logic applies when every host
//! runs in one process; a lab placed across processes refuses downlinks.
//!
//! Jitter is a delay drawn per datagram, but a link keeps its order: a datagram never arrives
//! before one sent earlier on the same link (it waits behind it, as in a FIFO queue whose delay
//! varies). Deep reordering would be a different impairment: with a jitter of milliseconds at a
//! gigabit, independent delays reorder hundreds of datagrams, which real paths rarely do and
//! which QUIC's fixed packet-reordering threshold reads as loss.
//!
//! Datagrams that are due go out at once; the rest wait in a departure-ordered heap that an
//! egress task drains on each timer wake-up, releasing every datagram whose time has passed (tokio
//! timers tick every millisecond, so one wake-up may carry many datagrams). On real sockets the
//! datagrams released together go out as few `sendmsg` calls as possible (UDP GSO, quinn-udp), and
//! the receiver reads with GRO and `recvmmsg`; the kernel buffers are enlarged (up to
//! `net.core.rmem_max`/`wmem_max`) so a millisecond's burst at a gigabit fits.
//!
//! Each datagram carries one extra leading byte holding its ECN codepoint, so ECN marks set by
//! quinn arrive at the peer as they were sent (nothing marks congestion: there is no AQM). Link
//! rates count the UDP payload quinn sends, without that byte. Over turmoil one segment per
//! transmit (no GSO), and the MTU is whatever the node pins. Inbound datagrams wait in a bounded
//! channel; when quinn does not keep up, the overflow is dropped and counted, like a socket buffer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use meshwire_alloc_count::{untracked, Untracked};
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit, UdpSocketState};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::Interest;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::link::{LinkSpec, Pacer, Rate};

mod real;
#[cfg(test)]
mod tests;

use real::{real_egress, real_ingress, RealSender, RealUdp};

/// Datagrams a socket buffers on receive before dropping (well above any in-flight window here).
const RECEIVE_QUEUE: usize = 1 << 16;
/// Kernel buffer asked for on real sockets: a few milliseconds at a gigabit, more than one timer
/// wake-up releases. The kernel caps it at `net.core.rmem_max` / `wmem_max` (4 MiB here) and
/// doubles what it grants for its own bookkeeping; the default (208 KiB) dropped bursts.
const REAL_SOCKET_BUFFER: usize = 8 << 20;
/// A datagram due within this much of now goes out at once rather than through the egress task.
const HALF_TICK: Duration = Duration::from_micros(500);
/// Bytes one GSO send may carry (the kernel refuses a UDP datagram train above 64 KiB).
const GSO_MAX_BYTES: usize = 65_000;
/// Bytes of one receive buffer: a whole GRO train (up to 64 segments) or the largest datagram.
const RECEIVE_SLOT: usize = 64 * 1536;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What carries the emulated sockets' datagrams, and so which parts of a link the sockets
/// emulate themselves (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// turmoil, virtual time: it adds each pair's symmetric latency; the sockets do the rest on
    /// send.
    Turmoil,
    /// Real UDP sockets with nothing in between: the sender paces and queues, the receiver
    /// delays, jitters and loses.
    Loopback,
    /// Real UDP sockets whose kernel serializes bit-rate links (veth + `tc tbf`): the sender paces
    /// only packet-rate links and uplinks, the receiver delays, jitters and loses.
    KernelRate,
}

/// The emulated network's link table: a spec per directed link, a default, optional host uplinks
/// and downlinks (with the downlinks' shared queues).
/// Shared by every socket and changeable while a scenario runs.
#[derive(Debug)]
pub struct Network {
    table: Mutex<Table>,
    downlinks: Mutex<HashMap<IpAddr, Downlink>>,
    /// The origin of the downlinks' clock: [`crate::lab::clock`] after it.
    epoch: Instant,
    carrier: Carrier,
}

/// A host's downlink: the queue every datagram to it shares, and what it did.
#[derive(Debug)]
struct Downlink {
    spec: LinkSpec,
    pacer: Pacer,
    stats: DownlinkStats,
}

/// What a host's downlink has done since it was set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DownlinkStats {
    /// Datagrams admitted to its queue.
    pub admitted: u64,
    /// Bytes admitted (quinn's payload, as link rates count it).
    pub admitted_bytes: u64,
    /// Datagrams dropped because its queue was full.
    pub drops: u64,
}

#[derive(Debug, Clone)]
struct Table {
    default: LinkSpec,
    links: HashMap<(IpAddr, IpAddr), LinkSpec>,
    uplinks: HashMap<IpAddr, LinkSpec>,
    blocked: HashSet<(IpAddr, IpAddr)>,
}

impl Table {
    fn link(&self, from: IpAddr, to: IpAddr) -> LinkSpec {
        self.links.get(&(from, to)).copied().unwrap_or(self.default)
    }
}

/// Everything a send from `from` to `to` needs to know, read under one lock.
struct Route {
    spec: LinkSpec,
    uplink: Option<LinkSpec>,
    blocked: bool,
    transport_latency: Duration,
}

impl Network {
    /// A network whose links all follow `default` until set otherwise, carried by `carrier`.
    pub fn new(default: LinkSpec, carrier: Carrier) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table {
                default,
                links: HashMap::new(),
                uplinks: HashMap::new(),
                blocked: HashSet::new(),
            }),
            downlinks: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            carrier,
        })
    }

    /// What carries this network's datagrams.
    pub fn carrier(&self) -> Carrier {
        self.carrier
    }

    /// Sets the spec of the directed link `from -> to`.
    pub fn set_link(&self, from: IpAddr, to: IpAddr, spec: LinkSpec) {
        lock(&self.table).links.insert((from, to), spec);
    }

    /// Cuts (or restores) the directed link `from -> to` in the emulated sockets. Virtual-time labs
    /// partition through turmoil instead; real-time labs use this.
    pub fn set_blocked(&self, from: IpAddr, to: IpAddr, blocked: bool) {
        let mut table = lock(&self.table);
        if blocked {
            table.blocked.insert((from, to));
        } else {
            table.blocked.remove(&(from, to));
        }
    }

    /// Sets a shared uplink that every datagram from `host` passes before its link.
    pub fn set_uplink(&self, host: IpAddr, spec: LinkSpec) {
        lock(&self.table).uplinks.insert(host, spec);
    }

    /// Sets a shared downlink that every datagram to `host` passes after its sender's link: only
    /// `spec`'s rate and queue apply (the links have the latency, jitter and loss). Setting it
    /// again changes the spec and keeps the queue and counters. See the module documentation for
    /// where it sits and what it approximates.
    pub fn set_downlink(&self, host: IpAddr, spec: LinkSpec) {
        lock(&self.downlinks)
            .entry(host)
            .and_modify(|downlink| downlink.spec = spec)
            .or_insert(Downlink {
                spec,
                pacer: Pacer::default(),
                stats: DownlinkStats::default(),
            });
    }

    /// What the downlink of `host` has done, if it has one.
    pub fn downlink_stats(&self, host: IpAddr) -> Option<DownlinkStats> {
        lock(&self.downlinks)
            .get(&host)
            .map(|downlink| downlink.stats)
    }

    /// Passes a datagram of `len` bytes to `to` that leaves its sender's link at `leaves` (on the
    /// sender's clock, whose present is `now`) through `to`'s downlink, if it has one. Returns when
    /// it leaves the downlink, on the sender's clock, or `None` if the queue was full.
    fn through_downlink(
        &self,
        to: IpAddr,
        now: Instant,
        leaves: Instant,
        len: usize,
    ) -> Option<Instant> {
        let mut downlinks = lock(&self.downlinks);
        let Some(downlink) = downlinks.get_mut(&to) else {
            return Some(leaves);
        };
        // Each turmoil host's tokio clock has its own origin: the queue keeps the lab's clock.
        let arrives = self.epoch + crate::lab::clock() + (leaves - now);
        match downlink.pacer.admit(arrives, len, &downlink.spec) {
            Ok(done) => {
                downlink.stats.admitted += 1;
                downlink.stats.admitted_bytes += len as u64;
                Some(leaves + (done - arrives))
            }
            Err(_) => {
                downlink.stats.drops += 1;
                None
            }
        }
    }

    /// The spec of the directed link `from -> to`.
    pub fn link(&self, from: IpAddr, to: IpAddr) -> LinkSpec {
        lock(&self.table).link(from, to)
    }

    /// The delay the transport itself adds between `a` and `b` (the same both ways): the smaller
    /// of the two directions' latencies under turmoil, zero on real sockets.
    pub fn transport_latency(&self, a: IpAddr, b: IpAddr) -> Duration {
        let table = lock(&self.table);
        self.latency_in(&table, a, b)
    }

    fn latency_in(&self, table: &Table, a: IpAddr, b: IpAddr) -> Duration {
        match self.carrier {
            Carrier::Turmoil => table.link(a, b).latency.min(table.link(b, a).latency),
            Carrier::Loopback | Carrier::KernelRate => Duration::ZERO,
        }
    }

    fn route(&self, from: IpAddr, to: IpAddr) -> Route {
        let table = lock(&self.table);
        Route {
            spec: table.link(from, to),
            uplink: table.uplinks.get(&from).copied(),
            blocked: table.blocked.contains(&(from, to)),
            transport_latency: self.latency_in(&table, from, to),
        }
    }

    /// Whether the sockets serialize `spec` themselves (the kernel does bit rates under
    /// [`Carrier::KernelRate`]).
    fn socket_paces(&self, spec: &LinkSpec) -> bool {
        self.carrier != Carrier::KernelRate || matches!(spec.rate, Rate::PacketsPerSec(_))
    }

    /// Whether the receiver emulates the path (delay, jitter, loss): on real sockets.
    fn receiver_emulates_path(&self) -> bool {
        self.carrier != Carrier::Turmoil
    }
}

/// Counters of one socket's emulated egress and ingress.
#[derive(Debug, Default)]
pub struct SocketStats {
    /// Datagrams handed to the transport.
    pub sent: AtomicU64,
    /// Bytes handed to the transport (quinn's payload, without the ECN byte).
    pub sent_bytes: AtomicU64,
    /// Datagrams dropped by emulated loss (by the sender over turmoil, by the receiver on real
    /// sockets).
    pub lost: AtomicU64,
    /// Datagrams dropped because a queue was full (the host's uplink or a link's).
    pub queue_drops: AtomicU64,
    /// Datagrams dropped because the destination's downlink queue was full.
    pub downlink_drops: AtomicU64,
    /// Datagrams dropped because the link was cut (real-time partitions).
    pub blocked: AtomicU64,
    /// Datagrams the kernel refused because the socket's send buffer was full (real sockets).
    pub send_buffer_drops: AtomicU64,
    /// Datagrams received and passed to quinn.
    pub received: AtomicU64,
    /// Datagrams dropped because quinn did not read them fast enough.
    pub receive_drops: AtomicU64,
}

impl SocketStats {
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The UDP socket underneath: turmoil's simulated one or a real one.
#[derive(Clone)]
enum Transport {
    Simulated(Arc<turmoil::net::UdpSocket>),
    Real(Arc<RealUdp>),
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Simulated(_) => f.write_str("Simulated"),
            Self::Real(_) => f.write_str("Real"),
        }
    }
}

struct Scheduled {
    at: Instant,
    sequence: u64,
    to: SocketAddr,
    bytes: Bytes,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

struct Egress {
    rng: SmallRng,
    uplink: Pacer,
    links: HashMap<IpAddr, Pacer>,
    /// Per destination, when the latest datagram sent there arrives (jitter keeps link order).
    arrivals: HashMap<IpAddr, Instant>,
    sequence: u64,
    waiting: Arc<AtomicU64>,
}

/// A datagram's arrival time on the link to (or from) `peer`: its own, or that of the one sent
/// before it if later, so jitter delays datagrams without reordering a link.
fn in_link_order(arrivals: &mut HashMap<IpAddr, Instant>, peer: IpAddr, at: Instant) -> Instant {
    let last = arrivals.entry(peer).or_insert(at);
    *last = (*last).max(at);
    *last
}

/// Where one datagram goes after the sender's emulation.
enum Verdict {
    /// Dropped (and counted).
    Dropped,
    /// Due now, and nothing is waiting before it.
    Now,
    /// Due at this time.
    At(Instant),
}

/// A quinn socket over an emulated link layer. See the module documentation.
pub struct LabSocket {
    local: SocketAddr,
    transport: Transport,
    network: Arc<Network>,
    egress: Mutex<Egress>,
    scheduled: mpsc::UnboundedSender<Scheduled>,
    inbound: Mutex<mpsc::Receiver<(Bytes, SocketAddr)>>,
    stats: Arc<SocketStats>,
}

impl fmt::Debug for LabSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LabSocket")
            .field("local", &self.local)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl LabSocket {
    /// Binds a simulated socket on the current turmoil host, whose address is `host`. Must run
    /// inside a turmoil host.
    pub async fn bind_simulated(
        host: IpAddr,
        port: u16,
        network: Arc<Network>,
        seed: u64,
    ) -> io::Result<Arc<Self>> {
        let socket = turmoil::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).await?;
        let local = SocketAddr::new(host, socket.local_addr()?.port());
        Ok(Self::start(
            local,
            Transport::Simulated(Arc::new(socket)),
            network,
            seed,
        ))
    }

    /// Binds a real UDP socket at `address`; the adapter adds each link's delay, jitter and loss
    /// on receive, and its rate and queue on send unless the network's carrier does.
    pub async fn bind_real(
        address: SocketAddr,
        network: Arc<Network>,
        seed: u64,
    ) -> io::Result<Arc<Self>> {
        let socket = RealUdp::bind(address)?;
        let local = socket.io.local_addr()?;
        Ok(Self::start(
            local,
            Transport::Real(Arc::new(socket)),
            network,
            seed,
        ))
    }

    fn start(
        local: SocketAddr,
        transport: Transport,
        network: Arc<Network>,
        seed: u64,
    ) -> Arc<Self> {
        let (scheduled, queue) = mpsc::unbounded_channel();
        let (inbound_tx, inbound) = mpsc::channel(RECEIVE_QUEUE);
        let stats = Arc::new(SocketStats::default());
        let waiting = Arc::new(AtomicU64::new(0));
        // The emulated network's memory is the lab's, not the node's: a tracked context (the
        // fan-out scenario's sender heap) never counts it.
        tokio::spawn(Untracked::new(egress_loop(
            transport.clone(),
            queue,
            waiting.clone(),
            stats.clone(),
        )));
        match &transport {
            Transport::Simulated(socket) => {
                tokio::spawn(Untracked::new(simulated_ingress(
                    socket.clone(),
                    inbound_tx,
                    stats.clone(),
                )));
            }
            Transport::Real(socket) => {
                // The receiver's own stream of loss and jitter draws.
                let rng = SmallRng::seed_from_u64(!seed);
                tokio::spawn(Untracked::new(real_ingress(
                    socket.clone(),
                    local,
                    network.clone(),
                    rng,
                    inbound_tx,
                    stats.clone(),
                )));
            }
        }
        Arc::new(Self {
            local,
            transport,
            network,
            egress: Mutex::new(Egress {
                rng: SmallRng::seed_from_u64(seed),
                uplink: Pacer::default(),
                links: HashMap::new(),
                arrivals: HashMap::new(),
                sequence: 0,
                waiting,
            }),
            scheduled,
            inbound: Mutex::new(inbound),
            stats,
        })
    }

    /// This socket's counters.
    pub fn stats(&self) -> Arc<SocketStats> {
        self.stats.clone()
    }

    /// Sends one datagram through the emulated link (used by calibration to send raw datagrams).
    pub fn send_datagram(&self, to: SocketAddr, payload: &[u8], ecn: Option<EcnCodepoint>) {
        untracked(|| self.send_segments(to, payload, payload.len().max(1), ecn));
    }

    /// Sends `contents` as datagrams of `segment` bytes (the last may be shorter).
    fn send_segments(
        &self,
        to: SocketAddr,
        contents: &[u8],
        segment: usize,
        ecn: Option<EcnCodepoint>,
    ) {
        let head = [ecn.map_or(0, |ecn| ecn as u8)];
        let mut real = match &self.transport {
            Transport::Real(socket) => Some(RealSender::new(socket, &self.stats)),
            Transport::Simulated(_) => None,
        };
        let segments: Box<dyn Iterator<Item = &[u8]>> = if contents.is_empty() {
            Box::new(std::iter::once(contents))
        } else {
            Box::new(contents.chunks(segment))
        };
        for payload in segments {
            match self.emulate_send(to, payload) {
                Verdict::Dropped => {}
                Verdict::Now => match (&mut real, &self.transport) {
                    (Some(sender), _) => sender.push(to, &head, payload),
                    (None, Transport::Simulated(socket)) => {
                        self.stats.sent.fetch_add(1, Ordering::Relaxed);
                        let bytes = wire(&head, payload);
                        if let Err(error) = socket.try_send_to(&bytes, to) {
                            tracing::trace!(%error, "emulated send failed");
                        }
                    }
                    (None, Transport::Real(_)) => {}
                },
                Verdict::At(at) => {
                    // What was gathered for now leaves before anything scheduled later.
                    if let Some(sender) = &mut real {
                        sender.flush();
                    }
                    self.schedule(at, to, wire(&head, payload));
                }
            }
        }
    }

    /// Applies the sender's part of the link to one datagram: partition, uplink and link queues,
    /// loss (over turmoil), the receiver's downlink, latency and jitter (over turmoil).
    fn emulate_send(&self, to: SocketAddr, payload: &[u8]) -> Verdict {
        let now = Instant::now();
        let route = self.network.route(self.local.ip(), to.ip());
        if route.blocked {
            self.stats.blocked.fetch_add(1, Ordering::Relaxed);
            return Verdict::Dropped;
        }
        let spec = route.spec;
        let path_on_send = !self.network.receiver_emulates_path();
        let mut egress = lock(&self.egress);
        let len = payload.len();
        let after_uplink = match route.uplink {
            Some(uplink) => match egress.uplink.admit(now, len, &uplink) {
                Ok(done) => done,
                Err(_) => {
                    self.stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    return Verdict::Dropped;
                }
            },
            None => now,
        };
        let departs = if self.network.socket_paces(&spec) {
            match egress
                .links
                .entry(to.ip())
                .or_default()
                .admit(after_uplink, len, &spec)
            {
                Ok(done) => done,
                Err(_) => {
                    self.stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    return Verdict::Dropped;
                }
            }
        } else {
            after_uplink
        };
        // Lost after it took its place on the link, as on a wire: loss costs the link's rate.
        if path_on_send && spec.loss > 0.0 && egress.rng.random::<f64>() < spec.loss {
            self.stats.lost.fetch_add(1, Ordering::Relaxed);
            return Verdict::Dropped;
        }
        // The receiver's shared downlink, after the sender's link and before propagation.
        let Some(departs) = self.network.through_downlink(to.ip(), now, departs, len) else {
            self.stats.downlink_drops.fetch_add(1, Ordering::Relaxed);
            return Verdict::Dropped;
        };
        let at = if path_on_send {
            let extra = spec.latency.saturating_sub(route.transport_latency);
            let jitter = if spec.jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(egress.rng.random_range(0..=spec.jitter.as_nanos() as u64))
            };
            in_link_order(&mut egress.arrivals, to.ip(), departs + extra + jitter)
        } else {
            departs
        };
        self.stats
            .sent_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        let horizon = if path_on_send { now } else { now + HALF_TICK };
        if at <= horizon && egress.waiting.load(Ordering::Relaxed) == 0 {
            return Verdict::Now;
        }
        Verdict::At(at)
    }

    fn schedule(&self, at: Instant, to: SocketAddr, bytes: Bytes) {
        let mut egress = lock(&self.egress);
        egress.sequence += 1;
        egress.waiting.fetch_add(1, Ordering::Relaxed);
        let item = Scheduled {
            at,
            sequence: egress.sequence,
            to,
            bytes,
        };
        if self.scheduled.send(item).is_err() {
            egress.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Receives one raw datagram (calibration only; a socket given to quinn is read by quinn).
    pub async fn recv_datagram(&self) -> Option<(Bytes, SocketAddr)> {
        std::future::poll_fn(|cx| lock(&self.inbound).poll_recv(cx)).await
    }
}

/// A datagram as it travels: the ECN byte, then the payload.
fn wire(head: &[u8], payload: &[u8]) -> Bytes {
    let mut bytes = BytesMut::with_capacity(head.len() + payload.len());
    bytes.put_slice(head);
    bytes.put_slice(payload);
    bytes.freeze()
}

/// Sends scheduled datagrams in departure order: each timer wake-up releases every datagram whose
/// time has passed.
async fn egress_loop(
    transport: Transport,
    queue: mpsc::UnboundedReceiver<Scheduled>,
    waiting: Arc<AtomicU64>,
    stats: Arc<SocketStats>,
) {
    match transport {
        Transport::Simulated(socket) => simulated_egress(socket, queue, waiting, stats).await,
        Transport::Real(socket) => real_egress(socket, queue, waiting, stats).await,
    }
}

async fn simulated_egress(
    socket: Arc<turmoil::net::UdpSocket>,
    mut queue: mpsc::UnboundedReceiver<Scheduled>,
    waiting: Arc<AtomicU64>,
    stats: Arc<SocketStats>,
) {
    let mut heap: BinaryHeap<Reverse<Scheduled>> = BinaryHeap::new();
    loop {
        let next = heap.peek().map(|Reverse(item)| item.at);
        tokio::select! {
            item = queue.recv() => match item {
                Some(item) => heap.push(Reverse(item)),
                None => return,
            },
            () = async { tokio::time::sleep_until(next.unwrap_or_else(Instant::now)).await }, if next.is_some() => {
                let now = Instant::now();
                while heap.peek().is_some_and(|Reverse(item)| item.at <= now) {
                    let Some(Reverse(item)) = heap.pop() else { break };
                    stats.sent.fetch_add(1, Ordering::Relaxed);
                    if let Err(error) = socket.try_send_to(&item.bytes, item.to) {
                        tracing::trace!(%error, "emulated send failed");
                    }
                    waiting.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

async fn simulated_ingress(
    socket: Arc<turmoil::net::UdpSocket>,
    inbound: mpsc::Sender<(Bytes, SocketAddr)>,
    stats: Arc<SocketStats>,
) {
    let mut buffer = vec![0u8; 65_536];
    loop {
        let (len, from) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "emulated socket closed");
                return;
            }
        };
        if len == 0 {
            continue;
        }
        if !deliver(
            &inbound,
            &stats,
            Bytes::copy_from_slice(&buffer[..len]),
            from,
        ) {
            return;
        }
    }
}

/// Hands one datagram to quinn's side; false once nobody reads any more.
fn deliver(
    inbound: &mpsc::Sender<(Bytes, SocketAddr)>,
    stats: &SocketStats,
    bytes: Bytes,
    from: SocketAddr,
) -> bool {
    match inbound.try_send((bytes, from)) {
        Ok(()) => {
            stats.received.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(mpsc::error::TrySendError::Full(_)) => {
            stats.receive_drops.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl quinn::UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The emulated queues drop instead of blocking, like a UDP socket.
        Poll::Ready(Ok(()))
    }
}

impl quinn::AsyncUdpSocket for LabSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let segment = match transmit.segment_size {
            Some(size) if size > 0 => size,
            _ => transmit.contents.len().max(1),
        };
        untracked(|| {
            self.send_segments(
                transmit.destination,
                transmit.contents,
                segment,
                transmit.ecn,
            )
        });
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        buffers: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        untracked(|| self.emulate_recv(cx, buffers, meta))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn max_transmit_segments(&self) -> usize {
        // Over turmoil one datagram per transmit; real sockets send quinn's trains with GSO.
        match &self.transport {
            Transport::Simulated(_) => 1,
            Transport::Real(socket) => socket.max_segments(),
        }
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

impl LabSocket {
    fn emulate_recv(
        &self,
        cx: &mut Context<'_>,
        buffers: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut inbound = lock(&self.inbound);
        let mut filled = 0;
        while filled < buffers.len().min(meta.len()) {
            let next = if filled == 0 {
                match inbound.poll_recv(cx) {
                    Poll::Ready(Some(next)) => next,
                    Poll::Ready(None) => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            "emulated socket closed",
                        )))
                    }
                    Poll::Pending => return Poll::Pending,
                }
            } else {
                match inbound.try_recv() {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            let (bytes, from) = next;
            let payload = &bytes[1..];
            let len = payload.len().min(buffers[filled].len());
            buffers[filled][..len].copy_from_slice(&payload[..len]);
            meta[filled] = RecvMeta {
                addr: from,
                len,
                stride: len,
                ecn: EcnCodepoint::from_bits(bytes[0]),
                dst_ip: Some(self.local.ip()),
            };
            filled += 1;
        }
        Poll::Ready(Ok(filled))
    }
}
