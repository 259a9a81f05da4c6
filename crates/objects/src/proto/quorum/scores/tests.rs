use super::*;
use crate::proto::quorum::Policy;
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Reachable peers the transport knows no round trip to.
fn reachable(peers: &[u32]) -> Vec<(u32, PathHint)> {
    let hint = PathHint {
        reachable: true,
        rtt: None,
    };
    peers.iter().map(|peer| (*peer, hint)).collect()
}

fn order(candidates: &[Candidate<u32>]) -> Vec<u32> {
    candidates.iter().map(|c| c.peer).collect()
}

#[test]
fn strangers_rank_by_their_paths_and_unreachable_peers_come_last() {
    let scores = PeerScores::<u32>::new(ScoreConfig::default());
    let mut rng = SmallRng::seed_from_u64(3);
    let candidates = [
        (0, PathHint::connected(ms(300))),
        (1, PathHint::default()),
        (2, PathHint::connected(ms(40))),
        (3, PathHint::connected(ms(90))),
    ];
    let ranked = scores.rank(&candidates, Instant::now(), &mut rng);
    assert_eq!(order(&ranked), vec![2, 3, 0, 1]);
    assert_eq!(
        ranked[0].hedge_after,
        ms(80),
        "twice the expected round trip"
    );
    assert!(!ranked[3].reachable);
    assert_eq!(ranked[3].timely, 0.0);
    assert_eq!(ranked[0].timely, 0.5, "nothing known of anyone yet");
}

#[test]
fn a_member_is_probed_only_while_fewer_than_needed_are_known_faster_than_its_round_trip() {
    let mut scores = PeerScores::<u32>::new(ScoreConfig::default());
    // Nothing known: probe, whatever the round trip; no round trip known: probe.
    assert_eq!(
        scores.probe_verdict(9, Some(ms(500)), 2, 0),
        ProbeVerdict::Probe
    );
    assert_eq!(scores.probe_verdict(9, None, 0, 0), ProbeVerdict::Probe);
    // Peer 0 answers in 40 ms (tail 50 ms), peer 1 in 80 ms (tail 100 ms), peer 2 is slow.
    for _ in 0..50 {
        scores.record_success(0, ms(40));
        scores.record_success(1, ms(80));
    }
    assert_eq!(scores.tail_latency(1), ms(100));
    scores.record_late_success(2, Instant::now(), ms(30));
    // A member 200 ms away can beat neither 0 nor 1: two known faster, skip it.
    assert_eq!(
        scores.probe_verdict(9, Some(ms(200)), 2, 0),
        ProbeVerdict::Skip
    );
    // A single answer is no steady estimate: its tail is two and a half times it (RFC 6298's
    // first deviation, half the sample, then one step), so a member at 150 ms cannot yet be
    // ruled out by an 80 ms answer.
    let mut fresh = PeerScores::<u32>::new(ScoreConfig::default());
    fresh.record_success(0, ms(40));
    fresh.record_success(1, ms(80));
    assert_eq!(fresh.tail_latency(1), ms(200));
    assert_eq!(
        fresh.probe_verdict(9, Some(ms(150)), 2, 0),
        ProbeVerdict::Probe
    );
    // 60 ms away it could beat peer 1's tail: probe it, or wait for a probe out that may
    // make up the second.
    assert_eq!(
        scores.probe_verdict(9, Some(ms(60)), 2, 0),
        ProbeVerdict::Probe
    );
    assert_eq!(
        scores.probe_verdict(9, Some(ms(60)), 2, 1),
        ProbeVerdict::Wait
    );
    // A late peer never counts as faster, and a peer does not count against itself.
    assert_eq!(
        scores.probe_verdict(9, Some(ms(200)), 3, 0),
        ProbeVerdict::Probe
    );
    assert_eq!(
        scores.probe_verdict(0, Some(ms(200)), 2, 0),
        ProbeVerdict::Probe
    );
}

#[test]
fn a_sub_millisecond_peer_is_late_only_a_granularity_past_its_mean() {
    let mut scores = PeerScores::<u32>::new(ScoreConfig::default());
    let us = Duration::from_micros;
    for _ in 0..50 {
        scores.record_success(0, us(400));
        scores.record_success(1, ms(40));
    }
    // A quarter of 400 µs would make a 600 µs answer late; the slack is a granularity.
    assert_eq!(scores.tail_latency(0), us(400) + GRANULARITY);
    // On a longer path the quarter is the larger slack.
    assert_eq!(scores.tail_latency(1), ms(50));
}

