//! Compare the keys two replicas share by bucket digests, list what differs, and decide which copies to pull and push.
//!
//! # Design
//!
//! Anti-entropy runs between pairs of members. For a pair (this node, a peer), the *shared range*
//! is the set of keys this node holds whose replicas ([`replicas_for`]) include both. The range
//! is split into `B` buckets by key hash (`bucket = first 8 bytes of SHA-256(key) · B / 2^64`);
//! a bucket's digest is the XOR of `first 16 bytes of SHA-256(key ‖ version ‖ hash)` over its
//! keys, so two replicas holding the same copies of the same keys in a bucket compute the same
//! digest, whatever order they saw the writes in, and a digest is cheap to update. XOR is not a
//! defence against a member that crafts collisions; members are trusted to store, not to agree.
//!
//! One exchange (request and response over the `OBJECT_SYNC` protocol):
//!
//! 1. The initiator sends its digests for the pair ([`encode_digests`]), tagged with the
//!    *placement id* of its member list and replication (a digest of both): two nodes whose
//!    member lists differ would compute different ranges and never agree, so a mismatch is a
//!    typed error, not a repair.
//! 2. The responder computes its own digests for the pair with the same `B`, picks differing
//!    buckets from a starting bucket it chooses (the driver picks it at random, so no bucket
//!    starves) until the answer would pass [`ExchangeLimits`] ([`select_buckets`]), and lists
//!    every `(key, version, hash, length)` it holds in them ([`encode_entries`]). A bucket with
//!    more keys than the limit is listed cut short and marked incomplete.
//! 3. The initiator compares each listed bucket with its own ([`reconcile`]): a listed copy that
//!    wins over its own (or that it lacks) is *pulled*; its own copy that wins over the listed
//!    one, or that a *complete* listed bucket lacks, may be *pushed* (the driver sends only some
//!    of these: `net/service/entropy.rs`). "Wins" is the store's rule
//!    ([`wins`]): a higher version, or the same version with the smaller hash. Pulls and pushes go
//!    through the ordinary `FETCH` and `STORE` requests, so membership, the clock checks and the
//!    store's rule apply to them as to any write: an acknowledged version is never replaced by an
//!    older one.
//!
//! ```text
//! digests   [clock u64][placement 16][buckets u16][digest 16 × buckets]
//! entries   [clock u64][0][bucket count u16] then per bucket:
//!               [bucket u16][complete u8: 0|1][entry count u16]
//!               then per entry: [key_len u16][key][version u64][hash 32][content length u32]
//!           [clock u64][2][reason u8]          refused (the reasons of `proto::object::Refusal`)
//! ```
//!
//! Limits: `B` is a power of two from 1 to [`MAX_BUCKETS`] (the initiator picks about
//! [`KEYS_PER_BUCKET`] keys per bucket, [`buckets_for`]), so a digest message is at most 64 KiB.
//! An answer lists at most [`ExchangeLimits::max_entries`] entries in at most
//! [`ExchangeLimits::max_bytes`] bytes; buckets are listed in ascending order from the start,
//! wrapping, each once. Everything else is refused as [`EntropyError`].

use std::collections::BTreeMap;

use meshwire_proto::hash::sha256;

use super::object::{
    decode_refusal, need, read_stamp, read_u64, replicas_for, validate_key, write_stamp, Answer,
    ObjectError, Refusal, Stamp, CLOCK_LEN, MAX_KEY_LEN, REFUSED, STAMP_LEN,
};

/// Most buckets a digest message may carry.
pub const MAX_BUCKETS: usize = 4096;
/// Bytes of one bucket digest and of a placement id.
pub const DIGEST_LEN: usize = 16;
/// Keys per bucket the initiator aims for when it picks the bucket count.
pub const KEYS_PER_BUCKET: usize = 32;
/// Bytes of a digest message's header (clock, placement id, bucket count).
const DIGESTS_HEADER: usize = CLOCK_LEN + DIGEST_LEN + 2;
/// Bytes of a listed bucket's header (bucket, complete, entry count).
const BUCKET_HEADER: usize = 2 + 1 + 2;
/// Bytes of an entry besides its key (key length, stamp, content length).
const ENTRY_OVERHEAD: usize = 2 + STAMP_LEN + 4;

