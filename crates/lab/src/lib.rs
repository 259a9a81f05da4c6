//! Run the real meshwire stack over emulated WAN links in virtual time.
//!
//! The lab puts unmodified [`meshwire::Node`]s on turmoil hosts. Each node's QUIC endpoint runs on
//! a [`socket::LabSocket`], which adds what turmoil lacks — per-link serialization at a rate, bounded
//! drop-tail queues, i.i.d. loss, jitter, ECN — while turmoil provides latency, partitions and
//! crashes. The same socket runs over real UDP in real time for cross-checks. Scenario files
//! (`scenarios/*.toml`, format in `docs/scenarios.md`) describe experiments; [`run_scenario`] runs
//! one and returns its [`Report`].

pub mod calibration;
pub mod fanout;
pub mod gossip;
#[cfg(feature = "baselines")]
pub mod grpc_team;
pub mod lab;
pub mod link;
pub mod multipath;
pub mod scale;
pub mod scenario;
pub mod session;
pub mod socket;
pub mod xx_team;
pub mod zold;

use std::time::Duration;

pub use lab::{HostContext, Lab, LabError, LabEvent};
pub use link::{LinkSpec, Rate};
pub use scenario::{CaseResult, Report, ScenarioError, ScenarioFile};
pub use socket::{LabSocket, Network, SocketStats};

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
    let mut report = Report::new(scenario, seed);
    for case in &scenario.cases {
        for policy in &scenario.policies {
            let label = format!("{} / {}", case.name, policy);
            let mut tick = |elapsed: Duration| progress(&label, elapsed);
            let metrics = match (scenario.kind.as_str(), policy.as_str()) {
                ("calibration", "meshwire") => calibration::run_case(case, seed, mode, &mut tick)?,
                ("fanout", policy) if mode == Mode::Virtual => {
                    fanout::run_case(case, seed, policy, &mut tick)?
                }
                ("gossip", policy) if mode == Mode::Virtual => {
                    gossip::run_case(case, seed, policy, &mut tick)?
                }
                ("xx-team", policy) if mode == Mode::Virtual => {
                    xx_team::run_case(case, seed, policy, &mut tick)?
                }
                ("multipath", policy) if mode == Mode::Virtual => {
                    multipath::run_case(case, seed, policy, &mut tick)?
                }
                ("session", policy) if mode == Mode::Virtual => {
                    session::run_case(case, seed, policy)?
                }
                ("scale", "meshwire") if mode == Mode::Virtual => {
                    scale::run_case(case, seed, &mut tick)?
                }
                ("zold-fetch", policy) if mode == Mode::Virtual => {
                    zold::run_case(case, seed, policy, &mut tick)?
                }
                (kind, policy) => {
                    return Err(ScenarioError::Invalid {
                        path: scenario.name.clone(),
                        reason: format!(
                            "no runner for kind {kind:?} with policy {policy:?} in {mode:?} mode"
                        ),
                    })
                }
            };
            report.results.push(CaseResult {
                case: case.name.clone(),
                policy: policy.clone(),
                metrics,
            });
        }
    }
    Ok(report)
}
