//! Ask one replica for the versions and hashes of several keys in one request (`OBJECT_STAMPS`).
//!
//! # Design
//!
//! A quorum read asks most replicas for version and hash only ([`FetchMode::Metadata`]). Under
//! load, one node has many reads in flight to the same replica at once, and each was its own
//! request: a stream opened, framed, handed to a task and answered on the replica, for about 40
//! bytes of answer. The object service gathers the version requests that reads start to one
//! replica while the runtime is busy, and sends them as one request when it is not
//! (`net/service/stamps.rs`); a request asks for at most [`MAX_STAMP_KEYS`] keys. A lone version
//! request is still sent as a plain metadata fetch ([`crate::proto::object`]).
//!
//! ```text
//! stamps request  [clock u64] then per key [key_len u16][key]          1..=MAX_STAMP_KEYS keys
//! stamps answer   [clock u64] then per key, in the request's order:
//!                     [0]                        the key is absent
//!                     [1][version u64][hash 32]  the replica's copy
//!                 [clock u64][2][reason u8]      the whole request refused
//! ```
//!
//! Every length is checked before it is used, a request's keys are validated like any key, and a
//! request with more than [`MAX_STAMP_KEYS`] keys is refused before anything is looked up, so one
//! request costs a replica a bounded amount of work. An answer must carry exactly one entry per
//! key asked.
//!
//! [`FetchMode::Metadata`]: crate::proto::object::FetchMode::Metadata

use crate::proto::object::{
    decode_refusal, read_stamp, split_clock, validate_key, write_stamp, Answer, ObjectError,
    Refusal, Stamp, CLOCK_LEN, REFUSED, STAMP_LEN,
};

/// The most keys one stamps request may name.
pub const MAX_STAMP_KEYS: usize = 64;

const ABSENT: u8 = 0;
const PRESENT: u8 = 1;

/// A decoded stamps request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampsRequest<'a> {
    /// The sender's hybrid clock.
    pub clock: u64,
    /// The keys, in the order their answers go.
    pub keys: Vec<&'a str>,
}

/// Encodes a request for the stamps of `keys` (1..=[`MAX_STAMP_KEYS`] valid keys), sent at
/// hybrid time `clock`.
pub fn encode_stamps_request<S: AsRef<str>>(clock: u64, keys: &[S]) -> Vec<u8> {
    let len = CLOCK_LEN + keys.iter().map(|k| 2 + k.as_ref().len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&clock.to_le_bytes());
    for key in keys {
        let key = key.as_ref().as_bytes();
        // Valid keys are at most MAX_KEY_LEN (256) bytes, so the length fits.
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
    }
    out
}

/// Decodes a stamps request: at least one key, at most [`MAX_STAMP_KEYS`], each valid.
pub fn decode_stamps_request(bytes: &[u8]) -> Result<StampsRequest<'_>, ObjectError> {
    let (clock, mut rest) = split_clock(bytes)?;
    let mut keys = Vec::new();
    while !rest.is_empty() {
        if keys.len() == MAX_STAMP_KEYS {
            return Err(ObjectError::TooManyKeys(MAX_STAMP_KEYS));
        }
        let [a, b, tail @ ..] = rest else {
            return Err(ObjectError::Truncated {
                needed: 2,
                have: rest.len(),
            });
        };
        let len = usize::from(u16::from_le_bytes([*a, *b]));
        if tail.len() < len {
            return Err(ObjectError::Truncated {
                needed: len,
                have: tail.len(),
            });
        }
        let (key, tail) = tail.split_at(len);
        let key = std::str::from_utf8(key).map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
        validate_key(key)?;
        keys.push(key);
        rest = tail;
    }
    if keys.is_empty() {
        return Err(ObjectError::Truncated {
            needed: CLOCK_LEN + 3,
            have: bytes.len(),
        });
    }
    Ok(StampsRequest { clock, keys })
}

/// Encodes the answer to a stamps request, sent at hybrid time `clock`: each key's stamp, or
/// `None` where the replica does not hold the key, in the request's order.
pub fn encode_stamps_answer(clock: u64, stamps: &[Option<Stamp>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + stamps.len() * (1 + STAMP_LEN));
    out.extend_from_slice(&clock.to_le_bytes());
    for stamp in stamps {
        match stamp {
            None => out.push(ABSENT),
            Some(stamp) => {
                out.push(PRESENT);
                write_stamp(&mut out, stamp);
            }
        }
    }
    out
}

