//! Two flows through a shared bottleneck (the `fairness` kind) both get through and fill it.

use meshwire_lab::{run_scenario, Mode, ScenarioFile};

/// Two CUBIC flows, 2 s at 20 Mbit/s behind a one-BDP queue, the first half second left out.
const SCENARIO: &str = r#"
name = "fairness-small"
description = "two flows, 20 Mbit/s"
kind = "fairness"
seed = 1
policies = ["meshwire"]

[[case]]
name = "two-cubic"
workload = "shared-bottleneck"
duration_s = 10
link = { latency_ms = 10 }
params = { bottleneck_mbit_per_s = 20, seconds = 2, warmup_ms = 500 }
"#;

#[test]
fn two_flows_share_a_bottleneck_and_fill_it() {
    let scenario = ScenarioFile::parse(SCENARIO, "inline").unwrap();
    let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {}).unwrap();
    let metrics = &report.results[0].metrics;
    let get = |name: &str| {
        *metrics
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {metrics:?}"))
    };
    assert!(get("goodput_1_mbit_per_s") > 0.0, "{metrics:?}");
    assert!(get("goodput_2_mbit_per_s") > 0.0, "{metrics:?}");
    assert!(get("utilization") > 0.5, "{metrics:?}");
    assert!(get("utilization") <= 1.0, "{metrics:?}");
    assert!(
        (get("share_1") + get("share_2") - 2.0).abs() < 1e-4,
        "{metrics:?}"
    );
    assert_eq!(get("measured_s"), 1.5);
}

#[test]
fn an_unknown_controller_or_a_zero_rate_is_refused_naming_the_field() {
    let vegas = SCENARIO.replace("seconds = 2", r#"seconds = 2, congestion_2 = "vegas""#);
    let message = ScenarioFile::parse(&vegas, "inline")
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("vegas") && message.contains("`bbr`"),
        "{message}"
    );
    let zero = SCENARIO.replace("bottleneck_mbit_per_s = 20", "bottleneck_mbit_per_s = 0");
    let scenario = ScenarioFile::parse(&zero, "inline").unwrap();
    let message = run_scenario(&scenario, 1, Mode::Virtual, |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(message.contains("bottleneck_mbit_per_s"), "{message}");
}
