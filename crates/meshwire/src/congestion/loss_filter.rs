//! Which losses are congestion: the sans-IO loss filter [`super::Meshwire`] runs beside CUBIC
//! (the rules are in the parent module's `# Design`).

use std::time::{Duration, Instant};

/// A queue is present when the RTT exceeds the minimum by this fraction of the minimum...
pub const QUEUE_DELAY_FRACTION: f64 = 0.125;
/// ...and by at least this much (timer and ACK-delay noise on short paths).
pub const QUEUE_DELAY_FLOOR: Duration = Duration::from_millis(2);
/// Losses above this fraction of a round trip's sent bytes are congestion whatever the RTT.
pub const LOSS_RATE_CEILING: f64 = 0.05;
/// How long the smoothed RTT's least value is remembered as the queue-free baseline (two such
/// windows are kept, so the baseline covers between one and two of them).
pub const BASELINE_WINDOW: Duration = Duration::from_secs(10);
/// How far above the floor plus [`LOSS_RATE_CEILING`] a sample's loss rate may lie by chance, in
/// standard deviations of a binomial sample of its size at the floor's rate. The floor is the
/// least of up to a few hundred samples, so on a path that loses a large share at random it
/// sits about three of the samples' deviations below the path's true rate, and each sample
/// scatters around that rate: with no margin a 10%-loss path (floor read near 5%, ceiling near
/// 10%) called a third of its samples congestion, and in `session-quic`'s `losses-0.01+0.1`
/// (seed 2) the relay connection's window fell to 8 KB, 0.654 of the ideal; with a margin of
/// 2 it still called one in twenty (`random_loss_scattering_around_a_high_floor_is_not_congestion`:
/// 2,317, 189 and 0 congestion losses at 0, 2 and 5). At a floor near zero (a policer, a
/// drop-tail queue, a path that loses 1%: a 300-packet sample with no loss is common there) the
/// margin is near zero too, so what the ceiling guards against is unchanged.
pub const LOSS_NOISE_DEVIATIONS: f64 = 5.0;
/// RTT samples the smoothed RTT must absorb before it enters the queue-free baseline (and before
/// any queue is read from the RTT). quinn's smoothed RTT starts as the first sample, unsmoothed;
/// on a jittered path that one sample sits anywhere in the jitter, and a baseline that took it
/// read the smoothed RTT's ordinary level as a queue for the baseline window's life (a 4 ms path
/// with up to 5 ms of jitter per datagram: baseline 5 ms from the handshake, smoothed RTT 8 ms
/// under load, every random loss congestion). After 16 samples the first one weighs
/// (7/8)^16 ≈ 0.12 in the smoothed RTT; they arrive within the first two or three round trips,
/// when a new connection has not had time to build a queue.
pub const BASELINE_SETTLING_SAMPLES: u32 = 16;
/// Lost packets the samples of [`LossFilter::random_loss`] must hold, in sum, before
/// their rate excuses losses at a queue: fewer say little about the rate (three losses in 300
/// packets fit a path that loses anything from 0.2% to 3%).
pub const RANDOM_LOSS_MIN_LOSSES: u64 = 3;
/// A random loss rate below this excuses nothing: so rare a loss costs CUBIC little, and a
/// lossless path's estimate, made of the few samples an overflow left losses in, stays at zero.
pub const RANDOM_LOSS_MIN_RATE: f64 = 0.001;
/// The packet size samples are counted in (as [`MIN_SAMPLE_BYTES`]).
const SAMPLE_PACKET_BYTES: u64 = 1200;
/// Losses detected at once, of at least this many packets (of [`SAMPLE_PACKET_BYTES`]) and more
/// than the path's random loss rate explains among the packets that acknowledgement covered
/// (acknowledged and lost, with [`LOSS_NOISE_DEVIATIONS`] of chance), are an overflow:
/// congestion, whatever the RTT shows. A drop-tail queue that a burst overruns drops the
/// burst's tail in one run, which one acknowledgement reveals; losses that strike packets
/// independently spread over acknowledgements as the rate says. On a 1 ms, 354 Mbit/s lab path
/// with 4 ms of jitter, whose queue (88 KB, 2 ms) never showed in the jittered RTT, a 108 KB
/// batch sent in one burst lost 10–60 packets at once, batch after batch; the loss floor learnt
/// those overflows as the path's own loss (17%) and no loss was ever congestion (ring sweep,
/// seed 7, case 9: a hop 4.7 times its floor).
pub const BURST_LOSS_PACKETS: u64 = 8;
/// Sent bytes a loss-rate sample must hold before its rate is trusted: 300 packets of 1200 B.
/// Below about 200 packets, random loss of 1–2% exceeds [`LOSS_RATE_CEILING`] in a sample too
/// often to tell it from congestion (binomial: 1.5% of 100-packet samples at 2% loss).
pub const MIN_SAMPLE_BYTES: u64 = 300 * 1200;
/// A sample that has not reached [`MIN_SAMPLE_BYTES`] after this many minimum RTTs, and at least
/// [`QUIET_SAMPLE_TIME`], is closed as quiet: its few packets say nothing new, and an old loss
/// rate fades. A sender below about 3 Mbit/s never fills a sample, so only the RTT (a queue)
/// tells it congestion from random loss.
const QUIET_SAMPLE_ROUNDS: u32 = 8;
/// See [`QUIET_SAMPLE_ROUNDS`].
const QUIET_SAMPLE_TIME: Duration = Duration::from_secs(1);

