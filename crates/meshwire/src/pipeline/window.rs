//! Keep up to K batches in flight around a pipeline and hand their outcomes back in order.
//!
//! # Design
//!
//! The first node of a pipeline ring starts batches, and each comes back to it after every node
//! has worked on it. Pipelining batches lets all nodes of the xx network's 5-node team work at
//! once (`docs/lessons.md`); this window is the first node's bookkeeping for that, as a pure state
//! machine:
//!
//! - [`Window::try_start`] hands out the next batch id while fewer than `capacity` batches are
//!   unreleased (in flight, or finished but waiting behind an older one), so memory is bounded;
//! - every batch has a deadline; [`Window::poll_timeout`] says when the driver must call
//!   [`Window::handle_timeout`], which fails the overdue batches ([`Outcome::TimedOut`]);
//! - [`Window::complete`] and [`Window::fail`] record an outcome; late news about a batch that
//!   already has one (a batch that timed out and then came back) is refused, so every batch has
//!   exactly one outcome;
//! - [`Window::poll_released`] hands outcomes back in start order, so the application sees batch
//!   `n` before batch `n + 1` whatever order they finished in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How one batch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T, E> {
    /// It came back whole.
    Completed(T),
    /// A node or link failed it.
    Failed(E),
    /// It did not come back before its deadline.
    TimedOut,
}

#[derive(Debug, Clone)]
enum Slot<T, E> {
    Pending { deadline: Instant },
    Done(Outcome<T, E>),
}

/// The first node's window of batches in flight.
#[derive(Debug, Clone)]
pub struct Window<T, E> {
    capacity: usize,
    deadline: Duration,
    next_id: u64,
    slots: BTreeMap<u64, Slot<T, E>>,
}

impl<T, E> Window<T, E> {
    /// A window of `capacity` batches (at least one), each given `deadline` to come back; batch
    /// ids start at `first_id`.
    pub fn new(capacity: usize, deadline: Duration, first_id: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            deadline,
            next_id: first_id,
            slots: BTreeMap::new(),
        }
    }

    /// Starts a batch at `now` and returns its id, or `None` while the window is full.
    pub fn try_start(&mut self, now: Instant) -> Option<u64> {
        if self.slots.len() >= self.capacity {
            return None;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.slots.insert(
            id,
            Slot::Pending {
                deadline: now + self.deadline,
            },
        );
        Some(id)
    }

    /// Batches started and not yet released.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no batch is unreleased.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `id` is still waiting for its outcome.
    pub fn is_pending(&self, id: u64) -> bool {
        matches!(self.slots.get(&id), Some(Slot::Pending { .. }))
    }

    /// Records that batch `id` came back; false (and `value` dropped) if it already has an
    /// outcome or is unknown.
    pub fn complete(&mut self, id: u64, value: T) -> bool {
        self.settle(id, Outcome::Completed(value))
    }

    /// Records that batch `id` failed; false if it already has an outcome or is unknown.
    pub fn fail(&mut self, id: u64, error: E) -> bool {
        self.settle(id, Outcome::Failed(error))
    }

    fn settle(&mut self, id: u64, outcome: Outcome<T, E>) -> bool {
        match self.slots.get_mut(&id) {
            Some(slot @ Slot::Pending { .. }) => {
                *slot = Slot::Done(outcome);
                true
            }
            _ => false,
        }
    }

    /// The earliest deadline of a pending batch.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter_map(|slot| match slot {
                Slot::Pending { deadline } => Some(*deadline),
                Slot::Done(_) => None,
            })
            .min()
    }

    /// Fails every pending batch whose deadline is at or before `now`; returns their ids.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<u64> {
        let mut expired = Vec::new();
        for (id, slot) in &mut self.slots {
            if matches!(slot, Slot::Pending { deadline } if *deadline <= now) {
                *slot = Slot::Done(Outcome::TimedOut);
                expired.push(*id);
            }
        }
        expired
    }

    /// The oldest batch's outcome, once it has one; this frees its place in the window.
    pub fn poll_released(&mut self) -> Option<(u64, Outcome<T, E>)> {
        let entry = self.slots.first_entry()?;
        if matches!(entry.get(), Slot::Pending { .. }) {
            return None;
        }
        let (id, slot) = entry.remove_entry();
        match slot {
            Slot::Done(outcome) => Some((id, outcome)),
            Slot::Pending { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn outcomes_are_released_in_start_order() {
        let now = Instant::now();
        let mut window: Window<&str, ()> = Window::new(3, Duration::from_secs(1), 10);
        let ids: Vec<u64> = (0..3).map(|_| window.try_start(now).unwrap()).collect();
        assert_eq!(ids, [10, 11, 12]);
        assert_eq!(window.try_start(now), None);
        assert!(window.complete(12, "c"));
        assert!(window.complete(11, "b"));
        assert_eq!(window.poll_released(), None);
        assert!(window.complete(10, "a"));
        assert!(!window.complete(10, "again"));
        let released: Vec<_> = std::iter::from_fn(|| window.poll_released()).collect();
        assert_eq!(
            released,
            [
                (10, Outcome::Completed("a")),
                (11, Outcome::Completed("b")),
                (12, Outcome::Completed("c"))
            ]
        );
        assert_eq!(window.try_start(now), Some(13));
    }

    #[test]
    fn an_overdue_batch_times_out_once_and_late_news_is_refused() {
        let now = Instant::now();
        let mut window: Window<(), &str> = Window::new(2, Duration::from_millis(100), 0);
        window.try_start(now).unwrap();
        window.try_start(now + Duration::from_millis(50)).unwrap();
        assert_eq!(
            window.poll_timeout(),
            Some(now + Duration::from_millis(100))
        );
        assert_eq!(window.handle_timeout(now + Duration::from_millis(100)), [0]);
        assert!(!window.complete(0, ()));
        assert!(window.fail(1, "link down"));
        assert_eq!(window.poll_timeout(), None);
        assert_eq!(window.poll_released(), Some((0, Outcome::TimedOut)));
        assert_eq!(
            window.poll_released(),
            Some((1, Outcome::Failed("link down")))
        );
    }

    proptest! {
        /// Whatever the order of completions, failures and timeouts: never more than `capacity`
        /// unreleased, every started batch released exactly once, in start order.
        #[test]
        fn every_batch_gets_exactly_one_outcome_in_order(
            capacity in 1usize..6,
            ops in proptest::collection::vec((0u8..4, 0u64..8, 0u64..300), 1..200),
        ) {
            let start = Instant::now();
            let mut window: Window<u64, u64> = Window::new(capacity, Duration::from_millis(100), 0);
            let mut started = Vec::new();
            let mut released = Vec::new();
            let mut now = start;
            for (op, pick, advance) in ops {
                now += Duration::from_millis(advance / 10);
                match op {
                    0 => if let Some(id) = window.try_start(now) { started.push(id) },
                    1 => { window.complete(pick, pick); }
                    2 => { window.fail(pick, pick); }
                    _ => { window.handle_timeout(now); }
                }
                prop_assert!(window.len() <= capacity);
                while let Some((id, _)) = window.poll_released() {
                    released.push(id);
                }
            }
            window.handle_timeout(now + Duration::from_secs(1));
            while let Some((id, _)) = window.poll_released() {
                released.push(id);
            }
            prop_assert_eq!(released, started);
            prop_assert!(window.is_empty());
        }
    }
}
