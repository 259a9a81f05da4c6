//! Floods from one hostile peer: the victim's heap stays within its configured bounds, the flood
//! is counted, and an honest peer is served throughout.
//!
//! The victim node runs on its own runtime, whose threads are the counting allocator's tracked
//! context, so the heap measured is the victim's alone (its QUIC endpoint, connections, queues
//! and tasks). `MESHWIRE_FLOOD_MESSAGES` sets the flood size (default 20,000, enough to fill every
//! queue many times over); `bench/floods.sh` runs the same floods with 1,000,000 in release and
//! prints the measurements.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire::proto::wire::{Destination, EncodedMessage, Kind, Limits, MsgHeader};
use meshwire::protocols::{ECHO, SERVICES};
use meshwire::tls::{client_crypto, TlsIdentity};
use meshwire::{Keypair, Node, NodeConfig, ProtocolId, STOP_STREAM_TIMEOUT};
use meshwire_alloc_count::{
    clear_tracker, mark_thread, reset_tracked_peak, track_marked_threads, tracked_live_and_peak,
    CountingAllocator,
};
use support::{config, loopback, PATIENCE};
use tokio::runtime::Runtime;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const UNREAD: ProtocolId = ProtocolId(0x0bad);
const HOARD: ProtocolId = ProtocolId(0x0bae);
const LATE: ProtocolId = ProtocolId(0x0baf);
const MIB: f64 = 1024.0 * 1024.0;

fn process_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

