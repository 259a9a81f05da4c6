//! The gRPC baselines of the xx-team scenario run real tonic calls round a lab ring: every batch
//! comes back with every node's transform applied, and 64 KiB HTTP/2 windows make a batch much
//! larger than the window take window round trips while streaming with tonic's defaults does not;
//! their TCP bytes are serialized at the link rate, so no hop comes in under its physical floor;
//! and their TCP loses segments at the link's loss rate.
#![cfg(feature = "baselines")]

use meshwire_lab::{run_scenario, Mode, Report, ScenarioFile};

/// Three nodes, 10 ms links, 200 KB batches (three 64 KiB windows and a bit).
const SCENARIO: &str = r#"
name = "grpc-baselines"
description = "small gRPC ring"
kind = "xx-team"
seed = 5
policies = ["grpc-unary-64k", "grpc-stream"]

[[case]]
name = "small"
workload = "ring"
duration_s = 30
link = { latency_ms = 10, rate_mbit_per_s = 1000 }
params = { nodes = 3, slots = 400, payload_bytes = 500, compute_ms = 5, batches = 4, hop_samples = 2 }
"#;

fn metric(report: &Report, policy: &str, name: &str) -> f64 {
    report
        .metric(policy, name)
        .unwrap_or_else(|| panic!("no {name} for {policy}"))
}

#[test]
fn grpc_baselines_deliver_every_batch_and_64k_windows_cost_round_trips() {
    let scenario = ScenarioFile::parse(SCENARIO, "test").unwrap();
    let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {}).unwrap();
    for policy in ["grpc-unary-64k", "grpc-stream"] {
        assert_eq!(metric(&report, policy, "batches_failed"), 0.0, "{policy}");
        assert!(metric(&report, policy, "batches_per_s") > 0.0, "{policy}");
        // Three one-way hops of 10 ms.
        assert_eq!(metric(&report, policy, "ring_ping_ms"), 30.0, "{policy}");
    }
    // 200 KB through 65 535-byte windows: at least three window round trips after the first
    // flight; streaming with the defaults' 1 MB windows: one flight.
    let unary = metric(&report, "grpc-unary-64k", "hop_transfer_ms_p50");
    let stream = metric(&report, "grpc-stream", "hop_transfer_ms_p50");
    assert!(unary >= 10.0 + 3.0 * 20.0, "unary hop {unary} ms");
    assert!(stream <= 12.0, "streaming hop {stream} ms");
}

/// Two nodes, 10 ms links, 50 KB batches (under the 64 KiB windows, so one flight): at 10 Mbit/s
/// a batch takes 40 ms to serialize, at 1000 packets/s (1500 B each, 12 Mbit/s) 33.3 ms. Without
/// serialization on turmoil's TCP both baselines took one latency, 10 ms.
const FLOOR_SCENARIO: &str = r#"
name = "grpc-floor"
description = "the gRPC baselines pay serialization"
kind = "xx-team"
seed = 7
policies = ["grpc-unary-64k", "grpc-stream"]

[[case]]
name = "bit-rate"
workload = "ring"
duration_s = 10
link = { latency_ms = 10, rate_mbit_per_s = 10 }
params = { nodes = 2, slots = 50, payload_bytes = 1000, batches = 1, hop_samples = 1 }

[[case]]
name = "packet-rate"
workload = "ring"
duration_s = 10
link = { latency_ms = 10, rate_packets_per_s = 1000 }
params = { nodes = 2, slots = 50, payload_bytes = 1000, batches = 1, hop_samples = 1 }
"#;

fn case_metric(report: &Report, case: &str, policy: &str, name: &str) -> f64 {
    report
        .results
        .iter()
        .find(|result| result.case == case && result.policy == policy)
        .and_then(|result| result.metrics.get(name).copied())
        .unwrap_or_else(|| panic!("no {name} for {policy} in {case}"))
}

#[test]
fn grpc_baselines_do_not_beat_the_hop_floor() {
    let scenario = ScenarioFile::parse(FLOOR_SCENARIO, "test").unwrap();
    let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {}).unwrap();
    for (case, floor) in [
        ("bit-rate", 10.0 + 40.0),
        ("packet-rate", 10.0 + 400.0 / 12.0),
    ] {
        for policy in ["grpc-unary-64k", "grpc-stream"] {
            let reported = case_metric(&report, case, policy, "hop_floor_ms");
            assert!(
                (reported - floor).abs() < 1e-3,
                "{case} {policy}: floor {reported}"
            );
            assert_eq!(case_metric(&report, case, policy, "batches_failed"), 0.0);
            // One sample after the warm-up batch, so the p50 is every sample there is.
            let hop = case_metric(&report, case, policy, "hop_transfer_ms_p50");
            assert!(
                hop >= floor - 1.0,
                "{case} {policy}: hop {hop} ms under the floor"
            );
        }
    }
}

/// The same ring on a lossless and on a 3%-loss link (10 ms, 100 Mbit/s, 200 KB batches). The
/// baselines' TCP loses segments at the link's rate, as meshwire's datagrams are lost: each lost
/// segment arrives a round trip late and the bytes behind it wait, so the lossy hops are slower.
/// Before TCP's rules were modelled (`crates/lab/src/tcp_link/flow.rs`) nothing was lost and the
/// two cases took the same time.
const LOSS_SCENARIO: &str = r#"
name = "grpc-loss"
description = "the gRPC baselines pay the link's loss"
kind = "xx-team"
seed = 3
policies = ["grpc-unary-64k", "grpc-stream"]

[[case]]
name = "lossless"
workload = "ring"
duration_s = 30
link = { latency_ms = 10, rate_mbit_per_s = 100 }
params = { nodes = 2, slots = 400, payload_bytes = 500, batches = 1, hop_samples = 4 }

[[case]]
name = "lossy"
workload = "ring"
duration_s = 30
link = { latency_ms = 10, rate_mbit_per_s = 100, loss = 0.03 }
params = { nodes = 2, slots = 400, payload_bytes = 500, batches = 1, hop_samples = 4 }
"#;

#[test]
fn grpc_baselines_pay_the_links_loss() {
    let scenario = ScenarioFile::parse(LOSS_SCENARIO, "test").unwrap();
    let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {}).unwrap();
    for policy in ["grpc-unary-64k", "grpc-stream"] {
        for case in ["lossless", "lossy"] {
            assert_eq!(case_metric(&report, case, policy, "batches_failed"), 0.0);
        }
        let lossless = case_metric(&report, "lossless", policy, "hop_transfer_ms_p99");
        let lossy = case_metric(&report, "lossy", policy, "hop_transfer_ms_p99");
        assert!(
            lossy >= lossless + 20.0,
            "{policy}: {lossy} ms lossy against {lossless} ms lossless"
        );
    }
}
