//! Segment the stream, track each path's packets in flight, process ACKs and their selective ranges, and hand the window policy the events it decides on.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::codec::{AckPacket, DataPacket, Packet, MAX_ACK_RANGES};
use super::rtt::RttEstimator;
use super::window::WindowPolicy;
use super::{PathId, SessionConfig, SessionError, Transmit};

/// A packet is lost once this many packets sent after it on the same path were acknowledged.
const PACKET_THRESHOLD: u64 = 3;
/// Longest RTO after exponential backoff.
const MAX_BACKED_OFF_RTO: Duration = Duration::from_secs(60);

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
    /// meshwire: copies of the oldest unacknowledged segments, sent while the receive window
    /// held new data back or once none was left, on a path where they arrive sooner than the
    /// copies in flight.
    pub late_copies: u64,
}

#[derive(Debug)]
pub(super) struct Segment {
    data: Bytes,
    fin: bool,
    /// Packet numbers of this segment's transmissions still counted in flight.
    pub(super) in_flight: Vec<u64>,
    /// When the earliest of its transmissions declared lost would have arrived (sent time plus
    /// its path's one-way delay): a declaration can be early, and that copy may still arrive.
    lost_copy_arrival: Option<Instant>,
}

/// One transmission of a segment, counted in its path's flight until acknowledged or lost.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) seq: u64,
    pub(super) path: PathId,
    pub(super) sent_at: Instant,
    /// Position among the path's transmissions.
    pub(super) path_index: u64,
    /// NCP: timed out and queued for resending, but still counted in the window.
    pub(super) timed_out: bool,
}

/// What every policy tracks about a path: health, flight, RTT and timers.
#[derive(Debug)]
pub(super) struct Path {
    pub(super) state: PathState,
    pub(super) in_flight_packets: u32,
    pub(super) rtt: RttEstimator,
    pub(super) backoff: u32,
    /// When the RTO timer started (last progress), while packets are in flight.
    pub(super) timer_start: Option<Instant>,
    sent_count: u64,
    /// Packet numbers in the order sent; entries no longer in flight are skipped lazily.
    pub(super) outstanding: VecDeque<u64>,
    /// The latest of the path's packets known to have arrived (see [`Sender::handle_ack`]).
    pub(super) largest_acked_index: Option<u64>,
    pub(super) delivered: u64,
    pub(super) next_probe: Option<Instant>,
    paused_until: Option<Instant>,
    /// The transport takes no datagram on this path before then (a blocking writer).
    pub(super) blocked_until: Option<Instant>,
}

impl Path {
    fn note_acked_index(&mut self, index: u64) {
        self.largest_acked_index = Some(self.largest_acked_index.map_or(index, |l| l.max(index)));
    }

    pub(super) fn new(config: &SessionConfig, initial_rto: Duration) -> Self {
        Self {
            state: PathState::Active,
            in_flight_packets: 0,
            rtt: RttEstimator::new(initial_rto, config.min_rto, config.max_rto),
            backoff: 0,
            timer_start: None,
            sent_count: 0,
            outstanding: VecDeque::new(),
            largest_acked_index: None,
            delivered: 0,
            next_probe: None,
            paused_until: None,
            blocked_until: None,
        }
    }

    pub(super) fn is_blocked(&self, now: Instant) -> bool {
        self.blocked_until.is_some_and(|until| until > now)
    }

    /// The RFC 6298 RTO with exponential backoff.
    pub(super) fn rto(&self) -> Duration {
        self.rtt
            .rto()
            .saturating_mul(1 << self.backoff.min(16))
            .min(MAX_BACKED_OFF_RTO)
    }

    /// Half the minimum (else smoothed) RTT.
    pub(super) fn one_way(&self) -> Duration {
        self.rtt.min().or(self.rtt.smoothed()).unwrap_or_default() / 2
    }
}

/// The state every window policy shares: the stream, its segments, the packets in flight and the
/// paths' flight and RTT. A policy reads it and drives it through the methods here.
#[derive(Debug)]
pub(super) struct Core {
    pub(super) config: SessionConfig,
    pub(super) paths: BTreeMap<PathId, Path>,
    /// Written bytes not yet cut into segments.
    pending: VecDeque<Bytes>,
    pending_bytes: usize,
    finishing: bool,
    fin_queued: bool,
    /// Unacknowledged segments by sequence number.
    pub(super) segments: BTreeMap<u64, Segment>,
    next_seq: u64,
    cumulative_acked: u64,
    peer_window_end: u64,
    /// Segments to send again, with the path to avoid if possible.
    pub(super) retransmit: BTreeMap<u64, Option<PathId>>,
    pub(super) in_flight: HashMap<u64, InFlight>,
    next_packet_number: u64,
    pub(super) stats: SenderStats,
    /// What the policy expects its paths to carry per round trip together, in packets (0: no
    /// estimate): the window-limited flag compares the room left with it.
    pub(super) flight_goal: u64,
}

