//! Keep a node's objects in an embedded, transactional store (redb) in its data directory.
//!
//! # Design
//!
//! Two redb tables: `objects.v2` maps a key to its header `[version u64 LE][SHA-256 32][length u64
//! LE][chunks u32 LE]` (followed by `[file id u64 LE]` when the content is in a content file, see
//! below), and `chunks.v2` maps `(key, index)` to the content's pieces; `totals` holds the content
//! bytes (all, and those in files) and `files` the ids of the content files headers name. A write reads the current header and replaces the object only if the
//! new copy wins (higher version; at equal versions, the smaller hash, the same rule [`merge`] ends
//! with), inside one write transaction that commits durably: a crash mid-write leaves the old
//! object or the new one, never a torn one (redb's commit is atomic). Every read recomputes the
//! hash, so an object damaged on disk is reported as [`StoreError::Corrupt`] instead of being
//! served or replicated. A conditional write ([`Store::put_if`]) checks its precondition against
//! the current header in the same transaction, so no other write can slip in between.
//!
//! **Why chunks.** redb allocates pages in power-of-two runs, so one 8 MiB value took a 16 MiB run
//! and a store of 8 MiB objects used 2.1× its content on disk after overwrites (measured with the
//! one-record-per-object layout this replaced). Content is therefore cut into pieces that fill a
//! power-of-two run of 4 KiB pages exactly (1 MiB runs, then halving down to one page, less room
//! for redb's leaf header and the key; see [`chunk_sizes`]); freed runs fit the next object's
//! pieces. A store written in the old layout (table `objects`) is converted on open.
//!
//! **Why content files.** Pieces fixed the runs but not the file: redb grows its file by doubling
//! and gives space back only when at least half of its last region is free, so after compaction
//! the file's length stayed at 1.50× its content in `bench/store.sh` (8 MiB objects). In a store
//! on disk, content of [`FILE_MIN_BYTES`] (64 KiB) or more therefore goes to a file of its own in
//! a directory beside the redb file (`objects.content/`, named by a 64-bit id), and redb keeps its
//! header, which names the file (the key-value separation of WiscKey, and of iroh-blobs' store).
//! The file is written and flushed before the commit that names it, and the directory is flushed
//! before that commit, so the commit stays the one atomic point: a crash leaves the old object or
//! the new one. A `files` table lists the files committed headers name; opening the store removes
//! every other content file (a write cut short by a crash before its commit, or a replaced
//! object's file whose removal was cut short). A write that could not win (a stale copy, a failed
//! precondition, judged from the committed header) writes no file; one that loses to a write
//! committed meanwhile has its file removed. A reader whose object was replaced between reading
//! the header and opening the file reads the new header. Smaller content stays in pieces: one
//! file per small object would cost a file and a flush each. A store in memory keeps everything
//! in pieces.
//!
//! **Streaming reads.** [`Store::get_body`] hands out a content file open for reading
//! ([`Body::File`]) instead of its content; [`ContentReader`] reads it chunk by chunk and checks
//! the hash when the last chunk is read, reporting damage instead of that chunk, so a reader
//! never receives a wrong end silently. The open file stays readable when a commit replaces its
//! object meanwhile: the reader finishes the version it began. [`Store::checked_stamp`] checks a
//! copy through a small buffer (a version-only answer to a read). Neither enters the object
//! cache.
//!
//! **Memory.** The store's memory budget ([`DEFAULT_MEMORY_BYTES`] unless configured) is split in
//! two halves: redb's page cache (which would otherwise default to 1 GiB) and a cache of hot
//! objects as shared buffers, so many readers of one large object share one copy (the 250-reader
//! test in `bench/http.sh`). An object larger than a quarter of the object cache is not cached.
//!
//! **Crash recovery.** A store on disk uses redb's quick repair when writes are sparse and once a
//! busy store falls idle (`store/repair.rs`): the commit saves redb's allocator state, so opening
//! the store after a crash does not rebuild it by walking the whole file. Saving it in every
//! commit cost about three quarters of a small write's CPU; a crash in the middle of a run of
//! writes now costs a rebuild on the next open instead. A store in memory ([`Store::in_memory`]:
//! tests and the lab) has no crash to recover from and skips it.
//!
//! **Compaction.** redb reuses freed pages but never returns space on its own, so a store whose
//! content shrank keeps its high-water mark on disk. [`Store::compact`] runs redb's compaction
//! when the redb file occupies more than 1.2× the content it holds (not counting content files)
//! plus 32 MiB; it holds every other store call meanwhile, so a node compacts only when it stops
//! gracefully (`Daemon::shutdown`, SIGTERM or ctrl-c), never after a crash and never while
//! serving. redb sizes a growing file by doubling into sparse space and truncates only when half
//! its last region is free, so the redb file's length can stay up to twice its content while its
//! disk blocks do not; content files take exactly their content's length.
//!
//! **Group commit.** Concurrent writes ([`Store::put`], [`Store::put_if`]) share one durable
//! transaction: a writer that finds a commit running queues behind it, and the next commit takes
//! every queued write (see `store/group.rs`). A lone write commits alone at once.
//!
//! The store's methods block (disk reads, durable commits): the object service calls them from
//! tokio's blocking pool, never on an async worker thread.
//!
//! [`merge`]: crate::proto::object::merge

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use crate::proto::cas::Precondition;
use crate::proto::object::Stamp;
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use redb::{ReadableTable, ReadableTableMetadata, TableHandle};

