//! Answer other members' fetch and store requests, and refuse non-members and stamps from the future.
//!
//! Every inbound object request passes the same gate before the store is touched: the sender must
//! be a member of this node's cluster (else [`Refusal::NotMember`]), and its clock and any version
//! it carries must pass this node's hybrid clock ([`Refusal::ClockSkew`] beyond `max_clock_skew`,
//! [`Refusal::VersionLimit`] at `u64::MAX`). A refused request gets a refusal answer, is counted in
//! `meshwire_object_refused_requests_total{reason}` and logged at warn with the sender's PeerId;
//! a non-member's clock never moves this node's clock.

use bytes::Bytes;
use meshwire::{AnswerBody, HandlerError, PeerId};

use crate::net::store::{StoreError, StoredObject};
use crate::proto::clock::ClockError;
use crate::proto::object::{self, FetchMode, FetchRequest, ObjectError, Refusal, Stamp, Stored};

use super::{lock, ObjectService, ReasonLabel};

/// The refusal that answers a clock error.
pub(super) fn refusal_of(error: ClockError) -> Refusal {
    match error {
        ClockError::AtLimit | ClockError::Exhausted => Refusal::VersionLimit,
        _ => Refusal::ClockSkew,
    }
}

impl ObjectService {
    /// Answers `peer`'s fetch request from the local store, or refuses it.
    pub fn serve_fetch(&self, peer: PeerId, body: &[u8]) -> Result<Bytes, HandlerError> {
        let request = match self.admit_fetch(peer, body) {
            Ok(request) => request,
            Err(answer) => return answer,
        };
        if request.mode == FetchMode::Metadata {
            let stamp = self
                .inner
                .store
                .checked_stamp(request.key)
                .map_err(handler_error)?;
            return self.answer_stamp(stamp).map(|(head, _)| head);
        }
        let held = self.inner.store.get(request.key).map_err(handler_error)?;
        let (head, content) = self.answer_fetch(request.mode, held)?;
        let mut answer = Vec::with_capacity(head.len() + content.len());
        answer.extend_from_slice(&head);
        answer.extend_from_slice(&content);
        Ok(Bytes::from(answer))
    }

    /// [`Self::serve_fetch`] as the node's handler runs it: decoding, the gate and an object the
    /// cache holds are answered on the calling task; only a cache miss reads the store, on the
    /// blocking pool. A hot object then costs a remote reader no hand-off to another thread and
    /// back (on the 2-core loopback cluster of `bench/http.sh`, two context switches per read).
    /// The answer is its header and the content as held (shared with the object cache), sent
    /// without joining them, or a content file's content streamed from the file, piece by piece.
    /// A [`FetchMode::FullIfSmall`] fetch of content over [`object::CARRY_MAX_BYTES`] gets the
    /// checked stamp without the content.
    pub(super) async fn serve_fetch_offloaded(
        &self,
        peer: PeerId,
        body: Bytes,
    ) -> Result<(Bytes, AnswerBody), HandlerError> {
        let request = match self.admit_fetch(peer, &body) {
            Ok(request) => request,
            Err(answer) => return answer.map(|answer| (answer, Bytes::new().into())),
        };
        let store_failed = |error| match error {
            StoreError::Stopped => HandlerError::Stopped,
            other => handler_error(other),
        };
        let carries = move |len: u64| {
            request.mode == FetchMode::Full || len <= object::CARRY_MAX_BYTES as u64
        };
        // The copy's stamp and, when the answer carries it, its content.
        let held = if request.mode == FetchMode::Metadata {
            // Version and hash, the content checked without holding it whole.
            let stamp = self.local_stamp(request.key).await.map_err(store_failed)?;
            stamp.map(|stamp| (stamp, None))
        } else if let Some(object) = self.inner.store.cached(request.key) {
            let carried = carries(object.content.len() as u64).then_some(object.content.into());
            Some((object.stamp, carried))
        } else {
            self.stored_answer_body(request.key, carries)
                .await
                .map_err(store_failed)?
        };
        let clock = self.tick().map_err(handler_error)?;
        let head = match &held {
            Some((stamp, None)) if request.mode == FetchMode::FullIfSmall => {
                object::encode_fetched_not_carried(clock, stamp)
            }
            held => object::encode_fetched_header(clock, held.as_ref().map(|(stamp, _)| stamp)),
        };
        let body = held
            .and_then(|(_, body)| body)
            .unwrap_or_else(|| Bytes::new().into());
        Ok((Bytes::from(head), body))
    }

