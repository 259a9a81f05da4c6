//! Batches over lossy paths in the lab, with default settings: whatever the loss rate, path and
//! batch size, a batch completes and arrives whole, in order and unchanged, including batches
//! whose tail the receiver rebuilt from recovery shards.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::{BatchHeader, Chunk, ProtocolId};
use meshwire_lab::lab::Lab;
use meshwire_lab::link::{LinkSpec, Rate};
use proptest::prelude::*;

const DATA: ProtocolId = ProtocolId(78);

/// The byte at `offset` of chunk `chunk`: distinct per chunk and position, so a chunk that is
/// lost, repeated, reordered or torn shows.
fn byte_at(chunk: usize, offset: usize) -> u8 {
    ((chunk * 131 + offset * 7) % 251) as u8
}

fn batch(bytes: usize, chunk_bytes: usize) -> (BatchHeader, Vec<Chunk>) {
    let chunks: Vec<Chunk> = (0..bytes.div_ceil(chunk_bytes))
        .map(|index| {
            let len = chunk_bytes.min(bytes - index * chunk_bytes);
            Chunk {
                slots: 1,
                data: (0..len).map(|offset| byte_at(index, offset)).collect(),
            }
        })
        .collect();
    let header = BatchHeader {
        protocol: DATA.0,
        batch_id: 9,
        round: 0,
        phase: 0,
        slot_count: chunks.len() as u32,
        total_bytes: bytes as u64,
        metadata: Bytes::from_static(b"lossy"),
    };
    (header, chunks)
}

/// What `b` received: the header and every chunk, or the error that ended the batch.
type Received = Result<(BatchHeader, Vec<Chunk>), String>;

/// What one run saw: what `b` received, how many of `a`'s datagrams the emulated loss dropped,
/// and the batches `b` completed with bytes rebuilt from recovery shards.
struct Run {
    received: Vec<Received>,
    lost: u64,
    repaired: u64,
}