/// Queue-free samples in sum, for [`LossFilter::random_loss`].
#[derive(Debug, Clone, Copy, Default)]
struct RandomLoss {
    sent: u64,
    lost: u64,
    samples: u32,
    /// Samples that lost nothing.
    lossless: u32,
}

impl RandomLoss {
    fn add(&mut self, sent: u64, lost: u64) {
        self.sent = self.sent.saturating_add(sent);
        self.lost = self.lost.saturating_add(lost);
        self.samples = self.samples.saturating_add(1);
        if lost == 0 {
            self.lossless = self.lossless.saturating_add(1);
        }
    }

    /// Adds `lost` bytes to the last sample added, which had lost `before` bytes until now.
    fn add_late(&mut self, lost: u64, before: u64) {
        self.lost = self.lost.saturating_add(lost);
        if before == 0 && lost > 0 {
            self.lossless = self.lossless.saturating_sub(1);
        }
    }
}

/// The sans-IO part: which losses are congestion, from RTTs and per-round byte counts.
#[derive(Debug, Clone, Default)]
pub struct LossFilter {
    round_start: Option<Instant>,
    round_sent: u64,
    round_lost: u64,
    /// Bytes the acknowledgement frame being processed has acknowledged so far.
    frame_acked: u64,
    /// Bytes the last whole acknowledgement frame acknowledged.
    last_frame_acked: u64,
    last_round_rate: f64,
    /// Bytes the last whole sample held.
    last_round_sent: u64,
    /// Bytes the last whole sample lost.
    last_round_lost: u64,
    min_rtt: Option<Duration>,
    latest_rtt: Duration,
    /// The smoothed RTT's least value in the current and the previous [`BASELINE_WINDOW`].
    baseline: [Option<Duration>; 2],
    baseline_start: Option<Instant>,
    /// The least loss rate of a whole sample whose losses more rate did not buy (see
    /// [`LossFilter::loss_floor`]), in the current and the previous [`BASELINE_WINDOW`].
    loss_floor: [Option<f64>; 2],
    /// Every whole sample's bytes sent and lost, and how many lost nothing, in the current and the
    /// previous [`BASELINE_WINDOW`]: see [`LossFilter::random_loss`].
    random_loss: [RandomLoss; 2],
    /// The send and delivery rates of the last whole sample, bytes per second.
    last_rates: Option<(f64, f64)>,
    congested: bool,
    /// RTT samples seen, up to [`BASELINE_SETTLING_SAMPLES`] and a little beyond.
    rtt_samples: u32,
    /// Which of `random_loss` holds the last whole sample, while that sample is the last one
    /// closed (a quiet sample closed after it, or two window turns, end it).
    last_whole: Option<usize>,
}

