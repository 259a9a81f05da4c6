//! Sweeps: an experiment run over randomly drawn cases, each result judged against its physical
//! floor.
//!
//! A sweep file (`scenarios/sweeps/*.toml`, format in `docs/scenarios.md`) names an experiment
//! kind and workload and gives, for the link and each parameter, a fixed value or a spec to draw
//! from: `{ range = [lo, hi] }` (uniform; integers when both bounds are, `scale = "log"` for
//! log-uniform), `{ choose = [a, b, ...] }` (one of them, each itself a value or a spec) or
//! `{ repeat = [min, max], each = SPEC }` (a list of `min..=max` independent draws). Any other
//! table is a table of specs, any array an array of specs.
//!
//! Case `K` is drawn from its own generator seeded by the sweep seed and `K`, so a case does not
//! depend on how many are drawn, and the same seed gives the same cases and, the lab being
//! deterministic in virtual time, byte-identical reports. Each case becomes an ordinary one-case
//! scenario file ([`Sweep::case_text`], what `meshwire lab sweep --print-case K` prints), parsed
//! and checked like any other, and runs under every policy. The experiment's [`Floor`](crate::experiments::Floor)s turn its
//! metrics into ratios; a case that fails (an error, a panic, or a result that misses one of the
//! experiment's [`Require`](crate::experiments::Require)ments, such as delivering everything) is
//! kept, as a failure with its reason, and counts as infinitely bad in the distributions.

use std::path::Path;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Deserialize;

use crate::experiments::{self, Experiment, Trial};
use crate::lab::derive_seed;
use crate::scenario::{ScenarioError, ScenarioFile};
use crate::stats::Metrics;
use crate::Mode;

mod report;
mod spec;

pub use report::{BelowFloor, CaseRun, Distribution, PolicyRun, RatioName, SweepReport, Worst};
use spec::{draw, spec_options, Pick};

/// How many of the worst cases a report lists per policy and ratio.
pub const WORST_PER_RATIO: usize = 3;

/// Why a sweep could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The file could not be read.
    #[error("cannot read sweep {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown or missing key.
    #[error("sweep {path} is invalid: {}", error.to_string().trim_end())]
    Syntax {
        /// The file.
        path: String,
        /// What the TOML reader said.
        error: Box<toml::de::Error>,
    },
    /// A field's spec or value is invalid.
    #[error("sweep {path}, field {field}: {reason}")]
    Field {
        /// The file.
        path: String,
        /// The field, e.g. `link.loss` or `params.paths[].rate_packets_per_s`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The file is not a valid sweep for another reason.
    #[error("sweep {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A sweep file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Short name, printed in reports and used for plot file names.
    pub name: String,
    /// One line saying what the sweep asks.
    pub description: String,
    /// The experiment kind.
    pub kind: String,
    /// The experiment's workload every case runs.
    pub workload: String,
    /// Default seed (`--seed` overrides).
    pub seed: u64,
    /// Default number of cases (`--cases` overrides).
    pub cases: usize,
    /// Policies compared on every case.
    pub policies: Vec<String>,
    /// Each case's virtual time limit in seconds.
    pub duration_s: f64,
    /// The case link's fields: values or specs.
    pub link: toml::Table,
    /// The workload's parameters: values or specs.
    #[serde(default)]
    pub params: toml::Table,
}

/// A loaded, checked sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    file: SweepFile,
    origin: String,
    experiment: &'static Experiment,
}

