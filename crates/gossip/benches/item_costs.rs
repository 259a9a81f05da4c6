//! gossip::item — what handling one inbound gossip item costs on this machine: the per-item CPU
//! costs of the lab's CPU model (`scenarios/ic-gossip.toml` states the numbers and this command).
//!
//! Each `handle_batch` bench feeds one batch of [`ITEMS`] items from one peer to a fresh state
//! machine (the machine is built outside the timing) and reports the time per item
//! (`Throughput::Elements`): decoding the batch, looking the id up, the bookkeeping the item
//! triggers (a request queued for an unknown advert, the artifact queued for a request, the
//! artifact hashed into its id and stored). Sending what the items queue (flushing, encoding,
//! encrypting) is not included. `validate` is an application's check of an artifact: one
//! ed25519 signature verified over a 1 KiB message (`ed25519-dalek`, as the IC signs ingress),
//! and `hash` the SHA-256 that turns every artifact copy into its content id, per KiB.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ed25519_dalek::{Signer, SigningKey, Verifier};
use meshwire_gossip::proto::{
    encode_batch, ArtifactId, ClassId, ClassPolicy, Gossip, GossipConfig, Item, Relay,
};
use meshwire_proto::PeerId;

const ITEMS: usize = 64;
const CLASS: ClassId = ClassId(1);
const ARTIFACT_BYTES: usize = 1024;

type Accept = fn(ClassId, &Bytes) -> bool;

fn accept(_: ClassId, _: &Bytes) -> bool {
    true
}

fn machine() -> Gossip<Accept> {
    let mut config = GossipConfig::default();
    // Origin relay: a received artifact is stored and delivered, not relayed on.
    config.classes.insert(
        CLASS,
        ClassPolicy::advertise(Relay::Origin, Duration::from_secs(30)),
    );
    let mut machine = Gossip::new(config, accept as Accept);
    machine.set_local_id(PeerId::from_bytes([1; 32]));
    machine.handle_peer_up(sender(), Instant::now());
    machine
}

fn sender() -> PeerId {
    PeerId::from_bytes([2; 32])
}

fn payloads() -> Vec<Bytes> {
    (0..ITEMS)
        .map(|i| {
            let mut payload = vec![0xab; ARTIFACT_BYTES];
            payload[..8].copy_from_slice(&(i as u64).to_le_bytes());
            Bytes::from(payload)
        })
        .collect()
}

/// A machine that already holds every payload (published by it).
fn holding(payloads: &[Bytes]) -> Gossip<Accept> {
    let mut machine = machine();
    let now = Instant::now();
    for payload in payloads {
        machine.publish(CLASS, payload.clone(), now).unwrap();
    }
    while machine.poll_transmit().is_some() {}
    machine
}

fn handle_batch(c: &mut Criterion) {
    let payloads = payloads();
    let ids: Vec<ArtifactId> = payloads.iter().map(|p| ArtifactId::of(CLASS, p)).collect();
    let adverts = encode_batch(
        &ids.iter()
            .map(|id| Item::Advert {
                class: CLASS,
                id: *id,
                size: ARTIFACT_BYTES as u32,
            })
            .collect::<Vec<_>>(),
    );
    let requests = encode_batch(&ids.iter().map(|id| Item::Request(*id)).collect::<Vec<_>>());
    let artifacts = encode_batch(
        &payloads
            .iter()
            .map(|payload| Item::Artifact {
                class: CLASS,
                payload: payload.clone(),
            })
            .collect::<Vec<_>>(),
    );
    let mut group = c.benchmark_group("gossip::item");
    group.throughput(Throughput::Elements(ITEMS as u64));
    let cases: [(&str, &Bytes, bool); 4] = [
        ("advert", &adverts, false),
        ("request", &requests, true),
        ("artifact_new", &artifacts, false),
        ("artifact_duplicate", &artifacts, true),
    ];
    for (kind, batch, held) in cases {
        group.bench_function(
            BenchmarkId::new("handle_batch", format!("kind={kind}")),
            |b| {
                b.iter_batched(
                    || if held { holding(&payloads) } else { machine() },
                    |mut machine| {
                        machine
                            .handle_batch(sender(), black_box(batch), Instant::now())
                            .unwrap();
                        machine
                    },
                    BatchSize::SmallInput,
                )
            },
        );
    }
    group.finish();
}

fn validate(c: &mut Criterion) {
    let key = SigningKey::from_bytes(&[7; 32]);
    let message = vec![0x5a; ARTIFACT_BYTES];
    let signature = key.sign(&message);
    let public = key.verifying_key();
    let mut group = c.benchmark_group("gossip::validate");
    group.throughput(Throughput::Elements(1));
    group.bench_function("ed25519_verify/message_bytes=1024", |b| {
        b.iter(|| {
            public
                .verify(black_box(&message), black_box(&signature))
                .unwrap()
        })
    });
    group.finish();
}

fn hash(c: &mut Criterion) {
    let mut group = c.benchmark_group("gossip::hash");
    for kib in [1usize, 32] {
        let payload = vec![0xab; kib * 1024];
        group.throughput(Throughput::Bytes(payload.len() as u64));
        group.bench_function(format!("sha256/payload_kib={kib}"), |b| {
            b.iter(|| ArtifactId::of(CLASS, black_box(&payload)))
        });
    }
    group.finish();
}

criterion_group!(benches, handle_batch, validate, hash);
criterion_main!(benches);