impl LossFilter {
    /// Records an RTT sample: `latest` the path's smoothed RTT, `min` its minimum. Closes the
    /// loss-rate sample once it is a minimum RTT long and holds [`MIN_SAMPLE_BYTES`], or as quiet
    /// (after `QUIET_SAMPLE_ROUNDS` minimum RTTs and at least `QUIET_SAMPLE_TIME`).
    pub fn on_rtt(&mut self, now: Instant, latest: Duration, min: Duration) {
        self.latest_rtt = latest;
        match self.baseline_start {
            Some(start) if now.saturating_duration_since(start) < BASELINE_WINDOW => {}
            _ => {
                self.baseline = [None, self.baseline[0]];
                self.loss_floor = [None, self.loss_floor[0]];
                self.random_loss = [RandomLoss::default(), self.random_loss[0]];
                self.last_whole = self
                    .last_whole
                    .and_then(|window| (window == 0).then_some(1));
                self.baseline_start = Some(now);
            }
        }
        self.rtt_samples = self.rtt_samples.saturating_add(1);
        if self.rtt_samples > BASELINE_SETTLING_SAMPLES {
            self.baseline[0] = Some(self.baseline[0].map_or(latest, |least| least.min(latest)));
        }
        if !min.is_zero() {
            self.min_rtt = Some(self.min_rtt.map_or(min, |current| current.min(min)));
        }
        let round = self.min_rtt.unwrap_or(latest).max(Duration::from_millis(1));
        let elapsed = self
            .round_start
            .map(|start| now.saturating_duration_since(start));
        let close = match elapsed {
            None => true,
            Some(elapsed) if elapsed < round => false,
            Some(elapsed) => {
                self.round_sent >= MIN_SAMPLE_BYTES
                    || elapsed >= (round * QUIET_SAMPLE_ROUNDS).max(QUIET_SAMPLE_TIME)
            }
        };
        if close {
            if self.round_sent >= MIN_SAMPLE_BYTES {
                let rate = self.round_lost as f64 / self.round_sent as f64;
                self.last_round_rate = rate;
                self.last_round_sent = self.round_sent;
                self.last_round_lost = self.round_lost;
                let seconds = elapsed.unwrap_or(round).as_secs_f64().max(1e-6);
                let sent = self.round_sent as f64 / seconds;
                let delivered = sent * (1.0 - rate);
                // These losses were not bought by more rate when the sample was sent no faster
                // than the one before, or when the path delivered at least half of what it was
                // sent beyond it (a path at its limit delivers no more however much more it
                // gets): the path loses this share whatever the sender does. A queue in the RTT
                // rules it out: its losses may be the overflow of an earlier, faster sample (a
                // loss is detected a round trip after its packet left).
                let independent = !self.queue_present()
                    && self.last_rates.is_some_and(|(last_sent, last_delivered)| {
                        sent <= last_sent || delivered - last_delivered >= (sent - last_sent) / 2.0
                    });
                if independent {
                    self.loss_floor[0] = Some(self.loss_floor[0].map_or(rate, |f| f.min(rate)));
                }
                self.random_loss[0].add(self.round_sent, self.round_lost);
                self.last_whole = Some(0);
                self.last_rates = Some((sent, delivered));
            } else if self.round_start.is_some() {
                self.last_whole = None;
                // A quiet sample says nothing new; an old rate fades.
                self.last_round_rate /= 2.0;
                self.last_round_lost /= 2;
            }
            self.round_start = Some(now);
            self.round_sent = 0;
            self.round_lost = 0;
        }
    }

    /// Records bytes sent.
    pub fn on_sent(&mut self, bytes: u64) {
        self.round_sent = self.round_sent.saturating_add(bytes);
    }

    /// Whether the RTT shows a standing queue.
    pub fn queue_present(&self) -> bool {
        let Some(min) = self.min_rtt else {
            return false;
        };
        if self.rtt_samples <= BASELINE_SETTLING_SAMPLES {
            return false;
        }
        // The smoothed RTT's own recent least value, not the path's minimum: jitter and timer
        // granularity keep the smoothed RTT above the minimum all the time, a queue only while it
        // stands.
        let baseline = self.baseline.iter().flatten().min().copied().unwrap_or(min);
        let threshold = min.mul_f64(QUEUE_DELAY_FRACTION).max(QUEUE_DELAY_FLOOR);
        self.latest_rtt.saturating_sub(baseline.max(min)) >= threshold
    }

    /// The loss rate the decision uses: the last whole sample's, or the current sample's once it
    /// holds [`MIN_SAMPLE_BYTES`], whichever is larger.
    pub fn loss_rate(&self) -> f64 {
        self.loss_sample().0
    }

    /// [`LossFilter::loss_rate`] and the bytes its sample held.
    fn loss_sample(&self) -> (f64, u64) {
        let current = if self.round_sent >= MIN_SAMPLE_BYTES {
            self.round_lost as f64 / self.round_sent as f64
        } else {
            0.0
        };
        if current >= self.last_round_rate {
            (current, self.round_sent)
        } else {
            (self.last_round_rate, self.last_round_sent)
        }
    }

    /// Whether the loss rate lies above the floor by more than [`LOSS_RATE_CEILING`] and what
    /// chance explains ([`LOSS_NOISE_DEVIATIONS`]).
    fn loss_exceeds_floor(&self) -> bool {
        let floor = self.loss_floor();
        let (rate, sent) = self.loss_sample();
        let packets = (sent / SAMPLE_PACKET_BYTES).max(1) as f64;
        let noise = LOSS_NOISE_DEVIATIONS * (floor * (1.0 - floor) / packets).sqrt();
        rate > floor + LOSS_RATE_CEILING + noise
    }

