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

/// What a run leaves: the sender's view of each path, when the last byte was read, its counters,
/// and the receiver's.
type Outcome = (Vec<PathStats>, Option<Duration>, SenderStats, ReceiverView);

/// The receiver over a run: its window at the end, its growths, the most bytes it held.
#[derive(Debug, Clone, Copy, Default)]
struct ReceiverView {
    window_segments: u64,
    window_growths: u64,
    max_buffered_bytes: usize,
}

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
    let mut view = ReceiverView::default();
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
        view.max_buffered_bytes = view.max_buffered_bytes.max(receiver.buffered_bytes());
        loop {
            let n = receiver.read(&mut buf);
            if n == 0 {
                break;
            }
            read += n;
        }
        view.window_segments = receiver.window_segments();
        view.window_growths = receiver.window_growths();
        if read == bytes {
            let stats = sender.paths().map(|(_, stats)| stats).collect();
            return (stats, Some(wire.elapsed()), sender.stats(), view);
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
    (stats, None, sender.stats(), view)
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
    let (stats, _, _, _) = run(&[LONG], &[], 1 << 20, Duration::from_secs(6));
    assert_measured(&stats[0]);
}

/// A long path next to a short one: its segments are acknowledged first through the short path's
/// ranges, and its own ACKs (with the echoed packet number) come a second later; those still
/// measure its RTT, so its window grows to its bandwidth-delay product and it carries its share.
#[test]
fn long_path_beside_short_path_measures_rtt() {
    let (stats, done, _, _) = run(&[SHORT, LONG], &[], 4 << 20, Duration::from_secs(30));
    assert_measured(&stats[1]);
    let done = done.expect("the transfer finished");
    // 4 MiB at 1152 packets/s takes 3.6 s; with the long path idle it would take 4 s.
    assert!(
        stats[1].delivered_packets > 200,
        "{:?} after {done:?}",
        stats[1]
    );
}

/// One path whose bandwidth-delay product (20,000 packets/s × 0.4 s, 8,000 segments) is twice the
/// starting receive window (4,096 segments): the sender flags the segments the window stops, the
/// receiver (whose application reads at once) doubles its window up to the largest, and the
/// transfer goes faster than any 4 MiB window allows, while the receiver never holds more than
/// the largest window.
#[test]
fn a_window_that_stops_a_sender_on_a_fast_long_path_grows_to_its_bound() {
    const FAST_LONG: Spec = (Duration::from_millis(200), 20_000.0);
    let bytes = 24 << 20;
    let (_, done, _, view) = run(&[FAST_LONG], &[], bytes, Duration::from_secs(30));
    let done = done.expect("the transfer finished");
    let config = SessionConfig::new(Policy::Meshwire);
    assert!(view.window_growths >= 1, "{view:?}");
    assert_eq!(
        view.window_segments,
        config.max_window_segments(),
        "{view:?}"
    );
    assert!(
        view.max_buffered_bytes <= config.max_receive_window_bytes,
        "{view:?}"
    );
    // A 4 MiB window per 0.4 s round trip moves 24 MiB in 2.4 s at best.
    assert!(done < Duration::from_millis(2400), "{done:?} {view:?}");
}

/// A clean path beside one that loses every tenth packet: the sender's loss estimate finds the
/// lossy path, and once no new data is left the idle paths carry copies of unacknowledged
/// segments (the end of the data no longer waits for loss detection), while every byte still
/// arrives exactly once (the receiver reads exactly the bytes written).
#[test]
fn lossy_path_is_measured_and_tail_copied() {
    let (stats, done, counters, _) =
        run(&[SHORT, SHORT], &[0, 10], 2 << 20, Duration::from_secs(30));
    done.expect("the transfer finished");
    assert!(stats[0].loss_rate < 0.01, "{:?}", stats[0]);
    assert!((0.03..0.3).contains(&stats[1].loss_rate), "{:?}", stats[1]);
    assert!(counters.tail_copies > 0, "{counters:?}");
    assert!(counters.fast_retransmits > 0, "{counters:?}");
}

/// Without loss nothing is copied: the tail copies cost capacity only where a path loses packets.
#[test]
fn clean_paths_send_no_tail_copies() {
    let (_, done, counters, _) = run(&[SHORT, SHORT], &[], 2 << 20, Duration::from_secs(30));
    done.expect("the transfer finished");
    assert_eq!(counters.tail_copies, 0, "{counters:?}");
    assert_eq!(counters.late_copies, 0, "{counters:?}");
    assert_eq!(counters.retransmissions, 0, "{counters:?}");
}

