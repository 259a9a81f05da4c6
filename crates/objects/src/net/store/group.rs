//! Group commit: concurrent writes share one durable transaction.
//!
//! A durable commit costs a few disk flushes (2-5 ms each on the 2-core test machine's virtual
//! disk under load), and redb runs one write transaction at a time, so with one commit per write
//! a node wrote at most a few hundred objects per second however many clients it served. Here a
//! writer queues its write; if no commit is running it becomes the leader, takes what is queued
//! (up to [`GROUP_BYTES`]), applies it in queue order in one transaction and commits once, then
//! hands every writer of the group its own outcome. Writers that arrive meanwhile queue for the
//! next group. A lone writer commits alone at once, as before: grouping adds no wait.
//!
//! Each write's outcome is what it would have been alone in that order: it is checked against
//! the headers as the earlier writes of its group left them (redb's transaction sees its own
//! writes), and one that loses or fails its precondition writes nothing. If applying any write
//! fails, or the commit fails, nothing of the group is kept and each write is retried in a
//! transaction of its own, so each gets its own outcome or error.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

use bytes::Bytes;

use super::{Store, StoreError, StoredObject, Tables};
use crate::proto::cas::Precondition;
use crate::proto::object::Stamp;

/// Content bytes a leader takes into one group (always at least one write).
pub(super) const GROUP_BYTES: usize = 8 << 20;

/// A write's outcome: the stamp held afterwards, or the held stamp it lost to (`None`: absent).
pub(super) type Outcome = Result<Result<Stamp, Option<Stamp>>, StoreError>;

/// One queued write.
pub(super) struct Write {
    pub key: String,
    pub stamp: Stamp,
    /// The content; empty when only `file` holds it (a write streamed into its file, of an
    /// object too large for the object cache).
    pub content: Bytes,
    /// The content's length.
    pub len: u64,
    pub precondition: Option<Precondition>,
    /// The content file already holding `content`, if it goes to one.
    pub file: Option<u64>,
}

/// The queue of writes and their outcomes.
#[derive(Debug, Default)]
pub(super) struct Group {
    state: Mutex<State>,
    finished: Condvar,
}

#[derive(Default)]
struct State {
    next_ticket: u64,
    queued: VecDeque<(u64, Write)>,
    committing: bool,
    outcomes: HashMap<u64, Outcome>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queued.len())
            .field("committing", &self.committing)
            .finish()
    }
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `write` to `store`, in a group with whatever other writes are queued.
    pub(super) fn write(&self, store: &Store, write: Write) -> Outcome {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queued.push_back((ticket, write));
        loop {
            if let Some(outcome) = state.outcomes.remove(&ticket) {
                return outcome;
            }
            if state.committing {
                state = self.finished.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Lead the next group: everything queued, up to GROUP_BYTES.
            state.committing = true;
            let mut bytes = 0;
            let mut group = Vec::new();
            while let Some((_, write)) = state.queued.front() {
                if !group.is_empty() && bytes + write.content.len() > GROUP_BYTES {
                    break;
                }
                // Only held content counts: a streamed write's file is written already.
                bytes += write.content.len();
                group.extend(state.queued.pop_front());
            }
            drop(state);
            let mut leader = Leader {
                group: self,
                tickets: group.iter().map(|(ticket, _)| *ticket).collect(),
                outcomes: Vec::new(),
            };
            let writes: Vec<Write> = group.into_iter().map(|(_, write)| write).collect();
            leader.outcomes = commit(store, &writes);
            drop(leader);
            state = self.lock();
        }
    }
}

/// Hands the group's outcomes over and lets the next leader go, also if the commit panicked
/// (each write of the group then fails as [`StoreError::Stopped`]: its worker stopped).
struct Leader<'a> {
    group: &'a Group,
    tickets: Vec<u64>,
    outcomes: Vec<Outcome>,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut outcomes = std::mem::take(&mut self.outcomes).into_iter();
        let mut state = self.group.lock();
        for &ticket in &self.tickets {
            let outcome = outcomes.next().unwrap_or(Err(StoreError::Stopped));
            state.outcomes.insert(ticket, outcome);
        }
        state.committing = false;
        drop(state);
        self.group.finished.notify_all();
    }
}

/// Applies `writes` in one transaction and commits; falls back to one transaction per write if
/// that fails. Updates the object cache with what was written, and removes the content files of
/// writes that wrote nothing.
pub(super) fn commit(store: &Store, writes: &[Write]) -> Vec<Outcome> {
    let outcomes = match together(store, writes) {
        Ok(outcomes) => outcomes,
        Err(_) if writes.len() > 1 => writes
            .iter()
            .map(|write| {
                together(store, std::slice::from_ref(write)).and_then(|mut one| one.remove(0))
            })
            .collect(),
        Err(error) => vec![Err(error)],
    };
    for (write, outcome) in writes.iter().zip(&outcomes) {
        if let (Some(id), false) = (write.file, matches!(outcome, Ok(Ok(_)))) {
            store.remove_file(id);
        }
    }
    let mut cache = store.cache();
    for (write, outcome) in writes.iter().zip(&outcomes) {
        // A streamed write's content not held is read from its file when asked for.
        if matches!(outcome, Ok(Ok(_))) && write.content.len() as u64 == write.len {
            cache.insert(
                &write.key,
                StoredObject {
                    stamp: write.stamp,
                    content: write.content.clone(),
                },
            );
        }
    }
    outcomes
}