fn flood_messages() -> usize {
    std::env::var("MESHWIRE_FLOOD_MESSAGES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20_000)
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

type VictimJob = Box<dyn FnOnce() + Send>;

/// The victim, the attacker and an honest peer. The victim runs on its own thread and runtime,
/// the tracked context; the others on the test thread's runtime.
struct Arena {
    _exclusive: std::sync::MutexGuard<'static, ()>,
    victim_thread: Option<std::thread::JoinHandle<()>>,
    jobs: Option<tokio::sync::mpsc::UnboundedSender<VictimJob>>,
    rt: Runtime,
    victim: Node,
    attacker: Node,
    honest: Node,
    victim_config: NodeConfig,
}

impl Arena {
    fn new() -> Self {
        // One arena at a time: the tracked context is process-wide.
        let exclusive = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        track_marked_threads();
        let mut victim_config = config(1);
        // Unfinished requests are reset after this long (default 30 s; shortened to keep the
        // test short, the bound is the same kind).
        victim_config.inbound_request_timeout = Duration::from_secs(1);
        victim_config.inbound_stream_timeout = Duration::from_secs(1);
        let (node_tx, node_rx) = std::sync::mpsc::channel();
        let (jobs, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<VictimJob>();
        let victim_settings = victim_config.clone();
        let victim_thread = std::thread::spawn(move || {
            mark_thread(true);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_start(|| mark_thread(true))
                .build()
                .unwrap();
            rt.block_on(async move {
                let node = Node::bind(victim_settings, loopback()).unwrap();
                node.handle(ECHO, |_, body| async move { Ok(body) })
                    .unwrap();
                node_tx.send(node.clone()).unwrap();
                while let Some(job) = job_rx.recv().await {
                    job();
                }
                node.close().await;
            });
        });
        let victim = node_rx.recv().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (attacker, honest) = rt.block_on(async {
            let attacker = Node::bind(config(2), loopback()).unwrap();
            let honest = Node::bind(config(3), loopback()).unwrap();
            for node in [&attacker, &honest] {
                node.connect(victim.local_addr().unwrap(), victim.peer_id())
                    .await
                    .unwrap();
            }
            (attacker, honest)
        });
        Self {
            _exclusive: exclusive,
            victim_thread: Some(victim_thread),
            jobs: Some(jobs),
            rt,
            victim,
            attacker,
            honest,
            victim_config,
        }
    }

    /// Runs `job` on the victim's thread (so what it frees is counted as the victim's).
    fn on_victim(&self, job: impl FnOnce() + Send + 'static) {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        self.jobs
            .as_ref()
            .unwrap()
            .send(Box::new(move || {
                job();
                let _ = done_tx.send(());
            }))
            .unwrap();
        done_rx.recv().unwrap();
    }

    /// The honest peer's echo round trip to the victim works.
    fn honest_is_served(&self) {
        let body = Bytes::from_static(b"still here");
        let reply = self
            .rt
            .block_on(
                self.honest
                    .request(self.victim.peer_id(), ECHO, body.clone(), PATIENCE),
            )
            .expect("the honest peer was not served");
        assert_eq!(reply, body);
    }

    /// The victim's live heap once it has settled (a few echo round trips and a pause).
    fn settled_heap(&self) -> i64 {
        for _ in 0..3 {
            self.honest_is_served();
            self.rt
                .block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
        }
        tracked_live_and_peak().0
    }

    /// The most a flood may add to the victim's heap: what the flooder's connection can make it
    /// hold (its QUIC receive window, twice the bandwidth-delay product: data accepted and not
    /// yet read or queued), as much again for data moved from that window into queues, and 8 MiB
    /// for per-stream and per-request state.
    fn bound_bytes(&self) -> i64 {
        let window = 2 * self.victim_config.transport.bdp_bytes() as i64;
        2 * window + (8 << 20)
    }

    fn report(&self, flood: &str, before: i64, peak: i64, after: i64) {
        eprintln!(
            "flood {flood}: victim heap before {:.1} MiB, peak {:.1} MiB (bound {:.1} MiB), after {:.1} MiB; \
             process RSS (victim, flooder and honest peer) {:.0} MiB",
            before as f64 / MIB,
            peak as f64 / MIB,
            self.bound_bytes() as f64 / MIB,
            after as f64 / MIB,
            process_rss_bytes() as f64 / MIB
        );
        assert!(
            peak - before <= self.bound_bytes(),
            "{flood}: the victim's heap grew by {} bytes",
            peak - before
        );
        assert!(
            (after - before) as f64 <= 0.1 * before as f64,
            "{flood}: the victim's heap did not come back within 10%: {before} -> {after}"
        );
    }

    /// Waits for `done`, driving the test thread's runtime (the attacker's queues) meanwhile.
    fn wait_for(&self, what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        self.rt.block_on(async {
            while !done() {
                assert!(Instant::now() < deadline, "never happened: {what}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.victim_thread.take() {
            let _ = thread.join();
        }
        clear_tracker();
    }
}

/// Messages to a protocol nobody subscribed to are dropped and counted as they arrive.
#[test]
fn a_million_messages_to_a_protocol_nobody_reads() {
    let arena = Arena::new();
    let messages = flood_messages();
    let before = arena.settled_heap();
    reset_tracked_peak();
    let victim = arena.victim.peer_id();
    let payload = Bytes::from_static(&[7u8; 64]);
    arena.rt.block_on(async {
        for _ in 0..messages {
            arena
                .attacker
                .send(victim, UNREAD, payload.clone())
                .await
                .unwrap();
        }
    });
    arena.wait_for("every flood message counted", || {
        arena.victim.metrics().dropped_count("no_subscriber") >= messages as u64
    });
    arena.honest_is_served();
    let peak = tracked_live_and_peak().1;
    let after = arena.settled_heap();
    assert_eq!(
        arena.victim.metrics().dropped_count("no_subscriber"),
        messages as u64
    );
    arena.report("unread protocol", before, peak, after);
}

/// A subscriber that never reads holds at most its queue: the sender is slowed down by QUIC flow
/// control, not buffered without end.
#[test]
fn a_subscriber_that_never_reads_slows_the_flooder_down() {
    let arena = Arena::new();
    let messages = flood_messages();
    let inbox = arena.victim.subscribe(HOARD).unwrap();
    let before = arena.settled_heap();
    reset_tracked_peak();
    let victim = arena.victim.peer_id();
    let payload = Bytes::from(vec![9u8; 1024]);
    let sent = arena.rt.block_on(async {
        let mut sent = 0;
        for _ in 0..messages {
            match tokio::time::timeout(
                Duration::from_secs(1),
                arena.attacker.send(victim, HOARD, payload.clone()),
            )
            .await
            {
                Ok(result) => {
                    result.unwrap();
                    sent += 1;
                }
                // Stalled: the victim's queue and the QUIC windows are full.
                Err(_) => break,
            }
        }
        sent
    });
    arena.honest_is_served();
    let peak = tracked_live_and_peak().1;
    eprintln!(
        "flood never-read subscriber: {sent} of {messages} messages queued before the sender stalled"
    );
    // Dropping the subscription releases the queue; what still arrives is dropped and counted.
    arena.on_victim(move || drop(inbox));
    let after = arena.settled_heap();
    arena.report("never-read subscriber", before, peak, after);
}

/// Streams opened and never finished: one-way streams are capped per connection and stopped
/// after `inbound_stream_timeout`, unfinished requests are reset after `inbound_request_timeout`,
/// both counted; once the one-way streams are stopped, a complete message on a new one-way stream
/// of the same connection is delivered again, and closing the connection frees the rest.
#[test]
fn ten_thousand_streams_opened_and_never_finished() {
    let arena = Arena::new();
    // 10,000 with the flood size of bench/floods.sh; fewer in the default test run.
    let streams = (flood_messages() / 10).min(10_000);
    let before = arena.settled_heap();
    reset_tracked_peak();
    let victim = arena.victim.peer_id();
    let identity = TlsIdentity::new(&Keypair::from_seed([9; 32])).unwrap();
    let (crypto, _) = client_crypto(&identity, victim).unwrap();
    let header = MsgHeader {
        kind: Kind::Request,
        flags: 0,
        protocol: ECHO,
        message_id: 1,
    };
    // A frame that announces 64 KiB of payload, cut off after its first 1,000 payload bytes.
    let frame = EncodedMessage::encode(
        &header,
        Bytes::from(vec![1u8; 64 << 10]),
        &Limits::default(),
    )
    .unwrap()
    .to_contiguous(&Destination::new(&victim))
    .to_vec();
    let partial = Bytes::from(frame[..frame.len() - (63 << 10)].to_vec());
    let message_payload = Bytes::from_static(b"after the timeout");
    let message = EncodedMessage::encode(
        &MsgHeader {
            kind: Kind::Message,
            flags: 0,
            protocol: LATE,
            message_id: 2,
        },
        message_payload.clone(),
        &Limits::default(),
    )
    .unwrap()
    .to_contiguous(&Destination::new(&victim));
    let target = arena.victim.local_addr().unwrap();
    let mut late = arena.victim.subscribe(LATE).unwrap();
    let (uni, bidi, connection) = arena.rt.block_on(async {
        let endpoint = quinn::Endpoint::client(loopback()).unwrap();
        let connection = endpoint
            .connect_with(
                quinn::ClientConfig::new(crypto),
                target,
                &victim.to_string(),
            )
            .unwrap()
            .await
            .unwrap();
        let mut held = Vec::new();
        let started = Instant::now();
        // One-way streams until the victim's per-connection cap stops the opening. The timeout
        // of an open is shorter than the victim's stream timeout, which would free places.
        let mut uni_sends = Vec::new();
        while let Ok(Ok(mut send)) =
            tokio::time::timeout(Duration::from_millis(200), connection.open_uni()).await
        {
            let _ = send.write_all(&partial).await;
            uni_sends.push(send);
        }
        let uni = uni_sends.len();
        // The victim stops each parked one-way stream after its stream timeout.
        for send in &mut uni_sends {
            let code = tokio::time::timeout(PATIENCE, send.stopped())
                .await
                .expect("a parked one-way stream was never stopped")
                .unwrap();
            assert_eq!(code, Some(quinn::VarInt::from_u32(STOP_STREAM_TIMEOUT)));
        }
        // Dropping a stopped stream resets it, as RFC 9000 (section 3.5) requires of a sender
        // told to stop (a meshwire writer drops its stream on the failed write); the reset ends
        // the stream and frees its place. A peer that never resets keeps its places, which
        // blocks only its own connection: the stopped streams' data is discarded as it arrives.
        drop(uni_sends);
        // A complete message on a new one-way stream of the same connection is delivered.
        let mut send = tokio::time::timeout(PATIENCE, connection.open_uni())
            .await
            .expect("no one-way stream could be opened after the timeout")
            .unwrap();
        send.write_all(&message).await.unwrap();
        send.finish().unwrap();
        let delivered = tokio::time::timeout(PATIENCE, late.recv())
            .await
            .expect("the message after the timeout was not delivered")
            .unwrap();
        assert_eq!(delivered.payload, message_payload);
        // Then requests, each left unfinished. The victim stops and resets each one after its
        // request timeout; the flooder then drops the stream, which resets it (as above) and
        // frees its place, so the flooder keeps opening until it reaches its target. The last
        // `max_concurrent_requests` streams are held when the loop ends.
        let mut bidi = 0usize;
        let mut parked = tokio::task::JoinSet::new();
        while uni + bidi < streams {
            match tokio::time::timeout(PATIENCE, connection.open_bi()).await {
                Ok(Ok((mut send, recv))) => {
                    let _ = send.write_all(&partial).await;
                    parked.spawn(async move {
                        let _ = send.stopped().await;
                        drop(recv);
                    });
                    bidi += 1;
                }
                Ok(Err(error)) => panic!("open failed: {error}"),
                Err(_) => panic!("no request stream could be opened in {PATIENCE:?}"),
            }
            while parked.try_join_next().is_some() {}
        }
        held.push(parked);
        eprintln!(
            "flood unfinished streams: {uni} one-way and {bidi} request streams opened in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        (uni, bidi, (endpoint, connection, held))
    });
    arena.honest_is_served();
    assert!(
        arena.victim.metrics().frame_error_count("request_timeout") > 0,
        "unfinished requests were never reset"
    );
    assert!(
        arena.victim.metrics().frame_error_count("stream_timeout") >= uni as u64,
        "parked one-way streams were not counted"
    );
    let peak = tracked_live_and_peak().1;
    let (endpoint, connection, held) = connection;
    drop(held);
    connection.close(quinn::VarInt::from_u32(0), b"done");
    arena.rt.block_on(endpoint.wait_idle());
    arena.wait_for("the flooder's connection gone", || {
        arena.victim.connected_peers().len() == 2
    });
    let after = arena.settled_heap();
    eprintln!(
        "flood unfinished streams: {} request streams reset and {} one-way streams stopped by timeout",
        arena.victim.metrics().frame_error_count("request_timeout"),
        arena.victim.metrics().frame_error_count("stream_timeout")
    );
    arena.on_victim(move || drop(late));
    assert!(uni + bidi > 0);
    arena.report("unfinished streams", before, peak, after);
}

/// Requests to every reserved protocol on a node that serves none of them get error answers;
/// at most `max_concurrent_requests` are open at once.
#[test]
fn request_floods_at_every_reserved_protocol() {
    let arena = Arena::new();
    let messages = flood_messages();
    let before = arena.settled_heap();
    reset_tracked_peak();
    let victim = arena.victim.peer_id();
    let protocols = SERVICES;
    let refused = arena.rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let mut refused = 0;
        for i in 0..messages {
            if tasks.len() >= 512 {
                refused += usize::from(tasks.join_next().await.unwrap().unwrap());
            }
            let protocol = protocols[i % protocols.len()];
            let attacker = arena.attacker.clone();
            tasks.spawn(async move {
                attacker
                    .request(victim, protocol, Bytes::from_static(&[0xff; 32]), PATIENCE)
                    .await
                    .is_err()
            });
        }
        while let Some(done) = tasks.join_next().await {
            refused += usize::from(done.unwrap());
        }
        refused
    });
    assert_eq!(refused, messages, "every request is refused (no handler)");
    assert_eq!(
        arena.victim.metrics().dropped_count("no_handler"),
        messages as u64,
        "every refusal is counted"
    );
    arena.honest_is_served();
    let peak = tracked_live_and_peak().1;
    let after = arena.settled_heap();
    arena.report("reserved-protocol requests", before, peak, after);
}
