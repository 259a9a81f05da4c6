//! Describe versioned objects, place them on replicas, encode the messages that move them between
//! nodes, and merge the copies a quorum read returns.
//!
//! # Design
//!
//! An object is `(key, version, content hash, bytes)`. The hash is SHA-256 of the bytes; every
//! decoder checks it, so a copy damaged on disk or on the wire is refused, never merged.
//!
//! Replicas are chosen by rendezvous (highest-random-weight) hashing: each peer's weight for a key
//! is the first 8 bytes of `SHA-256(key ‖ peer id)`, and the `R` heaviest peers hold the key. Every
//! node that knows the same peers computes the same replica set, and adding or removing a peer
//! moves only the keys it wins or held.
//!
//! Messages between nodes (all integers little-endian, all lengths checked before any allocation).
//! Every message starts with the sender's hybrid clock ([`crate::proto::clock`]), so every
//! exchange keeps the two clocks together; versions are timestamps of the same clock.
//!
//! ```text
//! fetch request   [clock u64][mode u8: 0 = metadata, 1 = full][key]
//! fetch response  [clock u64][0]                                  the key is absent
//!                 [clock u64][1][version u64][hash 32][content]   content empty in metadata mode
//!                 [clock u64][2][reason u8]                       refused (see below)
//! store request   [clock u64][version u64][hash 32][key_len u16][key][content]
//! store response  [clock u64][0]                                  the replica holds exactly this version and hash: an ack
//!                 [clock u64][1][version u64][hash 32]            superseded: it holds this winning copy instead
//!                 [clock u64][2][reason u8]                       refused (see below)
//! ```
//!
//! The anti-entropy messages (`OBJECT_SYNC`) are in [`crate::proto::entropy`]; pulls and pushes
//! are the fetch and store messages above. Version requests for several keys at once
//! (`OBJECT_STAMPS`) are in [`crate::proto::stamps`].
//!
//! Refusal reasons ([`Refusal`]): 1 = the sender is not a member of the replica's cluster,
//! 2 = the sender's clock or a version it carries is further ahead than the accepted skew,
//! 3 = a version at the integer limit. A refusal is an answer, not an ack and not a copy.
//!
//! Merge (Zold's lesson, `docs/lessons.md`: copies from untrusted nodes are compared, not taken on
//! faith): the highest version wins; among copies of that version with different contents, the one
//! whose holders have the highest summed trust wins, then the most holders, then the smaller hash
//! (so every reader picks the same copy).

use meshwire_proto::hash::sha256;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// SHA-256 of an object's content.
pub type ContentHash = [u8; 32];

/// Why an object message or key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The key is empty, too long, or has a character outside `[A-Za-z0-9._-]`.
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
    /// The message ended early.
    #[error("message truncated: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes it has.
        have: usize,
    },
    /// A tag or mode byte is not one this version knows.
    #[error("unknown tag {0}")]
    UnknownTag(u8),
    /// The content does not match its hash.
    #[error("content does not match its hash")]
    HashMismatch,
    /// Bytes follow a message that should have ended.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// The content exceeds the configured maximum.
    #[error("content of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The content's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A request names more keys than one request may ([`crate::proto::stamps::MAX_STAMP_KEYS`]).
    #[error("more than {0} keys in one request")]
    TooManyKeys(usize),
}

impl ObjectError {
    /// Whether a peer whose request failed so broke the protocol (its connection is closed).
    /// A limit another member may not share (content over this node's maximum, more keys than
    /// one request may name) or a tag a newer version added does not: members may run different
    /// versions or settings.
    pub fn breaks_protocol(&self) -> bool {
        !matches!(
            self,
            Self::TooLarge { .. } | Self::TooManyKeys(_) | Self::UnknownTag(_)
        )
    }
}

