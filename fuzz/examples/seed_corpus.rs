//! Writes seed inputs for every fuzz target into `fuzz/corpus/<target>/`: valid encodings made by
//! the codecs themselves (the golden vectors of their unit tests and a few variations), each with
//! the target's leading control bytes. The committed corpus is these seeds after `cargo fuzz cmin`
//! with the inputs the fuzzer found; see docs/fuzzing.md.
//!
//! Run: `cargo run --manifest-path fuzz/Cargo.toml --example seed_corpus` (a plain build: it
//! needs no fuzzer instrumentation). A seed whose bytes are already in the directory, under any
//! name, is not written again.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use bytes::Bytes;
use meshwire_gossip::proto::{encode_batch, ArtifactId, ClassId, Item};
use meshwire_objects::proto::cas::{self, etag, CasAnswer, Phase, Precondition};
use meshwire_objects::proto::entropy::{self, BucketEntries, Entry, ExchangeLimits};
use meshwire_objects::proto::object::{self, content_hash, FetchMode, Refusal, Stamp, Stored};
use meshwire_objects::proto::topic::{Envelope, TopicName};
use meshwire_proto::batch::{self, BatchHeader, BatchLimits, Chunk};
use meshwire_proto::wire::{
    encode_error_payload, Destination, EncodedMessage, ErrorCode, Kind, Limits, MsgHeader,
    ProtocolId,
};
use meshwire_proto::PeerId;
use meshwire_session::proto::route::{RelayOp, RelayReply, RelayRequest, Route, RouteHeader};
use meshwire_session::proto::{AckPacket, DataPacket, Packet};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut written = 0;
    for (target, seeds) in [
        ("decode_frame", frames()),
        ("decode_batch", batches()),
        ("decode_repair", repairs()),
        ("decode_gossip_batch", gossip()),
        ("decode_object", objects()),
        ("decode_session", session()),
        ("decode_route", routes()),
        ("http_key", keys()),
        ("http_headers", headers()),
        ("decode_topic", topics()),
    ] {
        let dir = root.join(target);
        fs::create_dir_all(&dir).expect("create the corpus directory");
        // `cargo fuzz cmin` renames what it keeps, so compare contents, not names.
        let mut present: HashSet<Vec<u8>> = fs::read_dir(&dir)
            .expect("list the corpus directory")
            .map(|entry| fs::read(entry.expect("a corpus entry").path()).expect("read an input"))
            .collect();
        for seed in seeds {
            if present.insert(seed.clone()) {
                let path = dir.join(format!("seed-{:016x}", fnv1a(&seed)));
                fs::write(&path, &seed).expect("write a seed");
                written += 1;
            }
        }
    }
    println!("{written} new seed files under {}", root.display());
}

/// A stable name for a seed (FNV-1a, 64 bits).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn with_prefix(prefix: &[u8], body: &[u8]) -> Vec<u8> {
    [prefix, body].concat()
}

fn peer(byte: u8) -> PeerId {
    PeerId::from_bytes([byte; 32])
}

/// `[limit][chunking][stream]`: the golden request frame, an error response, and two frames in
/// one stream, fed whole and byte by byte.
fn frames() -> Vec<Vec<u8>> {
    let limits = Limits::default();
    let frame = |kind, payload: &'static [u8]| {
        let header = MsgHeader {
            kind,
            flags: 0x81,
            protocol: ProtocolId(0x0102_0304),
            message_id: 0x1122_3344_5566_7788,
        };
        EncodedMessage::encode(&header, Bytes::from_static(payload), &limits)
            .expect("encode a frame")
            .to_contiguous(&Destination::new(&peer(3)))
    };
    let request = frame(Kind::Request, b"hello");
    let message = frame(Kind::Message, b"");
    let error = {
        let header = MsgHeader {
            kind: Kind::ErrorResponse,
            flags: 0,
            protocol: ProtocolId(7),
            message_id: 1,
        };
        let payload = encode_error_payload(ErrorCode::NoHandler, "none");
        EncodedMessage::encode(&header, payload, &limits)
            .expect("encode an error frame")
            .to_contiguous(&Destination::new(&peer(0xff)))
    };
    let two = [&request[..], &message[..]].concat();
    vec![
        with_prefix(&[255, 0xff], &request),
        with_prefix(&[16, 0x00], &request),
        with_prefix(&[255, 0x40], &message),
        with_prefix(&[255, 0x80], &error),
        with_prefix(&[255, 0x13], &two),
    ]
}

