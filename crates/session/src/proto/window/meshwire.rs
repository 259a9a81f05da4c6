//! meshwire's policy: windows of 1.25 × delivery rate × min RTT after a startup burst, segments to the path where they arrive first, ACK-evidence loss detection, tail copies, and paths failed by their RTO and probed back.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::super::codec::Packet;
use super::super::rtt::RttEstimator;
use super::super::sender::{Core, InFlight, Path, PathState};
use super::super::{PathId, SessionConfig, Transmit};
use super::WindowPolicy;

/// The window is this many bandwidth-delay products: one in flight, a quarter of headroom
/// (enough to keep the bottleneck busy and its ACK spacing measurable, little enough that the
/// queue it builds does not stretch the reordering span on long paths).
const WINDOW_GAIN: f64 = 1.25;
/// Startup ends when an RTT sample exceeds the minimum by this factor (a queue).
const STARTUP_EXIT_RTT: f64 = 1.25;
/// Smallest window, in packets.
const MIN_WINDOW_PACKETS: f64 = 4.0;
/// Echoes over which one delivery-rate sample is taken. Over QUIC the receiver's echoes can
/// come back coalesced in one packet, so a span of a few echoes overstates the rate; 32 spread
/// such a bunch out while the first burst (128 packets) still gives samples.
const RATE_SPAN_ACKS: usize = 32;
/// Most echoes remembered per path for rate samples (a round trip's worth up to this).
const MAX_ECHO_HISTORY: usize = 4096;
/// Fewest echo intervals that make a rate sample.
const RATE_MIN_ACKS: usize = 16;
/// How long a delivery-rate sample counts in the windowed maximum.
const RATE_WINDOW: Duration = Duration::from_secs(2);
/// Weight of one packet's fate in a path's loss estimate (an average over about 64 packets).
const LOSS_EWMA_WEIGHT: f64 = 1.0 / 64.0;
/// An unacknowledged segment is copied onto an idle path at the end of the data only when the
/// estimated chance that every copy in flight is lost exceeds this.
const MIN_COPY_RISK: f64 = 0.001;
/// Most transmissions of one segment in flight at once (the original and two copies).
const MAX_COPIES: usize = 3;
/// Oldest unacknowledged segments looked at for a copy while the receive window holds new data
/// back.
const WINDOW_COPY_SCAN: usize = 64;
/// Queued retransmissions dealt out to paths per poll at most.
const RETRANSMIT_SCAN: usize = 256;

/// What meshwire learns about one path.
#[derive(Debug)]
struct Estimate {
    /// The startup window: the first burst, plus one per packet acknowledged during startup.
    window_packets: f64,
    /// The shortest time from sending one of this path's packets to any ACK (on any path)
    /// covering it. Until the path's own RTT is measured, the window uses it: a path whose ACKs
    /// are slow is acknowledged sooner through a faster path's ranges.
    min_ack_delay: Option<Duration>,
    /// Still growing the window by one packet per packet acknowledged (doubling per round trip)
    /// on top of rate x min RTT, until an RTT sample shows a queue or a loss.
    startup: bool,
    /// The latest echoes of this path's packets: when the echo came, echoes counted by then,
    /// and when the echoed packet was sent.
    echo_history: VecDeque<(Instant, u64, Instant)>,
    /// Echoes of this path's packets that came back on it.
    echoes: u64,
    /// Windowed maximum of delivery-rate samples, decreasing from front to back.
    rate_filter: VecDeque<(Instant, f64)>,
    /// When the last packet put on the path should finish crossing its bottleneck.
    departure_clock: Option<Instant>,
    /// Moving average of packet fates on this path (1 lost, 0 acknowledged).
    loss_rate: f64,
    /// When the first packet went on this path while it had no RTT sample.
    first_unmeasured_send: Option<Instant>,
}

impl Estimate {
    fn new(window_packets: f64) -> Self {
        Self {
            window_packets,
            min_ack_delay: None,
            startup: true,
            echo_history: VecDeque::new(),
            echoes: 0,
            rate_filter: VecDeque::new(),
            departure_clock: None,
            loss_rate: 0.0,
            first_unmeasured_send: None,
        }
    }

    fn rate(&self) -> Option<f64> {
        self.rate_filter.front().map(|&(_, rate)| rate)
    }