/// Checks that `key` is 1..=256 bytes of `[A-Za-z0-9._-]`, and not `.` or `..`.
pub fn validate_key(key: &str) -> Result<(), ObjectError> {
    if key.is_empty() {
        return Err(ObjectError::InvalidKey("empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(ObjectError::InvalidKey("longer than 256 bytes"));
    }
    if key == "." || key == ".." {
        return Err(ObjectError::InvalidKey("'.' and '..' are reserved"));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ObjectError::InvalidKey(
            "only ASCII letters, digits, '.', '_' and '-' are allowed",
        ));
    }
    Ok(())
}

/// SHA-256 of `content`.
pub fn content_hash(content: &[u8]) -> ContentHash {
    sha256(&[content])
}

/// A version and hash: what a metadata fetch returns and what merging compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stamp {
    /// A hybrid-clock timestamp ([`crate::proto::clock`]); higher is newer.
    pub version: u64,
    /// SHA-256 of the content.
    pub hash: ContentHash,
}

/// How much of an object a fetch asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchMode {
    /// Version and hash only.
    Metadata,
    /// Version, hash and content.
    Full,
    /// Version and hash, and the content only if it is at most [`CARRY_MAX_BYTES`]: a read that
    /// streams a larger object fetches its content afterwards, from one replica, as a stream.
    FullIfSmall,
}

/// The largest content a [`FetchMode::FullIfSmall`] answer carries.
pub const CARRY_MAX_BYTES: usize = 256 * 1024;
/// The answer tag of a [`FetchMode::FullIfSmall`] answer whose content was too large to carry.
const NOT_CARRIED: u8 = 3;
/// Bytes of a fetch answer before its content: the sender's clock, the tag and the stamp.
pub const FETCHED_HEAD_LEN: usize = CLOCK_LEN + 1 + STAMP_LEN;

/// Why a replica refused a request instead of answering it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The sender is not a member of the replica's cluster.
    NotMember,
    /// The sender's clock, or a version it carries, is further ahead than the accepted skew.
    ClockSkew,
    /// A version it carries is at the integer limit.
    VersionLimit,
}

impl Refusal {
    /// The reason's name in metrics, logs and HTTP errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::NotMember => "not_member",
            Self::ClockSkew => "clock_skew",
            Self::VersionLimit => "version_limit",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Self::NotMember => 1,
            Self::ClockSkew => 2,
            Self::VersionLimit => 3,
        }
    }

    fn from_code(code: u8) -> Result<Self, ObjectError> {
        match code {
            1 => Ok(Self::NotMember),
            2 => Ok(Self::ClockSkew),
            3 => Ok(Self::VersionLimit),
            other => Err(ObjectError::UnknownTag(other)),
        }
    }
}

/// A decoded answer: the replica's clock and what it said (an answer, or why it refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<T> {
    /// The replica's hybrid clock when it answered.
    pub clock: u64,
    /// Its answer, or its refusal.
    pub answer: Result<T, Refusal>,
}

pub(crate) const CLOCK_LEN: usize = 8;
pub(crate) const STAMP_LEN: usize = 8 + 32;

/// The largest header an object message puts before its content (a conditional-write prepare
/// with a key of [`MAX_KEY_LEN`] bytes: clock, phase, stamp, key length, key, precondition tag and
/// stamp): an object of `max_payload_bytes - MAX_MESSAGE_OVERHEAD` bytes still fits in one frame.
pub const MAX_MESSAGE_OVERHEAD: usize = CLOCK_LEN + 1 + STAMP_LEN + 2 + MAX_KEY_LEN + 1 + STAMP_LEN;

pub(crate) fn need(bytes: &[u8], needed: usize) -> Result<(), ObjectError> {
    if bytes.len() < needed {
        return Err(ObjectError::Truncated {
            needed,
            have: bytes.len(),
        });
    }
    Ok(())
}

pub(crate) fn read_u64(bytes: &[u8]) -> Result<u64, ObjectError> {
    need(bytes, 8)?;
    let mut value = [0u8; 8];
    value.copy_from_slice(&bytes[..8]);
    Ok(u64::from_le_bytes(value))
}

pub(crate) fn read_stamp(bytes: &[u8]) -> Result<Stamp, ObjectError> {
    need(bytes, STAMP_LEN)?;
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&bytes[8..STAMP_LEN]);
    Ok(Stamp {
        version: read_u64(bytes)?,
        hash,
    })
}

