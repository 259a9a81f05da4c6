//! Careful resume: start a connection at a safe fraction of what an earlier one measured on the path.
//!
//! # Design
//!
//! After the IETF careful-resume draft (draft-ietf-tsvwg-careful-resume), with RFC 9002 §7 for
//! what must stay safe. A connection observes its path ([`PathObserver`]): the minimum RTT and
//! the largest number of bytes acknowledged within one minimum RTT, which over that RTT is a
//! delivery rate the path has sustained. The node keeps the latest [`PathEstimate`] per remote
//! address, from connections it dialed and accepted alike. A new connection with that address
//! starts in *reconnaissance* with the standard window; at its first
//! RTT sample ([`CarefulResume::on_rtt_sample`]):
//! - an estimate whose minimum RTT differs from the new one by more than [`RTT_CHANGE_FACTOR`]
//!   either way is dropped: the path changed and its rate says nothing about the new one;
//! - otherwise the window jumps to [`SAFE_FRACTION`] of the estimate's rate × the smaller of the
//!   two RTTs, never above the configured bandwidth × RTT (the cap every window obeys) and never
//!   below the standard window. quinn paces every flight at 1.25 × window / RTT, so the jump is
//!   a paced flight, not a burst.
//!
//! The jump is *unvalidated* for one RTT after it. A congestion signal then means the estimate was
//! wrong: [`CarefulResume::on_congestion`] returns the *safe retreat* window, half the bytes
//! acknowledged since the jump (what the path did carry), and the estimate is not used again.
//! After one RTT without congestion the jump is validated and the ordinary controller continues.
//!
//! An estimate with a zero RTT, a zero rate, or a rate above the configured bandwidth cannot come
//! from a real path; [`PathEstimate::check`] refuses it with a reason the node counts.

use std::time::{Duration, Instant};

/// The fraction of a remembered rate × RTT a resumed connection jumps to.
pub const SAFE_FRACTION: f64 = 0.5;
/// A remembered estimate is dropped when the new minimum RTT is more than this factor above or
/// below the remembered one.
pub const RTT_CHANGE_FACTOR: f64 = 1.5;

/// What a connection learned about its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathEstimate {
    /// The largest rate the path delivered over one minimum RTT.
    pub delivery_rate_bytes_per_sec: u64,
    /// The path's minimum RTT.
    pub min_rtt: Duration,
}

/// Why an estimate was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EstimateRejected {
    /// No real path has a zero round trip.
    #[error("zero round trip")]
    ZeroRtt,
    /// A path that delivered nothing has nothing to resume.
    #[error("zero delivery rate")]
    ZeroRate,
    /// Faster than the node's configured bandwidth: a window built on it would exceed the cap.
    #[error("delivery rate above the configured bandwidth")]
    RateAboveCap,
}

impl EstimateRejected {
    /// The metric label of the reason.
    pub fn label(self) -> &'static str {
        match self {
            Self::ZeroRtt => "zero_rtt",
            Self::ZeroRate => "zero_rate",
            Self::RateAboveCap => "rate_above_cap",
        }
    }
}

impl PathEstimate {
    /// Refuses an estimate no real path under a `cap_bytes_per_sec` bandwidth could produce.
    pub fn check(&self, cap_bytes_per_sec: u64) -> Result<(), EstimateRejected> {
        if self.min_rtt.is_zero() {
            Err(EstimateRejected::ZeroRtt)
        } else if self.delivery_rate_bytes_per_sec == 0 {
            Err(EstimateRejected::ZeroRate)
        } else if self.delivery_rate_bytes_per_sec > cap_bytes_per_sec {
            Err(EstimateRejected::RateAboveCap)
        } else {
            Ok(())
        }
    }
}

