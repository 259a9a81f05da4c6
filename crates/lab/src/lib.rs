//! Run the real meshwire stack over emulated WAN links in virtual time.
//!
//! The lab puts unmodified [`meshwire::Node`]s on turmoil hosts. Each node's QUIC endpoint runs on
//! a [`socket::LabSocket`], which adds what turmoil lacks — per-link serialization at a rate, bounded
//! drop-tail queues, i.i.d. loss, jitter, ECN — while turmoil provides latency, partitions and
//! crashes. The same socket runs over real UDP in real time for cross-checks ([`Mode::Realtime`]):
//! there the sending socket emulates each link's egress (rate, queue) and the receiving socket its
//! path (delay, jitter, loss), on loopback addresses, every host on one thread.
//!
//! The harness is [`lab`] (hosts, faults, the run loop), [`link`] and [`socket`] (the emulated
//! network), [`tcp_link`] (the same links' serialization for turmoil TCP), [`scenario`] (scenario
//! files and reports) and [`stats`] (percentiles, rounding). Every
//! experiment is one module under [`experiments`], registered in [`EXPERIMENTS`] under the
//! scenario `kind` that selects it, with its policies, workloads and typed parameters. Scenario
//! files (`scenarios/*.toml`, format in `docs/scenarios.md`) are checked against that table when
//! loaded; [`run_scenario`] runs one and returns its [`Report`], where every metric an
//! experiment bounds by a physical floor ([`experiments::Floor`]) also has its ratio to that floor,
//! `<floor>_over_floor`. [`sweep`] runs an experiment over randomly drawn cases and reports those
//! ratios' distributions.
//! [`plot`] draws reports as SVG charts (`meshwire lab plot`).

pub mod experiments;
pub mod lab;
pub mod link;
pub mod plot;
pub mod scenario;
pub mod socket;
pub mod stats;
pub mod sweep;
pub mod tcp_link;

use std::time::Duration;

pub use experiments::{Experiment, Trial, EXPERIMENTS};
pub use lab::{HostContext, Lab, LabError, LabEvent};
pub use link::{LinkSpec, Rate};
pub use scenario::{CaseResult, Report, ScenarioError, ScenarioFile};
pub use socket::{Carrier, LabSocket, Network, SocketStats};
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
/// and the lab time elapsed in it.
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
    let experiment = experiments::find(&scenario.kind).ok_or_else(|| ScenarioError::Invalid {
        path: scenario.name.clone(),
        reason: format!(
            "unknown kind {:?}; the kinds are {}",
            scenario.kind,
            experiments::kinds().join(", ")
        ),
    })?;
    if mode == Mode::Realtime && !experiment.realtime {
        return Err(ScenarioError::Invalid {
            path: scenario.name.clone(),
            reason: format!("kind {} runs in virtual time only", experiment.kind),
        });
    }
    let mut report = Report::new(scenario, seed);
    let total = scenario.cases.len() * scenario.policies.len();
    for case in &scenario.cases {
        for policy in &scenario.policies {
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
            };
            let mut metrics = (experiment.run)(&trial, &mut tick)?;
            for floor in experiment.floors {
                if let Some(ratio) = floor.ratio(&metrics) {
                    metrics.insert(
                        format!("{}_over_floor", floor.name),
                        stats::round_metric(ratio),
                    );
                }
            }
            report.results.push(CaseResult {
                case: case.name.clone(),
                policy: policy.clone(),
                metrics,
            });
        }
    }
    Ok(report)
}
