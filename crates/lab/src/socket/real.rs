//! Real UDP sockets under the lab socket: kernel buffers, GSO trains out, GRO/recvmmsg in, and the
//! receiving side's delay line (real time emulates the path on receive).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The most a real-time stage wakes ahead of the next datagram (see [`Lead`]).
const MAX_LEAD: Duration = Duration::from_millis(2);

/// A real UDP socket driven through quinn-udp (GSO on send, GRO and `recvmmsg` on receive).
pub(super) struct RealUdp {
    pub(super) io: tokio::net::UdpSocket,
    pub(super) state: UdpSocketState,
}

impl RealUdp {
    pub(super) fn bind(address: SocketAddr) -> io::Result<Self> {
        let domain = socket2::Domain::for_address(address);
        let socket =
            socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        socket.set_recv_buffer_size(REAL_SOCKET_BUFFER)?;
        socket.set_send_buffer_size(REAL_SOCKET_BUFFER)?;
        socket.set_nonblocking(true)?;
        socket.bind(&address.into())?;
        tracing::debug!(
            %address,
            receive_buffer = socket.recv_buffer_size()?,
            send_buffer = socket.send_buffer_size()?,
            "real lab socket"
        );
        let io = tokio::net::UdpSocket::from_std(socket.into())?;
        let state = UdpSocketState::new((&io).into())?;
        Ok(Self { io, state })
    }

    /// Datagrams one send may carry.
    pub(super) fn max_segments(&self) -> usize {
        self.state.max_gso_segments().max(1)
    }

    /// Sends `contents` to `to`, as datagrams of `segment_size` if given. Returns whether the
    /// kernel took it (a full send buffer drops it, as a link would).
    fn send(&self, to: SocketAddr, contents: &[u8], segment_size: Option<usize>) -> bool {
        let transmit = Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size,
            src_ip: None,
        };
        // Straight to the kernel, not through tokio's readiness: a socket tokio has not yet seen
        // writable would refuse the first datagrams (an early loss that ends QUIC's slow start).
        match self.state.send((&self.io).into(), &transmit) {
            Ok(()) => true,
            Err(error) => {
                tracing::trace!(%error, "real send refused");
                false
            }
        }
    }
}

/// Datagrams for one destination gathered into one GSO send: equal-sized segments, the last
/// possibly shorter.
pub(super) struct GsoBatch {
    to: Option<SocketAddr>,
    buffer: Vec<u8>,
    segment: usize,
    count: usize,
    closed: bool,
}

impl GsoBatch {
    pub(super) fn new() -> Self {
        Self {
            to: None,
            buffer: Vec::with_capacity(GSO_MAX_BYTES),
            segment: 0,
            count: 0,
            closed: false,
        }
    }

    /// Appends the datagram `head ++ body` if it fits this batch.
    fn try_push(&mut self, to: SocketAddr, head: &[u8], body: &[u8], max: usize) -> bool {
        let len = head.len() + body.len();
        let fits = match self.to {
            None => true,
            Some(current) => {
                current == to
                    && !self.closed
                    && len <= self.segment
                    && self.count < max
                    && self.buffer.len() + len <= GSO_MAX_BYTES
            }
        };
        if !fits {
            return false;
        }
        if self.to.is_none() {
            self.to = Some(to);
            self.segment = len;
        }
        // A shorter datagram can only be the last segment.
        self.closed = len < self.segment;
        self.buffer.extend_from_slice(head);
        self.buffer.extend_from_slice(body);
        self.count += 1;
        true
    }

    /// Sends the batch; returns how many datagrams it held and whether the kernel took them.
    pub(super) fn flush(&mut self, socket: &RealUdp) -> (u64, bool) {
        let Some(to) = self.to.take() else {
            return (0, true);
        };
        let segment_size = (self.count > 1).then_some(self.segment);
        let sent = socket.send(to, &self.buffer, segment_size);
        let count = self.count as u64;
        self.buffer.clear();
        self.count = 0;
        self.closed = false;
        (count, sent)
    }
}

