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
//! network), [`scenario`] (scenario files and reports) and [`stats`] (percentiles, rounding). Every
//! experiment is one module under [`experiments`], registered in [`EXPERIMENTS`] under the
//! scenario `kind` that selects it, with its policies, workloads and typed parameters. Scenario
//! files (`scenarios/*.toml`, format in `docs/scenarios.md`) are checked against that table when
//! loaded; [`run_scenario`] runs one and returns its [`Report`].

pub mod experiments;
pub mod lab;
pub mod link;
pub mod scenario;
pub mod socket;
pub mod stats;

use std::time::Duration;

pub use experiments::{Experiment, Trial, EXPERIMENTS};
pub use lab::{HostContext, Lab, LabError, LabEvent};
pub use link::{LinkSpec, Rate};
pub use scenario::{CaseResult, Report, ScenarioError, ScenarioFile};
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
/// and the lab time elapsed in it.
pub fn run_scenario(
    scenario: &ScenarioFile,
    seed: u64,
    mode: Mode,
    mut progress: impl FnMut(&str, Duration),
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
    for case in &scenario.cases {
        for policy in &scenario.policies {
            let label = format!("{} / {}", case.name, policy);
            let mut tick = |elapsed: Duration| progress(&label, elapsed);
            let trial = Trial {
                scenario: &scenario.name,
                case,
                seed,
                policy,
                mode,
            };
            let metrics = (experiment.run)(&trial, &mut tick)?;
            report.results.push(CaseResult {
                case: case.name.clone(),
                policy: policy.clone(),
                metrics,
            });
        }
    }
    Ok(report)
}