    /// The share of packets the path loses at random, from every whole sample of the last 10–20 s,
    /// once they hold [`RANDOM_LOSS_MIN_LOSSES`] lost packets; 0 before, and 0 below
    /// [`RANDOM_LOSS_MIN_RATE`]. It is the lesser of two estimates: their lost bytes over their
    /// sent bytes, and the rate at which a path losing packets independently leaves as many
    /// samples without a loss as there were (the Poisson zero count, `-ln(share of samples
    /// without loss) / packets per sample`). A queue's overflows come in bursts, a few samples
    /// losing many packets and the rest none: they raise the first estimate and hardly the
    /// second. Samples at a queue count too: on a path with jitter of several times its RTT
    /// every sample shows one, and only they can tell its random loss. Where the floor is the
    /// least sample (a guard against overdriving a policer), this is the rate losses at a queue
    /// are measured against.
    pub fn random_loss(&self) -> f64 {
        let [a, b] = &self.random_loss;
        let sum = RandomLoss {
            sent: a.sent.saturating_add(b.sent),
            lost: a.lost.saturating_add(b.lost),
            samples: a.samples + b.samples,
            lossless: a.lossless + b.lossless,
        };
        if sum.lost < RANDOM_LOSS_MIN_LOSSES * SAMPLE_PACKET_BYTES || sum.sent == 0 {
            return 0.0;
        }
        let pooled = sum.lost as f64 / sum.sent as f64;
        let rate = if sum.lossless == 0 {
            pooled
        } else {
            let packets_per_sample =
                sum.sent as f64 / SAMPLE_PACKET_BYTES as f64 / sum.samples as f64;
            let zero_count = -(sum.lossless as f64 / sum.samples as f64).ln() / packets_per_sample;
            pooled.min(zero_count)
        };
        if rate < RANDOM_LOSS_MIN_RATE {
            0.0
        } else {
            rate
        }
    }

    /// Whether the losses at a queue are more than the path's random loss explains: the current
    /// sample and the last whole one together (a loss is detected a round trip after its packet
    /// left, so the current sample alone may hold a loss and hardly any packets) lost more packets
    /// than [`LossFilter::random_loss`] predicts for their size plus [`LOSS_NOISE_DEVIATIONS`]
    /// of chance. On a path with no random loss seen any loss is more.
    fn queue_losses_exceed_random(&self) -> bool {
        let random = self.random_loss();
        if random <= 0.0 {
            return true;
        }
        let sent = self.round_sent.saturating_add(self.last_round_sent);
        let lost = self.round_lost.saturating_add(self.last_round_lost);
        let expected = random * (sent / SAMPLE_PACKET_BYTES) as f64;
        (lost / SAMPLE_PACKET_BYTES) as f64 > expected + LOSS_NOISE_DEVIATIONS * expected.sqrt()
    }

    /// The share of packets the path loses whatever the send rate: the least loss rate of a
    /// recent sample sent with no queue in the RTT and either no faster than the one before or
    /// with at least half of its extra rate delivered (0 while there is none).
    pub fn loss_floor(&self) -> f64 {
        self.loss_floor
            .iter()
            .flatten()
            .copied()
            .reduce(f64::min)
            .unwrap_or(0.0)
    }

    /// Records bytes an acknowledgement frame acknowledged (one call per acknowledged packet).
    pub fn on_acked(&mut self, bytes: u64) {
        self.frame_acked = self.frame_acked.saturating_add(bytes);
    }

    /// Records the end of an acknowledgement frame: the losses detected next are set against
    /// what it acknowledged ([`BURST_LOSS_PACKETS`]).
    pub fn on_end_acks(&mut self) {
        self.last_frame_acked = std::mem::take(&mut self.frame_acked);
    }

    /// Records a loss of `lost_bytes` detected at once (0: an ECN mark), the last of whose packets
    /// was sent at `sent`, and says whether it is congestion.
    ///
    /// The loss counts in the sample its packets were sent in: one sent before the current sample
    /// began counts in the last whole sample (a loss is detected a round trip or more after its
    /// packet left, often after its sample closed; why it matters is in the parent module's
    /// `# Design`).
    ///
    /// An overflow burst ([`BURST_LOSS_PACKETS`]) is congestion and stays out of the samples'
    /// loss counts: it is no part of the path's random loss (the floor and the random rate would
    /// learn it), and it gets its own congestion response (in the counts, every loss after it
    /// would read as congestion for as long as its sample is the last one).
    pub fn on_loss(&mut self, sent: Instant, lost_bytes: u64, persistent: bool) -> bool {
        let burst = self.is_burst(lost_bytes);
        if !burst {
            let late = self
                .last_whole
                .filter(|_| self.round_start.is_some_and(|start| sent < start));
            match late {
                Some(window) => {
                    self.random_loss[window].add_late(lost_bytes, self.last_round_lost);
                    self.last_round_lost = self.last_round_lost.saturating_add(lost_bytes);
                    self.last_round_rate =
                        self.last_round_lost as f64 / self.last_round_sent.max(1) as f64;
                }
                None => self.round_lost = self.round_lost.saturating_add(lost_bytes),
            }
        }
        let congestion = persistent
            || burst
            || lost_bytes == 0
            || (self.queue_present() && self.queue_losses_exceed_random())
            || self.loss_exceeds_floor();
        self.congested |= congestion;
        congestion
    }

