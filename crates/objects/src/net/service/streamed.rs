//! Large objects piece by piece. A write: a body streamed into a content file
//! ([`ObjectWriter`]), committed without a copy ([`ObjectService::put_written`]), sent to each
//! replica from that file ([`FileSource`]) and stored there the same way
//! ([`ObjectService::serve_store_streamed`]). A read through a node that does not hold the
//! content: a holder answers from its file ([`ReaderSource`]) and the reader passes the copy on
//! as it arrives, checked against its hash ([`RemoteContent`]). No node holds the content
//! whole: each holds one piece of [`PIECE_BYTES`] per transfer at a time.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use meshwire::{AnswerBody, HandlerError, PeerId, RequestBody};

use super::store_calls::blocking;
use super::write::Copy;
use super::{lock, ObjectService, ObjectServiceError, ReplicaError, WriteOutcome};
use crate::net::store::{Body, ContentReader, ContentWriter, StoreError, WrittenContent};
use crate::proto::object::{self, ContentHash, Stamp, Stored};

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
            let read = read_exact_at(&mut file, &mut piece, offset);
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

impl Outgoing {
    /// The file, for the local replica's commit (or prepare); taken once.
    pub(super) fn take_content(&self) -> Result<WrittenContent, StoreError> {
        lock(&self.content).take().ok_or(StoreError::Stopped)
    }
}

/// A finished content file made ready to write ([`ObjectService::ready_written`]).
pub(super) enum Ready {
    /// Small enough for the store's own pages: read back, its file removed.
    Small(Bytes),
    /// Stamped, and open for each other replica.
    Large(Stamp, Arc<Outgoing>),
}

