//! Large writes piece by piece: a body streamed into a content file ([`ObjectWriter`]), committed
//! without a copy ([`ObjectService::put_written`]), sent to each replica from that file
//! ([`FileSource`]) and stored there the same way ([`ObjectService::serve_store_streamed`]).
//! No node holds the content whole: each holds one piece of [`PIECE_BYTES`] per write at a time.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use meshwire::{HandlerError, PeerId, RequestBody};

use super::store_calls::blocking;
use super::{lock, ObjectService, ObjectServiceError, ReplicaError, WriteOutcome};
use crate::net::store::{ContentWriter, StoreError, WrittenContent};
use crate::proto::object::{self, Stamp, Stored};

/// The pieces a streamed write is written to disk in and sent in, one at a time (the size
/// `bench/store.sh`'s read-back favours, see `http::FILE_CHUNK_BYTES`).
pub const PIECE_BYTES: usize = meshwire::STREAMED_PIECE_BYTES;

/// A content file written from the async side: data is gathered into pieces of [`PIECE_BYTES`],
/// each written on the blocking pool. Refuses content over the configured `max_object_bytes`.
#[derive(Debug)]
pub struct ObjectWriter {
    service: ObjectService,
    writer: Option<ContentWriter>,
    piece: BytesMut,
    len: u64,
}

impl ObjectService {
    /// A writer for one object's content, or `None` when the store keeps no content files (a
    /// store in memory), whose writes are held whole.
    pub async fn object_writer(&self) -> Result<Option<ObjectWriter>, ObjectServiceError> {
        let writer = self.on_store(|store| store.content_writer()).await??;
        Ok(writer.map(|writer| ObjectWriter {
            service: self.clone(),
            writer: Some(writer),
            piece: BytesMut::new(),
            len: 0,
        }))
    }

    /// Content of at least this many bytes is written piece by piece (see
    /// [`ObjectService::object_writer`]); `None` when the store keeps no content files.
    pub fn streamed_min_bytes(&self) -> Option<usize> {
        self.inner.store.file_min_bytes()
    }
}

impl ObjectWriter {
    /// Appends `data`; refused as [`ObjectServiceError::TooLarge`] past `max_object_bytes`.
    pub async fn write(&mut self, mut data: Bytes) -> Result<(), ObjectServiceError> {
        let max = self.service.inner.config.max_object_bytes;
        self.len += data.len() as u64;
        if self.len > max as u64 {
            return Err(ObjectServiceError::TooLarge {
                len: usize::try_from(self.len).unwrap_or(usize::MAX),
                max,
            });
        }
        while !data.is_empty() {
            if self.piece.capacity() == 0 {
                // One allocation per piece, not a doubling series of them.
                self.piece.reserve(PIECE_BYTES);
            }
            let take = data.len().min(PIECE_BYTES - self.piece.len());
            self.piece.extend_from_slice(&data.split_to(take));
            if self.piece.len() == PIECE_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Writes the gathered piece on the blocking pool.
    async fn flush(&mut self) -> Result<(), ObjectServiceError> {
        let piece = self.piece.split().freeze();
        let mut writer = self.writer.take().ok_or(StoreError::Stopped)?;
        let inline = self.service.inner.inline_store;
        let (writer, written) = blocking(inline, move || {
            let written = writer.write(&piece);
            (writer, written)
        })
        .await
        .ok_or(StoreError::Stopped)?;
        written?;
        self.writer = Some(writer);
        Ok(())
    }

    /// Writes what is left; the file is flushed to disk when it is committed.
    pub async fn finish(mut self) -> Result<WrittenContent, ObjectServiceError> {
        if !self.piece.is_empty() {
            self.flush().await?;
        }
        let writer = self.writer.take().ok_or(StoreError::Stopped)?;
        Ok(writer.finish())
    }
}

/// A content file sent piece by piece, each piece read on the blocking pool.
pub(super) struct FileSource {
    file: Option<File>,
    offset: u64,
    left: u64,
    inline: bool,
}

impl meshwire::BodySource for FileSource {
    async fn next_piece(&mut self) -> std::io::Result<Option<Bytes>> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut file = self
            .file
            .take()
            .ok_or_else(|| std::io::Error::other("a content file read failed before"))?;
        let (offset, n) = (self.offset, self.left.min(PIECE_BYTES as u64) as usize);
        let (file, piece) = blocking(self.inline, move || {
            let mut piece = vec![0u8; n];
            let read = file
                .seek(SeekFrom::Start(offset))
                .and_then(|_| file.read_exact(&mut piece));
            (file, read.map(|()| Bytes::from(piece)))
        })
        .await
        .ok_or_else(|| std::io::Error::other("the blocking pool stopped"))?;
        let piece = piece?;
        self.file = Some(file);
        self.offset += n as u64;
        self.left -= n as u64;
        Ok(Some(piece))
    }
}

/// A written content file on its way to the replicas: the local commit takes the file, each
/// remote replica reads it through its own handle, opened before the commit (an open file stays
/// readable if the commit loses and removes it).
pub(super) struct Outgoing {
    content: Mutex<Option<WrittenContent>>,
    handles: Mutex<HashMap<PeerId, File>>,
    len: u64,
}

impl ObjectService {
    /// Writes the finished content file `content` under `key` to its replicas, as
    /// [`ObjectService::put`] does with content in memory; returns once W hold it.
    pub async fn put_written(
        &self,
        key: &str,
        content: WrittenContent,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        let started = tokio::time::Instant::now();
        let result = self.put_written_inner(key, content).await;
        self.count_put(started, &result);
        result
    }