    /// Whether `lost_bytes` detected at once are an overflow ([`BURST_LOSS_PACKETS`]). Before the
    /// first whole sample there is no random loss rate, and any run counts: on a path that loses
    /// 10%, an acknowledgement of 40 packets reveals eight or more losses in 4% of cases, but
    /// there the next samples read as congestion anyway until the loss floor is known
    /// ([`LOSS_RATE_CEILING`]).
    fn is_burst(&self, lost_bytes: u64) -> bool {
        let lost = lost_bytes / SAMPLE_PACKET_BYTES;
        let covered = self.last_frame_acked.saturating_add(lost_bytes) / SAMPLE_PACKET_BYTES;
        let expected = self.random_loss() * covered as f64;
        lost >= BURST_LOSS_PACKETS
            && lost as f64 > expected + LOSS_NOISE_DEVIATIONS * expected.sqrt()
    }

    /// Whether a loss floor has been measured (a sample whose losses more rate did not buy).
    pub fn calibrated(&self) -> bool {
        self.loss_floor.iter().any(Option::is_some)
    }

    /// Whether any congestion has been seen on this connection.
    pub fn congested(&self) -> bool {
        self.congested
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A loss whose packets were sent in the current sample.
    fn lose(filter: &mut LossFilter, lost_bytes: u64, persistent: bool) -> bool {
        let sent = filter.round_start.unwrap_or_else(Instant::now);
        filter.on_loss(sent, lost_bytes, persistent)
    }

    /// A filter that has seen `rounds` round trips of `sent` bytes at RTT `rtt` (minimum `min`)
    /// with `lost` bytes lost in each.
    fn filter_after(rounds: u32, sent: u64, lost: u64, rtt: Duration, min: Duration) -> LossFilter {
        let start = Instant::now();
        let mut filter = LossFilter::default();
        for round in 0..rounds {
            filter.on_rtt(start + min * round, rtt, min);
            filter.on_sent(sent);
            filter.round_lost += lost;
        }
        filter.on_rtt(start + min * rounds, rtt, min);
        filter
    }

    proptest! {
        /// Random loss below the ceiling on a path without a queue never reaches CUBIC.
        #[test]
        fn random_loss_without_a_queue_is_not_congestion(
            min_ms in 1u64..500,
            permille in 0u64..45,
            sent in MIN_SAMPLE_BYTES..10_000_000,
        ) {
            let min = MS * min_ms as u32;
            let lost = sent * permille / 1000;
            let mut filter = filter_after(4, sent, lost, min, min);
            prop_assert!(!lose(&mut filter, 1200, false));
            prop_assert!(!filter.congested());
        }

        /// A queue standing above the queue-free baseline (the smoothed RTT above its recent
        /// least value by the threshold) makes any loss congestion on a path that has shown no
        /// random loss.
        #[test]
        fn loss_at_a_standing_queue_is_congestion(
            min_ms in 1u64..500,
            extra_permille in 0u64..2000,
        ) {
            let min = MS * min_ms as u32;
            let threshold = min.mul_f64(QUEUE_DELAY_FRACTION).max(QUEUE_DELAY_FLOOR);
            let latest = min + threshold + threshold.mul_f64(extra_permille as f64 / 1000.0);
            let mut filter = filter_after(BASELINE_SETTLING_SAMPLES, 100_000, 0, min, min);
            filter.on_rtt(Instant::now() + min * (BASELINE_SETTLING_SAMPLES + 1), latest, min);
            prop_assert!(filter.queue_present());
            prop_assert!(lose(&mut filter, 1200, false));
            prop_assert!(filter.congested());
        }

        /// Jitter or timer granularity that keeps the smoothed RTT above the minimum all along is
        /// in the baseline, not a queue: random loss there is still not congestion.
        #[test]
        fn a_steady_rtt_above_the_minimum_is_not_a_queue(
            min_ms in 1u64..500,
            offset_ms in 0u64..50,
            permille in 0u64..45,
        ) {
            let min = MS * min_ms as u32;
            let steady = min + MS * offset_ms as u32;
            let mut filter = filter_after(4, 100_000, 100_000 * permille / 1000, steady, min);
            prop_assert!(!filter.queue_present());
            prop_assert!(!lose(&mut filter, 1200, false));
        }

        /// Loss bought by more rate never lowers the bar: a sender that keeps sending faster while
        /// the path delivers the same (a policer, a full shallow queue) loses more than the
        /// ceiling and that is congestion.
        #[test]
        fn loss_bought_by_more_rate_is_congestion(
            min_ms in 1u64..500,
            limit in MIN_SAMPLE_BYTES..10_000_000,
            growth_permille in 1100u64..2000,
        ) {
            let min = MS * min_ms as u32;
            let start = Instant::now();
            let mut filter = LossFilter::default();
            let mut sent = limit;
            for round in 0..6u32 {
                filter.on_rtt(start + min * round, min, min);
                filter.on_sent(sent);
                filter.round_lost += sent - limit;
                sent = sent * growth_permille / 1000;
            }
            filter.on_rtt(start + min * 6, min, min);
            prop_assert!(filter.loss_floor() <= 0.0 + f64::EPSILON);
            prop_assert!(lose(&mut filter, 1200, false));
        }

        /// Losing more than the ceiling of a sample is congestion, queue or not, until the path
        /// shows that it loses that share whatever the rate (random loss above the ceiling): a
        /// sample sent no faster sets the floor, and then the same loss is not congestion.
        #[test]
        fn heavy_loss_is_congestion_until_the_path_shows_it_as_its_floor(
            min_ms in 1u64..500,
            permille in 60u64..1000,
            sent in MIN_SAMPLE_BYTES..10_000_000,
        ) {
            let min = MS * min_ms as u32;
            for rounds in [1, 4] {
                let mut filter = filter_after(rounds, sent, sent * permille / 1000, min, min);
                let floor = filter.loss_floor();
                if rounds == 1 {
                    prop_assert!(lose(&mut filter, 1200, false));
                } else {
                    prop_assert!((floor - permille as f64 / 1000.0).abs() < 0.01, "floor {}", floor);
                    prop_assert!(!lose(&mut filter, 1200, false));
                }
            }
        }

        /// Persistent congestion and ECN marks always count; counts never overflow.
        #[test]
        fn persistent_congestion_and_ecn_always_count(
            sent in any::<u64>(),
            lost in any::<u64>(),
        ) {
            let mut filter = LossFilter::default();
            filter.on_sent(sent);
            filter.on_sent(sent);
            prop_assert!(lose(&mut filter, lost, true));
            prop_assert!(lose(&mut filter, 0, false));
            let rate = filter.loss_rate();
            prop_assert!(rate.is_finite() && rate >= 0.0);
        }
    }

    /// A loss found after its sample closed counts in that sample, where its packet was sent: the
    /// sample is no longer lossless and the current one stays clean. After a quiet sample there is
    /// no whole sample to count it in, and it counts in the current one.
    #[test]
    fn a_loss_counts_in_the_sample_its_packet_was_sent_in() {
        let min = 10 * MS;
        let mut filter = filter_after(4, MIN_SAMPLE_BYTES, 0, min, min);
        let begun = filter.round_start.expect("a sample is open");
        assert_eq!(
            (
                filter.random_loss[0].samples,
                filter.random_loss[0].lossless
            ),
            (4, 4)
        );
        assert!(!filter.on_loss(begun - MS, 1200, false));
        assert_eq!((filter.round_lost, filter.last_round_lost), (0, 1200));
        let last = filter.random_loss[0];
        assert_eq!((last.samples, last.lossless, last.lost), (4, 3, 1200));
        assert!(!filter.on_loss(begun, 1200, false));
        assert_eq!((filter.round_lost, filter.last_round_lost), (1200, 1200));

        // A quiet sample closes: nothing sent for a second.
        filter.on_rtt(begun + QUIET_SAMPLE_TIME, min, min);
        filter.on_loss(begun - MS, 1200, false);
        assert_eq!(filter.round_lost, 1200);
        assert_eq!(filter.random_loss[0].lost, 1200);
    }

    /// The case that made samples a minimum size: a 1 ms path whose round trip holds 15 packets,
    /// one in 50 lost at random. Per round trip that read as 6.7% (congestion); over a sample of
    /// [`MIN_SAMPLE_BYTES`] it is 2%.
    #[test]
    fn random_loss_on_a_short_path_is_not_congestion() {
        let start = Instant::now();
        let min = 3 * MS;
        let mut filter = LossFilter::default();
        for packet in 0..20_000u32 {
            if packet % 15 == 0 {
                filter.on_rtt(start + min * (packet / 15), min, min);
            }
            filter.on_sent(1200);
            if packet % 50 == 49 {
                assert!(!lose(&mut filter, 1200, false), "packet {packet}");
            }
        }
        assert!(!filter.congested());
        assert!(filter.loss_rate() < LOSS_RATE_CEILING);
    }

    /// Heavy loss still reads as congestion on a short path: the sample accumulates over round
    /// trips until it holds enough packets.
    #[test]
    fn heavy_loss_on_a_short_path_is_congestion() {
        let start = Instant::now();
        let min = 3 * MS;
        let mut filter = LossFilter::default();
        let mut congestion = false;
        for packet in 0..2 * (MIN_SAMPLE_BYTES / 1200) as u32 {
            if packet % 15 == 0 {
                filter.on_rtt(start + min * (packet / 15), min, min);
            }
            filter.on_sent(1200);
            if packet % 10 == 9 {
                congestion |= lose(&mut filter, 1200, false);
            }
        }
        assert!(congestion);
    }

    /// A path that drops 10% of packets at random, sample after sample at the same rate: once
    /// the floor is known, no sample's share of losses reads as congestion, though the floor is
    /// the least of them and the samples scatter around the true rate (i.i.d. losses from a
    /// fixed-seed generator, 300-packet samples).
    #[test]
    fn random_loss_scattering_around_a_high_floor_is_not_congestion() {
        let start = Instant::now();
        let min = 100 * MS;
        let mut filter = LossFilter::default();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut congestion = 0;
        for sample in 0..400u32 {
            filter.on_rtt(start + min * sample, min, min);
            for _ in 0..MIN_SAMPLE_BYTES / SAMPLE_PACKET_BYTES {
                filter.on_sent(SAMPLE_PACKET_BYTES);
                if lossy(&mut state, 10)
                    && lose(&mut filter, SAMPLE_PACKET_BYTES, false)
                    && sample >= 4
                {
                    congestion += 1;
                }
            }
        }
        let floor = filter.loss_floor();
        assert!((0.03..0.1).contains(&floor), "floor {floor}");
        assert_eq!(congestion, 0);
    }

    /// A generator of i.i.d. losses with a fixed seed: true once in `one_in` calls on average.
    fn lossy(state: &mut u64, one_in: u64) -> bool {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*state >> 33) % one_in == 0
    }

