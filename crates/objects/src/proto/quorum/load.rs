//! The content a client has asked of each peer and not yet received, against what the peer's
//! connection has been seen to deliver per round trip: the wait a new request to that peer
//! queues for behind the client's own earlier requests.
//!
//! A connection's congestion window starts at RFC 9002's initial window (ten packets, 12 KB at
//! QUIC's least MTU) and grows by slow start, doubling per round trip at most. A replica's
//! answers to one client share that window, so content asked of it beyond what the window lets
//! out in one round trip leaves a round trip later, and the next beyond that another. Ranking
//! by latency alone sends every read's content to the one best replica; with quorum 1 and 50
//! reads per second over a 176 ms round trip, nine 4 KiB answers a round trip met a 16 KB
//! window, they came back up to twice their round trip late, the replica looked slow, and the
//! ranking moved every read to the next-best, cold in turn (the quorum sweep, seed 7 case 6:
//! p99 2.43 × its floor). [`ContentLoad::queue_rounds`] counts the round trips a new request
//! waits: the content bytes out to the peer (requests out × the typical content answer) over
//! what its connection can carry in one round trip, taken as twice the most it delivered in one
//! round trip so far (slow start doubles a window that is used), at least the initial window.
//! The ranking adds that many round trips to the peer's expected latency (and to its hedge
//! delay: a wait the client's own requests cause is no lateness of the peer's), so reads spread
//! over the best replicas only as far as the best one's window cannot carry them, and come back
//! to it as its window grows.
//!
//! Until the first content answer shows how large answers are, nothing is counted. Counting each
//! request of unknown size as a whole first window (12 KB) spread the first round trip's reads
//! too far: with quorum 2–5 a replica among the best few with one content request out lost its
//! place to one a round trip farther, and in the quorum sweep (hedged, seeds 1–8) the cases over
//! 1.3× their floor went from 7 to 22. Counted from the first answer on: the worst case 3.28 →
//! 1.71 (seed 7 case 6 2.43 → 1.58, seed 8 case 1 2.24 → 1.46, seed 8 case 3 3.28 → 1.71), the
//! p99 ratios' median 0.990 → 1.011 and p90 1.261 → 1.266, cases over 1.3 7 → 8.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// What a connection delivers in its first round trip: RFC 9002's initial window (ten packets
/// of QUIC's least MTU, 1200 bytes).
pub const FIRST_ROUND_BYTES: usize = 12_000;

/// Weight of a new content answer's size in the typical size.
const SIZE_ALPHA: f64 = 0.125;

/// One peer's content in flight and deliveries.
#[derive(Debug, Clone, Default)]
struct Carried {
    /// Content requests out.
    out: usize,
    /// Content answers received within the last round trip: when, and their bytes.
    recent: VecDeque<(Instant, usize)>,
    /// The most content bytes received from the peer within one round trip.
    best_round: usize,
}

/// Content out to each peer and what each delivered (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct ContentLoad<P> {
    peers: HashMap<P, Carried>,
    /// EWMA of content answers' sizes; `None` before the first.
    typical_bytes: Option<f64>,
    max_peers: usize,
}

impl<P: Copy + Eq + Hash> ContentLoad<P> {
    pub(super) fn new(max_peers: usize) -> Self {
        Self {
            peers: HashMap::new(),
            typical_bytes: None,
            max_peers,
        }
    }

    /// A content request to `peer` was sent.
    pub(super) fn on_sent(&mut self, peer: P) {
        if self.peers.len() < self.max_peers || self.peers.contains_key(&peer) {
            self.peers.entry(peer).or_default().out += 1;
        }
    }

