//! Read scenario files and turn runs into the report every scenario prints: a table or one JSON object.
//!
//! The file format is documented in `docs/scenarios.md`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::experiments;
use crate::link::{LinkSpec, Rate};

/// Why a scenario could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not have a scenario's fields.
    #[error("scenario {path} is invalid: {}", error.to_string().trim_end())]
    Syntax {
        /// The file.
        path: String,
        /// What the TOML reader said (in the message, so it is not also a separate cause).
        error: Box<toml::de::Error>,
    },
    /// A case's `params` do not fit its experiment's parameters (a misspelt or unknown key, a
    /// wrong type).
    #[error("scenario {path}, case {case}: params: {}", error.to_string().trim_end())]
    Params {
        /// The file.
        path: String,
        /// The case.
        case: String,
        /// What the TOML reader said, naming the key and the valid ones (in the message, so
        /// it is not also a separate cause).
        error: Box<toml::de::Error>,
    },
    /// The file is not a valid scenario.
    #[error("scenario {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A case's lab could not be built or run.
    #[error("case {case}: the lab failed")]
    Lab {
        /// The case.
        case: String,
        /// What the lab said.
        source: crate::lab::LabError,
    },
    /// The scenario ran but an experiment failed.
    #[error("case {case}: {reason}")]
    Failed {
        /// The case.
        case: String,
        /// What went wrong.
        reason: String,
    },
}

impl ScenarioError {
    /// A failure of `case`'s lab.
    pub fn lab(case: &CaseFile, source: crate::lab::LabError) -> Self {
        Self::Lab {
            case: case.name.clone(),
            source,
        }
    }

    /// A failure of `case`'s experiment.
    pub fn failed(case: &CaseFile, reason: impl Into<String>) -> Self {
        Self::Failed {
            case: case.name.clone(),
            reason: reason.into(),
        }
    }
}

/// Runs `lab` for `case`'s duration; a lab error, or clients still running at the end, fail the case.
pub fn run_case_to_end(
    lab: &mut crate::lab::Lab,
    case: &CaseFile,
    progress: impl FnMut(Duration),
) -> Result<(), ScenarioError> {
    let finished = lab
        .run(case.duration(), progress)
        .map_err(|error| ScenarioError::lab(case, error))?;
    if !finished {
        return Err(ScenarioError::failed(
            case,
            format!(
                "the run did not finish within {} s of virtual time",
                case.duration_s
            ),
        ));
    }
    Ok(())
}

/// A link as scenario files write it.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    /// One-way latency in milliseconds.
    pub latency_ms: u64,
    /// Bit rate in Mbit/s (exclusive with `rate_packets_per_s`); neither means unlimited.
    pub rate_mbit_per_s: Option<f64>,
    /// Packet rate (exclusive with `rate_mbit_per_s`).
    pub rate_packets_per_s: Option<u64>,
    /// Egress queue in bytes; default one round-trip bandwidth-delay product, at least 64 KiB.
    pub queue_bytes: Option<usize>,
    /// i.i.d. loss probability.
    #[serde(default)]
    pub loss: f64,
    /// Maximum extra delay per datagram in milliseconds.
    #[serde(default)]
    pub jitter_ms: u64,
}

impl LinkFile {
    /// The emulator's spec for this link.
    pub fn spec(&self) -> Result<LinkSpec, String> {
        let latency = Duration::from_millis(self.latency_ms);
        let rate = match (self.rate_mbit_per_s, self.rate_packets_per_s) {
            (Some(_), Some(_)) => {
                return Err("give rate_mbit_per_s or rate_packets_per_s, not both".into())
            }
            (Some(mbit), None) if mbit > 0.0 => Rate::BitsPerSec((mbit * 1e6) as u64),
            (None, Some(packets)) if packets > 0 => Rate::PacketsPerSec(packets),
            (None, None) => Rate::Unlimited,
            (Some(mbit), None) => return Err(format!("rate_mbit_per_s {mbit} is not positive")),
            (None, Some(_)) => return Err("rate_packets_per_s 0 is not positive".into()),
        };
        if !(0.0..1.0).contains(&self.loss) {
            return Err(format!("loss {} is not in [0, 1)", self.loss));
        }
        if !(self.latency_ms < 3_600_000 && self.jitter_ms < 3_600_000) {
            return Err("latency_ms and jitter_ms must be under an hour".into());
        }
        let bytes_per_rtt = match rate {
            Rate::BitsPerSec(bits) => {
                (u128::from(bits) * latency.as_micros() * 2 / 8_000_000) as usize
            }
            Rate::PacketsPerSec(packets) => {
                (u128::from(packets) * 1500 * latency.as_micros() * 2 / 1_000_000) as usize
            }
            Rate::Unlimited => 0,
        };
        Ok(LinkSpec {
            latency,
            rate,
            queue_bytes: self.queue_bytes.unwrap_or(bytes_per_rtt.max(64 * 1024)),
            loss: self.loss,
            jitter: Duration::from_millis(self.jitter_ms),
        })
    }
}