    /// The handshake's single RTT sample, low in a jittered path's spread, does not become the
    /// baseline: the smoothed RTT's ordinary level under load is then no queue.
    #[test]
    fn a_low_first_sample_on_a_jittered_path_is_not_the_baseline() {
        let start = Instant::now();
        let min = 4 * MS;
        let mut filter = LossFilter::default();
        filter.on_rtt(start, 5 * MS, min);
        for sample in 1..100u32 {
            filter.on_rtt(start + MS * sample, 8 * MS + MS * (sample % 2), min);
            assert!(!filter.queue_present(), "sample {sample}");
        }
    }

    /// On a path that loses 1% at random, losses at a queue (or at what reads as one: jitter
    /// that keeps a link's order raises the RTT with the rate) at the rate the queue-free samples
    /// lost are not congestion; a burst beyond what that rate explains is.
    #[test]
    fn losses_at_a_queue_are_measured_against_the_random_loss_rate() {
        let start = Instant::now();
        let min = 20 * MS;
        let mut filter = LossFilter::default();
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut sample = 0u32;
        let mut send_sample = |filter: &mut LossFilter, rtt: Duration| -> u32 {
            filter.on_rtt(start + min * sample, rtt, min);
            sample += 1;
            let mut congestion = 0;
            for _ in 0..500 {
                filter.on_sent(SAMPLE_PACKET_BYTES);
                if lossy(&mut state, 100) && lose(filter, SAMPLE_PACKET_BYTES, false) {
                    congestion += 1;
                }
            }
            congestion
        };
        for _ in 0..40 {
            assert_eq!(send_sample(&mut filter, min), 0);
        }
        let random = filter.random_loss();
        assert!((0.005..0.02).contains(&random), "random {random}");
        let queued = min + min.mul_f64(QUEUE_DELAY_FRACTION * 2.0);
        for _ in 0..40 {
            assert_eq!(send_sample(&mut filter, queued), 0);
            assert!(filter.queue_present());
        }
        let burst = (0..30).any(|_| lose(&mut filter, SAMPLE_PACKET_BYTES, false));
        assert!(burst);
    }