/// Reads `buf.len()` bytes of `file` from `offset`. On Unix without moving the file's position,
/// which its clones share: two sends of one file to one replica (a conditional write's prepare
/// asked again while the first send still reads) never read each other's pieces.
#[allow(clippy::needless_pass_by_ref_mut)] // `&mut` for the seek elsewhere than Unix
fn read_exact_at(file: &mut File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
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
        match self.ready_written(key, content, None).await? {
            Ready::Small(content) => self.put_inner(key, content).await,
            Ready::Large(stamp, outgoing) => {
                self.write_copies(key, stamp, Copy::Written(outgoing)).await
            }
        }
    }

    /// Makes the finished content file `content` ready to be written under `key`: checks it,
    /// then either reads it back when it is small enough for the store's own pages (a short
    /// body of unknown length; its file is removed), or stamps it (after the version `after`)
    /// and opens it once for each other replica.
    pub(super) async fn ready_written(
        &self,
        key: &str,
        content: WrittenContent,
        after: Option<u64>,
    ) -> Result<Ready, ObjectServiceError> {
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
            let path = content.path().to_path_buf();
            let read = path.clone();
            let small = blocking(self.inner.inline_store, move || std::fs::read(read))
                .await
                .ok_or(StoreError::Stopped)?
                .map_err(|source| StoreError::File { path, source })?;
            drop(content);
            return Ok(Ready::Small(Bytes::from(small)));
        }
        let hash = content.hash();
        let stamp = self.next_stamp_of(key, move || hash, after).await?;
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
        Ok(Ready::Large(stamp, outgoing))
    }

    /// Stores the written content of `outgoing` locally, as one replica of `key`.
    pub(super) async fn store_written_here(
        &self,
        key: String,
        stamp: Stamp,
        outgoing: &Outgoing,
    ) -> Result<Stamp, ReplicaError> {
        let content = outgoing.take_content()?;
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
        let reply = self
            .send_written(peer, super::STORE, header, outgoing)
            .await?;
        self.stored_answer(peer, &reply)
    }

    /// Sends `peer` a request on `protocol` of `header` then the written content of `outgoing`,
    /// piece by piece from `peer`'s own handle of the file (read at each piece's offset), and
    /// sends it again while the replica refuses it as busy (see [`Self::retry_busy`]).
    pub(super) async fn send_written(
        &self,
        peer: PeerId,
        protocol: meshwire::ProtocolId,
        header: Bytes,
        outgoing: &Outgoing,
    ) -> Result<Bytes, meshwire::RequestError> {
        let inline = self.inner.inline_store;
        let node = self.inner.node.clone();
        let len = outgoing.len;
        self.retry_busy(|left| {
            let source = FileSource {
                file: lock(&outgoing.handles)
                    .get(&peer)
                    .and_then(|file| file.try_clone().ok()),
                offset: 0,
                left: len,
                inline,
            };
            let (node, header) = (node.clone(), header.clone());
            async move {
                node.request_streamed(peer, protocol, header, (len, source), left)
                    .await
            }
        })
        .await
    }

    /// The rest of `body` after `head`, read whole into one buffer with `head` in front: a
    /// request too small for a content file (read within the piece the node reserved for it).
    pub(super) async fn read_whole(
        head: &[&[u8]],
        body: &mut RequestBody,
    ) -> Result<Bytes, HandlerError> {
        let len = head.iter().map(|part| part.len()).sum::<usize>()
            + usize::try_from(body.remaining()).unwrap_or(usize::MAX);
        let mut whole = BytesMut::with_capacity(len);
        for part in head {
            whole.extend_from_slice(part);
        }
        while let Some(piece) = body.next_piece().await.map_err(HandlerError::from_body)? {
            whole.extend_from_slice(&piece);
        }
        Ok(whole.freeze())
    }

    /// The rest of `body` written to a new content file as it arrives (refused past
    /// `max_object_bytes`), then checked against `hash`: a mismatch is malformed, counted
    /// against `peer`, and leaves no file.
    pub(super) async fn write_body(
        &self,
        peer: PeerId,
        body: &mut RequestBody,
        hash: ContentHash,
    ) -> Result<WrittenContent, HandlerError> {
        let written = self.body_to_file(body).await.map_err(|error| match error {
            BodyToFile::Body(error) => HandlerError::from_body(error),
            BodyToFile::Writer(error) => HandlerError::Failed(Box::new(error)),
        })?;
        if written.hash() != hash {
            return Err(self.malformed(peer, object::ObjectError::HashMismatch));
        }
        Ok(written)
    }

    /// The rest of `body` written to a new content file as it arrives, hashed on the way
    /// (refused past `max_object_bytes`).
    async fn body_to_file(&self, body: &mut RequestBody) -> Result<WrittenContent, BodyToFile> {
        let mut writer = self
            .object_writer()
            .await
            .map_err(BodyToFile::Writer)?
            .ok_or(BodyToFile::Writer(StoreError::Stopped.into()))?;
        while let Some(piece) = body.next_piece().await.map_err(BodyToFile::Body)? {
            writer.write(piece).await.map_err(BodyToFile::Writer)?;
        }
        writer.finish().await.map_err(BodyToFile::Writer)
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
            .map_err(HandlerError::from_body)?;
        let (clock, stamp, key_len) = object::decode_store_fixed(&fixed).map_err(malformed)?;
        let key_bytes = body
            .read_exact(key_len)
            .await
            .map_err(HandlerError::from_body)?;
        let len = body.remaining();
        let max = self.inner.config.max_object_bytes;
        if len > max as u64 {
            return Err(malformed(object::ObjectError::TooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max,
            }));
        }
        if self.streamed_min_bytes().is_none_or(|min| len < min as u64) {
            // Too small for a content file: stored as a copy sent whole is.
            let whole = Self::read_whole(&[&fixed, &key_bytes], &mut body).await?;
            return self
                .clone()
                .serve_blocking(move |service| service.serve_store(peer, whole))
                .await;
        }
        let key = object::decode_store_key(&key_bytes).map_err(malformed)?;
        if let Err(reason) = self.admit(peer, clock, Some(stamp)) {
            return self.refuse(peer, key, reason);
        }
        let written = self.write_body(peer, &mut body, stamp.hash).await?;
        let key_owned = key.to_string();
        let held = self
            .on_store(move |store| store.put_written(&key_owned, stamp, written))
            .await
            .map_err(|_| HandlerError::Stopped)?
            .map_err(|error| HandlerError::Failed(Box::new(error)))?;
        self.stored(held, stamp)
    }
}

