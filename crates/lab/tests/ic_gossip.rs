//! The ic-gossip scenario, shrunk: every policy delivers every consensus artifact and includes
//! ingress, and the advert counts order as the relay policies predict; each host's CPU runs one
//! job at a time, and under the CPU model flood's adverts saturate it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use meshwire_lab::lab::{clock, wan_link};
use meshwire_lab::{run_scenario, Cpu, CpuStats, Lab, Mode, Report, ScenarioFile};

fn metric(report: &Report, policy: &str, name: &str) -> f64 {
    report
        .metric(policy, name)
        .unwrap_or_else(|| panic!("no {name} for {policy}"))
}

/// A small instance of the 56-node case (no CPU costs) keeps the tests quick.
fn small_scenario() -> ScenarioFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/ic-gossip.toml");
    let mut scenario = ScenarioFile::load(&path).unwrap();
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
    case.params.retain(|key, _| !key.starts_with("cpu_"));
    scenario
}

#[test]
fn origin_relay_cuts_adverts_and_every_policy_delivers_consensus() {
    let scenario = small_scenario();
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

/// Per host: when each job finished, the CPU's counters, and its backlog at two instants.
type CpuSeen = Rc<RefCell<BTreeMap<String, (Vec<Duration>, CpuStats, Duration, Duration)>>>;

/// `jobs` jobs of `cost`, one submitted every `every` (all at once when zero), on the host's CPU.
async fn submit(cpu: Arc<Cpu>, jobs: u32, cost: Duration, every: Duration) -> Vec<Duration> {
    let mut running = Vec::new();
    for _ in 0..jobs {
        let cpu = cpu.clone();
        running.push(tokio::task::spawn_local(async move {
            cpu.run(cost).await;
            clock()
        }));
        if every.is_zero() {
            // Let the job submit itself before the next one is spawned.
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(every).await;
        }
    }
    let mut finished = Vec::new();
    for job in running {
        finished.push(job.await.expect("job task"));
    }
    finished
}

#[test]
fn a_host_cpu_runs_one_job_at_a_time_and_queues_what_it_cannot_keep_up_with() {
    let link = wan_link(Duration::from_millis(10), 100_000_000);
    let mut lab = Lab::new(5, link, Duration::from_secs(10));
    let seen: CpuSeen = Rc::default();
    // (host, jobs, cost, interval): a burst, a host with spare time, an overloaded host.
    let plans = [
        ("burst", 50, Duration::from_millis(2), Duration::ZERO),
        (
            "idle",
            40,
            Duration::from_millis(1),
            Duration::from_millis(5),
        ),
        (
            "busy",
            200,
            Duration::from_millis(5),
            Duration::from_millis(2),
        ),
    ];
    for (name, jobs, cost, every) in plans {
        let seen = seen.clone();
        lab.client(name, move |context| async move {
            let cpu = context.cpu().clone();
            let start = clock();
            let probe = {
                let cpu = cpu.clone();
                tokio::task::spawn_local(async move {
                    // The backlog a fifth and four fifths into the submissions (between two).
                    let span = every * jobs;
                    tokio::time::sleep(span / 5 + every / 2).await;
                    let early = cpu.backlog();
                    tokio::time::sleep(span * 3 / 5).await;
                    (early, cpu.backlog())
                })
            };
            let finished = submit(cpu.clone(), jobs, cost, every).await;
            let (early, late) = probe.await.expect("probe task");
            let finished = finished.iter().map(|at| *at - start).collect();
            seen.borrow_mut()
                .insert(name.to_string(), (finished, cpu.stats(), early, late));
            Ok(())
        });
    }
    assert!(
        lab.run(Duration::from_secs(9), |_| {}).unwrap(),
        "jobs unfinished"
    );
    let seen = seen.borrow();
    // 50 jobs of 2 ms at once: the k-th to finish took at least k × 2 ms, all 50 were queued.
    let (finished, stats, _, _) = &seen["burst"];
    let mut sorted = finished.clone();
    sorted.sort();
    for (k, at) in sorted.iter().enumerate() {
        assert!(
            *at >= Duration::from_millis(2) * (k as u32 + 1),
            "job {k} at {at:?}"
        );
    }
    assert_eq!(stats.jobs, 50);
    assert_eq!(stats.finished, 50);
    assert_eq!(stats.busy, Duration::from_millis(100));
    assert_eq!(stats.max_queued, 50);
    // 1 ms every 5 ms: no job waits, nothing queues.
    let (_, stats, early, late) = &seen["idle"];
    assert_eq!(stats.max_wait, Duration::ZERO);
    assert_eq!(stats.max_queued, 1);
    assert_eq!((*early, *late), (Duration::ZERO, Duration::ZERO));
    // 5 ms every 2 ms: the backlog grows as the submissions go on.
    let (finished, stats, early, late) = &seen["busy"];
    assert!(late > early, "backlog {early:?} then {late:?}");
    assert!(*early > Duration::ZERO);
    assert!(stats.max_queued > 100);
    assert!(finished.iter().max().unwrap() >= &Duration::from_millis(1000));
}

#[test]
fn flood_saturates_the_cpu_that_meshwire_leaves_idle() {
    let mut scenario = small_scenario();
    // An advert costs 4 ms, everything else nothing: flood's adverts alone exceed a CPU's time.
    scenario.cases[0]
        .params
        .insert("cpu_advert_ns".into(), toml::Value::Integer(4_000_000));
    let report = run_scenario(&scenario, 2, Mode::Virtual, |_, _| {}).unwrap();
    let busy = |policy| metric(&report, policy, "cpu_busy_ratio_max");
    assert!(busy("flood") > 0.9, "flood busy {}", busy("flood"));
    assert!(busy("meshwire") < 0.5, "meshwire busy {}", busy("meshwire"));
    let p99 = |policy| metric(&report, policy, "ingress_latency_ms_p99");
    assert!(p99("flood") > p99("meshwire"));
    let achieved = |policy| metric(&report, policy, "achieved_rps");
    assert!(achieved("flood") < achieved("meshwire"));
    // Without costs the model is off.
    let free = run_scenario(&small_scenario(), 2, Mode::Virtual, |_, _| {}).unwrap();
    assert_eq!(metric(&free, "flood", "cpu_busy_ratio_max"), 0.0);
}
