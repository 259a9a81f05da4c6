//! The multipath session over simulated lossy, reordering paths that fail and return.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire_session::proto::{Packet, PathId, Policy, Receiver, Sender, SessionConfig};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
struct PathSpec {
    latency: Duration,
    jitter: Duration,
    loss: f64,
    packets_per_sec: f64,
    /// Intervals (from, to) during which the path drops everything, both ways.
    outages: Vec<(Duration, Duration)>,
}

struct InFlightDatagram {
    at: Instant,
    order: u64,
    to_receiver: bool,
    path: PathId,
    bytes: Bytes,
}

impl PartialEq for InFlightDatagram {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for InFlightDatagram {}
impl PartialOrd for InFlightDatagram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlightDatagram {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// A sender and a receiver joined by emulated paths, stepped from event to event.
struct Pair {
    start: Instant,
    now: Instant,
    sender: Sender,
    receiver: Receiver,
    paths: Vec<PathSpec>,
    departures: Vec<Instant>,
    wire: BinaryHeap<Reverse<InFlightDatagram>>,
    order: u64,
    rng: SmallRng,
    window_bytes: usize,
    max_buffered: usize,
    delivered: Vec<u8>,
    /// (time since start, bytes delivered so far), one entry per read.
    progress: Vec<(Duration, usize)>,
    /// Reads happen only this often, so the receive window fills.
    read_every: Duration,
    next_read: Instant,
}

impl Pair {
    fn new(config: SessionConfig, paths: Vec<PathSpec>, seed: u64, read_every: Duration) -> Self {
        let start = Instant::now();
        let mut sender = Sender::new(config);
        for index in 0..paths.len() {
            sender.add_path(PathId(index as u32), None);
        }
        Self {
            start,
            now: start,
            sender,
            receiver: Receiver::new(config),
            departures: vec![start; paths.len()],
            paths,
            wire: BinaryHeap::new(),
            order: 0,
            rng: SmallRng::seed_from_u64(seed),
            window_bytes: config.receive_window_bytes,
            max_buffered: 0,
            delivered: Vec::new(),
            progress: Vec::new(),
            read_every,
            next_read: start,
        }
    }

    fn is_down(&self, path: usize) -> bool {
        let elapsed = self.now - self.start;
        self.paths[path]
            .outages
            .iter()
            .any(|&(from, to)| from <= elapsed && elapsed < to)
    }

    fn put_on_wire(&mut self, path: PathId, bytes: Bytes, to_receiver: bool) {
        let index = path.0 as usize;
        if self.is_down(index) {
            return;
        }
        let spec = self.paths[index].clone();
        if self.rng.random::<f64>() < spec.loss {
            return;
        }
        let mut at = self.now;
        if to_receiver {
            // Serialization at the path's rate, then latency and jitter (jitter reorders).
            let departs = self.departures[index].max(self.now)
                + Duration::from_secs_f64(1.0 / spec.packets_per_sec);
            self.departures[index] = departs;
            at = departs;
        }
        let jitter = if spec.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.rng.random_range(0..spec.jitter.as_nanos() as u64))
        };
        self.order += 1;
        self.wire.push(Reverse(InFlightDatagram {
            at: at + spec.latency + jitter,
            order: self.order,
            to_receiver,
            path,
            bytes,
        }));
    }

    /// Runs until every byte of `data` is read or `limit` passes; returns whether it finished.
    fn run(&mut self, data: &[u8], limit: Duration) -> bool {
        let mut written = 0;
        loop {
            written += self.sender.write(&data[written..]);
            if written == data.len() {
                self.sender.finish();
            }
            while let Some(transmit) = self.sender.poll_transmit(self.now) {
                self.put_on_wire(transmit.path, transmit.payload, true);
            }
            if self.now >= self.next_read {
                let mut buf = [0u8; 4096];
                loop {
                    let n = self.receiver.read(&mut buf);
                    if n == 0 {
                        break;
                    }
                    self.delivered.extend_from_slice(&buf[..n]);
                }
                if self.progress.last().map(|&(_, bytes)| bytes) != Some(self.delivered.len()) {
                    self.progress
                        .push((self.now - self.start, self.delivered.len()));
                }
                self.next_read = self.now + self.read_every;
            }
            while let Some(transmit) = self.receiver.poll_transmit(self.now) {
                self.put_on_wire(transmit.path, transmit.payload, false);
            }
            if self.receiver.is_finished() {
                return true;
            }
            let candidates = [
                self.wire.peek().map(|Reverse(d)| d.at),
                self.sender.poll_timeout(),
                self.receiver.poll_timeout(),
                (!self.read_every.is_zero()).then_some(self.next_read),
            ];
            let Some(next) = candidates.into_iter().flatten().min() else {
                return false;
            };
            self.now = self.now.max(next);
            if self.now - self.start > limit {
                return false;
            }
            while self.wire.peek().is_some_and(|Reverse(d)| d.at <= self.now) {
                let Some(Reverse(datagram)) = self.wire.pop() else {
                    break;
                };
                let down = self.is_down(datagram.path.0 as usize);
                if down {
                    continue;
                }
                let result = if datagram.to_receiver {
                    let packet = Packet::decode(datagram.bytes, 1 << 16).expect("valid packet");
                    self.receiver.handle_packet(datagram.path, packet, self.now)
                } else {
                    match Packet::decode(datagram.bytes, 1 << 16).expect("valid packet") {
                        Packet::Ack(ack) => self.sender.handle_ack(datagram.path, ack, self.now),
                        other => panic!("sender got {other:?}"),
                    }
                };
                result.expect("a correct peer's packet is accepted");
                self.max_buffered = self.max_buffered.max(self.receiver.buffered_bytes());
            }
            self.sender.handle_timeout(self.now);
        }
    }

