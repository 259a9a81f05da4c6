//! Small sweeps of every experiment with a floor, as CI runs them: each draws a few cases from
//! narrow ranges (so a debug build finishes in seconds), and every result must complete and stay
//! at or above its physical floor (beyond the lab's 1 ms tick). Targets on the ratios are checked
//! by the full sweeps in `scenarios/sweeps/` (`bash scripts/results.sh`), not here.

use std::path::Path;

use meshwire_alloc_count::CountingAllocator;
use meshwire_lab::{Sweep, SweepReport};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn sweep(kind: &str, workload: &str, policies: &str, link: &str, params: &str) -> Sweep {
    let text = format!(
        "name = \"ci-{kind}\"\ndescription = \"small {kind} sweep\"\nkind = \"{kind}\"\n\
         workload = \"{workload}\"\nseed = 1\ncases = 2\npolicies = {policies}\n\
         duration_s = 120\nlink = {link}\nparams = {params}\n"
    );
    Sweep::parse(&text, kind).unwrap_or_else(|error| panic!("{error}"))
}

/// Runs `cases` cases and checks every result completed, has every ratio and is not below its
/// floor.
fn run(sweep: &Sweep, cases: usize) -> SweepReport {
    let report = sweep.run(7, cases, |_| {});
    assert!(
        report.below_floor.is_empty(),
        "{}: below the floor: {:?}",
        report.sweep,
        report.below_floor
    );
    for case in &report.cases {
        for run in &case.results {
            assert_eq!(
                run.failed, None,
                "{} case {} {}",
                report.sweep, case.index, run.policy
            );
            assert_eq!(
                run.ratios.len(),
                report.ratios.len(),
                "{} case {} {}: {:?}",
                report.sweep,
                case.index,
                run.policy,
                run.metrics
            );
        }
    }
    for distribution in &report.distributions {
        assert_eq!(distribution.cases, cases, "{distribution:?}");
        assert!(distribution.min.is_some_and(|min| min > 0.0));
    }
    report
}

#[test]
fn every_sweep_file_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/sweeps");
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "toml") {
            let sweep = Sweep::load(&path).unwrap_or_else(|error| panic!("{error}"));
            kinds.push(sweep.file().kind.clone());
        }
    }
    kinds.sort();
    kinds.dedup();
    for kind in [
        "fanout",
        "gossip",
        "multipath",
        "session",
        "xx-team",
        "zold-fetch",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no sweep of {kind}: {kinds:?}"
        );
    }
}

#[test]
fn ring_hops_stay_above_their_floor() {
    let sweep = sweep(
        "xx-team",
        "ring",
        r#"["grpc-unary-64k", "grpc-stream", "meshwire", "meshwire-pipelined"]"#,
        "{ latency_ms = { range = [1, 20] }, rate_mbit_per_s = { range = [20.0, 200.0] }, \
         loss = { choose = [0.0, 0.005] } }",
        "{ nodes = 3, payload_bytes = 500, slots = { range = [20, 200] }, compute_ms = 0, \
         batches = 1, baseline_batches = 1, pipelined_k = 2, hop_samples = 2 }",
    );
    run(&sweep, 2);
}

#[test]
fn multipath_transfers_stay_above_the_latency_aware_ideal_and_are_deterministic() {
    let sweep = sweep(
        "multipath",
        "transfer",
        r#"["classic", "nkp24", "meshwire"]"#,
        "{ latency_ms = 5 }",
        "{ mib = 1, paths = { repeat = [2, 3], each = { latency_ms = { range = [5, 60] }, \
         rate_packets_per_s = { range = [300, 2000], scale = \"log\" }, \
         loss = { choose = [0.0, 0.02] } } } }",
    );
    let first = run(&sweep, 2);
    assert_eq!(first.to_json(), sweep.run(7, 2, |_| {}).to_json());
}

#[test]
fn sessions_over_quic_stay_above_the_latency_aware_ideal() {
    let sweep = sweep(
        "session",
        "transfer",
        r#"["classic", "nkp24", "meshwire"]"#,
        "{ latency_ms = 5 }",
        "{ mib = 1, direct = { latency_ms = { range = [5, 40] }, \
         rate_packets_per_s = { range = [500, 2000] } }, relays = { repeat = [1, 2], each = { \
         latency_ms = { range = [5, 60] }, rate_packets_per_s = { range = [300, 2000] }, \
         loss = { choose = [0.0, 0.02] } } } }",
    );
    run(&sweep, 2);
}

#[test]
fn quorum_reads_stay_above_their_floor_and_are_deterministic() {
    let sweep = sweep(
        "zold-fetch",
        "quorum-reads",
        r#"["sequential", "parallel-all", "hedged"]"#,
        "{ latency_ms = 10 }",
        "{ servers = { range = [6, 10] }, slow_percent = { range = [0.0, 70.0] }, \
         dead_percent = { range = [0.0, 30.0] }, quorum = { range = [1, 3] }, slow_ms = 400, \
         min_latency_ms = 5, max_latency_ms = { range = [10, 60] }, reads = 20, \
         reads_per_s = 40, warmup_ms = 500, deadline_ms = 3000, attempt_timeout_ms = 1000 }",
    );
    let first = run(&sweep, 2);
    assert_eq!(first.to_json(), sweep.run(7, 2, |_| {}).to_json());
}

#[test]
fn fanout_stays_above_its_heap_and_completion_floors() {
    let sweep = sweep(
        "fanout",
        "fanout",
        r#"["meshwire", "naive"]"#,
        "{ latency_ms = { range = [5, 50] }, rate_mbit_per_s = 1000 }",
        "{ peers = { range = [3, 12] }, payload_bytes = { range = [16384, 262144], scale = \"log\" } }",
    );
    run(&sweep, 2);
}

#[test]
fn gossip_bytes_stay_above_the_distinct_bytes_each_node_holds() {
    let sweep = sweep(
        "gossip",
        "ic-subnet",
        r#"["flood", "ic-origin", "meshwire"]"#,
        "{ latency_ms = { range = [5, 40] }, rate_mbit_per_s = 1000, loss = { choose = [0.0, 0.02] } }",
        "{ nodes = { range = [4, 6] }, ingress_per_s = 20, ingress_bytes = { range = [200, 2048] }, \
         blocks_per_s_milli = 1000, rounds = 2, shares_per_round = 2, \
         share_bytes = { range = [200, 1024] }, warmup_ms = 1000, drain_ms = 1000 }",
    );
    run(&sweep, 2);
}
