//! Decide which of two connections to the same peer survives a simultaneous dial (sans-IO).
//!
//! When both sides dial at once, two connections exist for a moment. Between two live connections
//! of opposite direction established within `window` (the dial timeout) of each other, the one
//! dialed by the smaller [`PeerId`] is kept; otherwise the newer one is (the older one belongs to a
//! peer that restarted). Both sides apply the same rule to the same pair and so keep the same
//! connection.

use std::time::Duration;

use meshwire_proto::PeerId;

use super::Direction;

/// Which connection to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Keep the existing connection and close the new one.
    Existing,
    /// Make the new connection current and close the existing one.
    New,
}

/// Two live connections between `local` and `remote`: the existing one (dialed in direction
/// `existing`, current for `existing_age`) and a new one (dialed in direction `new`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Duplicate {
    /// This node.
    pub(crate) local: PeerId,
    /// The peer both connections lead to.
    pub(crate) remote: PeerId,
    /// Who dialed the existing connection.
    pub(crate) existing: Direction,
    /// Who dialed the new connection.
    pub(crate) new: Direction,
    /// How long the existing connection has been current.
    pub(crate) existing_age: Duration,
    /// Two connections made within this long of each other are one simultaneous dial.
    pub(crate) window: Duration,
}

impl Duplicate {
    /// The connection both sides keep.
    pub(crate) fn resolve(&self) -> Keep {
        let simultaneous = self.existing != self.new && self.existing_age < self.window;
        if !simultaneous || self.new == preferred_direction(self.local, self.remote) {
            Keep::New
        } else {
            Keep::Existing
        }
    }
}

/// The direction, seen from `local`, of the connection dialed by the smaller identity.
fn preferred_direction(local: PeerId, remote: PeerId) -> Direction {
    if local < remote {
        Direction::Outbound
    } else {
        Direction::Inbound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(5);

    fn ids() -> (PeerId, PeerId) {
        let a = PeerId::from_bytes([1; 32]);
        let b = PeerId::from_bytes([2; 32]);
        if a < b {
            (a, b)
        } else {
            (b, a)
        }
    }

    fn flip(direction: Direction) -> Direction {
        match direction {
            Direction::Outbound => Direction::Inbound,
            Direction::Inbound => Direction::Outbound,
        }
    }

    /// The connection each side keeps, named by who dialed it: `true` if the smaller id dialed it.
    fn kept_by_small_dialer(
        side: PeerId,
        other: PeerId,
        existing: Direction,
        small: PeerId,
    ) -> bool {
        let duplicate = Duplicate {
            local: side,
            remote: other,
            existing,
            new: flip(existing),
            existing_age: Duration::from_millis(10),
            window: WINDOW,
        };
        let kept = match duplicate.resolve() {
            Keep::Existing => existing,
            Keep::New => flip(existing),
        };
        (kept == Direction::Outbound) == (side == small)
    }

    #[test]
    fn a_simultaneous_dial_keeps_the_connection_the_smaller_id_dialed_on_both_sides() {
        let (small, large) = ids();
        for existing in [Direction::Outbound, Direction::Inbound] {
            // Each side may have registered either connection first.
            assert!(kept_by_small_dialer(small, large, existing, small));
            assert!(kept_by_small_dialer(large, small, existing, small));
        }
    }

    #[test]
    fn a_connection_older_than_the_window_is_replaced() {
        let (small, large) = ids();
        let duplicate = Duplicate {
            local: small,
            remote: large,
            existing: Direction::Outbound,
            new: Direction::Inbound,
            existing_age: WINDOW,
            window: WINDOW,
        };
        assert_eq!(duplicate.resolve(), Keep::New);
    }

    #[test]
    fn a_second_connection_in_the_same_direction_replaces_the_first() {
        let (small, large) = ids();
        for (local, remote) in [(small, large), (large, small)] {
            for direction in [Direction::Outbound, Direction::Inbound] {
                let duplicate = Duplicate {
                    local,
                    remote,
                    existing: direction,
                    new: direction,
                    existing_age: Duration::ZERO,
                    window: WINDOW,
                };
                assert_eq!(duplicate.resolve(), Keep::New);
            }
        }
    }
}