    /// Bytes delivered between two instants (since start).
    fn delivered_between(&self, from: Duration, to: Duration) -> usize {
        let at = |time: Duration| {
            self.progress
                .iter()
                .take_while(|(when, _)| *when <= time)
                .last()
                .map_or(0, |&(_, bytes)| bytes)
        };
        at(to) - at(from)
    }
}

fn small_config(policy: Policy) -> SessionConfig {
    let mut config = SessionConfig::new(policy);
    config.mtu_bytes = 256;
    config.receive_window_bytes = 16 * 1024;
    config.send_buffer_bytes = 32 * 1024;
    config
}

fn path_spec() -> impl Strategy<Value = PathSpec> {
    (5u64..60, 0u64..20, 0.0f64..0.2, 100.0f64..2000.0).prop_map(
        |(latency, jitter, loss, packets_per_sec)| PathSpec {
            latency: Duration::from_millis(latency),
            jitter: Duration::from_millis(jitter),
            loss,
            packets_per_sec,
            outages: Vec::new(),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every byte arrives exactly once and in order, the receiver never holds more than its
    /// window, and the session survives every path but the first failing for a while.
    #[test]
    fn delivers_everything_in_order_within_the_window(
        policy in prop_oneof![Just(Policy::Meshwire), Just(Policy::Classic), Just(Policy::Nkp24)],
        first in path_spec(),
        others in proptest::collection::vec(
            (path_spec(), 0u64..3000, 1u64..4000), 1..4),
        len in 1usize..60_000,
        seed in any::<u64>(),
        slow_reader in any::<bool>(),
    ) {
        let mut paths = vec![first];
        for (mut spec, from, length) in others {
            spec.outages.push((Duration::from_millis(from), Duration::from_millis(from + length)));
            paths.push(spec);
        }
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let read_every = if slow_reader { Duration::from_millis(200) } else { Duration::ZERO };
        let config = small_config(policy);
        let mut pair = Pair::new(config, paths, seed, read_every);
        let finished = pair.run(&data, Duration::from_secs(900));
        prop_assert!(finished, "session did not finish");
        prop_assert!(pair.delivered == data, "bytes differ from what was written");
        prop_assert!(pair.max_buffered <= pair.window_bytes);
    }
}

/// The session carries on over the one path left when all others fail at once, and speeds up
/// again when they return.
#[test]
fn survives_losing_all_but_one_path_and_speeds_up_when_they_return() {
    let spec = |outages| PathSpec {
        latency: Duration::from_millis(20),
        jitter: Duration::ZERO,
        loss: 0.01,
        packets_per_sec: 400.0,
        outages,
    };
    let outage = vec![(Duration::from_secs(2), Duration::from_secs(6))];
    let paths = vec![spec(Vec::new()), spec(outage.clone()), spec(outage)];
    let mut config = small_config(Policy::Meshwire);
    config.receive_window_bytes = 64 * 1024;
    config.send_buffer_bytes = 128 * 1024;
    let data = vec![0x5a; 2_500_000];
    let mut pair = Pair::new(config, paths, 7, Duration::ZERO);
    assert!(pair.run(&data, Duration::from_secs(120)));
    assert_eq!(pair.delivered, data);
    let second = |from: u64| {
        pair.delivered_between(Duration::from_secs(from), Duration::from_secs(from + 1))
    };
    let before = second(1);
    let during = second(4);
    let after = second(7);
    eprintln!("bytes delivered per second: before {before}, during {during}, after {after}");
    assert!(during > 0, "the remaining path kept delivering");
    assert!(
        before as f64 > 2.5 * during as f64,
        "three paths beat one: {before} vs {during} bytes/s"
    );
    assert!(
        after as f64 > 2.5 * during as f64,
        "returned paths are used again: {after} vs {during} bytes/s"
    );
    let stats = pair.sender.stats();
    assert!(
        stats.path_failures >= 2 && stats.path_readmissions >= 2,
        "{stats:?}"
    );
}
