//! Every experiment the lab runs, registered in one table under the scenario `kind` that selects it.
//!
//! A scenario file names a kind; [`EXPERIMENTS`] maps the kind to its runner, its policies, its
//! workloads and each workload's typed parameters. The scenario loader checks a file against the
//! table (kind, policies, workloads, params), [`crate::run_scenario`] runs cases through it, and
//! `meshwire lab list` prints it.

pub mod calibration;
pub mod fairness;
pub mod fanout;
pub mod gossip;
pub mod lab_cost;
pub mod multipath_quic;
pub mod multipath_raw;
pub mod quorum_reads;
pub mod ring_batches;

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::lab::Lab;
use crate::link::LinkSpec;
use crate::placement::Placement;
use crate::scenario::{CaseFile, ScenarioError};
use crate::stats::Metrics;
use crate::Mode;

/// One run of one case under one policy: what every runner gets.
#[derive(Debug, Clone, Copy)]
pub struct Trial<'a> {
    /// The scenario's name (for errors).
    pub scenario: &'a str,
    /// The case.
    pub case: &'a CaseFile,
    /// The run's seed.
    pub seed: u64,
    /// The policy under test.
    pub policy: &'a str,
    /// Virtual or real time.
    pub mode: Mode,
    /// In real time: when this process runs only one host of the case (`meshwire lab host`).
    pub placement: Option<&'a Placement>,
}

impl Trial<'_> {
    /// The case's parameters as `T` (see [`CaseFile::params`]).
    pub fn params<T: DeserializeOwned>(&self) -> Result<T, ScenarioError> {
        self.case.params().map_err(|error| ScenarioError::Params {
            path: self.scenario.to_string(),
            case: self.case.name.clone(),
            error: Box::new(error),
        })
    }

    /// The policy under test, parsed as the experiment's policy type `P`.
    pub fn policy<P>(&self) -> Result<P, ScenarioError>
    where
        P: std::str::FromStr,
        P::Err: std::fmt::Display,
    {
        self.policy
            .parse()
            .map_err(|error: P::Err| self.failed(error.to_string()))
    }

    /// The lab this trial runs in, its links following `default`: virtual time (limited to the
    /// case's duration and a second), real sockets on loopback, or this process's host of a
    /// placed case.
    pub fn lab(&self, default: LinkSpec) -> Lab {
        match (self.mode, self.placement) {
            (Mode::Virtual, _) => Lab::new(
                self.seed,
                default,
                self.case.duration() + Duration::from_secs(1),
            ),
            (Mode::Realtime, None) => Lab::realtime(self.seed, default),
            (Mode::Realtime, Some(placement)) => Lab::placed(self.seed, default, placement.clone()),
        }
    }

    /// A failure of this trial's case.
    pub fn failed(&self, reason: impl Into<String>) -> ScenarioError {
        ScenarioError::failed(self.case, reason)
    }
}

/// Runs one trial; `progress` hears the lab time elapsed.
pub type Runner = fn(&Trial<'_>, &mut dyn FnMut(Duration)) -> Result<Metrics, ScenarioError>;

/// One workload of an experiment: its name in scenario files and its parameters.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// The `workload` value that selects it.
    pub name: &'static str,
    /// What it does, in one line.
    pub description: &'static str,
    /// Checks a case's `params` against the workload's typed parameters.
    pub check: fn(&CaseFile) -> Result<(), toml::de::Error>,
}

impl Workload {
    /// A workload whose `params` deserialise into `P`.
    const fn with<P: DeserializeOwned>(name: &'static str, description: &'static str) -> Self {
        Self {
            name,
            description,
            check: check::<P>,
        }
    }
}

fn check<P: DeserializeOwned>(case: &CaseFile) -> Result<(), toml::de::Error> {
    case.params::<P>().map(drop)
}

