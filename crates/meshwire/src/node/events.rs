//! Tell services about connection changes: a lossless per-subscriber peer up/down stream, and
//! an informational broadcast of every connection event.
//!
//! [`PeerEvents`] never loses a change, yet its memory is bounded by the number of peers: the
//! changes a slow reader has not read yet are coalesced per peer to at most two, the first change
//! after the state it last read and the current state. A reader that last read a peer up and reads
//! late after the peer went down and came back still reads `Down` then `Up`; one that reads after
//! the peer went down, came back and went down again reads `Down` once (and a peer it never read
//! up that came and went and came back reads `Up` once).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use meshwire_proto::PeerId;
use quinn::ConnectionError;
use tokio::sync::{broadcast, Notify};

use super::{lock, Direction, Inner, Node};

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
        reason: ConnectionError,
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

/// A peer came up (this node now has a connection to it) or went down (it has none). A
/// connection replaced by another to the same peer (a simultaneous dial, a restarted peer whose
/// old connection had not closed yet) is no change: the peer stays up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerChange {
    /// The peer is connected.
    Up(PeerId),
    /// The peer is no longer connected.
    Down(PeerId),
}

/// One subscriber's stream of peer changes (see [`Node::peer_events`]). Nothing is lost however
/// slowly it is read; memory stays bounded by the number of peers.
#[derive(Debug)]
pub struct PeerEvents {
    watcher: Arc<Watcher>,
}

impl PeerEvents {
    /// The next change, waiting for one; `None` once the node is gone. Cancel-safe: a change is
    /// taken only when this returns it.
    pub async fn recv(&mut self) -> Option<PeerChange> {
        loop {
            {
                let mut backlog = lock(&self.watcher.backlog);
                if let Some(change) = backlog.pop() {
                    return Some(change);
                }
                if backlog.closed {
                    return None;
                }
            }
            self.watcher.wake.notified().await;
        }
    }

    /// The next change if one is waiting.
    pub fn try_recv(&mut self) -> Option<PeerChange> {
        lock(&self.watcher.backlog).pop()
    }
}

#[derive(Debug, Default)]
struct Watcher {
    backlog: Mutex<Backlog>,
    wake: Notify,
}

/// Unread changes: per peer, whether it is up in the first unread change and, if it changed
/// again since, in the latest.
#[derive(Debug, Default)]
struct Backlog {
    order: VecDeque<PeerId>,
    unread: HashMap<PeerId, (bool, Option<bool>)>,
    closed: bool,
}

impl Backlog {
    fn push(&mut self, peer: PeerId, up: bool) {
        match self.unread.get_mut(&peer) {
            None => {
                self.unread.insert(peer, (up, None));
                self.order.push_back(peer);
            }
            Some((first, latest)) => match *latest {
                // A flip back to the state before the first unread change cancels nothing: the
                // reader must still learn that the peer went away and came back.
                None if *first != up => *latest = Some(up),
                // first, latest, first again: the reader's next read is `first` either way.
                Some(previous) if previous != up => *latest = None,
                _ => {}
            },
        }
    }

    fn pop(&mut self) -> Option<PeerChange> {
        let peer = *self.order.front()?;
        let entry = self.unread.get_mut(&peer)?;
        let (up, latest) = *entry;
        match latest {
            Some(next) => *entry = (next, None),
            None => {
                self.unread.remove(&peer);
                self.order.pop_front();
            }
        }
        Some(if up {
            PeerChange::Up(peer)
        } else {
            PeerChange::Down(peer)
        })
    }
}

/// The node's peer-change subscribers.
#[derive(Debug, Default)]
pub(super) struct PeerWatchers {
    watchers: Mutex<Vec<Weak<Watcher>>>,
}

impl PeerWatchers {
    /// Tells every live subscriber that `peer` went up or down; forgets dropped subscribers.
    pub(super) fn announce(&self, peer: PeerId, up: bool) {
        let mut watchers = lock(&self.watchers);
        watchers.retain(|watcher| {
            let Some(watcher) = watcher.upgrade() else {
                return false;
            };
            lock(&watcher.backlog).push(peer, up);
            watcher.wake.notify_one();
            true
        });
    }

