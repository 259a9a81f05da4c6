//! Record a history of object operations (writes, conditional writes, reads) and check it: no
//! acknowledged write lost, no torn or mixed content, replicas converged, no stale quorum reads.
//!
//! # Design
//!
//! Every write carries content that names itself: `key|writer|seq|len|` followed by filler drawn
//! from a seed of that header ([`write_content`]), so a read's content either parses and
//! regenerates byte for byte ([`identify`]) or is torn, mixed or foreign. `writer` is unique per
//! client incarnation, so `(key, writer, seq)` names one write.
//!
//! The recorder ([`History`]) is pure: callers pass the virtual times at which an operation was
//! invoked and completed. An operation that never completes (its host crashed) keeps
//! `completed: None`; a write's outcome is then unknown, as is a `503 quorum_not_reached` write.
//! Outcomes follow the object API (`crates/objects`, `# Design`): `201` = acknowledged (durable on
//! W replicas) with its stamp; `412`, `409` and a conditional write's `not_applied` mean nothing
//! was written; anything else is unknown (it may still apply).
//!
//! [`check`] takes the history and the state after healing ([`Healed`]: each node's quorum read
//! of every key, and each replica's local copy) and reports every [`Violation`]:
//!
//! 1. *Lost write*: after healing, a read of a key returns a copy that loses (by the store's rule:
//!    higher version, then smaller hash) to some acknowledged write of that key, or nothing, or
//!    fails.
//! 2. *Torn or foreign content*: a read (during the run or after) or a replica's local copy whose
//!    content does not hash to its stamp, does not regenerate from its header, names another key,
//!    names no write of the history, names a write that was answered "nothing was written", or
//!    shows a write's content under a stamp other than the one its `201` reported.
//! 3. *Divergence*: after healing, the replicas of a key do not all hold the same copy, or the
//!    quorum reads through different nodes disagree with them.
//! 4. *Stale read*: a read that succeeded during the run returned a version below that of a
//!    write of the key acknowledged before the read was invoked (or nothing). The object API
//!    promises this with `W + read quorum > R`: a `201` means W replicas hold the copy durably, a
//!    read asks replicas until `read quorum` answered and merges to the highest version, so the
//!    two sets share a replica; no replica ever replaces a copy with an older one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use meshwire_objects::proto::entropy::wins;
use meshwire_objects::proto::object::{content_hash, Stamp};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use crate::lab::derive_seed;

/// One write, by key, writer and sequence number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId {
    /// The key written.
    pub key: String,
    /// The client incarnation that wrote it.
    pub writer: String,
    /// Its sequence number at that writer.
    pub seq: u64,
}

impl fmt::Display for WriteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}#{}", self.key, self.writer, self.seq)
    }
}

/// The content of write `id`, `len` bytes long (at least its header).
pub fn write_content(id: &WriteId, len: usize) -> Bytes {
    let header = format!("{}|{}|{}|", id.key, id.writer, id.seq);
    // The length is part of the header, so a truncated copy does not regenerate; 24 bytes more
    // than the rest of the header leave room for the length's own digits.
    let len = len.max(header.len() + 24);
    let header = format!("{header}{len}|");
    let mut content = Vec::with_capacity(len);
    content.extend_from_slice(header.as_bytes());
    let mut filler = vec![0u8; len - header.len()];
    SmallRng::seed_from_u64(derive_seed(0, &header, 0)).fill_bytes(&mut filler);
    content.extend_from_slice(&filler);
    Bytes::from(content)
}

/// Why content is not one whole write of its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContentError {
    /// The header does not parse.
    #[error("no write header")]
    NoHeader,
    /// The header names another key.
    #[error("content of key {0:?}")]
    OtherKey(String),
    /// The content is not what its header's write wrote (torn, truncated or mixed).
    #[error("content does not regenerate from its header ({0})")]
    Torn(WriteId),
    /// The content does not hash to the stamp it came with.
    #[error("content hash does not match its stamp")]
    HashMismatch,
}

