//! The sender and receiver joined by deterministic paths on the shared test network (rate, then
//! fixed latency; ACKs return over the same latency), to check what the window policy learns about
//! each path.

use std::time::{Duration, Instant};

use meshwire_proto::testnet::{Link, Loss, TestNet};

use super::{
    Packet, PathId, PathState, PathStats, Policy, Receiver, Sender, SenderStats, SessionConfig,
};

/// One-way latency and packets per second of a path.
type Spec = (Duration, f64);

/// One end of one path: the sender's or the receiver's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Sender(u32),
    Receiver(u32),
}

/// What a run leaves: the sender's view of each path, when the last byte was read, its counters.
type Outcome = (Vec<PathStats>, Option<Duration>, SenderStats);

/// Sends `bytes` over `specs` for at most `limit`, dropping every `drop_every[i]`-th datagram
/// towards the receiver on path i (0: none).
fn run(specs: &[Spec], drop_every: &[u64], bytes: usize, limit: Duration) -> Outcome {
    let config = SessionConfig::new(Policy::Meshwire);
    let mut wire = TestNet::new(Instant::now(), 0);
    let mut sender = Sender::new(config);
    let mut receiver = Receiver::new(config);
    for (index, &(latency, rate)) in specs.iter().enumerate() {
        let path = index as u32;
        sender.add_path(PathId(path), None);
        let loss = match drop_every.get(index).copied().unwrap_or(0) {
            0 => Loss::None,
            every => Loss::EveryNth(every),
        };
        let forth = Link::new(latency).with_rate(rate).with_loss(loss);
        wire.link(End::Sender(path), End::Receiver(path), forth)
            .expect("valid path");
        wire.link(End::Receiver(path), End::Sender(path), Link::new(latency))
            .expect("valid path");
    }
    let data = vec![0x42; bytes];
    let mut written = 0;
    let mut read = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while wire.elapsed() <= limit {
        let now = wire.now();
        written += sender.write(&data[written..]);
        if written == bytes {
            sender.finish();
        }
        while let Some(transmit) = sender.poll_transmit(now) {
            let path = transmit.path.0;
            wire.send(End::Sender(path), End::Receiver(path), transmit.payload)
                .expect("sent over a path");
        }
        while let Some(transmit) = receiver.poll_transmit(now) {
            let path = transmit.path.0;
            wire.send(End::Receiver(path), End::Sender(path), transmit.payload)
                .expect("sent over a path");
        }
        loop {
            let n = receiver.read(&mut buf);
            if n == 0 {
                break;
            }
            read += n;
        }
        if read == bytes {
            let stats = sender.paths().map(|(_, stats)| stats).collect();
            return (stats, Some(wire.elapsed()), sender.stats());
        }
        let now = wire
            .step([sender.poll_timeout()])
            .expect("something is pending while bytes remain");
        while let Some(arrival) = wire.poll_arrival() {
            let packet = Packet::decode(arrival.message, config.mtu_bytes).expect("valid datagram");
            let result = match (arrival.to, packet) {
                (End::Sender(path), Packet::Ack(ack)) => sender.handle_ack(PathId(path), ack, now),
                (End::Sender(path) | End::Receiver(path), other) => {
                    receiver.handle_packet(PathId(path), other, now)
                }
            };
            result.expect("a correct peer's datagram is accepted");
        }
        sender.handle_timeout(now);
    }
    let stats = sender.paths().map(|(_, stats)| stats).collect();
    (stats, None, sender.stats())
}

const SHORT: Spec = (Duration::from_millis(50), 1024.0);
/// RTT 1 s plus serialization: its first ACK comes back just after the 1 s initial RTO.
const LONG: Spec = (Duration::from_millis(500), 128.0);

fn assert_measured(stats: &PathStats) {
    let rtt = stats
        .smoothed_rtt
        .expect("the long path's RTT was measured");
    assert!(
        rtt >= Duration::from_secs(1) && rtt < Duration::from_secs(3),
        "RTT {rtt:?}"
    );
    assert_eq!(stats.state, PathState::Active);
    // Its window follows its bandwidth-delay product (128 packets/s × 1 s), not the first burst.
    assert!(stats.window_packets > 100.0, "{stats:?}");
}

/// A lone long path whose first ACK arrives just after its initial RTO fired: the late ACK still
/// measures the RTT and brings the path back.
#[test]
fn late_first_ack_after_initial_rto_measures_rtt() {
    let (stats, _, _) = run(&[LONG], &[], 1 << 20, Duration::from_secs(6));
    assert_measured(&stats[0]);
}

/// A long path next to a short one: its segments are acknowledged first through the short path's
/// ranges, and its own ACKs (with the echoed packet number) come a second later; those still
/// measure its RTT, so its window grows to its bandwidth-delay product and it carries its share.
#[test]
fn long_path_beside_short_path_measures_rtt() {
    let (stats, done, _) = run(&[SHORT, LONG], &[], 4 << 20, Duration::from_secs(30));
    assert_measured(&stats[1]);
    let done = done.expect("the transfer finished");
    // 4 MiB at 1152 packets/s takes 3.6 s; with the long path idle it would take 4 s.
    assert!(
        stats[1].delivered_packets > 200,
        "{:?} after {done:?}",
        stats[1]
    );
}

/// A clean path beside one that loses every tenth packet: the sender's loss estimate finds the
/// lossy path, and once no new data is left the idle paths carry copies of unacknowledged
/// segments (the end of the data no longer waits for loss detection), while every byte still
/// arrives exactly once (the receiver reads exactly the bytes written).
#[test]
fn lossy_path_is_measured_and_tail_copied() {
    let (stats, done, counters) = run(&[SHORT, SHORT], &[0, 10], 2 << 20, Duration::from_secs(30));
    done.expect("the transfer finished");
    assert!(stats[0].loss_rate < 0.01, "{:?}", stats[0]);
    assert!((0.03..0.3).contains(&stats[1].loss_rate), "{:?}", stats[1]);
    assert!(counters.tail_copies > 0, "{counters:?}");
    assert!(counters.fast_retransmits > 0, "{counters:?}");
}

/// Without loss nothing is copied: the tail copies cost capacity only where a path loses packets.
#[test]
fn clean_paths_send_no_tail_copies() {
    let (_, done, counters) = run(&[SHORT, SHORT], &[], 2 << 20, Duration::from_secs(30));
    done.expect("the transfer finished");
    assert_eq!(counters.tail_copies, 0, "{counters:?}");
    assert_eq!(counters.retransmissions, 0, "{counters:?}");
}