/// A bucket digest: the XOR of its entries' digests.
pub type Digest = u128;

/// Why a digest exchange was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntropyError {
    /// The message does not decode as an object message (truncated, trailing bytes, bad key,
    /// unknown tag).
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// The bucket count is zero, not a power of two, above [`MAX_BUCKETS`], or does not match
    /// the digests carried.
    #[error("bucket count {0} is not a power of two from 1 to 4096")]
    BucketCount(usize),
    /// The sender's member list or replication differs from this node's: the ranges differ.
    #[error(
        "the sender's placement differs from this node's (member lists or replication differ)"
    )]
    PlacementMismatch,
    /// A listed bucket is outside the range, out of order or repeated, or a key sits in another
    /// bucket than the one it is listed in.
    #[error(
        "bucket {bucket} is outside the exchange's range of {buckets} buckets or out of order"
    )]
    BucketRange {
        /// The bucket listed.
        bucket: usize,
        /// The buckets of the exchange.
        buckets: usize,
    },
    /// The answer lists more entries or bytes than the limits allow.
    #[error("the answer lists {entries} entries in {bytes} bytes, over the limit")]
    TooLarge {
        /// Entries listed.
        entries: usize,
        /// Bytes of the answer.
        bytes: usize,
    },
}

impl EntropyError {
    /// Whether a peer whose digest exchange failed so broke the protocol. Another placement is a
    /// member list one side changed first, and an unknown tag may come from a newer version.
    pub fn breaks_protocol(&self) -> bool {
        !matches!(
            self,
            Self::PlacementMismatch | Self::Object(ObjectError::UnknownTag(_))
        )
    }

    /// The reason's name in metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Object(ObjectError::Truncated { .. }) => "truncated",
            Self::Object(ObjectError::Trailing(_)) => "trailing",
            Self::Object(ObjectError::InvalidKey(_)) => "invalid_key",
            Self::Object(_) => "malformed",
            Self::BucketCount(_) => "bucket_count",
            Self::PlacementMismatch => "placement_mismatch",
            Self::BucketRange { .. } => "bucket_range",
            Self::TooLarge { .. } => "too_large",
        }
    }
}

/// How much one answer may list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeLimits {
    /// Most entries in one answer (and so most keys one exchange repairs).
    pub max_entries: usize,
    /// Most bytes of one answer.
    pub max_bytes: usize,
}

impl Default for ExchangeLimits {
    fn default() -> Self {
        Self {
            max_entries: 4096,
            max_bytes: 1024 * 1024,
        }
    }
}

impl ExchangeLimits {
    /// Most entries of one bucket an answer lists: the entry limit, or fewer when entries with
    /// the longest keys would pass the byte limit first.
    pub fn window(&self) -> usize {
        let widest = BUCKET_HEADER + ENTRY_OVERHEAD + MAX_KEY_LEN;
        self.max_entries
            .min(self.max_bytes.saturating_sub(CLOCK_LEN + 3) / widest)
            .max(1)
    }
}

/// Whether the entry at `index` (in the lister's key order) of a bucket of `count` entries is in
/// the window an answer lists: `window` entries from `offset`, wrapping. A bucket of more than
/// `window` entries is listed a window at a time, from a different offset each exchange, so every
/// entry is compared eventually.
pub fn in_window(index: usize, count: usize, offset: usize, window: usize) -> bool {
    if count <= window {
        return true;
    }
    (index + count - offset % count) % count < window
}

/// Whether `new` wins over `old` in a store: a higher version, or the same version with the
/// smaller hash (the rule [`super::object::merge`] ends with, so every replica keeps the same copy).
pub fn wins(new: &Stamp, old: &Stamp) -> bool {
    new.version > old.version || (new.version == old.version && new.hash < old.hash)
}