    /// On a lossless path a burst of losses in one sample (an overflow) excuses nothing at a
    /// queue: most samples lost nothing, so the random loss rate is zero.
    #[test]
    fn a_burst_in_queue_free_samples_is_not_a_random_loss_rate() {
        let start = Instant::now();
        let min = 20 * MS;
        let mut filter = LossFilter::default();
        for sample in 0..40u32 {
            filter.on_rtt(start + min * sample, min, min);
            filter.on_sent(500 * SAMPLE_PACKET_BYTES);
            if sample == 20 {
                for _ in 0..10 {
                    lose(&mut filter, SAMPLE_PACKET_BYTES, false);
                }
            }
        }
        assert_eq!(filter.random_loss(), 0.0);
        filter.on_rtt(start + min * 40, min * 2, min);
        assert!(filter.queue_present());
        assert!(lose(&mut filter, SAMPLE_PACKET_BYTES, false));
    }

    /// One acknowledgement frame of `acked` packets.
    fn acknowledge(filter: &mut LossFilter, acked: u64) {
        for _ in 0..acked {
            filter.on_acked(SAMPLE_PACKET_BYTES);
        }
        filter.on_end_acks();
    }

    proptest! {
        /// A run of packets one acknowledgement reveals lost, on a path that has shown no queue
        /// and less random loss than the run explains, is an overflow: congestion, and no part
        /// of the random loss rate or the loss floor. (A run that the random rate explains
        /// among the packets the acknowledgement covered, within [`LOSS_NOISE_DEVIATIONS`], is
        /// no overflow: 8 lost beside 78 acknowledged at 1.9% is 1.6 expected, 8.02 at most.)
        #[test]
        fn an_overflow_revealed_at_once_is_congestion_without_a_queue(
            min_ms in 1u64..200,
            permille in 0u64..20,
            run in BURST_LOSS_PACKETS..200,
            acked in 0u64..100,
        ) {
            let min = MS * min_ms as u32;
            let sent = MIN_SAMPLE_BYTES * 2;
            let mut filter = filter_after(8, sent, sent * permille / 1000, min, min);
            let (random, floor) = (filter.random_loss(), filter.loss_floor());
            prop_assert!(!filter.queue_present());
            let expected = random * (acked + run) as f64;
            prop_assume!(run as f64 > expected + LOSS_NOISE_DEVIATIONS * expected.sqrt());
            acknowledge(&mut filter, acked);
            prop_assert!(lose(&mut filter, run * SAMPLE_PACKET_BYTES, false));
            prop_assert!(filter.congested());
            let later = Instant::now() + min * 20;
            filter.on_sent(sent);
            filter.on_rtt(later, min, min);
            prop_assert!(filter.random_loss() <= random);
            prop_assert!(filter.loss_floor() <= floor);
        }
    }

