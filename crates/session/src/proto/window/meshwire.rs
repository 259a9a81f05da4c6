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
/// ACK arrivals over which one delivery-rate sample is taken.
const RATE_SPAN_ACKS: usize = 16;
/// Fewest ACK intervals that make a rate sample.
const RATE_MIN_ACKS: usize = 8;
/// How long a delivery-rate sample counts in the windowed maximum.
const RATE_WINDOW: Duration = Duration::from_secs(2);
/// Weight of one packet's fate in a path's loss estimate (an average over about 64 packets).
const LOSS_EWMA_WEIGHT: f64 = 1.0 / 64.0;
/// An unacknowledged segment is copied onto an idle path at the end of the data only when the
/// estimated chance that every copy in flight is lost exceeds this.
const MIN_COPY_RISK: f64 = 0.001;
/// Most transmissions of one segment in flight at once (the original and two copies).
const MAX_COPIES: usize = 3;

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
    ack_history: VecDeque<(Instant, u64)>,
    /// Windowed maximum of delivery-rate samples, decreasing from front to back.
    rate_filter: VecDeque<(Instant, f64)>,
    /// When the last packet put on the path should finish crossing its bottleneck.
    departure_clock: Option<Instant>,
    /// Moving average of packet fates on this path (1 lost, 0 acknowledged).
    loss_rate: f64,
}

impl Estimate {
    fn new(window_packets: f64) -> Self {
        Self {
            window_packets,
            min_ack_delay: None,
            startup: true,
            ack_history: VecDeque::new(),
            rate_filter: VecDeque::new(),
            departure_clock: None,
            loss_rate: 0.0,
        }
    }

    fn rate(&self) -> Option<f64> {
        self.rate_filter.front().map(|&(_, rate)| rate)
    }

    /// When a packet put on `path` now should arrive, by the rate and departure clock.
    fn expected_arrival(&self, path: &Path, now: Instant) -> Instant {
        let start = self.departure_clock.map_or(now, |clock| clock.max(now));
        let start = path.blocked_until.map_or(start, |until| until.max(start));
        let service = self
            .rate()
            .map_or(Duration::ZERO, |rate| Duration::from_secs_f64(1.0 / rate));
        start + service + path.one_way()
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

    fn record_rate_sample(&mut self, delivered: u64, now: Instant) {
        self.ack_history.push_back((now, delivered));
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
        let sample = (delivered - delivered_then) as f64 / elapsed;
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
    awaiting_echo: BTreeMap<u64, (PathId, Instant)>,
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
        }
    }

    /// The window of `path`, whose estimate is `estimate`.
    fn window(&self, path: &Path, estimate: &Estimate) -> f64 {
        estimate.window(path, self.session_window_packets as f64)
    }

    /// Keeps the send time of a transmission that left flight, for its echo.
    fn await_echo(&mut self, packet_number: u64, path: PathId, sent_at: Instant) {
        self.awaiting_echo.insert(packet_number, (path, sent_at));
        let limit = 2 * self.session_window_packets as usize;
        while self.awaiting_echo.len() > limit {
            self.awaiting_echo.pop_first();
        }
    }

    fn declare_lost(&mut self, core: &mut Core, pn: u64, by_evidence: bool) {
        if let Some(info) = core.declare_lost(pn) {
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
        if let Some(estimate) = self.estimates.get_mut(&id) {
            if let Some(rate) = estimate.rate() {
                let start = estimate.departure_clock.map_or(now, |clock| clock.max(now));
                estimate.departure_clock = Some(start + Duration::from_secs_f64(1.0 / rate));
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

    /// The tail rule: put a new segment on `id` only if it arrives no later than the other paths
    /// would deliver everything still unsent without it.
    fn worth_using(
        &self,
        core: &Core,
        id: PathId,
        arrival: Instant,
        remaining: f64,
        now: Instant,
    ) -> bool {
        let others: Vec<(&Path, &Estimate)> = core
            .paths
            .iter()
            .filter(|&(&other, path)| other != id && path.state == PathState::Active)
            .filter_map(|(other, path)| Some((path, self.estimates.get(other)?)))
            .collect();
        let rate: f64 = others
            .iter()
            .filter_map(|(_, estimate)| estimate.rate())
            .sum();
        if rate <= 0.0 {
            return true;
        }
        let finish = others
            .iter()
            .filter(|(_, estimate)| estimate.rate().is_some())
            .map(|(path, estimate)| estimate.expected_arrival(path, now))
            .min()
            .unwrap_or(now)
            + Duration::from_secs_f64(remaining / rate);
        arrival <= finish
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
        self.await_echo(packet_number, id, now);
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
            Some(info) => Some((info.path, info.sent_at)),
            None => self.awaiting_echo.remove(&echo),
        };
        let Some((sent_on, sent_at)) = sent else {
            return;
        };
        let (Some(state), Some(estimate)) =
            (core.paths.get_mut(&path), self.estimates.get_mut(&path))
        else {
            return;
        };
        if sent_on != path {
            return;
        }
        state.rtt.update(now.saturating_duration_since(sent_at));
        if let (Some(latest), Some(min)) = (state.rtt.latest(), state.rtt.min()) {
            if latest.as_secs_f64() > STARTUP_EXIT_RTT * min.as_secs_f64() {
                estimate.startup = false;
            }
        }
        if state.state == PathState::Probing {
            state.next_probe = None;
            state.state = PathState::Active;
            state.backoff = 0;
            estimate.ack_history.clear();
            core.stats.path_readmissions += 1;
        }
    }

    fn on_left_flight(&mut self, pn: u64, info: &InFlight) {
        self.await_echo(pn, info.path, info.sent_at);
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
        for id in progressed {
            if let (Some(path), Some(estimate)) = (core.paths.get(id), self.estimates.get_mut(id)) {
                estimate.record_rate_sample(path.delivered, now);
            }
        }
        for &id in progressed {
            self.detect_losses(core, id, now);
        }
    }

    fn on_lost(&mut self, pn: u64, info: &InFlight, by_evidence: bool) {
        self.await_echo(pn, info.path, info.sent_at);
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
        if let Some((&seq, &avoid)) = core.retransmit.iter().next() {
            // Earliest expected arrival, a retransmission on the path that lost it counting as
            // one RTT later (another path is preferred unless it is much slower), and each path's
            // chance of losing it again counting as that share of a recovery (two RTTs). A path
            // whose writer is busy counts from when it frees up: the retransmission waits for it
            // rather than take a worse path that happens to be free (which carries other work).
            let best =
                self.usable_paths(core, now, true)
                    .into_iter()
                    .min_by_key(|&(id, arrival)| {
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
                    });
            match best {
                Some((id, _))
                    if core
                        .paths
                        .get(&id)
                        .is_some_and(|path| !path.is_blocked(now)) =>
                {
                    core.retransmit.remove(&seq);
                    core.stats.retransmissions += 1;
                    return self.send(core, id, Some(seq), now);
                }
                Some(_) => {}
                None => return None,
            }
        }
        if !core.has_new_data() {
            return self.poll_tail_copy(core, now, &candidates);
        }
        if !core.may_send_new() {
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
                estimate.ack_history.clear();
                estimate.departure_clock = None;
            }
        }
        if self.window_probe_at.is_some_and(|at| at <= now) {
            self.window_probe_at = None;
        }
    }
}
