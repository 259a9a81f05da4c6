//! Summarise measurements into the numbers reports carry: percentiles and rounded metrics.

use std::collections::BTreeMap;

/// Metric name to value: what one case reports under one policy.
pub type Metrics = BTreeMap<String, f64>;

/// The `quantile` (0 to 1) of `sorted`, which must be in ascending order: the element at rank
/// `round((len - 1) * quantile)` (nearest rank, no interpolation). `None` when `sorted` is empty.
/// Works for any copyable sample type, e.g. `f64` milliseconds or `Duration`s.
pub fn percentile<T: Copy>(sorted: &[T], quantile: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (last as f64 * quantile.clamp(0.0, 1.0)).round() as usize;
    sorted.get(rank.min(last)).copied()
}

/// [`percentile`] of millisecond (or other `f64`) samples, NaN when there are none.
pub fn percentile_f64(sorted: &[f64], quantile: f64) -> f64 {
    percentile(sorted, quantile).unwrap_or(f64::NAN)
}

/// Rounds a metric to 6 significant digits so reports are stable and readable.
pub fn round_metric(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let digits = 6 - value.abs().log10().ceil() as i32;
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let samples = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile_f64(&samples, 0.5), 3.0);
        assert_eq!(percentile_f64(&samples, 0.99), 5.0);
        assert_eq!(percentile_f64(&samples, 0.0), 1.0);
        // (5 - 1) x 0.6 = 2.4 rounds to rank 2.
        assert_eq!(percentile_f64(&samples, 0.6), 3.0);
        assert!(percentile_f64(&[], 0.5).is_nan());
    }

    #[test]
    fn percentile_works_on_durations() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(percentile::<Duration>(&[], 0.5), None);
    }

    #[test]
    fn rounding_is_stable() {
        assert_eq!(round_metric(90.000_000_1), 90.0);
        assert_eq!(round_metric(0.123_456_789), 0.123_457);
    }
}
