//! Tell services about connection changes.

use std::net::SocketAddr;
use std::time::Duration;

use meshwire_proto::PeerId;
use tokio::sync::broadcast;

use super::{Direction, Inner, Node};

/// A change in a peer's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// A connection to `peer` is up.
    Connected {
        /// The peer.
        peer: PeerId,
        /// Its address.
        address: SocketAddr,
        /// Who dialed.
        direction: Direction,
    },
    /// The connection to `peer` is gone.
    Disconnected {
        /// The peer.
        peer: PeerId,
        /// Why, as quinn reported it.
        reason: String,
    },
    /// A configured peer will be dialed again after `delay`.
    Reconnecting {
        /// The peer.
        peer: PeerId,
        /// Failed attempts so far.
        attempt: u32,
        /// Wait before the next dial.
        delay: Duration,
    },
}

impl Node {
    /// Connection events from now on. A receiver that falls more than 1024 events behind skips
    /// the oldest ones (it sees `RecvError::Lagged`).
    pub fn events(&self) -> broadcast::Receiver<ConnectionEvent> {
        self.inner.events.subscribe()
    }
}

impl Inner {
    pub(super) fn emit(&self, event: ConnectionEvent) {
        // No receiver is fine: events are informational.
        let _ = self.events.send(event);
    }
}
