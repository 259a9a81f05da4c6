//! Test network tests: latency, ordering, stepping, rate, loss, jitter and outages.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

const MS: Duration = Duration::from_millis(1);

fn net() -> (TestNet<u8, u32>, Instant) {
    let start = Instant::now();
    (TestNet::new(start, 1), start)
}

/// Steps until `limit` (or until nothing is in flight), collecting (arrival time, arrival).
fn run<M>(net: &mut TestNet<u8, M>, limit: Option<Instant>) -> Vec<(Instant, Arrival<u8, M>)> {
    let mut arrivals = Vec::new();
    loop {
        let now = match limit {
            Some(limit) if net.step_until([], limit) => net.now(),
            Some(_) => break,
            None => match net.step([]) {
                Some(now) => now,
                None => break,
            },
        };
        while let Some(arrival) = net.poll_arrival() {
            arrivals.push((now, arrival));
        }
    }
    arrivals
}

/// The messages that arrive until nothing is in flight, in arrival order.
fn drain(net: &mut TestNet<u8, u32>) -> Vec<u32> {
    run(net, None).into_iter().map(|(_, a)| a.message).collect()
}

#[test]
fn a_message_arrives_after_the_link_latency_and_not_before() {
    let (mut net, start) = net();
    net.link(0, 1, Link::new(20 * MS)).unwrap();
    assert_eq!(net.send(0, 1, 7), Ok(Sent::Arrives(start + 20 * MS)));
    assert!(!net.step_until([], start + 19 * MS));
    assert_eq!(net.now(), start + 19 * MS);
    assert_eq!(net.poll_arrival(), None, "nothing arrives early");
    assert_eq!(net.step([]), Some(start + 20 * MS));
    assert_eq!(
        net.poll_arrival(),
        Some(Arrival {
            from: 0,
            to: 1,
            message: 7
        })
    );
    assert_eq!(net.poll_arrival(), None);
    assert_eq!(net.step([]), None, "idle");
    assert_eq!(net.elapsed(), 20 * MS);
}

#[test]
fn links_are_directed_and_sending_without_one_is_refused() {
    let (mut net, _) = net();
    net.link(0, 1, Link::new(MS)).unwrap();
    assert_eq!(
        net.send(1, 0, 1),
        Err(TestNetError::NoLink { from: 1, to: 0 })
    );
    net.connect(2, 3, Link::new(MS)).unwrap();
    assert!(net.send(2, 3, 1).is_ok() && net.send(3, 2, 2).is_ok());
}

#[test]
fn out_of_range_links_are_refused() {
    let (mut net, _) = net();
    for link in [
        Link::new(MS).with_rate(0.0),
        Link::new(MS).with_rate(f64::NAN),
        Link::new(MS).with_loss(Loss::Random(1.5)),
        Link::new(MS).with_loss(Loss::EveryNth(0)),
    ] {
        assert!(matches!(
            net.link(0, 1, link),
            Err(TestNetError::InvalidLink { from: 0, to: 1, .. })
        ));
    }
    assert_eq!(
        net.send(0, 1, 1),
        Err(TestNetError::NoLink { from: 0, to: 1 })
    );
}

#[test]
fn equal_arrival_times_keep_the_sending_order() {
    let (mut net, start) = net();
    net.link(0, 2, Link::new(10 * MS)).unwrap();
    net.link(1, 2, Link::new(5 * MS)).unwrap();
    net.send(0, 2, 1).unwrap();
    assert!(run(&mut net, Some(start + 5 * MS)).is_empty());
    net.send(1, 2, 2).unwrap();
    net.send(0, 2, 3).unwrap();
    net.send(1, 2, 4).unwrap();
    let order: Vec<(Duration, u32)> = run(&mut net, None)
        .into_iter()
        .map(|(at, arrival)| (at - start, arrival.message))
        .collect();
    assert_eq!(
        order,
        vec![(10 * MS, 1), (10 * MS, 2), (10 * MS, 4), (15 * MS, 3)]
    );
}