/// One experiment: a scenario kind and everything needed to run it.
#[derive(Debug, Clone, Copy)]
pub struct Experiment {
    /// The `kind` value that selects it.
    pub kind: &'static str,
    /// What it measures, in one line.
    pub description: &'static str,
    /// The policies it compares.
    pub policies: &'static [&'static str],
    /// Its workloads.
    pub workloads: &'static [Workload],
    /// What of it also runs on real sockets in real time (`--realtime`, `meshwire lab host`).
    pub realtime: Option<RealSockets>,
    /// Its physical floors: which measured metric each bounds from below.
    pub floors: &'static [Floor],
    /// What a run must achieve to count in a sweep (everything delivered, every read at
    /// quorum); a run that misses one is reported as failed, whatever its ratios.
    pub requires: &'static [Require],
    /// Runs one case under one policy.
    pub run: Runner,
}

/// A physical floor: a metric no run can beat, emitted by the experiment's runner beside the
/// metric it bounds, computed from the case's links and parameters (each experiment documents
/// its floors next to the code that computes them). Both metrics are lower-is-better, so
/// `metric / floor` is at least 1; it is the ratio sweeps report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    /// The ratio's name in reports, e.g. `hop_p50`.
    pub name: &'static str,
    /// The measured metric.
    pub metric: &'static str,
    /// The metric that holds the floor for it.
    pub floor: &'static str,
    /// How far, in the metric's unit, a measurement may fall below the floor: the lab delivers
    /// on 1 ms ticks, so a time can come in a tick under its floor.
    pub tick: f64,
}

impl Floor {
    const fn new(name: &'static str, metric: &'static str, floor: &'static str, tick: f64) -> Self {
        Self {
            name,
            metric,
            floor,
            tick,
        }
    }

    /// `metric / floor` in `metrics`, when both are there and the floor is positive.
    pub fn ratio(&self, metrics: &Metrics) -> Option<f64> {
        let metric = metrics.get(self.metric).copied()?;
        let floor = metrics.get(self.floor).copied()?;
        (floor > 0.0 && metric.is_finite() && floor.is_finite()).then(|| metric / floor)
    }

    /// Whether `metrics` beat the floor by more than the tick (a floor or measurement bug).
    pub fn beaten(&self, metrics: &Metrics) -> bool {
        match (metrics.get(self.metric), metrics.get(self.floor)) {
            (Some(metric), Some(floor)) => *metric < *floor - self.tick,
            _ => false,
        }
    }
}

/// A metric a run must keep within bounds to count as complete.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Require {
    /// The metric.
    pub metric: &'static str,
    /// Its least acceptable value.
    pub min: f64,
    /// Its greatest acceptable value.
    pub max: f64,
}

impl Require {
    const fn at_least(metric: &'static str, min: f64) -> Self {
        Self {
            metric,
            min,
            max: f64::INFINITY,
        }
    }

    const fn at_most(metric: &'static str, max: f64) -> Self {
        Self {
            metric,
            min: f64::NEG_INFINITY,
            max,
        }
    }

    /// Why `metrics` miss this requirement, if they do (a missing metric misses it).
    pub fn missed(&self, metrics: &Metrics) -> Option<String> {
        match metrics.get(self.metric) {
            Some(value) if (self.min..=self.max).contains(value) => None,
            Some(value) if *value < self.min => Some(format!(
                "incomplete: {} = {value} (needs at least {})",
                self.metric, self.min
            )),
            Some(value) => Some(format!(
                "incomplete: {} = {value} (needs at most {})",
                self.metric, self.max
            )),
            None => Some(format!("incomplete: no {} reported", self.metric)),
        }
    }
}

/// A transfer's floor (raw multipath and the session over QUIC): the latency-aware ideal.
const TRANSFER_FLOORS: &[Floor] = &[Floor::new(
    "transfer",
    "transfer_s",
    "ideal_transfer_s",
    S_TICK,
)];
/// A transfer counts when every byte arrived.
const TRANSFER_REQUIRES: &[Require] = &[Require::at_least("complete", 1.0)];

/// A millisecond metric's tick.
const MS_TICK: f64 = 1.0;
/// A second metric's tick.
const S_TICK: f64 = 0.001;

impl Experiment {
    /// The workload called `name`.
    pub fn workload(&self, name: &str) -> Option<&'static Workload> {
        self.workloads.iter().find(|workload| workload.name == name)
    }

    /// Whether `policy` also runs on real sockets.
    pub fn runs_in_real_time(&self, policy: &str) -> bool {
        self.realtime
            .is_some_and(|real| real.policies.contains(&policy))
    }
}

