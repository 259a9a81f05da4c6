//! The fan-out scenario delivers identical bytes everywhere and the encode-once sender holds far
//! less heap than the per-destination one.

use std::path::Path;

use meshwire_alloc_count::CountingAllocator;
use meshwire_lab::{run_scenario, Mode, Report, ScenarioFile};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn metric(report: &Report, policy: &str, name: &str) -> f64 {
    report
        .metric(policy, name)
        .unwrap_or_else(|| panic!("no {name} for {policy}"))
}

#[test]
fn encode_once_delivers_everywhere_without_per_destination_copies() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/safe-fanout.toml");
    let mut scenario = ScenarioFile::load(&path).unwrap();
    // A smaller instance of the published experiment keeps the test quick.
    let case = &mut scenario.cases[0];
    case.params.insert("peers".into(), toml::Value::Integer(20));
    case.params
        .insert("payload_bytes".into(), toml::Value::Integer(256 * 1024));
    let report = run_scenario(&scenario, 3, Mode::Virtual, |_, _| {}).unwrap();
    for policy in ["meshwire", "naive"] {
        assert_eq!(metric(&report, policy, "delivered_ratio"), 1.0, "{policy}");
    }
    let naive = metric(&report, "naive", "sender_heap_peak_bytes");
    let ours = metric(&report, "meshwire", "sender_heap_peak_bytes");
    assert!(
        naive >= 20.0 * 256.0 * 1024.0,
        "naive sender held only {naive} bytes"
    );
    assert!(
        ours * 4.0 < naive,
        "encode-once sender held {ours} bytes vs naive {naive}"
    );
}