pub(crate) fn write_stamp(out: &mut Vec<u8>, stamp: &Stamp) {
    out.extend_from_slice(&stamp.version.to_le_bytes());
    out.extend_from_slice(&stamp.hash);
}

/// Splits a message into the sender's clock and the rest.
pub(crate) fn split_clock(bytes: &[u8]) -> Result<(u64, &[u8]), ObjectError> {
    Ok((read_u64(bytes)?, &bytes[CLOCK_LEN..]))
}

/// A decoded fetch request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchRequest<'a> {
    /// The sender's hybrid clock.
    pub clock: u64,
    /// How much it asks for.
    pub mode: FetchMode,
    /// The key.
    pub key: &'a str,
}

/// The length of a fetch request for `key`.
pub fn fetch_len(key: &str) -> usize {
    CLOCK_LEN + 1 + key.len()
}

/// Encodes a fetch request for `key`, sent at hybrid time `clock`.
pub fn encode_fetch(clock: u64, mode: FetchMode, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(fetch_len(key));
    out.extend_from_slice(&clock.to_le_bytes());
    out.push(match mode {
        FetchMode::Metadata => 0,
        FetchMode::Full => 1,
        FetchMode::FullIfSmall => 2,
    });
    out.extend_from_slice(key.as_bytes());
    out
}

/// Decodes a fetch request.
pub fn decode_fetch(bytes: &[u8]) -> Result<FetchRequest<'_>, ObjectError> {
    let (clock, rest) = split_clock(bytes)?;
    let (&mode, key) = rest.split_first().ok_or(ObjectError::Truncated {
        needed: CLOCK_LEN + 1,
        have: bytes.len(),
    })?;
    let mode = match mode {
        0 => FetchMode::Metadata,
        1 => FetchMode::Full,
        2 => FetchMode::FullIfSmall,
        other => return Err(ObjectError::UnknownTag(other)),
    };
    let key = std::str::from_utf8(key).map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
    validate_key(key)?;
    Ok(FetchRequest { clock, mode, key })
}

/// A fetch response: absent, or a stamp with the content (empty in metadata mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched<B> {
    /// The replica does not hold the key.
    Absent,
    /// The replica's copy.
    Present {
        /// Its version and hash.
        stamp: Stamp,
        /// The content, or nothing for a metadata fetch.
        content: Option<B>,
    },
}

/// The header of a fetch response sent at hybrid time `clock` that carries `stamp`; the content
/// (if any) follows it.
pub fn encode_fetched_header(clock: u64, stamp: Option<&Stamp>) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + 1 + STAMP_LEN);
    out.extend_from_slice(&clock.to_le_bytes());
    match stamp {
        None => out.push(0),
        Some(stamp) => {
            out.push(1);
            write_stamp(&mut out, stamp);
        }
    }
    out
}

/// The answer to a [`FetchMode::FullIfSmall`] fetch of an object larger than
/// [`CARRY_MAX_BYTES`], sent at hybrid time `clock`: its stamp, without the content.
pub fn encode_fetched_not_carried(clock: u64, stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(FETCHED_HEAD_LEN);
    out.extend_from_slice(&clock.to_le_bytes());
    out.push(NOT_CARRIED);
    write_stamp(&mut out, stamp);
    out
}

/// Decodes the first [`FETCHED_HEAD_LEN`] bytes of a full fetch's answer read as a stream: the
/// sender's clock and the stamp of a copy whose content follows. `None` when the answer is not
/// such a copy (absent, refused, or not a content answer): the reader then drops the stream.
pub fn decode_fetched_head(bytes: &[u8]) -> Result<Option<(u64, Stamp)>, ObjectError> {
    let (clock, body) = split_clock(bytes)?;
    match body.split_first() {
        Some((1, rest)) => Ok(Some((clock, read_stamp(rest)?))),
        Some(_) => Ok(None),
        None => Err(ObjectError::Truncated {
            needed: CLOCK_LEN + 1,
            have: bytes.len(),
        }),
    }
}

