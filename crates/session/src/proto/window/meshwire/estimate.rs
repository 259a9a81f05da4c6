//! What meshwire's window policy learns about one path (delivery rate from echo spacing,
//! departure clock, loss estimate, startup window) and the water level that shares the unsent
//! segments among the paths.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::super::super::sender::Path;

/// The window is this many bandwidth-delay products: one in flight, a quarter of headroom
/// (enough to keep the bottleneck busy and its ACK spacing measurable, little enough that the
/// queue it builds does not stretch the reordering span on long paths).
const WINDOW_GAIN: f64 = 1.25;
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

/// What meshwire learns about one path.
#[derive(Debug)]
pub(super) struct Estimate {
    /// The startup window: the first burst, plus one per packet acknowledged during startup.
    pub(super) window_packets: f64,
    /// The shortest time from sending one of this path's packets to any ACK (on any path)
    /// covering it. Until the path's own RTT is measured, the window uses it: a path whose ACKs
    /// are slow is acknowledged sooner through a faster path's ranges.
    pub(super) min_ack_delay: Option<Duration>,
    /// Still growing the window by one packet per packet acknowledged (doubling per round trip)
    /// on top of rate x min RTT, until an RTT sample shows a queue or a loss.
    pub(super) startup: bool,
    /// The latest echoes of this path's packets: when the echo came, echoes counted by then,
    /// and when the echoed packet was sent.
    pub(super) echo_history: VecDeque<(Instant, u64, Instant)>,
    /// The latest-sent of this path's packets echoed on it (its position among the path's
    /// packets) and when that echo came: the one packet known to have arrived at a known time.
    pub(super) latest_echoed: Option<(u64, Instant)>,
    /// Echoes of this path's packets that came back on it.
    echoes: u64,
    /// Windowed maximum of delivery-rate samples, decreasing from front to back.
    rate_filter: VecDeque<(Instant, f64)>,
    /// When the last packet put on the path should finish crossing its bottleneck.
    pub(super) departure_clock: Option<Instant>,
    /// Moving average of packet fates on this path (1 lost, 0 acknowledged).
    pub(super) loss_rate: f64,
    /// When the first packet went on this path while it had no RTT sample.
    pub(super) first_unmeasured_send: Option<Instant>,
}

impl Estimate {
    pub(super) fn new(window_packets: f64) -> Self {
        Self {
            window_packets,
            min_ack_delay: None,
            startup: true,
            echo_history: VecDeque::new(),
            latest_echoed: None,
            echoes: 0,
            rate_filter: VecDeque::new(),
            departure_clock: None,
            loss_rate: 0.0,
            first_unmeasured_send: None,
        }
    }

    pub(super) fn rate(&self) -> Option<f64> {
        self.rate_filter.front().map(|&(_, rate)| rate)
    }

