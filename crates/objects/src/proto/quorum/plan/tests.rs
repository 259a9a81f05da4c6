use super::*;
use crate::proto::quorum::{Policy, ScoreConfig};
use proptest::prelude::*;

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn candidates(n: u32, hedge_after: Duration) -> Vec<Candidate<u32>> {
    (0..n)
        .map(|peer| Candidate::new(peer, hedge_after))
        .collect()
}

fn config(policy: Policy) -> QuorumConfig {
    QuorumConfig {
        policy,
        quorum: 3,
        fanout: 3,
        max_in_flight: 6,
        deadline: ms(1000),
        attempt_timeout: ms(300),
    }
}

/// A hedged plan asking two peers first for a quorum of two.
fn hedged_quorum_two() -> QuorumConfig {
    QuorumConfig {
        quorum: 2,
        fanout: 2,
        ..config(Policy::Hedged)
    }
}

fn drain(plan: &mut QuorumPlan<u32>, now: Instant) -> Vec<u32> {
    std::iter::from_fn(|| plan.poll_ask(now)).collect()
}

#[test]
fn sequential_asks_one_peer_at_a_time() {
    let t0 = Instant::now();
    let mut plan =
        QuorumPlan::new(config(Policy::Sequential), candidates(5, ms(50)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0]);
    plan.handle_answer(0, t0 + ms(10));
    assert_eq!(drain(&mut plan, t0 + ms(10)), vec![1]);
    // Peer 1 hangs: it is given up after the attempt timeout, not before.
    assert_eq!(plan.poll_timeout(), Some(t0 + ms(310)));
    assert!(drain(&mut plan, t0 + ms(300)).is_empty());
    assert_eq!(drain(&mut plan, t0 + ms(310)), vec![2]);
    plan.handle_answer(2, t0 + ms(320));
    assert_eq!(drain(&mut plan, t0 + ms(320)), vec![3]);
    plan.handle_answer(3, t0 + ms(330));
    let outcome = plan.outcome().unwrap();
    assert_eq!(outcome.finish, Finish::Quorum);
    assert_eq!((outcome.answers, outcome.asked, outcome.failed), (3, 4, 1));
}

#[test]
fn parallel_all_waits_for_everyone() {
    let t0 = Instant::now();
    let mut plan =
        QuorumPlan::new(config(Policy::ParallelAll), candidates(4, ms(50)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0, 1, 2, 3]);
    for peer in 0..3 {
        plan.handle_answer(peer, t0 + ms(10));
    }
    assert!(
        plan.outcome().is_none(),
        "quorum alone does not end parallel-all"
    );
    plan.handle_timeout(t0 + ms(1000));
    let outcome = plan.outcome().unwrap();
    assert_eq!(outcome.finish, Finish::Deadline);
    assert!(outcome.reached(3));
}

