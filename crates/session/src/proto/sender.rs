//! Segment the stream, schedule segments over paths, detect loss, retransmit, run the window policy.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::codec::{AckPacket, DataPacket, Packet};
use super::rtt::RttEstimator;
use super::{PathId, Policy, SessionConfig, SessionError, Transmit};

/// A packet is lost once this many packets sent after it on the same path were acknowledged.
const PACKET_THRESHOLD: u64 = 3;
/// meshwire's window is this many bandwidth-delay products: one in flight, a quarter of headroom
/// (enough to keep the bottleneck busy and its ACK spacing measurable, little enough that the
/// queue it builds does not stretch the reordering span on long paths).
const WINDOW_GAIN: f64 = 1.25;
/// meshwire leaves startup when an RTT sample exceeds the minimum by this factor (a queue).
const STARTUP_EXIT_RTT: f64 = 1.25;
/// Smallest meshwire window, in packets.
const MIN_WINDOW_PACKETS: f64 = 4.0;
/// ACK arrivals over which one delivery-rate sample is taken.
const RATE_SPAN_ACKS: usize = 16;
/// Fewest ACK intervals that make a rate sample.
const RATE_MIN_ACKS: usize = 8;
/// How long a delivery-rate sample counts in the windowed maximum.
const RATE_WINDOW: Duration = Duration::from_secs(2);
/// NCP checks for timed-out packets every 50 ms (`CheckTimeoutInterval`).
const NCP_TIMEOUT_CHECK: Duration = Duration::from_millis(50);
/// NCP's largest retransmission timeout (`MaxRetransmissionTimeout`).
const NCP_MAX_RTO: Duration = Duration::from_secs(10);
/// NCP's smallest connection window (`MinConnectionWindowSize`).
const NCP_MIN_WINDOW: f64 = 1.0;
/// How long an NCP connection whose window is full waits before it looks at the resend queue
/// again (ncp-go `maxWait`, used by `Connection.waitForSendWindow`).
const NCP_MAX_WAIT: Duration = Duration::from_secs(1);
/// Longest RTO after exponential backoff.
const MAX_BACKED_OFF_RTO: Duration = Duration::from_secs(60);
/// Weight of one packet's fate in a path's loss estimate (an average over about 64 packets).
const LOSS_EWMA_WEIGHT: f64 = 1.0 / 64.0;
/// meshwire copies an unacknowledged segment onto an idle path at the end of the data only when
/// the estimated chance that every copy in flight is lost exceeds this.
const MIN_COPY_RISK: f64 = 0.001;
/// Most transmissions of one segment in flight at once (the original and two copies).
const MAX_COPIES: usize = 3;

/// A path's health as the sender sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathState {
    /// Carries data.
    Active,
    /// Timed out: carries only probes until one is answered.
    Probing,
    /// Paused after a send error until the pause ends (NCP baselines).
    Paused,
}

/// What the sender knows about one path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathStats {
    /// Health.
    pub state: PathState,
    /// Current window in packets.
    pub window_packets: f64,
    /// Packets in flight (for NCP, as NCP counts them: timed-out packets stay until acknowledged).
    pub in_flight_packets: u32,
    /// Smoothed RTT.
    pub smoothed_rtt: Option<Duration>,
    /// Retransmission timeout in force (with backoff).
    pub rto: Duration,
    /// meshwire's delivery-rate estimate.
    pub delivery_rate_packets_per_sec: Option<f64>,
    /// Packets acknowledged that this path carried.
    pub delivered_packets: u64,
    /// meshwire's estimate of the fraction of this path's packets lost.
    pub loss_rate: f64,
}

/// Counters of the sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Data packets sent, first transmissions and retransmissions.
    pub packets_sent: u64,
    /// Retransmissions.
    pub retransmissions: u64,
    /// Packets declared lost by ACK evidence.
    pub fast_retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Paths that started probing after a timeout.
    pub path_failures: u64,
    /// Probing paths re-admitted after a probe was answered.
    pub path_readmissions: u64,
    /// meshwire: copies of in-flight segments sent on idle paths once no new data was left.
    pub tail_copies: u64,
}

#[derive(Debug)]
struct Segment {
    data: Bytes,
    fin: bool,
    /// Packet numbers of this segment's transmissions still counted in flight.
    in_flight: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    seq: u64,
    path: PathId,
    sent_at: Instant,
    /// Position among the path's transmissions.
    path_index: u64,
    /// NCP: timed out and queued for resending, but still counted in the window.
    timed_out: bool,
}

