//! Give quinn a UDP socket whose egress is paced, queued and lossy like a WAN link.
//!
//! # Design
//!
//! [`LabSocket`] implements [`quinn::AsyncUdpSocket`] over one of two transports: turmoil's
//! simulated UDP (virtual time; turmoil adds propagation delay, partitions and crashes) or a real
//! tokio UDP socket (real time; the adapter adds the delay itself). On every transmit it:
//!
//! 1. passes the datagram through the host's optional uplink [`Pacer`] and then the directed
//!    link's pacer (serialization at the link rate, bounded drop-tail queue),
//! 2. draws i.i.d. loss from the scenario's seeded RNG: a lost datagram has still taken its
//!    place on the link (a link of rate r and loss p delivers r·(1 − p), as NKN's emulator and the
//!    lab's physical floors have it),
//! 3. adds the part of the propagation delay the transport does not add, plus jitter,
//! 4. sends it at once if it is due and nothing is waiting, else hands it to the egress task,
//!    which sends datagrams in departure order.
//!
//! Each datagram carries one extra leading byte holding its ECN codepoint, so ECN marks set by
//! quinn arrive at the peer as they were sent (nothing marks congestion: there is no AQM). Link
//! rates count the UDP payload quinn sends, without that byte. One segment per transmit (no GSO),
//! and the MTU is whatever the node pins. Inbound datagrams are read by a task into a bounded
//! channel; when quinn does not keep up, the overflow is dropped and counted, like a socket buffer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
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
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::link::{LinkSpec, Pacer};

/// Datagrams a socket buffers on receive before dropping (well above any in-flight window here).
const RECEIVE_QUEUE: usize = 1 << 16;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The emulated network's link table: a spec per directed link, a default, optional host uplinks.
/// Shared by every socket and changeable while a scenario runs.
#[derive(Debug)]
pub struct Network {
    table: Mutex<Table>,
    transport_adds_latency: bool,
}

#[derive(Debug, Clone)]
struct Table {
    default: LinkSpec,
    links: HashMap<(IpAddr, IpAddr), LinkSpec>,
    uplinks: HashMap<IpAddr, LinkSpec>,
    blocked: std::collections::HashSet<(IpAddr, IpAddr)>,
}

impl Network {
    /// A network whose links all follow `default` until set otherwise. `transport_adds_latency`
    /// is true under turmoil, which delays each datagram by the pair's symmetric latency itself.
    pub fn new(default: LinkSpec, transport_adds_latency: bool) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table {
                default,
                links: HashMap::new(),
                uplinks: HashMap::new(),
                blocked: std::collections::HashSet::new(),
            }),
            transport_adds_latency,
        })
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

    fn is_blocked(&self, from: IpAddr, to: IpAddr) -> bool {
        lock(&self.table).blocked.contains(&(from, to))
    }

    /// Sets a shared uplink that every datagram from `host` passes before its link.
    pub fn set_uplink(&self, host: IpAddr, spec: LinkSpec) {
        lock(&self.table).uplinks.insert(host, spec);
    }

    /// The spec of the directed link `from -> to`.
    pub fn link(&self, from: IpAddr, to: IpAddr) -> LinkSpec {
        let table = lock(&self.table);
        table
            .links
            .get(&(from, to))
            .copied()
            .unwrap_or(table.default)
    }

    fn uplink(&self, host: IpAddr) -> Option<LinkSpec> {
        lock(&self.table).uplinks.get(&host).copied()
    }

    /// The delay the transport itself adds between `a` and `b` (the same both ways): the smaller
    /// of the two directions' latencies under turmoil, zero on real sockets.
    pub fn transport_latency(&self, a: IpAddr, b: IpAddr) -> Duration {
        if !self.transport_adds_latency {
            return Duration::ZERO;
        }
        self.link(a, b).latency.min(self.link(b, a).latency)
    }
}

/// Counters of one socket's emulated egress and ingress.
#[derive(Debug, Default)]
pub struct SocketStats {
    /// Datagrams handed to the transport.
    pub sent: AtomicU64,
    /// Bytes handed to the transport (quinn's payload, without the ECN byte).
    pub sent_bytes: AtomicU64,
    /// Datagrams dropped by emulated loss.
    pub lost: AtomicU64,
    /// Datagrams dropped because a queue was full.
    pub queue_drops: AtomicU64,
    /// Datagrams dropped because the link was cut (real-time partitions).
    pub blocked: AtomicU64,
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
    Real(Arc<tokio::net::UdpSocket>),
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Simulated(_) => f.write_str("Simulated"),
            Self::Real(_) => f.write_str("Real"),
        }
    }
}