/// One case of a scenario: an experiment with its link and parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseFile {
    /// The case's name (a metric row label).
    pub name: String,
    /// Which experiment runs (the scenario kind defines the choices).
    pub workload: String,
    /// The link between the hosts, both directions.
    pub link: LinkFile,
    /// Virtual time limit in seconds.
    pub duration_s: f64,
    /// Experiment parameters.
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
}

impl CaseFile {
    /// The case's `params` as the experiment's typed parameters: absent keys take their
    /// defaults, unknown keys and wrong types are errors naming the key and the valid ones.
    pub fn params<T: DeserializeOwned>(&self) -> Result<T, toml::de::Error> {
        let table: toml::Table = self
            .params
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        toml::Value::Table(table).try_into()
    }

    /// The virtual time limit.
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_s.max(0.0))
    }
}

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Short name, printed in reports.
    pub name: String,
    /// One line saying what the scenario shows.
    pub description: String,
    /// Which runner executes it.
    pub kind: String,
    /// Default seed (`--seed` overrides).
    pub seed: u64,
    /// Policies compared side by side.
    pub policies: Vec<String>,
    /// The experiments.
    #[serde(rename = "case")]
    pub cases: Vec<CaseFile>,
    /// Published or theoretical figures printed beside the results.
    #[serde(default)]
    pub anchors: BTreeMap<String, toml::Value>,
}

impl ScenarioFile {
    /// Reads and checks a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: display.clone(),
            source,
        })?;
        Self::parse(&text, &display)
    }

    /// Parses scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        let invalid = |reason: String| ScenarioError::Invalid {
            path: origin.to_string(),
            reason,
        };
        let scenario: Self = toml::from_str(text).map_err(|error| ScenarioError::Syntax {
            path: origin.to_string(),
            error: Box::new(error),
        })?;
        if scenario.cases.is_empty() {
            return Err(invalid("a scenario needs at least one [[case]]".into()));
        }
        if scenario.policies.is_empty() {
            return Err(invalid("a scenario needs at least one policy".into()));
        }
        let experiment = experiments::find(&scenario.kind).ok_or_else(|| {
            invalid(format!(
                "unknown kind {:?}; the kinds are {}",
                scenario.kind,
                experiments::kinds().join(", ")
            ))
        })?;
        for policy in &scenario.policies {
            if !experiment.policies.contains(&policy.as_str()) {
                return Err(invalid(format!(
                    "kind {} has no policy {policy:?}; its policies are {}",
                    experiment.kind,
                    experiment.policies.join(", ")
                )));
            }
        }
        for case in &scenario.cases {
            case.link
                .spec()
                .map_err(|reason| invalid(format!("case {}: {reason}", case.name)))?;
            let workload = experiment.workload(&case.workload).ok_or_else(|| {
                invalid(format!(
                    "case {}: kind {} has no workload {:?}; its workloads are {}",
                    case.name,
                    experiment.kind,
                    case.workload,
                    experiment
                        .workloads
                        .iter()
                        .map(|workload| workload.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            (workload.check)(case).map_err(|error| ScenarioError::Params {
                path: origin.to_string(),
                case: case.name.clone(),
                error: Box::new(error),
            })?;
        }
        Ok(scenario)
    }
}

/// One case's measurements under one policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case.
    pub case: String,
    /// The policy.
    pub policy: String,
    /// Metric name to value (JSON writes a value that is not a number, such as a reconnect that
    /// never happened, as `null`; it reads back as NaN).
    #[serde(deserialize_with = "metrics_from_json")]
    pub metrics: BTreeMap<String, f64>,
}

impl CaseResult {
    /// The result as one line of JSON (what `meshwire lab host` prints).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }
}

fn metrics_from_json<'de, D>(deserializer: D) -> Result<BTreeMap<String, f64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let metrics: BTreeMap<String, Option<f64>> = Deserialize::deserialize(deserializer)?;
    Ok(metrics
        .into_iter()
        .map(|(name, value)| (name, value.unwrap_or(f64::NAN)))
        .collect())
}

/// What `meshwire lab run --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// The seed used.
    pub seed: u64,
    /// Every case under every policy.
    pub results: Vec<CaseResult>,
    /// Published or theoretical figures.
    pub anchors: BTreeMap<String, serde_json::Value>,
}