#[test]
fn one_late_request_sinks_a_peer_below_strangers_at_once() {
    let mut scores = PeerScores::<u32>::new(ScoreConfig::default());
    let mut rng = SmallRng::seed_from_u64(4);
    for _ in 0..10 {
        scores.record_success(0, ms(45));
        scores.record_success(1, ms(50));
    }
    // Peer 0 stops answering: its first request late past 100 ms is enough.
    scores.record_unanswered(0, Instant::now(), ms(100), true);
    assert_eq!(scores.expected_latency(0), ms(100));
    assert!(scores.timely(0) < scores.timely(1));
    let candidates = [
        (0, PathHint::connected(ms(40))),
        (1, PathHint::connected(ms(40))),
        (2, PathHint::connected(ms(45))),
    ];
    assert_eq!(
        order(&scores.rank(&candidates, Instant::now(), &mut rng)),
        vec![1, 2, 0]
    );
    // A cancelled request that was neither late nor beyond the estimate is no news.
    let before = scores.expected_latency(1);
    scores.record_unanswered(1, Instant::now(), ms(20), false);
    assert_eq!(scores.expected_latency(1), before);
    assert!(scores.timely(1) > 0.9);
}

#[test]
fn a_request_out_longer_than_expected_charges_its_peer() {
    let mut scores = PeerScores::<u32>::new(ScoreConfig::default());
    let mut rng = SmallRng::seed_from_u64(6);
    let t0 = Instant::now();
    for _ in 0..10 {
        scores.record_success(0, ms(50));
        scores.record_success(1, ms(55));
    }
    let candidates = reachable(&[0, 1]);
    assert_eq!(order(&scores.rank(&candidates, t0, &mut rng)), vec![0, 1]);
    // A request to peer 0 is out: no charge while it is younger than peer 0's estimate...
    scores.on_request_sent(0, t0);
    let ranked = scores.rank(&candidates, t0 + ms(30), &mut rng);
    assert_eq!(order(&ranked), vec![0, 1]);
    // ...but once it has been out longer than peer 1 takes, a new request to peer 0 would
    // queue behind it, and peer 1 goes first.
    let ranked = scores.rank(&candidates, t0 + ms(60), &mut rng);
    assert_eq!(order(&ranked), vec![1, 0]);
    assert!(ranked[1].timely > 0.9, "not late yet");
    assert!(!ranked[1].overdue);
    // Out past its hedge delay, the peer is late, and overdue.
    let ranked = scores.rank(&candidates, t0 + ms(500), &mut rng);
    assert_eq!(
        (ranked[1].peer, ranked[1].timely, ranked[1].overdue),
        (0, 0.0, true)
    );
    // Once the request ends, the charge is gone.
    scores.on_request_done(0, t0);
    assert_eq!(scores.oldest_outstanding(0, t0 + ms(500)), None);
    let ranked = scores.rank(&candidates, t0 + ms(500), &mut rng);
    assert_eq!(order(&ranked), vec![0, 1]);
    assert!(!ranked[0].overdue);
}

#[test]
fn a_late_answer_is_measured_but_lateness_counts_once_per_episode() {
    let mut scores = PeerScores::<u32>::new(ScoreConfig::default());
    let t0 = Instant::now();
    for _ in 0..10 {
        scores.record_success(0, ms(50));
    }
    // Request A, sent at t0, passes its hedge delay: news.
    scores.record_unanswered(0, t0, ms(100), true);
    let lateness = 1.0 - scores.timely(0);
    assert!(lateness > 0.0);
    // B and C were sent behind A: the same episode, not counted; B's answer is measured (it
    // is what the peer took), C's silence is not.
    let before = scores.expected_latency(0);
    scores.record_unanswered(0, t0 + ms(40), ms(880), true);
    assert_eq!(scores.expected_latency(0), before);
    scores.record_late_success(0, t0 + ms(20), ms(900));
    assert_eq!(1.0 - scores.timely(0), lateness);
    let measured = scores.expected_latency(0);
    assert!(measured > before);
    // A itself answers after a second: measured, not counted late again.
    scores.record_late_success(0, t0, ms(1000));
    assert!(scores.expected_latency(0) > measured);
    assert_eq!(1.0 - scores.timely(0), lateness);
    // A request sent after the lateness was noticed starts a new episode.
    scores.record_late_success(0, t0 + ms(200), ms(900));
    assert!(1.0 - scores.timely(0) > lateness);
}

#[test]
fn a_peer_whose_every_answer_is_late_is_still_measured() {
    // As in the quorum sweep: a replica that answers every request after 2,750 ms, asked
    // every 20 ms. The request whose lateness makes the news belongs to a read that finished
    // without it and is dropped at its hedge delay, never answered; the requests answered
    // were all sent before that news, so none of them is news.
    let mut scores = PeerScores::<u32>::new(ScoreConfig::default());
    for _ in 0..10 {
        scores.record_success(0, ms(1000));
    }
    let hedge = scores.tail_latency(0);
    let t0 = Instant::now();
    scores.record_unanswered(0, t0, hedge, true);
    let before = scores.expected_latency(0);
    for index in 1..50u32 {
        scores.record_late_success(0, t0 + ms(20) * index, ms(2750));
    }
    let learned = scores.expected_latency(0);
    assert!(
        learned > before && learned > ms(2500),
        "learned {learned:?} (from {before:?}) for a peer that takes 2.75 s"
    );
}

