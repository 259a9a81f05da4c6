//! The shared downlink: two senders into one receiver's queue.

use std::net::SocketAddr;
use std::time::Duration;

use crate::lab::{clock, Lab};
use crate::link::{LinkSpec, Rate};
use crate::placement::SharedLog;
use crate::socket::SocketStats;

const PORT: u16 = 9000;
const DATAGRAM: usize = 1000;
/// The downlink: 8 Mbit/s, one datagram per millisecond.
const DOWNLINK_BITS: u64 = 8_000_000;
const QUEUE: usize = 20 * DATAGRAM;

/// What [`two_senders`] saw.
struct Outcome {
    /// c's arrivals: sender index, when.
    arrivals: Vec<(u8, Duration)>,
    /// Datagrams offered, all senders.
    offered: u64,
    /// What each sender counted as dropped at the downlink.
    dropped: [u64; 2],
    /// The downlink's own counters.
    stats: crate::socket::DownlinkStats,
}

/// `a1` and `a2` each offer `burst` datagrams every `every_ms` milliseconds for `offer` to `c`,
/// whose downlink carries one per millisecond.
fn two_senders(burst: u64, every_ms: u64, offer: Duration) -> Outcome {
    let link = LinkSpec {
        latency: Duration::from_millis(10),
        ..LinkSpec::default()
    };
    let mut lab = Lab::new_random_order(7, link, offer + Duration::from_secs(2));
    let arrivals: SharedLog<(u8, Duration)> = lab.shared_log("arrivals");
    let drops: SharedLog<(usize, u64, u64)> = lab.shared_log("drops");
    {
        let arrivals = arrivals.clone();
        lab.host("c", move |context| {
            let arrivals = arrivals.clone();
            async move {
                let socket = context.bind(PORT).await?;
                while let Some((bytes, _)) = socket.recv_datagram().await {
                    arrivals.push((bytes[1], clock()));
                }
                Ok(())
            }
        });
    }
    let c = SocketAddr::new(lab.ip("c").unwrap(), PORT);
    for (index, name) in ["a1", "a2"].into_iter().enumerate() {
        let drops = drops.clone();
        lab.client(name, move |context| async move {
            let socket = context.bind(PORT).await?;
            let payload = vec![index as u8; DATAGRAM];
            let started = clock();
            let mut offered = 0;
            while clock() - started < offer {
                for _ in 0..burst {
                    socket.send_datagram(c, &payload, None);
                    offered += 1;
                }
                tokio::time::sleep(Duration::from_millis(every_ms)).await;
            }
            // Let the queue drain.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let stats = socket.stats();
            drops.push((index, offered, SocketStats::get(&stats.downlink_drops)));
            Ok(())
        });
    }
    let downlink = LinkSpec {
        rate: Rate::BitsPerSec(DOWNLINK_BITS),
        queue_bytes: QUEUE,
        ..LinkSpec::default()
    };
    lab.downlink("c", downlink).unwrap();
    assert!(lab.run(offer + Duration::from_secs(2), |_| {}).unwrap());
    let mut dropped = [0; 2];
    let mut offered = 0;
    for (index, sent, lost) in drops.entries().iter() {
        dropped[*index] = *lost;
        offered += sent;
    }
    let stats = lab.downlink_stats("c").unwrap().unwrap();
    let arrivals = arrivals.entries().to_vec();
    Outcome {
        arrivals,
        offered,
        dropped,
        stats,
    }
}

#[test]
fn two_senders_share_the_downlink_rate_and_its_queue_drops_are_counted() {
    let offer = Duration::from_secs(1);
    // Each sender alone offers twice the downlink's rate.
    let Outcome {
        arrivals,
        offered,
        dropped,
        stats,
    } = two_senders(2, 1, offer);
    assert!(offered >= 4000, "offered {offered}");
    let received = arrivals.len() as u64;
    // The queue drains at the downlink's rate: about 1000 datagrams in the second, plus the
    // 20 still queued at its end.
    assert!((990..=1021).contains(&received), "received {received}");
    assert_eq!(stats.admitted, received);
    assert_eq!(stats.admitted_bytes, received * DATAGRAM as u64);
    assert_eq!(stats.drops, offered - received);
    assert_eq!(dropped[0] + dropped[1], stats.drops);
    // Never faster than the downlink: n datagrams need n - 1 service times between the first
    // arrival and the last (delivery is on 1 ms ticks, hence the tick of slack).
    let first = arrivals.iter().map(|(_, at)| *at).min().unwrap();
    let last = arrivals.iter().map(|(_, at)| *at).max().unwrap();
    let service = Duration::from_nanos(DATAGRAM as u64 * 8 * 1_000_000_000 / DOWNLINK_BITS);
    assert!(
        last - first + Duration::from_millis(1) >= service * (received as u32 - 1),
        "{received} datagrams in {:?}",
        last - first
    );
    // Neither sender owns the queue: with the hosts in a random order each tick, both get in.
    for sender in 0..2u8 {
        let share =
            arrivals.iter().filter(|(from, _)| *from == sender).count() as f64 / received as f64;
        assert!((0.35..=0.65).contains(&share), "sender {sender}: {share}");
    }
}

#[test]
fn below_its_rate_the_downlink_drops_nothing() {
    // Together the senders offer half the downlink's rate: every datagram arrives.
    let outcome = two_senders(1, 4, Duration::from_millis(300));
    assert_eq!(outcome.stats.drops, 0);
    assert_eq!(outcome.dropped, [0, 0]);
    assert_eq!(outcome.arrivals.len() as u64, outcome.offered);
}
