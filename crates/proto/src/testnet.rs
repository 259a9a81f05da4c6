//! A deterministic in-memory network for testing sans-IO state machines: one virtual clock, directed links, messages delivered in arrival order.
//!
//! # Design
//!
//! As in quinn-proto's test `Pair`, the network owns the clock and the wire while the test owns the
//! state machines: the test hands what a node wants to send to [`TestNet::send`], moves the clock
//! with [`TestNet::step`] and feeds what [`TestNet::poll_arrival`] yields to the receiving node. The
//! network is generic over the node id `N` (any `Copy + Ord` name: an index, a [`crate::PeerId`],
//! one end of one path of a multipath session) and the message `M`, so gossip, session and quorum
//! tests share it.
//!
//! Links are directed: a [`Link`] from `a` to `b` says nothing about `b` to `a`
//! ([`TestNet::connect`] sets both). A message sent over a link goes through, in the lab's order
//! (`crates/lab/src/link.rs`):
//!
//! 1. outages: a link that is down at send time takes nothing ([`Sent::Down`]);
//! 2. loss: [`Loss::Random`] draws from the network's seeded generator, [`Loss::EveryNth`] counts
//!    the messages the link took; a lost message takes no capacity ([`Sent::Lost`]);
//! 3. rate: the message waits for the link's transmitter, which sends `rate` messages per second
//!    back to back (messages, not bytes: the state machines under test count packets);
//! 4. propagation: the latency plus a jitter drawn uniformly from `[0, jitter)`; jitter reorders.
//!
//! A message whose link is down when it arrives is dropped then. Messages in flight are ordered by
//! arrival time, then by the order they were sent, so messages arriving at the same instant keep
//! their sending order.
//!
//! [`TestNet::step`] moves the clock to the next wake-up: the earlier of the next arrival and the
//! earliest timer the caller passes (each node's `poll_timeout`). The clock never moves backwards
//! and never moves by itself. Nothing reads a clock (the start instant is given) and the only
//! randomness is a generator seeded at construction, so the same sends give the same arrivals.
//!
//! # Why a feature
//!
//! The network is test code: it is built for this crate's own tests and, through the `testnet`
//! feature (off by default), for the protocol crates' tests, which enable it in their
//! `[dev-dependencies]`. The node, the lab and the binary never compile it, so it cannot become a
//! second link model next to the lab's, and it pulls in the small seeded generator only where a
//! test asks for it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How a link loses messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    /// Nothing is lost.
    None,
    /// Each message independently with this probability (in `[0, 1]`), drawn from the network's
    /// seeded generator.
    Random(f64),
    /// The n-th, 2n-th, ... message the link takes (n ≥ 1), without randomness.
    EveryNth(u64),
}

/// One directed link: what happens to a message between `send` and its arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Extra delay drawn uniformly from `[0, jitter)` per message (zero: none).
    pub jitter: Duration,
    /// Messages per second the link's transmitter sends back to back (`None`: no serialization
    /// delay).
    pub rate: Option<f64>,
    /// Which messages the link loses.
    pub loss: Loss,
    /// Intervals, measured from the network's start, during which the link carries nothing.
    pub outages: Vec<Range<Duration>>,
}

impl Link {
    /// A link of fixed `latency`, no jitter, no rate limit, no loss and no outage.
    pub fn new(latency: Duration) -> Self {
        Self {
            latency,
            jitter: Duration::ZERO,
            rate: None,
            loss: Loss::None,
            outages: Vec::new(),
        }
    }

    /// The same link with a jitter of up to `jitter`.
    pub fn with_jitter(self, jitter: Duration) -> Self {
        Self { jitter, ..self }
    }

    /// The same link sending at most `messages_per_sec` messages per second.
    pub fn with_rate(self, messages_per_sec: f64) -> Self {
        Self {
            rate: Some(messages_per_sec),
            ..self
        }
    }

    /// The same link losing messages as `loss` says.
    pub fn with_loss(self, loss: Loss) -> Self {
        Self { loss, ..self }
    }

    /// The same link, down during `outage` as well.
    pub fn with_outage(mut self, outage: Range<Duration>) -> Self {
        self.outages.push(outage);
        self
    }

    fn check(&self) -> Result<(), &'static str> {
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err("rate must be finite and positive");
            }
        }
        match self.loss {
            Loss::Random(p) if !(0.0..=1.0).contains(&p) => {
                Err("loss probability must be within [0, 1]")
            }
            Loss::EveryNth(0) => Err("every-nth loss needs n of at least 1"),
            _ => Ok(()),
        }
    }
}

/// A call the network refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TestNetError<N: fmt::Debug> {
    /// No link leads from `from` to `to`.
    #[error("no link from {from:?} to {to:?}")]
    NoLink {
        /// The sender.
        from: N,
        /// The intended receiver.
        to: N,
    },
    /// The link's parameters are out of range.
    #[error("invalid link from {from:?} to {to:?}: {reason}")]
    InvalidLink {
        /// The link's start.
        from: N,
        /// The link's end.
        to: N,
        /// What is wrong.
        reason: &'static str,
    },
}

/// What became of a message handed to [`TestNet::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// It is in flight and arrives at this instant, unless its link is down by then.
    Arrives(Instant),
    /// The link lost it.
    Lost,
    /// The link was down.
    Down,
}

/// A message that reached its receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival<N, M> {
    /// The sender.
    pub from: N,
    /// The receiver.
    pub to: N,
    /// The message.
    pub message: M,
}