/// Applies `writes` in one transaction and commits it, unless none of them writes anything.
fn together(store: &Store, writes: &[Write]) -> Result<Vec<Outcome>, StoreError> {
    let txn = store.write_txn()?;
    let mut outcomes = Vec::with_capacity(writes.len());
    let (replaced, new_files) = {
        let mut tables = Tables::open(&txn)?;
        for write in writes {
            outcomes.push(Ok(tables.apply(
                &write.key,
                write.stamp,
                (&write.content, write.len),
                write.file,
                write.precondition,
            )?));
        }
        (tables.replaced, tables.new_files)
    };
    let written = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(Ok(_))))
        .count();
    if written > 0 {
        if let (true, Some(files)) = (new_files, &store.files) {
            files.sync_dir()?;
        }
        store.commit(txn)?;
        store.counts.committed(written);
        for id in replaced {
            store.remove_file(id);
        }
    }
    // Else nothing was written: the transaction is dropped, not committed.
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::proto::object::content_hash;

    fn write(key: &str, version: u64, precondition: Option<Precondition>) -> Write {
        let content = Bytes::from(format!("{key} v{version}"));
        Write {
            key: key.to_string(),
            stamp: Stamp {
                version,
                hash: content_hash(&content),
            },
            len: content.len() as u64,
            content,
            precondition,
            file: None,
        }
    }

    /// Starts `writes` on threads while a commit is marked running, waits until all are queued,
    /// then lets them go: they commit as one group. Returns each write's outcome, in order.
    fn queued_then_released(store: &Arc<Store>, writes: Vec<Write>) -> Vec<Outcome> {
        let count = writes.len();
        store.group.lock().committing = true;
        let threads: Vec<_> = writes
            .into_iter()
            .map(|write| {
                let store = store.clone();
                std::thread::spawn(move || store.group.write(&store, write))
            })
            .collect();
        while store.group.lock().queued.len() < count {
            std::thread::sleep(Duration::from_millis(1));
        }
        store.group.lock().committing = false;
        store.group.finished.notify_all();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    }

    #[test]
    fn queued_writes_commit_once_each_with_its_own_outcome() {
        let store = Arc::new(Store::in_memory(1 << 20).unwrap());
        let held = write("taken", 5, None);
        let held_stamp = held.stamp;
        store
            .put(&held.key, held.stamp, held.content.clone())
            .unwrap();
        let commits_before = store.counts.commits.get();
        let mut writes: Vec<Write> = (0..8).map(|i| write(&format!("k{i}"), 1, None)).collect();
        // Loses to the held version, and a create that finds the key taken: neither writes.
        writes.push(write("taken", 4, None));
        writes.push(write("taken", 9, Some(Precondition::Absent)));
        let outcomes = queued_then_released(&store, writes);
        for (i, outcome) in outcomes[..8].iter().enumerate() {
            let stamp = outcome.as_ref().unwrap().unwrap();
            let object = store.get(&format!("k{i}")).unwrap().unwrap();
            assert_eq!(object.stamp, stamp);
            assert_eq!(object.content, format!("k{i} v1"));
        }
        assert_eq!(*outcomes[8].as_ref().unwrap(), Err(Some(held_stamp)));
        assert_eq!(*outcomes[9].as_ref().unwrap(), Err(Some(held_stamp)));
        assert_eq!(store.counts.commits.get() - commits_before, 1);
        assert_eq!(store.counts.writes.get(), 1 + 8);
        assert_eq!(store.size().unwrap().objects, 9);
    }

    #[test]
    fn writes_of_one_key_in_a_group_see_the_earlier_ones() {
        let store = Arc::new(Store::in_memory(1 << 20).unwrap());
        // Concurrent creates of one key: whichever the group applies first wins, the others
        // find it taken.
        let outcomes = queued_then_released(
            &store,
            (1..=6)
                .map(|version| write("k", version, Some(Precondition::Absent)))
                .collect(),
        );
        let winners: Vec<Stamp> = outcomes
            .iter()
            .filter_map(|outcome| outcome.as_ref().unwrap().ok())
            .collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        let stored = store.get("k").unwrap().unwrap();
        assert_eq!(stored.stamp, winners[0]);
        for outcome in &outcomes {
            if let Ok(Err(held)) = outcome {
                assert_eq!(*held, Some(winners[0]));
            }
        }
        assert_eq!(store.counts.commits.get(), 1);
    }

    #[test]
    fn a_group_is_cut_at_its_byte_budget() {
        let store = Arc::new(Store::in_memory(64 << 20).unwrap());
        let big = |key: &str| {
            let content = Bytes::from(vec![7u8; GROUP_BYTES / 2 + 1]);
            Write {
                key: key.to_string(),
                stamp: Stamp {
                    version: 1,
                    hash: content_hash(&content),
                },
                len: content.len() as u64,
                content,
                precondition: None,
                file: None,
            }
        };
        let outcomes = queued_then_released(&store, vec![big("a"), big("b"), big("c")]);
        assert!(outcomes.iter().all(|outcome| matches!(outcome, Ok(Ok(_)))));
        assert_eq!(store.counts.commits.get(), 3);
        assert_eq!(store.size().unwrap().objects, 3);
    }
}
