//! `send_many` encodes once: the call allocates far less than one payload, and every peer gets
//! the same bytes.

mod support;

use bytes::Bytes;
use meshwire::ProtocolId;
use meshwire_alloc_count::{thread_counts, CountingAllocator};
use support::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const FANOUT: ProtocolId = ProtocolId(7);
const PAYLOAD_BYTES: usize = 1024 * 1024;

#[tokio::test]
async fn send_many_allocates_less_than_one_payload_and_delivers_identical_bytes() {
    let sender = start(1);
    let receivers: Vec<_> = (10..18).map(start).collect();
    let mut inboxes = Vec::new();
    for receiver in &receivers {
        inboxes.push(receiver.subscribe(FANOUT).unwrap());
        connect(&sender, receiver).await;
    }
    let ids: Vec<_> = receivers.iter().map(|node| node.peer_id()).collect();
    let payload: Bytes = (0..PAYLOAD_BYTES).map(|i| (i * 31 % 251) as u8).collect();
    // Warm the per-peer queues so the measured call sees steady state.
    sender
        .send_many(&ids, FANOUT, Bytes::from_static(b"warm"))
        .unwrap();
    for inbox in &mut inboxes {
        inbox.recv().await.unwrap();
    }

    let before = thread_counts();
    let report = sender.send_many(&ids, FANOUT, payload.clone()).unwrap();
    let during = thread_counts().since(&before);
    eprintln!(
        "send_many to 8 peers: {} bytes in {} allocations",
        during.bytes, during.allocations
    );
    assert_eq!(report.queued, 8);
    assert!(
        during.bytes < PAYLOAD_BYTES as u64,
        "send_many to 8 peers allocated {} bytes in {} allocations",
        during.bytes,
        during.allocations
    );

    for inbox in &mut inboxes {
        let message = tokio::time::timeout(PATIENCE, inbox.recv())
            .await
            .expect("fan-out message missing")
            .unwrap();
        assert_eq!(message.payload, payload);
    }
}
