//! Encode and decode gossip batches: adverts, requests, artifacts, purges, lazy adverts and prunes, bounded before allocation.
//!
//! A batch is `[version u8][count u16][item]*`, every integer little-endian. Items:
//!
//! | tag | item     | fields                                             | bytes        |
//! |-----|----------|----------------------------------------------------|--------------|
//! | 1   | advert   | class (u8), id (32), size (u32)                    | 38           |
//! | 2   | request  | id (32)                                            | 33           |
//! | 3   | artifact | class (u8), length (u32), payload                  | 6 + length   |
//! | 4   | purge    | id (32)                                            | 33           |
//! | 5   | ihave    | class (u8), id (32), size (u32)                    | 38           |
//! | 6   | prune    | id (32)                                            | 33           |
//! | 7   | neighbours | sequence (u64), count (u16), peer ids (32 each)  | 11 + 32 × count |
//!
//! An ihave is a lazy advert: the receiver requests the artifact if it lacks it, and says nothing
//! if it holds it. A prune answers an eager copy (a pushed artifact or an advert) of an artifact
//! the receiver already held: "stop sending me eagerly what reaches you by the way this one did".
//! A neighbours item lists the sender's peers: a relay skips only the peers its upstream reaches
//! itself (both list each other), so a node whose neighbours all route elsewhere is never left out.
//! Its sequence number orders announcements that arrive out of order; the newest one counts.
//!
//! An artifact carries no id: the receiver derives it from the content ([`ArtifactId::of`]), so a
//! peer cannot deliver bytes under another artifact's id.

use bytes::{BufMut, Bytes, BytesMut};

use meshwire_proto::PeerId;

use super::{ArtifactId, ClassId};

/// The batch format version this code writes and accepts.
pub const BATCH_VERSION: u8 = 1;
/// Bytes before the first item.
pub const BATCH_HEADER_LEN: usize = 3;
/// Wire size of one advert.
pub const ADVERT_LEN: usize = 1 + 1 + 32 + 4;
/// Wire size of one request or purge.
pub const ID_ITEM_LEN: usize = 1 + 32;
/// Wire size of an artifact item without its payload.
pub const ARTIFACT_HEADER_LEN: usize = 1 + 1 + 4;
/// Wire size of a neighbours item without its peer ids.
pub const NEIGHBOURS_HEADER_LEN: usize = 1 + 8 + 2;

const TAG_ADVERT: u8 = 1;
const TAG_REQUEST: u8 = 2;
const TAG_ARTIFACT: u8 = 3;
const TAG_PURGE: u8 = 4;
const TAG_IHAVE: u8 = 5;
const TAG_PRUNE: u8 = 6;
const TAG_NEIGHBOURS: u8 = 7;

/// One gossip item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// "I hold artifact `id` of `class`, `size` bytes long; request it from me."
    Advert {
        /// The artifact's class.
        class: ClassId,
        /// Its content id.
        id: ArtifactId,
        /// Its payload length in bytes.
        size: u32,
    },
    /// "Send me artifact `id`."
    Request(ArtifactId),
    /// A whole artifact: a response to a request, or a push.
    Artifact {
        /// The artifact's class.
        class: ClassId,
        /// The payload, sliced from the received batch.
        payload: Bytes,
    },
    /// "I no longer hold `id`; do not request it from me."
    Purge(ArtifactId),
    /// A lazy advert: "I hold artifact `id`; request it from me if you lack it" (no reply if held).
    IHave {
        /// The artifact's class.
        class: ClassId,
        /// Its content id.
        id: ArtifactId,
        /// Its payload length in bytes.
        size: u32,
    },
    /// "I already held `id` when your eager copy came: stop pushing to me what reaches you by
    /// the peer that gave you `id`."
    Prune(ArtifactId),
    /// "These are my peers now" (announcement `seq`; a later one replaces it).
    Neighbours {
        /// Announcement number, increasing per sender and connection.
        seq: u64,
        /// The sender's peers, at most `max_items` (the batch's item limit).
        peers: Vec<PeerId>,
    },
}

impl Item {
    /// Bytes this item takes in a batch.
    pub fn wire_len(&self) -> usize {
        match self {
            Item::Advert { .. } | Item::IHave { .. } => ADVERT_LEN,
            Item::Request(_) | Item::Purge(_) | Item::Prune(_) => ID_ITEM_LEN,
            Item::Artifact { payload, .. } => ARTIFACT_HEADER_LEN + payload.len(),
            Item::Neighbours { peers, .. } => NEIGHBOURS_HEADER_LEN + 32 * peers.len(),
        }
    }
}