    /// A content request to `peer` ended at `now`, with an answer of `received` bytes if it
    /// brought one; `round_trip` is the peer's round trip, over which deliveries are summed.
    pub(super) fn on_done(
        &mut self,
        peer: P,
        received: Option<usize>,
        round_trip: Duration,
        now: Instant,
    ) {
        let Some(carried) = self.peers.get_mut(&peer) else {
            return;
        };
        carried.out = carried.out.saturating_sub(1);
        let Some(bytes) = received else {
            return;
        };
        self.typical_bytes = Some(match self.typical_bytes {
            None => bytes as f64,
            Some(typical) => typical + SIZE_ALPHA * (bytes as f64 - typical),
        });
        carried.recent.push_back((now, bytes));
        while carried
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > round_trip)
        {
            carried.recent.pop_front();
        }
        let round: usize = carried.recent.iter().map(|(_, bytes)| bytes).sum();
        carried.best_round = carried.best_round.max(round);
    }

    /// Round trips a new request to `peer` waits behind the content already out to it: the
    /// bytes ahead of it over what the connection carries per round trip, whole rounds; none
    /// before any content answer's size is known.
    pub(super) fn queue_rounds(&self, peer: P) -> f64 {
        let Some(carried) = self.peers.get(&peer).filter(|carried| carried.out > 0) else {
            return 0.0;
        };
        let Some(typical) = self.typical_bytes else {
            return 0.0;
        };
        let per_round = (2 * carried.best_round).max(FIRST_ROUND_BYTES) as f64;
        (carried.out as f64 * typical / per_round).floor()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_cold_peer_carries_a_first_window_per_round_trip() {
        let mut load = ContentLoad::<u32>::new(16);
        let t0 = Instant::now();
        assert_eq!(load.queue_rounds(0), 0.0, "nothing out");
        // Before any answer's size is known, nothing is counted.
        load.on_sent(0);
        load.on_sent(0);
        assert_eq!(load.queue_rounds(0), 0.0);
        // A 4 KiB answer: two 4 KiB answers out fit in the first 12 KB round, three do not.
        load.on_done(0, Some(4096), ms(100), t0);
        assert_eq!(load.queue_rounds(0), 0.0, "one out");
        load.on_sent(0);
        assert_eq!(load.queue_rounds(0), 0.0, "two out, 8 KiB ahead");
        load.on_sent(0);
        assert_eq!(load.queue_rounds(0), 1.0, "three out, 12 KiB ahead");
        // Another peer owes nothing.
        assert_eq!(load.queue_rounds(1), 0.0);
    }

    #[test]
    fn what_a_peer_delivered_in_one_round_trip_lets_twice_as_much_through() {
        let mut load = ContentLoad::<u32>::new(16);
        let t0 = Instant::now();
        for i in 0..6 {
            load.on_sent(0);
            load.on_done(0, Some(4096), ms(100), t0 + ms(10 * i));
        }
        // 24 KiB within 100 ms: 48 KiB a round trip, so eleven answers out wait no round.
        for _ in 0..11 {
            load.on_sent(0);
        }
        assert_eq!(load.queue_rounds(0), 0.0);
        load.on_sent(0);
        assert_eq!(load.queue_rounds(0), 1.0);
        // Deliveries further apart than the round trip are not summed.
        let mut spread = ContentLoad::<u32>::new(16);
        for i in 0..6 {
            spread.on_sent(0);
            spread.on_done(0, Some(4096), ms(100), t0 + ms(200 * i));
        }
        for _ in 0..3 {
            spread.on_sent(0);
        }
        assert_eq!(spread.queue_rounds(0), 1.0, "12 KiB ahead of a 12 KB round");
    }

    #[test]
    fn requests_that_end_without_an_answer_stop_counting_and_peers_are_bounded() {
        let mut load = ContentLoad::<u32>::new(2);
        load.on_sent(0);
        load.on_done(0, None, ms(100), Instant::now());
        assert_eq!(load.queue_rounds(0), 0.0);
        load.on_sent(1);
        load.on_sent(2);
        assert_eq!(load.queue_rounds(2), 0.0, "a third peer is not tracked");
        load.on_done(2, Some(1), ms(100), Instant::now());
    }
}
