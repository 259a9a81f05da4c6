//! Estimate one path's round-trip time and retransmission timeout as RFC 6298 does.
//!
//! `SRTT`, `RTTVAR` and `RTO = SRTT + max(G, 4·RTTVAR)` follow RFC 6298 §2, with the RTO clamped to
//! `[min_rto, max_rto]` (§2.4 asks for a 1 s floor; the floor is configuration here because the
//! paths meshwire stripes over have RTTs from milliseconds to seconds). The minimum RTT seen is kept
//! too: it is the propagation delay the window policy multiplies by the delivery rate.

use std::time::Duration;

/// Clock granularity `G` of RFC 6298.
const GRANULARITY: Duration = Duration::from_millis(1);

/// Smoothed RTT, its variation, the minimum and the resulting RTO of one path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RttEstimator {
    smoothed: Option<Duration>,
    variation: Duration,
    min: Option<Duration>,
    latest: Option<Duration>,
    initial_rto: Duration,
    min_rto: Duration,
    max_rto: Duration,
}

impl RttEstimator {
    /// An estimator with no samples: the RTO is `initial_rto` until the first one.
    pub fn new(initial_rto: Duration, min_rto: Duration, max_rto: Duration) -> Self {
        Self {
            smoothed: None,
            variation: Duration::ZERO,
            min: None,
            latest: None,
            initial_rto,
            min_rto,
            max_rto,
        }
    }

    /// Takes one RTT measurement (RFC 6298 §2.2 and §2.3).
    pub fn update(&mut self, sample: Duration) {
        self.latest = Some(sample);
        self.min = Some(self.min.map_or(sample, |min| min.min(sample)));
        match self.smoothed {
            None => {
                self.smoothed = Some(sample);
                self.variation = sample / 2;
            }
            Some(smoothed) => {
                let delta = smoothed.abs_diff(sample);
                self.variation = (self.variation * 3 + delta) / 4;
                self.smoothed = Some((smoothed * 7 + sample) / 8);
            }
        }
    }

    /// The retransmission timeout before backoff.
    pub fn rto(&self) -> Duration {
        match self.smoothed {
            None => self.initial_rto,
            Some(smoothed) => {
                (smoothed + GRANULARITY.max(self.variation * 4)).clamp(self.min_rto, self.max_rto)
            }
        }
    }

    /// The smoothed RTT, once measured.
    pub fn smoothed(&self) -> Option<Duration> {
        self.smoothed
    }

    /// The smallest RTT measured.
    pub fn min(&self) -> Option<Duration> {
        self.min
    }

    /// The latest sample.
    pub fn latest(&self) -> Option<Duration> {
        self.latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_rfc_6298() {
        let mut rtt = RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(60),
        );
        assert_eq!(rtt.rto(), Duration::from_secs(1));
        rtt.update(Duration::from_millis(100));
        // SRTT = 100, RTTVAR = 50, RTO = 100 + 200.
        assert_eq!(rtt.rto(), Duration::from_millis(300));
        rtt.update(Duration::from_millis(100));
        // RTTVAR = 37.5, RTO = 100 + 150 = 250.
        assert_eq!(rtt.rto(), Duration::from_millis(250));
        for _ in 0..50 {
            rtt.update(Duration::from_millis(100));
        }
        assert_eq!(
            rtt.rto(),
            Duration::from_millis(200),
            "clamped to the floor"
        );
        rtt.update(Duration::from_millis(40));
        assert_eq!(rtt.min(), Some(Duration::from_millis(40)));
    }
}
