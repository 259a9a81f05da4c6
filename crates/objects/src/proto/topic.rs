//! Name publish/subscribe topics, map them to gossip classes, and wrap their messages in an envelope.
//!
//! # Design
//!
//! A topic is a name of 1 to 64 characters from `[A-Za-z0-9._-]` ([`TopicName`]). Its messages
//! travel as gossip artifacts of one class ([`ClassId`], one byte). The class is derived from the
//! name alone ([`class_of`]: the first byte of SHA-256 of `meshwire-topic:` and the name), so every
//! node that configures a topic puts it on the same class without coordination; a node's config
//! may pin a topic to another class instead, and then every node must pin it alike.
//!
//! One byte of class cannot keep 64 names apart, so collisions are handled, not hoped away:
//!
//! - two topics of one node on one class are refused when the node starts (pin one elsewhere);
//! - every message carries its topic's name in its [`Envelope`], and a receiver accepts it only
//!   if that name is the topic it configured on the message's class. Two nodes whose different
//!   topics collide on a class therefore never deliver each other's messages under the wrong
//!   name: the receiver's validator rejects them (and, for a relayed class, does not relay them).
//!
//! The envelope (version 1, all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version, `1` |
//! | 1 | length `n` of the topic name, 1..=64 |
//! | n | the topic name |
//! | 32 | origin: the PeerId of the node the message was published on |
//! | 8 | sequence: the origin's publish clock, µs since the Unix epoch, strictly increasing per node |
//! | rest | the body |
//!
//! The origin and sequence make two publishes of the same body two artifacts (gossip dedups by
//! content). The origin is what the publishing node wrote: a relaying peer could forge it, so it
//! is informative; the peer a message came from is authenticated by the transport.

use bytes::{BufMut, Bytes, BytesMut};
use meshwire_gossip::proto::ClassId;
use meshwire_proto::PeerId;

/// Longest topic name, in bytes.
pub const MAX_TOPIC_NAME_BYTES: usize = 64;

/// The envelope's version byte.
pub const ENVELOPE_VERSION: u8 = 1;

/// The envelope's fixed bytes around a name: version, name length, origin, sequence.
const ENVELOPE_FIXED_BYTES: usize = 1 + 1 + 32 + 8;

/// The most bytes an envelope adds to a body (with a name of the longest length).
pub const MAX_ENVELOPE_OVERHEAD_BYTES: usize = ENVELOPE_FIXED_BYTES + MAX_TOPIC_NAME_BYTES;

/// Why a topic name or an envelope is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    /// The name is empty, longer than 64 bytes or holds a character outside `[A-Za-z0-9._-]`.
    #[error("topic name {0:?} is not 1 to 64 characters of [A-Za-z0-9._-]")]
    InvalidName(String),
    /// The envelope ends before its fields do.
    #[error("topic envelope truncated: {0} bytes")]
    Truncated(usize),
    /// The envelope's version is not one this node reads.
    #[error("topic envelope version {0} is not {ENVELOPE_VERSION}")]
    UnknownVersion(u8),
}

/// A valid topic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(String);

impl TopicName {
    /// Checks `name` against `[A-Za-z0-9._-]{1,64}`.
    pub fn new(name: &str) -> Result<Self, TopicError> {
        let valid = (1..=MAX_TOPIC_NAME_BYTES).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(Self(name.to_string()))
        } else {
            // Echo at most a name's worth of what was sent: the message must stay bounded.
            let shown: String = name.chars().take(MAX_TOPIC_NAME_BYTES + 1).collect();
            Err(TopicError::InvalidName(shown))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TopicName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The gossip class a topic travels on unless the config pins it: the first byte of
/// SHA-256(`meshwire-topic:` ‖ name).
pub fn class_of(name: &TopicName) -> ClassId {
    let digest = meshwire_proto::hash::sha256(&[b"meshwire-topic:", name.as_str().as_bytes()]);
    ClassId(digest[0])
}

/// One topic message as it travels in a gossip artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The topic.
    pub topic: TopicName,
    /// The node it was published on (as that node wrote it).
    pub origin: PeerId,
    /// The origin's publish clock (µs since the Unix epoch, strictly increasing per origin).
    pub sequence: u64,
    /// What was published.
    pub body: Bytes,
}

impl Envelope {
    /// The artifact payload: the envelope's fields, then the body.
    pub fn encode(&self) -> Bytes {
        let name = self.topic.as_str().as_bytes();
        let mut out = BytesMut::with_capacity(ENVELOPE_FIXED_BYTES + name.len() + self.body.len());
        out.put_u8(ENVELOPE_VERSION);
        // A TopicName is at most 64 bytes, so its length fits a byte.
        out.put_u8(name.len() as u8);
        out.put_slice(name);
        out.put_slice(self.origin.as_bytes());
        out.put_u64_le(self.sequence);
        out.put_slice(&self.body);
        out.freeze()
    }