/// A slow path whose startup queued packets deep in its link: once everything is sent, the
/// packets still in that queue are copied onto the idle fast path, not awaited (they are due
/// after the queue the slow path's RTT shows, not half a minimum RTT after they left).
#[test]
fn packets_held_in_a_slow_paths_queue_are_copied_to_the_idle_fast_path() {
    let (stats, done, counters, _) = run(&[SHORT, LONG], &[], 4 << 20, Duration::from_secs(60));
    done.expect("the transfer finished");
    let long = &stats[1];
    let queued = long.smoothed_rtt.expect("measured") - 2 * LONG.0;
    assert!(queued > Duration::from_millis(200), "{long:?}");
    assert!(counters.late_copies > 0, "{counters:?}");
}

/// Two endpoints joined by paths that deliver at once, for the path lifecycle.
mod lifecycle {
    use std::time::{Duration, Instant};

    use bytes::Bytes;

    use super::super::{Endpoint, Handled, PathId, Policy, SessionConfig, SessionError};

    struct Pair {
        a: Endpoint,
        b: Endpoint,
        now: Instant,
        /// Datagrams each end sent, by path: (from a, path).
        sent: Vec<(bool, PathId)>,
        /// Paths that carry nothing (cut both ways).
        cut: Vec<PathId>,
    }

    impl Pair {
        fn new(paths: &[u32]) -> Self {
            let config = SessionConfig::new(Policy::Meshwire);
            let (mut a, mut b) = (Endpoint::new(config), Endpoint::new(config));
            for &path in paths {
                a.add_path(PathId(path));
                b.add_path(PathId(path));
            }
            Self {
                a,
                b,
                now: Instant::now(),
                sent: Vec::new(),
                cut: Vec::new(),
            }
        }

        /// Exchanges datagrams until both ends are quiet, then moves time on by `step`.
        fn step(&mut self, step: Duration) {
            loop {
                let (now, cut) = (self.now, &self.cut);
                let moved_a = deliver(&mut self.a, &mut self.b, true, now, cut, &mut self.sent);
                let moved_b = deliver(&mut self.b, &mut self.a, false, now, cut, &mut self.sent);
                if !moved_a && !moved_b {
                    break;
                }
            }
            self.now += step;
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
        }
    }

    /// Hands everything `from` sends to `to` at once (except on cut paths), noting each datagram
    /// in `sent`; returns whether anything was sent.
    fn deliver(
        from: &mut Endpoint,
        to: &mut Endpoint,
        from_a: bool,
        now: Instant,
        cut: &[PathId],
        sent: &mut Vec<(bool, PathId)>,
    ) -> bool {
        let mut moved = false;
        while let Some(transmit) = from.poll_transmit(now) {
            moved = true;
            sent.push((from_a, transmit.path));
            if !cut.contains(&transmit.path) {
                // Refusals are what the tests below provoke and check directly.
                let _ = to.handle_datagram(transmit.path, transmit.payload, now);
            }
        }
        moved
    }

    #[test]
    fn a_closed_path_is_forgotten_by_the_peer_and_never_probed_again() {
        let mut pair = Pair::new(&[0, 1]);
        pair.b.sender.write(&[7; 64 * 1024]);
        for _ in 0..10 {
            pair.step(Duration::from_millis(10));
        }
        // a removes path 1 and, from now on, nothing crosses it but the close itself.
        let close = pair.a.close_path(PathId(1)).expect("a has path 1");
        assert_eq!(close.path, PathId(1));
        assert_eq!(pair.a.close_path(PathId(1)), None, "closed once");
        let handled = pair.b.handle_datagram(close.path, close.payload, pair.now);
        assert_eq!(handled, Ok(Handled::PathClosed(PathId(1))));
        assert!(!pair.b.sender.has_path(PathId(1)));
        pair.cut.push(PathId(1));
        pair.sent.clear();
        pair.b.sender.write(&[8; 256 * 1024]);
        for _ in 0..1000 {
            pair.step(Duration::from_millis(10));
        }
        assert!(
            pair.sent.iter().all(|&(_, path)| path == PathId(0)),
            "{:?}",
            &pair.sent[..5.min(pair.sent.len())]
        );
        let mut read = vec![0; 1 << 20];
        assert_eq!(
            pair.a.receiver.read(&mut read),
            320 * 1024,
            "everything arrived on path 0"
        );
    }

