//! Serialize lab TCP connections at their link's rate, as [`crate::socket`] does for UDP.
//!
//! # Design
//!
//! turmoil's TCP (what the gRPC baselines run on) delivers every write one link latency after it
//! was made, whatever its size: it has latency but no bandwidth. [`PacedTcp`] adds the missing
//! serialization on the receive side. Bytes the inner stream hands over at `t` (one latency after
//! they were written) are cut into segments of at most [`MSS`] bytes and queued on the directed
//! link's [`Serializer`]; a segment becomes readable once it is serialized, at
//! `max(t, when the link finished the previous segment) + segment / rate`. On a link whose latency
//! is constant this is the same instant as serializing at the sender before propagation, so the
//! last byte of `n` bytes written at `w` is through the link at `w + latency + n / rate` at the
//! earliest (read in that instant's tick, below); and it needs no task of its own: the reader (hyper's connection task, which always reads) waits on a
//! timer for the next segment. [`TcpLinks`] keeps one serializer per direction of each host pair,
//! shared by every connection in that direction, with the rate the lab's [`Network`] gives that
//! directed link when the direction is first used.
//!
//! The lab's clock moves in ticks ([`crate::lab::TICK`], 1 ms), so a segment becomes readable in
//! the tick its serialization ends in: at the start of that tick, up to one tick before the exact
//! instant, never earlier. This is how the emulated UDP links come out too (a small datagram on a
//! 1 Gbit/s, 45 ms link arrives 45 ms after it is sent, not 46), so neither transport pays a
//! whole tick for a few microseconds of serialization; readers see at most one tick's worth of
//! bytes (`rate × tick`) ahead of the exact schedule, and serialization that ends on a tick
//! boundary is exact.
//!
//! Segments and headers. A segment carries at most [`MSS`] stream bytes (for gRPC, HTTP/2 frames
//! with their headers): 1448, Linux's on a 1500-byte MTU with TCP timestamps on (its default),
//! 1500 − 20 (IPv4) − 20 (TCP) − 12 (timestamps option). The UDP links charge a datagram its UDP
//! payload, the IP packet less 28 bytes (IPv4 and UDP headers), QUIC's own header included; a
//! segment is charged the same way, its IP packet less 28 bytes: its stream bytes plus
//! [`SEGMENT_HEADER_BYTES`] (24: TCP's 20-byte header and 12 bytes of timestamps, less UDP's 8).
//! So a full segment and a full lab datagram (1472 bytes) are both one 1500-byte IP packet and
//! take the same link time, and a packet rate counts one packet per segment, as it counts one per
//! datagram. Before, a segment carried 1500 stream bytes, more than a 1500-byte packet can, and
//! paid nothing for its headers, which gave the gRPC baselines about 3.5% more payload per second
//! than a real TCP sender gets on the same link (meshwire pays QUIC's header inside the datagram).
//! An unlimited rate and no jitter passes reads straight through.
//!
//! Jitter as the UDP links have it ([`crate::link::LinkSpec::jitter`]): each segment, once
//! serialized, waits a further delay drawn uniformly from `[0, jitter]` (seeded per directed link)
//! and never overtakes a segment before it on that link, so a jittered path delays gRPC's bytes as
//! it delays meshwire's datagrams (before, the ring sweep's gRPC baselines crossed jittered links
//! without it and came out below the floor). The sender's acknowledgements draw the reverse
//! link's jitter in [`TcpFlow`] (turmoil's TCP has no acknowledgements of its own to delay).
//!
//! TCP's sender rules, which turmoil's TCP lacks too: [`TcpLinks::wrap`] gives each connection's
//! direction a [`TcpFlow`] ([`flow`], its `# Design`): Linux's default window, slow start,
//! CUBIC, the link's loss (each lost segment received a round trip late, the bytes after it
//! waiting for it) and the restart after idle. Each segment leaves when the flow lets it, then
//! goes through the link's serializer as above, whose drop-tail queue holds the link's
//! `queue_bytes` (the UDP links' size): a segment that finds it full is lost as a random loss
//! is. Not modelled, in TCP's favour: HyStart, delayed acknowledgements and ACK clocking.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::link::Rate;
use crate::socket::Network;

