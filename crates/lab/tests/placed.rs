//! A case split over processes (`meshwire lab host`), here two threads with a lab each: each runs
//! its own host on real loopback sockets, they meet over their control sockets, and the one that
//! runs the measuring client gets the metrics, including what the other host recorded.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use meshwire_lab::{run_host, CaseResult, Placement, ScenarioFile};

const SCENARIO: &str = r#"
name = "placed"
description = "two hosts in two labs"
kind = "calibration"
seed = 3
policies = ["meshwire"]

[[case]]
name = "rtt"
workload = "rtt"
duration_s = 10
link = { latency_ms = 5, rate_mbit_per_s = 100 }
params = { requests = 5 }

[[case]]
name = "bulk"
workload = "bulk"
duration_s = 20
link = { latency_ms = 5, rate_mbit_per_s = 100 }
params = { mebibytes = 4, warmup_mebibytes = 1 }
"#;

/// Runs `case` with host `a` and host `b` each in its own lab on its own thread.
fn run_split(case: &str, control: &Path) -> (Option<CaseResult>, Option<CaseResult>) {
    let scenario = ScenarioFile::parse(SCENARIO, "inline").unwrap();
    let addresses: BTreeMap<String, IpAddr> = [
        ("a".to_string(), "127.0.79.1".parse().unwrap()),
        ("b".to_string(), "127.0.79.2".parse().unwrap()),
    ]
    .into_iter()
    .collect();
    let start = SystemTime::now() + Duration::from_millis(300);
    let run = |host: &str| {
        let placement = Placement {
            host: host.to_string(),
            addresses: addresses.clone(),
            control_dir: control.to_path_buf(),
            start,
            kernel_rate: false,
        };
        let scenario = scenario.clone();
        let case = case.to_string();
        std::thread::spawn(move || {
            run_host(&scenario, scenario.seed, &case, "meshwire", &placement).unwrap()
        })
    };
    let (a, b) = (run("a"), run("b"));
    (a.join().unwrap(), b.join().unwrap())
}

#[test]
fn hosts_in_separate_labs_run_a_case_and_the_client_reports_it() {
    let control = std::env::temp_dir().join(format!("meshwire-placed-{}", std::process::id()));
    std::fs::create_dir_all(&control).unwrap();

    let (a, b) = run_split("rtt", &control);
    let a = a.expect("the client's lab reports the case");
    assert!(b.is_none(), "a host that only serves reports nothing");
    // Two 5 ms crossings of the emulated link, on real sockets.
    let rtt = a.metrics["rtt_ms"];
    assert!((9.0..100.0).contains(&rtt), "rtt {rtt} ms");

    // The receiver's log of what it got reaches the sender's lab, which computes the goodput.
    let (a, b) = run_split("bulk", &control);
    let goodput = a.unwrap().metrics["goodput_mbit_per_s"];
    assert!(goodput > 0.0 && goodput <= 100.0, "goodput {goodput}");
    assert!(b.is_none());

    std::fs::remove_dir_all(&control).unwrap();
}
