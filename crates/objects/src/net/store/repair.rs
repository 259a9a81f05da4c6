//! Which commits of a store on disk save redb's allocator state (quick repair), so that opening
//! the store after a crash does not rebuild that state by walking the whole file.
//!
//! redb saves the allocator state in a commit only when the commit asks for it, and a store
//! reopened after a crash is quick only if its last commit did. Saving it rewrites the whole
//! state, which grows with the file: on the 2-core test machine it took about three quarters of
//! each commit's CPU (4–5 ms per commit with a 200–800 MB redb file), and a node wrote about
//! 1,000 PUTs of 4 KiB per second alone and 620 through a 3-node cluster. Without it, 4,200–4,900
//! and 2,250–2,350 (`bash bench/http.sh`'s PUT load, wrk -c10), and a crash during writes costs a
//! rebuild on the next open: 1.36 s for a 545 MB redb file of 4 KiB objects (0.04 s with the
//! state saved).
//!
//! So a commit saves the state when writes are sparse, and a busy store saves it once it falls
//! idle:
//! - a commit that comes at least [`QUICK_REPAIR_GAP`] after the store's previous commit ended
//!   saves the state (at most one such commit per gap: at 4–5 ms each, under a tenth of a core);
//! - a commit closer behind the previous one does not; the store then counts as unsaved, and
//!   [`Repair::notified`] wakes whoever keeps it ([`crate::net::ObjectService::spawn_checkpoints`]),
//!   which calls [`super::Store::checkpoint`] once no commit has ended for the gap: an empty
//!   commit that saves the state.
//!
//! A crash while the store is idle therefore reopens quickly; a crash during a run of writes
//! rebuilds the state (about 2.5 s per GB of redb file measured; large objects live in content
//! files outside it). Either way every acknowledged write is there: durability does not depend
//! on the allocator state, only the time to reopen does.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A commit at least this long after the previous one ended saves the allocator state, and a
/// store left unsaved is checkpointed once no commit has ended for this long.
pub const QUICK_REPAIR_GAP: Duration = Duration::from_millis(50);

/// The longest wait between two attempts at a checkpoint that keeps failing (the wait starts at
/// [`QUICK_REPAIR_GAP`] and doubles with each failure in a row).
pub const CHECKPOINT_MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The state of a store on disk's crash recovery.
#[derive(Debug)]
pub(super) struct Repair {
    state: Mutex<State>,
    unsaved: Notify,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// When the last commit ended.
    last_commit: Option<Instant>,
    /// Whether the last commit asked to save the allocator state (or none happened since open).
    saved: bool,
}

