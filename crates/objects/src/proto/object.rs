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
//! Messages between nodes (all integers little-endian, all lengths checked before any allocation):
//!
//! ```text
//! fetch request   [mode u8: 0 = metadata, 1 = full][key]
//! fetch response  [0]                                    the key is absent
//!                 [1][version u64][hash 32][content]     content empty in metadata mode
//! store request   [version u64][hash 32][key_len u16][key][content]
//! store response  [version u64]                          the version the replica now holds
//! ```
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
    /// Higher is newer.
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
}

/// Encodes a fetch request for `key`.
pub fn encode_fetch(mode: FetchMode, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(match mode {
        FetchMode::Metadata => 0,
        FetchMode::Full => 1,
    });
    out.extend_from_slice(key.as_bytes());
    out
}

/// Decodes a fetch request.
pub fn decode_fetch(bytes: &[u8]) -> Result<(FetchMode, &str), ObjectError> {
    let (&mode, key) = bytes
        .split_first()
        .ok_or(ObjectError::Truncated { needed: 1, have: 0 })?;
    let mode = match mode {
        0 => FetchMode::Metadata,
        1 => FetchMode::Full,
        other => return Err(ObjectError::UnknownTag(other)),
    };
    let key = std::str::from_utf8(key).map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
    validate_key(key)?;
    Ok((mode, key))
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

const STAMP_LEN: usize = 8 + 32;

/// The largest header an object message puts before its content (a store request with a key of
/// [`MAX_KEY_LEN`] bytes): an object of `max_payload_bytes - MAX_MESSAGE_OVERHEAD` bytes still fits
/// in one frame.
pub const MAX_MESSAGE_OVERHEAD: usize = STAMP_LEN + 2 + MAX_KEY_LEN;

fn need(bytes: &[u8], needed: usize) -> Result<(), ObjectError> {
    if bytes.len() < needed {
        return Err(ObjectError::Truncated {
            needed,
            have: bytes.len(),
        });
    }
    Ok(())
}

fn read_stamp(bytes: &[u8]) -> Result<Stamp, ObjectError> {
    need(bytes, STAMP_LEN)?;
    let mut version = [0u8; 8];
    version.copy_from_slice(&bytes[..8]);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&bytes[8..STAMP_LEN]);
    Ok(Stamp {
        version: u64::from_le_bytes(version),
        hash,
    })
}

fn write_stamp(out: &mut Vec<u8>, stamp: &Stamp) {
    out.extend_from_slice(&stamp.version.to_le_bytes());
    out.extend_from_slice(&stamp.hash);
}

/// The header of a fetch response that carries `stamp`; the content (if any) follows it.
pub fn encode_fetched_header(stamp: Option<&Stamp>) -> Vec<u8> {
    match stamp {
        None => vec![0],
        Some(stamp) => {
            let mut out = Vec::with_capacity(1 + STAMP_LEN);
            out.push(1);
            write_stamp(&mut out, stamp);
            out
        }
    }
}

/// Decodes a fetch response made in `mode`, checking the content against its hash. Returns the
/// range of `bytes` holding the content, so the caller can slice its buffer without copying.
pub fn decode_fetched(
    mode: FetchMode,
    bytes: &[u8],
    max_content: usize,
) -> Result<Fetched<std::ops::Range<usize>>, ObjectError> {
    let (&tag, rest) = bytes
        .split_first()
        .ok_or(ObjectError::Truncated { needed: 1, have: 0 })?;
    match tag {
        0 if rest.is_empty() => Ok(Fetched::Absent),
        0 => Err(ObjectError::Trailing(rest.len())),
        1 => {
            let stamp = read_stamp(rest)?;
            let content = &rest[STAMP_LEN..];
            match mode {
                FetchMode::Metadata if content.is_empty() => Ok(Fetched::Present {
                    stamp,
                    content: None,
                }),
                FetchMode::Metadata => Err(ObjectError::Trailing(content.len())),
                FetchMode::Full => {
                    if content.len() > max_content {
                        return Err(ObjectError::TooLarge {
                            len: content.len(),
                            max: max_content,
                        });
                    }
                    if content_hash(content) != stamp.hash {
                        return Err(ObjectError::HashMismatch);
                    }
                    let start = 1 + STAMP_LEN;
                    Ok(Fetched::Present {
                        stamp,
                        content: Some(start..bytes.len()),
                    })
                }
            }
        }
        other => Err(ObjectError::UnknownTag(other)),
    }
}