    /// The path's one-way delay: half its RTT, and until the RTT is measured, at least the time
    /// its first packet has gone without an echo. That wait bounds the RTT from below only; the
    /// estimate takes the RTT as twice the wait so far (a wait already this long is expected to
    /// last as long again), not the bound itself. With the bound, a 412 ms path silent for
    /// 275 ms counted as 137 ms one way and took new segments beside 6–60 ms paths, and the
    /// whole transfer waited for them (multipath sweep, seed 1, case 5).
    pub(super) fn one_way(&self, path: &Path, now: Instant) -> Duration {
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
    pub(super) fn queue_clears(&self, ahead: u32, now: Instant) -> Instant {
        let clock = self.departure_clock.map_or(now, |clock| clock.max(now));
        match self.rate() {
            Some(rate) => clock.min(now + Duration::from_secs_f64(f64::from(ahead) / rate)),
            None => clock,
        }
    }

    /// When a packet put on `path` now should arrive, by the rate and departure clock.
    pub(super) fn expected_arrival(&self, path: &Path, now: Instant) -> Instant {
        let start = self.queue_clears(path.in_flight_packets, now);
        let start = path.blocked_until.map_or(start, |until| until.max(start));
        start + self.service() + self.one_way(path, now)
    }

    /// One packet's time at the path's rate (none before a rate is known).
    pub(super) fn service(&self) -> Duration {
        self.rate()
            .map_or(Duration::ZERO, |rate| Duration::from_secs_f64(1.0 / rate))
    }

    /// 1.25 × rate × min RTT, once a rate and a delay are known: what the path carries per
    /// round trip, with a quarter of headroom.
    pub(super) fn bdp_window(&self, path: &Path) -> Option<f64> {
        let rate = self.rate()?;
        let min_rtt = path.rtt.min().or(self.min_ack_delay)?;
        Some(WINDOW_GAIN * rate * min_rtt.as_secs_f64())
    }

    /// The window: [`Self::bdp_window`] (at least the startup window while in startup), within
    /// `ceiling`; the first burst until a rate and a delay are known.
    pub(super) fn window(&self, path: &Path, ceiling: f64) -> f64 {
        match self.bdp_window(path) {
            Some(bdp) => {
                let startup = if self.startup {
                    self.window_packets
                } else {
                    0.0
                };
                bdp.max(startup).max(MIN_WINDOW_PACKETS).min(ceiling)
            }
            None => self.window_packets.min(ceiling),
        }
    }

    /// The echo at `now` of the path's packet at `index`, if none sent later has been echoed.
    pub(super) fn note_echoed_index(&mut self, index: u64, now: Instant) {
        if self.latest_echoed.is_none_or(|(latest, _)| index > latest) {
            self.latest_echoed = Some((index, now));
        }
    }

    /// Counts an echo of a packet sent on this path at `sent` that came back on it at `now`,
    /// and takes one delivery-rate sample over the echoes since the last one that had come back
    /// when that packet was sent (a round trip's worth, as BBR's samples span one; at least the
    /// last [`RATE_SPAN_ACKS`] echoes, at most [`MAX_ECHO_HISTORY`] or the longer of
    /// [`RATE_WINDOW`] and twice this echo's round trip): the packets
    /// they echo over the longer of the time the echoes took to arrive and the time the packets
    /// took to send (the send interval bounds the sample by the rate the packets went out at,
    /// as in BBR's delivery-rate estimation, draft-cheng-iccrg-delivery-rate-estimation).
    /// The receiver echoes every arrival at once on its own path, so echoes come back spaced as
    /// the path delivered the packets. ACK ranges are no measure of that: a path's packets are
    /// also acknowledged through other paths' ACKs, in bursts that come when those paths'
    /// packets arrive.
    pub(super) fn record_echo(&mut self, sent: Instant, now: Instant) {
        self.echoes += 1;
        self.echo_history.push_back((now, self.echoes, sent));
        // The history reaches back a round trip, so the echo that had come back when this packet
        // was sent is still there on a path slower than the rate window.
        let horizon = RATE_WINDOW.max(2 * now.saturating_duration_since(sent));
        while self.echo_history.len() > MAX_ECHO_HISTORY
            || self.echo_history.len() > RATE_SPAN_ACKS + 1
                && self
                    .echo_history
                    .front()
                    .is_some_and(|&(at, _, _)| now.saturating_duration_since(at) > horizon)
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
pub(super) fn water_level(paths: &mut [(f64, f64)], packets: f64) -> Option<f64> {
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::super::super::sender::Path;
    use super::super::super::super::{Policy, SessionConfig};
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
    fn bunched_echoes_do_not_overstate_a_path_whose_round_trip_exceeds_the_rate_window() {
        // A 128 packets/s path with a round trip of 1.8 s and growing: it is sent 256/s, so a
        // queue builds, and its echoes come back 400 ms at a time (the session-quic
        // `direct+slow-relay` row, where 70 of the relay path's echoes arrived at one instant
        // after 436 ms of silence). A sample over the last 32 echoes of a bunch reads the send
        // rate; with the history cut at the 2 s rate window, shorter than the round trip, every
        // sample was one of those, and the rate read 256/s.
        let start = Instant::now();
        let mut estimate = Estimate::new(128.0);
        let bunch = 0.4;
        for packet in 0..1500u32 {
            let sent = f64::from(packet) / 256.0;
            let arrived = 1.8 + f64::from(packet) / 128.0;
            let echoed = (arrived / bunch).ceil() * bunch;
            estimate.record_echo(
                start + Duration::from_secs_f64(sent),
                start + Duration::from_secs_f64(echoed),
            );
        }
        let rate = estimate.rate().expect("sampled");
        assert!(rate <= 128.0 * WINDOW_GAIN, "{rate}");
        assert!(rate >= 100.0, "{rate}");
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
