//! The gRPC baselines of the xx-team scenario run real tonic calls round a lab ring: every batch
//! comes back with every node's transform applied, and 64 KiB HTTP/2 windows make a batch much
//! larger than the window take window round trips while streaming with tonic's defaults does not.
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