    /// The path's one-way delay: half its RTT, and until the RTT is measured, at least the time
    /// its first packet has gone without an echo. That wait bounds the RTT from below only; the
    /// estimate takes the RTT as twice the wait so far (a wait already this long is expected to
    /// last as long again), not the bound itself. With the bound, a 412 ms path silent for
    /// 275 ms counted as 137 ms one way and took new segments beside 6–60 ms paths, and the
    /// whole transfer waited for them (multipath sweep, seed 1, case 5).
    fn one_way(&self, path: &Path, now: Instant) -> Duration {
        let measured = path.one_way();
        match self.first_unmeasured_send {
            Some(first) if path.rtt.min().is_none() => {
                measured.max(now.saturating_duration_since(first))
            }
            _ => measured,
        }
    }

    /// When the packets put on this path so far should have crossed its bottleneck: the departure
    /// clock, but no later than the packets in flight take at the path's rate (`ahead` of
    /// them: the rest may already be through). Only packets in flight can wait there; a clock
    /// run ahead by a rate estimate that lagged the path (a window-limited delivery rate, which
    /// the window's 1.25 gain and startup outgrow) left paths that were idle looking seconds
    /// behind: on a session over QUIC with two 0.8 s paths the whole tail went to a 114
    /// packets/s path while the fast paths idled with their clocks 3.5 s ahead.
    fn queue_clears(&self, ahead: u32, now: Instant) -> Instant {
        let clock = self.departure_clock.map_or(now, |clock| clock.max(now));
        match self.rate() {
            Some(rate) => clock.min(now + Duration::from_secs_f64(f64::from(ahead) / rate)),
            None => clock,
        }
    }

    /// When a packet put on `path` now should arrive, by the rate and departure clock.
    fn expected_arrival(&self, path: &Path, now: Instant) -> Instant {
        let start = self.queue_clears(path.in_flight_packets, now);
        let start = path.blocked_until.map_or(start, |until| until.max(start));
        start + self.service() + self.one_way(path, now)
    }

    /// One packet's time at the path's rate (none before a rate is known).
    fn service(&self) -> Duration {
        self.rate()
            .map_or(Duration::ZERO, |rate| Duration::from_secs_f64(1.0 / rate))
    }

    /// The window: 1.25 × rate × min RTT (at least the startup window while in startup), within
    /// `ceiling`; the first burst until a rate and a delay are known.
    fn window(&self, path: &Path, ceiling: f64) -> f64 {
        match (self.rate(), path.rtt.min().or(self.min_ack_delay)) {
            (Some(rate), Some(min_rtt)) => {
                let bdp = WINDOW_GAIN * rate * min_rtt.as_secs_f64();
                let startup = if self.startup {
                    self.window_packets
                } else {
                    0.0
                };
                bdp.max(startup).max(MIN_WINDOW_PACKETS).min(ceiling)
            }
            _ => self.window_packets.min(ceiling),
        }
    }

