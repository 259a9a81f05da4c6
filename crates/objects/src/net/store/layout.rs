//! The store's on-disk layout: its redb tables, how content is cut into pieces, and the object
//! header that says where an object's content is (see the parent module's `# Design`).

use redb::{ReadableTable, TableDefinition};

use super::StoreError;
use crate::proto::cas::Precondition;
use crate::proto::entropy::wins;
use crate::proto::object::Stamp;

pub(super) const HEADERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects.v2");
pub(super) const CHUNKS: TableDefinition<'_, (&str, u32), &[u8]> =
    TableDefinition::new("chunks.v2");
pub(super) const TOTALS: TableDefinition<'_, &str, u64> = TableDefinition::new("totals");
/// The content files that committed headers refer to (see the parent module's docs).
pub(super) const FILES: TableDefinition<'_, u64, ()> = TableDefinition::new("files");
/// The one-record-per-object layout of earlier versions: `[version][hash][content]`.
pub(super) const LEGACY: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects");
pub(super) const LEGACY_HEADER: usize = 8 + 32;
pub(super) const CONTENT_BYTES: &str = "content_bytes";
/// The part of `content_bytes` held in content files.
pub(super) const FILE_BYTES: &str = "file_bytes";
pub(super) const HEADER_LEN: usize = 8 + 32 + 8 + 4;
/// A header whose content is in a file: the inline header (0 pieces), then the file's id.
pub(super) const FILE_HEADER_LEN: usize = HEADER_LEN + 8;
/// redb's page size (its default, which the store does not change).
pub(super) const PAGE: usize = 4096;
/// The largest piece fills a run of this many pages.
pub(super) const MAX_CHUNK_PAGES: usize = 256;
/// Room left in each run for redb's leaf header, offsets and the tuple key's encoding.
pub(super) const CHUNK_SLACK: usize = 128;

/// The sizes of the pieces `len` content bytes under a key of `key_len` bytes are cut into: as
/// many pieces filling 1 MiB page runs as fit, then pieces filling halving runs, and a last piece
/// smaller than one page. Each piece plus its key fits its run, so a piece wastes at most the
/// slack, never half its run.
pub fn chunk_sizes(len: usize, key_len: usize) -> impl Iterator<Item = usize> {
    let slack = CHUNK_SLACK + key_len;
    let mut left = len;
    let mut pages = MAX_CHUNK_PAGES;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        loop {
            let capacity = (pages * PAGE).saturating_sub(slack);
            if capacity > 0 && left >= capacity {
                left -= capacity;
                return Some(capacity);
            }
            if pages == 1 || capacity == 0 {
                let last = left;
                left = 0;
                return Some(last);
            }
            pages /= 2;
        }
    })
}

pub(super) type Headers<'txn> = redb::Table<'txn, &'static str, &'static [u8]>;
pub(super) type Chunks<'txn> = redb::Table<'txn, (&'static str, u32), &'static [u8]>;
pub(super) type Totals<'txn> = redb::Table<'txn, &'static str, u64>;

/// What a header says about an object.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    pub(super) stamp: Stamp,
    pub(super) len: u64,
    pub(super) place: Place,
}

/// Where an object's content is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// In this many pieces in the `chunks` table.
    Pieces(u32),
    /// In the content file with this id.
    File(u64),
}

impl Header {
    pub(super) fn pieces(&self) -> u32 {
        match self.place {
            Place::Pieces(pieces) => pieces,
            Place::File(_) => 0,
        }
    }

    pub(super) fn file(&self) -> Option<u64> {
        match self.place {
            Place::Pieces(_) => None,
            Place::File(id) => Some(id),
        }
    }
}

/// The tables a write touches, open in one transaction, and the content files its writes
/// replaced.
pub(super) struct Tables<'txn> {
    pub(super) headers: Headers<'txn>,
    pub(super) chunks: Chunks<'txn>,
    pub(super) totals: Totals<'txn>,
    pub(super) files: redb::Table<'txn, u64, ()>,
    /// Content files of replaced objects: removed once the transaction commits.
    pub(super) replaced: Vec<u64>,
    /// Whether a write refers to a new content file (the directory is flushed before commit).
    pub(super) new_files: bool,
}