/// `[piece][stream]`: the golden batch and one with several chunks.
/// A 3,000-byte stream with a recovery plan for all of it: its pieces with one or two lost, then
/// its recovery shards, as `decode_repair` operations.
fn repairs() -> Vec<Vec<u8>> {
    use meshwire_proto::batch::repair::{encode_region, RepairPlan, RepairShard, TailBuffer};
    let stream: Vec<u8> = (0..3_000u32).map(|i| (i * 7) as u8).collect();
    let plan = RepairPlan::for_tail(3_000, 3_000, 500, 600, 0.05).expect("a plan");
    let mut tail = TailBuffer::new(0, 1 << 20);
    tail.push(&Bytes::from(stream.clone()));
    let shards = encode_region(&plan, &tail).expect("encode shards");
    let op = |kind: u8, bytes: &[u8]| {
        let mut out = vec![kind];
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
        out
    };
    let piece = |index: usize| {
        let start = index * 600;
        let mut bytes = (start as u16).to_le_bytes().to_vec();
        bytes.extend_from_slice(&stream[start..start + 600]);
        op(0, &bytes)
    };
    let shard = |index: usize| {
        let encoded = RepairShard {
            stream: 2,
            plan,
            index: index as u16,
            data: Bytes::from(shards[index].clone()),
        }
        .encode();
        op(1, &encoded)
    };
    let mut seeds = Vec::new();
    for lost in [vec![4], vec![1, 3]] {
        let mut seed = Vec::new();
        for index in (0..5).filter(|index| !lost.contains(index)) {
            seed.extend(piece(index));
        }
        for index in 0..shards.len() {
            seed.extend(shard(index));
        }
        seeds.push(seed);
    }
    // Shards before the stream, as they usually arrive.
    let mut early = Vec::new();
    for index in 0..shards.len() {
        early.extend(shard(index));
    }
    for index in [0, 2, 3] {
        early.extend(piece(index));
    }
    seeds.push(early);
    seeds
}

fn batches() -> Vec<Vec<u8>> {
    let header = |slot_count, total_bytes| BatchHeader {
        protocol: 7,
        batch_id: 42,
        round: 3,
        phase: 1,
        slot_count,
        total_bytes,
        metadata: Bytes::from_static(b"meta"),
    };
    let chunks = |sizes: &[usize]| -> Vec<Chunk> {
        sizes
            .iter()
            .enumerate()
            .map(|(index, size)| Chunk {
                slots: 1,
                data: Bytes::from(vec![index as u8; *size]),
            })
            .collect()
    };
    let limits = BatchLimits::default();
    let golden = batch::encode_all(header(1, 2), &chunks(&[2]), limits).expect("encode a batch");
    let three =
        batch::encode_all(header(3, 12), &chunks(&[4, 5, 3]), limits).expect("encode a batch");
    vec![
        with_prefix(&[255], &golden),
        with_prefix(&[0], &golden),
        with_prefix(&[6], &three),
    ]
}