    /// Counts an echo of a packet sent on this path at `sent` that came back on it at `now`,
    /// and takes one delivery-rate sample over the echoes since the last one that had come back
    /// when that packet was sent (a round trip's worth, as BBR's samples span one; at least the
    /// last [`RATE_SPAN_ACKS`] echoes, at most [`MAX_ECHO_HISTORY`] or [`RATE_WINDOW`]): the packets
    /// they echo over the longer of the time the echoes took to arrive and the time the packets
    /// took to send (the send interval bounds the sample by the rate the packets went out at,
    /// as in BBR's delivery-rate estimation, draft-cheng-iccrg-delivery-rate-estimation).
    /// The receiver echoes every arrival at once on its own path, so echoes come back spaced as
    /// the path delivered the packets. ACK ranges are no measure of that: a path's packets are
    /// also acknowledged through other paths' ACKs, in bursts that come when those paths'
    /// packets arrive.
    fn record_echo(&mut self, sent: Instant, now: Instant) {
        self.echoes += 1;
        self.echo_history.push_back((now, self.echoes, sent));
        while self.echo_history.len() > MAX_ECHO_HISTORY
            || self.echo_history.len() > RATE_SPAN_ACKS + 1
                && self
                    .echo_history
                    .front()
                    .is_some_and(|&(at, _, _)| now.saturating_duration_since(at) > RATE_WINDOW)
        {
            self.echo_history.pop_front();
        }
        let newest = self.echo_history.len() - 1;
        // The last echo that had come back when this packet was sent: the sample spans the
        // echoes of the packets in flight with it, a round trip's worth (at least
        // RATE_SPAN_ACKS), so echoes bunched on the way back cannot compress it.
        let before_send = self
            .echo_history
            .partition_point(|&(at, _, _)| at <= sent)
            .checked_sub(1)
            .filter(|&index| index < newest);
        let base = newest.saturating_sub(RATE_SPAN_ACKS);
        let base = before_send.map_or(base, |index| index.min(base));
        if newest - base < RATE_MIN_ACKS {
            return;
        }
        let (then, echoes_then, sent_then) = self.echo_history[base];
        let elapsed = now
            .saturating_duration_since(then)
            .max(sent.saturating_duration_since(sent_then))
            .as_secs_f64();
        if elapsed <= 0.0 {
            return;
        }
        let sample = (self.echoes - echoes_then) as f64 / elapsed;
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

/// The time, from now, by which paths given as `(first arrival, packets/s)` deliver `packets`
/// between them, each from its first arrival at its rate; `None` without a path with a rate.
fn water_level(paths: &mut [(f64, f64)], packets: f64) -> Option<f64> {
    paths.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut rate, mut weighted) = (0.0, 0.0);
    let mut level = None;
    for (index, &(arrival, path_rate)) in paths.iter().enumerate() {
        if path_rate <= 0.0 {
            continue;
        }
        rate += path_rate;
        weighted += path_rate * arrival;
        let finish = (packets + weighted) / rate;
        level = Some(finish);
        if paths.get(index + 1).is_none_or(|&(next, _)| next >= finish) {
            break;
        }
    }
    level
}

/// meshwire's window policy.
#[derive(Debug)]
pub(super) struct Meshwire {
    initial_window_packets: f64,
    initial_rto: Duration,
    max_probe_interval: Duration,
    session_window_packets: u64,
    estimates: BTreeMap<PathId, Estimate>,
    window_probe_at: Option<Instant>,
    /// Send times of transmissions that left flight before their own ACK came back
    /// (acknowledged through another path's ranges, declared lost, probes), so that their echo
    /// still measures the path's RTT and proves a failed path alive (oldest dropped first).
    /// With each, its position among its path's transmissions (none for a probe).
    awaiting_echo: BTreeMap<u64, (PathId, Instant, Option<u64>)>,
    /// Paths whose largest acknowledged index an echo moved this ACK without crediting a packet
    /// there: their loss detection runs at the ACK's end like a credited path's.
    echoed: BTreeSet<PathId>,
}

impl Meshwire {
    pub(super) fn new(config: &SessionConfig) -> Self {
        Self {
            initial_window_packets: f64::from(config.initial_window_packets),
            initial_rto: config.initial_rto,
            max_probe_interval: config.max_probe_interval,
            session_window_packets: config.session_window_packets(),
            estimates: BTreeMap::new(),
            window_probe_at: None,
            awaiting_echo: BTreeMap::new(),
            echoed: BTreeSet::new(),
        }
    }

    /// The window of `path`, whose estimate is `estimate`.
    fn window(&self, path: &Path, estimate: &Estimate) -> f64 {
        estimate.window(path, self.session_window_packets as f64)
    }

    /// Keeps the send time of a transmission that left flight, for its echo.
    fn await_echo(
        &mut self,
        packet_number: u64,
        path: PathId,
        sent_at: Instant,
        path_index: Option<u64>,
    ) {
        self.awaiting_echo
            .insert(packet_number, (path, sent_at, path_index));
        let limit = 2 * self.session_window_packets as usize;
        while self.awaiting_echo.len() > limit {
            self.awaiting_echo.pop_first();
        }
    }

    fn declare_lost(&mut self, core: &mut Core, pn: u64, by_evidence: bool) {
        if let Some(info) = core.declare_lost(pn, true) {
            self.on_lost(pn, &info, by_evidence);
        }
    }

    /// Sends a segment (`None`: the next new one) on `id` and advances its departure clock.
    fn send(
        &mut self,
        core: &mut Core,
        id: PathId,
        seq: Option<u64>,
        now: Instant,
    ) -> Option<Transmit> {
        let transmit = core.send_segment(id, seq, now)?;
        let (unmeasured, in_flight) = core.paths.get(&id).map_or((false, 0), |path| {
            (path.rtt.min().is_none(), path.in_flight_packets)
        });
        if let Some(estimate) = self.estimates.get_mut(&id) {
            if unmeasured && estimate.first_unmeasured_send.is_none() {
                estimate.first_unmeasured_send = Some(now);
            }
            if estimate.rate().is_some() {
                // The packets ahead of this one: those in flight before it.
                let start = estimate.queue_clears(in_flight.saturating_sub(1), now);
                estimate.departure_clock = Some(start + estimate.service());
            }
        }
        Some(transmit)
    }