/// Which write of `key` `content` is, if it is one whole write of that key.
pub fn identify(key: &str, content: &[u8]) -> Result<WriteId, ContentError> {
    let mut fields = content.splitn(5, |byte| *byte == b'|');
    let mut field = || {
        fields
            .next()
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .ok_or(ContentError::NoHeader)
    };
    let (named, writer, seq, len) = (field()?, field()?, field()?, field()?);
    let seq: u64 = seq.parse().map_err(|_| ContentError::NoHeader)?;
    let len: usize = len.parse().map_err(|_| ContentError::NoHeader)?;
    if named != key {
        return Err(ContentError::OtherKey(named.to_string()));
    }
    let id = WriteId {
        key: key.to_string(),
        writer: writer.to_string(),
        seq,
    };
    if len != content.len() || write_content(&id, len) != content {
        return Err(ContentError::Torn(id));
    }
    Ok(id)
}

/// What a read saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A copy, and which write its content is (or why it is none).
    Copy {
        /// The copy's stamp.
        stamp: Stamp,
        /// The write its content is.
        write: Result<WriteId, ContentError>,
    },
    /// No replica holds the key.
    NotFound,
    /// The read failed (no quorum, no content, ...).
    Failed(String),
}

impl Seen {
    /// What a read of `key` that returned `stamp` and `content` saw.
    pub fn copy(key: &str, stamp: Stamp, content: &[u8]) -> Self {
        let write = if content_hash(content) == stamp.hash {
            identify(key, content)
        } else {
            Err(ContentError::HashMismatch)
        };
        Seen::Copy { stamp, write }
    }
}

/// How a write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteResult {
    /// `201`: durable on W replicas with this stamp.
    Acked(Stamp),
    /// Nothing was written (`412`, `409`, a conditional write's `not_applied`).
    NotApplied(&'static str),
    /// It may or may not have applied (`503 quorum_not_reached`, another error).
    Unknown(&'static str),
}

/// What an operation was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// A write (conditional or not) and, once it completed, how it ended.
    Write {
        /// The write.
        id: WriteId,
        /// Whether it was a compare-and-set.
        conditional: bool,
        /// How it ended (`None`: it never completed).
        result: Option<WriteResult>,
    },
    /// A read and, once it completed, what it saw.
    Read {
        /// What it saw (`None`: it never completed).
        seen: Option<Seen>,
    },
}

/// One operation of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The node it went through.
    pub node: String,
    /// The key.
    pub key: String,
    /// When it was invoked (virtual time since the run started).
    pub invoked: Duration,
    /// When it completed.
    pub completed: Option<Duration>,
    /// What it was and how it ended.
    pub kind: OpKind,
}

/// A history of operations, recorded as they are invoked and complete.
#[derive(Debug, Clone, Default)]
pub struct History {
    ops: Vec<Op>,
}

impl History {
    /// Records a write invoked at `at`; returns its index for [`History::complete_write`].
    pub fn invoke_write(
        &mut self,
        node: &str,
        id: WriteId,
        conditional: bool,
        at: Duration,
    ) -> usize {
        self.ops.push(Op {
            node: node.to_string(),
            key: id.key.clone(),
            invoked: at,
            completed: None,
            kind: OpKind::Write {
                id,
                conditional,
                result: None,
            },
        });
        self.ops.len() - 1
    }

    /// Records how write `index` ended, at `at`.
    pub fn complete_write(&mut self, index: usize, outcome: WriteResult, at: Duration) {
        if let Some(op) = self.ops.get_mut(index) {
            if let OpKind::Write { result, .. } = &mut op.kind {
                *result = Some(outcome);
                op.completed = Some(at);
            }
        }
    }

    /// Records a read of `key` invoked at `at`; returns its index for [`History::complete_read`].
    pub fn invoke_read(&mut self, node: &str, key: &str, at: Duration) -> usize {
        self.ops.push(Op {
            node: node.to_string(),
            key: key.to_string(),
            invoked: at,
            completed: None,
            kind: OpKind::Read { seen: None },
        });
        self.ops.len() - 1
    }