/// The part of an experiment that also runs on real sockets.
#[derive(Debug, Clone, Copy)]
pub struct RealSockets {
    /// The policies that do (the others need virtual time, e.g. turmoil's TCP).
    pub policies: &'static [&'static str],
    /// A case's hosts by name, as `meshwire lab plan` lists them for scripts that give each its
    /// own process (`meshwire lab host`).
    pub hosts: fn(&CaseFile) -> Vec<String>,
}

/// Every experiment, by kind.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        kind: "calibration",
        description:
            "the emulator against theory: round trip, bulk goodput, packet rate, loss, partition",
        policies: &["meshwire"],
        workloads: &[
            Workload::with::<calibration::RttParams>("rtt", "echo requests on a warm connection"),
            Workload::with::<calibration::BulkParams>("bulk", "1 MiB messages a to b"),
            Workload::with::<calibration::PpsParams>(
                "pps",
                "raw datagrams above a packet-rate link",
            ),
            Workload::with::<calibration::LossParams>("loss", "raw datagrams over a lossy link"),
            Workload::with::<calibration::PartitionParams>(
                "partition",
                "messages across a link cut and repaired",
            ),
        ],
        realtime: Some(RealSockets {
            policies: &["meshwire"],
            hosts: calibration::hosts,
        }),
        floors: &[],
        requires: &[],
        run: calibration::run,
    },
    Experiment {
        kind: "fairness",
        description: "two meshwire flows through one bottleneck: their shares and its use",
        policies: &["meshwire"],
        workloads: &[Workload::with::<fairness::Params>(
            "shared-bottleneck",
            "1 MiB messages from a1 and a2 to c through c's downlink",
        )],
        realtime: None,
        floors: &[],
        requires: &[],
        run: fairness::run,
    },
    Experiment {
        kind: "fanout",
        description: "one message to many peers: encode once vs once per destination",
        policies: &["meshwire", "naive"],
        workloads: &[Workload::with::<fanout::Params>(
            "fanout",
            "one message from a sender to every receiver",
        )],
        realtime: None,
        floors: &[
            Floor::new("heap", "sender_heap_peak_bytes", "heap_floor_bytes", 0.0),
            Floor::new(
                "completion",
                "completion_ms",
                "completion_floor_ms",
                MS_TICK,
            ),
        ],
        requires: &[Require::at_least("delivered_ratio", 1.0)],
        run: fanout::run,
    },
    Experiment {
        kind: "gossip",
        description:
            "an Internet Computer subnet's gossip: adverts, bytes, ingress latency, delivery",
        policies: &["flood", "ic-origin", "meshwire"],
        workloads: &[Workload::with::<gossip::Params>(
            "ic-subnet",
            "ingress, blocks and shares in a full mesh",
        )],
        realtime: None,
        floors: &[Floor::new(
            "bytes",
            "received_bytes_per_node",
            "distinct_bytes_per_node",
            0.0,
        )],
        requires: &[Require::at_least("consensus_delivery_ratio", 1.0)],
        run: gossip::run,
    },
    Experiment {
        kind: "multipath",
        description: "the sans-IO session striped over raw UDP paths: goodput and convergence",
        policies: &["classic", "nkp24", "meshwire"],
        workloads: &[
            Workload {
                name: "transfer",
                description: "send `mib` MiB, measure goodput",
                check: multipath_raw::check,
            },
            Workload {
                name: "converge",
                description: "send without end, measure when in-flight shares settle",
                check: multipath_raw::check,
            },
        ],
        realtime: None,
        floors: TRANSFER_FLOORS,
        requires: TRANSFER_REQUIRES,
        run: multipath_raw::run,
    },
    Experiment {
        kind: "session",
        description: "the session over QUIC datagrams: a direct path and relay paths",
        policies: &["classic", "nkp24", "meshwire"],
        workloads: &[Workload::with::<multipath_quic::Params>(
            "transfer",
            "send `mib` MiB from a to b",
        )],
        realtime: None,
        floors: TRANSFER_FLOORS,
        requires: TRANSFER_REQUIRES,
        run: multipath_quic::run,
    },
    Experiment {
        kind: "scale",
        description: "what the lab costs: a full mesh exchanging small requests",
        policies: &["meshwire"],
        workloads: &[Workload::with::<lab_cost::Params>(
            "mesh-requests",
            "echo requests to random peers",
        )],
        realtime: None,
        floors: &[],
        requires: &[],
        run: lab_cost::run,
    },
    Experiment {
        kind: "xx-team",
        description: "batches round a ring of computing nodes: one at a time, pipelined, gRPC",
        policies: &[
            "grpc-unary-64k",
            "grpc-stream",
            "meshwire",
            "meshwire-pipelined",
        ],
        workloads: &[Workload::with::<ring_batches::Params>(
            "ring",
            "hop transfer, ring ping and batches round the ring",
        )],
        realtime: Some(RealSockets {
            policies: &["meshwire", "meshwire-pipelined"],
            hosts: ring_batches::hosts,
        }),
        floors: &[
            Floor::new("hop_p50", "hop_transfer_ms_p50", "hop_floor_ms", MS_TICK),
            Floor::new("hop_p99", "hop_transfer_ms_p99", "hop_floor_ms", MS_TICK),
        ],
        requires: &[Require::at_most("batches_failed", 0.0)],
        run: ring_batches::run,
    },
    Experiment {
        kind: "zold-fetch",
        description: "quorum reads over replicas, some slow and one dead",
        policies: &["sequential", "parallel-all", "hedged"],
        workloads: &[Workload::with::<quorum_reads::Params>(
            "quorum-reads",
            "reads at a fixed rate, each at quorum",
        )],
        realtime: None,
        floors: &[
            // A round trip crosses the lab's 1 ms ticks twice.
            Floor::new("p99", "fetch_ms_p99", "ideal_ms_p99", 2.0 * MS_TICK),
            Floor::new("requests", "requests_per_read", "requests_floor", 0.0),
        ],
        requires: &[Require::at_least("quorum_ratio", 1.0)],
        run: quorum_reads::run,
    },
];