impl Report {
    /// The metric `name` that `policy` produced in the first case that has it.
    pub fn metric(&self, policy: &str, name: &str) -> Option<f64> {
        self.results
            .iter()
            .filter(|result| result.policy == policy)
            .find_map(|result| result.metrics.get(name).copied())
    }

    /// A report with the scenario's anchors and no results yet.
    pub fn new(scenario: &ScenarioFile, seed: u64) -> Self {
        let anchors = scenario
            .anchors
            .iter()
            .map(|(key, value)| (key.clone(), toml_to_json(value)))
            .collect();
        Self {
            scenario: scenario.name.clone(),
            seed,
            results: Vec::new(),
            anchors,
        }
    }

    /// Reads a report as [`Report::to_json`] writes it.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Every metric of either report beside the same metric of the other, in this report's order
    /// and then the other's rows this one lacks.
    pub fn compare(&self, other: &Report) -> Vec<MetricComparison> {
        let mut rows: Vec<MetricComparison> = Vec::new();
        let mut add = |result: &CaseResult, from_base: bool| {
            for (metric, value) in &result.metrics {
                let position = rows.iter().position(|row| {
                    row.case == result.case && row.policy == result.policy && row.metric == *metric
                });
                let index = position.unwrap_or_else(|| {
                    rows.push(MetricComparison {
                        case: result.case.clone(),
                        policy: result.policy.clone(),
                        metric: metric.clone(),
                        base: None,
                        other: None,
                    });
                    rows.len() - 1
                });
                if from_base {
                    rows[index].base = Some(*value);
                } else {
                    rows[index].other = Some(*value);
                }
            }
        };
        for result in &self.results {
            add(result, true);
        }
        for result in &other.results {
            add(result, false);
        }
        rows
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }

    /// The report as a plain-text table (also valid Markdown).
    pub fn to_table(&self) -> String {
        let mut out = format!("scenario `{}` (seed {})\n\n", self.scenario, self.seed);
        out.push_str("| case | policy | metric | value |\n|---|---|---|---|\n");
        for result in &self.results {
            for (metric, value) in &result.metrics {
                out.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    result.case,
                    result.policy,
                    metric,
                    format_number(*value)
                ));
            }
        }
        if !self.anchors.is_empty() {
            out.push_str("\n| anchor | value |\n|---|---|\n");
            for (name, value) in &self.anchors {
                out.push_str(&format!("| {name} | {value} |\n"));
            }
        }
        out
    }
}

/// One metric of two reports side by side ([`Report::compare`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricComparison {
    /// The case.
    pub case: String,
    /// The policy.
    pub policy: String,
    /// The metric.
    pub metric: String,
    /// Its value in the first report, if it has the row.
    pub base: Option<f64>,
    /// Its value in the second report, if it has the row.
    pub other: Option<f64>,
}

impl MetricComparison {
    /// `other / base`: 1 when the two are equal (two zeros, or two NaNs: a thing that happened in
    /// neither run), `None` when a report lacks the row.
    pub fn ratio(&self) -> Option<f64> {
        let (base, other) = (self.base?, self.other?);
        if base == other || (base.is_nan() && other.is_nan()) {
            Some(1.0)
        } else {
            Some(other / base)
        }
    }

    /// Whether both reports have the metric and it differs by at most `tolerance` (a fraction of
    /// the first report's value).
    pub fn within(&self, tolerance: f64) -> bool {
        self.ratio()
            .is_some_and(|ratio| ratio.is_finite() && (ratio - 1.0).abs() <= tolerance)
    }
}

/// Rounds for display: integers as integers, others to 3 significant decimals.
pub fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else if value.abs() >= 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

