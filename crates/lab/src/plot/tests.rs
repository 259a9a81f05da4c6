use super::*;

const SWEEP: &str = r#"{"sweep": "ring", "kind": "xx-team", "workload": "ring", "seed": 1,
 "policies": ["grpc-unary-64k", "meshwire"],
 "ratios": [{"name": "hop_p50", "metric": "hop_transfer_ms_p50", "floor": "hop_floor_ms"}],
 "cases": [
  {"index": 0, "name": "case-0", "link": {"latency_ms": 20}, "params": {}, "duration_s": 60.0,
   "results": [
{"policy": "meshwire", "failed": null, "metrics": {"hop_transfer_ms_p50": 52.0, "hop_floor_ms": 49.0}, "ratios": {"hop_p50": 1.061}},
{"policy": "grpc-unary-64k", "failed": "the run did not finish within 60 s of virtual time", "metrics": {}, "ratios": {}}]},
  {"index": 1, "name": "case-1", "link": {"latency_ms": 80}, "params": {}, "duration_s": 60.0,
   "results": [
{"policy": "meshwire", "failed": null, "metrics": {}, "ratios": {"hop_p50": 1.4}},
{"policy": "grpc-unary-64k", "failed": null, "metrics": {}, "ratios": {"hop_p50": 3.2}}]},
  {"index": 2, "name": "case-2", "link": {"latency_ms": 5}, "params": {}, "duration_s": 60.0,
   "results": [
{"policy": "meshwire", "failed": null, "metrics": {}, "ratios": {"hop_p50": 1.02}},
{"policy": "grpc-unary-64k", "failed": null, "metrics": {}, "ratios": {"hop_p50": null}}]}],
 "distributions": [{"policy": "meshwire", "ratio": "hop_p50", "cases": 3, "failed": 0, "min": 1.02, "p10": 1.02, "median": 1.061, "p90": 1.4, "max": 1.4},
               {"policy": "grpc-unary-64k", "ratio": "hop_p50", "cases": 3, "failed": 1, "min": 3.2, "p10": null, "median": null, "p90": null, "max": null}],
 "worst": [{"policy": "meshwire", "ratio": "hop_p50", "case": 1, "value": 1.4}]}"#;

const SCENARIO: &str = r#"{"scenario":"calibration","seed":1,"results":[
 {"case":"bulk-bdp","policy":"meshwire","metrics":{"goodput_mbit_per_s":952.7,"sender_queue_drops":0.0}},
 {"case":"bulk-bdp","policy":"naive","metrics":{"goodput_mbit_per_s":610.25}},
 {"case":"bulk-default-window","policy":"meshwire","metrics":{"goodput_mbit_per_s":109.8}},
 {"case":"bulk-default-window","policy":"naive","metrics":{"goodput_mbit_per_s":null}},
 {"case":"rtt","policy":"meshwire","metrics":{"rtt_ms":90.0}}],
 "anchors":{"rtt_ms":90}}"#;

fn metrics(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

#[test]
fn draws_a_sweep_cdf_per_ratio() {
    let input = PlotInput::parse(SWEEP, "sweep.json").unwrap();
    let PlotInput::Sweep(report) = &input else {
        panic!("not a sweep: {input:?}");
    };
    assert_eq!(report.cases.len(), 3);
    let charts = input.charts(&[], "sweep.json").unwrap();
    assert_eq!(charts.len(), 1);
    let chart = &charts[0];
    assert_eq!(chart.file_name, "ring-hop_p50.svg");
    assert_eq!(chart.title, "ring / hop_p50");
    assert!(chart.svg.starts_with("<svg"), "{}", &chart.svg[..80]);
    assert!(chart.svg.contains("ring / hop_p50"));
    assert!(chart.svg.contains("meshwire (3 cases, 0 failed)"));
    assert!(chart
        .svg
        .contains("grpc-unary-64k (3 cases, 1 failed, 1 infinite)"));
    assert!(chart.svg.contains("floor (ratio 1)"));
    assert!(chart.svg.contains("fraction of cases"));
    assert!(chart.svg.contains("hop_transfer_ms_p50 / hop_floor_ms"));
    // Same input, same bytes.
    let again = PlotInput::parse(SWEEP, "sweep.json")
        .unwrap()
        .charts(&[], "sweep.json")
        .unwrap();
    assert_eq!(charts, again);
}

#[test]
fn cdf_steps_end_below_one_for_failed_cases() {
    let curve = Curve {
        policy: "p",
        finite: vec![1.5, 2.0],
        failed: 1,
        infinite: 1,
    };
    let steps = curve.steps(&(0.9..3.0));
    assert_eq!(
        steps,
        vec![
            (0.9, 0.0),
            (1.5, 0.0),
            (1.5, 0.25),
            (2.0, 0.25),
            (2.0, 0.5),
            (3.0, 0.5)
        ]
    );
    assert_eq!(curve.legend(), "p (4 cases, 1 failed, 1 infinite)");
}

#[test]
fn draws_a_scenario_bar_chart_per_metric() {
    let input = PlotInput::parse(SCENARIO, "run.json").unwrap();
    let charts = input
        .charts(
            &metrics(&["goodput_mbit_per_s", "rtt_ms", "goodput_mbit_per_s"]),
            "run.json",
        )
        .unwrap();
    let names: Vec<&str> = charts
        .iter()
        .map(|chart| chart.file_name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "calibration-goodput_mbit_per_s.svg",
            "calibration-rtt_ms.svg"
        ]
    );
    let goodput = &charts[0].svg;
    for text in [
        "calibration / goodput_mbit_per_s",
        "meshwire",
        "naive",
        "bulk-bdp",
        "bulk-default-window",
        "952.7",
        "n/a",
    ] {
        assert!(goodput.contains(text), "no {text:?} in the chart");
    }
    // Only the cases that have the metric.
    assert!(!goodput.contains(">rtt<") && !goodput.contains("rtt\n"));
    // The rtt chart has only meshwire's bar.
    assert!(!charts[1].svg.contains("naive"));
    let again = PlotInput::parse(SCENARIO, "run.json")
        .unwrap()
        .charts(&metrics(&["goodput_mbit_per_s", "rtt_ms"]), "run.json")
        .unwrap();
    assert_eq!(charts, again);
}

