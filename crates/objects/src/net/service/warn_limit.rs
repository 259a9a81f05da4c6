//! At most one warning per peer and reason per interval. A peer that repeats a refused request is
//! counted every time (the metrics), but logged at warn only once per [`WARN_INTERVAL_MS`], with
//! how many refusals went unlogged since; the others are logged at debug. Without this, a
//! non-member sending requests in a loop wrote one warn line per request.

use std::collections::HashMap;
use std::hash::Hash;

/// Milliseconds between two warnings for one peer and reason.
pub(super) const WARN_INTERVAL_MS: u64 = 60_000;
/// Peers and reasons remembered at most; when full, those outside their interval are forgotten,
/// and if none is, all are (each then warns once more).
pub(super) const MAX_TRACKED: usize = 1024;

#[derive(Debug)]
pub(super) struct WarnLimit<K> {
    /// Per key: when it was last logged at warn, and how many were not logged since.
    last: HashMap<K, (u64, u64)>,
}

impl<K> Default for WarnLimit<K> {
    fn default() -> Self {
        Self {
            last: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash> WarnLimit<K> {
    /// Whether a refusal for `key` at `now_ms` is logged at warn: `Some(unlogged)` with the
    /// refusals for `key` not logged at warn since its last warning, or `None` (log it at debug).
    pub(super) fn check(&mut self, key: K, now_ms: u64) -> Option<u64> {
        if let Some((at, unlogged)) = self.last.get_mut(&key) {
            if now_ms.saturating_sub(*at) < WARN_INTERVAL_MS {
                *unlogged += 1;
                return None;
            }
            let since = std::mem::take(unlogged);
            *at = now_ms;
            return Some(since);
        }
        if self.last.len() >= MAX_TRACKED {
            self.last
                .retain(|_, (at, _)| now_ms.saturating_sub(*at) < WARN_INTERVAL_MS);
            if self.last.len() >= MAX_TRACKED {
                self.last.clear();
            }
        }
        self.last.insert(key, (now_ms, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_key_and_interval_with_the_unlogged_count() {
        let mut limit = WarnLimit::default();
        assert_eq!(limit.check(("a", "not_member"), 0), Some(0));
        for ms in 1..=5 {
            assert_eq!(limit.check(("a", "not_member"), ms), None);
        }
        // Another key has its own interval.
        assert_eq!(limit.check(("a", "clock_skew"), 10), Some(0));
        assert_eq!(limit.check(("b", "not_member"), 10), Some(0));
        assert_eq!(limit.check(("a", "not_member"), WARN_INTERVAL_MS - 1), None);
        assert_eq!(limit.check(("a", "not_member"), WARN_INTERVAL_MS), Some(6));
        assert_eq!(limit.check(("a", "not_member"), WARN_INTERVAL_MS + 1), None);
    }

    #[test]
    fn memory_stays_bounded_under_many_keys() {
        let mut limit = WarnLimit::default();
        for key in 0..10 * MAX_TRACKED as u64 {
            assert_eq!(limit.check(key, 0), Some(0));
            assert!(limit.last.len() <= MAX_TRACKED);
        }
        // Keys whose interval has passed are forgotten first.
        let mut limit = WarnLimit::default();
        for key in 0..MAX_TRACKED as u64 {
            limit.check(key, 0);
        }
        assert_eq!(limit.check(u64::MAX, WARN_INTERVAL_MS), Some(0));
        assert_eq!(limit.last.len(), 1);
    }
}