struct LinkState {
    link: Link,
    /// Time to send one message at the link's rate.
    per_message: Option<Duration>,
    /// When the transmitter is free again.
    free_at: Instant,
    /// Messages the link took (not down), for [`Loss::EveryNth`].
    taken: u64,
}

impl LinkState {
    fn is_down(&self, since_start: Duration) -> bool {
        self.link
            .outages
            .iter()
            .any(|outage| outage.contains(&since_start))
    }
}

struct InFlight<N, M> {
    at: Instant,
    order: u64,
    from: N,
    to: N,
    message: M,
}

impl<N, M> PartialEq for InFlight<N, M> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl<N, M> Eq for InFlight<N, M> {}

impl<N, M> PartialOrd for InFlight<N, M> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<N, M> Ord for InFlight<N, M> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// Nodes named `N` joined by directed [`Link`]s that carry messages `M`, in virtual time.
pub struct TestNet<N, M> {
    start: Instant,
    now: Instant,
    links: BTreeMap<(N, N), LinkState>,
    in_flight: BinaryHeap<Reverse<InFlight<N, M>>>,
    sent: u64,
    rng: SmallRng,
}

impl<N, M> fmt::Debug for TestNet<N, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestNet")
            .field("elapsed", &(self.now - self.start))
            .field("links", &self.links.len())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl<N: Copy + Ord + fmt::Debug, M> TestNet<N, M> {
    /// An empty network whose clock reads `start`; `seed` seeds its random loss and jitter.
    pub fn new(start: Instant, seed: u64) -> Self {
        Self {
            start,
            now: start,
            links: BTreeMap::new(),
            in_flight: BinaryHeap::new(),
            sent: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The virtual clock.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Virtual time since the network started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Sets the link from `from` to `to` (replacing one already there, with an idle transmitter).
    pub fn link(&mut self, from: N, to: N, link: Link) -> Result<(), TestNetError<N>> {
        link.check()
            .map_err(|reason| TestNetError::InvalidLink { from, to, reason })?;
        let per_message = link.rate.map(|rate| Duration::from_secs_f64(1.0 / rate));
        self.links.insert(
            (from, to),
            LinkState {
                link,
                per_message,
                free_at: self.now,
                taken: 0,
            },
        );
        Ok(())
    }

    /// Sets the same link both ways between `a` and `b`.
    pub fn connect(&mut self, a: N, b: N, link: Link) -> Result<(), TestNetError<N>> {
        self.link(a, b, link.clone())?;
        self.link(b, a, link)
    }

    /// Hands `message` to the link from `from` to `to` at the current time.
    pub fn send(&mut self, from: N, to: N, message: M) -> Result<Sent, TestNetError<N>> {
        let since_start = self.now - self.start;
        let state = self
            .links
            .get_mut(&(from, to))
            .ok_or(TestNetError::NoLink { from, to })?;
        if state.is_down(since_start) {
            return Ok(Sent::Down);
        }
        state.taken += 1;
        let lost = match state.link.loss {
            Loss::None => false,
            Loss::Random(p) => self.rng.random::<f64>() < p,
            Loss::EveryNth(n) => state.taken % n == 0,
        };
        if lost {
            return Ok(Sent::Lost);
        }
        let departs = match state.per_message {
            Some(per_message) => {
                state.free_at = state.free_at.max(self.now) + per_message;
                state.free_at
            }
            None => self.now,
        };
        let jitter = if state.link.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(
                self.rng
                    .random_range(0..state.link.jitter.as_nanos() as u64),
            )
        };
        let at = departs + state.link.latency + jitter;
        self.sent += 1;
        self.in_flight.push(Reverse(InFlight {
            at,
            order: self.sent,
            from,
            to,
            message,
        }));
        Ok(Sent::Arrives(at))
    }

    /// When the next message in flight arrives.
    fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse(flight)| flight.at)
    }

    /// The next wake-up: the earlier of the next arrival and the earliest of `timers`.
    fn next_wakeup(&self, timers: impl IntoIterator<Item = Option<Instant>>) -> Option<Instant> {
        timers
            .into_iter()
            .chain([self.next_arrival()])
            .flatten()
            .min()
    }

    /// Moves the clock to the next wake-up (never backwards) and returns the new time, or `None`
    /// (the clock unmoved) when nothing is in flight and no timer is set.
    pub fn step(&mut self, timers: impl IntoIterator<Item = Option<Instant>>) -> Option<Instant> {
        let wakeup = self.next_wakeup(timers)?;
        self.now = self.now.max(wakeup);
        Some(self.now)
    }

    /// Like [`TestNet::step`] if the next wake-up is at or before `limit`; otherwise moves the clock
    /// to `limit` and returns false.
    pub fn step_until(
        &mut self,
        timers: impl IntoIterator<Item = Option<Instant>>,
        limit: Instant,
    ) -> bool {
        match self.next_wakeup(timers) {
            Some(wakeup) if wakeup <= limit => {
                self.now = self.now.max(wakeup);
                true
            }
            _ => {
                self.now = self.now.max(limit);
                false
            }
        }
    }

    /// The next message that has arrived by now, in arrival order; messages whose link is down at
    /// their arrival are dropped on the way.
    pub fn poll_arrival(&mut self) -> Option<Arrival<N, M>> {
        while self
            .in_flight
            .peek()
            .is_some_and(|Reverse(flight)| flight.at <= self.now)
        {
            let Reverse(flight) = self.in_flight.pop()?;
            let down = self
                .links
                .get(&(flight.from, flight.to))
                .is_some_and(|state| state.is_down(flight.at - self.start));
            if !down {
                return Some(Arrival {
                    from: flight.from,
                    to: flight.to,
                    message: flight.message,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
