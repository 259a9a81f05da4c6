//! Reading an object's content as a stream: [`Store::get_body`] hands out a content file open for
//! reading instead of its content, and [`ContentReader`] reads it chunk by chunk and checks it
//! against its hash when the last chunk is read. A large object's reader (an HTTP `GET`) then
//! holds one chunk at a time instead of the whole object for as long as its client takes.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use meshwire_proto::hash::Sha256;

use super::layout::{read_header, Place, CHUNKS, HEADERS};
use super::{saturating_usize, Store, StoreError, FILE_READ_ATTEMPTS, MAX_PREALLOC};
use crate::proto::object::{content_hash, ContentHash, Stamp};

/// The buffer [`ContentReader::check`] reads through.
const CHECK_BUFFER: usize = 256 << 10;

/// An object's content as [`Store::get_body`] hands it out.
#[derive(Debug)]
pub enum Body {
    /// In memory: from the object cache, content too small for a file of its own, or a store in
    /// memory. Checked against its hash already.
    Held(Bytes),
    /// A content file, read and checked as it is streamed.
    File(Box<ContentReader>),
}

impl Body {
    /// The content's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::Held(content) => content.len() as u64,
            Self::File(reader) => reader.len,
        }
    }

    /// Whether the content is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A content file open for reading. The file stays readable when a commit replaces its object
/// and removes it meanwhile: a reader that began serves the version it began with.
#[derive(Debug)]
pub struct ContentReader {
    file: File,
    path: PathBuf,
    key: String,
    len: u64,
    left: u64,
    hash: ContentHash,
    hasher: Sha256,
    /// Whether the end was reached and checked.
    checked: bool,
}

impl ContentReader {
    /// The content's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the content is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next chunk of at most `max` bytes (at least one), or `Ok(None)` once the whole content
    /// was read and matched its hash. Content shorter or longer than its header says, or that
    /// does not match its hash, is [`StoreError::Corrupt`], reported instead of the last chunk.
    /// Blocks (a disk read): call it off the async workers.
    pub fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>, StoreError> {
        if self.left == 0 {
            // Checked when the last chunk was read (or now, for empty content).
            return if self.checked {
                Ok(None)
            } else {
                self.finish().map(|()| None)
            };
        }
        let mut chunk = BytesMut::zeroed(saturating_usize(self.left).min(max.max(1)));
        self.fill(&mut chunk)?;
        Ok(Some(chunk.freeze()))
    }

    /// Reads the whole content through one buffer and checks it, keeping none of it.
    pub fn check(mut self) -> Result<(), StoreError> {
        let mut buffer = vec![0u8; saturating_usize(self.left).min(CHECK_BUFFER)];
        while self.left > 0 {
            let want = saturating_usize(self.left).min(buffer.len());
            self.fill(&mut buffer[..want])?;
        }
        if self.checked {
            Ok(())
        } else {
            self.finish()
        }
    }

    /// Fills `chunk` (no longer than what is left) from the file and hashes it; checks the end
    /// once the last byte is read.
    fn fill(&mut self, chunk: &mut [u8]) -> Result<(), StoreError> {
        let mut filled = 0;
        while filled < chunk.len() {
            match self.file.read(&mut chunk[filled..]) {
                Ok(0) => {
                    return Err(self.corrupt("its content file is shorter than its header says"))
                }
                Ok(read) => filled += read,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(source) => return Err(self.io(source)),
            }
        }
        self.hasher.update(chunk);
        self.left -= chunk.len() as u64;
        if self.left == 0 {
            self.finish()?;
        }
        Ok(())
    }

    /// The whole content, read into one buffer and checked (what [`Store::get`] returns for this
    /// object).
    pub fn read_all(mut self) -> Result<Bytes, StoreError> {
        // A damaged header's length must not size a huge allocation: beyond the bound the buffer
        // grows as the file is read.
        let mut content = BytesMut::with_capacity(saturating_usize(self.left).min(MAX_PREALLOC));
        while self.left > 0 {
            let start = content.len();
            content.resize(start + saturating_usize(self.left).min(CHECK_BUFFER), 0);
            self.fill(&mut content[start..])?;
        }
        if !self.checked {
            self.finish()?;
        }
        Ok(content.freeze())
    }

