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
mod tests {
    use super::*;
    use crate::proto::object::content_hash;
    use proptest::prelude::*;

    fn stamp(version: u64, content: &[u8]) -> Stamp {
        Stamp {
            version,
            hash: content_hash(content),
        }
    }

    type Model = BTreeMap<String, Stamp>;

    fn summary(store: &Model, buckets: usize) -> Summary {
        let mut summary = Summary::new(buckets).unwrap();
        for (key, stamp) in store {
            summary.add(key, stamp);
        }
        summary
    }

    /// The lister's side, as the driver does it: a window of each chosen bucket from `offset`.
    fn listing(
        store: &Model,
        chosen: &[usize],
        buckets: usize,
        offset: usize,
        limits: ExchangeLimits,
    ) -> Vec<BucketEntries> {
        chosen
            .iter()
            .map(|&bucket| {
                let all: Vec<Entry> = store
                    .iter()
                    .filter(|(key, _)| bucket_of(key, buckets) == bucket)
                    .map(|(key, stamp)| Entry {
                        key: key.clone(),
                        stamp: *stamp,
                        len: 1,
                    })
                    .collect();
                let count = all.len();
                let window = limits.window();
                BucketEntries {
                    bucket,
                    complete: count <= window,
                    entries: all
                        .into_iter()
                        .enumerate()
                        .filter(|(index, _)| in_window(*index, count, offset, window))
                        .map(|(_, entry)| entry)
                        .collect(),
                }
            })
            .collect()
    }

    /// Applies a copy as the store does; checks that no copy is ever replaced by one it beats.
    fn apply(store: &mut Model, key: &str, stamp: Stamp) {
        match store.get(key) {
            Some(old) if !wins(&stamp, old) => {}
            _ => {
                if let Some(old) = store.get(key) {
                    assert!(wins(&stamp, old), "a copy was replaced by one that loses");
                }
                store.insert(key.to_string(), stamp);
            }
        }
    }

    /// One exchange initiated by `a` with `b`, through the encoded messages, as the driver runs
    /// it: `buckets` is the pair's bucket count, doubled after an answer with a bucket cut short.
    /// Returns whether anything differed.
    fn exchange(
        a: &mut Model,
        b: &mut Model,
        buckets: &mut usize,
        start: usize,
        limits: ExchangeLimits,
    ) -> bool {
        let placement = placement_id(&[[1; 32], [2; 32]], 2);
        let count = (*buckets).max(buckets_for(a.len()));
        let request = encode_digests(7, &placement, summary(a, count).digests());
        let request = decode_digests(&request).unwrap();
        assert_eq!(request.placement, placement);
        let theirs = summary(b, count);
        let (chosen, _more) = select_buckets(&theirs, &request.digests, start, limits).unwrap();
        let answer = encode_entries(8, &listing(b, &chosen, count, start, limits), limits);
        let listed = decode_entries(&answer, count, limits)
            .unwrap()
            .answer
            .unwrap();
        if listed.iter().any(|bucket| !bucket.complete) {
            *buckets = (count * 2).min(MAX_BUCKETS);
        }
        let mut mine: BTreeMap<usize, Vec<(String, Stamp)>> = BTreeMap::new();
        for (key, stamp) in a.iter() {
            mine.entry(bucket_of(key, count))
                .or_default()
                .push((key.clone(), *stamp));
        }
        let repairs = reconcile(&listed, &mine);
        for entry in &repairs.pull {
            let held = b[&entry.key];
            apply(a, &entry.key, held);
        }
        for (key, stamp) in &repairs.push {
            apply(b, key, *stamp);
        }
        !chosen.is_empty()
    }

    #[test]
    fn digests_agree_whatever_the_order_and_differ_on_any_change() {
        let mut one = Summary::new(16).unwrap();
        let mut two = Summary::new(16).unwrap();
        let entries: Vec<(String, Stamp)> =
            (0..50).map(|i| (format!("k{i}"), stamp(i, b"x"))).collect();
        for (key, s) in &entries {
            one.add(key, s);
        }
        for (key, s) in entries.iter().rev() {
            two.add(key, s);
        }
        assert_eq!(one, two);
        let mut wide = Summary::new(MAX_BUCKETS).unwrap();
        for (key, s) in &entries {
            wide.add(key, s);
        }
        assert_eq!(
            wide.fold(16).unwrap(),
            one,
            "folding equals summarising in fewer buckets"
        );
        assert_eq!(wide.total(), 50);
        two.add("k50", &stamp(1, b"y"));
        assert_ne!(one.digests(), two.digests());
        let (chosen, more) =
            select_buckets(&two, one.digests(), 0, ExchangeLimits::default()).unwrap();
        assert_eq!(chosen, vec![bucket_of("k50", 16)]);
        assert!(!more);
    }