impl Repair {
    /// A store just opened: redb saved the allocator state when it was last closed or repaired.
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                last_commit: None,
                saved: true,
            }),
            unsaved: Notify::new(),
        }
    }

    /// Whether the commit about to be made (the caller holds its write transaction) saves the
    /// allocator state: `force`, or the last commit ended at least the gap ago. Recorded now,
    /// while no other commit can come between.
    pub(super) fn decide(&self, force: bool, now: Instant) -> bool {
        let mut state = self.lock();
        let quick = force
            || state
                .last_commit
                .is_none_or(|at| now.saturating_duration_since(at) >= QUICK_REPAIR_GAP);
        state.saved = quick;
        quick
    }

    /// The commit decided on ended at `now`, or failed (`ok` false: counted as unsaved).
    pub(super) fn committed(&self, ok: bool, now: Instant) {
        let unsaved = {
            let mut state = self.lock();
            state.last_commit = Some(now);
            state.saved &= ok;
            !state.saved
        };
        if unsaved {
            self.unsaved.notify_one();
        }
    }

    /// When the last commit ended, if it left the allocator state unsaved.
    pub(super) fn unsaved_since(&self) -> Option<Instant> {
        let state = *self.lock();
        match state {
            State {
                saved: false,
                last_commit: Some(at),
            } => Some(at),
            _ => None,
        }
    }

    /// When a checkpoint is due: [`QUICK_REPAIR_GAP`] after the last commit ended, if it left
    /// the allocator state unsaved.
    pub(super) fn checkpoint_due_at(&self) -> Option<Instant> {
        self.unsaved_since().map(|at| at + QUICK_REPAIR_GAP)
    }

    /// Resolves after a commit that left the allocator state unsaved (at once if one came since
    /// the last call).
    pub(super) async fn notified(&self) {
        self.unsaved.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_commits_save_and_close_ones_do_not() {
        let repair = Repair::new();
        let t0 = Instant::now();
        assert!(repair.decide(false, t0), "the first commit saves");
        repair.committed(true, t0);
        assert_eq!(repair.unsaved_since(), None);
        let soon = t0 + QUICK_REPAIR_GAP / 2;
        assert!(
            !repair.decide(false, soon),
            "a commit close behind does not"
        );
        repair.committed(true, soon);
        assert_eq!(repair.unsaved_since(), Some(soon));
        let later = soon + QUICK_REPAIR_GAP;
        assert!(repair.decide(false, later), "one a gap later does");
        repair.committed(true, later);
        assert_eq!(repair.unsaved_since(), None);
        assert!(repair.decide(true, later), "a checkpoint always does");
    }

    #[test]
    fn a_failed_commit_counts_as_unsaved() {
        let repair = Repair::new();
        let t0 = Instant::now();
        assert!(repair.decide(false, t0));
        repair.committed(false, t0);
        assert_eq!(repair.unsaved_since(), Some(t0));
    }

    #[test]
    fn a_busy_store_is_checkpointed_once_idle_and_keeps_its_objects() {
        use crate::net::store::Store;
        use crate::proto::object::{content_hash, Stamp};
        use bytes::Bytes;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("objects.redb");
        let store = Store::open(&path, 1 << 20).unwrap();
        let repair = store
            .repair
            .as_ref()
            .expect("a store on disk keeps its repair state");
        let put = |n: u64| {
            let content = Bytes::from(format!("object {n}"));
            let stamp = Stamp {
                version: n,
                hash: content_hash(&content),
            };
            store.put(&format!("k{n}"), stamp, content).unwrap();
        };
        // Writes back to back until one commits without saving the allocator state (the first
        // after opening saves it; the next follows within the gap unless this thread stalls).
        let mut written = 0;
        while repair.unsaved_since().is_none() {
            written += 1;
            assert!(
                written < 1000,
                "no commit came within the gap of the one before"
            );
            put(written);
        }
        std::thread::sleep(QUICK_REPAIR_GAP + Duration::from_millis(10));
        assert!(
            store.checkpoint().unwrap(),
            "an idle unsaved store is checkpointed"
        );
        assert_eq!(store.commit_counts().checkpoints.get(), 1);
        assert_eq!(repair.unsaved_since(), None);
        assert!(!store.checkpoint().unwrap(), "once");
        drop(store);
        let store = Store::open(&path, 1 << 20).unwrap();
        for n in 1..=written {
            let object = store.get(&format!("k{n}")).unwrap().expect("kept");
            assert_eq!(object.content, format!("object {n}"));
        }
    }

    #[test]
    fn a_store_in_memory_has_nothing_to_save() {
        let store = crate::net::store::Store::in_memory(1 << 20).unwrap();
        assert!(store.repair.is_none());
        assert!(!store.checkpoint().unwrap());
    }

    #[tokio::test]
    async fn an_unsaved_commit_wakes_the_keeper() {
        let repair = Repair::new();
        let t0 = Instant::now();
        repair.decide(false, t0);
        repair.committed(true, t0);
        repair.decide(false, t0);
        repair.committed(true, t0);
        // The wake-up waits for the keeper even if it was not listening yet.
        tokio::time::timeout(Duration::from_secs(5), repair.notified())
            .await
            .expect("woken");
    }
}
