//! Encode the messages of a conditional write (compare-and-set): prepare, commit, abort.
//!
//! # Design
//!
//! `PUT` with `If-Match` or `If-None-Match: *` must succeed only if the current copy matches, and
//! a write that fails must never become visible. A replica cannot know whether the other
//! replicas accepted the same write, so a conditional write has two phases:
//!
//! 1. **Prepare** (to every replica): the replica checks the precondition against its store and
//!    that no other conditional write is pending on the key, then holds the copy as *pending*
//!    (in memory, or a large copy in a content file of its own, written as it arrives; until
//!    commit, abort, or twice the write deadline). A replica reading a large prepare piece by
//!    piece answers busy or a failed precondition from its head, before it reads the content,
//!    and checks both again once the content is in. Two conditional writes on
//!    the same key cannot both be pending on one replica, so with `W > R / 2` at most one of
//!    several concurrent writes prepares on W replicas.
//! 2. **Commit** (only after W prepares, to every replica): a replica applies its pending copy if
//!    the precondition still holds, atomically in one store transaction; a replica that already
//!    holds exactly this write (read repair brought it from a replica that committed first)
//!    acknowledges it too. `201` at W commits.
//!    Fewer than W prepares: **abort** to every replica, and nothing was written (`412` when a
//!    replica reported a mismatch, `409` when only other pending writes were in the way).
//! 3. **Late prepares.** The phases travel on separate streams, so a commit or abort can reach a
//!    replica before its prepare. A replica remembers such a decision (for twice the deadline, at
//!    most 4,096 of them) and, when the prepare arrives, applies a committed write at once (its
//!    precondition checked in the store's transaction) or drops an aborted one: a late prepare
//!    is never held, so it never blocks the key for the conditional writes that follow.
//!
//! Messages (little-endian; every message starts with the sender's hybrid clock, like the other
//! object messages in [`crate::proto::object`]):
//!
//! ```text
//! request   [clock u64][phase u8: 0 prepare, 1 commit, 2 abort][version u64][hash 32][key_len u16][key]
//!           prepare only, then: [precondition u8: 0 absent, 1 matches][version u64][hash 32 — when 1][content]
//! response  [clock u64][0]                          done
//!           [clock u64][1][0]                       precondition failed: the key is absent
//!           [clock u64][1][1][version u64][hash 32] precondition failed: this copy is current
//!           [clock u64][2][reason u8]               refused (the reasons of `proto::object::Refusal`)
//!           [clock u64][3]                          busy: another conditional write is pending on the key
//! ```

use super::object::{
    content_hash, decode_refusal, need, read_stamp, read_u64, validate_key, write_stamp,
    ObjectError, Refusal, Stamp, CLOCK_LEN, MAX_KEY_LEN, REFUSED, STAMP_LEN,
};

/// What a conditional write requires of the current copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precondition {
    /// No copy (`If-None-Match: *`).
    Absent,
    /// Exactly this version and hash (`If-Match: "<etag>"`).
    Matches(Stamp),
}

impl Precondition {
    /// Whether `current` satisfies it.
    pub fn holds(&self, current: Option<&Stamp>) -> bool {
        match self {
            Self::Absent => current.is_none(),
            Self::Matches(stamp) => current == Some(stamp),
        }
    }
}

/// The entity tag of a copy, quotes included: `"<version>-<hash hex>"`.
pub fn etag(stamp: &Stamp) -> String {
    use std::fmt::Write;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // One allocation: every GET answers with one (it was 34, one per hash byte).
    let mut tag = String::with_capacity(2 + 20 + 1 + 2 * stamp.hash.len());
    let _ = write!(tag, "\"{}-", stamp.version);
    for byte in stamp.hash {
        tag.push(char::from(HEX[usize::from(byte >> 4)]));
        tag.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    tag.push('"');
    tag
}

/// Why an `If-Match` or `If-None-Match` header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PreconditionError {
    /// `If-Match` is not one strong entity tag of this API.
    #[error("If-Match takes one entity tag as returned in ETag (\"<version>-<64 hex digits>\")")]
    NotAnEtag,
    /// `If-None-Match` is anything but `*`.
    #[error("If-None-Match takes only *")]
    NotAStar,
    /// Both headers are present.
    #[error("If-Match and If-None-Match exclude each other")]
    Both,
}

