//! Why an object operation failed: [`ObjectServiceError`], the one error type of the object
//! service's reads, writes and configuration checks.

use crate::proto::clock::ClockError;
use crate::proto::object::{ObjectError, Stamp};
use crate::proto::quorum::QuorumError;
use meshwire::SubscribeError;

use super::super::store::StoreError;

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectServiceError {
    /// The key is not valid.
    #[error(transparent)]
    InvalidKey(ObjectError),
    /// The content exceeds the maximum.
    #[error("object of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The content length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No replica holds the key.
    #[error("no such object")]
    NotFound,
    /// Fewer replicas answered a read than the quorum needs.
    #[error("quorum not reached: {reached} of {needed} needed ({asked} replicas asked)")]
    QuorumNotReached {
        /// Answers needed.
        needed: usize,
        /// Answers received.
        reached: usize,
        /// Replicas asked.
        asked: usize,
    },
    /// Fewer replicas acked a write than W before the deadline. The outcome is unknown: replicas
    /// that stored the copy keep it, so it may still be read later.
    #[error(
        "write quorum not reached: {acks} of {needed} acks ({asked} replicas asked, \
         {superseded} superseded); the write may still apply"
    )]
    WriteUnconfirmed {
        /// Acks needed.
        needed: usize,
        /// Acks received.
        acks: usize,
        /// Replicas asked.
        asked: usize,
        /// Replicas that answered they hold a winning copy instead.
        superseded: usize,
    },
    /// A newer write of the key won on so many replicas that this write could not reach W acks:
    /// it will not be read (a read quorum meets a replica holding the newer copy, and anti-entropy
    /// spreads that copy), so it must not be retried as if its outcome were unknown: retrying
    /// would overwrite the newer write.
    #[error(
        "superseded: a newer write of this key won on {superseded} of {asked} replicas, so this \
         write cannot reach {needed} acks ({acks} acked)"
    )]
    Superseded {
        /// Acks needed.
        needed: usize,
        /// Acks received.
        acks: usize,
        /// Replicas asked.
        asked: usize,
        /// Replicas that answered they hold a winning copy.
        superseded: usize,
    },
    /// An `If-Match` or `If-None-Match` header is not one this API takes.
    #[error(transparent)]
    InvalidPrecondition(#[from] crate::proto::cas::PreconditionError),
    /// A conditional write's precondition does not hold: nothing was written. `current` is the
    /// newest copy a replica reported (`None`: absent).
    #[error("precondition failed: the current copy does not match")]
    PreconditionFailed {
        /// The newest current copy reported.
        current: Option<Stamp>,
    },
    /// Other conditional writes on the key were pending on too many replicas: nothing was written.
    #[error("conflict: another conditional write is in progress ({prepared} of {needed} replicas prepared)")]
    Conflict {
        /// Prepares needed.
        needed: usize,
        /// Prepares received.
        prepared: usize,
    },
    /// Too few replicas prepared a conditional write before the deadline: nothing was written.
    #[error("write quorum not reached: {prepared} of {needed} replicas prepared ({asked} asked); nothing was written")]
    NotApplied {
        /// Prepares needed.
        needed: usize,
        /// Prepares received.
        prepared: usize,
        /// Replicas asked.
        asked: usize,
    },
    /// The quorum agreed on a copy but none of its holders delivered its content in time.
    #[error("no holder of the winning copy delivered it")]
    ContentUnavailable,
    /// This node's hybrid clock cannot produce a new version.
    #[error(transparent)]
    Clock(ClockError),
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The settings cannot work.
    #[error(transparent)]
    Config(#[from] QuorumError),
    /// Another service already handles the object protocols on this node.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// `max_object_bytes` does not fit in one node message: a PUT of that size could never be
    /// replicated.
    #[error(
        "max_object_bytes = {max_object_bytes} does not fit in one message: the node's frame \
         limit is {max_payload_bytes} bytes, of which {overhead} are the object header; \
         use at most {largest}"
    )]
    ObjectLimit {
        /// The configured largest object.
        max_object_bytes: usize,
        /// The node's largest message payload (`Limits::max_payload_bytes`).
        max_payload_bytes: u32,
        /// Bytes of the largest object message header.
        overhead: usize,
        /// The largest `max_object_bytes` that fits.
        largest: usize,
    },
}