/// The value of counter `name` in a node's metrics text.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Sends `count` batches of `bytes` in chunks of `chunk_bytes`, one after another, from `a` to
/// `b` over `link` (both directions).
fn send_over(seed: u64, link: LinkSpec, bytes: usize, chunk_bytes: usize, count: usize) -> Run {
    let mut lab = Lab::new(seed, link, Duration::from_secs(300));
    let received: Rc<RefCell<Vec<Received>>> = Rc::default();
    let repaired = Rc::new(RefCell::new(0));
    {
        let (received, repaired) = (received.clone(), repaired.clone());
        lab.host("b", move |context| {
            let (received, repaired) = (received.clone(), repaired.clone());
            async move {
                let (node, _) = context.start_node(context.node_config()).await?;
                let mut inbox = node.subscribe_batches(DATA)?;
                while let Some(batch) = inbox.recv().await {
                    let result = batch.collect().await.map_err(|error| error.to_string());
                    *repaired.borrow_mut() = counter(
                        &node.metrics().encode_text(),
                        "meshwire_batches_repaired_total",
                    );
                    received.borrow_mut().push(result);
                }
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    let b = lab.node_address("b").unwrap();
    let b_id = lab.peer_id("b");
    let lost = Rc::new(RefCell::new(0));
    {
        let (received, lost) = (received.clone(), lost.clone());
        lab.client("a", move |context| async move {
            let mut config = context.node_config();
            // At 5% loss a 5 s dial fails about once in a thousand (three handshake flights
            // lost); the test is about the batch, so the dial gets time for more retries.
            config.dial_timeout = Duration::from_secs(60);
            let (node, stats) = context.start_node(config).await?;
            node.connect(b, b_id).await?;
            for _ in 0..count {
                let (header, chunks) = batch(bytes, chunk_bytes);
                node.send_batch(b_id, header, chunks).await?;
            }
            while received.borrow().len() < count {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            *lost.borrow_mut() = stats.lost.load(std::sync::atomic::Ordering::Relaxed);
            Ok(())
        });
    }
    let finished = lab.run(Duration::from_secs(300), |_| {}).unwrap();
    assert!(finished, "the batch did not complete");
    let received = received.take();
    let lost = *lost.borrow();
    let repaired = *repaired.borrow();
    Run {
        received,
        lost,
        repaired,
    }
}

/// Checks that `received` is exactly the batch of `bytes` in chunks of `chunk_bytes`.
fn check_whole(received: &Received, bytes: usize, chunk_bytes: usize) -> Result<(), TestCaseError> {
    let (header, chunks) = received.clone().map_err(TestCaseError::fail)?;
    let (expected_header, expected_chunks) = batch(bytes, chunk_bytes);
    prop_assert_eq!(header, expected_header);
    prop_assert_eq!(chunks.len(), expected_chunks.len());
    for (index, (got, want)) in chunks.iter().zip(&expected_chunks).enumerate() {
        prop_assert_eq!(got.slots, want.slots, "chunk {}", index);
        prop_assert!(got.data == want.data, "chunk {} differs", index);
    }
    Ok(())
}

/// A path of `latency_ms` one way at `mbit` Mbit/s, its queue one round trip at that rate.
fn lossy_path(latency_ms: u64, mbit: u64, loss: f64, jitter_ms: u64) -> LinkSpec {
    let bdp = (mbit * 1_000_000 / 8 * 2 * latency_ms / 1000) as usize;
    LinkSpec {
        latency: Duration::from_millis(latency_ms),
        rate: Rate::BitsPerSec(mbit * 1_000_000),
        queue_bytes: bdp.max(64 * 1024),
        loss,
        jitter: Duration::from_millis(jitter_ms),
    }
}

/// The case: 4 Mbit on an 80 ms, 1 Gbit/s path with 1% loss, and a 3 MB batch at 5%:
/// datagrams are lost (the emulator drops them), and both batches arrive whole.
#[test]
fn batches_through_real_loss_arrive_whole() {
    for (loss, bytes) in [(0.01, 500_000), (0.05, 3_000_000)] {
        let run = send_over(7, lossy_path(80, 1_000, loss, 0), bytes, 100_000, 1);
        assert!(run.lost > 0, "no datagram was lost at {loss}");
        check_whole(&run.received[0], bytes, 100_000).unwrap();
    }
}

/// Batches after the first on a path that has lost packets carry recovery shards for their tail:
/// some arrive with lost bytes rebuilt from them, and every batch is whole.
#[test]
fn batch_tails_lost_on_a_lossy_path_are_rebuilt_from_recovery_shards() {
    let bytes = 240_000;
    let run = send_over(5, lossy_path(37, 135, 0.015, 0), bytes, 500, 12);
    assert!(run.lost > 0, "no datagram was lost");
    assert!(
        run.repaired > 0,
        "no batch was rebuilt from recovery shards"
    );
    assert_eq!(run.received.len(), 12);
    for received in &run.received {
        check_whole(received, bytes, 500).unwrap();
    }
}

proptest! {
    // Each case simulates up to 300 s: a failure's shrinking is bounded so CI ends either way.
    #![proptest_config(ProptestConfig {
        cases: 12,
        max_shrink_iters: 32,
        ..ProptestConfig::default()
    })]

    /// Loss up to 5%, 1-150 ms one way, 10 Mbit/s-1 Gbit/s, with or without jitter, batches of
    /// one byte to 3 MB: both batches arrive whole, in order and unchanged.
    #[test]
    fn a_batch_on_a_lossy_path_arrives_whole(
        seed in 1u64..1_000,
        latency_ms in 1u64..150,
        mbit in 10u64..1_000,
        loss in 0.0f64..0.05,
        jitter_ms in prop_oneof![Just(0u64), 1u64..10],
        bytes in prop_oneof![1usize..2_000, 2_000usize..3_000_000],
        chunk_bytes in prop_oneof![Just(1_000usize), 1_000usize..300_000],
    ) {
        let link = lossy_path(latency_ms, mbit, loss, jitter_ms);
        // Two batches: the second, on a connection that has seen its losses, carries recovery
        // shards for its tail.
        let run = send_over(seed, link, bytes, chunk_bytes, 2);
        for received in &run.received {
            check_whole(received, bytes, chunk_bytes)?;
        }
    }
}