/// The precondition of `If-Match` and `If-None-Match` header values (`None`: unconditional).
pub fn parse_precondition(
    if_match: Option<&[u8]>,
    if_none_match: Option<&[u8]>,
) -> Result<Option<Precondition>, PreconditionError> {
    match (if_match, if_none_match) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(PreconditionError::Both),
        (None, Some(value)) if value.trim_ascii() == b"*" => Ok(Some(Precondition::Absent)),
        (None, Some(_)) => Err(PreconditionError::NotAStar),
        (Some(value), None) => parse_etag(value.trim_ascii())
            .map(|stamp| Some(Precondition::Matches(stamp)))
            .ok_or(PreconditionError::NotAnEtag),
    }
}

fn parse_etag(value: &[u8]) -> Option<Stamp> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let text = std::str::from_utf8(inner).ok()?;
    let (version, hex) = text.split_once('-')?;
    if version.is_empty()
        || !version.bytes().all(|b| b.is_ascii_digit())
        || hex.len() != 64
        || !hex.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let mut hash = [0u8; 32];
    for (index, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * index..2 * index + 2)?, 16).ok()?;
    }
    Some(Stamp {
        version: version.parse().ok()?,
        hash,
    })
}

/// The phase a conditional-write request is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Check and hold the copy (content included).
    Prepare(Precondition),
    /// Apply the held copy.
    Commit,
    /// Drop the held copy.
    Abort,
}

/// A decoded conditional-write request; `content` is the range of the message holding the
/// content (empty unless preparing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasRequest<'a> {
    /// The sender's hybrid clock.
    pub clock: u64,
    /// The phase.
    pub phase: Phase,
    /// The key.
    pub key: &'a str,
    /// The version and hash being written.
    pub stamp: Stamp,
    /// Where the content sits in the message.
    pub content: std::ops::Range<usize>,
}

/// The header of a conditional-write request; a prepare's content follows it.
pub fn encode_cas_header(clock: u64, phase: Phase, key: &str, stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + 1 + STAMP_LEN + 2 + key.len() + 1 + STAMP_LEN);
    out.extend_from_slice(&clock.to_le_bytes());
    out.push(match phase {
        Phase::Prepare(_) => 0,
        Phase::Commit => 1,
        Phase::Abort => 2,
    });
    write_stamp(&mut out, stamp);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    match phase {
        Phase::Prepare(Precondition::Absent) => out.push(0),
        Phase::Prepare(Precondition::Matches(current)) => {
            out.push(1);
            write_stamp(&mut out, &current);
        }
        Phase::Commit | Phase::Abort => {}
    }
    out
}

/// Bytes a conditional-write request starts with: clock, phase, stamp and key length.
pub const CAS_FIXED_LEN: usize = CLOCK_LEN + 1 + STAMP_LEN + 2;

/// Whether a request is a prepare, and how many bytes of its head follow its first
/// [`CAS_FIXED_LEN`] bytes up to a prepare's precondition tag: the key and, for a prepare, the
/// tag. A reader of a request arriving piece by piece reads them, then [`precondition_len`]
/// more for a prepare.
pub fn cas_key_and_tag_len(fixed: &[u8]) -> Result<(bool, usize), ObjectError> {
    need(fixed, CAS_FIXED_LEN)?;
    let key_len = u16::from_le_bytes([fixed[CAS_FIXED_LEN - 2], fixed[CAS_FIXED_LEN - 1]]) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(ObjectError::InvalidKey("longer than 256 bytes"));
    }
    match fixed[CLOCK_LEN] {
        0 => Ok((true, key_len + 1)),
        1 | 2 => Ok((false, key_len)),
        other => Err(ObjectError::UnknownTag(other)),
    }
}

/// How many bytes of a prepare's precondition follow its tag.
pub fn precondition_len(tag: u8) -> Result<usize, ObjectError> {
    match tag {
        0 => Ok(0),
        1 => Ok(STAMP_LEN),
        other => Err(ObjectError::UnknownTag(other)),
    }
}

