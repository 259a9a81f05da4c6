//! The emulator agrees with theory, and a seed repeats exactly.

use std::path::Path;

use meshwire_lab::{run_scenario, Mode, Report, ScenarioFile};

fn calibration() -> ScenarioFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/calibration.toml");
    ScenarioFile::load(&path).unwrap()
}

fn metric(report: &Report, case: &str, name: &str) -> f64 {
    report
        .results
        .iter()
        .find(|result| result.case == case)
        .and_then(|result| result.metrics.get(name).copied())
        .unwrap_or_else(|| panic!("no {name} for {case}"))
}

fn within(value: f64, expected: f64, tolerance: f64) -> bool {
    (value - expected).abs() <= expected * tolerance
}

#[test]
fn calibration_matches_theory() {
    let scenario = calibration();
    let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {}).unwrap();
    let rtt = metric(&report, "rtt", "rtt_ms");
    assert!(within(rtt, 90.0, 0.02), "rtt {rtt} ms");
    let bdp = metric(&report, "bulk-bdp", "goodput_mbit_per_s");
    assert!(
        bdp >= 950.0,
        "BDP windows: {bdp} Mbit/s of a 1000 Mbit/s link"
    );
    let short = metric(&report, "bulk-short-link", "goodput_mbit_per_s");
    assert!(
        short >= 950.0,
        "short link: {short} Mbit/s of a 1000 Mbit/s link"
    );
    // window / RTT = 1.25 MB / 90 ms, less up to the eighth of the window the receiver reads
    // before it announces new credit (scenarios/calibration.toml)
    let default_window = metric(&report, "bulk-default-window", "goodput_mbit_per_s");
    let window_rate = 1.25e6 * 8.0 / 0.090 / 1e6;
    assert!(
        default_window >= window_rate * 7.0 / 8.0 * 0.98 && default_window <= window_rate * 1.02,
        "default window: {default_window} Mbit/s, outside 7/8..1 of {window_rate}"
    );
    let packets = metric(&report, "pps", "goodput_packets_per_s");
    assert!(within(packets, 1024.0, 0.02), "pps {packets}");
    let loss = metric(&report, "loss", "loss_ratio");
    assert!((loss - 0.10).abs() <= 0.01, "loss ratio {loss}");
    assert_eq!(
        metric(&report, "partition", "delivered_during_partition"),
        0.0
    );
    let reconnect = metric(&report, "partition", "reconnect_ms");
    assert!(
        reconnect.is_finite(),
        "messages never flowed again after the repair"
    );
}

#[test]
fn the_same_seed_gives_the_same_json() {
    let mut scenario = calibration();
    // The quick cases are enough to catch nondeterminism anywhere in the stack.
    scenario
        .cases
        .retain(|case| ["rtt", "loss", "partition", "pps"].contains(&case.name.as_str()));
    let first = run_scenario(&scenario, 42, Mode::Virtual, |_, _| {})
        .unwrap()
        .to_json();
    let second = run_scenario(&scenario, 42, Mode::Virtual, |_, _| {})
        .unwrap()
        .to_json();
    assert_eq!(first, second);
}