mod flow;

pub use flow::TcpFlow;

/// The most stream bytes one segment carries: Linux's MSS on a 1500-byte MTU with timestamps
/// (1500 − 20 IPv4 − 20 TCP − 12 timestamps option).
pub const MSS: usize = 1448;
/// What a segment is charged on a link beyond its stream bytes: TCP's 20-byte header and its
/// 12-byte timestamps option, less the 8 bytes of UDP header the UDP links do not charge either
/// (they charge UDP payload). A full segment is charged `MSS + 24 = 1472` bytes, a full lab
/// datagram's payload: both are one 1500-byte IP packet.
pub const SEGMENT_HEADER_BYTES: usize = 24;

/// Bytes read from the inner stream at a time.
const READ_CHUNK: usize = 64 * 1024;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a segment of `len` stream bytes is charged on a byte-rate link: its bytes and its
/// headers beyond a UDP datagram's ([`SEGMENT_HEADER_BYTES`]).
fn charged_bytes(len: usize) -> usize {
    len + SEGMENT_HEADER_BYTES
}

/// One directed link's serialization schedule: when each segment offered to it is through.
/// Nothing here reads a clock: [`Serializer::admit`] takes the arrival time.
#[derive(Debug, Clone)]
pub struct Serializer {
    /// The link's rate.
    rate: Rate,
    /// When the link finishes the last segment admitted so far.
    busy_until: Option<Instant>,
    /// The most extra delay a segment draws after its serialization.
    jitter: Duration,
    /// The jitter draws.
    rng: SmallRng,
    /// When the last segment admitted so far arrives (no segment arrives before it).
    last_arrival: Option<Instant>,
    /// The most bytes waiting to be serialized; `None`: unbounded.
    queue_bytes: Option<usize>,
}

impl Serializer {
    /// A serializer at `rate` (a packet rate counts one packet per segment).
    pub fn new(rate: Rate) -> Self {
        Self {
            rate,
            busy_until: None,
            jitter: Duration::ZERO,
            rng: SmallRng::seed_from_u64(0),
            last_arrival: None,
            queue_bytes: None,
        }
    }

    /// This serializer with each segment delayed by up to `jitter` after its serialization, drawn
    /// from `seed`, in link order.
    pub fn with_jitter(mut self, jitter: Duration, seed: u64) -> Self {
        self.jitter = jitter;
        self.rng = SmallRng::seed_from_u64(seed);
        self
    }

    /// This serializer with a drop-tail queue of `queue_bytes` for [`Self::offer_segment`].
    pub fn with_queue(mut self, queue_bytes: usize) -> Self {
        self.queue_bytes = Some(queue_bytes);
        self
    }

    /// Whether the link has no rate limit and no jitter (then nothing needs holding back).
    pub fn is_unlimited(&self) -> bool {
        matches!(self.rate, Rate::Unlimited) && self.jitter.is_zero()
    }

