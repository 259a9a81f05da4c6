//! Writing an object's content piece by piece: [`Store::content_writer`] opens a new content file,
//! [`ContentWriter`] appends pieces to it and hashes them as they come, and
//! [`Store::put_written`] commits the finished file as an object's content without reading it
//! back. A large write (an HTTP `PUT`, a replica's copy) then holds one piece at a time instead
//! of the whole object.
//!
//! A file that is not committed (the write failed, lost to a newer copy, or was dropped) is
//! removed; a crash leaves a file no header refers to, which opening the store removes (see
//! [`super::files`]).

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use meshwire_proto::hash::Sha256;

use super::{group, Store, StoreError};
use crate::proto::cas::Precondition;
use crate::proto::object::{ContentHash, Stamp};

/// A content file being written; removed when dropped unfinished.
#[derive(Debug)]
pub struct ContentWriter {
    /// Handed to the [`WrittenContent`] when finished.
    file: Option<File>,
    written: WrittenContent,
    hasher: Sha256,
}

impl ContentWriter {
    /// Appends `piece` to the file and to the hash.
    pub fn write(&mut self, piece: &[u8]) -> Result<(), StoreError> {
        self.hasher.update(piece);
        self.written.len += piece.len() as u64;
        let file = self.file.as_mut().ok_or(StoreError::Stopped)?;
        file.write_all(piece).map_err(|source| StoreError::File {
            path: self.written.path.clone(),
            source,
        })
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.written.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.written.len == 0
    }

    /// The file, with its length and hash, ready to commit. It is flushed to disk by the commit
    /// ([`Store::put_written`]), so a node sending it to other replicas meanwhile does not wait
    /// for the disk first.
    pub fn finish(mut self) -> WrittenContent {
        let mut written = std::mem::replace(&mut self.written, WrittenContent::disarmed());
        written.hash = std::mem::take(&mut self.hasher).finish();
        written.file = self.file.take();
        written
    }
}

/// A finished content file not yet committed as any object's content; removed when dropped
/// uncommitted.
#[derive(Debug)]
pub struct WrittenContent {
    id: u64,
    /// Open for writing, to flush it before the commit.
    file: Option<File>,
    /// Empty once the file is handed on (committed, or moved out of a writer).
    path: PathBuf,
    len: u64,
    hash: ContentHash,
}

impl WrittenContent {
    fn disarmed() -> Self {
        Self {
            id: 0,
            file: None,
            path: PathBuf::new(),
            len: 0,
            hash: [0; 32],
        }
    }

    /// The content's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the content is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// SHA-256 of the content.
    pub fn hash(&self) -> ContentHash {
        self.hash
    }

    /// Flushes the file to disk now and closes it (the commit then has nothing left to flush):
    /// content held for a while before its commit (a prepared conditional write) keeps no file
    /// open.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        if let Some(file) = self.file.take() {
            file.sync_data().map_err(|source| StoreError::File {
                path: self.path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// The file, for reading it while it is committed: an open file stays readable if the
    /// commit loses and removes it.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WrittenContent {
    /// Removes the file of content never committed. Dropped on an async worker (a request that
    /// failed), the unlink (which can take milliseconds for a large file) runs under
    /// `block_in_place`, so the worker's other tasks move on meanwhile; it still finishes before
    /// the drop returns, so no answer goes out ahead of it.
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let on_worker = tokio::runtime::Handle::try_current().is_ok_and(|handle| {
            handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        });
        if on_worker {
            tokio::task::block_in_place(|| super::files::remove(&self.path));
        } else {
            super::files::remove(&self.path);
        }
    }
}

impl Store {
    /// A new content file to write an object's content into piece by piece; `None` for a
    /// store that keeps no content files (one in memory), whose writes are held whole.
    pub fn content_writer(&self) -> Result<Option<ContentWriter>, StoreError> {
        let Some(files) = &self.files else {
            return Ok(None);
        };
        let (id, path, file) = files.create_empty()?;
        Ok(Some(ContentWriter {
            file: Some(file),
            written: WrittenContent {
                id,
                file: None,
                path,
                len: 0,
                hash: [0; 32],
            },
            hasher: Sha256::new(),
        }))
    }

    /// Stores `content` (a finished content file) under `key` with `stamp`, as [`Store::put`]
    /// does; refused as [`StoreError::HashMismatch`] if the file's hash is not `stamp`'s. The file
    /// becomes the object's content, or is removed if the write loses to the stored copy.
    pub fn put_written(
        &self,
        key: &str,
        stamp: Stamp,
        content: WrittenContent,
    ) -> Result<Stamp, StoreError> {
        let outcome = self.commit_written(key, stamp, content, None)?;
        Ok(outcome.unwrap_or_else(|held| held.unwrap_or(stamp)))
    }

    /// Stores `content` (a finished content file) under `key` with `stamp` only if the stored
    /// copy satisfies `precondition` and the new copy wins over it, as [`Store::put_if`] does.
    /// `Err` holds the stored copy's stamp (`None`: absent) when it does not; the file is then
    /// removed.
    pub fn put_written_if(
        &self,
        key: &str,
        stamp: Stamp,
        content: WrittenContent,
        precondition: Precondition,
    ) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
        self.commit_written(key, stamp, content, Some(precondition))
    }

    fn commit_written(
        &self,
        key: &str,
        stamp: Stamp,
        mut content: WrittenContent,
        precondition: Option<Precondition>,
    ) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
        if content.hash != stamp.hash {
            return Err(StoreError::HashMismatch {
                key: key.to_string(),
            });
        }
        // A committed header never refers to a file a crash could lose (see `files`).
        if let Some(file) = content.file.take() {
            file.sync_data().map_err(|source| StoreError::File {
                path: content.path.clone(),
                source,
            })?;
        }
        // An object the cache keeps is read back (from the page cache) and enters it with the
        // commit, as a write of content in memory does: readers of a freshly written hot object
        // then share one checked buffer instead of each reading and hashing the file (250
        // concurrent GETs of a 5 MB object in `bench/http.sh`: 162 requests/s from the file,
        // 620 from the cache).
        let held = if self.cache().keeps(content.len) {
            std::fs::read(&content.path)
                .map(Bytes::from)
                .map_err(|source| StoreError::File {
                    path: content.path.clone(),
                    source,
                })?
        } else {
            Bytes::new()
        };
        // From here the commit owns the file: it keeps it, or removes it if the write loses.
        content.path = PathBuf::new();
        self.group.write(
            self,
            group::Write {
                key: key.to_string(),
                stamp,
                content: held,
                len: content.len,
                precondition,
                file: Some(content.id),
            },
        )
    }
}