    /// Records what read `index` saw, at `at`.
    pub fn complete_read(&mut self, index: usize, outcome: Seen, at: Duration) {
        if let Some(op) = self.ops.get_mut(index) {
            if let OpKind::Read { seen } = &mut op.kind {
                *seen = Some(outcome);
                op.completed = Some(at);
            }
        }
    }

    /// Every operation, in invocation order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// How many operations ended how: `write/acked`, `cas/not_applied:412`, `read/copy`, ...
    pub fn tally(&self) -> BTreeMap<String, usize> {
        let mut tally = BTreeMap::new();
        for op in &self.ops {
            let name = match &op.kind {
                OpKind::Write {
                    conditional,
                    result,
                    ..
                } => {
                    let kind = if *conditional { "cas" } else { "write" };
                    let outcome = match result {
                        None => "unknown:never_completed".to_string(),
                        Some(WriteResult::Acked(_)) => "acked".to_string(),
                        Some(WriteResult::NotApplied(why)) => format!("not_applied:{why}"),
                        Some(WriteResult::Unknown(why)) => format!("unknown:{why}"),
                    };
                    format!("{kind}/{outcome}")
                }
                OpKind::Read { seen } => match seen {
                    None => "read/never_completed".to_string(),
                    Some(Seen::Copy { .. }) => "read/copy".to_string(),
                    Some(Seen::NotFound) => "read/not_found".to_string(),
                    Some(Seen::Failed(_)) => "read/failed".to_string(),
                },
            };
            *tally.entry(name).or_insert(0) += 1;
        }
        tally
    }
}

/// The state after healing: what each node's quorum read of every key saw, and each replica's
/// local copy of every key.
#[derive(Debug, Clone, Default)]
pub struct Healed {
    /// `(node, key)` → what a quorum read through that node saw.
    pub reads: BTreeMap<(String, String), Seen>,
    /// `key` → `(replica, its local copy: None when it holds none)`.
    pub replicas: BTreeMap<String, Vec<(String, Option<Seen>)>>,
}

/// A broken promise the checker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// After healing, a read through `node` returned `seen`, which loses to acknowledged `write`.
    LostWrite {
        /// The acknowledged write that lost.
        write: WriteId,
        /// Its stamp.
        stamp: Stamp,
        /// Through which node it was read.
        node: String,
        /// What that read saw.
        seen: Seen,
    },
    /// A read or local copy whose content is not a whole write that may have applied.
    BadContent {
        /// Where: `read n1 @ 12.345s`, `healed read n2`, `replica n3`.
        at: String,
        /// The key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// After healing, the replicas (or the nodes' reads) of `key` disagree.
    Diverged {
        /// The key.
        key: String,
        /// What each one holds or read.
        copies: Vec<(String, Option<Stamp>)>,
    },
    /// A read during the run returned something older than a write acknowledged before it began.
    StaleRead {
        /// The node read through.
        node: String,
        /// The key.
        key: String,
        /// When the read was invoked.
        invoked: Duration,
        /// What it saw (`None`: not found).
        seen: Option<Stamp>,
        /// The acknowledged write it missed.
        write: WriteId,
        /// That write's stamp.
        stamp: Stamp,
        /// When that write was acknowledged.
        acked: Duration,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::LostWrite {
                write,
                stamp,
                node,
                seen,
            } => write!(
                f,
                "lost write {write} (version {}): after healing {node} read {seen:?}",
                stamp.version
            ),
            Violation::BadContent { at, key, reason } => {
                write!(f, "bad content of {key} ({at}): {reason}")
            }
            Violation::Diverged { key, copies } => {
                write!(f, "{key} diverged after healing:")?;
                for (holder, stamp) in copies {
                    write!(f, " {holder}={:?}", stamp.map(|stamp| stamp.version))?;
                }
                Ok(())
            }
            Violation::StaleRead {
                node,
                key,
                invoked,
                seen,
                write,
                stamp,
                acked,
            } => write!(
                f,
                "stale read of {key} through {node} at {:.3}s: version {:?}, but {write} \
                 (version {}) was acknowledged at {:.3}s",
                invoked.as_secs_f64(),
                seen.map(|stamp| stamp.version),
                stamp.version,
                acked.as_secs_f64()
            ),
        }
    }
}