    #[test]
    fn bad_digest_messages_are_typed_errors() {
        let placement = [9u8; DIGEST_LEN];
        let good = encode_digests(1, &placement, Summary::new(8).unwrap().digests());
        assert_eq!(decode_digests(&good).unwrap().digests.len(), 8);
        for (buckets, _) in [(0u16, ()), (3, ()), (8192, ()), (u16::MAX, ())] {
            let mut bad = good.clone();
            bad[24..26].copy_from_slice(&buckets.to_le_bytes());
            assert_eq!(
                decode_digests(&bad),
                Err(EntropyError::BucketCount(usize::from(buckets)))
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            decode_digests(&long).map_err(|e| e.reason()),
            Err("trailing")
        );
        // Claims 16 buckets, carries 8.
        let mut short = good.clone();
        short[24..26].copy_from_slice(&16u16.to_le_bytes());
        assert_eq!(
            decode_digests(&short).map_err(|e| e.reason()),
            Err("truncated")
        );
        assert_eq!(
            decode_digests(&good[..10]).map_err(|e| e.reason()),
            Err("truncated")
        );
    }

    #[test]
    fn bad_answers_are_typed_errors() {
        let limits = ExchangeLimits::default();
        let key = "k1";
        let bucket = bucket_of(key, 4);
        let listed = |bucket: usize| {
            vec![BucketEntries {
                bucket,
                complete: true,
                entries: vec![Entry {
                    key: key.into(),
                    stamp: stamp(1, b"a"),
                    len: 1,
                }],
            }]
        };
        let good = encode_entries(3, &listed(bucket), limits);
        assert_eq!(
            decode_entries(&good, 4, limits).unwrap().answer.unwrap(),
            listed(bucket)
        );
        // The key is listed in a bucket it does not hash to.
        let wrong = encode_entries(3, &listed((bucket + 1) % 4), limits);
        assert_eq!(
            decode_entries(&wrong, 4, limits).map_err(|e| e.reason()),
            Err("bucket_range")
        );
        // A bucket beyond the range.
        let beyond = encode_entries(
            3,
            &[BucketEntries {
                bucket: 7,
                complete: true,
                entries: Vec::new(),
            }],
            limits,
        );
        assert_eq!(
            decode_entries(&beyond, 4, limits),
            Err(EntropyError::BucketRange {
                bucket: 7,
                buckets: 4
            })
        );
        // An absurd entry count is refused before anything is allocated.
        let mut absurd = good.clone();
        absurd[14..16].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            decode_entries(&absurd, 4, limits).map_err(|e| e.reason()),
            Err("too_large")
        );
        let small = ExchangeLimits {
            max_entries: 100_000,
            max_bytes: 1 << 20,
        };
        assert_eq!(
            decode_entries(&absurd, 4, small).map_err(|e| e.reason()),
            Err("truncated")
        );
        // The same bucket twice.
        let mut twice = listed(bucket);
        twice.extend(listed(bucket));
        let twice = encode_entries(3, &twice, limits);
        assert_eq!(
            decode_entries(&twice, 4, limits).map_err(|e| e.reason()),
            Err("bucket_range")
        );
        let refused = encode_entries_refusal(5, Refusal::NotMember);
        assert_eq!(
            decode_entries(&refused, 4, limits).unwrap().answer,
            Err(Refusal::NotMember)
        );
    }

    #[test]
    fn a_bucket_over_the_limit_is_listed_incomplete_and_pushes_nothing_it_lacks() {
        let limits = ExchangeLimits {
            max_entries: 2,
            max_bytes: 1 << 20,
        };
        let entries = (0..5)
            .map(|i| Entry {
                key: format!("k{i}"),
                stamp: stamp(1, b"a"),
                len: 1,
            })
            .collect();
        let answer = encode_entries(
            1,
            &[BucketEntries {
                bucket: 0,
                complete: true,
                entries,
            }],
            limits,
        );
        let listed = decode_entries(&answer, 1, limits).unwrap().answer.unwrap();
        assert_eq!(listed[0].entries.len(), 2);
        assert!(!listed[0].complete);
        let mine = BTreeMap::from([(0, vec![("k4".to_string(), stamp(1, b"a"))])]);
        let repairs = reconcile(&listed, &mine);
        assert!(repairs.push.is_empty(), "{repairs:?}");
        assert_eq!(repairs.pull.len(), 2);
    }

    #[test]
    fn equal_versions_with_different_hashes_settle_on_the_smaller_hash() {
        let (x, y) = (stamp(5, b"x"), stamp(5, b"y"));
        let small = if x.hash < y.hash { x } else { y };
        let large = if x.hash < y.hash { y } else { x };
        let mut a = Model::from([("k".to_string(), large)]);
        let mut b = Model::from([("k".to_string(), small)]);
        exchange(&mut a, &mut b, &mut 1, 0, ExchangeLimits::default());
        assert_eq!((a["k"], b["k"]), (small, small));
    }

    fn models() -> impl Strategy<Value = Model> {
        proptest::collection::btree_map("[a-e][0-9]", (0u64..6, 0u8..3), 0..40).prop_map(|map| {
            map.into_iter()
                .map(|(key, (version, content))| (key, stamp(version, &[content])))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn two_random_stores_converge_to_the_winning_copies(
            a in models(), b in models(), seed in any::<u64>(), max_entries in 1usize..8,
        ) {
            use rand::{Rng, SeedableRng};
            let limits = ExchangeLimits { max_entries, max_bytes: 1 << 20 };
            let mut expected = a.clone();
            for (key, s) in &b {
                apply(&mut expected, key, *s);
            }
            let (mut a, mut b) = (a, b);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let (mut ab, mut ba) = (1, 1);
            // Each exchange repairs at most `max_entries` keys a way: 80 keys need 80 rounds.
            let mut converged = false;
            for round in 0..400 {
                let start = rng.random_range(0..4096);
                let differed = if round % 2 == 0 {
                    exchange(&mut a, &mut b, &mut ab, start, limits)
                } else {
                    exchange(&mut b, &mut a, &mut ba, start, limits)
                };
                if !differed && a == b {
                    converged = true;
                    break;
                }
            }
            prop_assert!(converged, "no convergence in 400 exchanges");
            prop_assert_eq!(&a, &expected);
            prop_assert_eq!(&b, &expected);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                                buckets in 0usize..5000) {
            let _ = decode_digests(&bytes);
            let _ = decode_entries(&bytes, buckets, ExchangeLimits::default());
        }
    }
}
