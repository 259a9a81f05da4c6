//! TCP's sender rules for one direction of one lab TCP connection: Linux's defaults, modelled
//! where the bytes are received.
//!
//! # Design
//!
//! turmoil's TCP delivers every write one link latency after it was made, with no window and no
//! loss, so a gRPC baseline on it never paid what a TCP sender pays on a real path while
//! meshwire's QUIC paid all of it: the ring sweep's lossy cases dropped 1–2% of meshwire's
//! datagrams and none of gRPC's bytes, and a batch after idle left at full rate on gRPC while
//! meshwire's window had to carry it. [`TcpFlow`] adds the sender's rules, per segment of
//! [`super::MSS`] stream bytes, as Linux applies them by default (`net.ipv4.tcp_congestion_control =
//! cubic`, `tcp_slow_start_after_idle = 1`):
//! - **Window.** At most `cwnd` full segments' worth of bytes are unacknowledged (a short
//!   segment takes only its share: Linux sends the bytes that wait for the window as full
//!   segments). A segment the window has no room for leaves when the acknowledgement that makes
//!   room reaches the sender, one round trip after the segment it acknowledges was received.
//!   The first window is ten segments (RFC 6928).
//! - **Slow start**, one segment more per full segment acknowledged (byte counting, RFC 3465),
//!   until the first loss; no HyStart (which ends slow start earlier, on a rising RTT).
//! - **CUBIC** (RFC 9438, as Linux implements it) after it: on a loss the window falls to
//!   β = 0.7 of itself, once per recovery (losses of segments sent before the recovery began
//!   belong to it, as Linux's `high_seq`), then grows as `C·(t − K)³ + W_max` with C = 0.4, or by
//!   the Reno-friendly estimate where that is faster.
//! - **Loss.** Each segment is lost with the link's loss rate (i.i.d., drawn from a seeded RNG),
//!   or when the link's drop-tail queue has no room for it (the caller says so: the queue is the
//!   link's, shared by every connection in that direction, [`super::Serializer::offer_segment`]),
//!   and received one round trip after it would have been: fast retransmit on the duplicate
//!   acknowledgements of the segments after it. Bytes after it wait for it (TCP delivers in
//!   order). A lost last segment, which Linux finds by its tail-loss probe two round trips
//!   later or by its retransmission timeout, is also taken as recovered in one: generous to TCP.
//! - **Acknowledgements** reach the sender a round trip after the segment was received, plus the
//!   reverse link's jitter (a uniform draw from `[0, jitter]`, in order), as the lab delays
//!   meshwire's acknowledgements. Before, they came back at the bare round trip while the data
//!   direction was jittered, so on a 1 ms path with 10 ms of jitter TCP's window opened with no
//!   jitter at all while QUIC's waited for it.
//! - **Restart after idle** (RFC 7661's problem, Linux's `tcp_cwnd_restart`): a sender with
//!   nothing in flight that sent nothing for a retransmission timeout (here RTT + 200 ms, Linux's
//!   floor on the RTT variance) halves its window for every timeout of idleness, down to the
//!   first window.
//!
//! Not modelled, each in TCP's favour: HyStart, delayed acknowledgements, ACK clocking, the
//! queue time and serialization of a retransmission (which is never lost), the window's growth
//! while the application sends less than it (Linux grows only a window that limits) and CUBIC's
//! epoch shift after idle. (TCP's headers are charged on the link as QUIC's are:
//! [`super::SEGMENT_HEADER_BYTES`].) Against TCP:
//! the idle timeout is taken from the path's RTT without its queueing (Linux's smoothed RTT
//! includes it), so a sender whose RTT had grown with a queue restarts a little sooner here; and
//! a segment books its link when it leaves by its own connection's clock, so on a direction
//! shared by two connections (a 2-node ring's, where one connection's responses travel beside
//! the other's requests) a segment waiting for its window can hold the link ahead of the other
//! connection's bytes. The sweeps' rings of five have one data connection per direction.
//!
//! Time is in receive coordinates: the instant a segment would arrive with no window, which is
//! when turmoil hands it over (one latency after the write). A segment that must wait for a
//! slot arrives one round trip after the segment that held it was received. Nothing here reads
//! a clock.

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// The first window, in segments (RFC 6928, Linux's default).
pub const INITIAL_WINDOW: f64 = 10.0;
/// CUBIC's multiplicative decrease.
const BETA: f64 = 0.7;
/// CUBIC's scaling constant, in segments per second cubed.
const C: f64 = 0.4;
/// Linux's least retransmission timeout above the RTT (`TCP_RTO_MIN`).
const RTO_FLOOR: Duration = Duration::from_millis(200);
/// The fewest segments a window holds.
const MIN_WINDOW: f64 = 2.0;
/// Mixed into a flow's seed for its acknowledgements' jitter draws.
const ACK_JITTER_SEED: u64 = 0x6a69_7474_6572;