/// What the checker found, and how much it looked at.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Every violation.
    pub violations: Vec<Violation>,
    /// Keys with at least one acknowledged write (checked for loss).
    pub keys_with_acked_writes: usize,
    /// Reads during the run that returned and were checked for staleness.
    pub reads_checked: usize,
    /// Copies checked for torn or foreign content (reads and local copies).
    pub copies_checked: usize,
    /// Keys whose replicas were compared.
    pub keys_compared: usize,
}

/// Checks `history` and the `healed` state (see the module's `# Design`).
pub fn check(history: &History, healed: &Healed) -> CheckReport {
    let mut report = CheckReport::default();
    // Every write of the history by id, and the acknowledged ones by key.
    let mut writes: BTreeMap<&WriteId, Option<WriteResult>> = BTreeMap::new();
    let mut acked: BTreeMap<&str, Vec<(&WriteId, Stamp, Duration)>> = BTreeMap::new();
    for op in history.ops() {
        if let OpKind::Write { id, result, .. } = &op.kind {
            writes.insert(id, *result);
            if let (Some(WriteResult::Acked(stamp)), Some(completed)) = (result, op.completed) {
                acked
                    .entry(op.key.as_str())
                    .or_default()
                    .push((id, *stamp, completed));
            }
        }
    }
    report.keys_with_acked_writes = acked.len();

    // (2) Whole content of a write that may have applied, under that write's stamp.
    let check_content = |report: &mut CheckReport, at: String, key: &str, seen: &Seen| {
        let Seen::Copy { stamp, write } = seen else {
            return;
        };
        report.copies_checked += 1;
        let reason = match write {
            Err(error) => Some(error.to_string()),
            Ok(id) => match writes.get(id) {
                None => Some(format!("{id} is no write of the history")),
                Some(Some(WriteResult::NotApplied(why))) => {
                    Some(format!("{id} was answered {why}: nothing was written"))
                }
                Some(Some(WriteResult::Acked(acked))) if acked != stamp => Some(format!(
                    "{id} was acknowledged as version {}, seen as version {}",
                    acked.version, stamp.version
                )),
                Some(_) => None,
            },
        };
        if let Some(reason) = reason {
            report.violations.push(Violation::BadContent {
                at,
                key: key.to_string(),
                reason,
            });
        }
    };
    for op in history.ops() {
        if let OpKind::Read { seen: Some(seen) } = &op.kind {
            let at = format!("read {} @ {:.3}s", op.node, op.invoked.as_secs_f64());
            check_content(&mut report, at, &op.key, seen);
        }
    }
    for ((node, key), seen) in &healed.reads {
        check_content(&mut report, format!("healed read {node}"), key, seen);
    }
    for (key, holders) in &healed.replicas {
        for (replica, copy) in holders {
            if let Some(seen) = copy {
                check_content(&mut report, format!("replica {replica}"), key, seen);
            }
        }
    }

    // (4) No read older than a write acknowledged before it began.
    for op in history.ops() {
        let OpKind::Read { seen: Some(seen) } = &op.kind else {
            continue;
        };
        let version = match seen {
            Seen::Copy { stamp, .. } => Some(*stamp),
            Seen::NotFound => None,
            Seen::Failed(_) => continue,
        };
        report.reads_checked += 1;
        let missed = acked
            .get(op.key.as_str())
            .into_iter()
            .flatten()
            .filter(|(_, stamp, completed)| {
                *completed < op.invoked && version.is_none_or(|seen| seen.version < stamp.version)
            })
            .max_by_key(|(_, stamp, _)| stamp.version);
        if let Some((id, stamp, completed)) = missed {
            report.violations.push(Violation::StaleRead {
                node: op.node.clone(),
                key: op.key.clone(),
                invoked: op.invoked,
                seen: version,
                write: (*id).clone(),
                stamp: *stamp,
                acked: *completed,
            });
        }
    }

    // (1) After healing, every read returns the newest acknowledged write or one that wins over it.
    for ((node, key), seen) in &healed.reads {
        let newest = acked
            .get(key.as_str())
            .into_iter()
            .flatten()
            .max_by(|a, b| {
                if wins(&a.1, &b.1) {
                    std::cmp::Ordering::Greater
                } else if a.1 == b.1 {
                    std::cmp::Ordering::Equal
                } else {
                    std::cmp::Ordering::Less
                }
            });
        let Some((id, stamp, _)) = newest else {
            continue;
        };
        let holds =
            matches!(seen, Seen::Copy { stamp: got, .. } if got == stamp || wins(got, stamp));
        if !holds {
            report.violations.push(Violation::LostWrite {
                write: (*id).clone(),
                stamp: *stamp,
                node: node.clone(),
                seen: seen.clone(),
            });
        }
    }

    // (3) Every replica of a key holds the same copy, and every node read that copy.
    let keys: BTreeSet<&String> = healed
        .replicas
        .keys()
        .chain(healed.reads.keys().map(|(_, key)| key))
        .collect();
    for key in keys {
        let stamp_of = |seen: &Seen| match seen {
            Seen::Copy { stamp, .. } => Some(*stamp),
            _ => None,
        };
        let mut copies: Vec<(String, Option<Stamp>)> = healed
            .replicas
            .get(key)
            .into_iter()
            .flatten()
            .map(|(replica, copy)| {
                (
                    format!("replica {replica}"),
                    copy.as_ref().and_then(stamp_of),
                )
            })
            .collect();
        copies.extend(
            healed
                .reads
                .iter()
                .filter(|((_, read_key), _)| read_key == key)
                .map(|((node, _), seen)| (format!("read {node}"), stamp_of(seen))),
        );
        report.keys_compared += 1;
        if copies.windows(2).any(|pair| pair[0].1 != pair[1].1) {
            report.violations.push(Violation::Diverged {
                key: key.clone(),
                copies,
            });
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str, writer: &str, seq: u64) -> WriteId {
        WriteId {
            key: key.into(),
            writer: writer.into(),
            seq,
        }
    }

    fn stamp(version: u64, content: &[u8]) -> Stamp {
        Stamp {
            version,
            hash: content_hash(content),
        }
    }

    #[test]
    fn content_names_its_write_and_nothing_torn_passes() {
        let write = id("k1", "n0.1", 7);
        let content = write_content(&write, 300);
        assert_eq!(content.len(), 300);
        assert_eq!(identify("k1", &content), Ok(write.clone()));
        assert_eq!(
            identify("k2", &content),
            Err(ContentError::OtherKey("k1".into()))
        );
        assert_eq!(
            identify("k1", &content[..299]),
            Err(ContentError::Torn(write.clone()))
        );
        // The head of one write and the tail of another of the same length.
        let other = write_content(&id("k1", "n0.1", 8), 300);
        let mut mixed = content[..150].to_vec();
        mixed.extend_from_slice(&other[150..]);
        assert_eq!(identify("k1", &mixed), Err(ContentError::Torn(write)));
        assert_eq!(identify("k1", b"garbage"), Err(ContentError::NoHeader));
    }

    /// A history of one key: write a acked at v10, write b acked at v20, a failed CAS c.
    fn history() -> (History, [Bytes; 3], [Stamp; 2]) {
        let (a, b, c) = (id("k", "n0.1", 1), id("k", "n1.1", 1), id("k", "n2.1", 1));
        let contents = [
            write_content(&a, 100),
            write_content(&b, 100),
            write_content(&c, 100),
        ];
        let stamps = [stamp(10, &contents[0]), stamp(20, &contents[1])];
        let mut history = History::default();
        let s = Duration::from_secs;
        let w = history.invoke_write("n0", a, false, s(1));
        history.complete_write(w, WriteResult::Acked(stamps[0]), s(2));
        let w = history.invoke_write("n1", b, false, s(3));
        history.complete_write(w, WriteResult::Acked(stamps[1]), s(4));
        let w = history.invoke_write("n2", c, true, s(5));
        history.complete_write(w, WriteResult::NotApplied("412"), s(6));
        (history, contents, stamps)
    }

    fn healed(seen: &Seen, replicas: &[Option<Seen>]) -> Healed {
        let mut healed = Healed::default();
        for node in ["n0", "n1"] {
            healed.reads.insert((node.into(), "k".into()), seen.clone());
        }
        healed.replicas.insert(
            "k".into(),
            replicas
                .iter()
                .enumerate()
                .map(|(index, copy)| (format!("n{index}"), copy.clone()))
                .collect(),
        );
        healed
    }

    #[test]
    fn a_converged_history_passes() {
        let (history, contents, stamps) = history();
        let newest = Seen::copy("k", stamps[1], &contents[1]);
        let report = check(
            &history,
            &healed(&newest, &[Some(newest.clone()), Some(newest.clone())]),
        );
        assert_eq!(report.violations, vec![]);
        assert_eq!(report.keys_with_acked_writes, 1);
        assert_eq!(report.keys_compared, 1);
        assert_eq!(report.copies_checked, 4);
    }

    #[test]
    fn finds_a_lost_write_and_divergence() {
        let (history, contents, stamps) = history();
        let older = Seen::copy("k", stamps[0], &contents[0]);
        let newest = Seen::copy("k", stamps[1], &contents[1]);
        let report = check(
            &history,
            &healed(&older, &[Some(older.clone()), Some(newest)]),
        );
        let lost = report
            .violations
            .iter()
            .filter(|v| matches!(v, Violation::LostWrite { write, .. } if write.writer == "n1.1"))
            .count();
        assert_eq!(lost, 2, "{:?}", report.violations);
        assert!(report
            .violations
            .iter()
            .any(|v| matches!(v, Violation::Diverged { .. })));
    }

    #[test]
    fn finds_torn_foreign_and_not_applied_content() {
        let (mut history, contents, stamps) = history();
        let s = Duration::from_secs;
        // A read returns the failed CAS's content, another a torn copy, another a wrong hash.
        let cas = Seen::copy("k", stamp(30, &contents[2]), &contents[2]);
        let torn = contents[1][..90].to_vec();
        let reads = [
            cas,
            Seen::copy("k", stamp(20, &torn), &torn),
            Seen::copy("k", stamps[0], &contents[1]),
        ];
        for seen in reads {
            let r = history.invoke_read("n3", "k", s(7));
            history.complete_read(r, seen, s(8));
        }
        let newest = Seen::copy("k", stamps[1], &contents[1]);
        let report = check(&history, &healed(&newest, &[Some(newest.clone())]));
        let bad: Vec<&Violation> = report
            .violations
            .iter()
            .filter(|v| matches!(v, Violation::BadContent { .. }))
            .collect();
        assert_eq!(bad.len(), 3, "{:?}", report.violations);
    }

    #[test]
    fn finds_a_stale_read_but_not_a_concurrent_one() {
        let (mut history, contents, stamps) = history();
        let s = Duration::from_millis;
        // Invoked at 3.5 s, before b was acked at 4 s: the older copy is allowed.
        let r = history.invoke_read("n3", "k", s(3500));
        history.complete_read(r, Seen::copy("k", stamps[0], &contents[0]), s(4500));
        // Invoked at 5 s, after b was acked: the older copy is stale, and so is nothing.
        let r = history.invoke_read("n3", "k", s(5000));
        history.complete_read(r, Seen::copy("k", stamps[0], &contents[0]), s(5100));
        let r = history.invoke_read("n4", "k", s(5000));
        history.complete_read(r, Seen::NotFound, s(5100));
        let newest = Seen::copy("k", stamps[1], &contents[1]);
        let report = check(&history, &healed(&newest, &[Some(newest.clone())]));
        let stale: Vec<&Violation> = report
            .violations
            .iter()
            .filter(|v| matches!(v, Violation::StaleRead { .. }))
            .collect();
        assert_eq!(stale.len(), 2, "{:?}", report.violations);
        assert_eq!(report.reads_checked, 3);
    }
}