    /// Time to serialize a segment of `len` stream bytes (charged [`charged_bytes`]), rounded up
    /// to the nanosecond so bytes never go faster than the rate; one packet's time on a packet
    /// rate.
    fn service_time(&self, len: usize) -> Duration {
        let nanos = match self.rate {
            Rate::Unlimited => 0,
            Rate::PacketsPerSec(packets) => 1_000_000_000u128.div_ceil(u128::from(packets.max(1))),
            Rate::BitsPerSec(bits) => {
                (charged_bytes(len) as u128 * 8 * 1_000_000_000).div_ceil(u128::from(bits.max(1)))
            }
        };
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Offers `len` bytes arriving at `now`: cuts them into segments of at most [`MSS`] and appends each segment's length and the instant it is through (its
    /// serialization, then its jitter, in link order) to `segments`, behind everything admitted
    /// before.
    pub fn admit(&mut self, now: Instant, len: usize, segments: &mut VecDeque<(Instant, usize)>) {
        let mut left = len;
        while left > 0 {
            let piece = left.min(MSS);
            segments.push_back((self.admit_segment(now, piece), piece));
            left -= piece;
        }
    }

    /// Offers one segment of `len` bytes arriving at `now` to the drop-tail queue: `Ok` with when
    /// it is through ([`Self::admit_segment`]), or, when the bytes still waiting to be serialized
    /// leave no room for it, `Err` with when it would have been through, and the link unchanged.
    pub fn offer_segment(&mut self, now: Instant, len: usize) -> Result<Instant, Instant> {
        // The queue holds bytes: a packet rate counts 1500 of them per packet here.
        if let (Some(queue_bytes), Some(bits), Some(busy)) =
            (self.queue_bytes, self.rate.bit_rate(), self.busy_until)
        {
            let waiting = busy.saturating_duration_since(now);
            let queued = u128::from(bits) * waiting.as_nanos() / 8 / 1_000_000_000;
            if queued + charged_bytes(len) as u128 > queue_bytes as u128 {
                return Err(busy.max(now) + self.service_time(len));
            }
        }
        Ok(self.admit_segment(now, len))
    }

    /// Offers one segment of `len` stream bytes (at most [`MSS`]) arriving at `now`; returns
    /// when it is through: its serialization behind everything admitted before, then its jitter,
    /// in link order.
    pub fn admit_segment(&mut self, now: Instant, len: usize) -> Instant {
        let start = self.busy_until.map_or(now, |busy| busy.max(now));
        let done = start + self.service_time(len);
        self.busy_until = Some(done);
        let jitter = if self.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.rng.random_range(0..=self.jitter.as_nanos() as u64))
        };
        let arrival = self
            .last_arrival
            .map_or(done + jitter, |last| last.max(done + jitter));
        self.last_arrival = Some(arrival);
        arrival
    }
}

/// One directed link's serializer, shared by every connection in that direction.
pub type Wire = Arc<Mutex<Serializer>>;

/// The serializers of a lab's TCP links: one per direction of each host pair.
#[derive(Debug)]
pub struct TcpLinks {
    network: Arc<Network>,
    tick: Duration,
    seed: u64,
    latency_excess: Duration,
    wires: Mutex<HashMap<(IpAddr, IpAddr), Wire>>,
    /// Connections wrapped so far per direction: each one's loss draws get their own seed.
    flows: Mutex<HashMap<(IpAddr, IpAddr), u64>>,
}

impl TcpLinks {
    /// Serializers following the rates and jitter of `network`'s directed links, on a clock that
    /// moves in steps of `tick` (the lab's [`crate::lab::TICK`]; see the module's design notes),
    /// jitter and losses drawn from `seed`. `latency_excess` is how much longer `network`'s link
    /// latencies are than what turmoil's TCP takes (the gRPC baselines' labs add a tick to them,
    /// `experiments/ring_batches/grpc.rs`): TCP's round trip is taken from them without it.
    pub fn new(
        network: Arc<Network>,
        tick: Duration,
        seed: u64,
        latency_excess: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            network,
            tick,
            seed,
            latency_excess,
            wires: Mutex::default(),
            flows: Mutex::default(),
        })
    }

    /// The serializer of the directed link `from -> to`, made at the link's current rate the
    /// first time the direction is used.
    fn wire(&self, from: IpAddr, to: IpAddr) -> Wire {
        lock(&self.wires)
            .entry((from, to))
            .or_insert_with(|| {
                let spec = self.network.link(from, to);
                let seed = crate::lab::derive_seed(self.seed, &format!("tcp {from}->{to}"), 0);
                Arc::new(Mutex::new(
                    Serializer::new(spec.rate)
                        .with_jitter(spec.jitter, seed)
                        .with_queue(spec.queue_bytes),
                ))
            })
            .clone()
    }

    /// Wraps `stream`, whose bytes come from `peer` to `local`: they become readable as the link
    /// `peer -> local` serializes them.
    /// The connection's sender follows TCP's rules ([`TcpFlow`]) on the path's round trip and
    /// the link's loss rate.
    pub fn wrap<S>(&self, stream: S, peer: IpAddr, local: IpAddr) -> PacedTcp<S> {
        let (forward, back) = (
            self.network.link(peer, local),
            self.network.link(local, peer),
        );
        let index = {
            let mut flows = lock(&self.flows);
            let count = flows.entry((peer, local)).or_default();
            *count += 1;
            *count
        };
        let seed = crate::lab::derive_seed(self.seed, &format!("tcp flow {peer}->{local}"), index);
        let one_way = |latency: Duration| latency.saturating_sub(self.latency_excess);
        let rtt = one_way(forward.latency) + one_way(back.latency);
        let flow = TcpFlow::new(rtt, forward.loss, seed).with_ack_jitter(back.jitter);
        PacedTcp::new(stream, self.wire(peer, local), self.tick).with_flow(flow)
    }

    /// Wraps a turmoil TCP stream by its own addresses.
    pub fn wrap_turmoil(
        &self,
        stream: turmoil::net::TcpStream,
    ) -> io::Result<PacedTcp<turmoil::net::TcpStream>> {
        let (peer, local) = (stream.peer_addr()?.ip(), stream.local_addr()?.ip());
        Ok(self.wrap(stream, peer, local))
    }
}