/// The bytes a full segment carries: the window counts in them.
const MSS: f64 = super::MSS as f64;

/// One segment sent and not yet acknowledged (or found lost).
#[derive(Debug, Clone, Copy)]
struct Unacked {
    /// When its acknowledgement (or, if lost, the duplicate acknowledgements that reveal the
    /// loss) lets the next segment leave, in receive coordinates.
    known_at: Instant,
    lost: bool,
    bytes: usize,
    /// Its place in the connection's sending order.
    seq: u64,
}

/// The sender's state of one direction of one connection (see the module's `# Design`).
#[derive(Debug, Clone)]
pub struct TcpFlow {
    rtt: Duration,
    loss: f64,
    rng: SmallRng,
    /// Congestion window, in segments.
    cwnd: f64,
    ssthresh: f64,
    /// CUBIC's window before its last reduction.
    w_max: f64,
    /// The start of CUBIC's current epoch, and its `K` in seconds.
    epoch: Option<(Instant, f64)>,
    /// The Reno-friendly estimate of the window.
    reno: f64,
    /// The last segment sent when the recovery in progress began: a loss of it or of one before
    /// it belongs to that recovery and does not cut the window again.
    recover: Option<u64>,
    /// Segments sent so far (the next one's `seq`).
    sent: u64,
    unacked: VecDeque<Unacked>,
    /// Bytes of the unacknowledged segments.
    in_flight: usize,
    /// When the last segment was offered.
    last_sent: Option<Instant>,
    /// The most extra delay an acknowledgement draws on the reverse link.
    ack_jitter: Duration,
    /// The acknowledgements' jitter draws (apart from the losses', so jitter leaves them as
    /// they were).
    ack_rng: SmallRng,
    /// When the latest acknowledgement (or loss) so far reaches the sender: none arrives before
    /// it, as the reverse link keeps its order.
    last_known: Option<Instant>,
}

impl TcpFlow {
    /// A fresh connection's sender on a path of round trip `rtt` that loses `loss` of its
    /// segments, losses drawn from `seed`.
    pub fn new(rtt: Duration, loss: f64, seed: u64) -> Self {
        Self {
            rtt,
            loss: loss.clamp(0.0, 1.0),
            rng: SmallRng::seed_from_u64(seed),
            cwnd: INITIAL_WINDOW,
            ssthresh: f64::INFINITY,
            w_max: 0.0,
            epoch: None,
            reno: INITIAL_WINDOW,
            recover: None,
            sent: 0,
            unacked: VecDeque::new(),
            in_flight: 0,
            last_sent: None,
            ack_jitter: Duration::ZERO,
            ack_rng: SmallRng::seed_from_u64(seed ^ ACK_JITTER_SEED),
            last_known: None,
        }
    }

    /// This flow with its acknowledgements delayed by up to `jitter` each on the reverse link,
    /// drawn uniformly and kept in order, as the lab's links delay every datagram (meshwire's
    /// acknowledgements included).
    pub fn with_ack_jitter(mut self, jitter: Duration) -> Self {
        self.ack_jitter = jitter;
        self
    }

    /// The congestion window, in segments.
    pub fn window(&self) -> f64 {
        self.cwnd
    }

    /// When a segment of `len` bytes that would arrive at `offered` with no window does arrive:
    /// once the window has room for it, and not before the segment sent before it. Applies every
    /// acknowledgement and loss known by then. The window counts bytes (a full segment's worth
    /// per segment of window), so a short segment takes only its share: Linux sends what waits
    /// for the window as full segments.
    pub fn send(&mut self, offered: Instant, len: usize) -> Instant {
        // Segments leave in order: none before the one sent before it.
        let mut at = self.last_sent.map_or(offered, |last| last.max(offered));
        self.learn_until(at);
        if self.unacked.is_empty() {
            self.restart_after_idle(at);
        }
        while (self.in_flight + len) as f64 > self.cwnd * MSS {
            let Some(oldest) = self.unacked.pop_front() else {
                break;
            };
            at = at.max(oldest.known_at);
            self.learn(oldest);
            self.learn_until(at);
        }
        self.last_sent = Some(at);
        at
    }