#[test]
fn a_step_goes_to_the_earlier_of_the_next_arrival_and_the_earliest_timer() {
    let (mut net, start) = net();
    net.link(0, 1, Link::new(10 * MS)).unwrap();
    net.send(0, 1, 1).unwrap();
    assert_eq!(
        net.step([None, Some(start + 4 * MS), Some(start + 7 * MS)]),
        Some(start + 4 * MS)
    );
    assert_eq!(net.poll_arrival(), None);
    assert_eq!(net.step([Some(start + 30 * MS)]), Some(start + 10 * MS));
    assert!(net.poll_arrival().is_some());
    // A timer already due wakes at once and the clock does not go back.
    assert_eq!(net.step([Some(start)]), Some(start + 10 * MS));
    assert!(!net.step_until([Some(start + 50 * MS)], start + 40 * MS));
    assert_eq!(net.now(), start + 40 * MS);
    assert!(net.step_until([Some(start + 50 * MS)], start + 50 * MS));
    assert_eq!(net.now(), start + 50 * MS);
}

#[test]
fn a_rate_limited_link_sends_back_to_back_then_idles() {
    let (mut net, start) = net();
    net.link(0, 1, Link::new(10 * MS).with_rate(100.0)).unwrap();
    let sent: Vec<Sent> = (0..3).map(|m| net.send(0, 1, m).unwrap()).collect();
    assert_eq!(
        sent,
        vec![
            Sent::Arrives(start + 20 * MS),
            Sent::Arrives(start + 30 * MS),
            Sent::Arrives(start + 40 * MS)
        ]
    );
    // Once the transmitter is idle a message leaves one serialization after it is sent.
    assert_eq!(run(&mut net, Some(start + 100 * MS)).len(), 3);
    assert_eq!(net.send(0, 1, 3), Ok(Sent::Arrives(start + 120 * MS)));
    assert_eq!(drain(&mut net), vec![3]);
}

#[test]
fn every_nth_loss_drops_exactly_those_messages_and_takes_no_capacity() {
    let (mut net, start) = net();
    net.link(
        0,
        1,
        Link::new(MS).with_rate(1000.0).with_loss(Loss::EveryNth(3)),
    )
    .unwrap();
    let sent: Vec<Sent> = (0..6).map(|m| net.send(0, 1, m).unwrap()).collect();
    assert_eq!(
        sent,
        vec![
            Sent::Arrives(start + 2 * MS),
            Sent::Arrives(start + 3 * MS),
            Sent::Lost,
            Sent::Arrives(start + 4 * MS),
            Sent::Arrives(start + 5 * MS),
            Sent::Lost,
        ]
    );
    assert_eq!(drain(&mut net), vec![0, 1, 3, 4]);
}

#[test]
fn random_loss_is_seeded_and_close_to_its_probability() {
    let fates = |seed| {
        let mut net: TestNet<u8, u32> = TestNet::new(Instant::now(), seed);
        net.link(0, 1, Link::new(MS).with_loss(Loss::Random(0.2)))
            .unwrap();
        (0..10_000)
            .map(|m| net.send(0, 1, m).unwrap() == Sent::Lost)
            .collect::<Vec<bool>>()
    };
    let first = fates(5);
    assert_eq!(first, fates(5), "the same seed loses the same messages");
    assert_ne!(first, fates(6));
    let lost = first.iter().filter(|lost| **lost).count();
    assert!((1_700..2_300).contains(&lost), "{lost} of 10000 lost");
    let (mut net, _) = net();
    net.link(0, 1, Link::new(MS).with_loss(Loss::Random(1.0)))
        .unwrap();
    net.link(0, 2, Link::new(MS).with_loss(Loss::Random(0.0)))
        .unwrap();
    for m in 0..100 {
        assert_eq!(net.send(0, 1, m), Ok(Sent::Lost));
        assert!(matches!(net.send(0, 2, m), Ok(Sent::Arrives(_))));
    }
}

#[test]
fn jitter_stays_within_its_bound_and_reorders() {
    let (mut net, start) = net();
    net.link(0, 1, Link::new(10 * MS).with_jitter(5 * MS))
        .unwrap();
    for m in 0..200 {
        net.send(0, 1, m).unwrap();
    }
    let arrivals = run(&mut net, None);
    assert_eq!(arrivals.len(), 200);
    for (at, _) in &arrivals {
        assert!(
            *at >= start + 10 * MS && *at < start + 15 * MS,
            "{:?}",
            *at - start
        );
    }
    let messages: Vec<u32> = arrivals.iter().map(|(_, a)| a.message).collect();
    assert!(messages.windows(2).any(|w| w[0] > w[1]), "jitter reorders");
}