    /// A path that drops 10% of packets at random, acknowledged 40 packets at a time, all the
    /// losses one acknowledgement reveals reported at once: some acknowledgements reveal eight
    /// or more, none is an overflow once the first sample has measured the random loss rate,
    /// and once the loss floor is known no loss is congestion (i.i.d. losses from a fixed-seed
    /// generator).
    #[test]
    fn random_losses_revealed_together_are_not_an_overflow() {
        let start = Instant::now();
        let min = 50 * MS;
        let mut filter = LossFilter::default();
        let mut state: u64 = 0x5851_f42d_4c95_7f2d;
        let (mut congestion, mut runs, mut overflows) = (0, 0, 0);
        for sample in 0..200u32 {
            filter.on_rtt(start + min * sample, min, min);
            // Eight acknowledgements of 40: a whole sample (300 packets) in each round trip.
            for _ in 0..8 {
                filter.on_sent(40 * SAMPLE_PACKET_BYTES);
                let lost = (0..40).filter(|_| lossy(&mut state, 10)).count() as u64;
                runs += u32::from(lost >= BURST_LOSS_PACKETS);
                acknowledge(&mut filter, 40 - lost);
                if lost == 0 {
                    continue;
                }
                if sample >= 1 && filter.is_burst(lost * SAMPLE_PACKET_BYTES) {
                    overflows += 1;
                }
                if lose(&mut filter, lost * SAMPLE_PACKET_BYTES, false) && sample >= 4 {
                    congestion += 1;
                }
            }
        }
        assert!(runs > 0, "no acknowledgement revealed eight losses");
        assert_eq!(overflows, 0);
        assert_eq!(congestion, 0);
    }

    #[test]
    fn no_rtt_sample_means_no_queue() {
        assert!(!LossFilter::default().queue_present());
    }

    #[test]
    fn a_quiet_round_lets_an_old_loss_rate_fade() {
        let min = 50 * MS;
        let mut filter = filter_after(1, MIN_SAMPLE_BYTES, MIN_SAMPLE_BYTES / 5, min, min);
        assert!(filter.loss_rate() > LOSS_RATE_CEILING);
        let later = Instant::now() + Duration::from_secs(10);
        for quiet in 0..3 {
            filter.on_rtt(later + QUIET_SAMPLE_TIME * quiet, min, min);
        }
        assert!(filter.loss_rate() < LOSS_RATE_CEILING);
    }
}
