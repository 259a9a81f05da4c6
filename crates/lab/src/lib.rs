//! Run the real meshwire stack over emulated WAN links in virtual time.
//!
//! The lab puts unmodified [`meshwire::Node`]s on turmoil hosts. Each node's QUIC endpoint runs on
//! a [`socket::LabSocket`], which adds what turmoil lacks — per-link serialization at a rate, bounded
//! drop-tail queues, i.i.d. loss, jitter, ECN — while turmoil provides latency, partitions and
//! crashes. The same socket runs over real UDP in real time for cross-checks ([`Mode::Realtime`]):
//! there the sending socket emulates each link's egress (rate, queue) and the receiving socket its
//! path (delay, jitter, loss), on loopback addresses, every host on one thread. A real-time case
//! can also run one host per process ([`placement`], [`run_host`], `meshwire lab host`):
//! `scripts/netns-lab.sh` puts each host in its own network namespace, lets the kernel serialize
//! the links (`tc tbf`) while the receiving sockets add delay, jitter and loss
//! ([`socket::Carrier::KernelRate`]), and compares the metrics with virtual time.
//!
//! The harness is [`lab`] (hosts, faults, the run loop), [`cpu`] (each host's one CPU, on which
//! gossip items cost measured time), [`link`] and [`socket`] (the emulated network), [`tcp_link`] (the same links' serialization for turmoil TCP), [`placement`] (hosts
//! in separate processes, and the logs hosts share), [`scenario`] (scenario files and reports)
//! and [`stats`] (percentiles, rounding). Every
//! experiment is one module under [`experiments`], registered in [`EXPERIMENTS`] under the
//! scenario `kind` that selects it, with its policies, workloads and typed parameters. Scenario
//! files (`scenarios/*.toml`, format in `docs/scenarios.md`) are checked against that table when
//! loaded; [`run_scenario`] runs one and returns its [`Report`], where every metric an
//! experiment bounds by a physical floor ([`experiments::Floor`]) also has its ratio to that floor,
//! `<floor>_over_floor`. [`sweep`] runs an experiment over randomly drawn cases and reports those
//! ratios' distributions.
//! [`plot`] draws reports as SVG charts (`meshwire lab plot`).

pub mod cpu;
pub mod experiments;
pub mod history;
pub mod lab;
pub mod link;
pub mod placement;
pub mod plot;
pub mod scenario;
pub mod socket;
pub mod stats;
pub mod sweep;
pub mod tcp_link;

use std::time::Duration;

pub use cpu::{Cpu, CpuStats, GossipCpu, ItemCosts};
pub use experiments::{Experiment, RealSockets, Trial, EXPERIMENTS};
pub use lab::{HostContext, Lab, LabError, LabEvent};
pub use link::{LinkSpec, Rate};
pub use placement::{Placement, SharedLog};
pub use scenario::{CaseResult, MetricComparison, Report, ScenarioError, ScenarioFile};
pub use socket::{Carrier, DownlinkStats, LabSocket, Network, SocketStats};
pub use sweep::{Sweep, SweepError, SweepReport};

/// How to run a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// turmoil, virtual time: deterministic for a seed.
    Virtual,
    /// Real UDP sockets on loopback, real time: a cross-check of the emulator. Numbers vary from
    /// run to run and with machine load.
    Realtime,
}

/// What [`run_scenario_observed`] reports as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunEvent<'a> {
    /// Trial `index` (0-based, of `total` = cases × policies, the cases in file order and each
    /// under every policy in turn) starts; the trials before it are done.
    Trial {
        /// Its position.
        index: usize,
        /// How many trials the scenario has.
        total: usize,
        /// "case / policy".
        label: &'a str,
    },
    /// The lab time elapsed in the current trial, about every 100 ms of it (experiments that run
    /// no lab report none).
    Elapsed(Duration),
}

/// Runs every case of `scenario` under every policy with `seed`. `progress` hears the case name
/// and the lab time elapsed in it. In real time only the policies that run on real sockets run
/// ([`Experiment::runs_in_real_time`]); the report leaves the others out.
pub fn run_scenario(
    scenario: &ScenarioFile,
    seed: u64,
    mode: Mode,
    mut progress: impl FnMut(&str, Duration),
) -> Result<Report, ScenarioError> {
    let mut current = String::new();
    run_scenario_observed(scenario, seed, mode, |event| match event {
        RunEvent::Trial { label, .. } => current = label.to_string(),
        RunEvent::Elapsed(elapsed) => progress(&current, elapsed),
    })
}