/// Sends datagrams, gathering runs for one destination into GSO sends.
pub(super) struct RealSender<'a> {
    socket: &'a RealUdp,
    stats: &'a SocketStats,
    batch: GsoBatch,
    max: usize,
}

impl<'a> RealSender<'a> {
    pub(super) fn new(socket: &'a RealUdp, stats: &'a SocketStats) -> Self {
        Self {
            socket,
            stats,
            batch: GsoBatch::new(),
            max: socket.max_segments(),
        }
    }

    pub(super) fn push(&mut self, to: SocketAddr, head: &[u8], body: &[u8]) {
        if !self.batch.try_push(to, head, body, self.max) {
            self.flush();
            self.batch.try_push(to, head, body, self.max);
        }
    }

    pub(super) fn flush(&mut self) {
        let (count, sent) = self.batch.flush(self.socket);
        let counter = if sent {
            &self.stats.sent
        } else {
            &self.stats.send_buffer_drops
        };
        counter.fetch_add(count, Ordering::Relaxed);
    }
}

impl Drop for RealSender<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Like [`simulated_egress`], but what one wake-up releases leaves in GSO trains.
pub(super) async fn real_egress(
    socket: Arc<RealUdp>,
    mut queue: mpsc::UnboundedReceiver<Scheduled>,
    waiting: Arc<AtomicU64>,
    stats: Arc<SocketStats>,
) {
    let mut heap: BinaryHeap<Reverse<Scheduled>> = BinaryHeap::new();
    let mut lead = Lead::default();
    loop {
        let next = heap.peek().map(|Reverse(item)| item.at);
        tokio::select! {
            item = queue.recv() => match item {
                Some(item) => {
                    heap.push(Reverse(item));
                    while let Ok(item) = queue.try_recv() {
                        heap.push(Reverse(item));
                    }
                }
                None => return,
            },
            () = lead.sleep_until(next), if next.is_some() => {}
        }
        let mut sender = RealSender::new(&socket, &stats);
        let mut release = lead.release(Instant::now());
        while heap
            .peek()
            .is_some_and(|Reverse(item)| release.is_due(item.at))
        {
            let Some(Reverse(item)) = heap.pop() else {
                break;
            };
            release.count(item.at);
            sender.push(item.to, &[], &item.bytes);
            waiting.fetch_sub(1, Ordering::Relaxed);
        }
        lead.steer(release);
    }
}

