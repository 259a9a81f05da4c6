//! meshwire's policy: windows of 1.25 × delivery rate × min RTT after a startup burst, segments to the path where they arrive first, ACK-evidence loss detection, tail copies, and paths failed by their RTO and probed back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::super::codec::Packet;
use super::super::rtt::RttEstimator;
use super::super::sender::{Core, InFlight, Path, PathState};
use super::super::{PathId, SessionConfig, Transmit};
use super::WindowPolicy;

mod estimate;

use estimate::{water_level, Estimate};

/// Startup ends when an RTT sample exceeds the minimum by this factor (a queue).
const STARTUP_EXIT_RTT: f64 = 1.25;
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
        // What each path's choice depends on, looked up once: expected arrival, one packet's
        // time there, its smoothed RTT, the share of a recovery its loss rate costs, and whether
        // its writer is free now.
        let paths: Vec<(PathId, Instant, Duration, Duration, Duration, bool)> = paths
            .iter()
            .map(|&(id, arrival)| {
                let service = self
                    .estimates
                    .get(&id)
                    .map_or(Duration::ZERO, Estimate::service);
                let path = core.paths.get(&id);
                let rtt = path
                    .and_then(|path| path.rtt.smoothed())
                    .unwrap_or_default();
                let again = rtt.mul_f64(2.0 * self.loss_rate(id));
                let free = path.is_some_and(|path| !path.is_blocked(now));
                (id, arrival, service, rtt, again, free)
            })
            .collect();
        let mut dealt: BTreeMap<PathId, u32> = BTreeMap::new();
        for (&seq, &avoid) in core.retransmit.iter().take(RETRANSMIT_SCAN) {
            let &(id, .., free) =
                paths
                    .iter()
                    .min_by_key(|&&(id, arrival, service, rtt, again, _)| {
                        let behind = dealt.get(&id).copied().unwrap_or(0);
                        let arrival = arrival + service * behind + again;
                        if Some(id) == avoid {
                            arrival + rtt
                        } else {
                            arrival
                        }
                    })?;
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
                                        .copy_arrival(core, info, now)
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
    ///
    /// The latest RTT shows the queue an earlier packet met, not the one a later packet joined:
    /// a packet also arrives no sooner than the path's latest known arrival (the echo of its
    /// latest-sent packet echoed, less the way back) plus the packets sent between the two, at
    /// the path's rate. Traced in the session sweep (seed 1, case 6): a 168 packets/s relay path
    /// held the first burst's last 53 packets for 0.3 s at the end of the transfer while three
    /// faster paths sat idle, since their arrival was taken as 0.1–0.25 s sooner than it was.
    ///
    /// The position counts from the echoed packet itself, not from the path's largest
    /// acknowledged one: ACK ranges credit a path's packets that arrived through other paths'
    /// copies (or guessed so), far ahead of what the path delivered. Traced in the session sweep
    /// (seed 5, case 7): a 126 packets/s relay path's largest acknowledged index jumped from 16
    /// to 63 while it had delivered about 20, so its queue of 1 s was taken as arrived and no
    /// late copy went to the idle 5 ms path (0.89 s against a 0.32 s ideal; 0.45 s now).
    fn copy_arrival(&self, core: &Core, info: &InFlight, now: Instant) -> Option<Instant> {
        let state = core.paths.get(&info.path)?;
        let estimate = self.estimates.get(&info.path)?;
        let min = state.rtt.min()?;
        let queue = state.rtt.latest().unwrap_or(min).saturating_sub(min);
        let by_delay = info.sent_at + estimate.one_way(state, now) + queue;
        Some(
            by_delay.max(
                self.arrival_by_position(state, estimate, info)
                    .unwrap_or(by_delay),
            ),
        )
    }

    /// When `info` arrives if the path delivers at its rate from its latest known arrival (the
    /// echo of its latest-sent packet echoed, less the way back): 1 / rate later for every
    /// packet sent between that one and `info`. `None` without a rate or an echo, or when
    /// `info` was sent before the echoed packet.
    fn arrival_by_position(
        &self,
        state: &Path,
        estimate: &Estimate,
        info: &InFlight,
    ) -> Option<Instant> {
        let rate = estimate.rate()?;
        let (echoed_index, echoed_at) = estimate.latest_echoed?;
        let ahead = info.path_index.checked_sub(echoed_index)?;
        let arrived = echoed_at.checked_sub(state.one_way())?;
        Some(arrived + Duration::from_secs_f64(ahead as f64 / rate))
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
            Some(info) => Some((info.path, info.sent_at, Some(info.path_index), false)),
            None => self
                .awaiting_echo
                .remove(&echo)
                .map(|(on, at, index)| (on, at, index, true)),
        };
        let Some((sent_on, sent_at, echoed_index, left_flight)) = sent else {
            return;
        };
        let left_flight_index = echoed_index.filter(|_| left_flight);
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
        if let Some(index) = echoed_index {
            estimate.note_echoed_index(index, now);
        }
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
            estimate.latest_echoed = None;
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
        // What the active paths carry per round trip together, by their rate estimates (not
        // the startup growth, which on a path that never shows a queue runs on without
        // bound): the window-limited flag compares the receive window's room with it.
        let ceiling = self.session_window_packets as f64;
        core.flight_goal = core
            .paths
            .iter()
            .filter(|(_, path)| path.state == PathState::Active)
            .filter_map(|(id, path)| self.estimates.get(id)?.bdp_window(path))
            .map(|bdp| bdp.min(ceiling))
            .sum::<f64>() as u64;
        if let Some(transmit) = self.poll_probe(core, now) {
            return Some(transmit);
        }
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
        let candidates = self.usable_paths(core, now, false);
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
                estimate.latest_echoed = None;
                estimate.departure_clock = None;
            }
        }
        if self.window_probe_at.is_some_and(|at| at <= now) {
            self.window_probe_at = None;
        }
    }
}