mod body;
mod files;
mod group;
mod layout;
mod repair;
mod writer;

pub use body::{Body, ContentReader};
pub use layout::chunk_sizes;
use layout::*;
pub use repair::{CHECKPOINT_MAX_BACKOFF, QUICK_REPAIR_GAP};
pub use writer::{ContentWriter, WrittenContent};

/// Content of at least this many bytes goes to a file of its own in a store on disk.
pub const FILE_MIN_BYTES: usize = 64 << 10;
/// Reads that find their content file replaced under them (the object rewritten meanwhile) try
/// at most this many times.
const FILE_READ_ATTEMPTS: usize = 64;
/// The largest read buffer sized from a header before the pieces are read.
const MAX_PREALLOC: usize = 32 << 20;
/// Legacy records converted per transaction when opening an old store.
const MIGRATE_BATCH_BYTES: usize = 64 << 20;

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
    /// The blocking pool the store runs on was shut down (the runtime is stopping).
    #[error("the object store's worker was stopped")]
    Stopped,
    /// Compaction failed (boxed: redb's error is large). The file is left as redb's last
    /// commit left it: compaction commits in steps, each one atomic.
    #[error("object store compaction failed: {0}")]
    Compact(#[source] Box<redb::CompactionError>),
    /// Reading the store file's length failed.
    #[error("cannot read the object store file's size: {0}")]
    FileSize(#[source] std::io::Error),
    /// Creating, flushing or reading a content file (or their directory) failed.
    #[error("object store content file {path:?}: {source}")]
    File {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A stored object is damaged: its hash or length does not match, or a piece is missing.
    #[error("object {key:?} is corrupt: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Content written piece by piece does not match the hash its write carries
    /// ([`Store::put_written`]); nothing was stored.
    #[error("the content written for {key:?} does not match its hash")]
    HashMismatch {
        /// The key.
        key: String,
    },
}

impl From<redb::CompactionError> for StoreError {
    fn from(error: redb::CompactionError) -> Self {
        Self::Compact(Box::new(error))
    }
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
    /// The part of `content_bytes` kept in content files (see the module docs).
    pub file_bytes: u64,
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

    /// Whether an object of `len` bytes is kept: one larger than a quarter of the cache would
    /// evict too much to be worth keeping.
    fn keeps(&self, len: u64) -> bool {
        len <= (self.limit_bytes / 4) as u64
    }

    fn insert(&mut self, key: &str, object: StoredObject) {
        self.remove(key);
        if !self.keeps(object.content.len() as u64) {
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
    /// Every transaction runs under the read side; [`Store::compact`] takes the write side, so
    /// no transaction is live while redb moves pages.
    db: RwLock<redb::Database>,
    /// The file on disk (`None` in memory), for [`Store::compact`]'s size check.
    path: Option<PathBuf>,
    cache: Mutex<Cache>,
    group: group::Group,
    /// Content files (on disk only).
    files: Option<files::Files>,
    counts: CommitCounts,
    /// Which commits save the allocator state for a fast reopen after a crash (on disk only).
    repair: Option<repair::Repair>,
}

/// Counts of the store's durable write transactions, shared with the metrics registry.
#[derive(Debug, Clone, Default)]
pub struct CommitCounts {
    /// Write transactions committed (a group of concurrent writes, or a batch, commits once).
    pub commits: Counter,
    /// Objects those transactions wrote.
    pub writes: Counter,
    /// Empty commits that saved redb's allocator state once the store fell idle after commits
    /// that did not (see `store/repair.rs`).
    pub checkpoints: Counter,
}

impl CommitCounts {
    fn committed(&self, writes: usize) {
        self.commits.inc();
        self.writes.inc_by(writes as u64);
    }
}

/// [`Store::compact`] compacts a file occupying more disk than this many times its content ...
pub const COMPACT_SLACK_RATIO: f64 = 1.2;
/// ... plus this many bytes (redb's own tables and a small store's first allocations).
pub const COMPACT_SLACK_BYTES: u64 = 32 << 20;

/// What [`Store::compact`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    /// Content bytes held in the redb file (content files are not compacted).
    pub content_bytes: u64,
    /// Disk space the file occupied before (allocated blocks on Unix, length elsewhere).
    pub before_bytes: u64,
    /// Disk space the file occupies after.
    pub after_bytes: u64,
    /// How long it took.
    pub took: Duration,
}

/// Default memory budget of the store: half for redb's page cache, half for the object cache.
pub const DEFAULT_MEMORY_BYTES: usize = 128 * 1024 * 1024;

impl Store {
    /// Opens (or creates) the store file at `path` and its directory of content files (`path`
    /// with the extension `content`), within `memory_bytes` of caches (see the module docs). A
    /// store in the old one-record-per-object layout is converted first, and content files no
    /// committed object refers to are removed.
    pub fn open(path: &Path, memory_bytes: usize) -> Result<Self, StoreError> {
        Self::open_with(path, memory_bytes, FILE_MIN_BYTES)
    }

    /// [`Store::open`], with content of `file_min_bytes` or more in content files.
    fn open_with(
        path: &Path,
        memory_bytes: usize,
        file_min_bytes: usize,
    ) -> Result<Self, StoreError> {
        let db = redb::Database::builder()
            .set_cache_size(memory_bytes / 2)
            .create(path)?;
        Self::init(db, memory_bytes, Some((path.to_path_buf(), file_min_bytes)))
    }

    /// A store in memory (tests and the lab).
    pub fn in_memory(memory_bytes: usize) -> Result<Self, StoreError> {
        let db = redb::Database::builder()
            .set_cache_size(memory_bytes / 2)
            .create_with_backend(redb::backends::InMemoryBackend::new())?;
        Self::init(db, memory_bytes, None)
    }

    fn init(
        db: redb::Database,
        memory_bytes: usize,
        disk: Option<(PathBuf, usize)>,
    ) -> Result<Self, StoreError> {
        let quick_repair = disk.is_some();
        // Create the tables so readers never see them missing.
        let mut txn = db.begin_write()?;
        txn.set_quick_repair(quick_repair);
        txn.open_table(HEADERS)?;
        txn.open_table(CHUNKS)?;
        txn.open_table(TOTALS)?;
        txn.open_table(FILES)?;
        txn.commit()?;
        let files = match &disk {
            Some((path, min_bytes)) => {
                let txn = db.begin_read()?;
                let table = txn.open_table(FILES)?;
                let last = table.last()?.map(|(id, _)| id.value());
                Some(files::Files::open(
                    path.with_extension("content"),
                    *min_bytes,
                    last,
                    |id| Ok(table.get(id)?.is_some()),
                )?)
            }
            None => None,
        };
        let path = disk.map(|(path, _)| path);
        let store = Self {
            db: RwLock::new(db),
            path,
            cache: Mutex::new(Cache {
                limit_bytes: memory_bytes - memory_bytes / 2,
                bytes: 0,
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
            group: group::Group::default(),
            files,
            counts: CommitCounts::default(),
            repair: quick_repair.then(repair::Repair::new),
        };
        store.migrate_legacy()?;
        Ok(store)
    }

    /// Converts records of the old layout (table `objects`) in transactions of about
    /// [`MIGRATE_BATCH_BYTES`], then deletes the old table. A record too short to hold its header
    /// was unreadable before and is dropped with a warning.
    fn migrate_legacy(&self) -> Result<(), StoreError> {
        let exists = self
            .db()
            .begin_read()?
            .list_tables()?
            .any(|table| table.name() == LEGACY.name());
        if !exists {
            return Ok(());
        }
        let mut converted = 0u64;
        loop {
            let txn = self.write_txn()?;
            let done = {
                let mut legacy = txn.open_table(LEGACY)?;
                let mut batch = Vec::new();
                let mut bytes = 0;
                for record in legacy.iter()? {
                    let (key, value) = record?;
                    bytes += value.value().len();
                    batch.push((key.value().to_string(), value.value().to_vec()));
                    if bytes >= MIGRATE_BATCH_BYTES {
                        break;
                    }
                }
                let mut headers = txn.open_table(HEADERS)?;
                let mut chunks = txn.open_table(CHUNKS)?;
                for (key, record) in &batch {
                    legacy.remove(key.as_str())?;
                    if record.len() < LEGACY_HEADER {
                        tracing::warn!(%key, "dropping an unreadable object record while converting the store");
                        continue;
                    }
                    let mut version = [0u8; 8];
                    version.copy_from_slice(&record[..8]);
                    let mut hash = [0u8; 32];
                    hash.copy_from_slice(&record[8..LEGACY_HEADER]);
                    let stamp = Stamp {
                        version: u64::from_le_bytes(version),
                        hash,
                    };
                    write_object(
                        &mut headers,
                        &mut chunks,
                        key,
                        stamp,
                        (
                            &record[LEGACY_HEADER..],
                            (record.len() - LEGACY_HEADER) as u64,
                        ),
                        None,
                        None,
                    )?;
                    converted += 1;
                }
                batch.is_empty()
            };
            if done {
                txn.delete_table(LEGACY)?;
            }
            self.commit(txn)?;
            if done {
                break;
            }
        }
        tracing::info!(
            objects = converted,
            "converted the object store to the chunked layout"
        );
        Ok(())
    }

    /// A write transaction; commit it with [`Self::commit`].
    fn write_txn(&self) -> Result<redb::WriteTransaction, StoreError> {
        Ok(self.db().begin_write()?)
    }

    /// Commits `txn` durably, saving redb's allocator state if this commit should (on disk only,
    /// see `store/repair.rs`; a store in memory has no crash to recover from, and saving the
    /// state at every commit made the lab's in-memory stores spend most of their time copying
    /// it).
    fn commit(&self, txn: redb::WriteTransaction) -> Result<(), StoreError> {
        self.commit_saving(txn, false)
    }

    /// [`Self::commit`], saving the allocator state in any case if `save` (a checkpoint).
    fn commit_saving(&self, mut txn: redb::WriteTransaction, save: bool) -> Result<(), StoreError> {
        let Some(repair) = &self.repair else {
            return Ok(txn.commit()?);
        };
        txn.set_quick_repair(repair.decide(save, Instant::now()));
        let result = txn.commit();
        repair.committed(result.is_ok(), Instant::now());
        Ok(result?)
    }

    /// Saves redb's allocator state in an empty commit if the last commit did not and none has
    /// ended for [`QUICK_REPAIR_GAP`], so that a crash from now on reopens quickly (see
    /// `store/repair.rs`). Returns whether it committed.
    pub fn checkpoint(&self) -> Result<bool, StoreError> {
        let Some(repair) = &self.repair else {
            return Ok(false);
        };
        let due = || {
            repair
                .checkpoint_due_at()
                .is_some_and(|at| Instant::now() >= at)
        };
        if !due() {
            return Ok(false);
        }
        let txn = self.write_txn()?;
        // A commit may have come between the check and the transaction.
        if !due() {
            return Ok(false);
        }
        self.commit_saving(txn, true)?;
        self.counts.checkpoints.inc();
        Ok(true)
    }

    /// Resolves when a commit left the allocator state unsaved and it has been
    /// [`QUICK_REPAIR_GAP`] since the last commit ended: [`Self::checkpoint`] is due.
    /// Never, for a store in memory.
    pub async fn checkpoint_due(&self) {
        let Some(repair) = &self.repair else {
            return std::future::pending().await;
        };
        loop {
            match repair.checkpoint_due_at() {
                None => repair.notified().await,
                Some(due) if Instant::now() >= due => return,
                Some(due) => tokio::time::sleep_until(due.into()).await,
            }
        }
    }

    /// The database, for one transaction. A read transaction begun through this guard must end
    /// before the guard does (declare the guard first): redb refuses to compact while a reader
    /// is live. A write transaction may outlive it: redb runs one writer at a time, so
    /// compaction's own first write waits for it.
    fn db(&self) -> RwLockReadGuard<'_, redb::Database> {
        self.db.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Compacts the redb file if the disk space it occupies (allocated blocks on Unix) exceeds
    /// the content it holds (content files aside) by more than [`COMPACT_SLACK_RATIO`] and
    /// [`COMPACT_SLACK_BYTES`]: redb reuses freed pages but never gives space back on its own,
    /// so a store whose content shrank (large objects replaced by small ones) keeps its
    /// high-water mark. redb moves live pages down and truncates the file only when at least
    /// half of its last region is then free, so a file that grew by doubling keeps a sparse tail
    /// that occupies no disk. Every other store call waits meanwhile, so the node calls this only
    /// when it stops gracefully (see `Daemon::shutdown`). A store in memory is never compacted.
    /// Returns what was done, `None` if nothing needed doing.
    pub fn compact(&self) -> Result<Option<Compaction>, StoreError> {
        self.compact_above(COMPACT_SLACK_RATIO, COMPACT_SLACK_BYTES)
    }

    fn compact_above(&self, ratio: f64, slack: u64) -> Result<Option<Compaction>, StoreError> {
        let Some(path) = &self.path else {
            return Ok(None);
        };
        let file_len = || disk_bytes(path);
        let size = self.size()?;
        let content = size.content_bytes - size.file_bytes.min(size.content_bytes);
        let before = file_len()?;
        let worth = content as f64 * ratio + slack as f64;
        if (before as f64) <= worth {
            return Ok(None);
        }
        let started = Instant::now();
        let mut db = self.db.write().unwrap_or_else(|e| e.into_inner());
        db.compact()?;
        drop(db);
        Ok(Some(Compaction {
            content_bytes: content,
            before_bytes: before,
            after_bytes: file_len()?,
            took: started.elapsed(),
        }))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object under `key` if the in-memory cache holds it (never touches the disk).
    pub fn cached(&self, key: &str) -> Option<StoredObject> {
        self.cache().get(key)
    }

    /// The object under `key`, its content checked against its hash. A read from disk enters the
    /// object cache (see [`Store::get_body`] for reading a large object without holding it).
    pub fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        if let Some(object) = self.cached(key) {
            return Ok(Some(object));
        }
        let Some((stamp, body)) = self.get_body(key)? else {
            return Ok(None);
        };
        let content = match body {
            Body::Held(content) => content,
            Body::File(reader) => reader.read_all()?,
        };
        let object = StoredObject { stamp, content };
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
        let file = if self.goes_to_file(&content) {
            // A write that cannot win writes no file (the commit checks again).
            let current = {
                let db = self.db();
                let txn = db.begin_read()?;
                read_header(&txn.open_table(HEADERS)?, key)?.map(|header| header.stamp)
            };
            if !applies(&stamp, precondition, current.as_ref()) {
                return Ok(Err(current));
            }
            self.create_file(&content)?
        } else {
            None
        };
        self.group.write(
            self,
            group::Write {
                key: key.to_string(),
                stamp,
                len: content.len() as u64,
                content,
                precondition,
                file,
            },
        )
    }

    /// Content of at least this many bytes goes to a content file of its own; `None` for a
    /// store that keeps no content files (one in memory).
    pub fn file_min_bytes(&self) -> Option<usize> {
        self.files.as_ref().map(|files| files.min_bytes)
    }

    fn goes_to_file(&self, content: &[u8]) -> bool {
        self.files
            .as_ref()
            .is_some_and(|files| content.len() >= files.min_bytes)
    }

    /// Writes `content` to a new content file if it goes to one (see the module docs).
    fn create_file(&self, content: &[u8]) -> Result<Option<u64>, StoreError> {
        match &self.files {
            Some(files) if self.goes_to_file(content) => files.create(content).map(Some),
            _ => Ok(None),
        }
    }

    /// Removes content file `id`, which no committed header refers to.
    fn remove_file(&self, id: u64) {
        if let Some(files) = &self.files {
            files.remove(id);
        }
    }

    /// Stores each `(key, stamp, content)` that wins over the stored copy, as [`Store::put`]
    /// does, all in one durable transaction (one commit for many copies: anti-entropy's pulls).
    /// Returns the stamp the store holds afterwards for each, in order.
    pub fn put_batch(&self, copies: &[(String, Stamp, Bytes)]) -> Result<Vec<Stamp>, StoreError> {
        let mut writes = Vec::with_capacity(copies.len());
        for (key, stamp, content) in copies {
            let file = match self.create_file(content) {
                Ok(file) => file,
                Err(error) => {
                    for id in writes.iter().filter_map(|write: &group::Write| write.file) {
                        self.remove_file(id);
                    }
                    return Err(error);
                }
            };
            writes.push(group::Write {
                key: key.clone(),
                stamp: *stamp,
                len: content.len() as u64,
                content: content.clone(),
                precondition: None,
                file,
            });
        }
        group::commit(self, &writes)
            .into_iter()
            .zip(copies)
            .map(|(outcome, (_, stamp, _))| {
                Ok(outcome?.unwrap_or_else(|held| held.unwrap_or(*stamp)))
            })
            .collect()
    }

    /// Whether the store is a file on disk (not [`Store::in_memory`]).
    pub fn on_disk(&self) -> bool {
        self.path.is_some()
    }

    /// The counts of durable write transactions (for the metrics registry: clones share them).
    pub fn commit_counts(&self) -> &CommitCounts {
        &self.counts
    }

    /// Calls `visit` with the key, stamp and content length of every object, in key order,
    /// reading only the headers (the content is not hashed: a damaged object shows when it is
    /// read). Anti-entropy computes its digests with this.
    pub fn scan_stamps(&self, mut visit: impl FnMut(&str, Stamp, usize)) -> Result<(), StoreError> {
        let db = self.db();
        let txn = db.begin_read()?;
        let table = txn.open_table(HEADERS)?;
        for record in table.iter()? {
            let (key, value) = record?;
            let key = key.value();
            let header = decode_header(key, value.value())?;
            visit(key, header.stamp, saturating_usize(header.len));
        }
        Ok(())
    }

    /// The stamp and content length of the object under `key`, from its header only.
    pub fn header(&self, key: &str) -> Result<Option<(Stamp, usize)>, StoreError> {
        if let Some(object) = self.cached(key) {
            return Ok(Some((object.stamp, object.content.len())));
        }
        let db = self.db();
        let txn = db.begin_read()?;
        let table = txn.open_table(HEADERS)?;
        Ok(read_header(&table, key)?.map(|header| (header.stamp, saturating_usize(header.len))))
    }

    /// Objects and content bytes held.
    pub fn size(&self) -> Result<StoreSize, StoreError> {
        let db = self.db();
        let txn = db.begin_read()?;
        let objects = txn.open_table(HEADERS)?.len()?;
        let totals = txn.open_table(TOTALS)?;
        let total =
            |name| -> Result<u64, StoreError> { Ok(totals.get(name)?.map_or(0, |v| v.value())) };
        Ok(StoreSize {
            objects,
            content_bytes: total(CONTENT_BYTES)?,
            file_bytes: total(FILE_BYTES)?,
        })
    }
}

/// The disk space a file occupies: its allocated blocks on Unix (redb grows a file by doubling
/// into sparse space, which costs no disk until written), its length elsewhere.
fn disk_bytes(path: &Path) -> Result<u64, StoreError> {
    let metadata = std::fs::metadata(path).map_err(StoreError::FileSize)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(metadata.blocks().saturating_mul(512))
    }
    #[cfg(not(unix))]
    {
        Ok(metadata.len())
    }
}

fn saturating_usize(len: u64) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests;
