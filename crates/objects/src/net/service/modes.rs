//! Which requests of a quorum fetch ask for the content: all, none, or one in every quorum
//! (see [`ObjectService::read_from`](super::ObjectService::read_from)).

use std::sync::Mutex;
use std::time::Duration;

use crate::net::store::StoredObject;
use crate::proto::object::{FetchMode, Stamp};
use crate::proto::quorum::CONFIDENCE;

use super::{lock, now};

/// Requests made closer together than this are made at once (one pass of the plan), not one as
/// a hedge for the other.
const HEDGE_GAP: Duration = Duration::from_millis(1);

/// What this node knows of a replica a request goes to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Odds {
    /// The probability that it answers in time.
    pub(super) timely: f64,
    /// Whether no request of this node is out to it.
    pub(super) idle: bool,
}

/// Which mode each request of one quorum fetch asks in.
#[derive(Debug)]
pub(super) enum Modes {
    /// Every request in this mode.
    All(FetchMode),
    /// The content from one replica, version and hash from the others (a read, see
    /// `service/read.rs`).
    OneFull(Mutex<OneFull>),
}

/// The state of [`Modes::OneFull`].
#[derive(Debug)]
pub(super) struct OneFull {
    /// Requests made so far.
    asked: usize,
    /// The mode of a request that asks for the content.
    full: FetchMode,
    /// The first request that asks for the content (`usize::MAX`: none, this node answers it
    /// from its own store).
    full_at: usize,
    /// One request in this many asks for the content.
    quorum: usize,
    /// The first answer with the content, published also after the plan ended (a request it left
    /// in flight may still bring it).
    content: tokio::sync::watch::Sender<Option<StoredObject>>,
    /// When the content was last asked for.
    full_sent: Option<std::time::Instant>,
    /// The chance that none of the requests asking for the content so far answers in time,
    /// each by its replica's timeliness.
    miss: f64,
    /// Whether the fetch has more candidates than its quorum, so that it may end without
    /// waiting for one of the replicas asked for the content.
    may_skip: bool,
}

impl Modes {
    /// The content from one replica in every `quorum` requests, starting with the one at `full_at`
    /// (taken by turns below `quorum` by the caller, so that the replicas ranked first share the
    /// reads' content evenly): a plan that asks more replicas than its quorum (at first, while it
    /// cannot tell which are slow) expects some not to answer in time, and the content should not
    /// wait on one of those. None when this node is a candidate (its own copy is read once the
    /// quorum's winner is known). A later request (a hedge for a late one) also asks for the
    /// content while none has arrived, and so does any request to an idle replica while the chance
    /// that every replica asked for it so far is late is above 1 − [`CONFIDENCE`] (by each
    /// replica's timeliness: before any answer, every replica is a stranger at even odds), if there
    /// are more `candidates` than the quorum (when every candidate must answer, the content comes
    /// with the quorum from whichever replica carries it).
    ///
    /// With `stream` (a read that streams its content to its client), those requests ask for
    /// the content only if it is small ([`FetchMode::FullIfSmall`]): a larger one is fetched
    /// once the winner is known, as a stream, so that the read never holds it whole.
    pub(super) fn one_full(full_at: usize, quorum: usize, candidates: usize, stream: bool) -> Self {
        Self::OneFull(Mutex::new(OneFull {
            full: if stream {
                FetchMode::FullIfSmall
            } else {
                FetchMode::Full
            },
            asked: 0,
            full_at,
            quorum: quorum.max(1),
            content: tokio::sync::watch::Sender::new(None),
            full_sent: None,
            miss: 1.0,
            may_skip: candidates > quorum.max(1),
        }))
    }

    /// The mode of the next request, to this node itself if `local`, else to a replica whose
    /// [`Odds`] are looked up only if the mode depends on them.
    pub(super) fn next(&self, local: bool, odds: impl FnOnce() -> Odds) -> FetchMode {
        match self {
            Self::All(mode) => *mode,
            // This node's content is read once the quorum's winner is known, and only if it is
            // the winner's (a read streams it from its content file).
            Self::OneFull(_) if local => FetchMode::Metadata,
            Self::OneFull(state) => {
                let mut state = lock(state);
                let index = state.asked;
                state.asked += 1;
                let at = now();
                let in_turn = index >= state.full_at && (index - state.full_at) % state.quorum == 0;
                // A request made in the same instant as the last one for the content is not a
                // hedge for it.
                let hedge = state.full_at != usize::MAX
                    && state.content.borrow().is_none()
                    && state
                        .full_sent
                        .is_some_and(|sent| at.saturating_duration_since(sent) >= HEDGE_GAP);
                // While the replicas asked for the content so far may well all be late
                // (strangers, before any has answered), the next one asks for it too if it owes
                // this node no answer: the content must come with the quorum, not a round trip
                // after it, and an idle replica's copy leaves at once, in its connection's first
                // window, delaying no other answer of it.
                let odds = (state.full_at != usize::MAX && state.may_skip).then(odds);
                let uncertain = odds.is_some_and(|odds| {
                    odds.idle && index >= state.full_at && state.miss > 1.0 - CONFIDENCE
                });
                if in_turn || hedge || uncertain {
                    if let Some(odds) = odds {
                        state.miss *= 1.0 - odds.timely.clamp(0.0, 1.0);
                    }
                    state.full_sent = Some(at);
                    state.full
                } else {
                    FetchMode::Metadata
                }
            }
        }
    }