/// Decodes a conditional-write request, checking the key and a prepare's content against its hash.
pub fn decode_cas(bytes: &[u8], max_content: usize) -> Result<CasRequest<'_>, ObjectError> {
    let request = decode_cas_head(bytes)?;
    let content = request.content.clone();
    match request.phase {
        Phase::Prepare(_) => {
            if content.len() > max_content {
                return Err(ObjectError::TooLarge {
                    len: content.len(),
                    max: max_content,
                });
            }
            if content_hash(&bytes[content.clone()]) != request.stamp.hash {
                return Err(ObjectError::HashMismatch);
            }
        }
        Phase::Commit | Phase::Abort if !content.is_empty() => {
            return Err(ObjectError::Trailing(content.len()))
        }
        Phase::Commit | Phase::Abort => {}
    }
    Ok(request)
}

/// Decodes a conditional-write request's head; what follows it (`content`) is not checked. A
/// prepare's content arriving piece by piece is checked against the hash as it is stored.
pub fn decode_cas_head(bytes: &[u8]) -> Result<CasRequest<'_>, ObjectError> {
    let clock = read_u64(bytes)?;
    need(bytes, CLOCK_LEN + 1)?;
    let phase_tag = bytes[CLOCK_LEN];
    let stamp = read_stamp(&bytes[CLOCK_LEN + 1..])?;
    let len_at = CLOCK_LEN + 1 + STAMP_LEN;
    need(bytes, len_at + 2)?;
    let key_len = u16::from_le_bytes([bytes[len_at], bytes[len_at + 1]]) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(ObjectError::InvalidKey("longer than 256 bytes"));
    }
    let key_start = len_at + 2;
    need(bytes, key_start + key_len)?;
    let key = std::str::from_utf8(&bytes[key_start..key_start + key_len])
        .map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
    validate_key(key)?;
    let mut at = key_start + key_len;
    let phase = match phase_tag {
        0 => {
            need(bytes, at + 1)?;
            let precondition = match bytes[at] {
                0 => Precondition::Absent,
                1 => Precondition::Matches(read_stamp(&bytes[at + 1..])?),
                other => return Err(ObjectError::UnknownTag(other)),
            };
            at += 1 + if precondition == Precondition::Absent {
                0
            } else {
                STAMP_LEN
            };
            Phase::Prepare(precondition)
        }
        1 => Phase::Commit,
        2 => Phase::Abort,
        other => return Err(ObjectError::UnknownTag(other)),
    };
    Ok(CasRequest {
        clock,
        phase,
        key,
        stamp,
        content: at..bytes.len(),
    })
}

/// A replica's answer to a conditional-write request it did not refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasAnswer {
    /// Prepared, committed or aborted as asked.
    Done,
    /// The precondition does not hold: this is the current copy (`None`: absent).
    Mismatch(Option<Stamp>),
    /// Another conditional write is pending on the key.
    Busy,
}

/// Encodes an answer to a conditional-write request, sent at hybrid time `clock`.
pub fn encode_cas_answer(clock: u64, answer: Result<CasAnswer, Refusal>) -> Vec<u8> {
    let mut out = Vec::with_capacity(CLOCK_LEN + 2 + STAMP_LEN);
    out.extend_from_slice(&clock.to_le_bytes());
    match answer {
        Ok(CasAnswer::Done) => out.push(0),
        Ok(CasAnswer::Mismatch(None)) => out.extend_from_slice(&[1, 0]),
        Ok(CasAnswer::Mismatch(Some(stamp))) => {
            out.extend_from_slice(&[1, 1]);
            write_stamp(&mut out, &stamp);
        }
        Err(reason) => out.extend_from_slice(&[REFUSED, reason.code()]),
        Ok(CasAnswer::Busy) => out.push(3),
    }
    out
}