    async fn put_written_inner(
        &self,
        key: &str,
        content: WrittenContent,
    ) -> Result<WriteOutcome, ObjectServiceError> {
        object::validate_key(key).map_err(ObjectServiceError::InvalidKey)?;
        let max = self.inner.config.max_object_bytes;
        if content.len() > max as u64 {
            return Err(ObjectServiceError::TooLarge {
                len: usize::try_from(content.len()).unwrap_or(usize::MAX),
                max,
            });
        }
        if self
            .streamed_min_bytes()
            .is_none_or(|min| content.len() < min as u64)
        {
            // Content small enough to live in the store's own pages (a short body of unknown
            // length): read back and written as content in memory is, and its file removed.
            let path = content.path().to_path_buf();
            let read = path.clone();
            let small = blocking(self.inner.inline_store, move || std::fs::read(read))
                .await
                .ok_or(StoreError::Stopped)?
                .map_err(|source| StoreError::File { path, source })?;
            drop(content);
            return self.put_inner(key, Bytes::from(small)).await;
        }
        let hash = content.hash();
        let stamp = self.next_stamp_of(key, move || hash, None).await?;
        let me = self.inner.node.peer_id();
        let others: Vec<PeerId> = self
            .replicas(key)
            .into_iter()
            .filter(|peer| *peer != me)
            .collect();
        let path = content.path().to_path_buf();
        let handles = blocking(self.inner.inline_store, move || {
            let mut handles = HashMap::new();
            for peer in others {
                let file = File::open(&path).map_err(|source| StoreError::File {
                    path: path.clone(),
                    source,
                })?;
                handles.insert(peer, file);
            }
            Ok::<_, StoreError>(handles)
        })
        .await
        .ok_or(StoreError::Stopped)??;
        let outgoing = Arc::new(Outgoing {
            len: content.len(),
            content: Mutex::new(Some(content)),
            handles: Mutex::new(handles),
        });
        self.write_copies(key, stamp, super::write::Copy::Written(outgoing))
            .await
    }

    /// Stores the written content of `outgoing` locally, as one replica of `key`.
    pub(super) async fn store_written_here(
        &self,
        key: String,
        stamp: Stamp,
        outgoing: &Outgoing,
    ) -> Result<Stamp, ReplicaError> {
        let content = lock(&outgoing.content).take().ok_or(StoreError::Stopped)?;
        Ok(self
            .on_store(move |store| store.put_written(&key, stamp, content))
            .await??)
    }