    /// Whether this node's own copy may come with its content when the object cache holds it
    /// (a read's modes; a fetch in one mode for all gets what it asked for).
    pub(super) fn reads_local_content(&self) -> bool {
        matches!(self, Self::OneFull(_))
    }

    pub(super) fn content_received(&self, object: StoredObject) {
        if let Self::OneFull(state) = self {
            // The newest copy is kept: a stale replica's content never hides the winner's.
            lock(state).content.send_if_modified(|held| {
                let newer = held
                    .as_ref()
                    .is_none_or(|held| crate::proto::entropy::wins(&object.stamp, &held.stamp));
                if newer {
                    *held = Some(object);
                }
                newer
            });
        }
    }

    /// Waits for an answer carrying `winner`'s content, from a request made in these modes, for
    /// as long as the plan's requests are followed up; never returns if none brings it.
    pub(super) async fn carried(&self, winner: Stamp) -> StoredObject {
        if let Self::OneFull(state) = self {
            let mut arrivals = lock(state).content.subscribe();
            let found = arrivals
                .wait_for(|held| held.as_ref().is_some_and(|o| o.stamp == winner))
                .await
                .ok()
                .and_then(|held| held.clone());
            if let Some(object) = found {
                return object;
            }
        }
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::object;
    use bytes::Bytes;

    /// A replica known to answer in time, with requests of this node out to it.
    fn known() -> Odds {
        Odds {
            timely: 1.0,
            idle: false,
        }
    }

    fn copy(version: u64, content: &'static [u8]) -> StoredObject {
        StoredObject {
            stamp: Stamp {
                version,
                hash: object::content_hash(content),
            },
            content: Bytes::from_static(content),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_request_in_every_quorum_asks_for_the_content_and_a_later_hedge_too() {
        let modes = Modes::one_full(1, 3, 10, false);
        // The plan's first pass: seven requests at one instant.
        let first: Vec<FetchMode> = (0..7).map(|_| modes.next(false, known)).collect();
        use FetchMode::{Full, Metadata};
        assert_eq!(
            first,
            [Metadata, Full, Metadata, Metadata, Full, Metadata, Metadata]
        );
        // This node answers itself with version and hash, whatever its turn.
        assert_eq!(modes.next(true, known), Metadata);
        // A request made later is a hedge for a late one: it asks for the content while none
        // has arrived...
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(modes.next(false, known), Full);
        // ...but not once it has.
        modes.content_received(copy(1, b"v1"));
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(modes.next(false, known), Metadata);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_strangers_ask_for_the_content_until_one_of_them_is_likely_in_time() {
        use FetchMode::{Full, Metadata};
        let stranger = || Odds {
            timely: 0.5,
            idle: true,
        };
        let modes = Modes::one_full(1, 3, 10, false);
        // Before its turn nobody asks for it; from then on, each stranger at even odds does
        // until the chance that all of them are late is at most 1 - CONFIDENCE: seven of them.
        let first: Vec<FetchMode> = (0..10).map(|_| modes.next(false, stranger)).collect();
        assert_eq!(
            first,
            [Metadata, Full, Full, Full, Full, Full, Full, Full, Metadata, Metadata]
        );
        // A replica that already owes this node an answer is asked only in its turn.
        let busy = || Odds {
            timely: 0.5,
            idle: false,
        };
        let modes = Modes::one_full(0, 3, 10, false);
        let first: Vec<FetchMode> = (0..4).map(|_| modes.next(false, busy)).collect();
        assert_eq!(first, [Full, Metadata, Metadata, Full]);
        // When every candidate must answer, whichever carries the content answers with the
        // quorum: one in every quorum is enough, strangers or not.
        let modes = Modes::one_full(0, 3, 3, false);
        let first: Vec<FetchMode> = (0..3).map(|_| modes.next(false, stranger)).collect();
        assert_eq!(first, [Full, Metadata, Metadata]);
        // One replica known to be timely is enough.
        let modes = Modes::one_full(0, 3, 10, false);
        let timely = || Odds {
            timely: 0.995,
            idle: true,
        };
        let first: Vec<FetchMode> = (0..3).map(|_| modes.next(false, timely)).collect();
        assert_eq!(first, [Full, Metadata, Metadata]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_is_a_candidate_asks_no_one_else_for_the_content() {
        let modes = Modes::one_full(usize::MAX, 2, 10, false);
        assert_eq!(modes.next(true, known), FetchMode::Metadata);
        for _ in 0..4 {
            assert_eq!(modes.next(false, known), FetchMode::Metadata);
        }
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(modes.next(false, known), FetchMode::Metadata);
    }

    #[tokio::test(start_paused = true)]
    async fn the_newest_content_is_kept_and_waited_for() {
        let modes = Modes::one_full(0, 2, 10, false);
        let new = copy(2, b"new");
        modes.content_received(new.clone());
        modes.content_received(copy(1, b"old"));
        let found = tokio::time::timeout(Duration::from_secs(1), modes.carried(new.stamp))
            .await
            .expect("the held copy is the winner");
        assert_eq!(found.content, new.content);
        // No answer carries a copy that never arrived: the wait does not end.
        let missing = Stamp {
            version: 3,
            hash: object::content_hash(b"newest"),
        };
        assert!(
            tokio::time::timeout(Duration::from_secs(1), modes.carried(missing))
                .await
                .is_err()
        );
        // Every request of a fetch in one mode leaves nothing to wait for.
        let all = Modes::All(FetchMode::Full);
        assert_eq!(all.next(false, known), FetchMode::Full);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), all.carried(new.stamp))
                .await
                .is_err()
        );
    }
}
