//! Version requests to one replica gathered into one `OBJECT_STAMPS` request while the runtime is
//! busy, and the replica's side of that request (the message format is in
//! [`crate::proto::stamps`]).
//!
//! The first version request to a replica with none waiting spawns a sender and queues itself;
//! the sender yields once (tokio runs a yielded task after the work already queued on its worker
//! and a poll of the sockets, or as soon as the worker would otherwise wait), then takes every
//! request queued to that replica meanwhile and sends them: one key alone as a plain metadata
//! fetch, as before, more as one stamps request per [`MAX_STAMP_KEYS`] waiting reads, each
//! distinct key asked once. An idle node therefore sends each read's request at once; a busy one
//! sends one request where it sent many.
//! On the 2-core loopback cluster of `bench/http.sh` a replica spent about 37 µs of CPU per
//! version request it answered, almost all of it the request's stream, tasks and wake-ups, not
//! the lookup.
//!
//! Each waiting read gets its own answer, or the request's failure; a read that gives up (its
//! plan done, its deadline passed) drops its receiver and the others are unaffected.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{OBJECT_FETCH as FETCH, OBJECT_STAMPS as STAMPS};
use meshwire::{HandlerError, PeerId, RequestError};
use tokio::sync::oneshot;

use crate::net::store::StoreError;
use crate::proto::object::{self, FetchMode, Fetched, Stamp};
use crate::proto::stamps::{self as wire, MAX_STAMP_KEYS};

use super::serve::handler_error;
use super::{lock, ObjectService, ReplicaError};

/// One read's answer: the replica's clock and its copy's stamp, or why there is none.
type StampAnswer = Result<(u64, Option<Stamp>), ReplicaError>;

/// A version request waiting to be sent.
#[derive(Debug)]
struct Waiting {
    key: String,
    /// How long the read waits for this replica.
    timeout: Duration,
    reply: oneshot::Sender<StampAnswer>,
}

/// Per replica, the version requests waiting for its sender.
#[derive(Debug, Default)]
pub(super) struct StampQueues(HashMap<PeerId, Vec<Waiting>>);

