//! Floods from one peer against a running object service: the victim's heap stays within its
//! bounds, every flood request is refused or answered and counted by reason, and an honest member
//! still stores and fetches throughout.
//!
//! The victim daemon (node, object service, in-memory store) runs on its own runtime, whose
//! threads (the store's blocking pool included) are the counting allocator's tracked context, so
//! the heap measured is the victim's alone. `MESHWIRE_FLOOD_MESSAGES` sets the flood size (default
//! 20,000); `bench/floods.sh` runs the same floods with 1,000,000 in release.
#![cfg(feature = "net")]

use std::cell::Cell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire::protocols::{
    OBJECT_CAS as CAS, OBJECT_FETCH as FETCH, OBJECT_STAMPS as STAMPS, OBJECT_STORE as STORE,
    OBJECT_SYNC as SYNC,
};
use meshwire::{Keypair, Limits, Node, NodeConfig, PeerId, ProtocolId, RequestError};
use meshwire_alloc_count::{
    clear_tracker, mark_thread, reset_tracked_peak, track_marked_threads, tracked_live_and_peak,
    CountingAllocator,
};
use meshwire_objects::net::{Daemon, ObjectConfig};
use meshwire_objects::proto::cas::{self, Phase, Precondition};
use meshwire_objects::proto::entropy::{self, ExchangeLimits, Summary};
use meshwire_objects::proto::object::{self, content_hash, FetchMode, Fetched, Refusal, Stamp};
use meshwire_objects::proto::stamps;
use tokio::runtime::Runtime;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const MIB: f64 = 1024.0 * 1024.0;
const DEADLINE: Duration = Duration::from_secs(20);
/// Requests a flooder keeps in flight (the victim serves 256 at once per connection).
const IN_FLIGHT: usize = 512;
/// Oversized store requests a flooder keeps in flight.
const OVERSIZED_IN_FLIGHT: usize = 64;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

