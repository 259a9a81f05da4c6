//! Decide what a node relays for others, from `now`: which (session, path) agreements it admits, between which two ends, how long an unused one lives, and how many bytes each may forward.
//!
//! A node forwards only (session, path) pairs it agreed to in a [`RelayRequest`], only between the
//! two ends named there, one datagram out of the same length per datagram in (the caller forwards
//! what [`RelayTable::admit`] admits, no more), within a per-path token bucket, for at most
//! [`RelayLimits::max_paths`] paths at once, at most [`RelayLimits::max_paths_per_peer`] of them asked
//! for by one peer (so one peer flooding relay requests cannot take every place from the others);
//! an agreement unused for [`RelayLimits::idle`] is
//! forgotten when room is needed for a new one. Whether the other end is reachable is the
//! caller's to say: the table never reads the network or the clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use meshwire_proto::PeerId;

use super::route::{RelayOp, RelayReply, RelayRequest};

/// Bounds on what a node relays for others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RelayLimits {
    /// Paths relayed at once (0: this node relays nothing).
    pub max_paths: usize,
    /// Paths relayed at once that one peer asked for.
    pub max_paths_per_peer: usize,
    /// Bytes per second one relayed path may carry (both directions together).
    pub bytes_per_sec: u64,
    /// Bytes a relayed path may send in one burst.
    pub burst_bytes: u64,
    /// An agreement unused this long is forgotten.
    pub idle: Duration,
}

impl Default for RelayLimits {
    fn default() -> Self {
        Self {
            max_paths: 64,
            max_paths_per_peer: 16,
            bytes_per_sec: 12_500_000,
            burst_bytes: 1 << 20,
            idle: Duration::from_secs(30),
        }
    }
}

/// Why a relay datagram was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// No agreement covers the session's path.
    #[error("no relay agreement for session {session:#x} path {path}")]
    NoAgreement {
        /// Session.
        session: u64,
        /// Path.
        path: u32,
    },
    /// The agreement names other ends than the datagram's sender and destination.
    #[error("session {session:#x} path {path} is relayed between other ends")]
    OutsideAgreement {
        /// Session.
        session: u64,
        /// Path.
        path: u32,
    },
    /// The path's token bucket holds fewer bytes than the datagram.
    #[error("session {session:#x} path {path} is over its relay rate")]
    RateLimited {
        /// Session.
        session: u64,
        /// Path.
        path: u32,
    },
}

/// One agreement: the two ends and the path's token bucket.
#[derive(Debug, Clone, Copy)]
struct Agreement {
    ends: (PeerId, PeerId),
    tokens_bytes: f64,
    refilled: Instant,
    last_used: Instant,
}

impl Agreement {
    fn joins(&self, a: PeerId, b: PeerId) -> bool {
        self.ends == (a, b) || self.ends == (b, a)
    }
}

/// The relay agreements of one node.
#[derive(Debug, Clone)]
pub struct RelayTable {
    limits: RelayLimits,
    agreements: HashMap<(u64, u32), Agreement>,
}

impl RelayTable {
    /// A table with no agreements.
    pub fn new(limits: RelayLimits) -> Self {
        Self {
            limits,
            agreements: HashMap::new(),
        }
    }

    /// Agreements held (idle ones included until room is needed).
    pub fn len(&self) -> usize {
        self.agreements.len()
    }

    /// No agreement is held.
    pub fn is_empty(&self) -> bool {
        self.agreements.is_empty()
    }

    /// Answers `from`'s request. `peer_connected`: this node is connected to the other end the
    /// request names (it never dials on anyone's behalf). Closing is accepted whether or not
    /// there was anything to close, but only one of the two ends may close an agreement.
    pub fn handle_request(
        &mut self,
        from: PeerId,
        request: &RelayRequest,
        peer_connected: bool,
        now: Instant,
    ) -> RelayReply {
        let key = (request.session, request.path);
        if request.op == RelayOp::Close {
            if self
                .agreements
                .get(&key)
                .is_some_and(|agreement| agreement.ends.0 == from || agreement.ends.1 == from)
            {
                self.agreements.remove(&key);
            }
            return RelayReply::Accepted;
        }
        if let Some(agreement) = self.agreements.get(&key) {
            return if agreement.joins(from, request.peer) {
                RelayReply::Accepted
            } else {
                RelayReply::Conflict
            };
        }
        let idle = self.limits.idle;
        self.agreements
            .retain(|_, agreement| now.duration_since(agreement.last_used) < idle);
        let asked_by_peer = self
            .agreements
            .values()
            .filter(|agreement| agreement.ends.0 == from)
            .count();
        if self.agreements.len() >= self.limits.max_paths
            || asked_by_peer >= self.limits.max_paths_per_peer
        {
            return RelayReply::Full;
        }
        if from == request.peer || !peer_connected {
            return RelayReply::PeerUnreachable;
        }
        self.agreements.insert(
            key,
            Agreement {
                ends: (from, request.peer),
                tokens_bytes: self.limits.burst_bytes as f64,
                refilled: now,
                last_used: now,
            },
        );
        RelayReply::Accepted
    }

