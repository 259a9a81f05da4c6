//! The multipath session on the shared test network: lossy, reordering, duplicating paths that
//! fail and return, or that the sender removes and adds again.

use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire_proto::testnet::{Link, Loss, TestNet};
use meshwire_session::proto::{Packet, PathId, Policy, Receiver, Sender, SessionConfig};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct PathSpec {
    latency: Duration,
    jitter: Duration,
    loss: f64,
    packets_per_sec: f64,
    /// Intervals (from, to) during which the path drops everything, both ways.
    outages: Vec<(Duration, Duration)>,
    /// Every this many datagrams on the path (either way), one goes twice (the copy crosses
    /// with its own jitter, so it may arrive first or much later).
    duplicate_every: Option<u64>,
    /// The sender removes the path at the first instant and adds it again at the second (its
    /// in-flight packets go again on the others; the re-added path is measured afresh).
    removed: Option<(Duration, Duration)>,
}

/// Where a path stands in its removal schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    Never,
    Due { from: Instant, to: Instant },
    Removed { to: Instant },
    Done,
}

/// One end of one path: the sender's or the receiver's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Sender(u32),
    Receiver(u32),
}

/// A sender and a receiver joined by emulated paths on the shared test network, stepped from
/// event to event.
struct Pair {
    wire: TestNet<End, Bytes>,
    /// Per path: datagrams sent so far (both ways), and one in every how many goes twice.
    duplicates: Vec<(u64, Option<u64>)>,
    removals: Vec<Removal>,
    sender: Sender,
    receiver: Receiver,
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
        let mut wire = TestNet::new(Instant::now(), seed);
        let start = wire.now();
        let mut sender = Sender::new(config);
        for (index, spec) in paths.iter().enumerate() {
            let path = index as u32;
            sender.add_path(PathId(path), None);
            // Outages, loss, latency and jitter (which reorders) both ways; serialization at the
            // path's rate only towards the receiver.
            let back = Link {
                latency: spec.latency,
                jitter: spec.jitter,
                rate: None,
                loss: Loss::Random(spec.loss),
                outages: spec.outages.iter().map(|&(from, to)| from..to).collect(),
            };
            let forth = back.clone().with_rate(spec.packets_per_sec);
            wire.link(End::Sender(path), End::Receiver(path), forth)
                .expect("valid path");
            wire.link(End::Receiver(path), End::Sender(path), back)
                .expect("valid path");
        }
        Self {
            next_read: wire.now(),
            duplicates: paths.iter().map(|spec| (0, spec.duplicate_every)).collect(),
            removals: paths
                .iter()
                .map(|spec| match spec.removed {
                    Some((from, to)) => Removal::Due {
                        from: start + from,
                        to: start + to,
                    },
                    None => Removal::Never,
                })
                .collect(),
            wire,
            sender,
            receiver: Receiver::new(config),
            window_bytes: config
                .max_receive_window_bytes
                .max(config.receive_window_bytes),
            max_buffered: 0,
            delivered: Vec::new(),
            progress: Vec::new(),
            read_every,
        }
    }

    /// Puts `payload` on path `path` from `from` to `to`, twice when the path's turn to
    /// duplicate comes.
    fn send(&mut self, path: u32, from: End, to: End, payload: Bytes) {
        let (sent, every) = &mut self.duplicates[path as usize];
        *sent += 1;
        let twice = every.is_some_and(|every| *sent % every == 0);
        if twice {
            self.wire
                .send(from, to, payload.clone())
                .expect("sent over a path");
        }
        self.wire.send(from, to, payload).expect("sent over a path");
    }

    /// Removes and re-adds the sender's paths as their schedules say; the next instant one is
    /// due.
    fn apply_removals(&mut self, now: Instant) -> Option<Instant> {
        for (index, removal) in self.removals.iter_mut().enumerate() {
            let path = PathId(index as u32);
            if let Removal::Due { from, to } = *removal {
                if now >= from {
                    self.sender.remove_path(path);
                    *removal = Removal::Removed { to };
                }
            }
            if let Removal::Removed { to } = *removal {
                if now >= to {
                    self.sender.add_path(path, None);
                    *removal = Removal::Done;
                }
            }
        }
        self.removals
            .iter()
            .filter_map(|removal| match *removal {
                Removal::Due { from, .. } => Some(from),
                Removal::Removed { to } => Some(to),
                Removal::Never | Removal::Done => None,
            })
            .min()
    }

    /// Runs until every byte of `data` is read or `limit` passes; returns whether it finished.
    fn run(&mut self, data: &[u8], limit: Duration) -> bool {
        let mut written = 0;
        loop {
            let now = self.wire.now();
            let next_removal = self.apply_removals(now);
            written += self.sender.write(&data[written..]);
            if written == data.len() {
                self.sender.finish();
            }
            while let Some(transmit) = self.sender.poll_transmit(now) {
                let path = transmit.path.0;
                self.send(
                    path,
                    End::Sender(path),
                    End::Receiver(path),
                    transmit.payload,
                );
            }
            if now >= self.next_read {
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
                        .push((self.wire.elapsed(), self.delivered.len()));
                }
                self.next_read = now + self.read_every;
            }
            while let Some(transmit) = self.receiver.poll_transmit(now) {
                let path = transmit.path.0;
                self.send(
                    path,
                    End::Receiver(path),
                    End::Sender(path),
                    transmit.payload,
                );
            }
            if self.receiver.is_finished() {
                return true;
            }
            let timers = [
                self.sender.poll_timeout(),
                self.receiver.poll_timeout(),
                (!self.read_every.is_zero()).then_some(self.next_read),
                next_removal,
            ];
            let Some(now) = self.wire.step(timers) else {
                return false;
            };
            if self.wire.elapsed() > limit {
                return false;
            }
            while let Some(arrival) = self.wire.poll_arrival() {
                let packet = Packet::decode(arrival.message, 1 << 16).expect("valid packet");
                let result = match arrival.to {
                    End::Receiver(path) => self.receiver.handle_packet(PathId(path), packet, now),
                    End::Sender(path) => match packet {
                        Packet::Ack(ack) => self.sender.handle_ack(PathId(path), ack, now),
                        other => panic!("sender got {other:?}"),
                    },
                };
                result.expect("a correct peer's packet is accepted");
                self.max_buffered = self.max_buffered.max(self.receiver.buffered_bytes());
            }
            self.sender.handle_timeout(now);
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
    // meshwire's window may grow to four times its start, as by default.
    config.max_receive_window_bytes = match policy {
        Policy::Meshwire => 64 * 1024,
        Policy::Classic | Policy::Nkp24 => 16 * 1024,
    };
    config.send_buffer_bytes = 2 * config.max_receive_window_bytes;
    config
}