/// The placement id of a cluster: a digest of its sorted member ids and the replication.
pub fn placement_id(members: &[[u8; 32]], replication: usize) -> [u8; DIGEST_LEN] {
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let replication = (replication as u64).to_le_bytes();
    let mut parts: Vec<&[u8]> = vec![b"meshwire-objects placement", &replication];
    parts.extend(sorted.iter().map(|m| m.as_slice()));
    let digest = sha256(&parts);
    let mut id = [0u8; DIGEST_LEN];
    id.copy_from_slice(&digest[..DIGEST_LEN]);
    id
}

/// Whether `key` is in the range `a` and `b` share: both are among its `replication` replicas.
pub fn shared(
    key: &str,
    members: &[[u8; 32]],
    replication: usize,
    a: &[u8; 32],
    b: &[u8; 32],
) -> bool {
    let replicas = replicas_for(key, members, replication);
    replicas.contains(a) && replicas.contains(b)
}

/// The bucket count for a range of about `keys` keys: a power of two near `keys / 32`, from 1 to
/// [`MAX_BUCKETS`].
pub fn buckets_for(keys: usize) -> usize {
    (keys / KEYS_PER_BUCKET)
        .clamp(1, MAX_BUCKETS)
        .next_power_of_two()
}

/// The bucket of `key` among `buckets`.
pub fn bucket_of(key: &str, buckets: usize) -> usize {
    let digest = sha256(&[key.as_bytes()]);
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    ((u128::from(u64::from_be_bytes(head)) * buckets as u128) >> 64) as usize
}

/// The digest of one entry.
pub fn entry_digest(key: &str, stamp: &Stamp) -> Digest {
    let digest = sha256(&[key.as_bytes(), &stamp.version.to_le_bytes(), &stamp.hash]);
    let mut head = [0u8; DIGEST_LEN];
    head.copy_from_slice(&digest[..DIGEST_LEN]);
    u128::from_le_bytes(head)
}

fn check_buckets(buckets: usize) -> Result<(), EntropyError> {
    if buckets == 0 || buckets > MAX_BUCKETS || !buckets.is_power_of_two() {
        return Err(EntropyError::BucketCount(buckets));
    }
    Ok(())
}

/// One replica's view of a shared range: a digest, an entry count and the bytes its entries
/// take in an answer, per bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    digests: Vec<Digest>,
    counts: Vec<u32>,
    bytes: Vec<u64>,
}

impl Summary {
    /// An empty range in `buckets` buckets.
    pub fn new(buckets: usize) -> Result<Self, EntropyError> {
        check_buckets(buckets)?;
        Ok(Self {
            digests: vec![0; buckets],
            counts: vec![0; buckets],
            bytes: vec![0; buckets],
        })
    }

    /// Adds the entry `(key, stamp)`.
    pub fn add(&mut self, key: &str, stamp: &Stamp) {
        let bucket = bucket_of(key, self.digests.len());
        self.digests[bucket] ^= entry_digest(key, stamp);
        self.counts[bucket] = self.counts[bucket].saturating_add(1);
        self.bytes[bucket] += (ENTRY_OVERHEAD + key.len()) as u64;
    }

    /// The same range in `buckets` buckets (a power of two no larger than this summary's):
    /// bucket `i` of the result holds buckets `i·f .. (i+1)·f` of this one, `f` being the ratio,
    /// since a key's bucket is the top bits of its hash. One scan serves any bucket count.
    pub fn fold(&self, buckets: usize) -> Result<Self, EntropyError> {
        check_buckets(buckets)?;
        if buckets > self.buckets() {
            return Err(EntropyError::BucketCount(buckets));
        }
        let factor = self.buckets() / buckets;
        let mut folded = Self::new(buckets)?;
        for (from, digest) in self.digests.iter().enumerate() {
            let to = from / factor;
            folded.digests[to] ^= digest;
            folded.counts[to] = folded.counts[to].saturating_add(self.counts[from]);
            folded.bytes[to] += self.bytes[from];
        }
        Ok(folded)
    }