    /// Active paths with window space, by expected arrival; those whose writer is busy only if
    /// `with_blocked`.
    fn usable_paths(
        &self,
        core: &Core,
        now: Instant,
        with_blocked: bool,
    ) -> Vec<(PathId, Instant)> {
        let mut candidates: Vec<(PathId, Instant)> = core
            .paths
            .iter()
            .filter_map(|(&id, path)| Some((id, path, self.estimates.get(&id)?)))
            .filter(|(_, path, estimate)| {
                // A path whose writer is busy adds nothing now; the tail rule still counts it
                // among the others, at the time it frees up.
                path.state == PathState::Active
                    && (with_blocked || !path.is_blocked(now))
                    && f64::from(path.in_flight_packets) < self.window(path, estimate)
            })
            .map(|(id, path, estimate)| (id, estimate.expected_arrival(path, now)))
            .collect();
        candidates.sort_by_key(|&(_, arrival)| arrival);
        candidates
    }

    /// The tail rule: put a new segment on `id` only if it arrives no later than the unsent
    /// segments would all be delivered without it. That finish time is the latency-aware
    /// water level over the measured paths: the smallest `T` with
    /// `sum of rate_i x max(0, T - arrival_i) >= remaining`, where `arrival_i` is when a packet
    /// put on path `i` now arrives. A measured `id` counts among the paths (so every path takes
    /// the same decision about the same level, and the paths that reach it share the tail); an
    /// unmeasured one is compared with the measured others.
    fn worth_using(
        &self,
        core: &Core,
        id: PathId,
        arrival: Instant,
        remaining: f64,
        now: Instant,
    ) -> bool {
        let own_rate = self.estimates.get(&id).and_then(Estimate::rate);
        let mut fill: Vec<(f64, f64)> = core
            .paths
            .iter()
            .filter(|&(&other, path)| other != id && path.state == PathState::Active)
            .filter_map(|(other, path)| {
                let estimate = self.estimates.get(other)?;
                let rate = estimate.rate()?;
                let at = estimate.expected_arrival(path, now);
                Some((at.saturating_duration_since(now).as_secs_f64(), rate))
            })
            .collect();
        let own_arrival = arrival.saturating_duration_since(now).as_secs_f64();
        if let Some(rate) = own_rate {
            fill.push((own_arrival, rate));
        }
        match water_level(&mut fill, remaining) {
            Some(level) => own_arrival <= level,
            None => true,
        }
    }

    /// The queued retransmission a path free now should carry, and that path; `None` while
    /// every one is better off waiting for a busy path.
    ///
    /// The queue is dealt out in order, each to the path where it is expected first: earliest
    /// arrival, a retransmission on the path that lost it counting as one RTT later (another
    /// path is preferred unless it is much slower), and each path's chance of losing it again
    /// counting as that share of a recovery (two RTTs). A path whose writer is busy counts from
    /// when it frees up, and each retransmission already dealt to it pushes the next one back by
    /// one packet's time there. So a busy fast path still gets the retransmissions it delivers
    /// first, and a path free now takes the first one it delivers sooner than the paths ahead of
    /// it would: one at a time per slow path was 150 retransmissions behind a 223 packets/s path
    /// (0.67 s) while a 14,000 packets/s path sat idle.
    fn pick_retransmission(
        &self,
        core: &Core,
        paths: &[(PathId, Instant)],
        now: Instant,
    ) -> Option<(u64, PathId)> {
        let mut dealt: BTreeMap<PathId, u32> = BTreeMap::new();
        for (&seq, &avoid) in core.retransmit.iter().take(RETRANSMIT_SCAN) {
            let (id, _) = paths.iter().copied().min_by_key(|&(id, arrival)| {
                let behind = dealt.get(&id).copied().unwrap_or(0);
                let service = self
                    .estimates
                    .get(&id)
                    .map_or(Duration::ZERO, Estimate::service);
                let arrival = arrival + service * behind;
                let rtt = core
                    .paths
                    .get(&id)
                    .and_then(|path| path.rtt.smoothed())
                    .unwrap_or_default();
                let again = rtt.mul_f64(2.0 * self.loss_rate(id));
                if Some(id) == avoid {
                    arrival + rtt + again
                } else {
                    arrival + again
                }
            })?;
            let free = core
                .paths
                .get(&id)
                .is_some_and(|path| !path.is_blocked(now));
            if free && !dealt.contains_key(&id) {
                return Some((seq, id));
            }
            *dealt.entry(id).or_default() += 1;
        }
        None
    }