fn path_spec() -> impl Strategy<Value = PathSpec> {
    (
        5u64..60,
        0u64..20,
        0.0f64..0.2,
        100.0f64..2000.0,
        proptest::option::of(3u64..40),
    )
        .prop_map(
            |(latency, jitter, loss, packets_per_sec, duplicate_every)| PathSpec {
                latency: Duration::from_millis(latency),
                jitter: Duration::from_millis(jitter),
                loss,
                packets_per_sec,
                outages: Vec::new(),
                duplicate_every,
                removed: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every byte arrives exactly once and in order, the receiver never holds more than its
    /// largest window, and the session survives every path but the first failing for a while
    /// (an outage) or being removed by the sender and added again, on paths that lose,
    /// reorder and duplicate datagrams.
    #[test]
    fn delivers_everything_in_order_within_the_window(
        policy in prop_oneof![Just(Policy::Meshwire), Just(Policy::Classic), Just(Policy::Nkp24)],
        first in path_spec(),
        others in proptest::collection::vec(
            (path_spec(), 0u64..3000, 1u64..4000, any::<bool>()), 1..4),
        len in 1usize..60_000,
        seed in any::<u64>(),
        slow_reader in any::<bool>(),
    ) {
        let mut paths = vec![first];
        for (mut spec, from, length, removed) in others {
            let window = (Duration::from_millis(from), Duration::from_millis(from + length));
            if removed {
                spec.removed = Some(window);
            } else {
                spec.outages.push(window);
            }
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
        duplicate_every: None,
        removed: None,
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

/// NKP-0024 with a path removed and added again 1 ms later (the case the proptest above found):
/// the copies the removed path carried went again elsewhere while a copy NCP's check had timed
/// out still counted as on its way, so no segment was queued and the session stalled with 3,840
/// of 16,129 bytes delivered. It finishes, whole.
#[test]
fn an_ncp_session_finishes_after_a_path_is_removed_and_added_again() {
    let path = |latency: u64, jitter: u64, loss: f64, packets_per_sec: f64| PathSpec {
        latency: Duration::from_millis(latency),
        jitter: Duration::from_millis(jitter),
        loss,
        packets_per_sec,
        outages: Vec::new(),
        duplicate_every: None,
        removed: None,
    };
    let mut removed = path(5, 1, 0.118, 100.0);
    removed.removed = Some((Duration::from_millis(2451), Duration::from_millis(2452)));
    let mut interrupted = path(5, 0, 0.0, 1232.0);
    interrupted
        .outages
        .push((Duration::from_millis(56), Duration::from_millis(57)));
    let paths = vec![path(5, 0, 0.1967, 1778.0), removed, interrupted];
    let data: Vec<u8> = (0..16_129usize).map(|i| (i * 7 + i / 251) as u8).collect();
    for policy in [Policy::Nkp24, Policy::Classic, Policy::Meshwire] {
        let mut pair = Pair::new(
            small_config(policy),
            paths.clone(),
            1_345_882_810_359_860_171,
            Duration::ZERO,
        );
        assert!(
            pair.run(&data, Duration::from_secs(900)),
            "{policy:?}: delivered {} of {} bytes",
            pair.delivered.len(),
            data.len()
        );
        assert_eq!(pair.delivered, data, "{policy:?}");
    }
}