fn toml_to_json(value: &toml::Value) -> serde_json::Value {
    match value {
        toml::Value::String(text) => serde_json::Value::String(text.clone()),
        toml::Value::Integer(number) => serde_json::Value::from(*number),
        toml::Value::Float(number) => serde_json::Value::from(*number),
        toml::Value::Boolean(flag) => serde_json::Value::Bool(*flag),
        toml::Value::Datetime(time) => serde_json::Value::String(time.to_string()),
        toml::Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(toml_to_json).collect())
        }
        toml::Value::Table(table) => serde_json::Value::Object(
            table
                .iter()
                .map(|(key, value)| (key.clone(), toml_to_json(value)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name = "t"
description = "d"
kind = "calibration"
seed = 7
policies = ["meshwire"]
[[case]]
name = "rtt"
workload = "rtt"
duration_s = 5
link = { latency_ms = 45, rate_mbit_per_s = 1000 }
[anchors]
rtt_ms = 90
"#;

    #[test]
    fn parses_and_reports() {
        let scenario = ScenarioFile::parse(MINIMAL, "inline").unwrap();
        let spec = scenario.cases[0].link.spec().unwrap();
        assert_eq!(spec.rate, Rate::BitsPerSec(1_000_000_000));
        assert_eq!(spec.queue_bytes, 11_250_000);
        let mut report = Report::new(&scenario, 7);
        report.results.push(CaseResult {
            case: "rtt".into(),
            policy: "meshwire".into(),
            metrics: [("rtt_ms".to_string(), 90.0)].into_iter().collect(),
        });
        assert_eq!(
            report.to_json(),
            r#"{"scenario":"t","seed":7,"results":[{"case":"rtt","policy":"meshwire","metrics":{"rtt_ms":90.0}}],"anchors":{"rtt_ms":90}}"#
        );
        assert!(report
            .to_table()
            .contains("| rtt | meshwire | rtt_ms | 90 |"));
    }

    #[test]
    fn rejects_bad_files_clearly() {
        let typo = MINIMAL.replace("duration_s", "duration_sec");
        assert!(ScenarioFile::parse(&typo, "typo")
            .unwrap_err()
            .to_string()
            .contains("duration"));
        let both = MINIMAL.replace(
            "rate_mbit_per_s = 1000",
            "rate_mbit_per_s = 1000, rate_packets_per_s = 5",
        );
        assert!(ScenarioFile::parse(&both, "both")
            .unwrap_err()
            .to_string()
            .contains("not both"));
        let loss = MINIMAL.replace("rate_mbit_per_s = 1000", "loss = 1.5");
        assert!(ScenarioFile::parse(&loss, "loss").is_err());
    }

    #[test]
    fn reports_read_back_and_compare_metric_by_metric() {
        let scenario = ScenarioFile::parse(MINIMAL, "inline").unwrap();
        let result = |policy: &str, metrics: &[(&str, f64)]| CaseResult {
            case: "rtt".into(),
            policy: policy.into(),
            metrics: metrics
                .iter()
                .map(|(name, value)| (name.to_string(), *value))
                .collect(),
        };
        let mut base = Report::new(&scenario, 7);
        base.results.push(result(
            "meshwire",
            &[("rtt_ms", 90.0), ("drops", 0.0), ("never_ms", f64::NAN)],
        ));
        base.results.push(result("grpc", &[("rtt_ms", 100.0)]));
        // NaN travels as null and reads back as NaN.
        let read = Report::from_json(&base.to_json()).unwrap();
        assert!(read.results[0].metrics["never_ms"].is_nan());
        assert_eq!(read.results[1], base.results[1]);

        let mut other = Report::new(&scenario, 7);
        other.results.push(result(
            "meshwire",
            &[("rtt_ms", 99.5), ("drops", 0.0), ("never_ms", f64::NAN)],
        ));
        let rows = base.compare(&other);
        let row = |metric: &str, policy: &str| {
            rows.iter()
                .find(|row| row.metric == metric && row.policy == policy)
                .unwrap()
                .clone()
        };
        assert!(!row("rtt_ms", "meshwire").within(0.1));
        assert!(row("rtt_ms", "meshwire").within(0.11));
        assert_eq!(row("drops", "meshwire").ratio(), Some(1.0));
        assert_eq!(row("never_ms", "meshwire").ratio(), Some(1.0));
        // A row only one report has is listed, never "within".
        assert_eq!(row("rtt_ms", "grpc").other, None);
        assert!(!row("rtt_ms", "grpc").within(1.0));
        assert_eq!(rows.len(), 4);
    }

    #[test]
    fn rounding_is_stable() {
        assert_eq!(format_number(90.0), "90");
        assert_eq!(format_number(0.1), "0.100");
    }
}