#[test]
fn uncertain_peers_are_asked_in_parallel_within_the_budget() {
    let config = QuorumConfig::hedged(1, ms(1000));
    let t0 = Instant::now();
    let mut rng = SmallRng::seed_from_u64(5);
    let candidates: Vec<(u32, PathHint)> = (0..20)
        .map(|peer| (peer, PathHint::connected(ms(10 + u64::from(peer)))))
        .collect();
    // Strangers at one half each: seven of them give a 99% chance of one answer in time.
    let mut scores = PeerScores::<u32>::new(ScoreConfig {
        explore_probability: 0.0,
        ..ScoreConfig::default()
    });
    let mut plan = scores.plan(config, &candidates, t0, &mut rng).unwrap();
    let asked: Vec<u32> = std::iter::from_fn(|| plan.poll_ask(t0)).collect();
    assert_eq!(asked, (0..7).collect::<Vec<_>>());
    // Known timely peers need no company.
    for _ in 0..30 {
        scores.record_success(0, ms(12));
    }
    let mut plan = scores.plan(config, &candidates, t0, &mut rng).unwrap();
    assert_eq!(std::iter::from_fn(|| plan.poll_ask(t0)).count(), 1);
    // An empty budget asks the fanout alone, whatever is known.
    let mut broke = PeerScores::<u32>::new(ScoreConfig {
        explore_probability: 0.0,
        extra_request_reserve: 0.0,
        ..ScoreConfig::default()
    });
    let mut plan = broke.plan(config, &candidates, t0, &mut rng).unwrap();
    assert_eq!(std::iter::from_fn(|| plan.poll_ask(t0)).count(), 1);
    // Extra requests are paid for; plans that need none earn the budget back.
    scores.spend(6);
    scores.settle(1);
    assert_eq!(scores.extra_budget(), 26);
    for _ in 0..10 {
        scores.settle(1);
    }
    assert_eq!(scores.extra_budget(), 28);
    broke.settle(1);
    assert_eq!(broke.extra_budget(), 0);
    // What a plan spends is gone at once for the plans made while it still runs: among
    // strangers, a second plan gets one extra ask where the first took six.
    let mut shared = PeerScores::<u32>::new(ScoreConfig {
        explore_probability: 0.0,
        extra_request_reserve: 7.0,
        ..ScoreConfig::default()
    });
    let mut first = shared.plan(config, &candidates, t0, &mut rng).unwrap();
    let asked = std::iter::from_fn(|| first.poll_ask(t0)).count();
    assert_eq!(asked, 7);
    shared.spend(asked - 1);
    let mut second = shared.plan(config, &candidates, t0, &mut rng).unwrap();
    assert_eq!(std::iter::from_fn(|| second.poll_ask(t0)).count(), 2);
}

#[test]
fn ranking_learns_slow_and_failing_peers_and_explores() {
    let mut scores = PeerScores::new(ScoreConfig {
        explore_probability: 1.0,
        ..ScoreConfig::default()
    });
    let mut rng = SmallRng::seed_from_u64(1);
    let t0 = Instant::now();
    for round in 0..20 {
        scores.record_success(0u32, ms(100));
        scores.record_success(1, ms(40));
        scores.record_failure(2, ms(5));
        // One request after another, each sent after the last was found late.
        scores.record_unanswered(3, t0 + ms(2000) * round, ms(1500), true);
        scores.record_success(4, ms(60));
    }
    let ranked: Vec<u32> = scores
        .rank(&reachable(&[0, 1, 2, 3, 4]), Instant::now(), &mut rng)
        .iter()
        .map(|c| c.peer)
        .collect();
    // Both last two are useless; the one that fails at once wastes less time than the one
    // that never answers in time.
    assert_eq!(ranked, vec![1, 4, 0, 2, 3]);
    assert!(scores.tail_latency(1) >= scores.expected_latency(1));
    let config = QuorumConfig {
        policy: Policy::Hedged,
        quorum: 2,
        fanout: 2,
        max_in_flight: 6,
        deadline: ms(1000),
        attempt_timeout: ms(300),
    };
    let t0 = Instant::now();
    let mut plan = scores
        .plan(config, &reachable(&[0, 1, 2, 3, 4]), t0, &mut rng)
        .unwrap();
    let asked: Vec<u32> = std::iter::from_fn(|| plan.poll_ask(t0)).collect();
    assert_eq!(asked.len(), 3, "two best plus one exploration: {asked:?}");
    assert!(asked.contains(&1) && asked.contains(&4));
    // A recovered peer climbs back once measured again.
    for _ in 0..40 {
        scores.record_success(2, ms(10));
    }
    assert_eq!(
        scores.rank(&reachable(&[0, 1, 2]), Instant::now(), &mut rng)[0].peer,
        2
    );
}
