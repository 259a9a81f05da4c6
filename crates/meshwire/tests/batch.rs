//! Bulk batches between two nodes on loopback: chunks arrive before the batch ends, sizes are
//! enforced on both ends, and a batch that breaks off is an error, never a partial batch.

mod support;

use bytes::Bytes;
use meshwire::{
    split_into_chunks, BatchError, BatchHeader, Chunk, ProtocolId, RESET_BATCH_ABANDONED,
    STOP_BATCH_NO_SUBSCRIBER,
};
use meshwire_proto::batch::BatchError as CodecError;
use support::{connect, start, PATIENCE};
use tokio::sync::mpsc;

const BULK: ProtocolId = ProtocolId(30);

fn header(batch_id: u64, chunks: &[Chunk]) -> BatchHeader {
    BatchHeader {
        protocol: BULK.0,
        batch_id,
        round: 7,
        phase: 2,
        slot_count: chunks.iter().map(|c| c.slots).sum(),
        total_bytes: chunks.iter().map(|c| c.data.len() as u64).sum(),
        metadata: Bytes::from_static(b"round 7"),
    }
}

fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    SentChunk(usize),
    ReceivedHeader,
    ReceivedChunk(usize),
    SentEnd,
    ReceivedEnd,
}

#[tokio::test]
async fn chunks_reach_the_application_before_the_batch_ends() {
    let (a, b) = (start(61), start(62));
    let mut inbox = b.subscribe_batches(BULK).unwrap();
    connect(&a, &b).await;
    let chunks = split_into_chunks(&payload(40_000, 1), 10_000);
    let (events_tx, mut events) = mpsc::unbounded_channel();

    let receiver = {
        let events_tx = events_tx.clone();
        tokio::spawn(async move {
            let mut batch = inbox.recv().await.unwrap();
            events_tx.send(Event::ReceivedHeader).unwrap();
            let mut index = 0;
            while let Some(chunk) = batch.next_chunk().await.unwrap() {
                assert_eq!(chunk.data.len(), 10_000);
                events_tx.send(Event::ReceivedChunk(index)).unwrap();
                index += 1;
            }
            events_tx.send(Event::ReceivedEnd).unwrap();
        })
    };

    let mut sender = a.open_batch(b.peer_id(), header(1, &chunks)).await.unwrap();
    let mut log = Vec::new();
    for (index, chunk) in chunks.iter().cloned().enumerate() {
        sender.send_chunk(chunk).await.unwrap();
        log.push(Event::SentChunk(index));
        // The next chunk goes only after the receiver has seen this one: if chunks were held
        // back until the end of the batch, this would never return.
        let seen = tokio::time::timeout(PATIENCE, async {
            loop {
                let event = events.recv().await.unwrap();
                log.push(event.clone());
                if event == Event::ReceivedChunk(index) {
                    break;
                }
            }
        })
        .await;
        assert!(
            seen.is_ok(),
            "chunk {index} not delivered before the batch ended: {log:?}"
        );
    }
    sender.finish().await.unwrap();
    log.push(Event::SentEnd);
    receiver.await.unwrap();
    while let Ok(event) = events.try_recv() {
        log.push(event);
    }
    assert_eq!(
        log,
        vec![
            Event::SentChunk(0),
            Event::ReceivedHeader,
            Event::ReceivedChunk(0),
            Event::SentChunk(1),
            Event::ReceivedChunk(1),
            Event::SentChunk(2),
            Event::ReceivedChunk(2),
            Event::SentChunk(3),
            Event::ReceivedChunk(3),
            Event::SentEnd,
            Event::ReceivedEnd,
        ]
    );
}

#[tokio::test]
async fn a_4_mbit_batch_arrives_whole_and_intact() {
    let (a, b) = (start(63), start(64));
    let mut inbox = b.subscribe_batches(BULK).unwrap();
    connect(&a, &b).await;
    // The xx network's batch: 1000 payloads of 500 bytes.
    let data = payload(500_000, 3);
    let chunks = split_into_chunks(&data, 500);
    let header = header(2, &chunks);
    let send = a.send_batch(b.peer_id(), header.clone(), chunks);
    let receive = async { inbox.recv().await.unwrap().collect().await };
    let (sent, received) = tokio::time::timeout(PATIENCE, async { tokio::join!(send, receive) })
        .await
        .unwrap();
    sent.unwrap();
    let (received_header, received_chunks) = received.unwrap();
    assert_eq!(received_header, header);
    assert_eq!(received_chunks.len(), 1000);
    let joined: Vec<u8> = received_chunks
        .iter()
        .flat_map(|c| c.data.iter().copied())
        .collect();
    assert_eq!(joined, data);
    assert!(a.metrics().encode_text().contains("batches_sent_total 1"));
    assert!(b
        .metrics()
        .encode_text()
        .contains("batches_received_total 1"));
}