    /// Checks, once every byte the header counts was read, that the file ends there and that the
    /// content matches its hash.
    fn finish(&mut self) -> Result<(), StoreError> {
        let mut probe = [0u8; 1];
        loop {
            match self.file.read(&mut probe) {
                Ok(0) => break,
                Ok(_) => {
                    return Err(self.corrupt("its content file is longer than its header says"))
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(source) => return Err(self.io(source)),
            }
        }
        let digest = std::mem::take(&mut self.hasher).finish();
        if digest != self.hash {
            return Err(self.corrupt("content does not match its hash"));
        }
        self.checked = true;
        Ok(())
    }

    fn corrupt(&self, reason: &'static str) -> StoreError {
        StoreError::Corrupt {
            key: self.key.clone(),
            reason,
        }
    }

    fn io(&self, source: std::io::Error) -> StoreError {
        StoreError::File {
            path: self.path.clone(),
            source,
        }
    }
}

impl Store {
    /// The stamp of the object under `key`, its content checked against its hash without holding
    /// it: a content file is read through a small buffer (a version-only answer to a read, which
    /// must not vouch for a damaged copy, nor hold a large one whole).
    pub fn checked_stamp(&self, key: &str) -> Result<Option<Stamp>, StoreError> {
        let Some((stamp, body)) = self.get_body(key)? else {
            return Ok(None);
        };
        if let Body::File(reader) = body {
            reader.check()?;
        }
        Ok(Some(stamp))
    }

    /// The object under `key` with its content as a [`Body`]: held when the object cache has it
    /// or its content is in pieces (read and checked here), else its content file open for
    /// reading, checked as it is read. Unlike [`Store::get`], nothing read here enters the object
    /// cache: a content file's content is never held whole.
    pub fn get_body(&self, key: &str) -> Result<Option<(Stamp, Body)>, StoreError> {
        if let Some(object) = self.cached(key) {
            return Ok(Some((object.stamp, Body::Held(object.content))));
        }
        let corrupt = |reason| StoreError::Corrupt {
            key: key.to_string(),
            reason,
        };
        let mut attempts = 0;
        let mut missing = None;
        loop {
            let db = self.db();
            let txn = db.begin_read()?;
            let headers = txn.open_table(HEADERS)?;
            let Some(header) = read_header(&headers, key)? else {
                return Ok(None);
            };
            let id = match header.place {
                Place::Pieces(pieces) => {
                    let chunks = txn.open_table(CHUNKS)?;
                    // A damaged header's length must not size a huge allocation: beyond the
                    // bound the buffer grows with the pieces read.
                    let mut content =
                        BytesMut::with_capacity(saturating_usize(header.len).min(MAX_PREALLOC));
                    for index in 0..pieces {
                        let piece = chunks
                            .get((key, index))?
                            .ok_or_else(|| corrupt("a piece of its content is missing"))?;
                        content.extend_from_slice(piece.value());
                    }
                    if content.len() as u64 != header.len {
                        return Err(corrupt("content length does not match its header"));
                    }
                    if content_hash(&content) != header.stamp.hash {
                        return Err(corrupt("content does not match its hash"));
                    }
                    return Ok(Some((header.stamp, Body::Held(content.freeze()))));
                }
                Place::File(id) => id,
            };
            let files = self
                .files
                .as_ref()
                .ok_or_else(|| corrupt("its header names a file in a store in memory"))?;
            match files.open_file(id)? {
                Some(file) => {
                    return Ok(Some((
                        header.stamp,
                        Body::File(Box::new(ContentReader {
                            file,
                            path: files.path(id),
                            key: key.to_string(),
                            len: header.len,
                            left: header.len,
                            hash: header.stamp.hash,
                            hasher: Sha256::new(),
                            checked: false,
                        })),
                    )))
                }
                // A commit replaced the object and removed its file after the header was read:
                // read the new header. A header that still names the missing file is damage.
                None if missing != Some(id) && attempts + 1 < FILE_READ_ATTEMPTS => {
                    attempts += 1;
                    missing = Some(id);
                }
                None => return Err(corrupt("its content file is missing")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::FILE_MIN_BYTES;
    use super::*;
    use crate::proto::object::content_hash;
    use std::path::Path;

    /// Content too large for the object cache of a store with a 1 MiB budget.
    const LARGE: usize = 200 << 10;

    fn filled(len: usize, seed: u8) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|i| (i as u8).wrapping_mul(seed | 1) ^ (i >> 8) as u8)
                .collect::<Vec<u8>>(),
        )
    }

    fn put(store: &Store, key: &str, version: u64, content: &Bytes) -> Stamp {
        let stamp = Stamp {
            version,
            hash: content_hash(content),
        };
        store.put(key, stamp, content.clone()).unwrap();
        stamp
    }

    /// Every chunk of `body` (at most `max` bytes each), or the error that ended it.
    fn drain(body: Body, max: usize) -> Result<Vec<Bytes>, StoreError> {
        let Body::File(mut reader) = body else {
            panic!("expected a content file, got {body:?}");
        };
        let mut chunks = Vec::new();
        while let Some(chunk) = reader.next_chunk(max)? {
            assert!(!chunk.is_empty() && chunk.len() <= max);
            chunks.push(chunk);
        }
        Ok(chunks)
    }

    fn only_file(path: &Path) -> PathBuf {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path.with_extension("content"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1);
        files.pop().unwrap()
    }

    #[test]
    fn a_content_file_streams_in_chunks_and_outlives_its_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("objects.redb"), 1 << 20).unwrap();
        let one = filled(LARGE, 1);
        let stamp = put(&store, "k", 1, &one);
        assert_eq!(store.checked_stamp("k").unwrap(), Some(stamp));
        let (read_stamp, body) = store.get_body("k").unwrap().unwrap();
        assert_eq!((read_stamp, body.len()), (stamp, LARGE as u64));
        // A newer version replaces the object and removes its file; the open reader still reads
        // the version it began with, whole and checked.
        let two = filled(LARGE, 2);
        put(&store, "k", 2, &two);
        let chunks = drain(body, 64 << 10).unwrap();
        assert_eq!(chunks.len(), LARGE.div_ceil(64 << 10));
        assert_eq!(chunks.concat(), one);
        let (_, body) = store.get_body("k").unwrap().unwrap();
        let Body::File(reader) = body else {
            panic!("expected a content file");
        };
        assert_eq!(reader.read_all().unwrap(), two);
        assert!(store.get_body("absent").unwrap().is_none());
    }

