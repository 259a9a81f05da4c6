//! The sender and receiver joined by deterministic paths (rate, then fixed latency; ACKs return
//! over the same latency), to check what the window policy learns about each path.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    Packet, PathId, PathState, PathStats, Policy, Receiver, Sender, SenderStats, SessionConfig,
};

/// One-way latency and packets per second of a path.
type Spec = (Duration, f64);
/// A datagram on the wire: arrival, order sent, towards the receiver, path, bytes.
type OnWire = Reverse<(Instant, u64, bool, u32, Bytes)>;

/// What a run leaves: the sender's view of each path, when the last byte was read, its counters.
type Outcome = (Vec<PathStats>, Option<Duration>, SenderStats);

/// Sends `bytes` over `specs` for at most `limit`, dropping every `drop_every[i]`-th datagram
/// towards the receiver on path i (0: none).
fn run(specs: &[Spec], drop_every: &[u64], bytes: usize, limit: Duration) -> Outcome {
    let config = SessionConfig::new(Policy::Meshwire);
    let start = Instant::now();
    let mut now = start;
    let mut sender = Sender::new(config);
    let mut receiver = Receiver::new(config);
    for index in 0..specs.len() {
        sender.add_path(PathId(index as u32), None);
    }
    let mut free_at = vec![start; specs.len()];
    let mut wire: BinaryHeap<OnWire> = BinaryHeap::new();
    let mut order = 0;
    let mut sent_on = vec![0u64; specs.len()];
    let data = vec![0x42; bytes];
    let mut written = 0;
    let mut read = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while now - start <= limit {
        written += sender.write(&data[written..]);
        if written == bytes {
            sender.finish();
        }
        while let Some(transmit) = sender.poll_transmit(now) {
            let index = transmit.path.0 as usize;
            let (latency, rate) = specs[index];
            let slot = &mut free_at[index];
            *slot = (*slot).max(now) + Duration::from_secs_f64(1.0 / rate);
            sent_on[index] += 1;
            let every = drop_every.get(index).copied().unwrap_or(0);
            if every > 0 && sent_on[index] % every == 0 {
                continue;
            }
            order += 1;
            wire.push(Reverse((
                *slot + latency,
                order,
                true,
                transmit.path.0,
                transmit.payload,
            )));
        }
        while let Some(transmit) = receiver.poll_transmit(now) {
            let (latency, _) = specs[transmit.path.0 as usize];
            order += 1;
            wire.push(Reverse((
                now + latency,
                order,
                false,
                transmit.path.0,
                transmit.payload,
            )));
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
            return (stats, Some(now - start), sender.stats());
        }
        let next = [wire.peek().map(|Reverse(d)| d.0), sender.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("something is pending while bytes remain");
        now = now.max(next);
        while wire.peek().is_some_and(|Reverse(d)| d.0 <= now) {
            let Some(Reverse((_, _, to_receiver, path, datagram))) = wire.pop() else {
                break;
            };
            let packet = Packet::decode(datagram, config.mtu_bytes).expect("valid datagram");
            let result = match packet {
                Packet::Ack(ack) if !to_receiver => sender.handle_ack(PathId(path), ack, now),
                other => receiver.handle_packet(PathId(path), other, now),
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