/// Decodes an answer to a conditional-write request: the replica's clock and what it said.
pub fn decode_cas_answer(bytes: &[u8]) -> Result<(u64, Result<CasAnswer, Refusal>), ObjectError> {
    let clock = read_u64(bytes)?;
    let rest = &bytes[CLOCK_LEN..];
    let (&tag, rest) = rest.split_first().ok_or(ObjectError::Truncated {
        needed: CLOCK_LEN + 1,
        have: bytes.len(),
    })?;
    let trailing = |used: usize| {
        if rest.len() > used {
            Err(ObjectError::Trailing(rest.len() - used))
        } else {
            Ok(())
        }
    };
    let answer = match tag {
        0 => trailing(0).map(|()| Ok(CasAnswer::Done))?,
        1 => match rest.first() {
            Some(0) => trailing(1).map(|()| Ok(CasAnswer::Mismatch(None)))?,
            Some(1) => {
                let stamp = read_stamp(&rest[1..])?;
                trailing(1 + STAMP_LEN).map(|()| Ok(CasAnswer::Mismatch(Some(stamp))))?
            }
            Some(other) => return Err(ObjectError::UnknownTag(*other)),
            None => return Err(ObjectError::Truncated { needed: 1, have: 0 }),
        },
        REFUSED => Err(decode_refusal(rest)?),
        3 => trailing(0).map(|()| Ok(CasAnswer::Busy))?,
        other => return Err(ObjectError::UnknownTag(other)),
    };
    Ok((clock, answer))
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
    fn every_phase_and_answer_round_trips() {
        let s = stamp(9, b"new");
        for phase in [
            Phase::Prepare(Precondition::Absent),
            Phase::Prepare(Precondition::Matches(stamp(3, b"old"))),
            Phase::Commit,
            Phase::Abort,
        ] {
            let mut message = encode_cas_header(7, phase, "counter", &s);
            if matches!(phase, Phase::Prepare(_)) {
                message.extend_from_slice(b"new");
            }
            let request = decode_cas(&message, 16).unwrap();
            assert_eq!(
                (request.clock, request.phase, request.key, request.stamp),
                (7, phase, "counter", s)
            );
        }
        for answer in [
            Ok(CasAnswer::Done),
            Ok(CasAnswer::Mismatch(None)),
            Ok(CasAnswer::Mismatch(Some(s))),
            Ok(CasAnswer::Busy),
            Err(Refusal::NotMember),
        ] {
            assert_eq!(
                decode_cas_answer(&encode_cas_answer(5, answer)),
                Ok((5, answer))
            );
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let s = stamp(9, b"new");
        let mut prepare = encode_cas_header(7, Phase::Prepare(Precondition::Absent), "k", &s);
        prepare.extend_from_slice(b"forged");
        assert_eq!(decode_cas(&prepare, 16), Err(ObjectError::HashMismatch));
        let mut commit = encode_cas_header(7, Phase::Commit, "k", &s);
        commit.push(0);
        assert_eq!(decode_cas(&commit, 16), Err(ObjectError::Trailing(1)));
        assert!(Precondition::Absent.holds(None));
        assert!(!Precondition::Matches(s).holds(None));
        assert!(Precondition::Matches(s).holds(Some(&s)));
    }

    #[test]
    fn preconditions_parse_from_headers_and_etags_round_trip() {
        let s = stamp(1_234, b"v");
        let tag = etag(&s);
        assert_eq!(
            parse_precondition(Some(tag.as_bytes()), None),
            Ok(Some(Precondition::Matches(s)))
        );
        assert_eq!(
            parse_precondition(None, Some(b" * ")),
            Ok(Some(Precondition::Absent))
        );
        assert_eq!(parse_precondition(None, None), Ok(None));
        for bad in [
            &b"*"[..],
            b"W/\"1-00\"",
            b"\"1-zz\"",
            b"nonsense",
            b"\"-1-\"",
            b"\"99999999999999999999999-0000000000000000000000000000000000000000000000000000000000000000\"",
        ] {
            assert_eq!(
                parse_precondition(Some(bad), None),
                Err(PreconditionError::NotAnEtag),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            parse_precondition(None, Some(tag.as_bytes())),
            Err(PreconditionError::NotAStar)
        );
        assert_eq!(
            parse_precondition(Some(tag.as_bytes()), Some(b"*")),
            Err(PreconditionError::Both)
        );
    }

    proptest! {
        #[test]
        fn etags_parse_back(version in any::<u64>(), content in any::<Vec<u8>>()) {
            let s = stamp(version, &content);
            prop_assert_eq!(parse_etag(etag(&s).as_bytes()), Some(s));
        }

        #[test]
        fn decoders_never_panic_and_accepted_requests_re_encode(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            if let Ok(request) = decode_cas(&bytes, 64) {
                let mut again = encode_cas_header(request.clock, request.phase, request.key, &request.stamp);
                again.extend_from_slice(&bytes[request.content.clone()]);
                prop_assert_eq!(again, bytes.clone());
            }
            if let Ok((clock, answer)) = decode_cas_answer(&bytes) {
                prop_assert_eq!(encode_cas_answer(clock, answer), bytes);
            }
        }
    }
}