impl Sweep {
    /// Reads and checks a sweep file.
    pub fn load(path: &Path) -> Result<Self, SweepError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SweepError::Io {
            path: display.clone(),
            source,
        })?;
        Self::parse(&text, &display)
    }

    /// Parses sweep text; `origin` names it in errors. Every spec is checked, then every one of
    /// its extremes (both bounds of a range, each choice, the shortest and longest list) is built
    /// into a case with the other specs at their first option and checked like a scenario, so a
    /// rate of 0 or a loss of 1 anywhere in a range is refused here, naming the field.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SweepError> {
        let invalid = |reason: String| SweepError::Invalid {
            path: origin.to_string(),
            reason,
        };
        let file: SweepFile = toml::from_str(text).map_err(|error| SweepError::Syntax {
            path: origin.to_string(),
            error: Box::new(error),
        })?;
        let experiment = experiments::find(&file.kind).ok_or_else(|| {
            invalid(format!(
                "unknown kind {:?}; the kinds are {}",
                file.kind,
                experiments::kinds().join(", ")
            ))
        })?;
        if experiment.floors.is_empty() {
            return Err(invalid(format!(
                "kind {} has no physical floor to sweep against",
                file.kind
            )));
        }
        if file.cases == 0 {
            return Err(invalid("cases must be at least 1".into()));
        }
        if !(file.duration_s.is_finite() && file.duration_s > 0.0) {
            return Err(invalid("duration_s must be positive".into()));
        }
        let sweep = Self {
            file,
            origin: origin.to_string(),
            experiment,
        };
        let mut options = Vec::new();
        for (section, table) in [("link", &sweep.file.link), ("params", &sweep.file.params)] {
            for (key, value) in table {
                spec_options(&format!("{section}.{key}"), value, &mut options)
                    .map_err(|(field, reason)| sweep.field_error(field, reason))?;
            }
        }
        // The case with every spec at its first option; if it fails, the spec whose other options
        // pass is the one to blame. Then each option of each spec.
        if let Err(reason) = sweep.corner_case("", 0) {
            let culprit = options.iter().find(|(field, count, _)| {
                (1..*count).any(|which| sweep.corner_case(field, which).is_ok())
            });
            return Err(match culprit {
                Some((field, _, kind)) => {
                    sweep.field_error(field.clone(), format!("{}: {reason}", kind.option(0)))
                }
                None => invalid(format!("with every spec at its first option: {reason}")),
            });
        }
        for (field, count, kind) in &options {
            for which in 1..*count {
                sweep.corner_case(field, which).map_err(|reason| {
                    sweep.field_error(field.clone(), format!("{}: {reason}", kind.option(which)))
                })?;
            }
        }
        Ok(sweep)
    }

    fn field_error(&self, field: String, reason: String) -> SweepError {
        SweepError::Field {
            path: self.origin.clone(),
            field,
            reason,
        }
    }

    /// Builds and checks the case where `field` takes option `which` and every other spec its
    /// first; the reason it is not a valid scenario, if it is not.
    fn corner_case(&self, field: &str, which: usize) -> Result<(), String> {
        let text = self.build(0, &mut Pick::Corner { field, which });
        ScenarioFile::parse(&text, &self.origin)
            .map(drop)
            .map_err(|error| match error {
                ScenarioError::Invalid { reason, .. } => reason,
                ScenarioError::Params { error, .. } => error.to_string().trim_end().into(),
                other => other.to_string(),
            })
    }

    /// The file as written.
    pub fn file(&self) -> &SweepFile {
        &self.file
    }

    /// The experiment it sweeps.
    pub fn experiment(&self) -> &'static Experiment {
        self.experiment
    }

    /// Case `index`'s run seed under sweep seed `seed` (48 bits, so scenario files can hold it).
    pub fn case_seed(&self, seed: u64, index: usize) -> u64 {
        derive_seed(seed, &self.file.name, index as u64) >> 16
    }

    /// Case `index` under sweep seed `seed` as an ordinary one-case scenario file.
    pub fn case_text(&self, seed: u64, index: usize) -> String {
        let mut rng = SmallRng::seed_from_u64(self.case_seed(seed, index) ^ 0x5eed);
        let mut pick = Pick::Random(&mut rng);
        self.build_with_seed(index, self.case_seed(seed, index), seed, &mut pick)
    }

    fn build(&self, index: usize, pick: &mut Pick<'_>) -> String {
        self.build_with_seed(index, self.file.seed, self.file.seed, pick)
    }

    fn build_with_seed(
        &self,
        index: usize,
        case_seed: u64,
        sweep_seed: u64,
        pick: &mut Pick<'_>,
    ) -> String {
        let file = &self.file;
        let mut case = toml::Table::new();
        case.insert("name".into(), format!("case-{index}").into());
        case.insert("workload".into(), file.workload.clone().into());
        case.insert("duration_s".into(), file.duration_s.into());
        for (section, table) in [("link", &file.link), ("params", &file.params)] {
            let drawn: toml::Table = table
                .iter()
                .map(|(key, value)| {
                    let field = format!("{section}.{key}");
                    (key.clone(), draw(&field, value, pick))
                })
                .collect();
            case.insert(section.into(), toml::Value::Table(drawn));
        }
        let mut scenario = toml::Table::new();
        scenario.insert("name".into(), format!("{}-case-{index}", file.name).into());
        scenario.insert(
            "description".into(),
            format!(
                "case {index} of sweep {} (seed {sweep_seed}): {}",
                file.name, file.description
            )
            .into(),
        );
        scenario.insert("kind".into(), file.kind.clone().into());
        scenario.insert("seed".into(), toml::Value::Integer(case_seed as i64));
        scenario.insert(
            "policies".into(),
            toml::Value::Array(file.policies.iter().cloned().map(Into::into).collect()),
        );
        scenario.insert("case".into(), toml::Value::Array(vec![case.into()]));
        toml::to_string(&scenario).unwrap_or_default()
    }

    /// Runs `cases` cases drawn from `seed` under every policy. `progress` hears each trial as
    /// it runs and the lab time elapsed in it.
    pub fn run(
        &self,
        seed: u64,
        cases: usize,
        mut progress: impl FnMut(&SweepProgress<'_>),
    ) -> SweepReport {
        let experiment = self.experiment;
        let total = cases * self.file.policies.len();
        let mut runs = Vec::with_capacity(cases);
        for index in 0..cases {
            let text = self.case_text(seed, index);
            let scenario = ScenarioFile::parse(&text, &self.origin);
            let case_seed = self.case_seed(seed, index);
            let mut results = Vec::new();
            let mut drawn = CaseRun {
                index,
                name: format!("case-{index}"),
                seed: case_seed,
                link: serde_json::Value::Null,
                params: serde_json::Value::Null,
                results: Vec::new(),
            };
            for policy in &self.file.policies {
                let label = format!("case-{index} / {policy}");
                let done = index * self.file.policies.len() + results.len();
                let outcome = match &scenario {
                    Err(error) => Err(error.to_string()),
                    Ok(scenario) => {
                        let case = &scenario.cases[0];
                        drawn.link = serde_json::to_value(case.link).unwrap_or_default();
                        drawn.params = serde_json::to_value(&case.params).unwrap_or_default();
                        let trial = Trial {
                            scenario: &scenario.name,
                            case,
                            seed: case_seed,
                            policy,
                            mode: Mode::Virtual,
                            placement: None,
                        };
                        let mut tick = |elapsed: Duration| {
                            progress(&SweepProgress {
                                done,
                                total,
                                trial: &label,
                                elapsed,
                            })
                        };
                        run_trial(experiment, &trial, &mut tick)
                    }
                };
                results.push(PolicyRun::new(experiment, policy, outcome));
            }
            drawn.results = results;
            runs.push(drawn);
        }
        progress(&SweepProgress {
            done: total,
            total,
            trial: "",
            elapsed: Duration::ZERO,
        });
        SweepReport::new(self, seed, runs)
    }
}