/// A response refusing a request (fetch or store) for `reason`, sent at hybrid time `clock`.
pub fn encode_refusal(clock: u64, reason: Refusal) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + 2);
    out.extend_from_slice(&clock.to_le_bytes());
    out.extend_from_slice(&[REFUSED, reason.code()]);
    out
}

/// The tag of a refusal, in both fetch and store responses.
pub(crate) const REFUSED: u8 = 2;

pub(crate) fn decode_refusal(rest: &[u8]) -> Result<Refusal, ObjectError> {
    match rest {
        [code] => Refusal::from_code(*code),
        [] => Err(ObjectError::Truncated { needed: 1, have: 0 }),
        [_, trailing @ ..] => Err(ObjectError::Trailing(trailing.len())),
    }
}

/// Decodes a fetch response made in `mode`, checking the content against its hash. A present
/// copy holds the range of `bytes` with the content, so the caller can slice its buffer without
/// copying.
pub fn decode_fetched(
    mode: FetchMode,
    bytes: &[u8],
    max_content: usize,
) -> Result<Answer<Fetched<std::ops::Range<usize>>>, ObjectError> {
    let (clock, body) = split_clock(bytes)?;
    let (&tag, rest) = body.split_first().ok_or(ObjectError::Truncated {
        needed: CLOCK_LEN + 1,
        have: bytes.len(),
    })?;
    let answer = match tag {
        0 if rest.is_empty() => Ok(Fetched::Absent),
        0 => return Err(ObjectError::Trailing(rest.len())),
        1 => {
            let stamp = read_stamp(rest)?;
            let content = &rest[STAMP_LEN..];
            match mode {
                FetchMode::Metadata if content.is_empty() => Ok(Fetched::Present {
                    stamp,
                    content: None,
                }),
                FetchMode::Metadata => return Err(ObjectError::Trailing(content.len())),
                FetchMode::Full | FetchMode::FullIfSmall => {
                    let max_content = match mode {
                        FetchMode::FullIfSmall => max_content.min(CARRY_MAX_BYTES),
                        _ => max_content,
                    };
                    if content.len() > max_content {
                        return Err(ObjectError::TooLarge {
                            len: content.len(),
                            max: max_content,
                        });
                    }
                    if content_hash(content) != stamp.hash {
                        return Err(ObjectError::HashMismatch);
                    }
                    let start = CLOCK_LEN + 1 + STAMP_LEN;
                    Ok(Fetched::Present {
                        stamp,
                        content: Some(start..bytes.len()),
                    })
                }
            }
        }
        NOT_CARRIED if mode == FetchMode::FullIfSmall => {
            let stamp = read_stamp(rest)?;
            if rest.len() > STAMP_LEN {
                return Err(ObjectError::Trailing(rest.len() - STAMP_LEN));
            }
            Ok(Fetched::Present {
                stamp,
                content: None,
            })
        }
        REFUSED => Err(decode_refusal(rest)?),
        other => return Err(ObjectError::UnknownTag(other)),
    };
    Ok(Answer { clock, answer })
}

/// A decoded store request; `content` is the range of the message holding the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    /// The sender's hybrid clock.
    pub clock: u64,
    /// The key.
    pub key: &'a str,
    /// Version and hash.
    pub stamp: Stamp,
    /// Where the content sits in the message.
    pub content: std::ops::Range<usize>,
}

/// The header of a store request sent at hybrid time `clock`; the content follows it.
pub fn encode_store_header(clock: u64, key: &str, stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + STAMP_LEN + 2 + key.len());
    out.extend_from_slice(&clock.to_le_bytes());
    write_stamp(&mut out, stamp);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

/// Bytes of a store request before its key: the sender's clock, the stamp and the key's length.
pub const STORE_FIXED_LEN: usize = CLOCK_LEN + STAMP_LEN + 2;

