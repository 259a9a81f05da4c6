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
//! The harness is [`lab`] (hosts, faults, the run loop), [`link`] and [`socket`] (the emulated
//! network), [`placement`] (hosts in separate processes, and the logs hosts share), [`scenario`]
//! (scenario files and reports) and [`stats`] (percentiles, rounding). Every
//! experiment is one module under [`experiments`], registered in [`EXPERIMENTS`] under the
//! scenario `kind` that selects it, with its policies, workloads and typed parameters. Scenario
//! files (`scenarios/*.toml`, format in `docs/scenarios.md`) are checked against that table when
//! loaded; [`run_scenario`] runs one and returns its [`Report`].

pub mod experiments;
pub mod lab;
pub mod link;
pub mod placement;
pub mod scenario;
pub mod socket;
pub mod stats;

use std::time::Duration;

pub use experiments::{Experiment, RealSockets, Trial, EXPERIMENTS};
pub use lab::{HostContext, Lab, LabError, LabEvent};
pub use link::{LinkSpec, Rate};
pub use placement::{Placement, SharedLog};
pub use scenario::{CaseResult, MetricComparison, Report, ScenarioError, ScenarioFile};
pub use socket::{Carrier, LabSocket, Network, SocketStats};

/// How to run a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// turmoil, virtual time: deterministic for a seed.
    Virtual,
    /// Real UDP sockets on loopback, real time: a cross-check of the emulator. Numbers vary from
    /// run to run and with machine load.
    Realtime,
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
    for case in &scenario.cases {
        for policy in &policies {
            let label = format!("{} / {}", case.name, policy);
            let mut tick = |elapsed: Duration| progress(&label, elapsed);
            let trial = Trial {
                scenario: &scenario.name,
                case,
                seed,
                policy,
                mode,
                placement: None,
            };
            let metrics = (experiment.run)(&trial, &mut tick)?;
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
    let metrics = (experiment.run)(&trial, &mut |_| {})?;
    Ok((!metrics.is_empty()).then(|| CaseResult {
        case: case.name.clone(),
        policy: policy.to_string(),
        metrics,
    }))
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
