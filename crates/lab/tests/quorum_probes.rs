//! Probes of a large cluster (`crates/objects/src/net/service/probe.rs`): once enough members are
//! known to answer within a farther member's round trip, the farther one is not probed, and every
//! read still reaches its quorum with the winner's content.

use meshwire_lab::{run_scenario, Mode, ScenarioFile};

/// 24 healthy replicas between 5 and 400 ms away, quorum 1, 20 reads: probing each member would
/// add 24 requests to the reads' 20.
const SCENARIO: &str = r#"
name = "probes"
description = "quorum reads over a large cluster"
kind = "zold-fetch"
seed = 3
policies = ["hedged"]

[[case]]
name = "wide"
workload = "quorum-reads"
duration_s = 30
link = { latency_ms = 10 }
params = { servers = 24, slow = 0, dead = 0, quorum = 1, min_latency_ms = 5, max_latency_ms = 400, reads = 20, reads_per_s = 20, warmup_ms = 2000, deadline_ms = 3000, attempt_timeout_ms = 1000 }
"#;

#[test]
fn members_farther_than_enough_known_fast_ones_are_not_probed() {
    let scenario = ScenarioFile::parse(SCENARIO, "probes").unwrap();
    let report = run_scenario(&scenario, 3, Mode::Virtual, |_, _| {}).unwrap();
    let metric = |name| report.metric("hedged", name).unwrap();
    assert_eq!(metric("quorum_ratio"), 1.0, "every read reached quorum");
    let reads = 20.0;
    let probes = metric("requests_per_read") * reads - reads;
    assert!(
        probes < 24.0,
        "{probes} requests beyond one per read: every member was probed"
    );
}