    /// Entries in the whole range.
    pub fn total(&self) -> usize {
        self.counts.iter().map(|c| *c as usize).sum()
    }

    /// The bucket count.
    pub fn buckets(&self) -> usize {
        self.digests.len()
    }

    /// The digest of each bucket.
    pub fn digests(&self) -> &[Digest] {
        &self.digests
    }

    /// Entries in `bucket`.
    pub fn count(&self, bucket: usize) -> usize {
        self.counts[bucket] as usize
    }
}

/// A decoded digest message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestRequest {
    /// The sender's hybrid clock.
    pub clock: u64,
    /// The placement id of the sender's cluster.
    pub placement: [u8; DIGEST_LEN],
    /// The sender's digest of each bucket.
    pub digests: Vec<Digest>,
}

/// Encodes bucket `digests` (a [`Summary::digests`]), sent at hybrid time `clock` by a node of
/// `placement`.
pub fn encode_digests(clock: u64, placement: &[u8; DIGEST_LEN], digests: &[Digest]) -> Vec<u8> {
    let mut out = Vec::with_capacity(DIGESTS_HEADER + DIGEST_LEN * digests.len());
    out.extend_from_slice(&clock.to_le_bytes());
    out.extend_from_slice(placement);
    out.extend_from_slice(&(digests.len() as u16).to_le_bytes());
    for digest in digests {
        out.extend_from_slice(&digest.to_le_bytes());
    }
    out
}

/// Decodes a digest message, checking its bucket count and its length before any allocation.
pub fn decode_digests(bytes: &[u8]) -> Result<DigestRequest, EntropyError> {
    need(bytes, DIGESTS_HEADER)?;
    let clock = read_u64(bytes)?;
    let mut placement = [0u8; DIGEST_LEN];
    placement.copy_from_slice(&bytes[CLOCK_LEN..CLOCK_LEN + DIGEST_LEN]);
    let at = CLOCK_LEN + DIGEST_LEN;
    let buckets = usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    check_buckets(buckets)?;
    let expected = DIGESTS_HEADER + buckets * DIGEST_LEN;
    need(bytes, expected)?;
    if bytes.len() > expected {
        return Err(ObjectError::Trailing(bytes.len() - expected).into());
    }
    let digests = bytes[DIGESTS_HEADER..]
        .chunks_exact(DIGEST_LEN)
        .map(|chunk| {
            let mut digest = [0u8; DIGEST_LEN];
            digest.copy_from_slice(chunk);
            u128::from_le_bytes(digest)
        })
        .collect();
    Ok(DigestRequest {
        clock,
        placement,
        digests,
    })
}

/// One listed entry: a key, its stamp and its content length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// Its version and hash.
    pub stamp: Stamp,
    /// Its content length in bytes, as the lister claims (used to budget pulls).
    pub len: u32,
}

/// The entries of one listed bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketEntries {
    /// The bucket.
    pub bucket: usize,
    /// Whether every entry the lister holds in the bucket is listed.
    pub complete: bool,
    /// The entries, in any order.
    pub entries: Vec<Entry>,
}

/// The differing buckets to list, from `start` (wrapping) in ascending order, as many as fit in
/// `limits` by the entry counts and bytes of `mine`; at least one when any differs. The second
/// value is whether differing buckets were left out.
pub fn select_buckets(
    mine: &Summary,
    theirs: &[Digest],
    start: usize,
    limits: ExchangeLimits,
) -> Result<(Vec<usize>, bool), EntropyError> {
    let buckets = mine.buckets();
    if theirs.len() != buckets {
        return Err(EntropyError::BucketCount(theirs.len()));
    }
    let mut chosen = Vec::new();
    let (mut entries, mut bytes) = (0usize, CLOCK_LEN + 1 + 2);
    for offset in 0..buckets {
        let bucket = (start + offset) % buckets;
        if mine.digests[bucket] == theirs[bucket] {
            continue;
        }
        let count = mine.count(bucket).min(limits.window());
        let widest = ENTRY_OVERHEAD + MAX_KEY_LEN;
        let size = BUCKET_HEADER + (mine.bytes[bucket] as usize).min(count * widest);
        if !chosen.is_empty()
            && (entries + count > limits.max_entries || bytes + size > limits.max_bytes)
        {
            return Ok((chosen, true));
        }
        chosen.push(bucket);
        entries += count;
        bytes += size;
    }
    Ok((chosen, false))
}