    /// Reads an artifact payload; the body shares `payload`'s buffer.
    pub fn decode(payload: &Bytes) -> Result<Self, TopicError> {
        let truncated = || TopicError::Truncated(payload.len());
        let (&version, rest) = payload.split_first().ok_or_else(truncated)?;
        if version != ENVELOPE_VERSION {
            return Err(TopicError::UnknownVersion(version));
        }
        let (&name_len, rest) = rest.split_first().ok_or_else(truncated)?;
        let name_len = usize::from(name_len);
        if rest.len() < name_len + 32 + 8 {
            return Err(truncated());
        }
        let name = std::str::from_utf8(&rest[..name_len]).map_err(|_| {
            TopicError::InvalidName(String::from_utf8_lossy(&rest[..name_len]).into())
        })?;
        let topic = TopicName::new(name)?;
        let mut origin = [0u8; 32];
        origin.copy_from_slice(&rest[name_len..name_len + 32]);
        let mut sequence = [0u8; 8];
        sequence.copy_from_slice(&rest[name_len + 32..name_len + 40]);
        let body_start = 2 + name_len + 40;
        Ok(Self {
            topic,
            origin: PeerId::from_bytes(origin),
            sequence: u64::from_le_bytes(sequence),
            body: payload.slice(body_start..),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_pattern() {
        for good in ["a", "blocks", "A.b_c-9", &"x".repeat(64)] {
            assert!(TopicName::new(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a/b", "é", "a\0", &"x".repeat(65), "%2e"] {
            assert_eq!(
                TopicName::new(bad).unwrap_err(),
                TopicError::InvalidName(bad.chars().take(65).collect()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_class_depends_on_the_name_only() {
        let blocks = TopicName::new("blocks").unwrap();
        assert_eq!(
            class_of(&blocks),
            class_of(&TopicName::new("blocks").unwrap())
        );
        // Frozen: nodes of different versions must agree on it.
        let digest = meshwire_proto::hash::sha256(&[b"meshwire-topic:blocks"]);
        assert_eq!(class_of(&blocks), ClassId(digest[0]));
    }

    #[test]
    fn envelopes_round_trip_and_refuse_damage() {
        let envelope = Envelope {
            topic: TopicName::new("blocks").unwrap(),
            origin: PeerId::from_bytes([7; 32]),
            sequence: 1_700_000_000_000_001,
            body: Bytes::from_static(b"hello"),
        };
        let encoded = envelope.encode();
        assert_eq!(encoded.len(), ENVELOPE_FIXED_BYTES + 6 + 5);
        assert_eq!(Envelope::decode(&encoded).unwrap(), envelope);
        for cut in 0..encoded.len() - 5 {
            assert!(
                Envelope::decode(&encoded.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let mut wrong_version = encoded.to_vec();
        wrong_version[0] = 2;
        assert_eq!(
            Envelope::decode(&Bytes::from(wrong_version)),
            Err(TopicError::UnknownVersion(2))
        );
        let mut bad_name = encoded.to_vec();
        bad_name[2] = b'/';
        assert!(matches!(
            Envelope::decode(&Bytes::from(bad_name)),
            Err(TopicError::InvalidName(_))
        ));
        let mut zero_name = encoded.to_vec();
        zero_name[1] = 0;
        assert!(Envelope::decode(&Bytes::from(zero_name)).is_err());
    }
}