    /// With nothing new left to send, an idle path carries a copy of the unacknowledged segment
    /// most likely lost (every copy in flight on lossy paths; the newest first, whose loss would
    /// otherwise be found last). The end of a transfer then waits for one crossing, not for loss
    /// detection and a retransmission; it costs only capacity that would sit idle.
    fn poll_tail_copy(
        &mut self,
        core: &mut Core,
        now: Instant,
        candidates: &[(PathId, Instant)],
    ) -> Option<Transmit> {
        let risk_of = |path: PathId| {
            self.estimates
                .get(&path)
                .map_or(1.0, |estimate| estimate.loss_rate)
        };
        for &(id, _) in candidates {
            // Chosen by how much the copy lowers the chance that the segment needs recovery.
            let keep = 1.0 - risk_of(id);
            let mut best: Option<(f64, u64)> = None;
            for (&seq, segment) in core.segments.iter().rev() {
                if segment.in_flight.is_empty() || segment.in_flight.len() >= MAX_COPIES {
                    continue;
                }
                let risk: f64 = segment
                    .in_flight
                    .iter()
                    .map(|pn| {
                        core.in_flight
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
                core.stats.tail_copies += 1;
                return self.send(core, id, Some(seq), now);
            }
        }
        None
    }

    /// While the receive window holds new data back, or once the stream is finished and sent, the oldest
    /// unacknowledged segments hold the transfer up: a segment whose copies in flight arrive
    /// later than a copy put on an idle path now is copied there (MPTCP's opportunistic
    /// retransmission, Raiciu et al., NSDI 2012). A slow path's packets otherwise keep the
    /// window shut, or the transfer unfinished, for their whole crossing while faster paths
    /// idle; the copy costs only capacity that would sit idle.
    fn poll_late_copy(
        &mut self,
        core: &mut Core,
        now: Instant,
        candidates: &[(PathId, Instant)],
    ) -> Option<Transmit> {
        for &(id, arrival) in candidates {
            // A copy takes one packet's time on its path; it is worth that only if it arrives
            // earlier by more (a tie within the path's own service time gains nothing).
            let service = self
                .estimates
                .get(&id)
                .map_or(Duration::ZERO, Estimate::service);
            let arrival = arrival + service;
            let late = core
                .segments
                .iter()
                .take(WINDOW_COPY_SCAN)
                .find(|(_, segment)| {
                    !segment.in_flight.is_empty()
                        && segment.in_flight.len() < MAX_COPIES
                        && segment.in_flight.iter().all(|pn| {
                            core.in_flight.get(pn).is_some_and(|info| {
                                info.path != id
                                    && self
                                        .copy_arrival(core, info.path, info.sent_at, now)
                                        .is_none_or(|at| at > arrival)
                            })
                        })
                })
                .map(|(&seq, _)| seq);
            if let Some(seq) = late {
                core.stats.late_copies += 1;
                return self.send(core, id, Some(seq), now);
            }
        }
        None
    }

    /// When a packet sent on `path` at `sent_at` should arrive, by the path's one-way delay and
    /// the queue its latest RTT shows above the minimum (a packet sent into a queue waits in
    /// it: on a 128 packets/s relay path a session's startup left 1–2 s of queue, and the end
    /// of a transfer waited for packets counted as due at half the minimum RTT); `None` on a
    /// path with no RTT sample yet (its packets may all still be on the way).
    fn copy_arrival(
        &self,
        core: &Core,
        path: PathId,
        sent_at: Instant,
        now: Instant,
    ) -> Option<Instant> {
        let state = core.paths.get(&path)?;
        let estimate = self.estimates.get(&path)?;
        let min = state.rtt.min()?;
        let queue = state.rtt.latest().unwrap_or(min).saturating_sub(min);
        Some(sent_at + estimate.one_way(state, now) + queue)
    }

    /// When blocked by the peer's window with nothing in flight, probe so an ACK brings news.
    fn arm_window_probe(&mut self, core: &Core, now: Instant) {
        if core.has_new_data() && core.in_flight.is_empty() && self.window_probe_at.is_none() {
            let rto = core
                .paths
                .values()
                .map(Path::rto)
                .min()
                .unwrap_or(self.initial_rto);
            self.window_probe_at = Some(now + rto);
        }
    }

    fn poll_probe(&mut self, core: &mut Core, now: Instant) -> Option<Transmit> {
        let window_probe_due = self.window_probe_at.is_some_and(|at| at <= now);
        let due = core.paths.iter().find(|(_, path)| {
            path.state == PathState::Probing && path.next_probe.is_some_and(|at| at <= now)
        });
        let id = match due {
            Some((&id, _)) => id,
            None if window_probe_due => {
                self.window_probe_at = None;
                *core.paths.keys().next()?
            }
            None => return None,
        };
        let packet_number = core.take_packet_number();
        let path = core.paths.get_mut(&id)?;
        if path.state == PathState::Probing {
            path.next_probe = Some(now + path.rto().min(self.max_probe_interval));
        }
        // Any answered probe re-admits the path, not only the latest: on a path whose RTT exceeds
        // the probe interval the latest is never the one answered.
        self.await_echo(packet_number, id, now, None);
        Some(Transmit {
            path: id,
            payload: Packet::Probe { packet_number }.encode(),
        })
    }

    /// Packets sent on `id` well before an acknowledged one are lost.
    fn detect_losses(&mut self, core: &mut Core, id: PathId, now: Instant) {
        for pn in core.lost_by_evidence(id, now) {
            core.stats.fast_retransmits += 1;
            self.declare_lost(core, pn, true);
        }
    }
}

impl WindowPolicy for Meshwire {
    fn initial_rto(&self) -> Duration {
        self.initial_rto
    }

    /// meshwire never trusts an initial window beyond its first burst.
    fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>) {
        let window = initial_window_packets
            .unwrap_or(self.initial_window_packets)
            .max(1.0)
            .min(self.initial_window_packets);
        self.estimates.insert(path, Estimate::new(window));
    }

    fn remove_path(&mut self, path: PathId) {
        self.estimates.remove(&path);
    }

    fn window_packets(&self, core: &Core, path: PathId) -> f64 {
        match (core.paths.get(&path), self.estimates.get(&path)) {
            (Some(state), Some(estimate)) => self.window(state, estimate),
            _ => 0.0,
        }
    }

    fn rto(&self, core: &Core, path: PathId) -> Duration {
        core.paths.get(&path).map_or(self.initial_rto, Path::rto)
    }

    fn delivery_rate_packets_per_sec(&self, path: PathId) -> Option<f64> {
        self.estimates.get(&path)?.rate()
    }

    fn loss_rate(&self, path: PathId) -> f64 {
        self.estimates
            .get(&path)
            .map_or(0.0, |estimate| estimate.loss_rate)
    }

    /// The transport's own schedule supersedes the estimate from the delivery rate, which on a
    /// lossy path is slower than the rate the path takes packets.
    fn block_path_until(&mut self, path: PathId, until: Instant) {
        if let Some(estimate) = self.estimates.get_mut(&path) {
            estimate.departure_clock = Some(until);
        }
    }

    fn credits_every_copy(&self) -> bool {
        false
    }

    /// If the echoed transmission went on `path`, its send time gives an RTT sample, even when
    /// the transmission already left flight (acknowledged through another path's ranges,
    /// declared lost by an RTO that fired just before the ACK, or a probe), and a failed path
    /// that answers is re-admitted.
    fn on_echo(&mut self, core: &mut Core, path: PathId, echo: u64, now: Instant) {
        let sent = match core.in_flight.get(&echo) {
            Some(info) => Some((info.path, info.sent_at, None)),
            None => self.awaiting_echo.remove(&echo),
        };
        let Some((sent_on, sent_at, left_flight_index)) = sent else {
            return;
        };
        // A transmission that left flight before its echo (acknowledged through another path's
        // ranges, or declared lost) still arrived in order on its path, and is evidence against
        // the path's earlier packets: without running loss detection here, packets lost just
        // before a stretch acknowledged through ranges left out of full ACKs waited for their
        // RTO (multipath sweep, seed 4, case 17: five such packets held 1.6 MB of the stream for
        // 0.2 s).
        if let (true, Some(index)) = (sent_on == path, left_flight_index) {
            core.note_acked_index(path, index);
            self.echoed.insert(path);
        }
        let (Some(state), Some(estimate)) =
            (core.paths.get_mut(&path), self.estimates.get_mut(&path))
        else {
            return;
        };
        if sent_on != path {
            return;
        }
        state.rtt.update(now.saturating_duration_since(sent_at));
        estimate.record_echo(sent_at, now);
        if let (Some(latest), Some(min)) = (state.rtt.latest(), state.rtt.min()) {
            if latest.as_secs_f64() > STARTUP_EXIT_RTT * min.as_secs_f64() {
                estimate.startup = false;
            }
        }
        if state.state == PathState::Probing {
            state.next_probe = None;
            state.state = PathState::Active;
            state.backoff = 0;
            estimate.echo_history.clear();
            core.stats.path_readmissions += 1;
        }
    }

    fn on_left_flight(&mut self, pn: u64, info: &InFlight) {
        self.await_echo(pn, info.path, info.sent_at, Some(info.path_index));
    }

    fn on_acked(&mut self, _: &mut RttEstimator, info: &InFlight, _: PathId, now: Instant) {
        let Some(estimate) = self.estimates.get_mut(&info.path) else {
            return;
        };
        estimate.loss_rate *= 1.0 - LOSS_EWMA_WEIGHT;
        let delay = now.saturating_duration_since(info.sent_at);
        estimate.min_ack_delay = Some(estimate.min_ack_delay.map_or(delay, |min| min.min(delay)));
        if estimate.startup {
            estimate.window_packets += 1.0;
        }
    }

    fn on_acks_end(&mut self, core: &mut Core, progressed: &BTreeSet<PathId>, now: Instant) {
        let echoed = std::mem::take(&mut self.echoed);
        for &id in progressed.union(&echoed) {
            self.detect_losses(core, id, now);
        }
    }

    fn on_lost(&mut self, pn: u64, info: &InFlight, by_evidence: bool) {
        self.await_echo(pn, info.path, info.sent_at, Some(info.path_index));
        if let Some(estimate) = self.estimates.get_mut(&info.path) {
            estimate.startup = false;
            if by_evidence {
                estimate.loss_rate += (1.0 - estimate.loss_rate) * LOSS_EWMA_WEIGHT;
            }
        }
    }

    /// The packet is lost; the next poll moves on to another path at once.
    fn on_send_error(&mut self, _: &mut Core, _: PathId, _: Instant) {}

    fn poll_transmit(&mut self, core: &mut Core, now: Instant) -> Option<Transmit> {
        if let Some(transmit) = self.poll_probe(core, now) {
            return Some(transmit);
        }
        let candidates = self.usable_paths(core, now, false);
        if !core.retransmit.is_empty() {
            let paths = self.usable_paths(core, now, true);
            if paths.is_empty() {
                return None;
            }
            if let Some((seq, id)) = self.pick_retransmission(core, &paths, now) {
                core.retransmit.remove(&seq);
                core.stats.retransmissions += 1;
                return self.send(core, id, Some(seq), now);
            }
        }
        if !core.has_new_data() {
            // Only at the end of the stream: a writer that is merely slow will fill the paths.
            if core.is_finishing() {
                if let Some(transmit) = self.poll_late_copy(core, now, &candidates) {
                    return Some(transmit);
                }
            }
            return self.poll_tail_copy(core, now, &candidates);
        }
        if !core.may_send_new() {
            if let Some(transmit) = self.poll_late_copy(core, now, &candidates) {
                return Some(transmit);
            }
            self.arm_window_probe(core, now);
            return None;
        }
        let remaining = core.unsent_segments() as f64;
        for &(id, arrival) in &candidates {
            if self.worth_using(core, id, arrival, remaining, now) {
                return self.send(core, id, None, now);
            }
        }
        None
    }

    fn poll_timeout(&self, core: &Core) -> Option<Instant> {
        core.paths
            .values()
            .filter_map(|path| path.timer_start.map(|start| start + path.rto()))
            .chain(self.window_probe_at)
            .min()
    }

    /// A path whose RTO fires is failed: its packets are retransmitted elsewhere and it carries
    /// only probes until one is answered.
    fn handle_timeout(&mut self, core: &mut Core, now: Instant) {
        for path in core.paths.values_mut() {
            if path.in_flight_packets == 0 {
                path.timer_start = None;
            }
        }
        let expired: Vec<PathId> = core
            .paths
            .iter()
            .filter(|(_, path)| {
                path.timer_start
                    .is_some_and(|start| start + path.rto() <= now)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            core.stats.timeouts += 1;
            for pn in core.in_flight_on(id) {
                self.declare_lost(core, pn, false);
            }
            if let Some(path) = core.paths.get_mut(&id) {
                path.timer_start = None;
                path.outstanding.clear();
                path.backoff += 1;
                if path.state == PathState::Active {
                    core.stats.path_failures += 1;
                }
                path.state = PathState::Probing;
                path.next_probe = Some(now);
            }
            if let Some(estimate) = self.estimates.get_mut(&id) {
                estimate.echo_history.clear();
                estimate.departure_clock = None;
            }
        }
        if self.window_probe_at.is_some_and(|at| at <= now) {
            self.window_probe_at = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::super::sender::Path;
    use super::super::super::{Policy, SessionConfig};
    use super::{water_level, Estimate, WINDOW_GAIN};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_water_level_leaves_out_paths_that_arrive_after_it() {
        // 100 packets at 1000/s from 10 ms: done at 110 ms, before a path that starts at 200 ms.
        let mut paths = [(0.2, 1000.0), (0.01, 1000.0)];
        assert!(close(water_level(&mut paths, 100.0).unwrap(), 0.11));
    }

    #[test]
    fn the_water_level_shares_the_packets_among_the_paths_that_reach_it() {
        // From 0 and 100 ms at 1000/s each: 300 packets are done at 200 ms (200 + 100).
        let mut paths = [(0.1, 1000.0), (0.0, 1000.0)];
        assert!(close(water_level(&mut paths, 300.0).unwrap(), 0.2));
    }

    #[test]
    fn a_rate_sample_spans_a_round_trip_so_bunched_echoes_do_not_overstate_it() {
        // 1,000 packets/s handed on in bursts of 20 every 20 ms, echoed 100 ms later in the same
        // bunches (a local queue upstream, coalesced echoes downstream). A span of 32 echoes
        // read 1,600/s; a round trip's worth reads at most the window gain above the rate. (The
        // first round trip has no earlier echo to span from and samples 32 echoes; after 3 s
        // those samples have left the 2 s filter.)
        let start = Instant::now();
        let mut estimate = Estimate::new(128.0);
        for burst in 0..150u64 {
            let sent = start + Duration::from_millis(20 * burst);
            for _ in 0..20 {
                estimate.record_echo(sent, sent + Duration::from_millis(100));
            }
        }
        let rate = estimate.rate().expect("sampled");
        assert!(rate <= 1000.0 * WINDOW_GAIN, "{rate}");
        assert!(rate >= 900.0, "{rate}");
    }

    #[test]
    fn only_packets_in_flight_wait_ahead_of_a_new_one() {
        // A path measured at 1,000 packets/s whose departure clock ran 3 s ahead (sent faster
        // than a lagging rate estimate): with nothing in flight a new packet waits for nothing,
        // with 100 in flight at most 100 ms, and the clock still rules when it is the earlier.
        let start = Instant::now();
        let mut estimate = Estimate::new(128.0);
        for packet in 0..200u64 {
            let sent = start + Duration::from_millis(packet);
            estimate.record_echo(sent, sent + Duration::from_millis(50));
        }
        let rate = estimate.rate().expect("sampled");
        assert!((900.0..=1100.0).contains(&rate), "{rate}");
        let now = start + Duration::from_millis(250);
        estimate.departure_clock = Some(now + Duration::from_secs(3));
        assert_eq!(estimate.queue_clears(0, now), now);
        let hundred = estimate.queue_clears(100, now) - now;
        assert!(
            hundred <= Duration::from_secs_f64(100.0 / rate),
            "{hundred:?}"
        );
        assert!(hundred >= Duration::from_millis(90), "{hundred:?}");
        assert_eq!(
            estimate.queue_clears(100_000, now),
            now + Duration::from_secs(3)
        );
        estimate.departure_clock = Some(start);
        assert_eq!(estimate.queue_clears(100, now), now);
    }

    #[test]
    fn a_path_silent_for_a_while_is_expected_to_stay_silent_as_long_again() {
        // No echo 300 ms after the first packet: the RTT exceeds 300 ms, and the estimate takes
        // it as 600 ms, so one way counts as 300 ms.
        let config = SessionConfig::new(Policy::Meshwire);
        let path = Path::new(&config, Duration::from_secs(1));
        let start = Instant::now();
        let mut estimate = Estimate::new(128.0);
        assert_eq!(estimate.one_way(&path, start), Duration::ZERO);
        estimate.first_unmeasured_send = Some(start);
        let now = start + Duration::from_millis(300);
        assert_eq!(estimate.one_way(&path, now), Duration::from_millis(300));
    }

    #[test]
    fn no_water_level_without_a_rate() {
        assert_eq!(water_level(&mut [], 10.0), None);
        assert_eq!(water_level(&mut [(0.0, 0.0)], 10.0), None);
    }
}