/// Encodes an answer listing `buckets`, sent at hybrid time `clock`. Entries beyond `limits`
/// are left out and their bucket is marked incomplete.
pub fn encode_entries(clock: u64, buckets: &[BucketEntries], limits: ExchangeLimits) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&clock.to_le_bytes());
    out.push(0);
    let count_at = out.len();
    out.extend_from_slice(&0u16.to_le_bytes());
    let mut listed_buckets = 0u16;
    let mut listed_entries = 0usize;
    for bucket in buckets {
        if out.len() + BUCKET_HEADER > limits.max_bytes || listed_buckets == u16::MAX {
            break;
        }
        let header_at = out.len();
        out.extend_from_slice(&(bucket.bucket as u16).to_le_bytes());
        out.push(0);
        out.extend_from_slice(&0u16.to_le_bytes());
        let mut listed = 0u16;
        for entry in &bucket.entries {
            let size = ENTRY_OVERHEAD + entry.key.len();
            if listed_entries == limits.max_entries
                || out.len() + size > limits.max_bytes
                || listed == u16::MAX
            {
                break;
            }
            out.extend_from_slice(&(entry.key.len() as u16).to_le_bytes());
            out.extend_from_slice(entry.key.as_bytes());
            write_stamp(&mut out, &entry.stamp);
            out.extend_from_slice(&entry.len.to_le_bytes());
            listed += 1;
            listed_entries += 1;
        }
        let complete = bucket.complete && usize::from(listed) == bucket.entries.len();
        out[header_at + 2] = u8::from(complete);
        out[header_at + 3..header_at + 5].copy_from_slice(&listed.to_le_bytes());
        listed_buckets += 1;
    }
    out[count_at..count_at + 2].copy_from_slice(&listed_buckets.to_le_bytes());
    out
}

/// An answer refusing a digest message for `reason`, sent at hybrid time `clock`.
pub fn encode_entries_refusal(clock: u64, reason: Refusal) -> Vec<u8> {
    super::object::encode_refusal(clock, reason)
}

fn read_u16(bytes: &[u8], at: usize) -> Result<usize, EntropyError> {
    need(bytes, at + 2)?;
    Ok(usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])))
}