    /// Admits one datagram of `len_bytes` on (`session`, `path`) from `from` to `destination`,
    /// taking its bytes from the path's token bucket; an admitted datagram is forwarded once.
    pub fn admit(
        &mut self,
        session: u64,
        path: u32,
        from: PeerId,
        destination: PeerId,
        len_bytes: usize,
        now: Instant,
    ) -> Result<(), RelayError> {
        let agreement = self
            .agreements
            .get_mut(&(session, path))
            .ok_or(RelayError::NoAgreement { session, path })?;
        if !agreement.joins(from, destination) {
            return Err(RelayError::OutsideAgreement { session, path });
        }
        let elapsed = now.duration_since(agreement.refilled).as_secs_f64();
        agreement.tokens_bytes = (agreement.tokens_bytes
            + elapsed * self.limits.bytes_per_sec as f64)
            .min(self.limits.burst_bytes as f64);
        agreement.refilled = now;
        agreement.last_used = now;
        let len = len_bytes as f64;
        if agreement.tokens_bytes < len {
            return Err(RelayError::RateLimited { session, path });
        }
        agreement.tokens_bytes -= len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peer(byte: u8) -> PeerId {
        PeerId::from_bytes([byte; 32])
    }

    fn open(session: u64, path: u32, other: PeerId) -> RelayRequest {
        RelayRequest {
            op: RelayOp::Open,
            session,
            path,
            peer: other,
        }
    }

    fn close(session: u64, path: u32, other: PeerId) -> RelayRequest {
        RelayRequest {
            op: RelayOp::Close,
            ..open(session, path, other)
        }
    }

    fn limits() -> RelayLimits {
        RelayLimits {
            max_paths: 2,
            max_paths_per_peer: 2,
            bytes_per_sec: 1000,
            burst_bytes: 2000,
            idle: Duration::from_secs(30),
        }
    }

    #[test]
    fn one_peer_cannot_take_every_place() {
        let now = Instant::now();
        let (flooder, honest, other) = (peer(1), peer(2), peer(3));
        let mut table = RelayTable::new(RelayLimits {
            max_paths: 4,
            max_paths_per_peer: 2,
            ..limits()
        });
        let replies: Vec<RelayReply> = (0..100)
            .map(|session| table.handle_request(flooder, &open(session, 0, other), true, now))
            .collect();
        assert_eq!(replies[..2], [RelayReply::Accepted, RelayReply::Accepted]);
        assert!(replies[2..].iter().all(|reply| *reply == RelayReply::Full));
        assert_eq!(table.len(), 2);
        assert_eq!(
            table.handle_request(honest, &open(1000, 0, other), true, now),
            RelayReply::Accepted
        );
    }

    #[test]
    fn forwards_only_between_the_two_named_ends() {
        let now = Instant::now();
        let (a, b, c) = (peer(1), peer(2), peer(3));
        let mut table = RelayTable::new(limits());
        assert_eq!(
            table.handle_request(a, &open(7, 1, b), true, now),
            RelayReply::Accepted
        );
        assert_eq!(table.admit(7, 1, a, b, 100, now), Ok(()));
        assert_eq!(table.admit(7, 1, b, a, 100, now), Ok(()));
        assert_eq!(
            table.admit(7, 1, c, b, 100, now),
            Err(RelayError::OutsideAgreement {
                session: 7,
                path: 1
            })
        );
        assert_eq!(
            table.admit(7, 1, a, c, 100, now),
            Err(RelayError::OutsideAgreement {
                session: 7,
                path: 1
            })
        );
        assert_eq!(
            table.admit(7, 2, a, b, 100, now),
            Err(RelayError::NoAgreement {
                session: 7,
                path: 2
            })
        );
    }

    #[test]
    fn refuses_unreachable_self_and_conflicting_requests() {
        let now = Instant::now();
        let (a, b, c) = (peer(1), peer(2), peer(3));
        let mut table = RelayTable::new(limits());
        assert_eq!(
            table.handle_request(a, &open(7, 1, b), false, now),
            RelayReply::PeerUnreachable
        );
        assert_eq!(
            table.handle_request(a, &open(7, 1, a), true, now),
            RelayReply::PeerUnreachable
        );
        assert!(table.is_empty());
        assert_eq!(
            table.handle_request(a, &open(7, 1, b), true, now),
            RelayReply::Accepted
        );
        // The other end asking for the same path is the same agreement.
        assert_eq!(
            table.handle_request(b, &open(7, 1, a), true, now),
            RelayReply::Accepted
        );
        assert_eq!(
            table.handle_request(c, &open(7, 1, b), true, now),
            RelayReply::Conflict
        );
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn holds_at_most_max_paths_until_one_is_idle() {
        let start = Instant::now();
        let (a, b) = (peer(1), peer(2));
        let mut table = RelayTable::new(limits());
        for path in 0..2 {
            assert_eq!(
                table.handle_request(a, &open(7, path, b), true, start),
                RelayReply::Accepted
            );
        }
        assert_eq!(
            table.handle_request(a, &open(7, 2, b), true, start),
            RelayReply::Full
        );
        // Path 0 stays in use; path 1 goes idle and makes room.
        let later = start + Duration::from_secs(20);
        assert_eq!(table.admit(7, 0, a, b, 10, later), Ok(()));
        let much_later = start + Duration::from_secs(31);
        assert_eq!(
            table.handle_request(a, &open(7, 2, b), true, much_later),
            RelayReply::Accepted
        );
        assert_eq!(table.len(), 2);
        assert_eq!(
            table.admit(7, 1, a, b, 10, much_later),
            Err(RelayError::NoAgreement {
                session: 7,
                path: 1
            })
        );
    }

    #[test]
    fn only_an_end_closes() {
        let now = Instant::now();
        let (a, b, c) = (peer(1), peer(2), peer(3));
        let mut table = RelayTable::new(limits());
        table.handle_request(a, &open(7, 1, b), true, now);
        assert_eq!(
            table.handle_request(c, &close(7, 1, b), true, now),
            RelayReply::Accepted
        );
        assert_eq!(table.len(), 1);
        assert_eq!(
            table.handle_request(b, &close(7, 1, a), true, now),
            RelayReply::Accepted
        );
        assert!(table.is_empty());
    }

    #[test]
    fn token_bucket_refuses_beyond_burst_and_refills_with_time() {
        let start = Instant::now();
        let (a, b) = (peer(1), peer(2));
        let mut table = RelayTable::new(limits());
        table.handle_request(a, &open(7, 1, b), true, start);
        assert_eq!(table.admit(7, 1, a, b, 1500, start), Ok(()));
        assert_eq!(
            table.admit(7, 1, a, b, 1000, start),
            Err(RelayError::RateLimited {
                session: 7,
                path: 1
            })
        );
        // Half a second refills 500 bytes: 1000 in the bucket.
        let later = start + Duration::from_millis(500);
        assert_eq!(table.admit(7, 1, a, b, 1000, later), Ok(()));
    }

    proptest! {
        /// Whatever the datagrams and their timing, the bytes admitted on a path never exceed the
        /// burst plus the rate times the time elapsed, and nothing outside the agreement passes.
        #[test]
        fn admitted_bytes_stay_within_the_bucket(
            datagrams in proptest::collection::vec((0u64..200, 1usize..1500, 0u8..4), 1..200),
        ) {
            let start = Instant::now();
            let (a, b) = (peer(1), peer(2));
            let limits = limits();
            let mut table = RelayTable::new(limits);
            table.handle_request(a, &open(7, 1, b), true, start);
            let mut now = start;
            let mut admitted = 0u64;
            for (gap_ms, len, sender) in datagrams {
                now += Duration::from_millis(gap_ms);
                let from = peer(1 + sender);
                let result = table.admit(7, 1, from, b, len, now);
                if from != a {
                    prop_assert_eq!(result, Err(RelayError::OutsideAgreement { session: 7, path: 1 }));
                } else if result.is_ok() {
                    admitted += len as u64;
                }
                let allowed = limits.burst_bytes as f64
                    + limits.bytes_per_sec as f64 * (now - start).as_secs_f64();
                prop_assert!(admitted as f64 <= allowed + 1e-6);
            }
        }
    }
}