impl Core {
    fn new(config: SessionConfig) -> Self {
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
            stats: SenderStats::default(),
            flight_goal: 0,
        }
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

    /// Written bytes (or the end of the stream) not yet cut into segments.
    pub(super) fn has_new_data(&self) -> bool {
        self.pending_bytes > 0 || (self.finishing && !self.fin_queued)
    }

    /// The writer finished the stream: whatever is unsent now is all there will be.
    pub(super) fn is_finishing(&self) -> bool {
        self.finishing
    }

    /// Segments the written and not yet segmented bytes make (at least one).
    pub(super) fn unsent_segments(&self) -> usize {
        self.pending_bytes.div_ceil(self.config.mtu_bytes).max(1)
    }

    /// New segments may be sent: the peer's window and the session window have room.
    pub(super) fn may_send_new(&self) -> bool {
        self.has_new_data()
            && self.next_seq < self.peer_window_end
            && self.next_seq - self.cumulative_acked < self.config.session_window_packets()
    }

    /// A packet number never used before.
    pub(super) fn take_packet_number(&mut self) -> u64 {
        let packet_number = self.next_packet_number;
        self.next_packet_number += 1;
        packet_number
    }

    /// Which of a segment's transmissions in flight the ACK arriving on `ack_path` at `now`
    /// should credit: the echoed one, else the one expected to have arrived first if it could
    /// have arrived by now. With it, whether it is evidence of arrival on its path (it marks
    /// earlier packets there lost by count): the echoed one is, another only if no copy declared
    /// lost was due before it.
    ///
    /// A segment declared lost too early and sent again arrives through its first copy; the
    /// ACK names the segment, not the copy, and the copy still in flight may have left a moment
    /// ago. Taking that one as arrived marked its path's earlier packets lost by count: traced
    /// in `session-quic`'s `direct+3-relays`, 2,937 of 3,146 packets declared lost by count were
    /// echoed later, each set off this way. When the first copy was really lost (a relay's
    /// bucket dropped it) the one in flight did arrive: it still counts as delivered.
    fn arrived_copy(
        &self,
        segment: &Segment,
        echo: Option<u64>,
        ack_path: PathId,
        now: Instant,
    ) -> Option<(u64, bool)> {
        let copies = &segment.in_flight;
        if let Some(echo) = echo.filter(|echo| copies.contains(echo)) {
            return Some((echo, true));
        }
        let one_way = |id: &PathId| self.paths.get(id).map_or(Duration::ZERO, Path::one_way);
        let (arrival, pn) = copies
            .iter()
            .filter_map(|pn| {
                let info = self.in_flight.get(pn)?;
                Some((info.sent_at + one_way(&info.path), *pn))
            })
            .min()?;
        let evidence = segment
            .lost_copy_arrival
            .is_none_or(|lost_arrival| arrival < lost_arrival);
        (arrival + one_way(&ack_path) <= now).then_some((pn, evidence))
    }

    /// The path's packet at `index` is known to have arrived (its own echo came back).
    pub(super) fn note_acked_index(&mut self, id: PathId, index: u64) {
        if let Some(path) = self.paths.get_mut(&id) {
            path.note_acked_index(index);
        }
    }

    /// Packets sent on `id` well before one known to have arrived (3 later packets, or 9/8 RTT
    /// older than one): they leave the path's outstanding list and are to be declared lost.
    pub(super) fn lost_by_evidence(&mut self, id: PathId, now: Instant) -> Vec<u64> {
        let mut lost = Vec::new();
        let Some(path) = self.paths.get_mut(&id) else {
            return lost;
        };
        let Some(largest) = path.largest_acked_index else {
            return lost;
        };
        let delay = path
            .rtt
            .smoothed()
            .unwrap_or_default()
            .max(path.rtt.latest().unwrap_or_default())
            .mul_f64(9.0 / 8.0);
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
        lost
    }

    /// Packet numbers in flight on `path`.
    pub(super) fn in_flight_on(&self, path: PathId) -> Vec<u64> {
        self.in_flight
            .iter()
            .filter(|(_, info)| info.path == path)
            .map(|(&pn, _)| pn)
            .collect()
    }

