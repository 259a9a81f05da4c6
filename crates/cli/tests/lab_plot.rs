//! `meshwire lab run` and `meshwire lab plot` as a user runs them, with stderr not a terminal.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_meshwire");

/// A scenario of one short case: a lab round trip over a 45 ms link.
const TINY: &str = r#"
name = "tiny"
description = "one round trip"
kind = "calibration"
seed = 3
policies = ["meshwire"]
[[case]]
name = "rtt"
workload = "rtt"
duration_s = 5
link = { latency_ms = 45, rate_mbit_per_s = 100 }
"#;

const SWEEP: &str = r#"{"sweep": "ring", "kind": "xx-team", "workload": "ring", "seed": 1,
 "policies": ["grpc-unary-64k", "meshwire"],
 "ratios": [{"name": "hop_p50", "metric": "hop_transfer_ms_p50", "floor": "hop_floor_ms"}],
 "cases": [
  {"index": 0, "name": "case-0", "link": {}, "params": {}, "duration_s": 60.0, "results": [
    {"policy": "meshwire", "failed": null, "metrics": {}, "ratios": {"hop_p50": 1.061}},
    {"policy": "grpc-unary-64k", "failed": "the run did not finish within 60 s of virtual time", "metrics": {}, "ratios": {}}]},
  {"index": 1, "name": "case-1", "link": {}, "params": {}, "duration_s": 60.0, "results": [
    {"policy": "meshwire", "failed": null, "metrics": {}, "ratios": {"hop_p50": 1.3}},
    {"policy": "grpc-unary-64k", "failed": null, "metrics": {}, "ratios": {"hop_p50": 2.5}}]}],
 "distributions": [], "worst": []}"#;

fn meshwire(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("cannot run meshwire")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn run_then_plot() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tiny.toml"), TINY).unwrap();
    let run = meshwire(&["lab", "run", "--json", "tiny.toml"], dir.path());
    assert!(run.status.success(), "{}", text(&run.stderr));
    // No terminal, no progress output.
    assert_eq!(text(&run.stderr), "");
    std::fs::write(dir.path().join("tiny.json"), &run.stdout).unwrap();
    std::fs::write(dir.path().join("sweep.json"), SWEEP).unwrap();

    let args = [
        "lab",
        "plot",
        "--out",
        "charts",
        "--metric",
        "rtt_ms",
        "tiny.json",
        "sweep.json",
    ];
    let plot = meshwire(&args, dir.path());
    assert!(plot.status.success(), "{}", text(&plot.stderr));
    assert_eq!(
        text(&plot.stdout),
        "charts/tiny-rtt_ms.svg\ncharts/ring-hop_p50.svg\n"
    );
    let bars = std::fs::read_to_string(dir.path().join("charts/tiny-rtt_ms.svg")).unwrap();
    assert!(bars.contains("tiny / rtt_ms") && bars.contains("meshwire"));
    let cdf = std::fs::read(dir.path().join("charts/ring-hop_p50.svg")).unwrap();
    assert!(text(&cdf).contains("grpc-unary-64k (2 cases, 1 failed)"));

    // The same input gives the same bytes.
    let again = meshwire(&args, dir.path());
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        std::fs::read(dir.path().join("charts/ring-hop_p50.svg")).unwrap(),
        cdf
    );
}

#[test]
fn plot_errors_are_clear_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let report = r#"{"scenario":"s","seed":1,"results":[{"case":"c","policy":"meshwire","metrics":{"rtt_ms":90.0}}],"anchors":{}}"#;
    std::fs::write(dir.path().join("run.json"), report).unwrap();
    std::fs::write(dir.path().join("broken.json"), "{\"scenario\": ").unwrap();
    std::fs::write(dir.path().join("other.json"), "{\"name\": 1}").unwrap();
    std::fs::write(dir.path().join("sweep.json"), SWEEP).unwrap();

    let cases: [(&[&str], &[&str]); 5] = [
        (&["run.json"], &["run.json", "--metric", "rtt_ms"]),
        (
            &["--metric", "goodput", "run.json"],
            &["run.json", "\"goodput\"", "rtt_ms"],
        ),
        (
            &["--metric", "rtt_ms", "broken.json"],
            &["broken.json is not JSON"],
        ),
        (
            &["--metric", "rtt_ms", "other.json"],
            &["other.json", "sweep report"],
        ),
        (
            &["--metric", "rtt_ms", "sweep.json", "missing.json"],
            &["cannot read missing.json"],
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["lab", "plot", "--out", "charts"];
        all.extend_from_slice(args);
        let output = meshwire(&all, dir.path());
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        for part in expected {
            assert!(stderr.contains(part), "{args:?}: no {part:?} in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!dir.path().join("charts").exists(), "{args:?} wrote charts");
    }
}
