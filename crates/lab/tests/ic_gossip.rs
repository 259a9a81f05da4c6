//! The ic-gossip scenario, shrunk: every policy delivers every consensus artifact and includes
//! ingress, and the advert counts order as the relay policies predict.

use std::path::Path;

use meshwire_lab::{run_scenario, Mode, Report, ScenarioFile};

fn metric(report: &Report, policy: &str, name: &str) -> f64 {
    report
        .metric(policy, name)
        .unwrap_or_else(|| panic!("no {name} for {policy}"))
}

#[test]
fn origin_relay_cuts_adverts_and_every_policy_delivers_consensus() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/ic-gossip.toml");
    let mut scenario = ScenarioFile::load(&path).unwrap();
    // A small instance of the 56-node case keeps the test quick.
    scenario.cases.truncate(1);
    let case = &mut scenario.cases[0];
    for (key, value) in [
        ("nodes", 6),
        ("ingress_per_s", 60),
        ("rounds", 2),
        ("blocks_per_s_milli", 1000),
        ("warmup_ms", 1500),
    ] {
        case.params.insert(key.into(), toml::Value::Integer(value));
    }
    let report = run_scenario(&scenario, 2, Mode::Virtual, |_, _| {}).unwrap();
    for policy in ["flood", "ic-origin", "meshwire"] {
        assert_eq!(
            metric(&report, policy, "consensus_delivery_ratio"),
            1.0,
            "{policy}"
        );
        assert_eq!(metric(&report, policy, "nodes_reporting"), 6.0, "{policy}");
        // 60 ingress/s over two 1 s rounds: most of them make it into the measured blocks.
        assert!(metric(&report, policy, "achieved_rps") > 50.0, "{policy}");
    }
    let adverts = |policy| metric(&report, policy, "adverts_per_node_per_s");
    assert!(adverts("meshwire") < adverts("ic-origin"));
    assert!(adverts("ic-origin") < adverts("flood"));
    // Relay trees: one payload per share per node, and fewer share bytes than advertising to all.
    assert_eq!(
        metric(&report, "meshwire", "share_duplicates_per_artifact"),
        0.0
    );
    let shares = |policy| metric(&report, policy, "share_duplicate_byte_ratio");
    assert!(shares("meshwire") < shares("ic-origin"));
    assert!(shares("meshwire") >= 1.0);
}