/// `[max_items][stream]`: the golden gossip batch, adverts and artifacts of both classes.
fn gossip() -> Vec<Vec<u8>> {
    let artifact = |class, payload: &'static [u8]| Item::Artifact {
        class: ClassId(class),
        payload: Bytes::from_static(payload),
    };
    let golden = encode_batch(&[
        Item::Advert {
            class: ClassId(2),
            id: ArtifactId([0xaa; 32]),
            size: 0x0102_0304,
        },
        Item::Request(ArtifactId([0x11; 32])),
        artifact(1, b"hi"),
        Item::Purge(ArtifactId([0x22; 32])),
    ]);
    let adverts = encode_batch(&[
        Item::Advert {
            class: ClassId(0),
            id: ArtifactId::of(ClassId(0), b"even"),
            size: 4,
        },
        Item::Advert {
            class: ClassId(1),
            id: ArtifactId::of(ClassId(1), b"odd"),
            size: 3,
        },
    ]);
    let artifacts = encode_batch(&[artifact(0, b"even"), artifact(1, b"odd"), artifact(0, b"")]);
    // A neighbours announcement (naming the fuzz target's own peer and another), then a relayed
    // artifact from that peer: the relay consults the lists.
    let neighbours = encode_batch(&[
        Item::Neighbours {
            seq: 1,
            peers: vec![PeerId::from_bytes([1; 32]), PeerId::from_bytes([2; 32])],
        },
        artifact(0, b"even"),
        Item::IHave {
            class: ClassId(0),
            id: ArtifactId::of(ClassId(0), b"ev"),
            size: 2,
        },
    ]);
    vec![
        with_prefix(&[8], &golden),
        with_prefix(&[2], &adverts),
        with_prefix(&[3], &artifacts),
        with_prefix(&[4], &neighbours),
        with_prefix(&[255], &encode_batch(&[])),
    ]
}

/// `[max_content][message]`: one of each object, conditional-write and anti-entropy message.
fn objects() -> Vec<Vec<u8>> {
    let clock = 1_760_000_000_000 << 16;
    let content = b"object content";
    let stamp = Stamp {
        version: clock + 1,
        hash: content_hash(content),
    };
    let mut store = object::encode_store_header(clock, "key-1", &stamp);
    store.extend_from_slice(content);
    let mut fetched = object::encode_fetched_header(clock, Some(&stamp));
    fetched.extend_from_slice(content);
    let mut prepare = cas::encode_cas_header(
        clock,
        Phase::Prepare(Precondition::Matches(stamp)),
        "key-1",
        &stamp,
    );
    prepare.extend_from_slice(content);
    let limits = ExchangeLimits {
        max_entries: 64,
        max_bytes: 4096,
    };
    let listing = [BucketEntries {
        bucket: 1,
        complete: true,
        entries: vec![Entry {
            key: "key-1".into(),
            stamp,
            len: content.len() as u32,
        }],
    }];
    let messages = [
        object::encode_fetch(clock, FetchMode::Metadata, "key-1"),
        object::encode_fetch(clock, FetchMode::Full, "a.b_c-d"),
        object::encode_fetch(clock, FetchMode::FullIfSmall, "key-1"),
        object::encode_fetched_header(clock, Some(&stamp)),
        object::encode_fetched_not_carried(clock, &stamp),
        object::encode_fetched_header(clock, None),
        fetched,
        object::encode_refusal(clock, Refusal::ClockSkew),
        store,
        object::encode_stored(clock, Stored::Holds),
        object::encode_stored(clock, Stored::Superseded(stamp)),
        prepare,
        cas::encode_cas_header(clock, Phase::Commit, "key-1", &stamp),
        cas::encode_cas_header(clock, Phase::Abort, "key-1", &stamp),
        cas::encode_cas_answer(clock, Ok(CasAnswer::Done)),
        cas::encode_cas_answer(clock, Ok(CasAnswer::Mismatch(Some(stamp)))),
        cas::encode_cas_answer(clock, Err(Refusal::NotMember)),
        entropy::encode_digests(clock, &[7; entropy::DIGEST_LEN], &[1, 2, 3, 4]),
        entropy::encode_entries(clock, &listing, limits),
        entropy::encode_entries_refusal(clock, Refusal::VersionLimit),
    ];
    // 65: the content fits, and 65 % 13 = 0 picks one bucket; 66 picks two for the listing.
    messages
        .iter()
        .flat_map(|message| [with_prefix(&[65], message), with_prefix(&[66], message)])
        .collect()
}