impl<'txn> Tables<'txn> {
    pub(super) fn open(txn: &'txn redb::WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            headers: txn.open_table(HEADERS)?,
            chunks: txn.open_table(CHUNKS)?,
            totals: txn.open_table(TOTALS)?,
            files: txn.open_table(FILES)?,
            replaced: Vec::new(),
            new_files: false,
        })
    }

    /// Writes `content` (already in content file `file`, if given) under `key` with `stamp` if
    /// `precondition` holds and the copy wins over the stored one; `Err` holds the stored copy's
    /// stamp when it does not.
    pub(super) fn apply(
        &mut self,
        key: &str,
        stamp: Stamp,
        (content, len): (&[u8], u64),
        file: Option<u64>,
        precondition: Option<Precondition>,
    ) -> Result<Result<Stamp, Option<Stamp>>, StoreError> {
        let old = read_header(&self.headers, key)?;
        let current = old.map(|old| old.stamp);
        if !applies(&stamp, precondition, current.as_ref()) {
            return Ok(Err(current));
        }
        write_object(
            &mut self.headers,
            &mut self.chunks,
            key,
            stamp,
            (content, len),
            file,
            old,
        )?;
        let old_len = old.map_or(0, |old| old.len);
        self.add_to_total(CONTENT_BYTES, len, old_len)?;
        let old_file = old.and_then(|old| old.file());
        if let Some(id) = old_file {
            self.files.remove(id)?;
            self.replaced.push(id);
        }
        if let Some(id) = file {
            self.files.insert(id, ())?;
            self.new_files = true;
        }
        let file_len = |has: bool, len: u64| if has { len } else { 0 };
        self.add_to_total(
            FILE_BYTES,
            file_len(file.is_some(), len),
            file_len(old_file.is_some(), old_len),
        )?;
        Ok(Ok(stamp))
    }

    /// Adds `added` to the total `name` and takes `removed` from it.
    pub(super) fn add_to_total(
        &mut self,
        name: &str,
        added: u64,
        removed: u64,
    ) -> Result<(), StoreError> {
        let total = self.totals.get(name)?.map_or(0, |v| v.value());
        let total = total.saturating_add(added).saturating_sub(removed);
        self.totals.insert(name, total)?;
        Ok(())
    }
}

/// Writes the header of `content` (`len` bytes) under `key` and, unless the content is in
/// content file `file` (then `content` may be empty: only the file holds it), its pieces;
/// removes the pieces of the `old` object the new one does not overwrite.
pub(super) fn write_object(
    headers: &mut Headers<'_>,
    chunks: &mut Chunks<'_>,
    key: &str,
    stamp: Stamp,
    (content, len): (&[u8], u64),
    file: Option<u64>,
    old: Option<Header>,
) -> Result<(), StoreError> {
    let mut index = 0u32;
    if file.is_none() {
        let mut offset = 0;
        for size in chunk_sizes(content.len(), key.len()) {
            chunks.insert((key, index), &content[offset..offset + size])?;
            offset += size;
            index += 1;
        }
    }
    for stale in index..old.map_or(0, |old| old.pieces()) {
        chunks.remove((key, stale))?;
    }
    let mut header = [0u8; FILE_HEADER_LEN];
    header[..8].copy_from_slice(&stamp.version.to_le_bytes());
    header[8..40].copy_from_slice(&stamp.hash);
    header[40..48].copy_from_slice(&len.to_le_bytes());
    header[48..HEADER_LEN].copy_from_slice(&index.to_le_bytes());
    let len = match file {
        Some(id) => {
            header[HEADER_LEN..].copy_from_slice(&id.to_le_bytes());
            FILE_HEADER_LEN
        }
        None => HEADER_LEN,
    };
    headers.insert(key, &header[..len])?;
    Ok(())
}

pub(super) fn read_header(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<Header>, StoreError> {
    match table.get(key)? {
        Some(record) => Ok(Some(decode_header(key, record.value())?)),
        None => Ok(None),
    }
}

pub(super) fn decode_header(key: &str, record: &[u8]) -> Result<Header, StoreError> {
    let corrupt = |reason| StoreError::Corrupt {
        key: key.to_string(),
        reason,
    };
    if record.len() != HEADER_LEN && record.len() != FILE_HEADER_LEN {
        return Err(corrupt("header has the wrong length"));
    }
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&record[8..40]);
    let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    let pieces = u32::from_le_bytes(record[48..HEADER_LEN].try_into().expect("4 bytes"));
    let place = if record.len() == FILE_HEADER_LEN {
        if pieces != 0 {
            return Err(corrupt("header names both pieces and a content file"));
        }
        Place::File(u64_at(HEADER_LEN))
    } else {
        Place::Pieces(pieces)
    };
    Ok(Header {
        stamp: Stamp {
            version: u64_at(0),
            hash,
        },
        len: u64_at(40),
        place,
    })
}

/// Whether a write of `stamp` under `precondition` applies over the stored copy `current`: the
/// precondition holds and the new copy wins (see [`wins`]).
pub(super) fn applies(
    stamp: &Stamp,
    precondition: Option<Precondition>,
    current: Option<&Stamp>,
) -> bool {
    precondition.is_none_or(|p| p.holds(current))
        && current.is_none_or(|current| wins(stamp, current))
}