    #[test]
    fn replayed_and_unknown_closes_are_refused_and_change_nothing() {
        let mut pair = Pair::new(&[0, 1]);
        let close = pair.a.close_path(PathId(1)).expect("a has path 1");
        let replay = close.payload.clone();
        assert_eq!(
            pair.b.handle_datagram(PathId(1), close.payload, pair.now),
            Ok(Handled::PathClosed(PathId(1)))
        );
        // Again: b no longer has the path.
        assert_eq!(
            pair.b.handle_datagram(PathId(1), replay.clone(), pair.now),
            Err(SessionError::CloseUnknownPath(PathId(1)))
        );
        // The path comes back and carries data; the old close replayed then is refused.
        pair.a.add_path(PathId(1));
        pair.b.add_path(PathId(1));
        pair.a.sender.write(&[9; 32 * 1024]);
        for _ in 0..20 {
            pair.step(Duration::from_millis(10));
        }
        assert!(matches!(
            pair.b.handle_datagram(PathId(1), replay, pair.now),
            Err(SessionError::ReplayedClose {
                path: PathId(1),
                ..
            })
        ));
        assert!(pair.b.sender.has_path(PathId(1)));
        // A close that is not a whole packet is a codec error.
        assert!(matches!(
            pair.b
                .handle_datagram(PathId(1), Bytes::from_static(&[4, 1, 2]), pair.now),
            Err(SessionError::Codec(_))
        ));
        assert!(pair.b.sender.has_path(PathId(1)));
    }

    #[test]
    fn a_path_closed_and_added_again_is_measured_and_used_again() {
        let mut pair = Pair::new(&[0, 1]);
        let close = pair.a.close_path(PathId(1)).expect("a has path 1");
        pair.b
            .handle_datagram(close.path, close.payload, pair.now)
            .expect("closed");
        pair.a.add_path(PathId(1));
        pair.b.add_path(PathId(1));
        pair.a.sender.write(&[5; 512 * 1024]);
        for _ in 0..200 {
            pair.step(Duration::from_millis(5));
        }
        let used: Vec<PathId> = pair
            .sent
            .iter()
            .filter(|(from_a, _)| *from_a)
            .map(|&(_, path)| path)
            .collect();
        assert!(used.contains(&PathId(1)), "re-admitted path carries data");
        let stats: Vec<_> = pair.a.sender.paths().collect();
        assert!(
            stats
                .iter()
                .any(|(id, s)| *id == PathId(1) && s.smoothed_rtt.is_some()),
            "and is measured again"
        );
        let mut read = vec![0; 1 << 20];
        assert_eq!(pair.b.receiver.read(&mut read), 512 * 1024);
    }
}

/// An ACK full of ranges may leave the middle ones out: a packet acknowledged above the gap must
/// not make the sender declare the packets in the gap lost (they arrived; the receiver just had
/// no room to say so).
#[test]
fn an_ack_that_leaves_ranges_out_is_no_evidence_of_loss_above_the_gap() {
    let (sender, _) = one_burst_and_a_full_ack();
    // Lost by evidence: only the even segments below the highest one reported before the gap
    // (31; with no RTT measured yet the time rule takes 30 too), never one in the gap or above.
    assert_eq!(sender.stats().fast_retransmits, 16);
}