#[test]
fn extreme_ratios_still_draw() {
    let sweep = r#"{"sweep": "s", "ratios": [{"name": "r"}], "cases": [
        {"results": [{"policy": "a", "ratios": {"r": 0.0}}, {"policy": "b", "ratios": {"r": 1e300}}]},
        {"results": [{"policy": "a", "ratios": {"r": -2.0}}, {"policy": "b", "ratios": {"r": 1e-300}}]}]}"#;
    let charts = PlotInput::parse(sweep, "s.json")
        .unwrap()
        .charts(&[], "s.json")
        .unwrap();
    assert!(charts[0].svg.contains("a (2 cases, 0 failed)"));
    let empty = r#"{"sweep": "s", "ratios": [{"name": "r"}], "cases": []}"#;
    let charts = PlotInput::parse(empty, "e.json")
        .unwrap()
        .charts(&[], "e.json")
        .unwrap();
    assert!(charts[0].svg.contains("floor (ratio 1)"));
    let negative = r#"{"scenario": "n", "results": [
        {"case": "c", "policy": "p", "metrics": {"m": -5.0}},
        {"case": "d", "policy": "p", "metrics": {"m": 0.0}}]}"#;
    let charts = PlotInput::parse(negative, "n.json")
        .unwrap()
        .charts(&metrics(&["m"]), "n.json")
        .unwrap();
    assert!(charts[0].svg.contains("-5"));
}

#[test]
fn errors_name_the_file_and_the_metric() {
    let not_json = PlotInput::parse("{nope", "a.json").unwrap_err();
    assert!(matches!(not_json, PlotError::NotJson { .. }));
    assert!(not_json.to_string().contains("a.json is not JSON"));

    let neither = PlotInput::parse(r#"{"name": "x"}"#, "b.json").unwrap_err();
    assert!(matches!(neither, PlotError::Shape { .. }), "{neither}");
    assert!(neither.to_string().contains("b.json"));
    let array = PlotInput::parse("[1, 2]", "c.json").unwrap_err();
    assert!(matches!(array, PlotError::Shape { .. }), "{array}");
    let broken_sweep = PlotInput::parse(r#"{"sweep": "s", "cases": []}"#, "d.json")
        .unwrap_err()
        .to_string();
    assert!(
        broken_sweep.contains("d.json") && broken_sweep.contains("ratios"),
        "{broken_sweep}"
    );

    let input = PlotInput::parse(SCENARIO, "run.json").unwrap();
    let none = input.charts(&[], "run.json").unwrap_err();
    assert!(matches!(none, PlotError::NoMetric { .. }));
    assert!(none.to_string().contains("--metric"));
    assert!(none.to_string().contains("goodput_mbit_per_s, rtt_ms"));
    let unknown = input
        .charts(&metrics(&["rtt_ms", "latency"]), "run.json")
        .unwrap_err();
    assert!(matches!(unknown, PlotError::UnknownMetric { .. }));
    let message = unknown.to_string();
    assert!(message.contains("run.json") && message.contains("\"latency\""));

    let no_ratios = PlotInput::parse(r#"{"sweep": "s", "ratios": [], "cases": []}"#, "e")
        .unwrap()
        .charts(&[], "e")
        .unwrap_err();
    assert!(matches!(no_ratios, PlotError::NoRatios { .. }));

    let missing = PlotInput::load(Path::new("/nonexistent/report.json")).unwrap_err();
    assert!(matches!(missing, PlotError::Io { .. }));
    assert!(missing.to_string().contains("/nonexistent/report.json"));
}

#[test]
fn file_names_stay_in_the_directory() {
    assert_eq!(file_part("ring"), "ring");
    assert_eq!(file_part("../etc/passwd"), ".._etc_passwd");
    assert_eq!(file_part(".."), "___");
    assert_eq!(file_part(""), "_");
}

#[test]
fn ticks_are_round() {
    let ticks = linear_ticks(&(0.0..1.0), 5);
    let expected = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0];
    assert_eq!(ticks.len(), expected.len(), "{ticks:?}");
    for (tick, expected) in ticks.iter().zip(expected) {
        assert!((tick - expected).abs() < 1e-12, "{ticks:?}");
    }
    assert_eq!(
        log_ticks(&(0.9..110.0)),
        vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
    );
    let wide = log_ticks(&(0.5..2e40));
    assert!((5..=11).contains(&wide.len()), "{wide:?}");
    assert_eq!(tick(1.5), "1.5");
    assert_eq!(tick(2.0), "2");
    assert_eq!(tick(0.30000000000000004), "0.3");
    assert_eq!(tick(1e40), "1e40");
    assert_eq!(tick(0.00015), "1.5e-4");
    assert_eq!(tick(250000.0), "250000");
}