    /// Sends the written content of `outgoing` to `peer` after `header`, piece by piece from
    /// the file, and asks again while the replica is busy (see [`Self::request_replica`]).
    pub(super) async fn store_written_at(
        &self,
        peer: PeerId,
        header: Bytes,
        outgoing: &Outgoing,
    ) -> Result<Stored, ReplicaError> {
        let file = lock(&outgoing.handles)
            .remove(&peer)
            .ok_or(StoreError::Stopped)?;
        let inline = self.inner.inline_store;
        let node = self.inner.node.clone();
        let len = outgoing.len;
        let file = Arc::new(Mutex::new(Some(file)));
        let reply = self
            .retry_busy(|left| {
                let source = FileSource {
                    file: lock(&file).as_ref().and_then(|file| file.try_clone().ok()),
                    offset: 0,
                    left: len,
                    inline,
                };
                let (node, header) = (node.clone(), header.clone());
                async move {
                    node.request_streamed(peer, super::STORE, header, (len, source), left)
                        .await
                }
            })
            .await?;
        self.stored_answer(peer, &reply)
    }

    /// Stores a copy `peer` sends piece by piece, as [`Self::serve_store`] does with one sent
    /// whole: the same gate, the content checked against its hash (as it arrives) before it is
    /// stored. Content too small for a content file is read whole. Serves STORE on a node whose
    /// store keeps content files (others read every copy whole).
    pub(super) async fn serve_store_streamed(
        &self,
        peer: PeerId,
        mut body: RequestBody,
    ) -> Result<Bytes, HandlerError> {
        let malformed = |error| self.malformed(peer, error);
        let fixed = body
            .read_exact(object::STORE_FIXED_LEN)
            .await
            .map_err(|error| HandlerError::Malformed(Box::new(error)))?;
        let (clock, stamp, key_len) = object::decode_store_fixed(&fixed).map_err(malformed)?;
        let key_bytes = body
            .read_exact(key_len)
            .await
            .map_err(|error| HandlerError::Malformed(Box::new(error)))?;
        let len = body.remaining();
        let max = self.inner.config.max_object_bytes;
        if len > max as u64 {
            return Err(malformed(object::ObjectError::TooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max,
            }));
        }
        if self.streamed_min_bytes().is_none_or(|min| len < min as u64) {
            // Too small for a content file: read whole (within the piece the node reserved for
            // the request) and stored as a copy sent whole is.
            let mut whole = BytesMut::with_capacity(fixed.len() + key_bytes.len() + len as usize);
            whole.extend_from_slice(&fixed);
            whole.extend_from_slice(&key_bytes);
            while let Some(piece) = body.next_piece().await.map_err(body_failed)? {
                whole.extend_from_slice(&piece);
            }
            let service = self.clone();
            let inline = self.inner.inline_store;
            let whole = whole.freeze();
            return blocking(inline, move || service.serve_store(peer, whole))
                .await
                .unwrap_or(Err(HandlerError::Stopped));
        }
        let key = object::decode_store_key(&key_bytes).map_err(malformed)?;
        if let Err(reason) = self.admit(peer, clock, Some(stamp)) {
            return self.refuse(peer, key, reason);
        }
        let failed = |error: ObjectServiceError| HandlerError::Failed(Box::new(error));
        let mut writer = self
            .object_writer()
            .await
            .map_err(failed)?
            .ok_or(HandlerError::Stopped)?;
        while let Some(piece) = body.next_piece().await.map_err(body_failed)? {
            writer.write(piece).await.map_err(failed)?;
        }
        let written = writer.finish().await.map_err(failed)?;
        if written.hash() != stamp.hash {
            return Err(malformed(object::ObjectError::HashMismatch));
        }
        let key_owned = key.to_string();
        let held = self
            .on_store(move |store| store.put_written(&key_owned, stamp, written))
            .await
            .map_err(|_| HandlerError::Stopped)?
            .map_err(|error| HandlerError::Failed(Box::new(error)))?;
        self.stored(held, stamp)
    }
}

fn body_failed(error: meshwire::BodyError) -> HandlerError {
    HandlerError::Failed(Box::new(error))
}