    /// Decodes `peer`'s fetch request and passes it through the gate: the request to answer, or
    /// the answer already due (a malformed request's error, a refusal).
    fn admit_fetch<'b>(
        &self,
        peer: PeerId,
        body: &'b [u8],
    ) -> Result<FetchRequest<'b>, Result<Bytes, HandlerError>> {
        let request =
            object::decode_fetch(body).map_err(|error| Err(self.malformed(peer, error)))?;
        match self.admit(peer, request.clock, None) {
            Ok(()) => Ok(request),
            Err(reason) => Err(self.refuse(peer, request.key, reason)),
        }
    }

    /// The answer to an admitted fetch request, stamped with this node's clock: its header, and
    /// the content in full mode.
    fn answer_fetch(
        &self,
        mode: FetchMode,
        held: Option<StoredObject>,
    ) -> Result<(Bytes, Bytes), HandlerError> {
        match held {
            Some(object) if mode == FetchMode::Full => {
                let (head, _) = self.answer_stamp(Some(object.stamp))?;
                Ok((head, object.content))
            }
            held => self.answer_stamp(held.map(|object| object.stamp)),
        }
    }

    /// The answer to an admitted metadata fetch: `stamp`, or absent (and no content).
    fn answer_stamp(&self, stamp: Option<Stamp>) -> Result<(Bytes, Bytes), HandlerError> {
        let clock = self.tick().map_err(handler_error)?;
        let head = Bytes::from(object::encode_fetched_header(clock, stamp.as_ref()));
        Ok((head, Bytes::new()))
    }

    /// Stores a copy sent by `peer` if it wins over the local one, or refuses it. Answers
    /// [`Stored::Holds`] only when the store now holds exactly the version and hash sent.
    pub fn serve_store(&self, peer: PeerId, body: Bytes) -> Result<Bytes, HandlerError> {
        let request = object::decode_store(&body, self.inner.config.max_object_bytes)
            .map_err(|error| self.malformed(peer, error))?;
        if let Err(reason) = self.admit(peer, request.clock, Some(request.stamp)) {
            return self.refuse(peer, request.key, reason);
        }
        let held = self
            .inner
            .store
            .put(
                request.key,
                request.stamp,
                body.slice(request.content.clone()),
            )
            .map_err(handler_error)?;
        self.stored(held, request.stamp)
    }

    /// The answer to a store request for `sent` when the store holds `held` afterwards: an ack
    /// only when they are the same.
    pub(super) fn stored(&self, held: Stamp, sent: Stamp) -> Result<Bytes, HandlerError> {
        let stored = if held == sent {
            Stored::Holds
        } else {
            Stored::Superseded(held)
        };
        let clock = self.tick().map_err(handler_error)?;
        Ok(Bytes::from(object::encode_stored(clock, stored)))
    }

    /// Counts a request from `peer` that does not decode in
    /// `meshwire_object_refused_requests_total{reason="malformed"}` and answers it with the error.
    /// Where the peer broke the protocol ([`ObjectError::breaks_protocol`]) the node then closes
    /// the connection (`meshwire_frame_errors_total{reason="malformed_request"}`). A limit
    /// another member may not share is counted as `reason="too_large"` instead. Logged here at
    /// debug; the close is logged at warn.
    pub(super) fn malformed(&self, peer: PeerId, error: ObjectError) -> HandlerError {
        let reason = match error {
            ObjectError::TooLarge { .. } | ObjectError::TooManyKeys(_) => "too_large",
            _ => "malformed",
        };
        self.inner
            .metrics
            .refused_requests
            .get_or_create(&ReasonLabel { reason })
            .inc();
        tracing::debug!(%peer, %error, reason, "object request refused");
        HandlerError::refused(error.breaks_protocol(), error)
    }

    /// Counts and logs a request from `peer` refused for `reason`: at warn once a minute per peer
    /// and reason (with how many were not logged at warn since), else at debug.
    pub(super) fn count_refused_request(&self, peer: PeerId, key: &str, reason: Refusal) {
        let reason = reason.name();
        self.inner
            .metrics
            .refused_requests
            .get_or_create(&ReasonLabel { reason })
            .inc();
        let now_ms = self.inner.physical.now_ms();
        match lock(&self.inner.refusal_warnings).check((peer, reason), now_ms) {
            Some(0) => tracing::warn!(%peer, %key, reason, "object request refused"),
            Some(unlogged) => tracing::warn!(
                %peer,
                %key,
                reason,
                "object request refused ({unlogged} more from this peer for this reason since the last warning)"
            ),
            None => tracing::debug!(%peer, %key, reason, "object request refused"),
        }
    }

    /// Lets a request from `peer` sent at `clock` (carrying `stamp`, for a store) through the
    /// membership and clock gate; the accepted clock and version move this node's clock.
    pub(super) fn admit(
        &self,
        peer: PeerId,
        clock: u64,
        stamp: Option<Stamp>,
    ) -> Result<(), Refusal> {
        if !self.is_member(peer) {
            return Err(Refusal::NotMember);
        }
        let now_ms = self.inner.physical.now_ms();
        let mut hybrid = lock(&self.inner.clock);
        // Both are checked before either is accepted, so a refused request moves nothing.
        hybrid.check(clock, now_ms).map_err(refusal_of)?;
        if let Some(stamp) = stamp {
            hybrid.check(stamp.version, now_ms).map_err(refusal_of)?;
            hybrid.observe(stamp.version, now_ms).map_err(refusal_of)?;
        }
        hybrid.observe(clock, now_ms).map_err(refusal_of)
    }

    pub(super) fn refuse(
        &self,
        peer: PeerId,
        key: &str,
        reason: Refusal,
    ) -> Result<Bytes, HandlerError> {
        self.count_refused_request(peer, key, reason);
        let clock = self.tick().map_err(handler_error)?;
        Ok(Bytes::from(object::encode_refusal(clock, reason)))
    }
}

pub(super) fn handler_error(error: impl std::error::Error + Send + Sync + 'static) -> HandlerError {
    HandlerError::Failed(Box::new(error))
}