/// [`run_scenario`], telling `observe` when each trial starts and how far its lab has run.
pub fn run_scenario_observed(
    scenario: &ScenarioFile,
    seed: u64,
    mode: Mode,
    mut observe: impl FnMut(RunEvent<'_>),
) -> Result<Report, ScenarioError> {
    let experiment = find_experiment(scenario)?;
    let policies: Vec<&String> = scenario
        .policies
        .iter()
        .filter(|policy| mode == Mode::Virtual || experiment.runs_in_real_time(policy))
        .collect();
    if policies.is_empty() {
        return Err(ScenarioError::Invalid {
            path: scenario.name.clone(),
            reason: format!(
                "kind {} runs {} in virtual time only",
                experiment.kind,
                scenario.policies.join(", ")
            ),
        });
    }
    let mut report = Report::new(scenario, seed);
    let total = scenario.cases.len() * policies.len();
    for case in &scenario.cases {
        for policy in &policies {
            let label = format!("{} / {}", case.name, policy);
            observe(RunEvent::Trial {
                index: report.results.len(),
                total,
                label: &label,
            });
            let mut tick = |elapsed: Duration| observe(RunEvent::Elapsed(elapsed));
            let trial = Trial {
                scenario: &scenario.name,
                case,
                seed,
                policy,
                mode,
                placement: None,
            };
            let mut metrics = (experiment.run)(&trial, &mut tick)?;
            add_floor_ratios(experiment, &mut metrics);
            report.results.push(CaseResult {
                case: case.name.clone(),
                policy: policy.to_string(),
                metrics,
            });
        }
    }
    Ok(report)
}

/// Runs this process's host of case `case` under `policy` (see [`placement`]): on real sockets,
/// the other hosts in their own processes. Returns the case's result when this process ran the
/// client that measures it, `None` for a host that only serves.
pub fn run_host(
    scenario: &ScenarioFile,
    seed: u64,
    case: &str,
    policy: &str,
    placement: &Placement,
) -> Result<Option<CaseResult>, ScenarioError> {
    let experiment = find_experiment(scenario)?;
    let invalid = |reason: String| ScenarioError::Invalid {
        path: scenario.name.clone(),
        reason,
    };
    let case = scenario
        .cases
        .iter()
        .find(|candidate| candidate.name == case)
        .ok_or_else(|| invalid(format!("no case {case:?}")))?;
    if !scenario
        .policies
        .iter()
        .any(|candidate| candidate == policy)
    {
        return Err(invalid(format!("no policy {policy:?}")));
    }
    if !experiment.runs_in_real_time(policy) {
        return Err(invalid(format!(
            "kind {} runs policy {policy} in virtual time only",
            experiment.kind
        )));
    }
    let trial = Trial {
        scenario: &scenario.name,
        case,
        seed,
        policy,
        mode: Mode::Realtime,
        placement: Some(placement),
    };
    let mut metrics = (experiment.run)(&trial, &mut |_| {})?;
    add_floor_ratios(experiment, &mut metrics);
    Ok((!metrics.is_empty()).then(|| CaseResult {
        case: case.name.clone(),
        policy: policy.to_string(),
        metrics,
    }))
}

/// Adds `<floor>_over_floor` for each of the experiment's floors that `metrics` has both sides of.
fn add_floor_ratios(experiment: &Experiment, metrics: &mut stats::Metrics) {
    for floor in experiment.floors {
        if let Some(ratio) = floor.ratio(metrics) {
            metrics.insert(
                format!("{}_over_floor", floor.name),
                stats::round_metric(ratio),
            );
        }
    }
}

fn find_experiment(scenario: &ScenarioFile) -> Result<&'static Experiment, ScenarioError> {
    experiments::find(&scenario.kind).ok_or_else(|| ScenarioError::Invalid {
        path: scenario.name.clone(),
        reason: format!(
            "unknown kind {:?}; the kinds are {}",
            scenario.kind,
            experiments::kinds().join(", ")
        ),
    })
}
