//! The service's calls into the store, hashing included: all run on tokio's blocking pool, so
//! disk reads, durable commits and SHA-256 of large objects never stall the async workers that
//! serve the network and the HTTP API.

use bytes::Bytes;
use meshwire::HandlerError;

use super::{lock, ObjectService, ObjectServiceError, ReadBody};
use crate::net::store::{
    Body, ContentReader, Store, StoreError, StoredObject, CHECKPOINT_MAX_BACKOFF, QUICK_REPAIR_GAP,
};
use crate::proto::object::{content_hash, ContentHash, Stamp};

impl ObjectService {
    /// The version for a new write of `key`: a tick of the hybrid clock after it observed the
    /// version this node holds and `after` (a conditional write's expected version), unless one
    /// is beyond the accepted skew (it is then not adopted, and loses).
    /// The content's hash is computed on the blocking pool with the held version's lookup.
    pub(super) async fn next_stamp(
        &self,
        key: &str,
        content: &Bytes,
        after: Option<u64>,
    ) -> Result<Stamp, ObjectServiceError> {
        let content = content.clone();
        self.next_stamp_of(key, move || content_hash(&content), after)
            .await
    }

    /// The stamp of a new write under `key` whose content `hash` hashes (on the blocking pool,
    /// with the read of the held copy): this node's next clock tick, after the held copy's
    /// version and `after`.
    pub(super) async fn next_stamp_of(
        &self,
        key: &str,
        hash: impl FnOnce() -> ContentHash + Send + 'static,
        after: Option<u64>,
    ) -> Result<Stamp, ObjectServiceError> {
        let key = key.to_string();
        let (held, hash) = self
            .on_store(move |store| {
                // A damaged local copy is not observed: the write replaces it.
                let held = store.header(&key).unwrap_or(None).map(|(stamp, _)| stamp);
                (held, hash())
            })
            .await?;
        let now_ms = self.inner.physical.now_ms();
        let mut hybrid = lock(&self.inner.clock);
        for version in held.map(|held| held.version).into_iter().chain(after) {
            // A refused version is not adopted: a write must not inherit a stamp from the future.
            let _ = hybrid.observe(version, now_ms);
        }
        let version = hybrid.tick(now_ms).map_err(ObjectServiceError::Clock)?;
        Ok(Stamp { version, hash })
    }