#[derive(Debug)]
struct Path {
    state: PathState,
    window_packets: f64,
    in_flight_packets: u32,
    rtt: RttEstimator,
    /// NCP's own timeout, adjusted per ACK.
    ncp_rto: Duration,
    backoff: u32,
    /// meshwire: when the RTO timer started (last progress), while packets are in flight.
    timer_start: Option<Instant>,
    sent_count: u64,
    /// Packet numbers in the order sent; entries no longer in flight are skipped lazily.
    outstanding: VecDeque<u64>,
    largest_acked_index: Option<u64>,
    delivered: u64,
    /// meshwire: the shortest time from sending one of this path's packets to any ACK (on any
    /// path) covering it. Until the path's own RTT is measured, the window uses it: a path
    /// whose ACKs are slow is acknowledged sooner through a faster path's ranges.
    min_ack_delay: Option<Duration>,
    /// meshwire: still growing the window by one packet per packet acknowledged (doubling per
    /// round trip) on top of rate x min RTT, until an RTT sample shows a queue or a loss.
    startup: bool,
    ack_history: VecDeque<(Instant, u64)>,
    /// Windowed maximum of delivery-rate samples, decreasing from front to back.
    rate_filter: VecDeque<(Instant, f64)>,
    /// When the last packet put on the path should finish crossing its bottleneck.
    departure_clock: Option<Instant>,
    /// meshwire: moving average of packet fates on this path (1 lost, 0 acknowledged).
    loss_rate: f64,
    next_probe: Option<Instant>,
    paused_until: Option<Instant>,
    /// The transport takes no datagram on this path before then (a blocking writer).
    blocked_until: Option<Instant>,
    /// NCP: the connection's send loop is parked waiting for window (ncp-go
    /// `Connection.waitForSendWindow`) and looks at the resend queue again only then (its
    /// `maxWait`), unless an ACK frees window first. `None`: at the top of the loop.
    ncp_parked_until: Option<Instant>,
}

impl Path {
    fn new(config: &SessionConfig, window_packets: f64) -> Self {
        Self {
            state: PathState::Active,
            window_packets,
            in_flight_packets: 0,
            rtt: RttEstimator::new(config.initial_rto(), config.min_rto, config.max_rto),
            ncp_rto: config.initial_rto(),
            backoff: 0,
            timer_start: None,
            sent_count: 0,
            outstanding: VecDeque::new(),
            largest_acked_index: None,
            delivered: 0,
            min_ack_delay: None,
            startup: true,
            ack_history: VecDeque::new(),
            rate_filter: VecDeque::new(),
            departure_clock: None,
            loss_rate: 0.0,
            next_probe: None,
            paused_until: None,
            blocked_until: None,
            ncp_parked_until: None,
        }
    }

    fn is_blocked(&self, now: Instant) -> bool {
        self.blocked_until.is_some_and(|until| until > now)
    }

    fn rate(&self) -> Option<f64> {
        self.rate_filter.front().map(|&(_, rate)| rate)
    }

    fn rto(&self) -> Duration {
        self.rtt
            .rto()
            .saturating_mul(1 << self.backoff.min(16))
            .min(MAX_BACKED_OFF_RTO)
    }

    fn one_way(&self) -> Duration {
        self.rtt.min().or(self.rtt.smoothed()).unwrap_or_default() / 2
    }

    /// When a packet put on the path now should arrive, by the rate and departure clock.
    fn expected_arrival(&self, now: Instant) -> Instant {
        let start = self.departure_clock.map_or(now, |clock| clock.max(now));
        let start = self.blocked_until.map_or(start, |until| until.max(start));
        let service = self
            .rate()
            .map_or(Duration::ZERO, |rate| Duration::from_secs_f64(1.0 / rate));
        start + service + self.one_way()
    }

    fn record_rate_sample(&mut self, now: Instant) {
        self.ack_history.push_back((now, self.delivered));
        while self.ack_history.len() > RATE_SPAN_ACKS + 1 {
            self.ack_history.pop_front();
        }
        if self.ack_history.len() <= RATE_MIN_ACKS {
            return;
        }
        let (then, delivered_then) = self.ack_history[0];
        let elapsed = now.saturating_duration_since(then).as_secs_f64();
        if elapsed <= 0.0 {
            return;
        }
        let sample = (self.delivered - delivered_then) as f64 / elapsed;
        while self
            .rate_filter
            .back()
            .is_some_and(|&(_, rate)| rate <= sample)
        {
            self.rate_filter.pop_back();
        }
        self.rate_filter.push_back((now, sample));
        while self
            .rate_filter
            .front()
            .is_some_and(|&(at, _)| now.saturating_duration_since(at) > RATE_WINDOW)
        {
            self.rate_filter.pop_front();
        }
    }
}

/// The sending half of a session.
#[derive(Debug)]
pub struct Sender {
    config: SessionConfig,
    paths: BTreeMap<PathId, Path>,
    /// Written bytes not yet cut into segments.
    pending: VecDeque<Bytes>,
    pending_bytes: usize,
    finishing: bool,
    fin_queued: bool,
    /// Unacknowledged segments by sequence number.
    segments: BTreeMap<u64, Segment>,
    next_seq: u64,
    cumulative_acked: u64,
    peer_window_end: u64,
    /// Segments to send again, with the path to avoid if possible.
    retransmit: BTreeMap<u64, Option<PathId>>,
    in_flight: HashMap<u64, InFlight>,
    next_packet_number: u64,
    next_timeout_check: Option<Instant>,
    round_robin: usize,
    window_probe_at: Option<Instant>,
    /// meshwire: send times of transmissions that left flight before their own ACK came back
    /// (acknowledged through another path's ranges, declared lost, probes), so that their echo
    /// still measures the path's RTT and proves a failed path alive (oldest dropped first).
    awaiting_echo: BTreeMap<u64, (PathId, Instant)>,
    stats: SenderStats,
}

