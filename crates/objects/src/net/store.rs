//! Keep a node's objects in an embedded, transactional store (redb) in its data directory.
//!
//! # Design
//!
//! One redb table maps a key to `[version u64 LE][SHA-256 32][content]`, and a second holds the
//! total content bytes. A write reads the current record and replaces it only if the new copy wins
//! (higher version; at equal versions, the smaller hash, the same rule [`merge`] ends with), inside
//! one write transaction that commits durably: a crash mid-write leaves the old record or the new
//! one, never a torn one (redb's commit is atomic). Every read recomputes the hash, so a record
//! damaged on disk is reported as [`StoreError::Corrupt`] instead of being served or replicated.
//! A conditional write ([`Store::put_if`]) checks its precondition against the current record in
//! the same transaction, so no other write can slip in between the check and the write.
//!
//! Hot objects are kept in a bounded in-memory cache of shared buffers, so many readers of one large
//! object share one copy (the 250-reader test in `bench/http.sh`).
//!
//! [`merge`]: crate::proto::object::merge

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;

use crate::proto::cas::Precondition;
use crate::proto::entropy::wins;
use crate::proto::object::{content_hash, Stamp};
use bytes::Bytes;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};

const OBJECTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects");
const TOTALS: TableDefinition<'_, &str, u64> = TableDefinition::new("totals");
const CONTENT_BYTES: &str = "content_bytes";
const RECORD_HEADER: usize = 8 + 32;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file could not be opened or created.
    #[error("cannot open the object store: {0}")]
    Open(#[from] redb::DatabaseError),
    /// A transaction could not begin (boxed: redb's error is large).
    #[error("object store transaction failed: {0}")]
    Transaction(#[source] Box<redb::TransactionError>),
    /// A table could not be opened.
    #[error("object store table failed: {0}")]
    Table(#[from] redb::TableError),
    /// Reading or writing a record failed.
    #[error("object store failure: {0}")]
    Storage(#[from] redb::StorageError),
    /// A transaction could not commit.
    #[error("object store commit failed: {0}")]
    Commit(#[from] redb::CommitError),
    /// A stored record is damaged: its hash does not match, or it is too short.
    #[error("object {key:?} is corrupt: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
}

impl From<redb::TransactionError> for StoreError {
    fn from(error: redb::TransactionError) -> Self {
        Self::Transaction(Box::new(error))
    }
}

/// A stored object's stamp and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// Version and hash.
    pub stamp: Stamp,
    /// The content.
    pub content: Bytes,
}

/// How many objects and content bytes the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreSize {
    /// Objects.
    pub objects: u64,
    /// Content bytes.
    pub content_bytes: u64,
}

#[derive(Debug)]
struct Cache {
    limit_bytes: usize,
    bytes: usize,
    entries: HashMap<String, StoredObject>,
    order: VecDeque<String>,
}

impl Cache {
    fn get(&self, key: &str) -> Option<StoredObject> {
        self.entries.get(key).cloned()
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= old.content.len();
            self.order.retain(|k| k != key);
        }
    }

    fn insert(&mut self, key: &str, object: StoredObject) {
        self.remove(key);
        // An object larger than a quarter of the cache would evict too much to be worth keeping.
        if object.content.len() > self.limit_bytes / 4 {
            return;
        }
        while self.bytes + object.content.len() > self.limit_bytes {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.entries.remove(&oldest) {
                self.bytes -= old.content.len();
            }
        }
        self.bytes += object.content.len();
        self.order.push_back(key.to_string());
        self.entries.insert(key.to_string(), object);
    }
}

/// The object store.
#[derive(Debug)]
pub struct Store {
    db: redb::Database,
    cache: Mutex<Cache>,
}

/// Default bound of the in-memory cache of hot objects.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

impl Store {
    /// Opens (or creates) the store file at `path`.
    pub fn open(path: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        Self::init(redb::Database::create(path)?, cache_bytes)
    }

    /// A store in memory (tests and the lab).
    pub fn in_memory(cache_bytes: usize) -> Result<Self, StoreError> {
        let db =
            redb::Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        Self::init(db, cache_bytes)
    }

    fn init(db: redb::Database, cache_bytes: usize) -> Result<Self, StoreError> {
        // Create the tables so readers never see them missing.
        let txn = db.begin_write()?;
        txn.open_table(OBJECTS)?;
        txn.open_table(TOTALS)?;
        txn.commit()?;
        Ok(Self {
            db,
            cache: Mutex::new(Cache {
                limit_bytes: cache_bytes,
                bytes: 0,
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object under `key`, its content checked against its hash.
    pub fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        if let Some(object) = self.cache().get(key) {
            return Ok(Some(object));
        }
        let txn = self.db.begin_read()?;
        let table = txn.open_table(OBJECTS)?;
        let Some(record) = table.get(key)? else {
            return Ok(None);
        };
        let object = decode_record(key, record.value())?;
        self.cache().insert(key, object.clone());
        Ok(Some(object))
    }

    /// The stamp of the object under `key` (its content is checked too).
    pub fn stamp(&self, key: &str) -> Result<Option<Stamp>, StoreError> {
        Ok(self.get(key)?.map(|object| object.stamp))
    }

    /// Stores `content` under `key` with `stamp` if it wins over the stored copy (see the module
    /// docs). Returns the stamp the store holds afterwards. The caller has checked the hash.
    pub fn put(&self, key: &str, stamp: Stamp, content: Bytes) -> Result<Stamp, StoreError> {
        Ok(match self.apply(key, stamp, content, None)? {
            Ok(held) => held,
            Err(held) => held.unwrap_or(stamp),
        })
    }

    /// Stores `content` under `key` with `stamp` only if the stored copy satisfies `precondition`
    /// and the new copy wins over it, checked and written in one transaction. `Err` holds the
    /// stored copy's stamp (`None`: absent) when it does not.
    pub fn put_if(
        &self,
        key: &str,
        stamp: Stamp,
        content: Bytes,
        precondition: Precondition,
    ) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
        self.apply(key, stamp, content, Some(precondition))
    }

    fn apply(
        &self,
        key: &str,
        stamp: Stamp,
        content: Bytes,
        precondition: Option<Precondition>,
    ) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
        let txn = self.db.begin_write()?;
        let result = {
            let mut table = txn.open_table(OBJECTS)?;
            let mut totals = txn.open_table(TOTALS)?;
            apply_in(&mut table, &mut totals, key, stamp, &content, precondition)?
        };
        if result.is_err() {
            // Nothing was written: the transaction is dropped, not committed.
            return Ok(result);
        }
        txn.commit()?;
        self.cache().insert(key, StoredObject { stamp, content });
        Ok(result)
    }

    /// Stores each `(key, stamp, content)` that wins over the stored copy, as [`Store::put`]
    /// does, all in one durable transaction (one commit for many copies: anti-entropy's pulls).
    /// Returns the stamp the store holds afterwards for each, in order.
    pub fn put_batch(&self, copies: &[(String, Stamp, Bytes)]) -> Result<Vec<Stamp>, StoreError> {
        let txn = self.db.begin_write()?;
        let mut held = Vec::with_capacity(copies.len());
        {
            let mut table = txn.open_table(OBJECTS)?;
            let mut totals = txn.open_table(TOTALS)?;
            for (key, stamp, content) in copies {
                held.push(
                    match apply_in(&mut table, &mut totals, key, *stamp, content, None)? {
                        Ok(stamp) => stamp,
                        Err(current) => current.unwrap_or(*stamp),
                    },
                );
            }
        }
        txn.commit()?;
        let mut cache = self.cache();
        for ((key, stamp, content), now) in copies.iter().zip(&held) {
            if now == stamp {
                cache.insert(
                    key,
                    StoredObject {
                        stamp: *stamp,
                        content: content.clone(),
                    },
                );
            }
        }
        Ok(held)
    }

    /// Calls `visit` with the key, stamp and content length of every record, in key order,
    /// reading only the records' headers (the content is not hashed: a damaged record shows when
    /// it is read). Anti-entropy computes its digests with this.
    pub fn scan_stamps(&self, mut visit: impl FnMut(&str, Stamp, usize)) -> Result<(), StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(OBJECTS)?;
        for record in table.iter()? {
            let (key, value) = record?;
            let key = key.value();
            let (stamp, len) = record_header(key, value.value())?;
            visit(key, stamp, len);
        }
        Ok(())
    }

    /// The stamp and content length of the record under `key`, from its header only.
    pub fn header(&self, key: &str) -> Result<Option<(Stamp, usize)>, StoreError> {
        if let Some(object) = self.cache().get(key) {
            return Ok(Some((object.stamp, object.content.len())));
        }
        let txn = self.db.begin_read()?;
        let table = txn.open_table(OBJECTS)?;
        let Some(record) = table.get(key)? else {
            return Ok(None);
        };
        Ok(Some(record_header(key, record.value())?))
    }

    /// Objects and content bytes held.
    pub fn size(&self) -> Result<StoreSize, StoreError> {
        let txn = self.db.begin_read()?;
        let objects = txn.open_table(OBJECTS)?.len()?;
        let content_bytes = txn
            .open_table(TOTALS)?
            .get(CONTENT_BYTES)?
            .map_or(0, |v| v.value());
        Ok(StoreSize {
            objects,
            content_bytes,
        })
    }
}

/// Writes `content` under `key` with `stamp` in an open transaction if `precondition` holds
/// and the copy wins over the stored one; `Err` holds the stored copy's stamp when it does not.
fn apply_in(
    table: &mut redb::Table<'_, &'static str, &'static [u8]>,
    totals: &mut redb::Table<'_, &'static str, u64>,
    key: &str,
    stamp: Stamp,
    content: &[u8],
    precondition: Option<Precondition>,
) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
    let old = match table.get(key)? {
        Some(record) => Some(record_header(key, record.value())?),
        None => None,
    };
    let current = old.map(|(old, _)| old);
    if precondition.is_some_and(|p| !p.holds(current.as_ref())) {
        return Ok(Err(current));
    }
    if !old.is_none_or(|(old, _)| wins(&stamp, &old)) {
        return Ok(Err(current));
    }
    let mut record = Vec::with_capacity(RECORD_HEADER + content.len());
    record.extend_from_slice(&stamp.version.to_le_bytes());
    record.extend_from_slice(&stamp.hash);
    record.extend_from_slice(content);
    table.insert(key, record.as_slice())?;
    let total = totals.get(CONTENT_BYTES)?.map_or(0, |v| v.value());
    let old_len = old.map_or(0, |(_, len)| len as u64);
    let new_total = (total + content.len() as u64).saturating_sub(old_len);
    totals.insert(CONTENT_BYTES, new_total)?;
    Ok(Ok(stamp))
}

fn record_header(key: &str, record: &[u8]) -> Result<(Stamp, usize), StoreError> {
    if record.len() < RECORD_HEADER {
        return Err(StoreError::Corrupt {
            key: key.to_string(),
            reason: "record shorter than its header",
        });
    }
    let mut version = [0u8; 8];
    version.copy_from_slice(&record[..8]);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&record[8..RECORD_HEADER]);
    Ok((
        Stamp {
            version: u64::from_le_bytes(version),
            hash,
        },
        record.len() - RECORD_HEADER,
    ))
}