    /// A new subscriber that first reads `Up` for each of `up_now`.
    fn subscribe(&self, up_now: impl IntoIterator<Item = PeerId>) -> PeerEvents {
        let watcher = Arc::new(Watcher::default());
        {
            let mut backlog = lock(&watcher.backlog);
            for peer in up_now {
                backlog.push(peer, true);
            }
        }
        lock(&self.watchers).push(Arc::downgrade(&watcher));
        PeerEvents { watcher }
    }
}

impl Drop for PeerWatchers {
    fn drop(&mut self) {
        // The node is gone: every stream ends once its backlog is read.
        for watcher in lock(&self.watchers).drain(..) {
            if let Some(watcher) = watcher.upgrade() {
                lock(&watcher.backlog).closed = true;
                watcher.wake.notify_one();
            }
        }
    }
}

impl Node {
    /// Connection events from now on, for logs and tools. A receiver that falls more than 1024
    /// events behind skips the oldest ones (it sees `RecvError::Lagged`); services that must not
    /// miss a change use [`Node::peer_events`].
    pub fn events(&self) -> broadcast::Receiver<ConnectionEvent> {
        self.inner.events.subscribe()
    }

    /// Every peer change from now on, starting with `Up` for each peer connected now (in id
    /// order). Lossless and bounded: see [`PeerEvents`].
    pub fn peer_events(&self) -> PeerEvents {
        // Taken under the peers lock, which every announcement holds: no change falls between
        // the snapshot and the subscription.
        let peers = lock(&self.inner.peers);
        let mut up_now: Vec<PeerId> = peers
            .iter()
            .filter(|(_, peer)| peer.up)
            .map(|(id, _)| *id)
            .collect();
        up_now.sort();
        self.inner.peer_watchers.subscribe(up_now)
    }
}

impl Inner {
    pub(super) fn emit(&self, event: ConnectionEvent) {
        // No receiver is fine: events are informational.
        let _ = self.events.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(byte: u8) -> PeerId {
        PeerId::from_bytes([byte; 32])
    }

    fn drain(backlog: &mut Backlog) -> Vec<PeerChange> {
        std::iter::from_fn(|| backlog.pop()).collect()
    }

    #[test]
    fn a_bounce_read_late_is_down_then_up() {
        let mut backlog = Backlog::default();
        backlog.push(peer(1), false);
        backlog.push(peer(1), true);
        assert_eq!(
            drain(&mut backlog),
            [PeerChange::Down(peer(1)), PeerChange::Up(peer(1))]
        );
    }

    #[test]
    fn an_up_never_read_then_a_bounce_reads_as_one_up() {
        // The reader never learned the peer was up, so up-down-up is just up to it.
        let mut backlog = Backlog::default();
        backlog.push(peer(1), true);
        backlog.push(peer(1), false);
        backlog.push(peer(1), true);
        assert_eq!(drain(&mut backlog), [PeerChange::Up(peer(1))]);
    }

    #[test]
    fn many_bounces_are_bounded_and_end_in_the_current_state() {
        let mut backlog = Backlog::default();
        for _ in 0..1000 {
            backlog.push(peer(1), false);
            backlog.push(peer(1), true);
        }
        backlog.push(peer(2), true);
        backlog.push(peer(1), false);
        assert_eq!(backlog.order.len(), 2);
        assert_eq!(
            drain(&mut backlog),
            [PeerChange::Down(peer(1)), PeerChange::Up(peer(2))]
        );
    }

    #[test]
    fn changes_of_different_peers_keep_their_order() {
        let mut backlog = Backlog::default();
        backlog.push(peer(3), true);
        backlog.push(peer(1), true);
        backlog.push(peer(3), false);
        assert_eq!(
            drain(&mut backlog),
            [
                PeerChange::Up(peer(3)),
                PeerChange::Down(peer(3)),
                PeerChange::Up(peer(1))
            ]
        );
    }
}