/// A decoded store request; `content` is the range of the message holding the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    /// The key.
    pub key: &'a str,
    /// Version and hash.
    pub stamp: Stamp,
    /// Where the content sits in the message.
    pub content: std::ops::Range<usize>,
}

/// The header of a store request; the content follows it.
pub fn encode_store_header(key: &str, stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(STAMP_LEN + 2 + key.len());
    write_stamp(&mut out, stamp);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

/// Decodes a store request, checking the key and the content against its hash.
pub fn decode_store(bytes: &[u8], max_content: usize) -> Result<StoreRequest<'_>, ObjectError> {
    let stamp = read_stamp(bytes)?;
    need(bytes, STAMP_LEN + 2)?;
    let key_len = u16::from_le_bytes([bytes[STAMP_LEN], bytes[STAMP_LEN + 1]]) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(ObjectError::InvalidKey("longer than 256 bytes"));
    }
    let key_start = STAMP_LEN + 2;
    need(bytes, key_start + key_len)?;
    let key = std::str::from_utf8(&bytes[key_start..key_start + key_len])
        .map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
    validate_key(key)?;
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
        key,
        stamp,
        content,
    })
}

/// Encodes a store response.
pub fn encode_stored(version: u64) -> [u8; 8] {
    version.to_le_bytes()
}

/// Decodes a store response.
pub fn decode_stored(bytes: &[u8]) -> Result<u64, ObjectError> {
    need(bytes, 8)?;
    if bytes.len() > 8 {
        return Err(ObjectError::Trailing(bytes.len() - 8));
    }
    let mut version = [0u8; 8];
    version.copy_from_slice(bytes);
    Ok(u64::from_le_bytes(version))
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
        let request = encode_fetch(FetchMode::Full, "k1");
        assert_eq!(decode_fetch(&request), Ok((FetchMode::Full, "k1")));
        let mut response = encode_fetched_header(Some(&s));
        response.extend_from_slice(content);
        let Fetched::Present {
            stamp: got,
            content: Some(range),
        } = decode_fetched(FetchMode::Full, &response, 1024).unwrap()
        else {
            panic!("expected a full copy");
        };
        assert_eq!(got, s);
        assert_eq!(&response[range], content);
        assert_eq!(
            decode_fetched(FetchMode::Full, &encode_fetched_header(None), 10),
            Ok(Fetched::Absent)
        );
        let mut store = encode_store_header("k1", &s);
        store.extend_from_slice(content);
        let decoded = decode_store(&store, 1024).unwrap();
        assert_eq!((decoded.key, decoded.stamp), ("k1", s));
        assert_eq!(&store[decoded.content], content);
        assert_eq!(decode_stored(&encode_stored(9)), Ok(9));
    }

    #[test]
    fn damaged_copies_are_refused() {
        let s = stamp(1, b"good");
        let mut response = encode_fetched_header(Some(&s));
        response.extend_from_slice(b"evil");
        assert_eq!(
            decode_fetched(FetchMode::Full, &response, 1024),
            Err(ObjectError::HashMismatch)
        );
        let mut store = encode_store_header("k", &s);
        store.extend_from_slice(b"good");
        assert!(matches!(
            decode_store(&store, 2),
            Err(ObjectError::TooLarge { len: 4, max: 2 })
        ));
        assert_eq!(decode_fetch(&[9, b'k']), Err(ObjectError::UnknownTag(9)));
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
                                     content in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assume!(key != "." && key != "..");
            let s = stamp(version, &content);
            let mut message = encode_store_header(&key, &s);
            message.extend_from_slice(&content);
            let decoded = decode_store(&message, 300).unwrap();
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