    /// Takes `pn` out of flight and queues its segment for retransmission (preferably on another
    /// path) unless another copy is still on its way; returns the transmission, for the policy.
    /// `on_the_wire`: the transmission left (it may still arrive); false for one the transport
    /// refused.
    pub(super) fn declare_lost(&mut self, pn: u64, on_the_wire: bool) -> Option<InFlight> {
        let info = self.in_flight.remove(&pn)?;
        if let Some(path) = self.paths.get_mut(&info.path) {
            path.in_flight_packets = path.in_flight_packets.saturating_sub(1);
        }
        let one_way = self
            .paths
            .get(&info.path)
            .map_or(Duration::ZERO, Path::one_way);
        if let Some(segment) = self.segments.get_mut(&info.seq) {
            segment.in_flight.retain(|&other| other != pn);
            if on_the_wire {
                let arrival = info.sent_at + one_way;
                segment.lost_copy_arrival = Some(
                    segment
                        .lost_copy_arrival
                        .map_or(arrival, |at| at.min(arrival)),
                );
            }
            // Another copy still on its way may deliver it; if that one is lost too, its own
            // loss queues the segment. A copy NCP's check timed out is not on its way: it stays
            // in its connection's window only until acknowledged, and times out again only if
            // that connection resends it. Counted as live, a path removed with the segment's
            // one other copy in flight left it unqueued for good and the session stalled
            // (`tests/session.rs`, NKP-0024 with a path removed and added again).
            let on_its_way = segment.in_flight.iter().any(|other| {
                self.in_flight
                    .get(other)
                    .is_some_and(|copy| !copy.timed_out)
            });
            if !on_its_way {
                self.retransmit.entry(info.seq).or_insert(Some(info.path));
            }
        }
        Some(info)
    }

    /// Sends segment `seq` again, or the next new segment when `None`, on path `id`.
    pub(super) fn send_segment(
        &mut self,
        id: PathId,
        seq: Option<u64>,
        now: Instant,
    ) -> Option<Transmit> {
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
                        lost_copy_arrival: None,
                    },
                );
                (seq, data, fin)
            }
        };
        let packet_number = self.take_packet_number();
        // ncp-go `Connection.tx`: a connection resending a packet it already holds keeps the
        // first send time (`timeSentSeq` is set only when absent) and only clears its resent mark,
        // so the packet counts once in its window and times out again at the next check unless
        // acknowledged by then. Only NCP's timeout check marks packets timed out.
        let held = self.segments.get(&seq).and_then(|segment| {
            segment.in_flight.iter().copied().find(|pn| {
                self.in_flight
                    .get(pn)
                    .is_some_and(|info| info.path == id && info.timed_out)
            })
        });
        // Tells the receiver its window, not the paths, holds the rest of the data back, or will
        // within a round trip: the room left is less than what the paths carry per round trip
        // (the packets in flight, or what the policy expects the paths to carry per round trip
        // together, whichever is more). Its cue to grow the window. Flagged only once the
        // window stopped the sender, the window grew a round trip after the stop and the paths
        // idled that long: multipath sweep, seed 3, case 4 (two paths of 0.7 s RTT, a
        // bandwidth-delay product of twice the 4 MiB start) waited 0.7 s with all of the window
        // sent. Compared with the packets in flight alone, the flag still came a round trip
        // late after a path's first burst, whose echoes give its rate at once while its flight
        // grows only as it sends.
        let room = self.peer_window_end.saturating_sub(self.next_seq);
        let want = (self.in_flight.len() as u64).max(self.flight_goal);
        let window_limited = self.has_new_data() && room < want + 1;
        let path = self.paths.get_mut(&id)?;
        let transmit = Transmit {
            path: id,
            payload: Packet::Data(DataPacket {
                packet_number,
                seq,
                fin,
                window_limited,
                payload,
            })
            .encode(),
        };
        self.stats.packets_sent += 1;
        if let Some(held) = held {
            if let Some(info) = self.in_flight.get_mut(&held) {
                info.timed_out = false;
            }
            return Some(transmit);
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
        self.in_flight.insert(packet_number, info);
        if let Some(segment) = self.segments.get_mut(&seq) {
            segment.in_flight.push(packet_number);
        }
        Some(transmit)
    }

    /// Stops sending on `path` until `until` (the transport refused a datagram).
    pub(super) fn pause(&mut self, path: PathId, until: Instant) -> bool {
        let Some(state) = self.paths.get_mut(&path) else {
            return false;
        };
        state.state = PathState::Paused;
        state.paused_until = Some(until);
        true
    }
}