/// `[mtu][datagram]`: the golden data, probe and ack packets.
fn session() -> Vec<Vec<u8>> {
    let data = Packet::Data(DataPacket {
        packet_number: 7,
        seq: 3,
        fin: true,
        window_limited: false,
        payload: Bytes::from_static(b"hi"),
    });
    let first = Packet::Data(DataPacket {
        packet_number: 0,
        seq: 0,
        fin: false,
        window_limited: false,
        payload: Bytes::from_static(b"first"),
    });
    let ack = Packet::Ack(AckPacket {
        echo: Some(5),
        cumulative: 1,
        window_end: 9,
        ranges: vec![(3, 4), (6, 8)],
    });
    [data, first, Packet::Probe { packet_number: 1 }, ack]
        .iter()
        .map(|packet| with_prefix(&[64], &packet.encode()))
        .collect()
}

/// The whole input is a datagram or relay message: each route kind, requests and replies.
fn routes() -> Vec<Vec<u8>> {
    let header = |route| RouteHeader {
        session: 0x0102_0304_0506_0708,
        path: 9,
        route,
    };
    vec![
        header(Route::Direct).encode_with(&[0xaa]).to_vec(),
        header(Route::ToRelay {
            destination: peer(4),
        })
        .encode_with(b"packet")
        .to_vec(),
        header(Route::FromRelay { source: peer(5) })
            .encode_with(b"")
            .to_vec(),
        RelayRequest {
            op: RelayOp::Open,
            session: 1,
            path: 2,
            peer: peer(6),
        }
        .encode()
        .to_vec(),
        RelayRequest {
            op: RelayOp::Close,
            session: 1,
            path: 2,
            peer: peer(6),
        }
        .encode()
        .to_vec(),
        RelayReply::Accepted.encode().to_vec(),
        RelayReply::Conflict.encode().to_vec(),
    ]
}

/// Object keys as they reach validation: valid ones, the reserved names, the longest.
fn topics() -> Vec<Vec<u8>> {
    let envelope = |name: &str, body: &'static [u8]| {
        Envelope {
            topic: TopicName::new(name).expect("a valid topic name"),
            origin: PeerId::from_bytes([7; 32]),
            sequence: 1_700_000_000_000_000,
            body: Bytes::from_static(body),
        }
        .encode()
        .to_vec()
    };
    let mut seeds = vec![
        envelope("default", b"hello"),
        envelope("blocks.v1", b""),
        envelope(&"t".repeat(64), &[0xff; 100]),
    ];
    seeds.extend(["default", "a_b-c.d", "", "has space", &"t".repeat(65)].map(|n| n.as_bytes().to_vec()));
    seeds
}

fn keys() -> Vec<Vec<u8>> {
    [
        "key-1",
        "a.b_c-d",
        ".",
        "..",
        "...",
        "with space",
        "naïve",
        &"k".repeat(object::MAX_KEY_LEN),
        &"k".repeat(object::MAX_KEY_LEN + 1),
    ]
    .iter()
    .map(|key| key.as_bytes().to_vec())
    .collect()
}

/// Header values: entity tags, `*`, `Accept` values scrapers send, bearer credentials.
fn headers() -> Vec<Vec<u8>> {
    let stamp = Stamp {
        version: 1_760_000_000_000 << 16,
        hash: content_hash(b"object content"),
    };
    [
        etag(&stamp),
        "*".into(),
        " * ".into(),
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;\
         q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            .into(),
        "text/plain; version=0.0.4".into(),
        "application/openmetrics-text;q=0.2, text/plain;q=0.9".into(),
        "Bearer 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        "Bearer wrong".into(),
    ]
    .iter()
    .map(|value: &String| value.as_bytes().to_vec())
    .collect()
}
