//! Decide when to dial a lost peer again: exponential backoff with full jitter and a give-up rule.
//!
//! # Design
//!
//! The xx network's nodes reconnected on fixed, aggressive timers and flooded each other after an
//! outage (`docs/lessons.md`). Here attempt `n` (counting from 0) waits a uniformly random delay in
//! `[floor, min(cap, floor · 2ⁿ)]` — "full jitter" between a floor and a cap — so peers that lost each
//! other at the same moment spread their retries out, and the wait never exceeds `cap`.
//!
//! Configured peers are retried forever; peers learned at run time are given up after
//! `give_up_after` of continuous failure. The policy reads no clock: the driver passes `now`.

use std::time::{Duration, Instant};

use rand::{Rng, RngCore};

/// Exponential backoff with full jitter between `floor` and `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The shortest wait, and the base of the exponential.
    pub floor: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            floor: Duration::from_millis(100),
            cap: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The upper bound of the wait before attempt `attempt`: `min(cap, floor · 2^attempt)`, and never
    /// below `floor`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.floor
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.cap)
            .max(self.floor)
    }

    /// A random wait before attempt `attempt`, uniform in `[floor, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32, rng: &mut impl RngCore) -> Duration {
        let low = self.floor.as_nanos() as u64;
        let high = self.ceiling(attempt).as_nanos().min(u128::from(u64::MAX)) as u64;
        if high <= low {
            return self.floor;
        }
        Duration::from_nanos(rng.random_range(low..=high))
    }
}

/// What the driver should do after a failed dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Dial again after this delay.
    RetryAfter(Duration),
    /// Stop dialing this peer.
    GiveUp,
}

/// Per-peer reconnect state: the attempt counter and when failures began.
#[derive(Debug, Clone)]
pub struct Reconnect {
    backoff: Backoff,
    give_up_after: Option<Duration>,
    attempt: u32,
    failing_since: Option<Instant>,
}

impl Reconnect {
    /// A configured peer: retried forever.
    pub fn configured(backoff: Backoff) -> Self {
        Self {
            backoff,
            give_up_after: None,
            attempt: 0,
            failing_since: None,
        }
    }

    /// A learned peer: given up after `give_up_after` of continuous failure.
    pub fn learned(backoff: Backoff, give_up_after: Duration) -> Self {
        Self {
            give_up_after: Some(give_up_after),
            ..Self::configured(backoff)
        }
    }

    /// Records a failed (or lost) connection at `now` and decides what to do next.
    pub fn on_failure(&mut self, now: Instant, rng: &mut impl RngCore) -> Decision {
        let since = *self.failing_since.get_or_insert(now);
        if let Some(limit) = self.give_up_after {
            if now.saturating_duration_since(since) >= limit {
                return Decision::GiveUp;
            }
        }
        let delay = self.backoff.delay(self.attempt, rng);
        self.attempt = self.attempt.saturating_add(1);
        Decision::RetryAfter(delay)
    }

    /// Records an established connection: the next failure starts from the floor again.
    pub fn on_connected(&mut self) {
        self.attempt = 0;
        self.failing_since = None;
    }

    /// Attempts made since the last success.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn ceiling_doubles_then_caps() {
        let backoff = Backoff {
            floor: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        let ceilings: Vec<_> = (0..6).map(|n| backoff.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn same_seed_same_delays() {
        let backoff = Backoff::default();
        let draw = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..10)
                .map(|n| backoff.delay(n, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn learned_peers_are_given_up_configured_never() {
        let backoff = Backoff::default();
        let mut rng = SmallRng::seed_from_u64(1);
        let start = Instant::now();
        let mut learned = Reconnect::learned(backoff, Duration::from_secs(30));
        let mut configured = Reconnect::configured(backoff);
        assert!(matches!(
            learned.on_failure(start, &mut rng),
            Decision::RetryAfter(_)
        ));
        let later = start + Duration::from_secs(31);
        assert_eq!(learned.on_failure(later, &mut rng), Decision::GiveUp);
        configured.on_failure(start, &mut rng);
        assert!(matches!(
            configured.on_failure(later + Duration::from_secs(3600), &mut rng),
            Decision::RetryAfter(_)
        ));
        learned.on_connected();
        assert_eq!(learned.attempt(), 0);
        assert!(matches!(
            learned.on_failure(later, &mut rng),
            Decision::RetryAfter(_)
        ));
    }

    proptest! {
        #[test]
        fn delays_stay_within_floor_and_cap(
            seed in any::<u64>(),
            floor_ms in 1u64..1000,
            cap_ms in 1u64..100_000,
            attempts in 1u32..80,
        ) {
            let backoff = Backoff { floor: Duration::from_millis(floor_ms), cap: Duration::from_millis(cap_ms) };
            let mut reconnect = Reconnect::configured(backoff);
            let mut rng = SmallRng::seed_from_u64(seed);
            let now = Instant::now();
            for _ in 0..attempts {
                let Decision::RetryAfter(delay) = reconnect.on_failure(now, &mut rng) else {
                    panic!("configured peers are never given up");
                };
                prop_assert!(delay >= backoff.floor);
                prop_assert!(delay <= backoff.cap.max(backoff.floor));
            }
        }
    }
}
