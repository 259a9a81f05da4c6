//! Version objects with a hybrid logical clock that a peer's wrong clock cannot push far ahead.
//!
//! # Design
//!
//! A timestamp is one `u64`: physical Unix milliseconds in the high 48 bits, a counter in the low
//! 16 (Kulkarni et al., "Logical Physical Clocks", 2014). Comparing two timestamps as integers
//! compares the milliseconds first, then the counter, so the store and the merge keep ordering
//! versions as plain integers. 48 bits of milliseconds last until the year 10889.
//!
//! - **Tick** (a write, or any object message sent): `max(last + 1, physical << 16)`. A counter
//!   that overflows carries into the milliseconds, so ticks never repeat.
//! - **Observe** (any object message received, and every version it carries): `last =
//!   max(last, remote)`, so the next tick is later than anything this node has accepted.
//! - **Skew**: a remote timestamp whose milliseconds are more than `max_skew` ahead of this node's
//!   physical clock is refused ([`ClockError::AheadOfClock`]) and does not move the clock. A node
//!   whose clock runs a year ahead therefore cannot plant a version that freezes a key: every
//!   correct node refuses its messages. With all physical clocks within `max_skew` of each other
//!   (the assumption the setting states), a correct node's clock never exceeds the fastest
//!   physical clock, so correct nodes never refuse each other.
//! - **Limit**: [`MAX_TIMESTAMP`] (`u64::MAX`) is refused on receipt and never produced: nothing
//!   could be newer than it. All arithmetic is checked; a clock that would pass the limit answers
//!   [`ClockError::Exhausted`] instead of wrapping.
//!
//! Sans-IO: the physical time arrives as an argument.

use std::time::Duration;

/// Bits of a timestamp that hold the counter.
pub const COUNTER_BITS: u32 = 16;

/// The largest timestamp: refused on receipt, never produced.
pub const MAX_TIMESTAMP: u64 = u64::MAX;

/// The largest physical time a timestamp can carry, in Unix milliseconds.
pub const MAX_PHYSICAL_MS: u64 = u64::MAX >> COUNTER_BITS;

/// The physical milliseconds of `timestamp`.
pub fn physical_ms(timestamp: u64) -> u64 {
    timestamp >> COUNTER_BITS
}

/// The counter of `timestamp`.
pub fn counter(timestamp: u64) -> u16 {
    (timestamp & u64::from(u16::MAX)) as u16
}

/// The timestamp of `physical_ms` (clamped to [`MAX_PHYSICAL_MS`]) and `counter`.
pub fn timestamp(physical_ms: u64, counter: u16) -> u64 {
    (physical_ms.min(MAX_PHYSICAL_MS) << COUNTER_BITS) | u64::from(counter)
}

/// Why a timestamp was refused or could not be produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClockError {
    /// The remote timestamp is further ahead of this node's physical clock than `max_skew`.
    #[error(
        "timestamp {ahead_ms} ms ahead of this node's clock (at most {max_skew_ms} ms accepted)"
    )]
    AheadOfClock {
        /// How far ahead, in milliseconds.
        ahead_ms: u64,
        /// The accepted skew, in milliseconds.
        max_skew_ms: u64,
    },
    /// The remote timestamp is the largest one; nothing could ever be newer.
    #[error("timestamp at the integer limit")]
    AtLimit,
    /// This clock has reached the limit and cannot tick again.
    #[error("the clock has reached its limit")]
    Exhausted,
}

/// One node's hybrid logical clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridClock {
    last: u64,
    max_skew_ms: u64,
}

