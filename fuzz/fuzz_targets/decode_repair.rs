//! Fuzz the batch repair path in `meshwire_proto::batch::repair` with bytes a hostile peer could
//! send: recovery shard datagrams and stream pieces in any order.
//!
//! Input layout: a sequence of operations, each `[op][len u16 LE][bytes (len)]`:
//! * `op` even: the bytes are a stream piece at the offset in their first two bytes (LE);
//! * `op` odd: the bytes are a repair datagram's payload.
//!
//! Invariants checked (a panic here is a bug):
//! * neither `RepairShard::decode` nor the reassembly panics;
//! * a shard that decodes re-encodes to exactly the bytes it came from;
//! * after an error the reassembly is not used again (as the node stops the stream);
//! * bytes handed on are contiguous from offset 0 and never more than the stream offset
//!   `next_offset` says, and no more than `max_pending` bytes are held after a hole.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use meshwire_proto::batch::repair::{Reassembly, RepairShard};

const MAX_PENDING: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let mut reassembly = Reassembly::new(0, MAX_PENDING, true);
    let mut handed = 0u64;
    let mut rest = data;
    while let [op, a, b, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*a, *b])).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let outcome = if op % 2 == 0 {
            let [x, y, piece @ ..] = bytes else {
                continue;
            };
            let offset = u64::from(u16::from_le_bytes([*x, *y]));
            reassembly.insert(offset, Bytes::copy_from_slice(piece))
        } else {
            let payload = Bytes::copy_from_slice(bytes);
            match RepairShard::decode(payload.clone()) {
                Ok(shard) => {
                    assert_eq!(shard.encode(), payload, "a decoded shard re-encodes differently");
                    reassembly.add_repair(shard)
                }
                Err(error) => Err(error),
            }
        };
        if outcome.is_err() {
            return;
        }
        assert!(reassembly.pending() <= MAX_PENDING);
        while let Some(piece) = reassembly.pop() {
            assert!(!piece.is_empty());
            handed += piece.len() as u64;
        }
        assert_eq!(handed, reassembly.next_offset());
    }
});