impl ObjectService {
    /// The version and hash of `peer`'s copy of `key` (a metadata fetch), asked together with the
    /// other version requests to `peer` that reads start before the runtime is idle.
    pub(super) async fn fetch_stamp(
        &self,
        peer: PeerId,
        key: &str,
        timeout: Duration,
    ) -> Result<Fetched<Bytes>, ReplicaError> {
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut queues = lock(&self.inner.stamp_queues);
            let queue = queues.0.entry(peer).or_default();
            queue.push(Waiting {
                key: key.to_string(),
                timeout,
                reply,
            });
            queue.len() == 1
        };
        if first {
            tokio::spawn(self.clone().send_stamps(peer));
        }
        // The sender answers every request it took, within the request's own deadline; a
        // dropped sender means the service is stopping.
        let (clock, stamp) = answer
            .await
            .map_err(|_| ReplicaError::Request(RequestError::NoResponse))??;
        self.accept_answer(peer, clock, stamp.map(|s| s.version))?;
        Ok(match stamp {
            None => Fetched::Absent,
            Some(stamp) => Fetched::Present {
                stamp,
                content: None,
            },
        })
    }

    /// Sends the version requests queued to `peer` once the runtime has run what it had queued.
    async fn send_stamps(self, peer: PeerId) {
        tokio::task::yield_now().await;
        let waiting = lock(&self.inner.stamp_queues)
            .0
            .remove(&peer)
            .unwrap_or_default();
        let mut batches = Vec::new();
        let mut waiting = waiting.into_iter().peekable();
        while waiting.peek().is_some() {
            let batch: Vec<Waiting> = waiting.by_ref().take(MAX_STAMP_KEYS).collect();
            batches.push(self.send_batch(peer, batch));
        }
        futures_util::future::join_all(batches).await;
    }

    /// Sends one batch of version requests to `peer`, each distinct key asked once (concurrent
    /// reads of a hot key are common), under the longest of their timeouts, and answers each.
    async fn send_batch(&self, peer: PeerId, batch: Vec<Waiting>) {
        let mut keys: Vec<&str> = Vec::new();
        let slots: Vec<usize> = batch
            .iter()
            .map(|w| {
                keys.iter().position(|k| *k == w.key).unwrap_or_else(|| {
                    keys.push(&w.key);
                    keys.len() - 1
                })
            })
            .collect();
        let timeout = batch.iter().map(|w| w.timeout).max().unwrap_or_default();
        self.inner.metrics.stamp_requests.inc();
        self.inner
            .metrics
            .stamp_request_keys
            .inc_by(keys.len() as u64);
        let answered = self.ask_stamps(peer, &keys, timeout).await;
        for (waiting, slot) in batch.into_iter().zip(slots) {
            let answer = match &answered {
                Ok((clock, stamps)) => Ok((*clock, stamps[slot])),
                Err(error) => Err(shared(error)),
            };
            // A read that gave up has dropped its receiver.
            let _ = waiting.reply.send(answer);
        }
    }

    /// One request for the stamps of `keys` (distinct): a plain metadata fetch for one key.
    async fn ask_stamps(
        &self,
        peer: PeerId,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<(u64, Vec<Option<Stamp>>), ReplicaError> {
        let clock = self.tick()?;
        let node = &self.inner.node;
        let answer = if let [key] = keys {
            let request = object::encode_fetch(clock, FetchMode::Metadata, key);
            let reply = node.request(peer, FETCH, request.into(), timeout).await?;
            let answer = object::decode_fetched(FetchMode::Metadata, &reply, 0)?;
            object::Answer {
                clock: answer.clock,
                answer: answer.answer.map(|fetched| vec![super::stamp_of(&fetched)]),
            }
        } else {
            let request = wire::encode_stamps_request(clock, keys);
            let reply = node.request(peer, STAMPS, request.into(), timeout).await?;
            wire::decode_stamps_answer(&reply, keys.len())?
        };
        let stamps = answer
            .answer
            .map_err(|reason| self.refused_answer(reason))?;
        Ok((answer.clock, stamps))
    }

    /// Answers `peer`'s stamps request (the `OBJECT_STAMPS` handler): each key's stamp from the
    /// object cache, the rest looked up in one call on the blocking pool; or refuses it, under the
    /// same gate as a fetch.
    pub async fn serve_stamps(&self, peer: PeerId, body: Bytes) -> Result<Bytes, HandlerError> {
        let request = wire::decode_stamps_request(&body).map_err(|e| self.malformed(peer, e))?;
        if let Err(reason) = self.admit(peer, request.clock, None) {
            return self.refuse(peer, request.keys[0], reason);
        }
        let store = &self.inner.store;
        let mut stamps: Vec<Option<Stamp>> = Vec::with_capacity(request.keys.len());
        let mut missed = Vec::new();
        for (index, key) in request.keys.iter().enumerate() {
            match store.cached(key) {
                Some(object) => stamps.push(Some(object.stamp)),
                None => {
                    stamps.push(None);
                    missed.push((index, key.to_string()));
                }
            }
        }
        if !missed.is_empty() {
            let looked_up = self
                .on_store(move |store| {
                    missed
                        .into_iter()
                        .map(|(index, key)| store.checked_stamp(&key).map(|s| (index, s)))
                        .collect::<Result<Vec<_>, StoreError>>()
                })
                .await
                .map_err(|error| match error {
                    StoreError::Stopped => HandlerError::Stopped,
                    other => handler_error(other),
                })?
                .map_err(handler_error)?;
            for (index, stamp) in looked_up {
                stamps[index] = stamp;
            }
        }
        let clock = self.tick().map_err(handler_error)?;
        Ok(Bytes::from(wire::encode_stamps_answer(clock, &stamps)))
    }
}

/// Each waiting read's copy of its batch's failure. The failures of a batch's request are all of
/// kinds that can be copied; any other is passed on by its message.
fn shared(error: &ReplicaError) -> ReplicaError {
    match error {
        ReplicaError::Request(error) => ReplicaError::Request(error.clone()),
        ReplicaError::Malformed(error) => ReplicaError::Malformed(error.clone()),
        ReplicaError::Refused(reason) => ReplicaError::Refused(*reason),
        ReplicaError::Clock(error) => ReplicaError::Clock(*error),
        other => ReplicaError::Request(RequestError::Remote(other.to_string())),
    }
}