/// Decodes the answer to a stamps request that asked for `keys` keys: exactly one entry per key,
/// or the request's refusal.
pub fn decode_stamps_answer(
    bytes: &[u8],
    keys: usize,
) -> Result<Answer<Vec<Option<Stamp>>>, ObjectError> {
    let (clock, mut rest) = split_clock(bytes)?;
    if let Some((&REFUSED, reason)) = rest.split_first() {
        let reason: Refusal = decode_refusal(reason)?;
        return Ok(Answer {
            clock,
            answer: Err(reason),
        });
    }
    let mut stamps = Vec::with_capacity(keys.min(MAX_STAMP_KEYS));
    for _ in 0..keys {
        let (&tag, tail) = rest
            .split_first()
            .ok_or(ObjectError::Truncated { needed: 1, have: 0 })?;
        match tag {
            ABSENT => {
                stamps.push(None);
                rest = tail;
            }
            PRESENT => {
                stamps.push(Some(read_stamp(tail)?));
                rest = &tail[STAMP_LEN..];
            }
            other => return Err(ObjectError::UnknownTag(other)),
        }
    }
    if !rest.is_empty() {
        return Err(ObjectError::Trailing(rest.len()));
    }
    Ok(Answer {
        clock,
        answer: Ok(stamps),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::object::{content_hash, encode_refusal};
    use proptest::prelude::*;

    fn stamp(version: u64) -> Stamp {
        Stamp {
            version,
            hash: content_hash(&version.to_le_bytes()),
        }
    }

    #[test]
    fn a_request_round_trips() {
        let bytes = encode_stamps_request(7, &["a", "wallet-1", "b.c"]);
        let request = decode_stamps_request(&bytes).unwrap();
        assert_eq!(request.clock, 7);
        assert_eq!(request.keys, ["a", "wallet-1", "b.c"]);
    }

    #[test]
    fn an_answer_round_trips_in_order() {
        let stamps = [Some(stamp(3)), None, Some(stamp(9))];
        let bytes = encode_stamps_answer(11, &stamps);
        let answer = decode_stamps_answer(&bytes, 3).unwrap();
        assert_eq!(answer.clock, 11);
        assert_eq!(answer.answer.unwrap(), stamps);
    }

    #[test]
    fn a_refusal_is_the_whole_answer() {
        let bytes = encode_refusal(5, Refusal::NotMember);
        let answer = decode_stamps_answer(&bytes, 4).unwrap();
        assert_eq!(answer.answer, Err(Refusal::NotMember));
    }

    #[test]
    fn too_many_keys_are_refused() {
        let keys: Vec<String> = (0..=MAX_STAMP_KEYS).map(|i| format!("k{i}")).collect();
        let bytes = encode_stamps_request(1, &keys);
        assert_eq!(
            decode_stamps_request(&bytes),
            Err(ObjectError::TooManyKeys(MAX_STAMP_KEYS))
        );
        assert!(decode_stamps_request(&encode_stamps_request(1, &keys[..MAX_STAMP_KEYS])).is_ok());
    }

    #[test]
    fn bad_requests_are_refused() {
        // No keys.
        assert!(decode_stamps_request(&1u64.to_le_bytes()).is_err());
        // A length past the end.
        let mut bytes = encode_stamps_request(1, &["key"]);
        bytes[CLOCK_LEN] = 200;
        assert!(matches!(
            decode_stamps_request(&bytes),
            Err(ObjectError::Truncated { .. })
        ));
        // An invalid key.
        let bytes = encode_stamps_request(1, &["a/b"]);
        assert!(matches!(
            decode_stamps_request(&bytes),
            Err(ObjectError::InvalidKey(_))
        ));
        // A lone length byte.
        let mut bytes = encode_stamps_request(1, &["key"]);
        bytes.push(3);
        assert!(decode_stamps_request(&bytes).is_err());
    }

    #[test]
    fn an_answer_with_the_wrong_count_is_refused() {
        let bytes = encode_stamps_answer(1, &[Some(stamp(1)), None]);
        assert!(matches!(
            decode_stamps_answer(&bytes, 3),
            Err(ObjectError::Truncated { .. })
        ));
        assert_eq!(
            decode_stamps_answer(&bytes, 1),
            Err(ObjectError::Trailing(1))
        );
        let mut cut = encode_stamps_answer(1, &[Some(stamp(1))]);
        cut.pop();
        assert!(decode_stamps_answer(&cut, 1).is_err());
    }

    proptest! {
        /// Whatever a peer sends, the decoders return an error or a message that re-encodes to
        /// exactly the bytes sent, never more keys or entries than the limit.
        #[test]
        fn decoders_never_panic_and_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..600), keys in 0usize..80) {
            if let Ok(request) = decode_stamps_request(&bytes) {
                prop_assert!(request.keys.len() <= MAX_STAMP_KEYS);
                prop_assert_eq!(encode_stamps_request(request.clock, &request.keys), bytes.clone());
            }
            if let Ok(answer) = decode_stamps_answer(&bytes, keys) {
                let again = match answer.answer {
                    Ok(stamps) => {
                        prop_assert_eq!(stamps.len(), keys);
                        encode_stamps_answer(answer.clock, &stamps)
                    }
                    Err(reason) => encode_refusal(answer.clock, reason),
                };
                prop_assert_eq!(again, bytes);
            }
        }
    }
}