    /// Records the segment of `len` bytes just sent (at what [`Self::send`] returned) that its
    /// link delivers at `delivered` (or would have, had its queue not `dropped` it); returns when
    /// the receiver has it: then, or a round trip later if it is lost, to the link's random loss
    /// or to the queue.
    pub fn delivered(&mut self, len: usize, delivered: Instant, dropped: bool) -> Instant {
        let lost = dropped || (self.loss > 0.0 && self.rng.random_bool(self.loss));
        let jitter = if self.ack_jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(
                self.ack_rng
                    .random_range(0..=self.ack_jitter.as_nanos().min(u128::from(u64::MAX)) as u64),
            )
        };
        let known_at = self
            .last_known
            .map_or(delivered + self.rtt + jitter, |last| {
                last.max(delivered + self.rtt + jitter)
            });
        self.last_known = Some(known_at);
        self.unacked.push_back(Unacked {
            known_at,
            lost,
            bytes: len,
            seq: self.sent,
        });
        self.sent += 1;
        self.in_flight += len;
        if lost {
            known_at
        } else {
            delivered
        }
    }

    fn learn_until(&mut self, now: Instant) {
        while let Some(&oldest) = self.unacked.front() {
            if oldest.known_at > now {
                break;
            }
            self.unacked.pop_front();
            self.learn(oldest);
        }
    }

    fn learn(&mut self, segment: Unacked) {
        self.in_flight = self.in_flight.saturating_sub(segment.bytes);
        if segment.lost {
            self.on_loss(segment.seq);
        } else {
            self.on_ack(segment.known_at, segment.bytes as f64 / MSS);
        }
    }

    /// `segments` (full ones, a fraction for a short one: appropriate byte counting, RFC 3465)
    /// acknowledged at `at`.
    fn on_ack(&mut self, at: Instant, segments: f64) {
        if self.cwnd < self.ssthresh {
            self.cwnd += segments;
            return;
        }
        let (start, k) = *self.epoch.get_or_insert_with(|| {
            let k = ((self.w_max - self.cwnd).max(0.0) / C).cbrt();
            (at, k)
        });
        let t = at.saturating_duration_since(start).as_secs_f64() + self.rtt.as_secs_f64();
        let target = (C * (t - k).powi(3) + self.w_max).clamp(self.cwnd, 1.5 * self.cwnd);
        self.reno += segments * 3.0 * (1.0 - BETA) / (1.0 + BETA) / self.cwnd;
        self.cwnd = (self.cwnd + segments * (target - self.cwnd) / self.cwnd).max(self.reno);
    }

    /// The segment `seq` was lost. One reduction per recovery, as Linux's: losses of segments
    /// sent before the recovery began (up to `recover`) belong to it.
    fn on_loss(&mut self, seq: u64) {
        if self.recover.is_some_and(|recover| seq <= recover) {
            return;
        }
        // Fast convergence (RFC 9438 §4.7): a flow losing below its last maximum yields more.
        self.w_max = if self.cwnd < self.w_max {
            self.cwnd * (1.0 + BETA) / 2.0
        } else {
            self.cwnd
        };
        self.cwnd = (self.cwnd * BETA).max(MIN_WINDOW);
        self.ssthresh = self.cwnd;
        self.reno = self.cwnd;
        self.epoch = None;
        self.recover = Some(self.sent.saturating_sub(1));
    }

    /// Linux's `tcp_cwnd_restart`: one halving per retransmission timeout of idleness, down to
    /// the first window.
    fn restart_after_idle(&mut self, now: Instant) {
        let Some(last) = self.last_sent else {
            return;
        };
        let rto = self.rtt + RTO_FLOOR;
        let mut idle = now.saturating_duration_since(last);
        if idle <= rto {
            return;
        }
        // Slow start takes the window back up to three quarters of what it was.
        self.ssthresh = self.ssthresh.max(self.cwnd * 0.75);
        let restart = INITIAL_WINDOW.min(self.cwnd);
        while idle > rto && self.cwnd > restart {
            self.cwnd = (self.cwnd / 2.0).max(restart);
            idle -= rto;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SEGMENT: usize = super::super::MSS;

    /// Sends `segments` offered at `start` over a link that delivers each one `one_way` after it
    /// leaves and serializes one per `spacing`; returns when each is received. Checks that no
    /// segment leaves before the one sent before it.
    fn run(
        flow: &mut TcpFlow,
        start: Instant,
        segments: usize,
        one_way: Duration,
        spacing: Duration,
    ) -> Vec<Instant> {
        let mut busy = start;
        let mut previous = start;
        (0..segments)
            .map(|_| {
                let sent = flow.send(start + one_way, SEGMENT);
                assert!(sent >= previous, "segments leave in order");
                previous = sent;
                busy = busy.max(sent) + spacing;
                flow.delivered(SEGMENT, busy, false)
            })
            .collect()
    }

    /// Acknowledgements draw the reverse link's jitter: the segment after the first window
    /// leaves between one round trip and one round trip plus the jitter after the first segment
    /// was received, and later than the bare round trip for some draws.
    #[test]
    fn acknowledgements_draw_the_reverse_links_jitter() {
        let start = Instant::now();
        let (rtt, jitter) = (20 * MS, 10 * MS);
        let mut delayed = 0;
        for seed in 0..20 {
            let mut flow = TcpFlow::new(rtt, 0.0, seed).with_ack_jitter(jitter);
            let received = run(&mut flow, start, 11, 10 * MS, Duration::ZERO);
            let waited = received[10] - received[0];
            assert!(waited >= rtt && waited <= rtt + jitter, "{waited:?}");
            if waited > rtt + MS {
                delayed += 1;
            }
        }
        assert!(delayed > 0, "no draw delayed an acknowledgement");
    }

    /// On a lossless 50 ms path with room for 1000 segments in flight, 150 segments take four
    /// round trips of slow start (10, 20, 40, 80), not one.
    #[test]
    fn slow_start_doubles_the_window_each_round_trip() {
        let start = Instant::now();
        let rtt = 100 * MS;
        let mut flow = TcpFlow::new(rtt, 0.0, 1);
        let received = run(&mut flow, start, 150, 50 * MS, Duration::ZERO);
        let rounds: Vec<usize> = (0..4)
            .map(|round| {
                let from = start + 50 * MS + rtt * round;
                received
                    .iter()
                    .filter(|&&at| at >= from && at < from + rtt)
                    .count()
            })
            .collect();
        assert_eq!(rounds, [10, 20, 40, 80]);
        assert_eq!(flow.window(), 10.0 + 150.0 - 80.0);
    }

    /// A lost segment arrives a round trip late, the window falls to 0.7 of itself once per
    /// loss episode (two losses in one round trip cut once), and grows again afterwards.
    #[test]
    fn a_loss_costs_a_round_trip_and_cuts_the_window_once() {
        let start = Instant::now();
        let rtt = 20 * MS;
        let mut flow = TcpFlow::new(rtt, 1.0, 1);
        for _ in 0..2 {
            let sent = flow.send(start, SEGMENT);
            assert_eq!(flow.delivered(SEGMENT, sent, false), sent + rtt);
        }
        flow.loss = 0.0;
        let sent = flow.send(start + rtt + MS, SEGMENT);
        assert_eq!(flow.delivered(SEGMENT, sent, false), sent);
        assert!((flow.window() - INITIAL_WINDOW * BETA).abs() < 1e-9);
        let cut = flow.window();
        run(&mut flow, start + rtt + MS, 500, 10 * MS, MS / 10);
        assert!(flow.window() > cut, "{} after {cut}", flow.window());
    }

    /// Short segments take their share of the window: thirty 500-byte segments fit the first
    /// window of ten full ones, the thirty-first waits a round trip.
    #[test]
    fn short_segments_take_their_share_of_the_window() {
        let start = Instant::now();
        let rtt = 20 * MS;
        let mut flow = TcpFlow::new(rtt, 0.0, 1);
        let short = SEGMENT / 3;
        for _ in 0..30 {
            let sent = flow.send(start, short);
            assert_eq!(sent, start);
            flow.delivered(short, sent, false);
        }
        assert_eq!(flow.send(start, short), start + rtt);
    }

    /// A sender idle for three retransmission timeouts halves its window three times, down to
    /// the first window; one that paused for less keeps it.
    #[test]
    fn an_idle_sender_restarts_from_the_first_window() {
        let start = Instant::now();
        let rtt = 10 * MS;
        let mut flow = TcpFlow::new(rtt, 0.0, 1);
        let received = run(&mut flow, start, 300, 5 * MS, Duration::ZERO);
        // Every acknowledgement is in by then; nothing is left in flight.
        let resumed = *received.last().unwrap() + 50 * MS;
        assert_eq!(flow.send(resumed, SEGMENT), resumed);
        let grown = flow.window();
        assert!(grown > 100.0, "{grown}");
        let mut paused = flow.clone();
        let _ = paused.send(resumed + 100 * MS, SEGMENT);
        assert_eq!(paused.window(), grown, "a pause shorter than a timeout");
        let mut idle = flow.clone();
        let _ = idle.send(resumed + 3 * (rtt + RTO_FLOOR) + 2 * MS, SEGMENT);
        assert_eq!(idle.window(), (grown / 8.0).max(INITIAL_WINDOW));
        let _ = flow.send(resumed + Duration::from_secs(60), SEGMENT);
        assert_eq!(flow.window(), INITIAL_WINDOW);
    }

    /// At a given loss rate the share of segments lost follows it (seeded, so exactly
    /// reproducible).
    #[test]
    fn losses_follow_the_link_rate() {
        let start = Instant::now();
        let mut flow = TcpFlow::new(2 * MS, 0.02, 7);
        let mut late = 0;
        for index in 0..20_000u32 {
            let at = start + MS * index;
            let sent = flow.send(at, SEGMENT);
            if flow.delivered(SEGMENT, sent, false) > sent {
                late += 1;
            }
        }
        assert!((300..500).contains(&late), "{late} of 20000 lost at 2%");
    }
}