/// A sender that put 100 segments in one burst on path 0 at `start` (returned with each
/// segment's packet number) and got, 50 ms later, the ACK of a receiver that holds the odd
/// segments only: 50 ranges, of which it reports the lowest 16 and the highest 16 (see
/// `Receiver::ack`).
fn one_burst_and_a_full_ack() -> (Sender, Vec<(u64, u64)>) {
    let start = Instant::now();
    let mut sender = Sender::new(SessionConfig::new(Policy::Meshwire));
    sender.add_path(PathId(0), None);
    assert_eq!(sender.write(&[7u8; 100 * 1024]), 100 * 1024);
    let mut sent = Vec::new();
    while let Some(transmit) = sender.poll_transmit(start) {
        if let Ok(Packet::Data(data)) = Packet::decode(transmit.payload, 1024) {
            sent.push((data.seq, data.packet_number));
        }
    }
    assert_eq!(sent.len(), 100, "the first burst carries every segment");
    let received: Vec<(u64, u64)> = (0..50).map(|k| (2 * k + 1, 2 * k + 2)).collect();
    let ranges: Vec<(u64, u64)> = received[..16]
        .iter()
        .chain(&received[34..])
        .copied()
        .collect();
    let ack = super::codec::AckPacket {
        echo: None,
        cumulative: 0,
        window_end: 1 << 20,
        ranges,
    };
    sender
        .handle_ack(PathId(0), ack, start + Duration::from_millis(50))
        .unwrap();
    (sender, sent)
}

/// The echo of a packet already acknowledged through ranges left out of evidence (above the gap
/// of a full ACK) is evidence after all: it names the packet, so the path's packets three or more
/// before it are lost by count at once, not at their RTO.
#[test]
fn an_echo_of_a_packet_acknowledged_above_the_gap_detects_the_losses_before_it() {
    let (mut sender, sent) = one_burst_and_a_full_ack();
    assert_eq!(sender.stats().fast_retransmits, 16);
    // Segment 99 was credited by a range above the gap; now its own echo comes back, 60 ms
    // after the burst left.
    let echo = sent.iter().find(|&&(seq, _)| seq == 99).map(|&(_, pn)| pn);
    let echoed = super::codec::AckPacket {
        echo,
        cumulative: 0,
        window_end: 1 << 20,
        ranges: Vec::new(),
    };
    let at = Instant::now() + Duration::from_millis(60);
    sender.handle_ack(PathId(0), echoed, at).unwrap();
    // Every packet still in flight three or more before 99 on the path joins the 16 found
    // before: the even segments 32 to 96 (33), and the odd ones 33 to 67 (18) whose arrival the
    // full ACK left out; the sender cannot tell those from losses, as at its next ACK before.
    assert_eq!(sender.stats().fast_retransmits, 16 + 33 + 18);
}

/// A segment declared lost too early and sent again on another path arrives through its first
/// copy. The ACK that covers it (by its ranges, not its echo) must not credit the copy still in
/// flight: that copy has not arrived, and taking it as arrived would declare the packets sent
/// before it on its path lost by count (traced in `session-quic`'s `direct+3-relays`, where this
/// turned a few real losses into thousands of needless retransmissions).
#[test]
fn an_ack_of_a_resent_segment_credits_no_copy_still_in_flight() {
    let start = Instant::now();
    let mut sender = Sender::new(SessionConfig::new(Policy::Meshwire));
    sender.add_path(PathId(0), None);
    sender.add_path(PathId(1), None);
    assert_eq!(sender.write(&[7u8; 200 * 1024]), 200 * 1024);
    let mut sent = Vec::new();
    let drain = |sender: &mut Sender, now: Instant, sent: &mut Vec<(u32, u64, u64)>| {
        while let Some(transmit) = sender.poll_transmit(now) {
            if let Ok(Packet::Data(data)) = Packet::decode(transmit.payload, 1024) {
                sent.push((transmit.path.0, data.seq, data.packet_number));
            }
        }
    };
    drain(&mut sender, start, &mut sent);
    let on = |path: u32, sent: &[(u32, u64, u64)]| -> Vec<(u64, u64)> {
        sent.iter()
            .filter(|&&(p, _, _)| p == path)
            .map(|&(_, seq, pn)| (seq, pn))
            .collect()
    };
    let (first0, first1) = (on(0, &sent), on(1, &sent));
    assert!(first0.len() >= 8 && first1.len() >= 8, "{sent:?}");
    // Path 0's fifth packet is echoed: its first two are declared lost by count and resent.
    let echoed = first0[4];
    let ack =
        |echo: Option<u64>, cumulative: u64, ranges: Vec<(u64, u64)>| super::codec::AckPacket {
            echo,
            cumulative,
            window_end: 1 << 20,
            ranges,
        };
    let at = start + Duration::from_millis(10);
    let ranges = vec![(echoed.0, echoed.0 + 1)];
    sender
        .handle_ack(PathId(0), ack(Some(echoed.1), 0, ranges), at)
        .unwrap();
    assert_eq!(sender.stats().fast_retransmits, 2);
    let mut resent = Vec::new();
    drain(&mut sender, at, &mut resent);
    assert!(
        resent.iter().any(|&(path, _, _)| path == 1),
        "a lost segment goes out on the other path: {resent:?}"
    );
    // The first copies of path 0's first two segments arrive after all: an ACK on path 0 covers
    // them by its ranges, without an echo of the resent copies.
    let lost: Vec<(u64, u64)> = first0[..2].iter().map(|&(seq, _)| (seq, seq + 1)).collect();
    let at = at + Duration::from_millis(1);
    sender
        .handle_ack(PathId(0), ack(None, 0, lost), at)
        .unwrap();
    // Path 1 is owed nothing: no packet of its first burst is declared lost, none credited.
    assert_eq!(sender.stats().fast_retransmits, 2);
    let path1 = sender
        .paths()
        .find(|(path, _)| *path == PathId(1))
        .map(|(_, stats)| stats)
        .unwrap();
    assert_eq!(path1.delivered_packets, 0, "{path1:?}");
}