fn decode_record(key: &str, record: &[u8]) -> Result<StoredObject, StoreError> {
    let (stamp, _) = record_header(key, record)?;
    let content = &record[RECORD_HEADER..];
    if content_hash(content) != stamp.hash {
        return Err(StoreError::Corrupt {
            key: key.to_string(),
            reason: "content does not match its hash",
        });
    }
    Ok(StoredObject {
        stamp,
        content: Bytes::copy_from_slice(content),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(version: u64, content: &[u8]) -> Stamp {
        Stamp {
            version,
            hash: content_hash(content),
        }
    }

    #[test]
    fn newer_versions_replace_older_ones_only() {
        let store = Store::in_memory(1 << 20).unwrap();
        assert_eq!(store.get("k").unwrap(), None);
        let v2 = stamp(2, b"two");
        assert_eq!(store.put("k", v2, Bytes::from_static(b"two")).unwrap(), v2);
        let v1 = stamp(1, b"one");
        assert_eq!(store.put("k", v1, Bytes::from_static(b"one")).unwrap(), v2);
        assert_eq!(store.get("k").unwrap().unwrap().content, "two");
        let v3 = stamp(3, b"three!");
        store.put("k", v3, Bytes::from_static(b"three!")).unwrap();
        assert_eq!(store.get("k").unwrap().unwrap().stamp, v3);
        assert_eq!(
            store.size().unwrap(),
            StoreSize {
                objects: 1,
                content_bytes: 6
            }
        );
    }

    #[test]
    fn records_survive_reopening_and_corruption_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("objects.redb");
        {
            let store = Store::open(&path, 1 << 20).unwrap();
            store
                .put("good", stamp(1, b"fine"), Bytes::from_static(b"fine"))
                .unwrap();
            store
                .put("bad", stamp(1, b"fine"), Bytes::from_static(b"fine"))
                .unwrap();
        }
        {
            // Damage one record behind the store's back, as a disk fault would.
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(OBJECTS).unwrap();
                let mut record = table.get("bad").unwrap().unwrap().value().to_vec();
                let last = record.len() - 1;
                record[last] ^= 0xff;
                table.insert("bad", record.as_slice()).unwrap();
                table.insert("short", [1u8, 2, 3].as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let store = Store::open(&path, 1 << 20).unwrap();
        assert_eq!(store.get("good").unwrap().unwrap().content, "fine");
        assert!(matches!(
            store.get("bad"),
            Err(StoreError::Corrupt { key, .. }) if key == "bad"
        ));
        assert!(matches!(
            store.get("short"),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn conditional_writes_apply_only_when_the_precondition_holds() {
        let store = Store::in_memory(1 << 20).unwrap();
        let one = stamp(1, b"one");
        let put = |s: Stamp, content: &'static [u8], p| {
            store
                .put_if("k", s, Bytes::from_static(content), p)
                .unwrap()
        };
        assert_eq!(put(one, b"one", Precondition::Matches(one)), Err(None));
        assert_eq!(put(one, b"one", Precondition::Absent), Ok(one));
        assert_eq!(
            put(stamp(2, b"two"), b"two", Precondition::Absent),
            Err(Some(one))
        );
        let two = stamp(2, b"two");
        assert_eq!(put(two, b"two", Precondition::Matches(one)), Ok(two));
        // A stale precondition fails even with a newer version.
        assert_eq!(
            put(stamp(3, b"three"), b"three", Precondition::Matches(one)),
            Err(Some(two))
        );
        assert_eq!(store.get("k").unwrap().unwrap().content, "two");
    }

    #[test]
    fn a_batch_applies_the_same_rule_in_one_transaction() {
        let store = Store::in_memory(1 << 20).unwrap();
        let two = stamp(2, b"two");
        store.put("b", two, Bytes::from_static(b"two")).unwrap();
        let copies = vec![
            ("a".to_string(), stamp(1, b"a"), Bytes::from_static(b"a")),
            (
                "b".to_string(),
                stamp(1, b"old"),
                Bytes::from_static(b"old"),
            ),
            ("c".to_string(), stamp(3, b"c"), Bytes::from_static(b"c")),
        ];
        let held = store.put_batch(&copies).unwrap();
        assert_eq!(held, vec![stamp(1, b"a"), two, stamp(3, b"c")]);
        assert_eq!(store.get("b").unwrap().unwrap().content, "two");
        assert_eq!(
            store.size().unwrap(),
            StoreSize {
                objects: 3,
                content_bytes: 5
            }
        );
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let store = Store::in_memory(4096).unwrap();
        for i in 0..100u64 {
            let content = Bytes::from(vec![i as u8; 500]);
            store
                .put(&format!("k{i}"), stamp(1, &content), content)
                .unwrap();
        }
        assert!(store.cache().bytes <= 4096);
        assert_eq!(store.get("k0").unwrap().unwrap().content.len(), 500);
        assert_eq!(store.size().unwrap().objects, 100);
    }
}