/// Why a body could not be written to a content file: the body failed to arrive, or the file
/// could not be written (or the body was too large).
enum BodyToFile {
    Body(meshwire::BodyError),
    Writer(ObjectServiceError),
}

/// A read's content: as this node's store gives it, or arriving from a replica that holds it.
#[derive(Debug)]
pub enum ReadBody {
    /// From this node: held, or its content file open for reading.
    Local(Body),
    /// From another replica, as a stream (see [`RemoteContent`]).
    Remote(Box<RemoteContent>),
}

impl ReadBody {
    /// The content's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::Local(body) => body.len(),
            Self::Remote(content) => content.len,
        }
    }

    /// Whether the content is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Body> for ReadBody {
    fn from(body: Body) -> Self {
        Self::Local(body)
    }
}

/// Why content streamed from another replica was cut short.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteContentError {
    /// The stream failed before the end (the replica reset it or went away, or it was late).
    #[error("the replica's copy of {key:?} stopped arriving: {source}")]
    Stream {
        /// The key.
        key: String,
        /// What failed.
        #[source]
        source: meshwire::BodyError,
    },
    /// The content does not match the hash of the stamp it was sent under.
    #[error("the replica's copy of {key:?} does not match its hash")]
    HashMismatch {
        /// The key.
        key: String,
    },
}

/// A replica's copy arriving piece by piece, checked against its stamp's hash as it is read: a
/// copy that does not match fails instead of its last piece, so a reader that passes pieces on
/// (an HTTP `GET`) ends short of the content's length rather than complete and wrong.
#[derive(Debug)]
pub struct RemoteContent {
    body: RequestBody,
    key: String,
    hash: ContentHash,
    hasher: meshwire::proto::hash::Sha256,
    len: u64,
}

impl RemoteContent {
    /// The next piece, or `None` once all of it arrived and matched its hash.
    pub async fn next_piece(&mut self) -> Result<Option<Bytes>, RemoteContentError> {
        let piece = match self.body.next_piece().await {
            Ok(Some(piece)) => piece,
            Ok(None) => return Ok(None),
            Err(source) => {
                return Err(RemoteContentError::Stream {
                    key: self.key.clone(),
                    source,
                })
            }
        };
        self.hasher.update(&piece);
        if self.body.remaining() == 0 && std::mem::take(&mut self.hasher).finish() != self.hash {
            return Err(RemoteContentError::HashMismatch {
                key: self.key.clone(),
            });
        }
        Ok(Some(piece))
    }

    /// All of it, in one buffer.
    pub async fn read_all(mut self) -> Result<Bytes, RemoteContentError> {
        let mut content = BytesMut::with_capacity(usize::try_from(self.len).unwrap_or(0));
        while let Some(piece) = self.next_piece().await? {
            content.extend_from_slice(&piece);
        }
        Ok(content.freeze())
    }
}

/// A content file sent as an answer, piece by piece, each read (and hashed: a damaged file
/// fails the answer instead of its last piece) on the blocking pool.
struct ReaderSource {
    reader: Option<Box<ContentReader>>,
    inline: bool,
}

impl meshwire::BodySource for ReaderSource {
    async fn next_piece(&mut self) -> std::io::Result<Option<Bytes>> {
        let Some(mut reader) = self.reader.take() else {
            return Ok(None);
        };
        let (reader, piece) = blocking(self.inline, move || {
            let piece = reader.next_chunk(PIECE_BYTES);
            (reader, piece)
        })
        .await
        .ok_or_else(|| std::io::Error::other("the blocking pool stopped"))?;
        match piece {
            Ok(Some(piece)) => {
                self.reader = Some(reader);
                Ok(Some(piece))
            }
            Ok(None) => Ok(None),
            Err(error) => Err(std::io::Error::other(error)),
        }
    }
}