/// Limits a decoder enforces before it allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most items in one batch.
    pub max_items: usize,
    /// Largest artifact payload.
    pub max_artifact_bytes: u32,
}

/// A malformed or oversized gossip batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A batch version this code does not speak.
    #[error("unsupported gossip batch version {0}")]
    UnsupportedVersion(u8),
    /// More items than the limit.
    #[error("batch announces {count} items, the limit is {max}")]
    TooManyItems {
        /// Announced items.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An item tag this version does not define.
    #[error("unknown gossip item tag {0}")]
    UnknownTag(u8),
    /// An artifact longer than the limit.
    #[error("artifact of {len} bytes exceeds the limit of {max} bytes")]
    ArtifactTooLarge {
        /// Announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The batch ended inside an item.
    #[error("gossip batch truncated")]
    Truncated,
    /// A neighbours item listing more peers than the limit.
    #[error("neighbours item lists {count} peers, the limit is {max}")]
    TooManyNeighbours {
        /// Listed peers.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// Bytes after the last announced item.
    #[error("{0} trailing bytes after the last gossip item")]
    TrailingBytes(usize),
}

/// Encodes `items` as one batch.
pub fn encode_batch(items: &[Item]) -> Bytes {
    let len = BATCH_HEADER_LEN + items.iter().map(Item::wire_len).sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    out.put_u8(BATCH_VERSION);
    out.put_u16_le(items.len().min(usize::from(u16::MAX)) as u16);
    for item in items.iter().take(usize::from(u16::MAX)) {
        match item {
            Item::Advert { class, id, size } => {
                out.put_u8(TAG_ADVERT);
                out.put_u8(class.0);
                out.put_slice(&id.0);
                out.put_u32_le(*size);
            }
            Item::Request(id) => {
                out.put_u8(TAG_REQUEST);
                out.put_slice(&id.0);
            }
            Item::Artifact { class, payload } => {
                out.put_u8(TAG_ARTIFACT);
                out.put_u8(class.0);
                out.put_u32_le(payload.len() as u32);
                out.put_slice(payload);
            }
            Item::Purge(id) => {
                out.put_u8(TAG_PURGE);
                out.put_slice(&id.0);
            }
            Item::IHave { class, id, size } => {
                out.put_u8(TAG_IHAVE);
                out.put_u8(class.0);
                out.put_slice(&id.0);
                out.put_u32_le(*size);
            }
            Item::Prune(id) => {
                out.put_u8(TAG_PRUNE);
                out.put_slice(&id.0);
            }
            Item::Neighbours { seq, peers } => {
                out.put_u8(TAG_NEIGHBOURS);
                out.put_u64_le(*seq);
                let count = peers.len().min(usize::from(u16::MAX));
                out.put_u16_le(count as u16);
                for peer in &peers[..count] {
                    out.put_slice(peer.as_bytes());
                }
            }
        }
    }
    out.freeze()
}

struct Reader<'a> {
    bytes: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, len: usize) -> Result<&[u8], CodecError> {
        let end = self.at.checked_add(len).ok_or(CodecError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(CodecError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn id(&mut self) -> Result<ArtifactId, CodecError> {
        let mut id = [0u8; 32];
        id.copy_from_slice(self.take(32)?);
        Ok(ArtifactId(id))
    }

    /// A neighbours item's body: at most `max` peers, checked before allocating, and the ids
    /// must all be present.
    fn neighbours(&mut self, max: usize) -> Result<Item, CodecError> {
        let seq = self.u64()?;
        let count = {
            let b = self.take(2)?;
            usize::from(u16::from_le_bytes([b[0], b[1]]))
        };
        if count > max {
            return Err(CodecError::TooManyNeighbours { count, max });
        }
        let ids = self.take(32 * count)?;
        let peers = ids
            .chunks_exact(32)
            .map(|chunk| {
                let mut id = [0u8; 32];
                id.copy_from_slice(chunk);
                PeerId::from_bytes(id)
            })
            .collect();
        Ok(Item::Neighbours { seq, peers })
    }
}

/// Decodes one batch. Artifact payloads are slices of `bytes`; nothing is copied. The item count
/// and every artifact length are checked against `limits` before anything is allocated for them.
pub fn decode_batch(bytes: &Bytes, limits: &BatchLimits) -> Result<Vec<Item>, CodecError> {
    let mut reader = Reader { bytes, at: 0 };
    let version = reader.u8()?;
    if version != BATCH_VERSION {
        return Err(CodecError::UnsupportedVersion(version));
    }
    let count = {
        let b = reader.take(2)?;
        usize::from(u16::from_le_bytes([b[0], b[1]]))
    };
    if count > limits.max_items {
        return Err(CodecError::TooManyItems {
            count,
            max: limits.max_items,
        });
    }
    // Only a neighbours item takes fewer than 33 bytes, so a short batch cannot make us reserve
    // much (the reservation is a hint; the vector grows past it if it must).
    let mut items = Vec::with_capacity(count.min(bytes.len() / ID_ITEM_LEN));
    for _ in 0..count {
        let item = match reader.u8()? {
            TAG_ADVERT => Item::Advert {
                class: ClassId(reader.u8()?),
                id: reader.id()?,
                size: reader.u32()?,
            },
            TAG_REQUEST => Item::Request(reader.id()?),
            TAG_ARTIFACT => {
                let class = ClassId(reader.u8()?);
                let len = reader.u32()?;
                if len > limits.max_artifact_bytes {
                    return Err(CodecError::ArtifactTooLarge {
                        len,
                        max: limits.max_artifact_bytes,
                    });
                }
                let start = reader.at;
                reader.take(len as usize)?;
                Item::Artifact {
                    class,
                    payload: bytes.slice(start..reader.at),
                }
            }
            TAG_PURGE => Item::Purge(reader.id()?),
            TAG_IHAVE => Item::IHave {
                class: ClassId(reader.u8()?),
                id: reader.id()?,
                size: reader.u32()?,
            },
            TAG_PRUNE => Item::Prune(reader.id()?),
            TAG_NEIGHBOURS => reader.neighbours(limits.max_items)?,
            other => return Err(CodecError::UnknownTag(other)),
        };
        items.push(item);
    }
    if reader.at != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - reader.at));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_items: 1024,
        max_artifact_bytes: 4096,
    };

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    // Golden vector: changing any byte here changes the gossip wire format.
    #[test]
    fn golden_batch() {
        let items = vec![
            Item::Advert {
                class: ClassId(2),
                id: ArtifactId([0xaa; 32]),
                size: 0x0102_0304,
            },
            Item::Request(ArtifactId([0x11; 32])),
            Item::Artifact {
                class: ClassId(1),
                payload: Bytes::from_static(b"hi"),
            },
            Item::Purge(ArtifactId([0x22; 32])),
            Item::IHave {
                class: ClassId(3),
                id: ArtifactId([0xbb; 32]),
                size: 0x100,
            },
            Item::Prune(ArtifactId([0x33; 32])),
        ];
        let encoded = encode_batch(&items);
        let expected = [
            "01".to_string(),
            "0600".to_string(),
            format!("0102{}04030201", "aa".repeat(32)),
            format!("02{}", "11".repeat(32)),
            "0301020000006869".to_string(),
            format!("04{}", "22".repeat(32)),
            format!("0503{}00010000", "bb".repeat(32)),
            format!("06{}", "33".repeat(32)),
        ]
        .concat();
        assert_eq!(hex(&encoded), expected);
        assert_eq!(decode_batch(&encoded, &LIMITS).unwrap(), items);
    }

    // Golden vector of a neighbours item.
    #[test]
    fn golden_neighbours() {
        let items = vec![Item::Neighbours {
            seq: 0x0102,
            peers: vec![
                PeerId::from_bytes([0xcc; 32]),
                PeerId::from_bytes([0xdd; 32]),
            ],
        }];
        let encoded = encode_batch(&items);
        let expected = format!(
            "01010007{}0200{}{}",
            "0201000000000000",
            "cc".repeat(32),
            "dd".repeat(32)
        );
        assert_eq!(hex(&encoded), expected);
        assert_eq!(encoded.len(), BATCH_HEADER_LEN + items[0].wire_len());
        assert_eq!(decode_batch(&encoded, &LIMITS).unwrap(), items);
    }

    #[test]
    fn a_neighbours_item_is_bounded_before_allocation() {
        let peers = vec![PeerId::from_bytes([1; 32]); 3];
        let encoded = encode_batch(&[Item::Neighbours { seq: 1, peers }]);
        let limits = BatchLimits {
            max_items: 2,
            ..LIMITS
        };
        assert_eq!(
            decode_batch(&encoded, &limits),
            Err(CodecError::TooManyNeighbours { count: 3, max: 2 })
        );
        // A count the bytes do not back is truncated, not allocated.
        let mut lying = vec![BATCH_VERSION, 1, 0, TAG_NEIGHBOURS];
        lying.extend_from_slice(&7u64.to_le_bytes());
        lying.extend_from_slice(&1000u16.to_le_bytes());
        assert_eq!(
            decode_batch(&Bytes::from(lying), &LIMITS),
            Err(CodecError::Truncated)
        );
    }

    #[test]
    fn rejects_malformed_batches() {
        let good = encode_batch(&[Item::Request(ArtifactId([1; 32]))]).to_vec();
        let with = |index: usize, value: u8| {
            let mut bytes = good.clone();
            bytes[index] = value;
            decode_batch(&Bytes::from(bytes), &LIMITS)
        };
        assert_eq!(with(0, 9), Err(CodecError::UnsupportedVersion(9)));
        assert_eq!(with(3, 8), Err(CodecError::UnknownTag(8)));
        let mut short_prune = encode_batch(&[Item::Prune(ArtifactId([1; 32]))]).to_vec();
        short_prune.pop();
        assert_eq!(
            decode_batch(&Bytes::from(short_prune), &LIMITS),
            Err(CodecError::Truncated)
        );
        assert_eq!(with(1, 2), Err(CodecError::Truncated));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            decode_batch(&Bytes::from(long), &LIMITS),
            Err(CodecError::TrailingBytes(1))
        );
        let many = [BATCH_VERSION, 0xff, 0xff];
        assert_eq!(
            decode_batch(&Bytes::copy_from_slice(&many), &LIMITS),
            Err(CodecError::TooManyItems {
                count: 65535,
                max: 1024
            })
        );
        let big = encode_batch(&[Item::Artifact {
            class: ClassId(0),
            payload: Bytes::from(vec![0u8; 5000]),
        }]);
        assert_eq!(
            decode_batch(&big, &LIMITS),
            Err(CodecError::ArtifactTooLarge {
                len: 5000,
                max: 4096
            })
        );
    }

    fn arb_item() -> impl Strategy<Value = Item> {
        prop_oneof![
            (any::<u8>(), any::<[u8; 32]>(), any::<u32>()).prop_map(|(c, id, size)| {
                Item::Advert {
                    class: ClassId(c),
                    id: ArtifactId(id),
                    size,
                }
            }),
            any::<[u8; 32]>().prop_map(|id| Item::Request(ArtifactId(id))),
            (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..600)).prop_map(|(c, p)| {
                Item::Artifact {
                    class: ClassId(c),
                    payload: Bytes::from(p),
                }
            }),
            any::<[u8; 32]>().prop_map(|id| Item::Purge(ArtifactId(id))),
            (any::<u8>(), any::<[u8; 32]>(), any::<u32>()).prop_map(|(c, id, size)| {
                Item::IHave {
                    class: ClassId(c),
                    id: ArtifactId(id),
                    size,
                }
            }),
            any::<[u8; 32]>().prop_map(|id| Item::Prune(ArtifactId(id))),
            (
                any::<u64>(),
                proptest::collection::vec(any::<[u8; 32]>(), 0..20)
            )
                .prop_map(|(seq, peers)| Item::Neighbours {
                    seq,
                    peers: peers.into_iter().map(PeerId::from_bytes).collect(),
                }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips_arbitrary_batches(items in proptest::collection::vec(arb_item(), 0..40)) {
            let encoded = encode_batch(&items);
            prop_assert_eq!(
                encoded.len(),
                BATCH_HEADER_LEN + items.iter().map(Item::wire_len).sum::<usize>()
            );
            prop_assert_eq!(decode_batch(&encoded, &LIMITS).unwrap(), items);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
            let bytes = Bytes::from(bytes);
            if let Ok(items) = decode_batch(&bytes, &LIMITS) {
                prop_assert!(items.len() <= LIMITS.max_items);
                // What decodes re-encodes to the same bytes.
                prop_assert_eq!(encode_batch(&items), bytes);
            }
        }
    }
}