/// The experiment of scenario kind `kind`.
pub fn find(kind: &str) -> Option<&'static Experiment> {
    EXPERIMENTS
        .iter()
        .find(|experiment| experiment.kind == kind)
}

/// Every kind, in table order.
pub fn kinds() -> Vec<&'static str> {
    EXPERIMENTS
        .iter()
        .map(|experiment| experiment.kind)
        .collect()
}

/// A congestion controller as scenario params name it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CongestionParam {
    /// CUBIC, quinn's default.
    Cubic,
    /// BBR.
    Bbr,
    /// NewReno (also spelt `new-reno`).
    #[serde(alias = "new-reno")]
    NewReno,
    /// meshwire's loss-discriminating CUBIC (`meshwire::congestion`), the node's default.
    #[default]
    Meshwire,
}

impl From<CongestionParam> for meshwire::Congestion {
    fn from(param: CongestionParam) -> Self {
        match param {
            CongestionParam::Cubic => Self::Cubic,
            CongestionParam::Bbr => Self::Bbr,
            CongestionParam::NewReno => Self::NewReno,
            CongestionParam::Meshwire => Self::Meshwire,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::scenario::ScenarioFile;

    fn scenario(kind: &str, policy: &str, workload: &str, params: &str) -> String {
        format!(
            r#"
name = "t"
description = "d"
kind = "{kind}"
seed = 1
policies = ["{policy}"]
[[case]]
name = "c"
workload = "{workload}"
duration_s = 1
link = {{ latency_ms = 10 }}
params = {params}
"#
        )
    }

    fn error(text: &str) -> String {
        ScenarioFile::parse(text, "inline").unwrap_err().to_string()
    }

    /// The parameter names a workload accepts, as the params error lists them.
    fn fields(workload: &Workload) -> Vec<String> {
        let case: CaseFile = toml::from_str(
            r#"
name = "c"
workload = "w"
duration_s = 1
link = { latency_ms = 10 }
params = { not_a_parameter = 0 }
"#,
        )
        .unwrap();
        let message = (workload.check)(&case).unwrap_err().to_string();
        let expected = message
            .split("expected")
            .nth(1)
            .unwrap_or_else(|| panic!("{}: {message}", workload.name));
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_misspelt_parameter_is_refused_naming_it_and_the_valid_ones() {
        let message = error(&scenario(
            "calibration",
            "meshwire",
            "rtt",
            "{ requsts = 21 }",
        ));
        assert!(message.contains("requsts"), "{message}");
        assert!(message.contains("`requests`"), "{message}");
        let message = error(&scenario(
            "calibration",
            "meshwire",
            "bulk",
            "{ mebibyte = 2 }",
        ));
        assert!(message.contains("mebibyte"), "{message}");
        for field in [
            "mebibytes",
            "warmup_mebibytes",
            "stream_window_bytes",
            "congestion",
        ] {
            assert!(message.contains(&format!("`{field}`")), "{message}");
        }
        let message = error(&scenario("xx-team", "meshwire", "ring", "{ node = 3 }"));
        assert!(
            message.contains("node") && message.contains("`nodes`"),
            "{message}"
        );
    }

    #[test]
    fn a_wrong_type_or_value_is_refused() {
        let message = error(&scenario("fanout", "naive", "fanout", "{ peers = -1 }"));
        assert!(
            message.contains("-1") && message.contains("u64"),
            "{message}"
        );
        let message = error(&scenario(
            "session",
            "meshwire",
            "transfer",
            r#"{ direct = { latency_ms = 5 }, congestion = "vegas" }"#,
        ));
        assert!(
            message.contains("vegas") && message.contains("`bbr`"),
            "{message}"
        );
        let message = error(&scenario(
            "multipath",
            "meshwire",
            "converge",
            "{ mib = 8, paths = [{ latency_ms = 5, rate_packets_per_s = 10 }] }",
        ));
        assert!(
            message.contains("mib applies to workload transfer"),
            "{message}"
        );
    }

    #[test]
    fn unknown_kinds_workloads_and_policies_are_refused_naming_the_valid_ones() {
        let message = error(&scenario("calibrate", "meshwire", "rtt", "{}"));
        assert!(
            message.contains("calibrate") && message.contains("zold-fetch"),
            "{message}"
        );
        let message = error(&scenario("calibration", "meshwire", "ping", "{}"));
        assert!(
            message.contains("ping") && message.contains("partition"),
            "{message}"
        );
        let message = error(&scenario("zold-fetch", "random", "quorum-reads", "{}"));
        assert!(
            message.contains("random") && message.contains("hedged"),
            "{message}"
        );
    }

    #[test]
    fn the_table_has_one_entry_per_kind_and_per_workload() {
        let mut kinds = kinds();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), EXPERIMENTS.len());
        for experiment in EXPERIMENTS {
            let mut names: Vec<_> = experiment.workloads.iter().map(|w| w.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(
                names.len(),
                experiment.workloads.len(),
                "{}",
                experiment.kind
            );
            assert_eq!(find(experiment.kind).map(|e| e.kind), Some(experiment.kind));
        }
    }

    #[test]
    fn every_scenario_file_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut loaded = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "toml") {
                ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
                loaded += 1;
            }
        }
        assert!(loaded >= EXPERIMENTS.len(), "only {loaded} scenario files");
    }

    /// docs/scenarios.md has a section per kind that names its policies, workloads and every
    /// parameter of every workload.
    #[test]
    fn the_scenario_docs_cover_every_kind_workload_and_parameter() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scenarios.md");
        let docs = std::fs::read_to_string(path).unwrap();
        for experiment in EXPERIMENTS {
            let heading = format!("### `{}`", experiment.kind);
            let start = docs
                .find(&heading)
                .unwrap_or_else(|| panic!("no section {heading}"));
            let section = &docs[start + heading.len()..];
            let section = &section[..section.find("\n### ").unwrap_or(section.len())];
            let mentioned = |name: &str| section.contains(&format!("`{name}`"));
            for policy in experiment.policies {
                assert!(mentioned(policy), "{}: policy {policy}", experiment.kind);
            }
            for workload in experiment.workloads {
                assert!(
                    mentioned(workload.name),
                    "{}: workload {}",
                    experiment.kind,
                    workload.name
                );
                for field in fields(workload) {
                    assert!(
                        mentioned(&field),
                        "{}/{}: param {field}",
                        experiment.kind,
                        workload.name
                    );
                }
            }
        }
    }
}