/// Runs one trial, turning an error or a panic into a failure reason.
fn run_trial(
    experiment: &Experiment,
    trial: &Trial<'_>,
    tick: &mut dyn FnMut(Duration),
) -> Result<Metrics, String> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (experiment.run)(trial, tick)
    }));
    match run {
        Ok(Ok(metrics)) => Ok(metrics),
        Ok(Err(error)) => Err(error_chain(&error)),
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Where a sweep is, for progress displays.
#[derive(Debug, Clone, Copy)]
pub struct SweepProgress<'a> {
    /// Trials finished.
    pub done: usize,
    /// Trials in the sweep (cases × policies).
    pub total: usize,
    /// The running trial, `case-K / policy`; empty when the sweep is done.
    pub trial: &'a str,
    /// Lab time elapsed in the running trial.
    pub elapsed: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUORUM: &str = r#"
name = "q"
description = "d"
kind = "zold-fetch"
workload = "quorum-reads"
seed = 3
cases = 2
policies = ["parallel-all", "hedged"]
duration_s = 30
link = { latency_ms = 10, loss = { choose = [0.0, { range = [0.0, 0.01] }] } }

[params]
servers = { range = [4, 6] }
slow = 1
dead = 0
quorum = { range = [1, 2] }
slow_ms = 300
min_latency_ms = { range = [5, 10] }
max_latency_ms = { range = [10, 40], scale = "log" }
reads = 12
reads_per_s = 20
warmup_ms = 500
deadline_ms = 2000
"#;

    fn error(text: &str) -> String {
        Sweep::parse(text, "inline").unwrap_err().to_string()
    }

    fn case_params(sweep: &Sweep, seed: u64, index: usize) -> toml::Table {
        let scenario = ScenarioFile::parse(&sweep.case_text(seed, index), "case").unwrap();
        let case = &scenario.cases[0];
        case.params.clone().into_iter().collect()
    }

    #[test]
    fn cases_are_drawn_per_seed_and_index_within_their_specs() {
        let sweep = Sweep::parse(QUORUM, "inline").unwrap();
        assert_eq!(sweep.case_text(3, 5), sweep.case_text(3, 5));
        assert_ne!(sweep.case_text(3, 5), sweep.case_text(4, 5));
        let drawn: Vec<toml::Table> = (0..40).map(|index| case_params(&sweep, 3, index)).collect();
        let servers: Vec<i64> = drawn
            .iter()
            .map(|params| params["servers"].as_integer().unwrap())
            .collect();
        assert!(servers.iter().all(|servers| (4..=6).contains(servers)));
        for value in 4..=6 {
            assert!(servers.contains(&value), "{value} never drawn: {servers:?}");
        }
        for params in &drawn {
            let max = params["max_latency_ms"].as_integer().unwrap();
            assert!((10..=40).contains(&max), "{max}");
            assert_eq!(params["slow"].as_integer(), Some(1));
        }
        // The printed case is a scenario of the sweep's kind, with the case's own seed.
        let scenario = ScenarioFile::parse(&sweep.case_text(3, 1), "case").unwrap();
        assert_eq!(scenario.kind, "zold-fetch");
        assert_eq!(scenario.seed, sweep.case_seed(3, 1));
        assert_eq!(scenario.policies, ["parallel-all", "hedged"]);
        let losses: Vec<f64> = (0..40)
            .map(|index| {
                let text = sweep.case_text(3, index);
                ScenarioFile::parse(&text, "case").unwrap().cases[0]
                    .link
                    .loss
            })
            .collect();
        assert!(losses.iter().all(|loss| (0.0..=0.01).contains(loss)));
        assert!(losses.contains(&0.0) && losses.iter().any(|loss| *loss > 0.0));
    }

    #[test]
    fn repeat_draws_lists_of_drawn_elements() {
        let text = r#"
name = "m"
description = "d"
kind = "multipath"
workload = "transfer"
seed = 1
cases = 1
policies = ["meshwire"]
duration_s = 10
link = { latency_ms = 5 }
params = { mib = 1, paths = { repeat = [2, 4], each = { latency_ms = { range = [5, 50] }, rate_packets_per_s = { range = [100, 200] } } } }
"#;
        let sweep = Sweep::parse(text, "inline").unwrap();
        let mut lengths = Vec::new();
        for index in 0..30 {
            let params = case_params(&sweep, 1, index);
            let paths = params["paths"].as_array().unwrap();
            lengths.push(paths.len());
            for path in paths {
                let rate = path["rate_packets_per_s"].as_integer().unwrap();
                assert!((100..=200).contains(&rate), "{rate}");
            }
        }
        assert!(lengths.iter().all(|length| (2..=4).contains(length)));
        assert!(lengths.contains(&2) && lengths.contains(&4), "{lengths:?}");
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        let unknown = QUORUM.replace("cases = 2", "cases = 2\nrepeats = 3");
        assert!(error(&unknown).contains("repeats"), "{}", error(&unknown));
        let empty = QUORUM.replace("range = [4, 6]", "range = [6, 4]");
        let message = error(&empty);
        assert!(
            message.contains("params.servers") && message.contains("empty"),
            "{message}"
        );
        let zero_rate = QUORUM.replace(
            "link = { latency_ms = 10,",
            "link = { rate_mbit_per_s = { range = [0.0, 10.0] }, latency_ms = 10,",
        );
        let message = error(&zero_rate);
        assert!(
            message.contains("link.rate_mbit_per_s") && message.contains("not positive"),
            "{message}"
        );
        let full_loss = QUORUM.replace("range = [0.0, 0.01]", "range = [0.0, 1.0]");
        let message = error(&full_loss);
        assert!(
            message.contains("link.loss[1]") && message.contains("loss 1 is not in [0, 1)"),
            "{message}"
        );
        let misspelt = QUORUM.replace("slow_ms = 300", "slow_mss = 300");
        let message = error(&misspelt);
        assert!(message.contains("slow_mss"), "{message}");
        let bad_spec = QUORUM.replace("range = [1, 2]", "range = [1, 2], step = 1");
        let message = error(&bad_spec);
        assert!(
            message.contains("params.quorum") && message.contains("step"),
            "{message}"
        );
        let no_choice = QUORUM.replace("choose = [0.0, { range = [0.0, 0.01] }]", "choose = []");
        assert!(error(&no_choice).contains("choose is empty"));
        let wrong_kind = QUORUM.replace("kind = \"zold-fetch\"", "kind = \"scale\"");
        assert!(error(&wrong_kind).contains("no physical floor"));
        let no_cases = QUORUM.replace("cases = 2", "cases = 0");
        assert!(error(&no_cases).contains("cases"));
    }

    #[test]
    fn a_sweep_is_deterministic_keeps_failures_and_reports_ratios() {
        // Case draws where quorum exceeds the live servers fail at run time: make one certain.
        let text = QUORUM.replace("dead = 0", "dead = { choose = [0, 5] }");
        let sweep = Sweep::parse(&text, "inline").unwrap();
        let first = sweep.run(3, 3, |_| {});
        let second = sweep.run(3, 3, |_| {});
        assert_eq!(first.to_json(), second.to_json());
        assert_eq!(first.cases.len(), 3);
        assert!(first.below_floor.is_empty(), "{:?}", first.below_floor);
        for case in &first.cases {
            assert_eq!(case.results.len(), 2);
            for run in &case.results {
                match &run.failed {
                    Some(reason) => assert!(run.ratios.is_empty(), "{reason}"),
                    None => {
                        // The floor allows two 1 ms ticks, one each way.
                        let ratio = run.ratios["p99"];
                        assert!(ratio >= 1.0 - 2.0 / run.metrics["ideal_ms_p99"], "{ratio}");
                        assert!(run.ratios["requests"] >= 1.0, "{:?}", run.ratios);
                    }
                }
            }
        }
        let failed = first
            .cases
            .iter()
            .flat_map(|case| &case.results)
            .filter(|run| run.failed.is_some())
            .count();
        assert!(
            failed > 0,
            "seed 3 draws a case with 5 dead of at most 6 servers"
        );
        for distribution in &first.distributions {
            assert_eq!(distribution.cases, 3, "{distribution:?}");
        }
        // Two policies, each with two ratios (p99 and requests): a failed run counts in both.
        assert_eq!(first.distributions.len(), 2 * 2);
        let counted: usize = first.distributions.iter().map(|d| d.failed).sum();
        assert_eq!(counted, 2 * failed);
        assert_eq!(first.worst.len(), 2 * 2 * 3);
    }
}