/// Decodes the first [`STORE_FIXED_LEN`] bytes of a store request: the sender's clock, the stamp
/// and the length of the key that follows them (checked against [`MAX_KEY_LEN`]). A receiver
/// that reads the request piece by piece reads these, then the key, then the content.
pub fn decode_store_fixed(bytes: &[u8]) -> Result<(u64, Stamp, usize), ObjectError> {
    let (clock, body) = split_clock(bytes)?;
    let stamp = read_stamp(body)?;
    need(bytes, STORE_FIXED_LEN)?;
    let len_at = CLOCK_LEN + STAMP_LEN;
    let key_len = u16::from_le_bytes([bytes[len_at], bytes[len_at + 1]]) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(ObjectError::InvalidKey("longer than 256 bytes"));
    }
    Ok((clock, stamp, key_len))
}

/// Decodes a store request's key (the `key_len` bytes after its fixed part).
pub fn decode_store_key(bytes: &[u8]) -> Result<&str, ObjectError> {
    let key = std::str::from_utf8(bytes).map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
    validate_key(key)?;
    Ok(key)
}

/// Decodes a store request, checking the key and the content against its hash.
pub fn decode_store(bytes: &[u8], max_content: usize) -> Result<StoreRequest<'_>, ObjectError> {
    let (clock, stamp, key_len) = decode_store_fixed(bytes)?;
    let key_start = STORE_FIXED_LEN;
    need(bytes, key_start + key_len)?;
    let key = decode_store_key(&bytes[key_start..key_start + key_len])?;
    let content = key_start + key_len..bytes.len();
    if content.len() > max_content {
        return Err(ObjectError::TooLarge {
            len: content.len(),
            max: max_content,
        });
    }
    if content_hash(&bytes[content.clone()]) != stamp.hash {
        return Err(ObjectError::HashMismatch);
    }
    Ok(StoreRequest {
        clock,
        key,
        stamp,
        content,
    })
}

/// What a replica holds after a store request it did not refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Exactly the version and hash sent: an ack.
    Holds,
    /// Another copy that wins over the one sent (a newer version, or the same version with a
    /// smaller hash): not an ack.
    Superseded(Stamp),
}

/// Encodes a store response sent at hybrid time `clock`.
pub fn encode_stored(clock: u64, stored: Stored) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + 1 + STAMP_LEN);
    out.extend_from_slice(&clock.to_le_bytes());
    match stored {
        Stored::Holds => out.push(0),
        Stored::Superseded(stamp) => {
            out.push(1);
            write_stamp(&mut out, &stamp);
        }
    }
    out
}

/// Decodes a store response.
pub fn decode_stored(bytes: &[u8]) -> Result<Answer<Stored>, ObjectError> {
    let (clock, body) = split_clock(bytes)?;
    let (&tag, rest) = body.split_first().ok_or(ObjectError::Truncated {
        needed: CLOCK_LEN + 1,
        have: bytes.len(),
    })?;
    let answer = match tag {
        0 if rest.is_empty() => Ok(Stored::Holds),
        0 => return Err(ObjectError::Trailing(rest.len())),
        1 => {
            let stamp = read_stamp(rest)?;
            if rest.len() > STAMP_LEN {
                return Err(ObjectError::Trailing(rest.len() - STAMP_LEN));
            }
            Ok(Stored::Superseded(stamp))
        }
        REFUSED => Err(decode_refusal(rest)?),
        other => return Err(ObjectError::UnknownTag(other)),
    };
    Ok(Answer { clock, answer })
}

/// The weight of `peer` (its 32 id bytes) for `key` in rendezvous hashing.
pub fn rendezvous_weight(key: &str, peer: &[u8; 32]) -> u64 {
    let digest = sha256(&[key.as_bytes(), peer]);
    let mut weight = [0u8; 8];
    weight.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(weight)
}

/// The `replicas` peers (by 32-byte id) that hold `key`, heaviest first.
pub fn replicas_for(key: &str, peers: &[[u8; 32]], replicas: usize) -> Vec<[u8; 32]> {
    let mut weighted: Vec<(u64, [u8; 32])> = peers
        .iter()
        .map(|peer| (rendezvous_weight(key, peer), *peer))
        .collect();
    weighted.sort_unstable_by(|a, b| b.cmp(a));
    weighted.dedup_by_key(|(_, peer)| *peer);
    weighted
        .into_iter()
        .take(replicas)
        .map(|(_, peer)| peer)
        .collect()
}