/// Decodes an answer to a digest message of `buckets` buckets: every listed bucket is inside the
/// range, in ascending order from the first (wrapping once), each key is valid and in its bucket,
/// and the answer is within `limits`.
pub fn decode_entries(
    bytes: &[u8],
    buckets: usize,
    limits: ExchangeLimits,
) -> Result<Answer<Vec<BucketEntries>>, EntropyError> {
    check_buckets(buckets)?;
    let clock = read_u64(bytes)?;
    need(bytes, CLOCK_LEN + 1)?;
    match bytes[CLOCK_LEN] {
        0 => {}
        REFUSED => {
            return Ok(Answer {
                clock,
                answer: Err(decode_refusal(&bytes[CLOCK_LEN + 1..])?),
            })
        }
        other => return Err(ObjectError::UnknownTag(other).into()),
    }
    if bytes.len() > limits.max_bytes {
        return Err(EntropyError::TooLarge {
            entries: 0,
            bytes: bytes.len(),
        });
    }
    let listed = read_u16(bytes, CLOCK_LEN + 1)?;
    if listed > buckets {
        return Err(EntropyError::BucketRange {
            bucket: listed,
            buckets,
        });
    }
    let mut at = CLOCK_LEN + 1 + 2;
    let mut out = Vec::with_capacity(listed);
    let mut total = 0usize;
    let mut wrapped = false;
    for _ in 0..listed {
        let bucket = read_u16(bytes, at)?;
        need(bytes, at + BUCKET_HEADER)?;
        let complete = match bytes[at + 2] {
            0 => false,
            1 => true,
            other => return Err(ObjectError::UnknownTag(other).into()),
        };
        let count = read_u16(bytes, at + 3)?;
        at += BUCKET_HEADER;
        let in_order = match out.last() {
            None => true,
            Some(BucketEntries {
                bucket: previous, ..
            }) if bucket > *previous => !wrapped || bucket < out[0].bucket,
            Some(_) if !wrapped && bucket < out[0].bucket => {
                wrapped = true;
                true
            }
            Some(_) => false,
        };
        if bucket >= buckets || !in_order {
            return Err(EntropyError::BucketRange { bucket, buckets });
        }
        total += count;
        if total > limits.max_entries {
            return Err(EntropyError::TooLarge {
                entries: total,
                bytes: bytes.len(),
            });
        }
        // Each entry takes at least its overhead plus one key byte: check before allocating.
        need(bytes, at + count * (ENTRY_OVERHEAD + 1))?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let key_len = read_u16(bytes, at)?;
            if key_len > MAX_KEY_LEN {
                return Err(ObjectError::InvalidKey("longer than 256 bytes").into());
            }
            at += 2;
            need(bytes, at + key_len + STAMP_LEN + 4)?;
            let key = std::str::from_utf8(&bytes[at..at + key_len])
                .map_err(|_| ObjectError::InvalidKey("not UTF-8"))?;
            validate_key(key)?;
            if bucket_of(key, buckets) != bucket {
                return Err(EntropyError::BucketRange { bucket, buckets });
            }
            at += key_len;
            let stamp = read_stamp(&bytes[at..])?;
            at += STAMP_LEN;
            let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            at += 4;
            entries.push(Entry {
                key: key.to_string(),
                stamp,
                len,
            });
        }
        out.push(BucketEntries {
            bucket,
            complete,
            entries,
        });
    }
    if at != bytes.len() {
        return Err(ObjectError::Trailing(bytes.len() - at).into());
    }
    Ok(Answer {
        clock,
        answer: Ok(out),
    })
}

/// What an exchange repairs: copies to pull from the peer (with the stamp and length it listed)
/// and keys whose own copy to push to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Listed copies that win over this node's (or that it lacks).
    pub pull: Vec<Entry>,
    /// This node's copies that win over the listed ones, or that a complete bucket lacks.
    pub push: Vec<(String, Stamp)>,
}

/// Compares the listed buckets with this node's entries in them (`mine`, by bucket; a bucket
/// missing from `mine` is empty here).
pub fn reconcile(
    listed: &[BucketEntries],
    mine: &BTreeMap<usize, Vec<(String, Stamp)>>,
) -> Repairs {
    let mut repairs = Repairs::default();
    let empty = Vec::new();
    for bucket in listed {
        let own: BTreeMap<&str, Stamp> = mine
            .get(&bucket.bucket)
            .unwrap_or(&empty)
            .iter()
            .map(|(key, stamp)| (key.as_str(), *stamp))
            .collect();
        let mut theirs: BTreeMap<&str, Stamp> = BTreeMap::new();
        for entry in &bucket.entries {
            // A key listed twice counts once, with its winning stamp.
            let slot = theirs.entry(&entry.key).or_insert(entry.stamp);
            if wins(&entry.stamp, slot) {
                *slot = entry.stamp;
            }
        }
        for entry in &bucket.entries {
            if theirs.get(entry.key.as_str()) != Some(&entry.stamp)
                || repairs.pull.iter().any(|p| p.key == entry.key)
            {
                continue;
            }
            if own
                .get(entry.key.as_str())
                .is_none_or(|own| wins(&entry.stamp, own))
            {
                repairs.pull.push(entry.clone());
            }
        }
        for (key, stamp) in &own {
            let push = match theirs.get(key) {
                Some(listed) => wins(stamp, listed),
                None => bucket.complete,
            };
            if push {
                repairs.push.push((key.to_string(), *stamp));
            }
        }
    }
    repairs
}

#[cfg(test)]
mod tests;