/// The sending half of a session.
#[derive(Debug)]
pub struct Sender {
    core: Core,
    policy: Box<dyn WindowPolicy>,
}

impl Sender {
    /// A sender with no paths yet, under `config.policy`.
    pub fn new(config: SessionConfig) -> Self {
        Self {
            policy: config.policy.build(&config),
            core: Core::new(config),
        }
    }

    /// Adds a path (or re-adds a removed one). Its window starts at the policy's initial value, or
    /// at `initial_window_packets` when given (the convergence experiments start windows wrong on
    /// purpose). meshwire never trusts an initial window beyond its probe burst.
    pub fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>) {
        self.policy.add_path(path, initial_window_packets);
        let state = Path::new(&self.core.config, self.policy.initial_rto());
        self.core.paths.insert(path, state);
    }

    /// Removes a path: what it carried is sent again on the others.
    pub fn remove_path(&mut self, path: PathId) {
        if self.core.paths.remove(&path).is_none() {
            return;
        }
        self.policy.remove_path(path);
        for pn in self.core.in_flight_on(path) {
            self.declare_lost(pn, true);
        }
    }

    /// Whether `path` is one of the sender's paths.
    pub fn has_path(&self, path: PathId) -> bool {
        self.core.paths.contains_key(&path)
    }

    /// A packet number never used before (for a path close).
    pub(super) fn take_packet_number(&mut self) -> u64 {
        self.core.take_packet_number()
    }

    /// The transport cannot take another datagram on `path` before `until` (its writer blocks, as
    /// NKN's link emulator's does when its queue is full). Nothing is scheduled on the path until
    /// then, so a packet's send time excludes the wait; [`Sender::poll_timeout`] wakes the driver
    /// when the path frees up.
    pub fn block_path_until(&mut self, path: PathId, until: Instant) {
        if let Some(state) = self.core.paths.get_mut(&path) {
            state.blocked_until = Some(until);
            self.policy.block_path_until(path, until);
        }
    }

    /// The paths, with what the sender knows about each.
    pub fn paths(&self) -> impl Iterator<Item = (PathId, PathStats)> + '_ {
        self.core.paths.iter().map(|(&id, path)| {
            (
                id,
                PathStats {
                    state: path.state,
                    window_packets: self.policy.window_packets(&self.core, id),
                    in_flight_packets: path.in_flight_packets,
                    smoothed_rtt: path.rtt.smoothed(),
                    rto: self.policy.rto(&self.core, id),
                    delivery_rate_packets_per_sec: self.policy.delivery_rate_packets_per_sec(id),
                    delivered_packets: path.delivered,
                    loss_rate: self.policy.loss_rate(id),
                },
            )
        })
    }

    /// Counters.
    pub fn stats(&self) -> SenderStats {
        self.core.stats
    }

    /// Bytes the send buffer accepts now.
    pub fn writable_bytes(&self) -> usize {
        let core = &self.core;
        if core.finishing {
            return 0;
        }
        let held = core.pending_bytes + core.segments.len() * core.config.mtu_bytes;
        core.config.send_buffer_bytes.saturating_sub(held)
    }

    /// Queues bytes of the stream; returns how many were taken (the send buffer is bounded).
    pub fn write(&mut self, data: &[u8]) -> usize {
        let taken = data.len().min(self.writable_bytes());
        if taken > 0 {
            self.core
                .pending
                .push_back(Bytes::copy_from_slice(&data[..taken]));
            self.core.pending_bytes += taken;
        }
        taken
    }

    /// Ends the stream after the bytes written so far.
    pub fn finish(&mut self) {
        self.core.finishing = true;
    }

    /// Every byte written was acknowledged (and, once finished, the end too).
    pub fn is_idle(&self) -> bool {
        let core = &self.core;
        core.pending_bytes == 0 && core.segments.is_empty() && (!core.finishing || core.fin_queued)
    }

    /// Handles an ACK that arrived on `path`.
    pub fn handle_ack(
        &mut self,
        path: PathId,
        ack: AckPacket,
        now: Instant,
    ) -> Result<(), SessionError> {
        let core = &mut self.core;
        let highest = ack.ranges.last().map_or(ack.cumulative, |&(_, end)| end);
        if highest > core.next_seq {
            return Err(SessionError::AckBeyondSent {
                acked: highest,
                sent: core.next_seq,
            });
        }
        core.peer_window_end = core.peer_window_end.max(ack.window_end);
        let mut newly: Vec<u64> = core
            .segments
            .range(..ack.cumulative)
            .map(|(&seq, _)| seq)
            .collect();
        if let Some(echo) = ack.echo {
            // The echoed transmission arrived, whether or not its segment fits in the ranges.
            newly.extend(core.in_flight.get(&echo).map(|info| info.seq));
            self.policy.on_echo(core, path, echo, now);
        }
        for &(start, end) in &ack.ranges {
            newly.extend(core.segments.range(start..end).map(|(&seq, _)| seq));
        }
        // An ACK with as many ranges as it can carry may leave out the middle ones (the
        // receiver keeps the lowest and the highest half). A packet credited by a range above
        // the gap is no evidence that the path's earlier packets were lost: they may sit in the
        // ranges left out (with paths of very different delays the receiver holds many holes).
        let unreported_from =
            (ack.ranges.len() >= MAX_ACK_RANGES).then(|| ack.ranges[MAX_ACK_RANGES / 2].0);
        let credits_every_copy = self.policy.credits_every_copy();
        let mut progressed: BTreeSet<PathId> = BTreeSet::new();
        for seq in newly {
            core.retransmit.remove(&seq);
            let Some(segment) = core.segments.remove(&seq) else {
                continue;
            };
            let arrived = core.arrived_copy(&segment, ack.echo, path, now);
            for pn in segment.in_flight {
                let Some(info) = core.in_flight.remove(&pn) else {
                    continue;
                };
                if Some(pn) != ack.echo {
                    self.policy.on_left_flight(pn, &info);
                }
                // NCP counts every copy as acknowledged (ncp-go `Connection.ReceiveAck` runs on
                // each connection that holds the sequence number); meshwire credits one. Another
                // copy that made it leaves flight without counting as delivered on its path (it
                // may still be on its way, or lost).
                let credited =
                    arrived.is_some_and(|(arrived, _)| arrived == pn) || credits_every_copy;
                let evidence = match arrived {
                    Some((arrived, evidence)) if arrived == pn => evidence,
                    _ => true,
                };
                if credited {
                    progressed.insert(info.path);
                }
                let Some(state) = core.paths.get_mut(&info.path) else {
                    continue;
                };
                state.in_flight_packets = state.in_flight_packets.saturating_sub(1);
                if credited {
                    state.delivered += 1;
                    if Some(pn) == ack.echo
                        || evidence && unreported_from.is_none_or(|from| info.seq < from)
                    {
                        state.note_acked_index(info.path_index);
                    }
                    self.policy.on_acked(&mut state.rtt, &info, path, now);
                }
            }
        }
        core.cumulative_acked = core
            .segments
            .keys()
            .next()
            .copied()
            .unwrap_or(core.next_seq);
        for id in &progressed {
            if let Some(state) = core.paths.get_mut(id) {
                state.timer_start = (state.in_flight_packets > 0).then_some(now);
                // Progress ends any backoff (only a policy that fails paths on RTO backs off).
                state.backoff = 0;
            }
        }
        self.policy.on_acks_end(core, &progressed, now);
        Ok(())
    }

    /// Declares `pn` lost without ACK evidence (a refused send, a removed path).
    fn declare_lost(&mut self, pn: u64, on_the_wire: bool) {
        if let Some(info) = self.core.declare_lost(pn, on_the_wire) {
            self.policy.on_lost(pn, &info, false);
        }
    }

    /// Handles a failed send on `path` (the transport refused the datagram): the packet is lost,
    /// and the policy decides what that means for the path.
    pub fn handle_send_error(&mut self, path: PathId, transmit: &Transmit, now: Instant) {
        let Ok(Packet::Data(data)) =
            Packet::decode(transmit.payload.clone(), self.core.config.mtu_bytes)
        else {
            return;
        };
        self.declare_lost(data.packet_number, false);
        self.policy.on_send_error(&mut self.core, path, now);
    }

    /// When [`Sender::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.core
            .paths
            .values()
            .flat_map(|path| [path.paused_until, path.next_probe, path.blocked_until])
            .chain([self.policy.poll_timeout(&self.core)])
            .flatten()
            .min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for path in self.core.paths.values_mut() {
            if path.blocked_until.is_some_and(|until| until <= now) {
                path.blocked_until = None;
            }
            if path.paused_until.is_some_and(|until| until <= now) {
                path.paused_until = None;
                path.state = PathState::Active;
            }
        }
        self.policy.handle_timeout(&mut self.core, now);
    }

    /// The next datagram to send, if any may go now.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.policy.poll_transmit(&mut self.core, now)
    }
}