/// A data segment numbered `seq` on path 0, flagged window-limited or not.
fn segment(seq: u64, window_limited: bool) -> Packet {
    Packet::Data(super::DataPacket {
        packet_number: seq,
        seq,
        fin: false,
        window_limited,
        payload: bytes::Bytes::from_static(b"x"),
    })
}

/// Delivers segments `from..to` (the last flagged window-limited); with `read`, the application
/// reads each as it arrives.
fn fill(receiver: &mut Receiver, from: u64, to: u64, read: bool, now: Instant) {
    for seq in from..to {
        receiver
            .handle_packet(PathId(0), segment(seq, seq + 1 == to), now)
            .expect("inside the window");
        if read {
            read_all(receiver);
        }
    }
}

fn read_all(receiver: &mut Receiver) {
    let mut buf = [0u8; 4096];
    while receiver.read(&mut buf) > 0 {}
}

/// The window doubles only when a sender says the window stops it while the application keeps
/// up, at most once per round trip of the sender seeing the last growth, never past the largest
/// window, and never for NCP's policies (a fixed session window).
#[test]
fn the_receive_window_grows_only_for_a_stopped_sender_and_a_prompt_reader() {
    let now = Instant::now();
    let config = SessionConfig::new(Policy::Meshwire);
    let start = config.window_segments();
    let mut receiver = Receiver::new(config);
    // The application reads nothing: the window, not the paths, is right to stop the sender.
    fill(&mut receiver, 0, start, false, now);
    assert_eq!(receiver.window_segments(), start);
    // It reads everything, the sender fills the window again and says so: the window doubles,
    // and an ACK tells the sender at once.
    read_all(&mut receiver);
    while receiver.poll_transmit(now).is_some() {}
    fill(&mut receiver, start, 2 * start, true, now);
    assert_eq!(receiver.window_segments(), 2 * start);
    assert_eq!(receiver.window_growths(), 1);
    let mut advertised = 0;
    while let Some(transmit) = receiver.poll_transmit(now) {
        if let Ok(Packet::Ack(ack)) = Packet::decode(transmit.payload, config.mtu_bytes) {
            advertised = advertised.max(ack.window_end);
        }
    }
    assert_eq!(advertised, 2 * start + 2 * start);
    // A flag sent before the sender saw that growth changes nothing.
    receiver
        .handle_packet(PathId(0), segment(2 * start - 1, true), now)
        .expect("a duplicate inside the window");
    assert_eq!(receiver.window_segments(), 2 * start);
    // Used up and flagged again: doubles to the largest, then stays there.
    let mut next = 2 * start;
    for _ in 0..3 {
        let end = next + receiver.window_segments();
        fill(&mut receiver, next, end, true, now);
        next = end;
    }
    assert_eq!(receiver.window_segments(), config.max_window_segments());
    assert_eq!(receiver.window_growths(), 2);

    // NCP's session window is fixed.
    let ncp = SessionConfig::new(Policy::Nkp24);
    let start = ncp.window_segments();
    let mut receiver = Receiver::new(ncp);
    for round in 0..3 {
        fill(&mut receiver, round * start, (round + 1) * start, true, now);
    }
    assert_eq!(receiver.window_segments(), start);
    assert_eq!(receiver.window_growths(), 0);
}