#[test]
fn outages_drop_what_is_sent_and_what_arrives_while_the_link_is_down() {
    let (mut net, start) = net();
    net.link(0, 1, Link::new(10 * MS).with_outage(15 * MS..30 * MS))
        .unwrap();
    // Arrives at 10 ms, before the outage.
    net.send(0, 1, 1).unwrap();
    assert!(run(&mut net, Some(start + 8 * MS)).is_empty());
    // Due at 18 ms, during the outage.
    assert_eq!(net.send(0, 1, 2), Ok(Sent::Arrives(start + 18 * MS)));
    let before: Vec<u32> = run(&mut net, Some(start + 20 * MS))
        .into_iter()
        .map(|(_, a)| a.message)
        .collect();
    assert_eq!(before, vec![1]);
    assert_eq!(net.send(0, 1, 3), Ok(Sent::Down));
    assert!(run(&mut net, Some(start + 30 * MS)).is_empty());
    // The link is back.
    net.send(0, 1, 4).unwrap();
    assert_eq!(drain(&mut net), vec![4]);
}

fn arb_link() -> impl Strategy<Value = Link> {
    (0u64..50, 0u64..20, proptest::option::of(10.0f64..5000.0)).prop_map(
        |(latency, jitter, rate)| Link {
            latency: Duration::from_millis(latency),
            jitter: Duration::from_millis(jitter),
            rate,
            loss: Loss::None,
            outages: Vec::new(),
        },
    )
}

proptest! {
    /// Over lossless links every message arrives exactly once, never before its latency, in
    /// non-decreasing time; without jitter each link keeps its order and its rate's spacing.
    #[test]
    fn lossless_links_deliver_everything_in_arrival_order(
        links in proptest::collection::vec(arb_link(), 3),
        sends in proptest::collection::vec((0usize..3, 0u64..30), 1..80),
        timers in proptest::collection::vec(0u64..200, 0..5),
    ) {
        let start = Instant::now();
        let mut net: TestNet<u8, usize> = TestNet::new(start, 9);
        for (index, link) in links.iter().enumerate() {
            net.link(0, index as u8 + 1, link.clone()).unwrap();
        }
        let mut sent_at = Vec::new();
        let mut arrivals: Vec<(Instant, usize, usize)> = Vec::new();
        let record = |arrivals: &mut Vec<_>, list: Vec<(Instant, Arrival<u8, usize>)>| {
            arrivals.extend(list.into_iter().map(|(at, a)| (at, a.to as usize - 1, a.message)));
        };
        for (message, &(link, wait_ms)) in sends.iter().enumerate() {
            let limit = net.now() + Duration::from_millis(wait_ms);
            record(&mut arrivals, run(&mut net, Some(limit)));
            prop_assert_eq!(net.now(), limit);
            prop_assert!(matches!(net.send(0, link as u8 + 1, message), Ok(Sent::Arrives(_))));
            sent_at.push(net.now());
        }
        let mut timers: Vec<Instant> = timers.iter().map(|ms| start + Duration::from_millis(*ms)).collect();
        let mut last = net.now();
        loop {
            let next_timer = timers.iter().copied().filter(|t| *t > net.now()).min();
            let Some(now) = net.step([next_timer]) else { break };
            prop_assert!(now >= last, "the clock went back");
            last = now;
            timers.retain(|t| *t > now);
            while let Some(arrival) = net.poll_arrival() {
                arrivals.push((now, arrival.to as usize - 1, arrival.message));
            }
        }
        let mut seen: Vec<usize> = arrivals.iter().map(|(_, _, m)| *m).collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..sends.len()).collect::<Vec<_>>());
        prop_assert!(arrivals.windows(2).all(|w| w[0].0 <= w[1].0));
        for &(at, link, message) in &arrivals {
            prop_assert_eq!(sends[message].0, link);
            prop_assert!(at >= sent_at[message] + links[link].latency);
        }
        for (index, link) in links.iter().enumerate() {
            if !link.jitter.is_zero() {
                continue;
            }
            let on_link: Vec<(Instant, usize)> = arrivals
                .iter()
                .filter(|(_, l, _)| *l == index)
                .map(|&(at, _, m)| (at, m))
                .collect();
            prop_assert!(on_link.windows(2).all(|w| w[0].1 < w[1].1), "reordered without jitter");
            if let Some(rate) = link.rate {
                let spacing = Duration::from_secs_f64(1.0 / rate);
                prop_assert!(on_link.windows(2).all(|w| w[1].0 - w[0].0 >= spacing));
            }
        }
    }
}