impl Sender {
    /// A sender with no paths yet.
    pub fn new(config: SessionConfig) -> Self {
        Self {
            peer_window_end: config.window_segments(),
            config,
            paths: BTreeMap::new(),
            pending: VecDeque::new(),
            pending_bytes: 0,
            finishing: false,
            fin_queued: false,
            segments: BTreeMap::new(),
            next_seq: 0,
            cumulative_acked: 0,
            retransmit: BTreeMap::new(),
            in_flight: HashMap::new(),
            next_packet_number: 0,
            next_timeout_check: None,
            round_robin: 0,
            window_probe_at: None,
            awaiting_echo: BTreeMap::new(),
            stats: SenderStats::default(),
        }
    }

    /// Adds a path (or re-adds a removed one). Its window starts at the policy's initial value, or
    /// at `initial_window_packets` when given (the convergence experiments start windows wrong on
    /// purpose). meshwire never trusts an initial window beyond its probe burst.
    pub fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>) {
        let default = match self.config.policy {
            Policy::Classic | Policy::Meshwire => f64::from(self.config.initial_window_packets),
            Policy::Nkp24 => {
                self.config.session_window_packets() as f64 / (self.paths.len() + 1) as f64
            }
        };
        let mut window = initial_window_packets.unwrap_or(default).max(1.0);
        if self.config.policy == Policy::Meshwire {
            window = window.min(f64::from(self.config.initial_window_packets));
        }
        self.paths.insert(path, Path::new(&self.config, window));
        if self.config.policy == Policy::Nkp24 && initial_window_packets.is_none() {
            self.normalize_windows();
        }
    }

    /// Removes a path: what it carried is sent again on the others.
    pub fn remove_path(&mut self, path: PathId) {
        if self.paths.remove(&path).is_none() {
            return;
        }
        self.resend_all_from(path);
        if self.config.policy == Policy::Nkp24 {
            self.normalize_windows();
        }
    }

    /// The transport cannot take another datagram on `path` before `until` (its writer blocks, as
    /// NKN's link emulator's does when its queue is full). Nothing is scheduled on the path until
    /// then, so a packet's send time excludes the wait; [`Sender::poll_timeout`] wakes the driver
    /// when the path frees up.
    pub fn block_path_until(&mut self, path: PathId, until: Instant) {
        if let Some(state) = self.paths.get_mut(&path) {
            state.blocked_until = Some(until);
            // The transport's own schedule supersedes the estimate from the delivery rate, which
            // on a lossy path is slower than the rate the path takes packets.
            state.departure_clock = Some(until);
        }
    }

    /// The paths, with what the sender knows about each.
    pub fn paths(&self) -> impl Iterator<Item = (PathId, PathStats)> + '_ {
        self.paths.iter().map(|(&id, path)| {
            (
                id,
                PathStats {
                    state: path.state,
                    window_packets: match self.config.policy {
                        Policy::Meshwire => self.meshwire_window(path),
                        Policy::Classic | Policy::Nkp24 => path.window_packets,
                    },
                    in_flight_packets: path.in_flight_packets,
                    smoothed_rtt: path.rtt.smoothed(),
                    rto: match self.config.policy {
                        Policy::Meshwire => path.rto(),
                        _ => path.ncp_rto,
                    },
                    delivery_rate_packets_per_sec: path.rate(),
                    delivered_packets: path.delivered,
                    loss_rate: path.loss_rate,
                },
            )
        })
    }

    /// Counters.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }

    /// Bytes the send buffer accepts now.
    pub fn writable_bytes(&self) -> usize {
        if self.finishing {
            return 0;
        }
        let held = self.pending_bytes + self.segments.len() * self.config.mtu_bytes;
        self.config.send_buffer_bytes.saturating_sub(held)
    }

    /// Queues bytes of the stream; returns how many were taken (the send buffer is bounded).
    pub fn write(&mut self, data: &[u8]) -> usize {
        let taken = data.len().min(self.writable_bytes());
        if taken > 0 {
            self.pending
                .push_back(Bytes::copy_from_slice(&data[..taken]));
            self.pending_bytes += taken;
        }
        taken
    }

    /// Ends the stream after the bytes written so far.
    pub fn finish(&mut self) {
        self.finishing = true;
    }

    /// Every byte written was acknowledged (and, once finished, the end too).
    pub fn is_idle(&self) -> bool {
        self.pending_bytes == 0 && self.segments.is_empty() && (!self.finishing || self.fin_queued)
    }

    /// Cuts the next segment from the written bytes.
    fn next_segment(&mut self) -> Option<(Bytes, bool)> {
        if self.pending_bytes == 0 {
            if self.finishing && !self.fin_queued {
                self.fin_queued = true;
                return Some((Bytes::new(), true));
            }
            return None;
        }
        let mtu = self.config.mtu_bytes;
        let mut segment = BytesMut::with_capacity(mtu.min(self.pending_bytes));
        while segment.len() < mtu {
            let Some(front) = self.pending.front_mut() else {
                break;
            };
            let take = front.len().min(mtu - segment.len());
            segment.extend_from_slice(&front.split_to(take));
            if front.is_empty() {
                self.pending.pop_front();
            }
        }
        self.pending_bytes -= segment.len();
        let fin = self.finishing && self.pending_bytes == 0;
        if fin {
            self.fin_queued = true;
        }
        Some((segment.freeze(), fin))
    }

    fn has_new_data(&self) -> bool {
        self.pending_bytes > 0 || (self.finishing && !self.fin_queued)
    }

    /// New segments may be sent: the peer's window and the session window have room.
    fn may_send_new(&self) -> bool {
        self.has_new_data()
            && self.next_seq < self.peer_window_end
            && self.next_seq - self.cumulative_acked < self.config.session_window_packets()
    }

    /// Handles an ACK that arrived on `path`.
    pub fn handle_ack(
        &mut self,
        path: PathId,
        ack: AckPacket,
        now: Instant,
    ) -> Result<(), SessionError> {
        let highest = ack.ranges.last().map_or(ack.cumulative, |&(_, end)| end);
        if highest > self.next_seq {
            return Err(SessionError::AckBeyondSent {
                acked: highest,
                sent: self.next_seq,
            });
        }
        self.peer_window_end = self.peer_window_end.max(ack.window_end);
        let mut newly: Vec<u64> = self
            .segments
            .range(..ack.cumulative)
            .map(|(&seq, _)| seq)
            .collect();
        if let Some(echo) = ack.echo {
            // The echoed transmission arrived, whether or not its segment fits in the ranges.
            newly.extend(self.in_flight.get(&echo).map(|info| info.seq));
            self.handle_echo(path, echo, now);
        }
        for &(start, end) in &ack.ranges {
            newly.extend(self.segments.range(start..end).map(|(&seq, _)| seq));
        }
        let mut progressed: BTreeSet<PathId> = BTreeSet::new();
        for seq in newly {
            self.retransmit.remove(&seq);
            let Some(segment) = self.segments.remove(&seq) else {
                continue;
            };
            let arrived = self.arrived_copy(&segment.in_flight, ack.echo);
            for pn in segment.in_flight {
                let Some(info) = self.in_flight.remove(&pn) else {
                    continue;
                };
                if Some(pn) != ack.echo {
                    self.await_echo(pn, info.path, info.sent_at);
                }
                // NCP counts every copy as acknowledged (ncp-go `Connection.ReceiveAck` runs on
                // each connection that holds the sequence number); meshwire credits one.
                if Some(pn) == arrived || self.config.policy != Policy::Meshwire {
                    self.on_packet_acked(info, path, now);
                    progressed.insert(info.path);
                } else if let Some(path) = self.paths.get_mut(&info.path) {
                    // Another copy made it: this one leaves flight without counting as delivered
                    // on its path (it may still be on its way, or lost).
                    path.in_flight_packets = path.in_flight_packets.saturating_sub(1);
                }
            }
        }
        self.cumulative_acked = self
            .segments
            .keys()
            .next()
            .copied()
            .unwrap_or(self.next_seq);
        for id in &progressed {
            if let Some(path) = self.paths.get_mut(id) {
                path.timer_start = (path.in_flight_packets > 0).then_some(now);
                if self.config.policy == Policy::Meshwire {
                    path.backoff = 0;
                    path.record_rate_sample(now);
                }
            }
        }
        if self.config.policy == Policy::Meshwire {
            for &id in &progressed {
                self.detect_losses(id, now);
            }
        } else if self.config.policy == Policy::Nkp24 && !progressed.is_empty() {
            self.normalize_windows();
        }
        Ok(())
    }

    /// Which of a segment's transmissions in flight the ACK should credit: the echoed one, else
    /// the one expected to have arrived first.
    fn arrived_copy(&self, copies: &[u64], echo: Option<u64>) -> Option<u64> {
        if let Some(echo) = echo.filter(|echo| copies.contains(echo)) {
            return Some(echo);
        }
        copies
            .iter()
            .filter_map(|pn| {
                let info = self.in_flight.get(pn)?;
                let one_way = self
                    .paths
                    .get(&info.path)
                    .map_or(Duration::ZERO, Path::one_way);
                Some((info.sent_at + one_way, *pn))
            })
            .min()
            .map(|(_, pn)| pn)
    }

    /// meshwire: an ACK on `path` echoes transmission `echo`. If that transmission went on
    /// `path`, its send time gives an RTT sample, even when the transmission already left flight
    /// (acknowledged through another path's ranges, declared lost by an RTO that fired just
    /// before the ACK, or a probe), and a failed path that answers is re-admitted.
    fn handle_echo(&mut self, path: PathId, echo: u64, now: Instant) {
        if self.config.policy != Policy::Meshwire {
            return;
        }
        let sent = match self.in_flight.get(&echo) {
            Some(info) => Some((info.path, info.sent_at)),
            None => self.awaiting_echo.remove(&echo),
        };
        let Some((sent_on, sent_at)) = sent else {
            return;
        };
        let Some(state) = self.paths.get_mut(&path) else {
            return;
        };
        if sent_on != path {
            return;
        }
        state.rtt.update(now.saturating_duration_since(sent_at));
        if let (Some(latest), Some(min)) = (state.rtt.latest(), state.rtt.min()) {
            if latest.as_secs_f64() > STARTUP_EXIT_RTT * min.as_secs_f64() {
                state.startup = false;
            }
        }
        if state.state == PathState::Probing {
            state.next_probe = None;
            state.state = PathState::Active;
            state.backoff = 0;
            state.ack_history.clear();
            self.stats.path_readmissions += 1;
        }
    }

    /// meshwire: keeps the send time of a transmission that left flight, for its echo.
    fn await_echo(&mut self, packet_number: u64, path: PathId, sent_at: Instant) {
        if self.config.policy != Policy::Meshwire {
            return;
        }
        self.awaiting_echo.insert(packet_number, (path, sent_at));
        let limit = 2 * self.config.session_window_packets() as usize;
        while self.awaiting_echo.len() > limit {
            self.awaiting_echo.pop_first();
        }
    }

    fn on_packet_acked(&mut self, info: InFlight, ack_path: PathId, now: Instant) {
        let policy = self.config.policy;
        let Some(path) = self.paths.get_mut(&info.path) else {
            return;
        };
        path.in_flight_packets = path.in_flight_packets.saturating_sub(1);
        path.delivered += 1;
        path.largest_acked_index = Some(
            path.largest_acked_index
                .map_or(info.path_index, |largest| largest.max(info.path_index)),
        );
        if policy == Policy::Meshwire {
            path.loss_rate *= 1.0 - LOSS_EWMA_WEIGHT;
            let delay = now.saturating_duration_since(info.sent_at);
            path.min_ack_delay = Some(path.min_ack_delay.map_or(delay, |min| min.min(delay)));
            if path.startup {
                path.window_packets += 1.0;
            }
            return;
        }
        // NCP: one more packet of window per ACK of a packet that was not resent, and the RTO
        // moves toward three RTTs by at most 100 ms per ACK.
        if !info.timed_out {
            path.window_packets += 1.0;
            if policy == Policy::Classic {
                path.window_packets = path
                    .window_packets
                    .min(f64::from(self.config.ncp_max_window_packets));
            }
        }
        // ncp-go `Connection.ReceiveAck` (NKP-0024 era): only the connection the ACK came back on
        // moves its RTO, by the time since it first sent the packet.
        if info.path != ack_path {
            return;
        }
        let rtt = now.saturating_duration_since(info.sent_at);
        path.rtt.update(rtt);
        let rto = path.ncp_rto.as_secs_f64();
        let step = ((3.0 * rtt.as_secs_f64() - rto) / 1.0).tanh() * 0.1;
        path.ncp_rto = Duration::from_secs_f64((rto + step).max(0.001)).min(NCP_MAX_RTO);
    }

    /// meshwire: packets sent on `id` well before an acknowledged one are lost.
    fn detect_losses(&mut self, id: PathId, now: Instant) {
        let Some(path) = self.paths.get_mut(&id) else {
            return;
        };
        let Some(largest) = path.largest_acked_index else {
            return;
        };
        let delay = path
            .rtt
            .smoothed()
            .unwrap_or_default()
            .max(path.rtt.latest().unwrap_or_default())
            .mul_f64(9.0 / 8.0);
        let mut lost = Vec::new();
        while let Some(&pn) = path.outstanding.front() {
            let Some(info) = self.in_flight.get(&pn) else {
                path.outstanding.pop_front();
                continue;
            };
            let by_count = info.path_index + PACKET_THRESHOLD <= largest;
            let by_time = info.path_index < largest && info.sent_at + delay <= now;
            if !(by_count || by_time) {
                break;
            }
            path.outstanding.pop_front();
            lost.push(pn);
        }
        for pn in lost {
            self.stats.fast_retransmits += 1;
            self.declare_lost(pn, true);
        }
    }

    /// Takes everything in flight on `path` out of flight and queues it to go again (the path was
    /// removed or failed; that says nothing about its loss rate).
    fn resend_all_from(&mut self, path: PathId) {
        let lost: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, info)| info.path == path)
            .map(|(&pn, _)| pn)
            .collect();
        for pn in lost {
            self.declare_lost(pn, false);
        }
    }

    /// Takes `pn` out of flight and queues its segment for retransmission (preferably on another
    /// path). `by_evidence`: ACKs showed the path lost it, which counts in the path's loss
    /// estimate (a refused send, a removed path or an RTO says nothing about the loss rate).
    fn declare_lost(&mut self, pn: u64, by_evidence: bool) {
        let Some(info) = self.in_flight.remove(&pn) else {
            return;
        };
        self.await_echo(pn, info.path, info.sent_at);
        if let Some(path) = self.paths.get_mut(&info.path) {
            path.in_flight_packets = path.in_flight_packets.saturating_sub(1);
            path.startup = false;
            if by_evidence {
                path.loss_rate += (1.0 - path.loss_rate) * LOSS_EWMA_WEIGHT;
            }
        }
        if let Some(segment) = self.segments.get_mut(&info.seq) {
            segment.in_flight.retain(|&other| other != pn);
            // Another copy still on its way may deliver it; if that one is lost too, its own
            // loss queues the segment.
            if segment.in_flight.is_empty() {
                self.retransmit.entry(info.seq).or_insert(Some(info.path));
            }
        }
    }

    /// Handles a failed send on `path` (the transport refused the datagram): NCP pauses the
    /// connection for its configured time and queues the packet for resending; meshwire treats the
    /// packet as lost and moves on to another path at once.
    pub fn handle_send_error(&mut self, path: PathId, transmit: &Transmit, now: Instant) {
        let Ok(Packet::Data(data)) =
            Packet::decode(transmit.payload.clone(), self.config.mtu_bytes)
        else {
            return;
        };
        self.declare_lost(data.packet_number, false);
        if self.config.policy == Policy::Meshwire {
            return;
        }
        if let Some(state) = self.paths.get_mut(&path) {
            state.state = PathState::Paused;
            state.paused_until = Some(now + self.config.ncp_send_error_pause);
            if self.config.policy == Policy::Nkp24 {
                state.window_packets = (state.window_packets / 2.0).max(NCP_MIN_WINDOW);
            }
        }
        if self.config.policy == Policy::Nkp24 {
            self.normalize_windows();
        }
    }

    /// NKP-0024: scale every window so that together they hold the session window.
    fn normalize_windows(&mut self) {
        let total: f64 = self.paths.values().map(|path| path.window_packets).sum();
        if total <= 0.0 {
            return;
        }
        let scale = self.config.session_window_packets() as f64 / total;
        for path in self.paths.values_mut() {
            path.window_packets = (path.window_packets * scale).max(NCP_MIN_WINDOW);
        }
    }

    /// When [`Sender::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next = self.window_probe_at;
        let mut consider = |at: Option<Instant>| {
            if let Some(at) = at {
                next = Some(next.map_or(at, |next: Instant| next.min(at)));
            }
        };
        consider(self.next_timeout_check);
        for path in self.paths.values() {
            consider(path.paused_until);
            consider(path.next_probe);
            consider(path.blocked_until);
            if !self.retransmit.is_empty() {
                consider(path.ncp_parked_until);
            }
            if self.config.policy == Policy::Meshwire {
                consider(path.timer_start.map(|start| start + path.rto()));
            }
        }
        next
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for path in self.paths.values_mut() {
            if path.blocked_until.is_some_and(|until| until <= now) {
                path.blocked_until = None;
            }
            if path.paused_until.is_some_and(|until| until <= now) {
                path.paused_until = None;
                path.state = PathState::Active;
            }
        }
        match self.config.policy {
            Policy::Meshwire => self.meshwire_timeouts(now),
            Policy::Classic | Policy::Nkp24 => {
                if self.next_timeout_check.is_some_and(|at| at <= now) {
                    // Checks run every 50 ms while anything is in flight, as NCP's loop does.
                    self.next_timeout_check =
                        (!self.in_flight.is_empty()).then_some(now + NCP_TIMEOUT_CHECK);
                    self.ncp_timeouts(now);
                }
            }
        }
    }

    fn meshwire_timeouts(&mut self, now: Instant) {
        for path in self.paths.values_mut() {
            if path.in_flight_packets == 0 {
                path.timer_start = None;
            }
        }
        let expired: Vec<PathId> = self
            .paths
            .iter()
            .filter(|(_, path)| {
                path.timer_start
                    .is_some_and(|start| start + path.rto() <= now)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.stats.timeouts += 1;
            self.resend_all_from(id);
            if let Some(path) = self.paths.get_mut(&id) {
                path.timer_start = None;
                path.outstanding.clear();
                path.ack_history.clear();
                path.backoff += 1;
                path.departure_clock = None;
                if path.state == PathState::Active {
                    self.stats.path_failures += 1;
                }
                path.state = PathState::Probing;
                path.next_probe = Some(now);
            }
        }
        if self.window_probe_at.is_some_and(|at| at <= now) {
            self.window_probe_at = None;
        }
    }

    fn ncp_timeouts(&mut self, now: Instant) {
        let mut timed_out = Vec::new();
        for (&pn, info) in &self.in_flight {
            if info.timed_out {
                continue;
            }
            if let Some(path) = self.paths.get(&info.path) {
                if info.sent_at + path.ncp_rto <= now {
                    timed_out.push(pn);
                }
            }
        }
        timed_out.sort_unstable();
        for pn in timed_out {
            let Some(info) = self.in_flight.get_mut(&pn) else {
                continue;
            };
            info.timed_out = true;
            let (seq, id) = (info.seq, info.path);
            self.stats.timeouts += 1;
            self.retransmit.entry(seq).or_insert(None);
            if let Some(path) = self.paths.get_mut(&id) {
                path.window_packets = (path.window_packets / 2.0).max(NCP_MIN_WINDOW);
            }
            if self.config.policy == Policy::Nkp24 {
                self.normalize_windows();
            }
        }
    }

    /// The next datagram to send, if any may go now.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if self.next_timeout_check.is_none() && self.config.policy != Policy::Meshwire {
            self.next_timeout_check = Some(now + NCP_TIMEOUT_CHECK);
        }
        match self.config.policy {
            Policy::Meshwire => self.poll_meshwire(now),
            Policy::Classic | Policy::Nkp24 => self.poll_ncp(now),
        }
    }

    fn poll_ncp(&mut self, now: Instant) -> Option<Transmit> {
        let ids: Vec<PathId> = self.paths.keys().copied().collect();
        for offset in 0..ids.len() {
            let id = ids[(self.round_robin + offset) % ids.len()];
            let path = &self.paths[&id];
            if path.state == PathState::Paused || path.is_blocked(now) {
                continue;
            }
            // ncp-go `Connection.tx`: at the top of its loop (after each send, or when `maxWait`
            // ends a wait for window) a connection takes from the session-wide resend queue
            // without window; otherwise it waits until its window has room
            // (`waitForSendWindow`: used < windowSize) and then takes a resend or new data.
            let has_room = f64::from(path.in_flight_packets) < path.window_packets;
            let at_top = path.ncp_parked_until.is_none_or(|until| until <= now);
            let seq = if (at_top || has_room) && !self.retransmit.is_empty() {
                let (&seq, _) = self.retransmit.iter().next()?;
                self.retransmit.remove(&seq);
                Some(seq)
            } else if has_room && self.may_send_new() {
                None
            } else {
                if !has_room && at_top {
                    // Parks for `maxWait`, on the schedule it started.
                    let mut until = path.ncp_parked_until.unwrap_or(now);
                    while until <= now {
                        until += NCP_MAX_WAIT;
                    }
                    if let Some(path) = self.paths.get_mut(&id) {
                        path.ncp_parked_until = Some(until);
                    }
                }
                continue;
            };
            self.round_robin = (self.round_robin + offset + 1) % ids.len();
            if seq.is_some() {
                self.stats.retransmissions += 1;
            }
            return self.send_segment(id, seq, now);
        }
        None
    }

    fn poll_meshwire(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(transmit) = self.poll_probe(now) {
            return Some(transmit);
        }
        let candidates = self.usable_paths(now, false);
        if let Some((&seq, &avoid)) = self.retransmit.iter().next() {
            // Earliest expected arrival, a retransmission on the path that lost it counting as
            // one RTT later (another path is preferred unless it is much slower), and each path's
            // chance of losing it again counting as that share of a recovery (two RTTs). A path
            // whose writer is busy counts from when it frees up: the retransmission waits for it
            // rather than take a worse path that happens to be free (which carries other work).
            let best = self
                .usable_paths(now, true)
                .into_iter()
                .min_by_key(|&(id, arrival)| {
                    let path = &self.paths[&id];
                    let rtt = path.rtt.smoothed().unwrap_or_default();
                    let again = rtt.mul_f64(2.0 * path.loss_rate);
                    if Some(id) == avoid {
                        arrival + rtt + again
                    } else {
                        arrival + again
                    }
                });
            match best {
                Some((id, _)) if !self.paths[&id].is_blocked(now) => {
                    self.retransmit.remove(&seq);
                    self.stats.retransmissions += 1;
                    return self.send_segment(id, Some(seq), now);
                }
                Some(_) => {}
                None => return None,
            }
        }
        if !self.has_new_data() {
            return self.poll_tail_copy(now, &candidates);
        }
        if !self.may_send_new() {
            self.arm_window_probe(now);
            return None;
        }
        let remaining = (self.pending_bytes.div_ceil(self.config.mtu_bytes)).max(1) as f64;
        for &(id, arrival) in &candidates {
            if self.worth_using(id, arrival, remaining, now) {
                return self.send_segment(id, None, now);
            }
        }
        None
    }

    /// Active, unpaused paths with window space, by expected arrival; those whose writer is busy
    /// only if `with_blocked`.
    fn usable_paths(&self, now: Instant, with_blocked: bool) -> Vec<(PathId, Instant)> {
        let mut candidates: Vec<(PathId, Instant)> = self
            .paths
            .iter()
            .filter(|(_, path)| {
                // A path whose writer is busy adds nothing now; the tail rule still counts it
                // among the others, at the time it frees up.
                path.state == PathState::Active
                    && (with_blocked || !path.is_blocked(now))
                    && f64::from(path.in_flight_packets) < self.meshwire_window(path)
            })
            .map(|(&id, path)| (id, path.expected_arrival(now)))
            .collect();
        candidates.sort_by_key(|&(_, arrival)| arrival);
        candidates
    }

    /// With nothing new left to send, an idle path carries a copy of the unacknowledged segment
    /// most likely lost (every copy in flight on lossy paths; the newest first, whose loss would
    /// otherwise be found last). The end of a transfer then waits for one crossing, not for loss
    /// detection and a retransmission; it costs only capacity that would sit idle.
    fn poll_tail_copy(
        &mut self,
        now: Instant,
        candidates: &[(PathId, Instant)],
    ) -> Option<Transmit> {
        let risk_of = |path: PathId| self.paths.get(&path).map_or(1.0, |path| path.loss_rate);
        for &(id, _) in candidates {
            // Chosen by how much the copy lowers the chance that the segment needs recovery.
            let keep = 1.0 - risk_of(id);
            let mut best: Option<(f64, u64)> = None;
            for (&seq, segment) in self.segments.iter().rev() {
                if segment.in_flight.is_empty() || segment.in_flight.len() >= MAX_COPIES {
                    continue;
                }
                let risk: f64 = segment
                    .in_flight
                    .iter()
                    .map(|pn| {
                        self.in_flight
                            .get(pn)
                            .map_or(0.0, |info| risk_of(info.path))
                    })
                    .product();
                let gain = risk * keep;
                if risk > MIN_COPY_RISK && best.is_none_or(|(most, _)| gain > most) {
                    best = Some((gain, seq));
                }
            }
            if let Some((_, seq)) = best {
                self.stats.tail_copies += 1;
                return self.send_segment(id, Some(seq), now);
            }
        }
        None
    }

    /// The tail rule: put a new segment on `id` only if it arrives no later than the other paths
    /// would deliver everything still unsent without it.
    fn worth_using(&self, id: PathId, arrival: Instant, remaining: f64, now: Instant) -> bool {
        let others: Vec<&Path> = self
            .paths
            .iter()
            .filter(|&(&other, path)| other != id && path.state == PathState::Active)
            .map(|(_, path)| path)
            .collect();
        let rate: f64 = others.iter().filter_map(|path| path.rate()).sum();
        if rate <= 0.0 {
            return true;
        }
        let finish = others
            .iter()
            .filter(|path| path.rate().is_some())
            .map(|path| path.expected_arrival(now))
            .min()
            .unwrap_or(now)
            + Duration::from_secs_f64(remaining / rate);
        arrival <= finish
    }

    fn meshwire_window(&self, path: &Path) -> f64 {
        let ceiling = self.config.session_window_packets() as f64;
        match (path.rate(), path.rtt.min().or(path.min_ack_delay)) {
            (Some(rate), Some(min_rtt)) => {
                let bdp = WINDOW_GAIN * rate * min_rtt.as_secs_f64();
                let startup = if path.startup {
                    path.window_packets
                } else {
                    0.0
                };
                bdp.max(startup).max(MIN_WINDOW_PACKETS).min(ceiling)
            }
            _ => path.window_packets.min(ceiling),
        }
    }

    /// When blocked by the peer's window with nothing in flight, probe so an ACK brings news.
    fn arm_window_probe(&mut self, now: Instant) {
        if self.has_new_data() && self.in_flight.is_empty() && self.window_probe_at.is_none() {
            let rto = self
                .paths
                .values()
                .map(|path| path.rto())
                .min()
                .unwrap_or(self.config.initial_rto());
            self.window_probe_at = Some(now + rto);
        }
    }

    fn poll_probe(&mut self, now: Instant) -> Option<Transmit> {
        let window_probe_due = self.window_probe_at.is_some_and(|at| at <= now);
        let due = self.paths.iter().find(|(_, path)| {
            path.state == PathState::Probing && path.next_probe.is_some_and(|at| at <= now)
        });
        let id = match due {
            Some((&id, _)) => id,
            None if window_probe_due => {
                self.window_probe_at = None;
                *self.paths.keys().next()?
            }
            None => return None,
        };
        let packet_number = self.next_packet_number;
        self.next_packet_number += 1;
        let max_interval = self.config.max_probe_interval;
        let path = self.paths.get_mut(&id)?;
        if path.state == PathState::Probing {
            path.next_probe = Some(now + path.rto().min(max_interval));
        }
        // Any answered probe re-admits the path, not only the latest: on a path whose RTT exceeds
        // the probe interval the latest is never the one answered.
        self.await_echo(packet_number, id, now);
        Some(Transmit {
            path: id,
            payload: Packet::Probe { packet_number }.encode(),
        })
    }

    fn send_segment(&mut self, id: PathId, seq: Option<u64>, now: Instant) -> Option<Transmit> {
        let (seq, payload, fin) = match seq {
            Some(seq) => {
                let segment = self.segments.get(&seq)?;
                (seq, segment.data.clone(), segment.fin)
            }
            None => {
                let (data, fin) = self.next_segment()?;
                let seq = self.next_seq;
                self.next_seq += 1;
                self.segments.insert(
                    seq,
                    Segment {
                        data: data.clone(),
                        fin,
                        in_flight: Vec::new(),
                    },
                );
                (seq, data, fin)
            }
        };
        let packet_number = self.next_packet_number;
        self.next_packet_number += 1;
        let ncp = self.config.policy != Policy::Meshwire;
        // ncp-go `Connection.tx`: a connection resending a packet it already holds keeps the
        // first send time (`timeSentSeq` is set only when absent) and only clears its resent mark,
        // so the packet counts once in its window and times out again at the next check unless
        // acknowledged by then.
        let held = ncp
            .then(|| {
                self.segments
                    .get(&seq)?
                    .in_flight
                    .iter()
                    .copied()
                    .find(|pn| {
                        self.in_flight
                            .get(pn)
                            .is_some_and(|info| info.path == id && info.timed_out)
                    })
            })
            .flatten();
        let path = self.paths.get_mut(&id)?;
        path.ncp_parked_until = None;
        if let Some(held) = held {
            if let Some(info) = self.in_flight.get_mut(&held) {
                info.timed_out = false;
            }
            self.stats.packets_sent += 1;
            return Some(Transmit {
                path: id,
                payload: Packet::Data(DataPacket {
                    packet_number,
                    seq,
                    fin,
                    payload,
                })
                .encode(),
            });
        }
        let info = InFlight {
            seq,
            path: id,
            sent_at: now,
            path_index: path.sent_count,
            timed_out: false,
        };
        path.sent_count += 1;
        path.in_flight_packets += 1;
        path.outstanding.push_back(packet_number);
        if path.timer_start.is_none() {
            path.timer_start = Some(now);
        }
        if let Some(rate) = path.rate() {
            let start = path.departure_clock.map_or(now, |clock| clock.max(now));
            path.departure_clock = Some(start + Duration::from_secs_f64(1.0 / rate));
        }
        self.in_flight.insert(packet_number, info);
        if let Some(segment) = self.segments.get_mut(&seq) {
            segment.in_flight.push(packet_number);
        }
        self.stats.packets_sent += 1;
        Some(Transmit {
            path: id,
            payload: Packet::Data(DataPacket {
                packet_number,
                seq,
                fin,
                payload,
            })
            .encode(),
        })
    }
}