    #[test]
    fn small_content_and_a_store_in_memory_are_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("objects.redb"), 1 << 20).unwrap();
        let small = filled(FILE_MIN_BYTES - 1, 3);
        put(&store, "small", 1, &small);
        let memory = Store::in_memory(1 << 20).unwrap();
        let large = filled(LARGE, 4);
        put(&memory, "large", 1, &large);
        for (store, key, content) in [(&store, "small", small), (&memory, "large", large)] {
            match store.get_body(key).unwrap().unwrap().1 {
                Body::Held(held) => assert_eq!(held, content),
                Body::File(_) => panic!("{key}: expected held content"),
            }
        }
    }

    #[test]
    fn a_damaged_content_file_ends_its_stream_with_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("objects.redb");
        let store = Store::open(&path, 1 << 20).unwrap();
        let content = filled(LARGE, 5);
        put(&store, "k", 1, &content);
        let file = only_file(&path);
        let mut flipped = content.to_vec();
        flipped[LARGE - 1] ^= 1;
        let mut longer = content.to_vec();
        longer.push(0);
        let damage: [(&[u8], &str); 3] = [
            (&flipped, "content does not match its hash"),
            (
                &content[..LARGE - 10],
                "its content file is shorter than its header says",
            ),
            (&longer, "its content file is longer than its header says"),
        ];
        for (on_disk, expected) in damage {
            std::fs::write(&file, on_disk).unwrap();
            assert!(
                matches!(store.checked_stamp("k"), Err(StoreError::Corrupt { reason, .. }) if reason == expected),
                "{expected}"
            );
            let (_, body) = store.get_body("k").unwrap().unwrap();
            match drain(body, 64 << 10) {
                Err(StoreError::Corrupt { key, reason }) => {
                    assert_eq!((key.as_str(), reason), ("k", expected))
                }
                other => panic!("{expected}: got {other:?}"),
            }
        }
    }
}