fn bytes_in(rate_bytes_per_sec: u64, rtt: Duration) -> u64 {
    let bytes = u128::from(rate_bytes_per_sec) * rtt.as_micros() / 1_000_000;
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// Measures a connection's [`PathEstimate`] from its acknowledgements.
#[derive(Debug, Clone, Default)]
pub struct PathObserver {
    round_start: Option<Instant>,
    round_acked: u64,
    best_round_acked: u64,
    min_rtt: Option<Duration>,
}

impl PathObserver {
    /// Records `bytes` acknowledged at `now` on a path of minimum RTT `min_rtt`. Returns a new
    /// estimate when a round closed with the largest delivery seen so far.
    pub fn on_ack(&mut self, now: Instant, bytes: u64, min_rtt: Duration) -> Option<PathEstimate> {
        if min_rtt.is_zero() {
            return None;
        }
        self.min_rtt = Some(self.min_rtt.map_or(min_rtt, |least| least.min(min_rtt)));
        let round = self.min_rtt.unwrap_or(min_rtt);
        let mut improved = None;
        match self.round_start {
            Some(start) if now.saturating_duration_since(start) < round => {}
            _ => {
                if self.round_acked > self.best_round_acked {
                    self.best_round_acked = self.round_acked;
                    improved = self.estimate();
                }
                self.round_start = Some(now);
                self.round_acked = 0;
            }
        }
        self.round_acked = self.round_acked.saturating_add(bytes);
        improved
    }

    /// The estimate so far: the best round's bytes over the minimum RTT.
    pub fn estimate(&self) -> Option<PathEstimate> {
        let min_rtt = self.min_rtt?;
        if self.best_round_acked == 0 {
            return None;
        }
        let rate = u128::from(self.best_round_acked) * 1_000_000 / min_rtt.as_micros().max(1);
        Some(PathEstimate {
            delivery_rate_bytes_per_sec: u64::try_from(rate).unwrap_or(u64::MAX),
            min_rtt,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reconnaissance,
    Unvalidated { until: Instant },
    Done,
}

/// One connection's careful resume (see the module's `# Design`).
#[derive(Debug, Clone)]
pub struct CarefulResume {
    estimate: PathEstimate,
    cap_bytes_per_sec: u64,
    standard_window: u64,
    phase: Phase,
    acked_since_jump: u64,
}

impl CarefulResume {
    /// Resume from `estimate` under a `cap_bytes_per_sec` bandwidth; `standard_window` is the
    /// window a cold start uses. Refuses an absurd estimate.
    pub fn new(
        estimate: PathEstimate,
        cap_bytes_per_sec: u64,
        standard_window: u64,
    ) -> Result<Self, EstimateRejected> {
        estimate.check(cap_bytes_per_sec)?;
        Ok(Self {
            estimate,
            cap_bytes_per_sec,
            standard_window,
            phase: Phase::Reconnaissance,
            acked_since_jump: 0,
        })
    }

    /// The first RTT sample, `rtt` at `now`: the window to jump to, or `None` when the RTT
    /// changed markedly (the estimate is dropped) or the jump was already decided.
    pub fn on_rtt_sample(&mut self, now: Instant, rtt: Duration) -> Option<u64> {
        if self.phase != Phase::Reconnaissance {
            return None;
        }
        self.phase = Phase::Done;
        let saved = self.estimate.min_rtt.as_secs_f64();
        let current = rtt.as_secs_f64();
        if current.is_nan()
            || rtt.is_zero()
            || current > saved * RTT_CHANGE_FACTOR
            || current * RTT_CHANGE_FACTOR < saved
        {
            return None;
        }
        let shorter = rtt.min(self.estimate.min_rtt);
        let jump = (bytes_in(self.estimate.delivery_rate_bytes_per_sec, shorter) as f64
            * SAFE_FRACTION) as u64;
        let jump = jump.min(bytes_in(self.cap_bytes_per_sec, rtt));
        if jump <= self.standard_window {
            return None;
        }
        self.phase = Phase::Unvalidated { until: now + rtt };
        Some(jump)
    }

    /// Bytes acknowledged at `now`; the jump is validated one RTT after it was made.
    pub fn on_ack(&mut self, now: Instant, bytes: u64) {
        if let Phase::Unvalidated { until } = self.phase {
            self.acked_since_jump = self.acked_since_jump.saturating_add(bytes);
            if now >= until {
                self.phase = Phase::Done;
            }
        }
    }

    /// A congestion signal. Before the jump is validated: the safe-retreat window, half of what
    /// was acknowledged since the jump and at least the standard window; the resume ends.
    pub fn on_congestion(&mut self) -> Option<u64> {
        if let Phase::Unvalidated { .. } = self.phase {
            self.phase = Phase::Done;
            return Some((self.acked_since_jump / 2).max(self.standard_window));
        }
        None
    }

    /// Whether a jump is still unvalidated.
    pub fn unvalidated(&self) -> bool {
        matches!(self.phase, Phase::Unvalidated { .. })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const STANDARD: u64 = 12_000;
    const CAP: u64 = 125_000_000; // 1 Gbit/s

    fn estimate(rate: u64, rtt_ms: u64) -> PathEstimate {
        PathEstimate {
            delivery_rate_bytes_per_sec: rate,
            min_rtt: MS * rtt_ms as u32,
        }
    }

    #[test]
    fn absurd_estimates_are_refused_with_a_reason() {
        let refuse = |e: PathEstimate| CarefulResume::new(e, CAP, STANDARD).unwrap_err();
        assert_eq!(refuse(estimate(1_000_000, 0)), EstimateRejected::ZeroRtt);
        assert_eq!(refuse(estimate(0, 50)), EstimateRejected::ZeroRate);
        assert_eq!(
            refuse(estimate(CAP + 1, 50)),
            EstimateRejected::RateAboveCap
        );
        assert!(CarefulResume::new(estimate(CAP, 50), CAP, STANDARD).is_ok());
    }

    /// The path change: RTT doubled, rate quartered. The estimate is dropped, so the
    /// connection starts exactly as a cold start does.
    #[test]
    fn a_doubled_rtt_drops_the_estimate() {
        let mut resume = CarefulResume::new(estimate(12_500_000, 50), CAP, STANDARD).unwrap();
        assert_eq!(resume.on_rtt_sample(Instant::now(), 100 * MS), None);
        assert!(!resume.unvalidated());
        assert_eq!(resume.on_congestion(), None);
    }

    #[test]
    fn congestion_before_validation_retreats_to_half_the_acknowledged_bytes() {
        let start = Instant::now();
        let mut resume = CarefulResume::new(estimate(12_500_000, 50), CAP, STANDARD).unwrap();
        let jump = resume.on_rtt_sample(start, 50 * MS).unwrap();
        assert_eq!(jump, 312_500); // half of 100 Mbit/s x 50 ms
        resume.on_ack(start + 10 * MS, 200_000);
        assert_eq!(resume.on_congestion(), Some(100_000));
        assert_eq!(resume.on_congestion(), None);
    }

    #[test]
    fn a_round_trip_without_congestion_validates_the_jump() {
        let start = Instant::now();
        let mut resume = CarefulResume::new(estimate(12_500_000, 50), CAP, STANDARD).unwrap();
        resume.on_rtt_sample(start, 50 * MS).unwrap();
        resume.on_ack(start + 50 * MS, 300_000);
        assert!(!resume.unvalidated());
        assert_eq!(resume.on_congestion(), None);
    }

    #[test]
    fn the_observer_measures_the_largest_delivery_per_round_trip() {
        let start = Instant::now();
        let mut observer = PathObserver::default();
        for ms in 0..200u32 {
            // 1000 bytes per ms for 200 ms on a 50 ms path: 1 MB/s.
            observer.on_ack(start + MS * ms, 1000, 50 * MS);
        }
        let estimate = observer.estimate().unwrap();
        assert_eq!(estimate.min_rtt, 50 * MS);
        assert_eq!(estimate.delivery_rate_bytes_per_sec, 1_000_000);
    }

    proptest! {
        /// Whatever the estimate and the new RTT, a jump never exceeds the configured
        /// bandwidth × RTT nor the remembered rate × RTT × the safe fraction, and happens only
        /// while the RTT stays within the change factor.
        #[test]
        fn a_jump_stays_under_the_cap_and_the_safe_fraction(
            rate in 1u64..=CAP,
            saved_ms in 1u64..1000,
            rtt_ms in 1u64..2000,
        ) {
            let mut resume = CarefulResume::new(estimate(rate, saved_ms), CAP, STANDARD).unwrap();
            let rtt = MS * rtt_ms as u32;
            if let Some(jump) = resume.on_rtt_sample(Instant::now(), rtt) {
                prop_assert!(jump <= bytes_in(CAP, rtt));
                let shorter = rtt.min(MS * saved_ms as u32);
                prop_assert!(jump as f64 <= bytes_in(rate, shorter) as f64 * SAFE_FRACTION + 1.0);
                prop_assert!(jump > STANDARD);
                let ratio = rtt_ms as f64 / saved_ms as f64;
                prop_assert!((1.0 / RTT_CHANGE_FACTOR..=RTT_CHANGE_FACTOR).contains(&ratio));
            }
        }

        /// The path changes (RTT × `rtt_factor`, rate quartered or less) behind a drop-tail
        /// queue of one new BDP. The first flight of a resumed connection overflows that queue by
        /// no more than a cold start's slow start does at its last round, where it sends up to
        /// twice what the path and queue hold (RFC 9002 §7.3.1: the window doubles per round
        /// until a loss). A rate cut deeper than 4× at the same RTT can overflow more for one
        /// round trip; the safe retreat then halves what was delivered.
        #[test]
        fn a_resumed_first_flight_overflows_no_more_than_a_cold_start(
            rate in 125_000u64..=CAP,
            saved_ms in 1u64..500,
            rtt_factor in 0.25f64..4.0,
            rate_divisor in 1u64..=4,
        ) {
            let saved = MS * saved_ms as u32;
            let rtt = saved.mul_f64(rtt_factor).max(MS);
            let new_rate = rate / rate_divisor;
            let path_and_queue = 2 * bytes_in(new_rate, rtt);
            let mut resume = CarefulResume::new(estimate(rate, saved_ms), CAP, STANDARD).unwrap();
            let first_flight = resume.on_rtt_sample(Instant::now(), rtt).unwrap_or(STANDARD);
            let resumed_overflow = first_flight.saturating_sub(path_and_queue);
            // Slow start's last round: the window first exceeds what the path and queue hold,
            // at most twice that (it doubled from under it).
            let mut cold = STANDARD;
            while cold <= path_and_queue {
                cold *= 2;
            }
            let cold_overflow = cold.saturating_sub(path_and_queue);
            prop_assert!(resumed_overflow <= cold_overflow.max(STANDARD),
                "resumed {resumed_overflow} cold {cold_overflow}");
        }
    }
}