impl ObjectService {
    /// The content of `key` stamped `winner` (or a newer one, as `current` says) from `peer`,
    /// streamed: `None` if the peer does not answer with such a copy in time. Its clock passes
    /// the same checks as any answer's.
    /// A copy longer than `limit` bytes is refused. With `observe_version`, the copy's version
    /// passes the clock's checks too (a copy this node will store, as anti-entropy's pulls do).
    pub(super) async fn remote_content(
        &self,
        peer: PeerId,
        key: &str,
        current: impl Fn(Stamp) -> bool,
        limit: u64,
        observe_version: bool,
    ) -> Option<(Stamp, ReadBody)> {
        let clock = self.tick().ok()?;
        let request = Bytes::from(object::encode_fetch(clock, object::FetchMode::Full, key));
        let mut body = self
            .inner
            .node
            .request_streamed_answer(peer, super::FETCH, request, self.inner.config.deadline)
            .await
            .ok()?;
        let head = body.read_exact(object::FETCHED_HEAD_LEN).await.ok()?;
        let (clock, stamp) = object::decode_fetched_head(&head).ok()??;
        let len = body.remaining();
        if !current(stamp)
            || len > limit.min(self.inner.config.max_object_bytes as u64)
            || self
                .accept_answer(peer, clock, observe_version.then_some(stamp.version))
                .is_err()
        {
            return None;
        }
        let content = RemoteContent {
            body,
            key: key.to_string(),
            hash: stamp.hash,
            hasher: meshwire::proto::hash::Sha256::new(),
            len,
        };
        Some((stamp, ReadBody::Remote(Box::new(content))))
    }

    /// The answer to an admitted full fetch of `key` when the object cache does not hold it: its
    /// stamp and, if `carries` its length, its content. A copy in a content file is streamed
    /// from the file, piece by piece, never held whole; one too large to carry is read through
    /// once to check it (on the blocking pool) and answered by its stamp alone. `None` when
    /// absent.
    pub(super) async fn stored_answer_body(
        &self,
        key: &str,
        carries: impl Fn(u64) -> bool,
    ) -> Result<Option<(Stamp, Option<AnswerBody>)>, StoreError> {
        let key = key.to_string();
        let Some((stamp, body)) = self.on_store(move |store| store.get_body(&key)).await?? else {
            return Ok(None);
        };
        let body = match body {
            Body::Held(content) => carries(content.len() as u64).then_some(content.into()),
            Body::File(reader) if carries(reader.len()) => {
                Some(AnswerBody::Streamed(meshwire::StreamedAnswer::new(
                    reader.len(),
                    ReaderSource {
                        reader: Some(reader),
                        inline: self.inner.inline_store,
                    },
                )))
            }
            Body::File(reader) => {
                self.on_store(move |_| reader.check()).await??;
                None
            }
        };
        Ok(Some((stamp, body)))
    }
}