fn flood_messages() -> usize {
    std::env::var("MESHWIRE_FLOOD_MESSAGES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20_000)
}

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

fn node_config(seed: u8) -> NodeConfig {
    let mut config = NodeConfig::new(Keypair::from_seed([seed; 32]));
    config.rng_seed = Some(u64::from(seed));
    config
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

const VICTIM: u8 = 1;
const HONEST: u8 = 2;
const MEMBER_FLOODER: u8 = 3;
const OUTSIDER: u8 = 4;

fn peer(seed: u8) -> PeerId {
    Keypair::from_seed([seed; 32]).peer_id()
}

/// The victim daemon on its own thread and runtime; the flooder and an honest member as bare
/// nodes on the test thread's runtime.
struct Arena {
    _exclusive: std::sync::MutexGuard<'static, ()>,
    victim_thread: Option<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    rt: Runtime,
    victim: Node,
    flooder: Node,
    honest: Node,
    honest_writes: u64,
}

impl Arena {
    /// `flooder_seed` is a member's seed or the outsider's; `flooder_limits` lets it send frames
    /// the victim's limits refuse.
    fn new(flooder_seed: u8, flooder_limits: Limits) -> Self {
        let exclusive = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        track_marked_threads();
        let (node_tx, node_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let victim_thread = std::thread::spawn(move || {
            mark_thread(true);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_start(|| mark_thread(true))
                .build()
                .unwrap();
            rt.block_on(async move {
                let objects = ObjectConfig {
                    // Only the floods' requests reach the store.
                    anti_entropy_interval: Duration::ZERO,
                    ..ObjectConfig::default()
                };
                let daemon = Daemon::builder(objects)
                    .members([peer(VICTIM), peer(HONEST), peer(MEMBER_FLOODER)])
                    .bind(loopback(), |config| *config = node_config(VICTIM))
                    .await
                    .unwrap();
                node_tx.send(daemon.node().clone()).unwrap();
                let _ = stopped.await;
                daemon.shutdown().await.unwrap();
            });
        });
        let victim = node_rx.recv().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (flooder, honest) = rt.block_on(async {
            let mut flooder_config = node_config(flooder_seed);
            flooder_config.limits = flooder_limits;
            let flooder = Node::bind(flooder_config, loopback()).unwrap();
            let honest = Node::bind(node_config(HONEST), loopback()).unwrap();
            for node in [&flooder, &honest] {
                node.connect(victim.local_addr().unwrap(), victim.peer_id())
                    .await
                    .unwrap();
            }
            (flooder, honest)
        });
        Self {
            _exclusive: exclusive,
            victim_thread: Some(victim_thread),
            stop: Some(stop),
            rt,
            victim,
            flooder,
            honest,
            honest_writes: 0,
        }
    }

    /// The honest member stores a new version of its key on the victim and fetches it back.
    fn honest_is_served(&mut self) {
        self.honest_writes += 1;
        let content = format!("honest write {}", self.honest_writes).into_bytes();
        let stamp = Stamp {
            version: self.honest_writes,
            hash: content_hash(&content),
        };
        let mut store = object::encode_store_header(1, "honest", &stamp);
        store.extend_from_slice(&content);
        let victim = self.victim.peer_id();
        let (stored, fetched) = self.rt.block_on(async {
            let stored = self
                .honest
                .request(victim, STORE, Bytes::from(store), DEADLINE)
                .await
                .expect("the honest member's store was not served");
            let fetch = object::encode_fetch(1, FetchMode::Full, "honest");
            let fetched = self
                .honest
                .request(victim, FETCH, Bytes::from(fetch), DEADLINE)
                .await
                .expect("the honest member's fetch was not served");
            (stored, fetched)
        });
        let stored = object::decode_stored(&stored).unwrap();
        assert_eq!(stored.answer, Ok(object::Stored::Holds));
        let answer = object::decode_fetched(FetchMode::Full, &fetched, 1 << 20).unwrap();
        match answer.answer {
            Ok(Fetched::Present {
                stamp: held,
                content: Some(range),
            }) => {
                assert_eq!(held, stamp);
                assert_eq!(&fetched[range], &content[..]);
            }
            other => panic!("the honest member's copy is not served: {other:?}"),
        }
    }

    /// The victim's live heap once it has settled (a few honest round trips and a pause).
    fn settled_heap(&mut self) -> i64 {
        for _ in 0..3 {
            self.honest_is_served();
            self.rt
                .block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
        }
        tracked_live_and_peak().0
    }

    /// The most a flood may add to the victim's heap: what the flooder's connection can make it
    /// hold (its receive window, twice the bandwidth-delay product), request bodies read out of
    /// that window (at most the node's request budget, `inbound_request_bytes`, or for small
    /// requests as much as the window again, as for a bare node in
    /// `crates/meshwire/tests/floods.rs`), and 8 MiB for per-stream and per-request state.
    fn bound_bytes(&self) -> i64 {
        let config = self.victim.config();
        let window = 2 * config.transport.bdp_bytes() as i64;
        let requests = window.max(i64::from(config.inbound_request_bytes));
        window + requests + (8 << 20)
    }

    /// The value of the counter `name` with label `reason` in the victim's metrics (0 when absent).
    fn counted(&self, name: &str, reason: &str) -> u64 {
        let text = self.victim.metrics().encode_text();
        let prefix = format!("{name}{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0)
    }

    fn report(&self, flood: &str, before: i64, peak: i64, after: i64) {
        eprintln!(
            "flood {flood}: victim heap before {:.1} MiB, peak {:.1} MiB (bound {:.1} MiB), after {:.1} MiB; \
             process RSS (victim, flooder and honest member) {:.0} MiB",
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

    /// Sends `count` requests from the flooder, `in_flight` at a time, the `i`th made by
    /// `request(i)`, and hands each result to `check`.
    fn flood(
        &self,
        count: usize,
        in_flight: usize,
        request: impl Fn(usize) -> (ProtocolId, Bytes),
        check: impl Fn(usize, ProtocolId, Result<Bytes, RequestError>),
    ) {
        let victim = self.victim.peer_id();
        let started = Instant::now();
        self.rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..count {
                if tasks.len() >= in_flight {
                    let (i, protocol, result) = tasks.join_next().await.unwrap().unwrap();
                    check(i, protocol, result);
                }
                let (protocol, body) = request(i);
                let flooder = self.flooder.clone();
                tasks.spawn(async move {
                    let result = flooder.request(victim, protocol, body, DEADLINE).await;
                    (i, protocol, result)
                });
            }
            while let Some(done) = tasks.join_next().await {
                let (i, protocol, result) = done.unwrap();
                check(i, protocol, result);
            }
        });
        eprintln!(
            "flood requests: {count} answered in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.victim_thread.take() {
            let _ = thread.join();
        }
        clear_tracker();
    }
}

/// A well-formed request on each object protocol in turn, for key `key-{i}`.
fn object_request(i: usize) -> (ProtocolId, Bytes) {
    let key = format!("key-{i}");
    let content = b"flood content";
    let stamp = Stamp {
        version: 1,
        hash: content_hash(content),
    };
    let body = match i % 5 {
        0 => (FETCH, object::encode_fetch(1, FetchMode::Full, &key)),
        1 => {
            let mut body = object::encode_store_header(1, &key, &stamp);
            body.extend_from_slice(content);
            (STORE, body)
        }
        2 => {
            let mut body =
                cas::encode_cas_header(1, Phase::Prepare(Precondition::Absent), &key, &stamp);
            body.extend_from_slice(content);
            (CAS, body)
        }
        3 => (
            STAMPS,
            stamps::encode_stamps_request(1, &[key.clone(), format!("{key}-b")]),
        ),
        _ => {
            let placement = entropy::placement_id(&[], 3);
            let digests = Summary::new(8).unwrap();
            (
                SYNC,
                entropy::encode_digests(1, &placement, digests.digests()),
            )
        }
    };
    (body.0, Bytes::from(body.1))
}

/// Whether `reply`, an answer on `protocol`, is a refusal for `reason`.
fn refused_for(protocol: ProtocolId, reply: &[u8], reason: Refusal) -> bool {
    let refusal = if protocol == FETCH {
        object::decode_fetched(FetchMode::Full, reply, 1 << 20)
            .unwrap()
            .answer
            .err()
    } else if protocol == STORE {
        object::decode_stored(reply).unwrap().answer.err()
    } else if protocol == CAS {
        cas::decode_cas_answer(reply).unwrap().1.err()
    } else if protocol == STAMPS {
        stamps::decode_stamps_answer(reply, 2).unwrap().answer.err()
    } else {
        entropy::decode_entries(reply, 8, ExchangeLimits::default())
            .unwrap()
            .answer
            .err()
    };
    refusal == Some(reason)
}

/// A non-member's fetch, store, conditional-write, stamps and digest requests are all refused
/// before the store is touched, and counted as `not_member`.
#[test]
fn a_non_member_flooding_every_object_request_is_refused() {
    let mut arena = Arena::new(OUTSIDER, Limits::default());
    let messages = flood_messages();
    let before = arena.settled_heap();
    reset_tracked_peak();
    let counter = "meshwire_object_refused_requests_total";
    let refused_before = arena.counted(counter, "not_member");
    arena.flood(
        messages,
        IN_FLIGHT,
        object_request,
        |i, protocol, result| {
            let reply = result.unwrap_or_else(|error| panic!("request {i} failed: {error}"));
            assert!(
                refused_for(protocol, &reply, Refusal::NotMember),
                "request {i} was not refused"
            );
        },
    );
    assert_eq!(
        arena.counted(counter, "not_member") - refused_before,
        messages as u64
    );
    arena.honest_is_served();
    let peak = tracked_live_and_peak().1;
    let after = arena.settled_heap();
    assert!(
        arena.victim.connected_peers().contains(&peer(OUTSIDER)),
        "a refused request breaks no protocol: the outsider stays connected"
    );
    arena.report("non-member object requests", before, peak, after);
}

/// A member fetching keys nobody stored gets `Absent` answers and stays connected. Each kind of
/// malformed request (a fetch of an invalid key, a store whose content does not match its hash,
/// a conditional write cut short) gets an error answer, is counted as `malformed`, and closes
/// the sender's connection; the sender may dial again, and the honest member is served throughout.
#[test]
fn a_member_flooding_missing_keys_and_malformed_requests_is_answered() {
    let mut arena = Arena::new(MEMBER_FLOODER, Limits::default());
    let messages = flood_messages();
    let before = arena.settled_heap();
    reset_tracked_peak();
    let fetch_missing = |i: usize| -> (ProtocolId, Bytes) {
        let key = format!("missing-{i}");
        (
            FETCH,
            Bytes::from(object::encode_fetch(1, FetchMode::Metadata, &key)),
        )
    };
    arena.flood(messages, IN_FLIGHT, fetch_missing, |i, _, result| {
        let reply = result.unwrap_or_else(|error| panic!("fetch {i} failed: {error}"));
        let answer = object::decode_fetched(FetchMode::Metadata, &reply, 0).unwrap();
        assert_eq!(answer.answer, Ok(Fetched::Absent), "fetch {i}");
    });
    assert!(
        arena
            .victim
            .connected_peers()
            .contains(&peer(MEMBER_FLOODER)),
        "fetches of missing keys break no protocol: the member stays connected"
    );
    let counter = "meshwire_object_refused_requests_total";
    let malformed_before = arena.counted(counter, "malformed");
    let closed_before = arena
        .victim
        .metrics()
        .frame_error_count("malformed_request");
    let stamp = Stamp {
        version: 1,
        hash: content_hash(b"the real content"),
    };
    // A fetch of a key no valid request can name (an unknown mode would only be refused: a
    // newer version may send one).
    let bad_key = object::encode_fetch(1, FetchMode::Full, "bad key!");
    let mut bad_hash = object::encode_store_header(1, "bad", &stamp);
    bad_hash.extend_from_slice(b"something else");
    let prepare = cas::encode_cas_header(1, Phase::Prepare(Precondition::Absent), "bad", &stamp);
    let cut_short = prepare[..prepare.len() - 3].to_vec();
    let malformed = [(FETCH, bad_key), (STORE, bad_hash), (CAS, cut_short)];
    let victim = (arena.victim.local_addr().unwrap(), arena.victim.peer_id());
    for (protocol, body) in malformed {
        let result = arena.rt.block_on(async {
            if !arena.flooder.connected_peers().contains(&victim.1) {
                arena.flooder.connect(victim.0, victim.1).await.unwrap();
            }
            let asked = arena
                .flooder
                .request(victim.1, protocol, Bytes::from(body), DEADLINE);
            let result = asked.await;
            let closed = tokio::time::timeout(DEADLINE, async {
                while arena
                    .victim
                    .connected_peers()
                    .contains(&peer(MEMBER_FLOODER))
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            closed
                .await
                .expect("the malformed request's sender is still connected");
            result
        });
        assert!(
            matches!(result, Err(RequestError::Remote(ref text)) if text.contains("malformed")),
            "malformed request on {protocol:?}: {result:?}"
        );
        arena.honest_is_served();
    }
    assert_eq!(arena.counted(counter, "malformed") - malformed_before, 3);
    assert_eq!(
        arena
            .victim
            .metrics()
            .frame_error_count("malformed_request")
            - closed_before,
        3
    );
    let peak = tracked_live_and_peak().1;
    let after = arena.settled_heap();
    arena.report(
        "member missing-key and malformed requests",
        before,
        peak,
        after,
    );
}

/// Store requests over the frame limit are answered `TooLarge` after the header, before their
/// payload is read (counted `too_large`); store requests within the frame limit whose content is
/// over `max_object_bytes` are read and refused (counted `too_large` among the object service's
/// refusals); neither breaks the protocol, so the connection stays.
#[test]
fn oversized_store_frames_are_refused_unread() {
    // The flooder's own limit lets it send frames of 32 MiB; the victim's is 16 MiB.
    let mut arena = Arena::new(
        MEMBER_FLOODER,
        Limits {
            max_payload_bytes: 32 << 20,
        },
    );
    // Each is megabytes on the wire: fewer than the message floods.
    let count = (flood_messages() / 100).clamp(20, 2_000);
    let before = arena.settled_heap();
    reset_tracked_peak();
    let frame_limit = Limits::default().max_payload_bytes as usize;
    let max_object = ObjectConfig::default().max_object_bytes;
    let store = |len: usize| {
        let content = vec![5u8; len];
        let stamp = Stamp {
            version: 1,
            hash: content_hash(&content),
        };
        let mut body = object::encode_store_header(1, &format!("big-{len}"), &stamp);
        body.extend_from_slice(&content);
        Bytes::from(body)
    };
    let over_frame = store(frame_limit + (1 << 20));
    let over_object = store(max_object + 1);
    let too_large_before = arena.victim.metrics().frame_error_count("too_large");
    let refused_before = arena.counted("meshwire_object_refused_requests_total", "too_large");
    let request = |i: usize| -> (ProtocolId, Bytes) {
        let body = if i % 2 == 0 {
            &over_frame
        } else {
            &over_object
        };
        (STORE, body.clone())
    };
    let busy_before = arena.victim.metrics().dropped_count("request_budget");
    let (refused, busy) = (Cell::new(0u64), Cell::new(0u64));
    arena.flood(count, OVERSIZED_IN_FLIGHT, request, |i, _, result| {
        if i % 2 == 0 {
            assert!(
                matches!(result, Err(RequestError::RemoteTooLarge(_))),
                "store over the frame limit {i}: {result:?}"
            );
            return;
        }
        // Read and refused as too large, or refused unread while the request budget was full.
        match result {
            Err(RequestError::Remote(ref text)) if text.contains("exceeds the maximum") => {
                refused.set(refused.get() + 1);
            }
            Err(RequestError::Busy(_)) => {
                busy.set(busy.get() + 1);
            }
            other => panic!("store over max_object_bytes {i}: {other:?}"),
        }
    });
    eprintln!(
        "flood oversized stores: {count} sent, {} refused after the header, {} read and refused \
         as too large, {} refused for the request budget",
        count.div_ceil(2),
        refused.get(),
        busy.get()
    );
    assert_eq!(
        arena.victim.metrics().frame_error_count("too_large") - too_large_before,
        count.div_ceil(2) as u64
    );
    assert_eq!(
        arena.counted("meshwire_object_refused_requests_total", "too_large") - refused_before,
        refused.get()
    );
    assert_eq!(
        arena.victim.metrics().dropped_count("request_budget") - busy_before,
        busy.get()
    );
    assert_eq!(refused.get() + busy.get(), (count / 2) as u64);
    assert!(refused.get() > 0, "no oversized object was ever read");
    assert!(arena
        .victim
        .connected_peers()
        .contains(&peer(MEMBER_FLOODER)));
    arena.honest_is_served();
    let peak = tracked_live_and_peak().1;
    let after = arena.settled_heap();
    // What stays above `before` (1.4-1.9 MiB in runs on 2026-12-02, flat over 3 s) is held by
    // the flooder's connection and freed with it. A likely holder, from quinn-proto 0.11.19's
    // source (not measured apart): a connection pools the receive state of its finished streams
    // (`StreamsState::free_recv`) and each keeps its reassembly heap's capacity, so 64 large
    // streams at once leave that much until the connection closes.
    arena
        .victim
        .close_for_violation(peer(MEMBER_FLOODER), "flood_over");
    let closed = arena.settled_heap();
    eprintln!(
        "flood oversized stores: victim heap {:.1} MiB with the flooder's connection still open",
        after as f64 / MIB
    );
    // Once the flood is over (its connection gone), within 10% of before, with no slack: 5.8 MiB
    // before, 6.0-6.6 MiB with the connection open (and once in eight debug runs over 10% + 1 MiB
    // above before, which failed this test when it checked the heap before the close), 5.7 MiB
    // closed.
    assert!(
        closed as f64 <= 1.1 * before as f64,
        "heap {closed} B after the flood, {before} B before"
    );
    arena.report("oversized stores", before, peak, closed);
}