/// One replica's answer to a read, for merging: its stamp (or absence) and how much it is trusted
/// (`0.0..=1.0`, for example one minus its error rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vote {
    /// The copy it holds, if any.
    pub stamp: Option<Stamp>,
    /// Its trust.
    pub trust: f64,
}

/// The winning copy among `votes`: highest version, then highest summed trust, then most holders,
/// then smallest hash. `None` when no vote holds a copy.
pub fn merge(votes: &[Vote]) -> Option<Stamp> {
    let mut tallies: Vec<(Stamp, f64, usize)> = Vec::new();
    for vote in votes {
        let Some(stamp) = vote.stamp else { continue };
        let trust = if vote.trust.is_finite() {
            vote.trust.clamp(0.0, 1.0)
        } else {
            0.0
        };
        match tallies.iter_mut().find(|(s, _, _)| *s == stamp) {
            Some(tally) => {
                tally.1 += trust;
                tally.2 += 1;
            }
            None => tallies.push((stamp, trust, 1)),
        }
    }
    tallies
        .into_iter()
        .max_by(|a, b| {
            a.0.version
                .cmp(&b.0.version)
                .then(a.1.total_cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(b.0.hash.cmp(&a.0.hash))
        })
        .map(|(stamp, _, _)| stamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stamp(version: u64, content: &[u8]) -> Stamp {
        Stamp {
            version,
            hash: content_hash(content),
        }
    }

    #[test]
    fn keys_are_checked() {
        assert!(validate_key("wallet-0000.json_v2").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "ü", &"k".repeat(257)] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn fetch_and_store_round_trip() {
        let content = b"hello wallet";
        let s = stamp(7, content);
        let request = encode_fetch(40, FetchMode::Full, "k1");
        assert_eq!(
            decode_fetch(&request),
            Ok(FetchRequest {
                clock: 40,
                mode: FetchMode::Full,
                key: "k1"
            })
        );
        let mut response = encode_fetched_header(41, Some(&s));
        response.extend_from_slice(content);
        let Answer {
            clock: 41,
            answer:
                Ok(Fetched::Present {
                    stamp: got,
                    content: Some(range),
                }),
        } = decode_fetched(FetchMode::Full, &response, 1024).unwrap()
        else {
            panic!("expected a full copy");
        };
        assert_eq!(got, s);
        assert_eq!(&response[range], content);
        assert_eq!(
            decode_fetched(FetchMode::Full, &encode_fetched_header(3, None), 10),
            Ok(Answer {
                clock: 3,
                answer: Ok(Fetched::Absent)
            })
        );
        let mut store = encode_store_header(42, "k1", &s);
        store.extend_from_slice(content);
        let decoded = decode_store(&store, 1024).unwrap();
        assert_eq!((decoded.clock, decoded.key, decoded.stamp), (42, "k1", s));
        assert_eq!(&store[decoded.content], content);
        for stored in [Stored::Holds, Stored::Superseded(stamp(9, b"newer"))] {
            assert_eq!(
                decode_stored(&encode_stored(43, stored)),
                Ok(Answer {
                    clock: 43,
                    answer: Ok(stored)
                })
            );
        }
    }

    #[test]
    fn refusals_are_answers_in_both_responses() {
        for reason in [
            Refusal::NotMember,
            Refusal::ClockSkew,
            Refusal::VersionLimit,
        ] {
            let message = encode_refusal(5, reason);
            assert_eq!(
                decode_stored(&message),
                Ok(Answer {
                    clock: 5,
                    answer: Err(reason)
                })
            );
            assert_eq!(
                decode_fetched(FetchMode::Metadata, &message, 10),
                Ok(Answer {
                    clock: 5,
                    answer: Err(reason)
                })
            );
        }
        let mut unknown = encode_refusal(5, Refusal::NotMember);
        unknown[9] = 200;
        assert_eq!(decode_stored(&unknown), Err(ObjectError::UnknownTag(200)));
        unknown.push(0);
        assert_eq!(decode_stored(&unknown), Err(ObjectError::Trailing(1)));
    }

    #[test]
    fn damaged_copies_are_refused() {
        let s = stamp(1, b"good");
        let mut response = encode_fetched_header(0, Some(&s));
        response.extend_from_slice(b"evil");
        assert_eq!(
            decode_fetched(FetchMode::Full, &response, 1024),
            Err(ObjectError::HashMismatch)
        );
        let mut store = encode_store_header(0, "k", &s);
        store.extend_from_slice(b"good");
        assert!(matches!(
            decode_store(&store, 2),
            Err(ObjectError::TooLarge { len: 4, max: 2 })
        ));
        let mut fetch = encode_fetch(0, FetchMode::Full, "k");
        fetch[8] = 9;
        assert_eq!(decode_fetch(&fetch), Err(ObjectError::UnknownTag(9)));
    }

    #[test]
    fn merge_prefers_version_then_trust() {
        let old = stamp(1, b"old");
        let a = stamp(2, b"a");
        let b = stamp(2, b"b");
        let votes = [
            Vote {
                stamp: Some(old),
                trust: 1.0,
            },
            Vote {
                stamp: Some(old),
                trust: 1.0,
            },
            Vote {
                stamp: Some(a),
                trust: 0.2,
            },
            Vote {
                stamp: Some(b),
                trust: 0.9,
            },
            Vote {
                stamp: None,
                trust: 1.0,
            },
        ];
        assert_eq!(merge(&votes), Some(b));
        assert_eq!(
            merge(&[Vote {
                stamp: None,
                trust: 1.0
            }]),
            None
        );
    }

    #[test]
    fn rendezvous_is_stable_and_minimal() {
        let peers: Vec<[u8; 32]> = (0..10u8).map(|i| [i; 32]).collect();
        let before: Vec<_> = (0..200)
            .map(|k| replicas_for(&format!("k{k}"), &peers, 3))
            .collect();
        let fewer = &peers[..9];
        for (k, old) in before.iter().enumerate() {
            assert_eq!(old.len(), 3);
            let new = replicas_for(&format!("k{k}"), fewer, 3);
            if !old.contains(&peers[9]) {
                assert_eq!(&new, old, "a key peer 9 did not hold moved");
            }
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode_fetch(&bytes);
            let _ = decode_fetched(FetchMode::Full, &bytes, 256);
            let _ = decode_fetched(FetchMode::Metadata, &bytes, 256);
            let _ = decode_store(&bytes, 256);
            let _ = decode_stored(&bytes);
        }

        #[test]
        fn store_requests_round_trip(key in "[A-Za-z0-9._-]{1,40}", version in any::<u64>(),
                                     clock in any::<u64>(),
                                     content in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assume!(key != "." && key != "..");
            let s = stamp(version, &content);
            let mut message = encode_store_header(clock, &key, &s);
            message.extend_from_slice(&content);
            let decoded = decode_store(&message, 300).unwrap();
            prop_assert_eq!(decoded.clock, clock);
            prop_assert_eq!(decoded.key, key.as_str());
            prop_assert_eq!(decoded.stamp, s);
            prop_assert_eq!(&message[decoded.content], content.as_slice());
            // Any single flipped content byte is caught.
            if !content.is_empty() {
                let last = message.len() - 1;
                message[last] ^= 1;
                prop_assert_eq!(decode_store(&message, 300), Err(ObjectError::HashMismatch));
            }
        }

        #[test]
        fn merge_never_loses_the_newest_version(votes in proptest::collection::vec(
            (proptest::option::of((0u64..5, 0u8..3)), 0.0f64..1.0), 0..10)) {
            let votes: Vec<Vote> = votes.into_iter().map(|(copy, trust)| Vote {
                stamp: copy.map(|(version, content)| stamp(version, &[content])),
                trust,
            }).collect();
            let newest = votes.iter().filter_map(|v| v.stamp.map(|s| s.version)).max();
            prop_assert_eq!(merge(&votes).map(|s| s.version), newest);
        }
    }
}