impl ObjectService {
    /// Sends `peer` this node's copy of `key` in a store request, if it holds one (given `only`,
    /// only the copy stamped so): content held from its buffer, a content file's content piece by
    /// piece from the file, checked as it is read, never held whole. Asks again while the replica
    /// is busy (the copy read again from its start). `None`: no such copy here. Read repair and
    /// anti-entropy's pushes send copies so.
    pub(super) async fn send_local_copy(
        &self,
        peer: PeerId,
        key: &str,
        only: Option<Stamp>,
    ) -> Result<Option<SentCopy>, ReplicaError> {
        let Some((stamp, body)) = self.local_body(key).await? else {
            return Ok(None);
        };
        if only.is_some_and(|only| only != stamp) {
            return Ok(None);
        }
        let clock = self.tick()?;
        let header = Bytes::from(object::encode_store_header(clock, key, &stamp));
        let sent = header.len() as u64 + body.len();
        let first = Mutex::new(Some(body));
        let reply = self
            .retry_busy(|left| {
                let body = lock(&first).take();
                let (service, header) = (self.clone(), header.clone());
                async move {
                    // Asked again: the copy is read again from its start.
                    let body = match body {
                        Some(body) => body,
                        None => service.body_of(key, stamp).await.ok_or_else(|| {
                            meshwire::RequestError::Source(format!(
                                "this node's copy of {key:?} changed while it was sent"
                            ))
                        })?,
                    };
                    let node = &service.inner.node;
                    match body {
                        Body::Held(content) => {
                            node.request_parts(peer, super::STORE, header, content, left)
                                .await
                        }
                        Body::File(reader) => {
                            let len = reader.len();
                            let source = ReaderSource {
                                reader: Some(reader),
                                inline: service.inner.inline_store,
                            };
                            node.request_streamed(peer, super::STORE, header, (len, source), left)
                                .await
                        }
                    }
                }
            })
            .await?;
        Ok(Some(SentCopy {
            sent,
            received: reply.len() as u64,
            stored: self.stored_answer(peer, &reply)?,
        }))
    }

    /// This node's copy of `key` (held, or its content file open for reading), if it still
    /// holds the copy stamped `stamp`.
    async fn body_of(&self, key: &str, stamp: Stamp) -> Option<Body> {
        match self.local_body(key).await {
            Ok(Some((held, body))) if held == stamp => Some(body),
            _ => None,
        }
    }

    /// Fetches `peer`'s copy of `key` (at most `limit` bytes: the length its listing gave) as
    /// it arrives into a content file of this node (hashed once, as it is written; its clock and
    /// version checked as any answer's) and stores it; never holds it whole. `None`: the peer
    /// did not send such a copy (it no longer holds one, refused, or sent a longer one). Anti-
    /// entropy pulls copies large enough for a content file so.
    pub(super) async fn pull_written(
        &self,
        peer: PeerId,
        key: &str,
        limit: u64,
    ) -> Result<Option<PulledCopy>, ReplicaError> {
        let Some((stamp, ReadBody::Remote(content))) =
            self.remote_content(peer, key, |_| true, limit, true).await
        else {
            return Ok(None);
        };
        let mut content = *content;
        let received = content.len + object::FETCHED_HEAD_LEN as u64;
        let written = match self.body_to_file(&mut content.body).await {
            Ok(written) => written,
            Err(BodyToFile::Body(error)) => return Err(error.into()),
            Err(BodyToFile::Writer(error)) => return Err(replica_error(error)),
        };
        if written.hash() != stamp.hash {
            return Err(object::ObjectError::HashMismatch.into());
        }
        let key = key.to_string();
        let held = self
            .on_store(move |store| store.put_written(&key, stamp, written))
            .await??;
        Ok(Some(PulledCopy {
            received,
            holds: held == stamp,
        }))
    }
}

/// A copy this node sent a replica ([`ObjectService::send_local_copy`]).
pub(super) struct SentCopy {
    /// Bytes sent: the request's header and the content.
    pub sent: u64,
    /// Bytes of the replica's answer.
    pub received: u64,
    /// The replica's answer.
    pub stored: Stored,
}

/// A copy this node fetched and stored ([`ObjectService::pull_written`]).
pub(super) struct PulledCopy {
    /// Bytes of the answer: its head and the content.
    pub received: u64,
    /// Whether this node now holds the fetched copy (not a newer one it held already).
    pub holds: bool,
}

/// An [`ObjectWriter`]'s error as a failure of the copy it was writing: the copy was larger
/// than allowed, or this node's store failed (a writer fails in no other way).
fn replica_error(error: ObjectServiceError) -> ReplicaError {
    match error {
        ObjectServiceError::TooLarge { len, max } => {
            object::ObjectError::TooLarge { len, max }.into()
        }
        ObjectServiceError::Store(error) => error.into(),
        _ => StoreError::Stopped.into(),
    }
}