    /// Runs `call` on the store in tokio's blocking pool, so disk reads, durable commits and
    /// hashing never stall the async workers that serve the network and the HTTP API.
    pub(crate) async fn on_store<T, F>(&self, call: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> T + Send + 'static,
    {
        let store = self.inner.store.clone();
        blocking(self.inner.inline_store, move || call(&store))
            .await
            .ok_or(StoreError::Stopped)
    }

    /// Runs a request handler's store work, `serve`, on the blocking pool (see
    /// [`Self::on_store`]); a stopped pool answers [`HandlerError::Stopped`].
    pub(super) async fn serve_blocking(
        self,
        serve: impl FnOnce(&Self) -> Result<Bytes, HandlerError> + Send + 'static,
    ) -> Result<Bytes, HandlerError> {
        let inline = self.inner.inline_store;
        blocking(inline, move || serve(&self))
            .await
            .unwrap_or(Err(HandlerError::Stopped))
    }

    /// The local copy of `key`: from the object cache at once, else read on the blocking pool.
    pub(crate) async fn local_copy(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        if let Some(object) = self.inner.store.cached(key) {
            return Ok(Some(object));
        }
        let key = key.to_string();
        self.on_store(move |store| store.get(&key)).await?
    }

    /// The local copy of `key` as a [`Body`] (see [`Store::get_body`]), read on the blocking pool
    /// unless the object cache holds it.
    pub(crate) async fn local_body(&self, key: &str) -> Result<Option<(Stamp, Body)>, StoreError> {
        if let Some(object) = self.inner.store.cached(key) {
            return Ok(Some((object.stamp, Body::Held(object.content))));
        }
        let key = key.to_string();
        self.on_store(move |store| store.get_body(&key)).await?
    }

    /// The stamp of the local copy of `key`, its content checked (see [`Store::checked_stamp`]):
    /// from the object cache at once, else on the blocking pool.
    pub(crate) async fn local_stamp(&self, key: &str) -> Result<Option<Stamp>, StoreError> {
        if let Some(object) = self.inner.store.cached(key) {
            return Ok(Some(object.stamp));
        }
        let key = key.to_string();
        self.on_store(move |store| store.checked_stamp(&key))
            .await?
    }

    /// `body`'s whole content: a content file is read (and checked) on the blocking pool.
    pub(crate) async fn held(&self, body: Body) -> Result<Bytes, StoreError> {
        match body {
            Body::Held(content) => Ok(content),
            Body::File(reader) => self.on_store(move |_| reader.read_all()).await?,
        }
    }

    /// A read's whole content (see [`Self::held`]); content streamed from a replica is read to
    /// its end and checked.
    pub(crate) async fn held_read(&self, body: ReadBody) -> Result<Bytes, ObjectServiceError> {
        match body {
            ReadBody::Local(body) => Ok(self.held(body).await?),
            ReadBody::Remote(content) => content
                .read_all()
                .await
                .map_err(|_| ObjectServiceError::ContentUnavailable),
        }
    }

    /// Keeps a store on disk quick to reopen after a crash: whenever commits left redb's
    /// allocator state unsaved and the store has been idle for [`QUICK_REPAIR_GAP`], runs
    /// [`Store::checkpoint`] on the blocking pool (see `store/repair.rs`). A failed checkpoint
    /// is logged and tried again after a wait that doubles with each failure in a row, up to
    /// [`CHECKPOINT_MAX_BACKOFF`]. `None` for a store in memory. The loop holds the store open
    /// until the task is aborted.
    pub fn spawn_checkpoints(&self) -> Option<tokio::task::JoinHandle<()>> {
        if !self.inner.store.on_disk() {
            return None;
        }
        let store = self.inner.store.clone();
        let inline = self.inner.inline_store;
        Some(tokio::spawn(async move {
            let mut backoff = QUICK_REPAIR_GAP;
            loop {
                store.checkpoint_due().await;
                let store = store.clone();
                match blocking(inline, move || store.checkpoint()).await {
                    Some(Ok(_)) => backoff = QUICK_REPAIR_GAP,
                    Some(Err(error)) => {
                        tracing::warn!(
                            %error,
                            retry_ms = backoff.as_millis() as u64,
                            "saving the store's allocator state failed (a crash now costs a \
                             rebuild when the store is opened; no write is lost)"
                        );
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(CHECKPOINT_MAX_BACKOFF);
                    }
                    None => return,
                }
            }
        }))
    }

    /// The next chunk of at most `max` bytes from `reader` and the reader to read on with, or
    /// `None` at the end (see [`ContentReader::next_chunk`]); read on the blocking pool.
    pub async fn next_chunk(
        &self,
        mut reader: Box<ContentReader>,
        max: usize,
    ) -> Result<Option<(Bytes, Box<ContentReader>)>, StoreError> {
        let (reader, chunk) = blocking(self.inner.inline_store, move || {
            let chunk = reader.next_chunk(max);
            (reader, chunk)
        })
        .await
        .ok_or(StoreError::Stopped)?;
        Ok(chunk?.map(|chunk| (chunk, reader)))
    }
}

/// Runs `work` on tokio's blocking pool (at once on this task when `inline`, see
/// [`super::ServiceOptions::inline_store`]); `None` when the runtime cancelled it (shutting
/// down). A panic in `work` resumes in the caller.
pub(crate) async fn blocking<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    match offload(inline, work).await {
        Ok(value) => Some(value),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => None,
    }
}

/// Runs `work` on tokio's blocking pool, or at once on this task when `inline`.
pub(super) async fn offload<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if inline {
        Ok(work())
    } else {
        tokio::task::spawn_blocking(work).await
    }
}
