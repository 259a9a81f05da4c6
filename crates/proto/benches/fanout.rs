//! wire::fanout — one message to many destinations: meshwire's encode-once against a naive
//! encoder that serialises the whole message per destination (the Safe Network's "before",
//! docs/lessons.md).
//!
//! Before criterion's timing runs, the bench prints allocations and bytes allocated per
//! destination for both, counted by the counting global allocator. Criterion then times one
//! fan-out to all destinations (`Throughput::Elements` = destinations, so it also reports
//! destinations per second); ns per destination is the time per iteration divided by `dsts`.

use std::hint::black_box;

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use meshwire_alloc_count::{thread_counts, CountingAllocator};
use meshwire_proto::wire::{
    Destination, EncodedMessage, Kind, Limits, MsgHeader, ProtocolId, FRAME_OVERHEAD, MAGIC,
    MIN_BODY_LEN, WIRE_VERSION,
};
use meshwire_proto::PeerId;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const DESTINATIONS: usize = 1000;
const PAYLOADS: [usize; 2] = [1024 * 1024, 1024];

fn header() -> MsgHeader {
    MsgHeader {
        kind: Kind::Message,
        flags: 0,
        protocol: ProtocolId(1),
        message_id: 42,
    }
}

fn peers() -> Vec<PeerId> {
    (0..DESTINATIONS)
        .map(|i| {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
            PeerId::from_bytes(bytes)
        })
        .collect()
}

/// meshwire: encode once, then per destination only the three shared chunks for a vectored write
/// (the destination buffers are made once per peer, when the peer becomes known).
fn meshwire_fanout(payload: &Bytes, destinations: &[Destination]) {
    let message = EncodedMessage::encode(&header(), payload.clone(), &Limits::default())
        .expect("within limits");
    for destination in destinations {
        black_box(message.chunks_for(destination));
    }
}

/// The naive encoder: the whole frame serialised into a fresh buffer for every destination.
fn naive_fanout(payload: &Bytes, peers: &[PeerId]) {
    let header = header();
    for peer in peers {
        let mut frame = BytesMut::with_capacity(FRAME_OVERHEAD + payload.len());
        frame.put_slice(&MAGIC);
        frame.put_u8(WIRE_VERSION);
        frame.put_u8(0);
        frame.put_u32_le((MIN_BODY_LEN + payload.len()) as u32);
        frame.put_u8(header.kind as u8);
        frame.put_u8(header.flags);
        frame.put_u16_le(0);
        frame.put_u32_le(header.protocol.0);
        frame.put_u64_le(header.message_id);
        frame.put_slice(peer.as_bytes());
        frame.put_slice(payload);
        black_box(frame.freeze());
    }
}

fn report_allocations(payload: &Bytes, peers: &[PeerId], destinations: &[Destination]) {
    let per_destination = |f: &dyn Fn()| {
        let before = thread_counts();
        f();
        let counted = thread_counts().since(&before);
        (
            counted.allocations as f64 / DESTINATIONS as f64,
            counted.bytes as f64 / DESTINATIONS as f64,
        )
    };
    let (ours_allocs, ours_bytes) = per_destination(&|| meshwire_fanout(payload, destinations));
    let (naive_allocs, naive_bytes) = per_destination(&|| naive_fanout(payload, peers));
    eprintln!(
        "wire::fanout/dsts={DESTINATIONS}/payload_bytes={}: meshwire {ours_allocs:.3} allocations \
         and {ours_bytes:.1} bytes per destination; naive {naive_allocs:.3} allocations and \
         {naive_bytes:.1} bytes per destination",
        payload.len()
    );
}

fn fanout(c: &mut Criterion) {
    let peers = peers();
    let destinations: Vec<Destination> = peers.iter().map(Destination::new).collect();
    let mut group = c.benchmark_group("wire::fanout");
    group.throughput(Throughput::Elements(DESTINATIONS as u64));
    for size in PAYLOADS {
        let payload = Bytes::from(vec![7u8; size]);
        report_allocations(&payload, &peers, &destinations);
        let parameter = format!("dsts={DESTINATIONS}/payload_bytes={size}");
        group.bench_with_input(
            BenchmarkId::new("meshwire", &parameter),
            &payload,
            |b, payload| b.iter(|| meshwire_fanout(payload, &destinations)),
        );
        group.bench_with_input(
            BenchmarkId::new("naive", &parameter),
            &payload,
            |b, payload| b.iter(|| naive_fanout(payload, &peers)),
        );
    }
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