#[tokio::test]
async fn a_truncated_batch_is_an_error_on_both_ends() {
    let (a, b) = (start(65), start(66));
    let mut inbox = b.subscribe_batches(BULK).unwrap();
    connect(&a, &b).await;
    let chunks = split_into_chunks(&payload(3_000, 5), 1_000);

    // The sender finishes after two of three chunks: its own finish refuses, and the receiver,
    // which already took the header and both chunks, sees the batch reset instead of an end. (A
    // reset that wins the race against the header makes the stream vanish unread instead.)
    let mut sender = a.open_batch(b.peer_id(), header(3, &chunks)).await.unwrap();
    for chunk in chunks.iter().take(2).cloned() {
        sender.send_chunk(chunk).await.unwrap();
    }
    let mut batch = tokio::time::timeout(PATIENCE, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    for chunk in chunks.iter().take(2) {
        assert_eq!(batch.next_chunk().await.unwrap().as_ref(), Some(chunk));
    }
    assert_eq!(
        sender.finish().await.unwrap_err(),
        BatchError::Codec(CodecError::Short {
            what: "bytes",
            declared: 3_000,
            actual: 2_000
        })
    );
    let outcome = tokio::time::timeout(PATIENCE, batch.next_chunk())
        .await
        .unwrap();
    assert_eq!(
        outcome.unwrap_err(),
        BatchError::Reset(RESET_BATCH_ABANDONED.into())
    );

    // A sender dropped mid-batch, after the receiver took the header and first chunk: the same
    // on the receiving end.
    let mut sender = a.open_batch(b.peer_id(), header(4, &chunks)).await.unwrap();
    sender.send_chunk(chunks[0].clone()).await.unwrap();
    let mut batch = tokio::time::timeout(PATIENCE, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch.header().batch_id, 4);
    assert_eq!(batch.next_chunk().await.unwrap(), Some(chunks[0].clone()));
    drop(sender);
    let outcome = tokio::time::timeout(PATIENCE, batch.next_chunk())
        .await
        .unwrap();
    assert_eq!(
        outcome.unwrap_err(),
        BatchError::Reset(RESET_BATCH_ABANDONED.into())
    );
}

#[tokio::test]
async fn a_batch_longer_than_its_header_is_refused_by_the_sender() {
    let (a, b) = (start(67), start(68));
    let _inbox = b.subscribe_batches(BULK).unwrap();
    connect(&a, &b).await;
    let chunks = split_into_chunks(&payload(2_000, 7), 1_000);
    let mut sender = a
        .open_batch(b.peer_id(), header(5, &chunks[..1]))
        .await
        .unwrap();
    sender.send_chunk(chunks[0].clone()).await.unwrap();
    assert!(matches!(
        sender.send_chunk(chunks[1].clone()).await,
        Err(BatchError::Codec(CodecError::Overrun { what: "bytes", .. }))
    ));
}

#[tokio::test]
async fn a_batch_nobody_subscribed_to_is_stopped() {
    let (a, b) = (start(69), start(70));
    connect(&a, &b).await;
    let chunks = split_into_chunks(&payload(1_000, 9), 500);
    let result = tokio::time::timeout(
        PATIENCE,
        a.send_batch(b.peer_id(), header(6, &chunks), chunks.clone()),
    )
    .await
    .unwrap();
    // The stop may race the acknowledgement of the last byte; when it wins, the sender knows.
    if let Err(error) = result {
        assert_eq!(error, BatchError::Stopped(STOP_BATCH_NO_SUBSCRIBER.into()));
    }
    let dropped = tokio::time::timeout(PATIENCE, async {
        while b.metrics().dropped_count("no_subscriber") == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(dropped.is_ok());
}

/// A recovery shard that does not parse, sent by the batch's own sender on the batch's stream:
/// the batch fails with a typed error on both ends and is counted; the connection and the node
/// go on (the next batch arrives whole).
#[tokio::test]
async fn a_malformed_repair_shard_fails_its_batch_only() {
    let (a, b) = (start(67), start(68));
    let mut inbox = b.subscribe_batches(BULK).unwrap();
    connect(&a, &b).await;
    let chunks = split_into_chunks(&payload(3_000, 6), 1_000);
    let mut sender = a.open_batch(b.peer_id(), header(5, &chunks)).await.unwrap();
    sender.send_chunk(chunks[0].clone()).await.unwrap();
    let mut batch = tokio::time::timeout(PATIENCE, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch.next_chunk().await.unwrap(), Some(chunks[0].clone()));
    // The client's first one-way stream has id 2: a header naming it, with a shard size of 3
    // (odd, below the minimum) and no shard.
    let mut shard = Vec::new();
    shard.extend_from_slice(&2u64.to_le_bytes());
    shard.extend_from_slice(&0u64.to_le_bytes());
    shard.extend_from_slice(&1000u32.to_le_bytes());
    shard.extend_from_slice(&3u16.to_le_bytes());
    shard.extend_from_slice(&1u16.to_le_bytes());
    shard.extend_from_slice(&0u16.to_le_bytes());
    a.send_datagram(
        b.peer_id(),
        meshwire::protocols::BATCH_REPAIR,
        Bytes::from(shard),
    )
    .unwrap();
    let outcome = tokio::time::timeout(PATIENCE, batch.next_chunk())
        .await
        .unwrap();
    assert_eq!(
        outcome.unwrap_err(),
        BatchError::Codec(CodecError::BadRepair("shard size"))
    );
    for chunk in chunks.iter().skip(1).cloned() {
        // The receiver has stopped the stream; a write may already see it.
        if sender.send_chunk(chunk).await.is_err() {
            break;
        }
    }
    assert_eq!(
        tokio::time::timeout(PATIENCE, sender.finish())
            .await
            .unwrap()
            .unwrap_err(),
        BatchError::Stopped(meshwire::STOP_BATCH_MALFORMED.into())
    );
    assert!(b
        .metrics()
        .encode_text()
        .contains("batch_errors_total{reason=\"bad_repair\"} 1"));
    // The connection carries the next batch whole.
    let sent = a.send_batch(b.peer_id(), header(6, &chunks), chunks.clone());
    let received = async { inbox.recv().await.unwrap().collect().await.unwrap() };
    let (sent, (_, received)) =
        tokio::time::timeout(PATIENCE, async { tokio::join!(sent, received) })
            .await
            .unwrap();
    sent.unwrap();
    assert_eq!(received, chunks);
}