#[test]
fn hedged_asks_the_next_peer_when_one_is_late() {
    let t0 = Instant::now();
    let mut plan =
        QuorumPlan::new(config(Policy::Hedged), candidates(6, ms(50)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
    plan.handle_answer(0, t0 + ms(20));
    plan.handle_answer(1, t0 + ms(30));
    assert!(drain(&mut plan, t0 + ms(30)).is_empty());
    assert_eq!(plan.poll_timeout(), Some(t0 + ms(50)));
    assert_eq!(drain(&mut plan, t0 + ms(50)), vec![3]);
    plan.handle_answer(3, t0 + ms(70));
    let outcome = plan.outcome().unwrap();
    assert_eq!(outcome.finish, Finish::Quorum);
    assert_eq!(outcome.asked, 4);
    assert_eq!(
        plan.pending().map(|(peer, _)| peer).collect::<Vec<_>>(),
        vec![2]
    );
}

#[test]
fn hedged_replaces_failures_at_once() {
    let t0 = Instant::now();
    let mut plan =
        QuorumPlan::new(config(Policy::Hedged), candidates(5, ms(500)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
    plan.handle_failure(1, t0 + ms(5));
    assert_eq!(drain(&mut plan, t0 + ms(5)), vec![3]);
    plan.handle_failure(3, t0 + ms(6));
    plan.handle_failure(0, t0 + ms(6));
    assert_eq!(drain(&mut plan, t0 + ms(6)), vec![4]);
    plan.handle_failure(2, t0 + ms(7));
    assert!(plan.outcome().is_none(), "peer 4 is still in flight");
    plan.handle_failure(4, t0 + ms(8));
    let outcome = plan.outcome().unwrap();
    assert_eq!(outcome.finish, Finish::Exhausted);
    assert!(!outcome.reached(3));
}

#[test]
fn fewer_reachable_than_the_quorum_fails_at_once() {
    let t0 = Instant::now();
    let mut list = candidates(5, ms(50));
    for candidate in &mut list[2..] {
        candidate.reachable = false;
    }
    let mut plan = QuorumPlan::new(config(Policy::Hedged), list, None, t0).unwrap();
    assert!(drain(&mut plan, t0).is_empty());
    let outcome = plan.outcome().unwrap();
    assert_eq!(outcome.finish, Finish::Unreachable);
    assert_eq!((outcome.asked, outcome.reachable), (0, 2));
    assert_eq!(plan.poll_timeout(), None);
}

#[test]
fn hedged_keeps_asking_when_every_attempt_out_is_late() {
    let t0 = Instant::now();
    let tight = QuorumConfig {
        quorum: 1,
        fanout: 1,
        max_in_flight: 1,
        ..config(Policy::Hedged)
    };
    let mut plan = QuorumPlan::new(tight, candidates(4, ms(50)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0]);
    assert_eq!(drain(&mut plan, t0 + ms(50)), vec![1]);
    assert_eq!(drain(&mut plan, t0 + ms(100)), vec![2]);
    // A late attempt's answer still counts.
    plan.handle_answer(0, t0 + ms(120));
    assert_eq!(plan.outcome().unwrap().finish, Finish::Quorum);
}

#[test]
fn peers_with_no_chance_in_time_are_asked_only_to_keep_the_quorum_out() {
    let t0 = Instant::now();
    // Peer 0 answers in time; peers 1-4 are overdue on requests already out (timeliness 0), and
    // peer 5, ranked last, is a stranger at even odds.
    let mut list = candidates(6, ms(50));
    for candidate in &mut list[1..5] {
        candidate.timely = 0.0;
        candidate.overdue = true;
    }
    list[0].timely = 1.0;
    let mut plan = QuorumPlan::new(hedged_quorum_two(), list, None, t0)
        .unwrap()
        .with_spare(8);
    // The two first choices, then the chance below confidence buys one extra ask: the peer that
    // can still answer in time, not the late ones ranked before it.
    assert_eq!(drain(&mut plan, t0), vec![0, 1, 5]);
    plan.handle_answer(0, t0 + ms(10));
    // Peers 1 and 5 pass their hedge delay: one answer is still needed and two attempts are out,
    // so no late peer is added to them.
    assert_eq!(drain(&mut plan, t0 + ms(50)), Vec::<u32>::new());
    // Peer 1 fails: one attempt is out, one answer needed, so still no one.
    plan.handle_failure(1, t0 + ms(60));
    assert_eq!(drain(&mut plan, t0 + ms(60)), Vec::<u32>::new());
    // Peer 5 fails too: the next late peer is asked, as the only way left to the quorum.
    plan.handle_failure(5, t0 + ms(70));
    assert_eq!(drain(&mut plan, t0 + ms(70)), vec![2]);
    plan.handle_answer(2, t0 + ms(400));
    assert_eq!(plan.outcome().unwrap().finish, Finish::Quorum);
    assert_eq!(plan.outcome().unwrap().asked, 4);
}

#[test]
fn a_peer_late_once_is_still_asked_in_place_of_a_late_attempt() {
    let t0 = Instant::now();
    // Three replicas, one of them just stopped (peer 1, still ranked second); peer 2's last
    // answer was late, so its timeliness is 0, but no request to it is out: it can answer now.
    let mut list = candidates(3, ms(50));
    list[0].timely = 1.0;
    list[1].timely = 1.0;
    list[2].timely = 0.0;
    let mut plan = QuorumPlan::new(hedged_quorum_two(), list, None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0, 1]);
    plan.handle_answer(0, t0 + ms(1));
    // The stopped replica passes its hedge delay: peer 2 is asked rather than waited behind it.
    assert_eq!(drain(&mut plan, t0 + ms(50)), vec![2]);
    plan.handle_answer(2, t0 + ms(52));
    assert_eq!(plan.outcome().unwrap().finish, Finish::Quorum);
}

#[test]
fn late_peers_are_reported_once_as_they_pass_their_hedge_delay() {
    let mut scores = PeerScores::new(ScoreConfig::default());
    let t0 = Instant::now();
    let mut plan =
        QuorumPlan::new(config(Policy::Hedged), candidates(6, ms(50)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
    plan.handle_answer(1, t0 + ms(10));
    assert_eq!(drain(&mut plan, t0 + ms(60)), vec![3, 4]);
    plan.report_late(t0 + ms(60), &mut scores);
    assert_eq!(scores.expected_latency(0), ms(60));
    assert!(scores.timely(0) < 0.5);
    plan.report_late(t0 + ms(70), &mut scores);
    assert_eq!(scores.expected_latency(0), ms(60), "reported once");
}

#[test]
fn bad_settings_are_refused() {
    let t0 = Instant::now();
    let mut bad = config(Policy::Hedged);
    bad.fanout = 2;
    assert!(QuorumPlan::new(bad, candidates(3, MS), None, t0).is_err());
    assert!("fastest".parse::<Policy>().is_err());
    assert_eq!("parallel-all".parse::<Policy>(), Ok(Policy::ParallelAll));
}

fn snapshot(scores: &PeerScores<u32>, peers: u32) -> Vec<(Duration, Duration, f64)> {
    (0..peers)
        .map(|peer| {
            (
                scores.expected_latency(peer),
                scores.tail_latency(peer),
                scores.error_rate(peer),
            )
        })
        .collect()
}

#[test]
fn replies_score_the_time_since_the_peer_was_asked() {
    let prior = ScoreConfig::default().prior_latency;
    let mut scores = PeerScores::new(ScoreConfig::default());
    let t0 = Instant::now();
    let mut plan = QuorumPlan::new(
        QuorumConfig {
            quorum: 2,
            fanout: 3,
            ..config(Policy::Hedged)
        },
        candidates(5, ms(500)),
        None,
        t0,
    )
    .unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0, 1, 2]);
    assert!(!plan.on_answer(4, t0 + ms(5), &mut scores), "never asked");
    assert_eq!(scores.expected_latency(4), prior);
    assert!(plan.on_answer(0, t0 + ms(20), &mut scores));
    assert_eq!(scores.expected_latency(0), ms(20));
    assert_eq!(scores.error_rate(0), 0.0);
    plan.on_failure(1, t0 + ms(30), &mut scores);
    assert_eq!(scores.expected_latency(1), ms(30));
    assert!(scores.error_rate(1) > 0.0);
    // Peer 2 still counts as live until its hedge delay; then peer 3 is asked in its place.
    assert!(drain(&mut plan, t0 + ms(30)).is_empty());
    assert_eq!(drain(&mut plan, t0 + ms(500)), vec![3]);
    assert!(plan.on_answer(3, t0 + ms(530), &mut scores));
    assert_eq!(scores.expected_latency(3), ms(30), "asked at 500 ms");
    assert_eq!(plan.outcome().map(|o| o.finish), Some(Finish::Quorum));
    // Peer 2 is still out: dropping it at 600 ms, later than the prior, is news.
    plan.cancel_pending(t0 + ms(600), &mut scores);
    assert_eq!(scores.expected_latency(2), ms(600));
    // Replies after the plan is done are not the driver's any more.
    let before = snapshot(&scores, 5);
    assert!(!plan.on_answer(2, t0 + ms(610), &mut scores));
    plan.on_failure(2, t0 + ms(620), &mut scores);
    assert_eq!(snapshot(&scores, 5), before);
}

#[test]
fn a_reply_after_a_sequential_timeout_is_scored_but_not_counted() {
    let mut scores = PeerScores::new(ScoreConfig::default());
    let t0 = Instant::now();
    let mut plan =
        QuorumPlan::new(config(Policy::Sequential), candidates(5, ms(50)), None, t0).unwrap();
    assert_eq!(drain(&mut plan, t0), vec![0]);
    assert_eq!(drain(&mut plan, t0 + ms(300)), vec![1]);
    assert!(plan.on_answer(0, t0 + ms(350), &mut scores));
    assert_eq!(scores.expected_latency(0), ms(350));
    assert_eq!(plan.outcome(), None);
    assert_eq!(
        plan.pending().map(|(peer, _)| peer).collect::<Vec<_>>(),
        vec![1],
        "peer 0 was given up; only peer 1 is awaited"
    );
}

#[derive(Debug, Clone)]
enum Step {
    Advance(u16),
    Answer(u8),
    Fail(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u16..400).prop_map(Step::Advance),
        (0u8..12).prop_map(Step::Answer),
        (0u8..12).prop_map(Step::Fail),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Sequential),
        Just(Policy::ParallelAll),
        Just(Policy::Hedged)
    ]
}

proptest! {
    /// Whatever peers do: each is asked at most once, bounds hold, and the plan is done by
    /// the deadline with an outcome that matches what happened.
    #[test]
    fn plans_are_bounded_and_end_by_the_deadline(
        policy in policy(),
        n in 0u32..12,
        quorum in 1usize..5,
        extra_fanout in 0usize..3,
        hedge_ms in 1u64..300,
        explore in proptest::option::of(0usize..12),
        steps in proptest::collection::vec(step(), 0..60),
    ) {
        let config = QuorumConfig {
            policy,
            quorum,
            fanout: quorum + extra_fanout,
            max_in_flight: 2 * (quorum + extra_fanout),
            deadline: ms(1000),
            attempt_timeout: ms(200),
        };
        let t0 = Instant::now();
        let mut now = t0;
        let explore = explore.filter(|index| *index >= config.fanout);
        let mut plan = QuorumPlan::new(config, candidates(n, ms(hedge_ms)), explore, t0).unwrap();
        let mut asked = std::collections::HashSet::new();
        let mut answered = 0;
        for step in steps.into_iter().chain(std::iter::once(Step::Advance(1000))) {
            while let Some(peer) = plan.poll_ask(now) {
                prop_assert!(asked.insert(peer), "peer {} asked twice", peer);
                prop_assert!(now < t0 + config.deadline);
            }
            let in_flight = plan.pending().count();
            match policy {
                Policy::Sequential => prop_assert!(in_flight <= 1),
                Policy::Hedged => prop_assert!(plan.slots.live() <= config.max_in_flight),
                Policy::ParallelAll => {}
            }
            if let Some(wake) = plan.poll_timeout() {
                prop_assert!(wake <= t0 + config.deadline);
            }
            match step {
                Step::Advance(step_ms) => now += ms(u64::from(step_ms)),
                Step::Answer(peer) => {
                    let peer = u32::from(peer);
                    if plan.outcome().is_none() && plan.pending().any(|(p, _)| p == peer) {
                        answered += 1;
                    }
                    plan.handle_answer(peer, now);
                }
                Step::Fail(peer) => plan.handle_failure(u32::from(peer), now),
            }
        }
        plan.handle_timeout(now);
        let outcome = plan.outcome();
        prop_assert!(outcome.is_some(), "not done after the deadline");
        let outcome = outcome.unwrap();
        prop_assert_eq!(outcome.answers, answered);
        prop_assert_eq!(outcome.asked, asked.len());
        prop_assert!(outcome.answers + outcome.failed <= outcome.asked);
        if outcome.finish == Finish::Quorum {
            prop_assert!(outcome.reached(quorum));
        }
        if policy != Policy::ParallelAll && outcome.reached(quorum) {
            prop_assert_eq!(outcome.finish, Finish::Quorum);
            prop_assert_eq!(outcome.answers, quorum);
        }
    }

    /// The chance of quorum is the Poisson-binomial tail: checked against every outcome.
    #[test]
    fn chance_of_quorum_counts_every_outcome(
        timely in proptest::collection::vec(0.0f64..=1.0, 0..8),
        needed in 0usize..5,
    ) {
        let t0 = Instant::now();
        let list: Vec<Candidate<u32>> = timely
            .iter()
            .enumerate()
            .map(|(peer, p)| Candidate { timely: *p, ..Candidate::new(peer as u32, ms(50)) })
            .collect();
        let n = list.len();
        let open = QuorumConfig {
            quorum: 1,
            fanout: n.max(1),
            max_in_flight: n.max(1),
            ..config(Policy::ParallelAll)
        };
        let mut plan = QuorumPlan::new(open, list, None, t0).unwrap();
        drain(&mut plan, t0);
        let mut brute = 0.0;
        for mask in 0u32..(1 << n) {
            let mut p = 1.0;
            for (i, t) in timely.iter().enumerate() {
                p *= if mask & (1 << i) != 0 { *t } else { 1.0 - t };
            }
            if mask.count_ones() as usize >= needed {
                brute += p;
            }
        }
        let chance = plan.slots.chance_of_quorum(needed);
        prop_assert!((chance - brute).abs() < 1e-9, "{} vs {}", chance, brute);
    }

    /// When every asked peer answers at once, a hedged plan asks only the quorum (plus the
    /// exploration peer) and sequential asks exactly the quorum.
    #[test]
    fn fast_peers_cost_no_extra_requests(n in 3u32..12, quorum in 1usize..4, explore in any::<bool>()) {
        for policy in [Policy::Hedged, Policy::Sequential] {
            let config = QuorumConfig { policy, ..QuorumConfig::hedged(quorum, ms(1000)) };
            let t0 = Instant::now();
            let explore_index = (explore && (n as usize) > quorum).then_some(n as usize - 1);
            let mut plan = QuorumPlan::new(config, candidates(n, ms(50)), explore_index, t0).unwrap();
            while plan.outcome().is_none() {
                let asked = drain(&mut plan, t0);
                prop_assert!(!asked.is_empty());
                for peer in asked {
                    plan.handle_answer(peer, t0 + MS);
                }
            }
            let outcome = plan.outcome().unwrap();
            let extra = usize::from(policy == Policy::Hedged && explore_index.is_some());
            prop_assert!(outcome.asked <= quorum + extra);
            prop_assert!(outcome.reached(quorum));
        }
    }
    /// Whatever peers do, the scores hear only about peers the plan asked, only while it
    /// runs, and failures raise a peer's error rate while answers never do.
    #[test]
    fn scores_follow_replies_of_asked_peers_while_the_plan_runs(
        policy in policy(),
        n in 1u32..10,
        quorum in 1usize..4,
        steps in proptest::collection::vec(step(), 0..60),
    ) {
        let config = QuorumConfig { policy, ..QuorumConfig::hedged(quorum, ms(1000)) };
        let mut scores = PeerScores::new(ScoreConfig::default());
        let t0 = Instant::now();
        let mut now = t0;
        let mut plan = QuorumPlan::new(config, candidates(n, ms(50)), None, t0).unwrap();
        let mut asked = std::collections::HashSet::new();
        let mut failed = std::collections::HashSet::new();
        let mut kept = 0;
        for step in steps {
            asked.extend(std::iter::from_fn(|| plan.poll_ask(now)));
            let before = snapshot(&scores, 12);
            let done = plan.outcome().is_some();
            match step {
                Step::Advance(step_ms) => now += ms(u64::from(step_ms)),
                Step::Answer(peer) => {
                    let peer = u32::from(peer);
                    let keep = plan.on_answer(peer, now, &mut scores);
                    prop_assert_eq!(keep, !done && asked.contains(&peer));
                    kept += usize::from(keep);
                }
                Step::Fail(peer) => {
                    let peer = u32::from(peer);
                    plan.on_failure(peer, now, &mut scores);
                    if !done && asked.contains(&peer) {
                        failed.insert(peer);
                        prop_assert!(scores.error_rate(peer) > 0.0);
                    }
                }
            }
            if done {
                prop_assert_eq!(snapshot(&scores, 12), before);
            }
        }
        plan.handle_timeout(now + ms(1000));
        plan.cancel_pending(now + ms(1000), &mut scores);
        let prior = ScoreConfig::default().prior_latency;
        for peer in 0..12u32 {
            if !asked.contains(&peer) {
                prop_assert_eq!(scores.expected_latency(peer), prior);
                prop_assert_eq!(scores.error_rate(peer), 0.0);
            }
            if !failed.contains(&peer) {
                prop_assert_eq!(scores.error_rate(peer), 0.0);
            }
        }
        let outcome = plan.outcome().unwrap();
        prop_assert!(outcome.answers <= kept);
    }
}