impl Transport {
    fn try_send_to(&self, bytes: &[u8], to: SocketAddr) -> io::Result<()> {
        match self {
            Self::Simulated(socket) => socket.try_send_to(bytes, to).map(|_| ()),
            Self::Real(socket) => match socket.try_send_to(bytes, to) {
                Ok(_) => Ok(()),
                // A full kernel buffer is a drop on the wire, as on a real link.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(()),
                Err(error) => Err(error),
            },
        }
    }

    async fn recv_from(&self, buffer: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        match self {
            Self::Simulated(socket) => socket.recv_from(buffer).await,
            Self::Real(socket) => socket.recv_from(buffer).await,
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
    sequence: u64,
    waiting: Arc<AtomicU64>,
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

    /// Binds a real UDP socket at `address`; the adapter adds all of each link's delay itself.
    pub async fn bind_real(
        address: SocketAddr,
        network: Arc<Network>,
        seed: u64,
    ) -> io::Result<Arc<Self>> {
        let socket = tokio::net::UdpSocket::bind(address).await?;
        let local = socket.local_addr()?;
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
        tokio::spawn(Untracked::new(ingress_loop(
            transport.clone(),
            inbound_tx,
            stats.clone(),
        )));
        Arc::new(Self {
            local,
            transport,
            network,
            egress: Mutex::new(Egress {
                rng: SmallRng::seed_from_u64(seed),
                uplink: Pacer::default(),
                links: HashMap::new(),
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
        untracked(|| self.emulate_send(to, payload, ecn));
    }

    fn emulate_send(&self, to: SocketAddr, payload: &[u8], ecn: Option<EcnCodepoint>) {
        let now = Instant::now();
        let spec = self.network.link(self.local.ip(), to.ip());
        let uplink = self.network.uplink(self.local.ip());
        if self.network.is_blocked(self.local.ip(), to.ip()) {
            self.stats.blocked.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut egress = lock(&self.egress);
        let len = payload.len();
        let after_uplink = match uplink {
            Some(uplink) => match egress.uplink.admit(now, len, &uplink) {
                Ok(done) => done,
                Err(_) => {
                    self.stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
            None => now,
        };
        let departs = match egress
            .links
            .entry(to.ip())
            .or_default()
            .admit(after_uplink, len, &spec)
        {
            Ok(done) => done,
            Err(_) => {
                self.stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // Lost after it took its place on the link, as on a wire: loss costs the link's rate.
        if spec.loss > 0.0 && egress.rng.random::<f64>() < spec.loss {
            self.stats.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let extra = spec
            .latency
            .saturating_sub(self.network.transport_latency(self.local.ip(), to.ip()));
        let jitter = if spec.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(egress.rng.random_range(0..=spec.jitter.as_nanos() as u64))
        };
        let at = departs + extra + jitter;
        let mut bytes = BytesMut::with_capacity(len + 1);
        bytes.put_u8(ecn.map_or(0, |ecn| ecn as u8));
        bytes.put_slice(payload);
        self.stats
            .sent_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        if at <= now && egress.waiting.load(Ordering::Relaxed) == 0 {
            drop(egress);
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = self.transport.try_send_to(&bytes, to) {
                tracing::trace!(%error, "emulated send failed");
            }
            return;
        }
        egress.sequence += 1;
        egress.waiting.fetch_add(1, Ordering::Relaxed);
        let item = Scheduled {
            at,
            sequence: egress.sequence,
            to,
            bytes: bytes.freeze(),
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

async fn egress_loop(
    transport: Transport,
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
                    if let Err(error) = transport.try_send_to(&item.bytes, item.to) {
                        tracing::trace!(%error, "emulated send failed");
                    }
                    waiting.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

async fn ingress_loop(
    transport: Transport,
    inbound: mpsc::Sender<(Bytes, SocketAddr)>,
    stats: Arc<SocketStats>,
) {
    let mut buffer = vec![0u8; 65_536];
    loop {
        let (len, from) = match transport.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "emulated socket closed");
                return;
            }
        };
        if len == 0 {
            continue;
        }
        match inbound.try_send((Bytes::copy_from_slice(&buffer[..len]), from)) {
            Ok(()) => {
                stats.received.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                stats.receive_drops.fetch_add(1, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
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
        match transmit.segment_size {
            Some(size) if size < transmit.contents.len() => {
                for segment in transmit.contents.chunks(size) {
                    self.send_datagram(transmit.destination, segment, transmit.ecn);
                }
            }
            _ => self.send_datagram(transmit.destination, transmit.contents, transmit.ecn),
        }
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