/// Reads a real socket in batches and emulates the path: loss, then a delay line holding each
/// datagram for its link's latency plus jitter.
pub(super) async fn real_ingress(
    socket: Arc<RealUdp>,
    local: SocketAddr,
    network: Arc<Network>,
    mut rng: SmallRng,
    inbound: mpsc::Sender<(Bytes, SocketAddr)>,
    stats: Arc<SocketStats>,
) {
    let slots = quinn::udp::BATCH_SIZE;
    let mut buffer = vec![0u8; slots * RECEIVE_SLOT];
    let mut meta = vec![RecvMeta::default(); slots];
    let mut held: BinaryHeap<Reverse<Scheduled>> = BinaryHeap::new();
    let mut sequence = 0u64;
    let mut arrivals: HashMap<IpAddr, Instant> = HashMap::new();
    let mut lead = Lead::default();
    loop {
        let next = held.peek().map(|Reverse(item)| item.at);
        tokio::select! {
            ready = socket.io.readable() => {
                if let Err(error) = ready {
                    tracing::debug!(%error, "real lab socket closed");
                    return;
                }
                // Drain what the kernel holds, a bounded number of batches per wake-up.
                for _ in 0..16 {
                    let mut slices: Vec<IoSliceMut<'_>> =
                        buffer.chunks_mut(RECEIVE_SLOT).map(IoSliceMut::new).collect();
                    let received = socket.io.try_io(Interest::READABLE, || {
                        socket.state.recv((&socket.io).into(), &mut slices, &mut meta)
                    });
                    let count = match received {
                        Ok(count) => count,
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                        Err(error) => {
                            tracing::debug!(%error, "real lab socket receive failed");
                            break;
                        }
                    };
                    let now = Instant::now();
                    for (slot, meta) in meta.iter().take(count).enumerate() {
                        let data = &buffer[slot * RECEIVE_SLOT..slot * RECEIVE_SLOT + meta.len];
                        let spec = network.link(meta.addr.ip(), local.ip());
                        for datagram in data.chunks(meta.stride.max(1)) {
                            if datagram.is_empty() {
                                continue;
                            }
                            if spec.loss > 0.0 && rng.random::<f64>() < spec.loss {
                                stats.lost.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            let jitter = if spec.jitter.is_zero() {
                                Duration::ZERO
                            } else {
                                Duration::from_nanos(
                                    rng.random_range(0..=spec.jitter.as_nanos() as u64),
                                )
                            };
                            let at = in_link_order(
                                &mut arrivals,
                                meta.addr.ip(),
                                now + spec.latency + jitter,
                            );
                            let bytes = Bytes::copy_from_slice(datagram);
                            if at <= now + HALF_TICK && held.is_empty() {
                                if !deliver(&inbound, &stats, bytes, meta.addr) {
                                    return;
                                }
                                continue;
                            }
                            sequence += 1;
                            held.push(Reverse(Scheduled {
                                at,
                                sequence,
                                to: meta.addr,
                                bytes,
                            }));
                        }
                    }
                }
            }
            () = lead.sleep_until(next), if next.is_some() => {}
        }
        let mut release = lead.release(Instant::now());
        while held
            .peek()
            .is_some_and(|Reverse(item)| release.is_due(item.at))
        {
            let Some(Reverse(item)) = held.pop() else {
                break;
            };
            release.count(item.at);
            if !deliver(&inbound, &stats, item.bytes, item.to) {
                return;
            }
        }
        lead.steer(release);
    }
}

/// When a real-time stage (the sender's queue, the receiver's delay line) wakes, and what it
/// releases. tokio's timers fire on millisecond ticks, at a phase set by when the runtime last
/// parked, so a datagram released at the first wake-up after its time came out late by 0.85 ms on
/// average per stage (round trips 1.7 ms long). A stage therefore wakes `lead` before its next
/// datagram is due, releases everything due within `lead`, and steers `lead` by the mean error
/// of what it released, so datagrams leave on time on average (each within about a millisecond).
#[derive(Debug, Clone, Copy)]
struct Lead {
    nanos: i64,
}

impl Default for Lead {
    fn default() -> Self {
        Self {
            nanos: Duration::from_millis(1).as_nanos() as i64,
        }
    }
}

/// One wake-up's release: its time and the error of what it let go.
struct Release {
    now: Instant,
    horizon: Instant,
    error_nanos: i64,
    count: i64,
}

impl Release {
    fn is_due(&self, at: Instant) -> bool {
        at <= self.horizon
    }

    fn count(&mut self, at: Instant) {
        let error = if self.now >= at {
            (self.now - at).as_nanos() as i64
        } else {
            -((at - self.now).as_nanos() as i64)
        };
        self.error_nanos += error;
        self.count += 1;
    }
}

impl Lead {
    fn lead(&self) -> Duration {
        Duration::from_nanos(self.nanos.max(0) as u64)
    }

    /// Sleeps until `lead` before `at`; forever without one.
    async fn sleep_until(&self, at: Option<Instant>) {
        match at {
            Some(at) => tokio::time::sleep_until(at.checked_sub(self.lead()).unwrap_or(at)).await,
            None => std::future::pending().await,
        }
    }

    fn release(&self, now: Instant) -> Release {
        Release {
            now,
            horizon: now + self.lead(),
            error_nanos: 0,
            count: 0,
        }
    }

    /// Wakes earlier when what was released was late on average, later when it was early.
    fn steer(&mut self, release: Release) {
        if release.count > 0 {
            let mean = release.error_nanos / release.count;
            self.nanos = (self.nanos + mean / 4).clamp(0, MAX_LEAD.as_nanos() as i64);
        }
    }
}