impl HybridClock {
    /// A clock that has seen nothing yet and refuses timestamps more than `max_skew` ahead.
    pub fn new(max_skew: Duration) -> Self {
        Self {
            last: 0,
            max_skew_ms: u64::try_from(max_skew.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The latest timestamp this clock produced or accepted.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The accepted skew, in milliseconds.
    pub fn max_skew_ms(&self) -> u64 {
        self.max_skew_ms
    }

    /// A new timestamp, later than every one this clock produced or accepted, at physical time
    /// `now_ms` (Unix milliseconds).
    pub fn tick(&mut self, now_ms: u64) -> Result<u64, ClockError> {
        let next = self
            .last
            .checked_add(1)
            .filter(|next| *next < MAX_TIMESTAMP)
            .ok_or(ClockError::Exhausted)?;
        let next = next.max(timestamp(now_ms, 0)).min(MAX_TIMESTAMP - 1);
        if next <= self.last {
            return Err(ClockError::Exhausted);
        }
        self.last = next;
        Ok(next)
    }

    /// Checks a timestamp received at physical time `now_ms` without accepting it.
    pub fn check(&self, remote: u64, now_ms: u64) -> Result<(), ClockError> {
        if remote == MAX_TIMESTAMP {
            return Err(ClockError::AtLimit);
        }
        let ahead_ms = physical_ms(remote).saturating_sub(now_ms.min(MAX_PHYSICAL_MS));
        if ahead_ms > self.max_skew_ms {
            return Err(ClockError::AheadOfClock {
                ahead_ms,
                max_skew_ms: self.max_skew_ms,
            });
        }
        Ok(())
    }

    /// Accepts a timestamp received at physical time `now_ms`: later ticks are later than it.
    /// A refused timestamp leaves the clock as it was.
    pub fn observe(&mut self, remote: u64, now_ms: u64) -> Result<(), ClockError> {
        self.check(remote, now_ms)?;
        self.last = self.last.max(remote);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SKEW: Duration = Duration::from_secs(5);
    const NOW: u64 = 1_760_000_000_000;

    #[test]
    fn ticks_follow_physical_time_and_count_within_a_millisecond() {
        let mut clock = HybridClock::new(SKEW);
        assert_eq!(clock.tick(NOW), Ok(timestamp(NOW, 0)));
        assert_eq!(clock.tick(NOW), Ok(timestamp(NOW, 1)));
        // Physical time going backwards does not move the clock back.
        assert_eq!(clock.tick(NOW - 10), Ok(timestamp(NOW, 2)));
        assert_eq!(clock.tick(NOW + 1), Ok(timestamp(NOW + 1, 0)));
    }

    #[test]
    fn a_counter_overflow_carries_into_the_milliseconds() {
        let mut clock = HybridClock::new(SKEW);
        clock.observe(timestamp(NOW, u16::MAX), NOW).unwrap();
        assert_eq!(clock.tick(NOW), Ok(timestamp(NOW + 1, 0)));
    }

    #[test]
    fn stamps_from_the_future_and_at_the_limit_are_refused() {
        let mut clock = HybridClock::new(SKEW);
        let year_ms = 365 * 24 * 3600 * 1000;
        assert_eq!(
            clock.observe(timestamp(NOW + year_ms, 0), NOW),
            Err(ClockError::AheadOfClock {
                ahead_ms: year_ms,
                max_skew_ms: 5000
            })
        );
        assert_eq!(clock.last(), 0, "a refused stamp does not move the clock");
        assert_eq!(clock.observe(u64::MAX, NOW), Err(ClockError::AtLimit));
        assert!(clock.observe(timestamp(NOW + 5000, 7), NOW).is_ok());
        assert!(clock.tick(NOW).unwrap() > timestamp(NOW + 5000, 7));
    }

    #[test]
    fn the_limit_is_never_produced_nor_passed() {
        let mut clock = HybridClock::new(Duration::MAX);
        clock.observe(MAX_TIMESTAMP - 2, MAX_PHYSICAL_MS).unwrap();
        assert_eq!(clock.tick(MAX_PHYSICAL_MS), Ok(MAX_TIMESTAMP - 1));
        assert_eq!(clock.tick(MAX_PHYSICAL_MS), Err(ClockError::Exhausted));
        assert_eq!(clock.tick(u64::MAX), Err(ClockError::Exhausted));
        assert_eq!(clock.last(), MAX_TIMESTAMP - 1);
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// Physical time moves by this many ms (negative: a clock stepped back).
        Step(i32),
        Tick,
        /// A remote stamp this many ms from physical time, with this counter.
        Receive(i64, u16),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (-2000i32..2000).prop_map(Event::Step),
            Just(Event::Tick),
            ((-20_000i64..20_000), any::<u16>()).prop_map(|(ms, c)| Event::Receive(ms, c)),
        ]
    }

    proptest! {
        /// Whatever the physical clock and peers do: ticks strictly increase, a tick is never
        /// behind a stamp accepted before it, stamps beyond the skew are refused and leave the
        /// clock alone, and stamps within it are accepted.
        #[test]
        fn ticks_are_monotonic_and_never_behind_an_accepted_stamp(
            skew_ms in 0u64..10_000,
            events in proptest::collection::vec(event(), 0..200),
        ) {
            let mut clock = HybridClock::new(Duration::from_millis(skew_ms));
            let mut now = NOW;
            let mut last_tick = 0u64;
            let mut newest_accepted = 0u64;
            for event in events {
                match event {
                    Event::Step(ms) => now = now.saturating_add_signed(i64::from(ms)),
                    Event::Tick => {
                        let tick = clock.tick(now).unwrap();
                        prop_assert!(tick > last_tick);
                        prop_assert!(tick > newest_accepted);
                        prop_assert!(physical_ms(tick) >= now);
                        last_tick = tick;
                    }
                    Event::Receive(offset_ms, count) => {
                        let remote = timestamp(now.saturating_add_signed(offset_ms), count);
                        let before = clock;
                        let result = clock.observe(remote, now);
                        let ahead = physical_ms(remote).saturating_sub(now);
                        if ahead > skew_ms {
                            let refused = matches!(result, Err(ClockError::AheadOfClock { .. }));
                            prop_assert!(refused);
                            prop_assert_eq!(clock, before);
                        } else {
                            prop_assert!(result.is_ok());
                            prop_assert!(clock.last() >= remote);
                            newest_accepted = newest_accepted.max(remote);
                        }
                    }
                }
            }
        }

        /// No input makes the clock panic, wrap, or produce the limit.
        #[test]
        fn arbitrary_stamps_never_overflow(
            remotes in proptest::collection::vec(any::<u64>(), 0..20),
            now in any::<u64>(),
        ) {
            let mut clock = HybridClock::new(Duration::MAX);
            for remote in remotes {
                let accepted = clock.observe(remote, now).is_ok();
                prop_assert_eq!(accepted, remote != MAX_TIMESTAMP);
                match clock.tick(now) {
                    Ok(tick) => prop_assert!(tick > remote && tick < MAX_TIMESTAMP || !accepted),
                    Err(error) => prop_assert_eq!(error, ClockError::Exhausted),
                }
            }
        }
    }
}