/// How the inner stream ended, told to the reader once every queued byte is read.
#[derive(Debug)]
enum End {
    Open,
    Eof,
    Failed(io::ErrorKind, String),
}

/// A byte stream whose received bytes are readable only once their link has serialized them;
/// writes pass straight through (the peer's [`PacedTcp`] paces them). See the module's design
/// notes.
pub struct PacedTcp<S> {
    inner: S,
    /// `None`: an unlimited link, reads pass through.
    wire: Option<Wire>,
    /// The clock's step: a segment is readable in the tick its serialization ends in.
    tick: Duration,
    /// Bytes received and not yet read: the serialized ones first, then the queued ones.
    received: BytesMut,
    /// Bytes at the front of `received` that are serialized and may be read.
    readable: usize,
    /// When each queued segment behind them is serialized, and its length.
    segments: VecDeque<(Instant, usize)>,
    /// The sender's TCP rules, `None`: bytes leave as soon as they are written.
    flow: Option<TcpFlow>,
    end: End,
    scratch: Vec<u8>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> fmt::Debug for PacedTcp<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedTcp")
            .field("unlimited", &self.wire.is_none())
            .field("received", &self.received.len())
            .field("readable", &self.readable)
            .field("segments", &self.segments.len())
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<S> PacedTcp<S> {
    /// Wraps `inner`, whose received bytes go through `wire` and become readable in the `tick`
    /// their serialization ends in (`Duration::ZERO`: exactly when it ends).
    pub fn new(inner: S, wire: Wire, tick: Duration) -> Self {
        let unlimited = lock(&wire).is_unlimited();
        Self {
            inner,
            wire: (!unlimited).then_some(wire),
            tick,
            received: BytesMut::new(),
            readable: 0,
            segments: VecDeque::new(),
            flow: None,
            end: End::Open,
            scratch: Vec::new(),
            timer: None,
        }
    }

    /// This stream with its sender following `flow` (windows, slow start, loss), on any link,
    /// an unlimited one too.
    pub fn with_flow(mut self, flow: TcpFlow) -> Self {
        if self.wire.is_none() {
            self.wire = Some(Arc::new(Mutex::new(Serializer::new(Rate::Unlimited))));
        }
        self.flow = Some(flow);
        self
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// When the segment serialized at `done` becomes readable: the start of the tick `done` falls
    /// in, as a reader waking at tick starts sees it.
    fn readable_at(&self, done: Instant) -> Instant {
        match self.tick.checked_sub(Duration::from_nanos(1)) {
            Some(early) => done.checked_sub(early).unwrap_or(done),
            None => done,
        }
    }

    /// Makes every segment readable by `now` readable.
    fn release(&mut self, now: Instant) {
        while let Some(&(done, len)) = self.segments.front() {
            if self.readable_at(done) > now {
                break;
            }
            self.segments.pop_front();
            self.readable += len;
        }
    }
}

impl<S: AsyncRead + Unpin> PacedTcp<S> {
    /// Takes everything the inner stream has now, queuing it on the wire as arrived at `now`.
    fn drain_inner(&mut self, cx: &mut Context<'_>, wire: &Mutex<Serializer>, now: Instant) {
        if self.scratch.is_empty() {
            self.scratch = vec![0; READ_CHUNK];
        }
        while matches!(self.end, End::Open) {
            let mut buf = ReadBuf::new(&mut self.scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Pending => break,
                Poll::Ready(Ok(())) if buf.filled().is_empty() => self.end = End::Eof,
                Poll::Ready(Ok(())) => {
                    let filled = buf.filled();
                    self.received.extend_from_slice(filled);
                    let mut wire = lock(wire);
                    match &mut self.flow {
                        None => wire.admit(now, filled.len(), &mut self.segments),
                        Some(flow) => {
                            for piece in filled.chunks(MSS) {
                                let len = piece.len();
                                let sent = flow.send(now, len);
                                let readable = match wire.offer_segment(sent, len) {
                                    Ok(through) => flow.delivered(len, through, false),
                                    Err(would_be) => flow.delivered(len, would_be, true),
                                };
                                self.segments.push_back((readable, piece.len()));
                            }
                        }
                    }
                }
                Poll::Ready(Err(error)) => {
                    self.end = End::Failed(error.kind(), error.to_string());
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PacedTcp<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(wire) = this.wire.clone() else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // The deadline of a timer that has fired: tokio's clock reads at least that much then.
        let mut fired = None;
        loop {
            let now = fired.map_or_else(Instant::now, |at: Instant| at.max(Instant::now()));
            this.drain_inner(cx, &wire, now);
            this.release(now);
            if this.readable > 0 {
                let len = this.readable.min(buf.remaining());
                buf.put_slice(&this.received[..len]);
                this.received.advance(len);
                this.readable -= len;
                return Poll::Ready(Ok(()));
            }
            let Some(next) = this
                .segments
                .front()
                .map(|&(done, _)| this.readable_at(done))
            else {
                // Nothing queued: the inner stream's end, or wait for it (its waker is set).
                return match &this.end {
                    End::Open => Poll::Pending,
                    End::Eof => Poll::Ready(Ok(())),
                    End::Failed(kind, message) => {
                        Poll::Ready(Err(io::Error::new(*kind, message.clone())))
                    }
                };
            };
            let timer = this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
            if timer.deadline() != next {
                timer.as_mut().reset(next);
            }
            ready!(timer.as_mut().poll(cx));
            fired = Some(next);
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PacedTcp<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::lab::TICK;
    use crate::link::LinkSpec;

    /// 8 Mbit/s: one byte per microsecond.
    const BYTE_PER_MICROSECOND: Rate = Rate::BitsPerSec(8_000_000);

    fn admit_all(serializer: &mut Serializer, now: Instant, len: usize) -> Vec<(Instant, usize)> {
        let mut segments = VecDeque::new();
        serializer.admit(now, len, &mut segments);
        segments.into()
    }

    /// Link time of a segment of `len` stream bytes at one byte per microsecond: its bytes and
    /// its headers.
    fn on_wire(len: usize) -> Duration {
        Duration::from_micros((len + SEGMENT_HEADER_BYTES) as u64)
    }

    #[test]
    fn releases_bytes_no_faster_than_the_rate() {
        let now = Instant::now();
        let mut serializer = Serializer::new(BYTE_PER_MICROSECOND);
        let segments = admit_all(&mut serializer, now, 15_000);
        let mut released = 0;
        for &(done, len) in &segments {
            released += len;
            // By the time a segment is out, the link has had time for every byte so far.
            assert!(
                done - now >= Duration::from_micros(released as u64),
                "{released} B early"
            );
        }
        assert_eq!(released, 15_000);
        // Ten full segments and one of 520 bytes, each with its headers.
        assert_eq!(segments.len(), 11);
        let whole = Duration::from_micros(15_000 + 11 * SEGMENT_HEADER_BYTES as u64);
        assert_eq!(segments.last().unwrap().0 - now, whole);
        // A second write at the same instant queues behind the first.
        let behind = admit_all(&mut serializer, now, 1000);
        assert_eq!(behind, [(now + whole + on_wire(1000), 1000)]);
        // After the link has gone idle, bytes start at their own arrival.
        let later = now + Duration::from_secs(1);
        let fresh = admit_all(&mut serializer, later, 500);
        assert_eq!(fresh, [(later + on_wire(500), 500)]);
    }

    /// A full segment takes as long on a link as a full lab datagram: both are one 1500-byte IP
    /// packet.
    #[test]
    fn a_full_segment_is_charged_as_a_full_datagram() {
        let rate = Rate::BitsPerSec(100_000_000);
        let serializer = Serializer::new(rate);
        assert_eq!(
            serializer.service_time(MSS),
            rate.service_time(usize::from(crate::lab::LAB_MTU))
        );
    }

    #[test]
    fn splits_a_write_larger_than_a_segment() {
        let now = Instant::now();
        let mut serializer = Serializer::new(BYTE_PER_MICROSECOND);
        let segments = admit_all(&mut serializer, now, 2 * MSS + 100);
        let lengths: Vec<usize> = segments.iter().map(|&(_, len)| len).collect();
        assert_eq!(lengths, [MSS, MSS, 100]);
        // The first segment is out before the whole write would be.
        assert_eq!(segments[0].0 - now, on_wire(MSS));
    }

    /// Jitter delays each segment by at most its bound after serialization, keeps link order,
    /// and a jittered link holds reads back even without a rate.
    #[test]
    fn jitter_delays_segments_within_its_bound_in_link_order() {
        let now = Instant::now();
        let jitter = Duration::from_millis(8);
        let mut serializer = Serializer::new(Rate::Unlimited).with_jitter(jitter, 7);
        assert!(!serializer.is_unlimited());
        let segments = admit_all(&mut serializer, now, 200 * MSS);
        assert_eq!(segments.len(), 200);
        assert!(segments
            .iter()
            .all(|&(at, _)| at >= now && at <= now + jitter));
        assert!(segments.windows(2).all(|pair| pair[0].0 <= pair[1].0));
        assert!(segments.iter().any(|&(at, _)| at > now), "some delay drawn");
    }

    #[test]
    fn a_packet_rate_counts_a_segment_per_packet() {
        let now = Instant::now();
        let mut serializer = Serializer::new(Rate::PacketsPerSec(1000));
        let segments = admit_all(&mut serializer, now, 2 * MSS + 100);
        let done: Vec<Duration> = segments.iter().map(|&(at, _)| at - now).collect();
        assert_eq!(
            done,
            [1, 2, 3].map(Duration::from_millis),
            "1000 packets/s, one per segment, short or full"
        );
    }

    /// The drop-tail queue: a segment that finds more waiting than the queue holds is refused
    /// with when it would have been through, and leaves the link as it was; once the link has
    /// drained, segments fit again.
    #[test]
    fn a_full_queue_refuses_a_segment_and_leaves_the_link_unchanged() {
        let now = Instant::now();
        let charged = MSS + SEGMENT_HEADER_BYTES;
        let mut serializer = Serializer::new(BYTE_PER_MICROSECOND).with_queue(3 * charged);
        let through: Vec<Instant> = (0..3)
            .map(|_| serializer.offer_segment(now, MSS).unwrap())
            .collect();
        let third = through[2];
        assert_eq!(third - now, 3 * on_wire(MSS));
        let refused = serializer.offer_segment(now, MSS);
        assert_eq!(refused, Err(third + on_wire(MSS)));
        // One segment's time later one slot is free, and the next one queues behind the third.
        let later = now + on_wire(MSS);
        assert_eq!(
            serializer.offer_segment(later, MSS),
            Ok(third + on_wire(MSS))
        );
    }

    #[test]
    fn an_unlimited_link_passes_reads_through() {
        let now = Instant::now();
        let mut serializer = Serializer::new(Rate::Unlimited);
        assert!(serializer.is_unlimited());
        assert!(admit_all(&mut serializer, now, 10_000)
            .iter()
            .all(|&(done, _)| done == now));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (near, far) = tokio::io::duplex(1 << 20);
            let wire = Arc::new(Mutex::new(serializer));
            let mut near = PacedTcp::new(near, wire, TICK);
            let unlimited = Arc::new(Mutex::new(Serializer::new(Rate::Unlimited)));
            let mut far = PacedTcp::new(far, unlimited, TICK);
            far.write_all(&[7; 100_000]).await.unwrap();
            far.shutdown().await.unwrap();
            let mut got = Vec::new();
            near.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, [7; 100_000]);
        });
    }

    /// A turmoil TCP connection over a 10 ms, 8 Mbit/s link in virtual time: 150 000 bytes
    /// written at once are read no earlier than the tick in which the link has carried them, and
    /// the end of the stream comes when TCP's first window allows: ten segments (14.7 ms of the
    /// link, headers included) go at once, the eleventh when the first one's acknowledgement is
    /// back (the first is through 1.472 ms after it arrived, the round trip is 20 ms), and from
    /// then on the window outgrows the path (14 segments in flight fill it), so the last byte is
    /// through 10 + 1.472 + 20 + 137.8 ms (94 more segments) after the write, read in that tick.
    #[test]
    fn paces_a_turmoil_connection_in_virtual_time() {
        const LEN: usize = 150_000;
        let latency = Duration::from_millis(10);
        let spec = LinkSpec {
            latency,
            rate: BYTE_PER_MICROSECOND,
            ..LinkSpec::default()
        };
        let links = TcpLinks::new(
            Network::new(spec, crate::socket::Carrier::Turmoil),
            TICK,
            1,
            Duration::ZERO,
        );
        let mut sim = turmoil::Builder::new()
            .tick_duration(TICK)
            .min_message_latency(latency)
            .max_message_latency(latency)
            .build();
        let written: Arc<Mutex<Option<Duration>>> = Arc::default();
        let reads: Arc<Mutex<Vec<(Duration, usize)>>> = Arc::default();
        {
            let (links, reads) = (links.clone(), reads.clone());
            sim.host("server", move || {
                let (links, reads) = (links.clone(), reads.clone());
                async move {
                    let listener =
                        turmoil::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 9000)).await?;
                    let (stream, _) = listener.accept().await?;
                    let mut stream = links.wrap_turmoil(stream)?;
                    let (mut total, mut buffer) = (0, vec![0; 4096]);
                    loop {
                        let len = stream.read(&mut buffer).await?;
                        total += len;
                        lock(&reads).push((turmoil::sim_elapsed().unwrap_or_default(), total));
                        if len == 0 {
                            break;
                        }
                        assert!(buffer[..len].iter().all(|&byte| byte == 1));
                    }
                    Ok(())
                }
            });
        }
        {
            let written = written.clone();
            sim.client("client", async move {
                let mut stream = turmoil::net::TcpStream::connect(("server", 9000)).await?;
                *lock(&written) = turmoil::sim_elapsed();
                stream.write_all(&[1; LEN]).await?;
                stream.shutdown().await?;
                // Stay up until the server has read everything.
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(())
            });
        }
        sim.run().unwrap();
        let written = lock(&written).unwrap();
        let reads = lock(&reads).clone();
        let &(eof_at, total) = reads.last().unwrap();
        assert_eq!(total, LEN);
        for &(at, total) in &reads {
            // Readable in the tick the link carries them in: by the end of the read's tick.
            let carried = (at + TICK).saturating_sub(written + latency).as_micros() as usize;
            assert!(total <= carried, "{total} B read {at:?} after {written:?}");
        }
        // Every segment is charged its headers; the last one is short.
        let first_window = 10 * MSS;
        let later_segments = (LEN - first_window).div_ceil(MSS);
        let through = written
            + latency
            + on_wire(MSS)
            + 2 * latency
            + Duration::from_micros(
                (LEN - first_window + later_segments * SEGMENT_HEADER_BYTES) as u64,
            );
        let tick_start = through - Duration::from_micros(through.as_micros() as u64 % 1000);
        assert_eq!(eof_at, tick_start, "the end came at {eof_at:?}");
    }
}
